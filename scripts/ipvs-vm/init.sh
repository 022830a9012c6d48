#!/bin/sh
# /init of the IPVS guest: mount the host's / read-only over 9p with a tmpfs
# overlay on top, run the job the host left in the shared directory inside
# that root, write its exit status back, power off.
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /mods/order); do
  insmod "/mods/$m" || echo "ipvs-vm: insmod $m failed"
done
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro,cache=loose" hostroot /host || echo "ipvs-vm: cannot mount hostroot"
mount -t 9p -o "$opts" hostshare /share || echo "ipvs-vm: cannot mount hostshare"
mount -t tmpfs -o mode=0755 tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work overlay /merged \
  || echo "ipvs-vm: cannot mount the overlay"
sharepath=$(cat /share/hostpath)
m=/merged
mount -t proc proc $m/proc
mount -t sysfs sysfs $m/sys
mount -t devtmpfs devtmpfs $m/dev
mkdir -p $m/dev/pts $m/dev/shm
mount -t devpts devpts $m/dev/pts
mount -t tmpfs tmpfs $m/dev/shm
# A fresh /tmp and /run, but keep the job's working directory when it lives there
# (a checkout in /tmp, as CI may use).
workdir=$(cat /share/workdir 2>/dev/null)
keep=""
case "$workdir" in /tmp/*|/run/*) keep=1; mkdir -p /saved; mount -o bind "$m$workdir" /saved ;; esac
mount -t tmpfs tmpfs $m/tmp
mount -t tmpfs tmpfs $m/run
if [ -n "$keep" ]; then
  mkdir -p "$m$workdir"
  mount -o bind /saved "$m$workdir"
fi
mkdir -p "$m$sharepath"
mount -o bind /share "$m$sharepath"
echo /sbin/guest-modprobe > /proc/sys/kernel/modprobe
echo "ipvs-vm: guest ready"
chroot $m /bin/bash "$sharepath/job.sh" < /dev/console > /dev/console 2>&1
status=$?
echo "$status" > /share/status
echo "ipvs-vm: exit status $status"
sync
umount /share
poweroff -f
