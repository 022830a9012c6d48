#!/bin/sh
# The guest kernel's module loader (/proc/sys/kernel/modprobe). The kernel runs
# it with the initramfs as root, so it enters the merged root where the host's
# kmod and /lib/modules of the guest kernel live.
exec /bin/chroot /merged /sbin/modprobe "$@"
