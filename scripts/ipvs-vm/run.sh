#!/usr/bin/env bash
# Runs one command inside a real IPVS kernel: Debian's kernel under
# qemu-system-x86_64 (TCG, no NIC), with the host's / mounted read-only over 9p
# and a tmpfs overlay on top. The command runs as root in the same working
# directory with PATH, VIRTUAL_ENV and every SVCPROXY_* / PYTEST_* variable,
# plus SVCPROXY_IPVS_GUEST=1. Its output streams to stdout; the script exits
# with the command's exit status (or 125 when the guest never reported one).
#
# Usage: scripts/ipvs-vm/run.sh CMD [ARGS...]
# Environment: SVCPROXY_IPVS_VM_TIMEOUT (seconds, default 900),
#   SVCPROXY_IPVS_VM_MEMORY (default 3G), SVCPROXY_IPVS_VM_CPUS (default 2),
#   SVCPROXY_IPVS_VM_KERNEL (path to a vmlinuz with matching /lib/modules),
#   SVCPROXY_IPVS_VM_CACHE (the initramfs cache, default ~/.cache/svcproxy/ipvs-vm).
set -euo pipefail
(($#)) || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# The initramfs, keyed by its inputs, outside the checkout: a fresh clone on the same
# machine reuses it (SVCPROXY_IPVS_VM_CACHE to put it elsewhere).
cache=${SVCPROXY_IPVS_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/svcproxy/ipvs-vm}

kernel=${SVCPROXY_IPVS_VM_KERNEL:-}
if [[ -z $kernel ]]; then
  for k in $(ls -v /boot/vmlinuz-* 2>/dev/null | sort -rV); do
    [[ -d /lib/modules/${k#/boot/vmlinuz-} ]] && { kernel=$k; break; }
  done
fi
[[ -n $kernel && -r $kernel ]] || {
  echo "ipvs-vm: no guest kernel: install linux-image-amd64 (bash scripts/setup.sh)" >&2; exit 125; }
command -v qemu-system-x86_64 >/dev/null || {
  echo "ipvs-vm: qemu-system-x86_64 missing: install qemu-system-x86 (bash scripts/setup.sh)" >&2; exit 125; }
kver=${kernel##*/vmlinuz-}

mkdir -p "$cache"
key=$(cat "$here/build-initramfs.sh" "$here/init.sh" "$here/guest-modprobe.sh" \
  "$(command -v busybox || echo /dev/null)" "/lib/modules/$kver/modules.dep" 2>/dev/null \
  | { cat; echo "$kver"; } | sha256sum | cut -c1-16)
initrd=$cache/initramfs-$kver-$key.cpio.gz
[[ -f $initrd ]] || "$here/build-initramfs.sh" "$kver" "$initrd"

share=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$share"' EXIT
echo "$share" > "$share/hostpath"
echo "$PWD" > "$share/workdir"
{
  echo "ip link set lo up 2>/dev/null"
  printf 'cd %q || exit 125\n' "$PWD"
  for var in PATH VIRTUAL_ENV HOME LANG TERM $(compgen -e | grep -E '^(SVCPROXY_|PYTEST_)' || true); do
    [[ -n ${!var+x} ]] && printf 'export %s=%q\n' "$var" "${!var}"
  done
  echo "export SVCPROXY_IPVS_GUEST=1 SVCPROXY_IPVS_VM_SHARE=$(printf %q "$share")"
  printf 'exec'; printf ' %q' "$@"; printf '\n'
} > "$share/job.sh"

timeout_s=${SVCPROXY_IPVS_VM_TIMEOUT:-900}
set +e
timeout --foreground -k 10 "$timeout_s" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp "${SVCPROXY_IPVS_VM_CPUS:-2}" -m "${SVCPROXY_IPVS_VM_MEMORY:-3G}" \
  -nic none -display none -no-reboot -monitor none -serial stdio \
  -kernel "$kernel" -initrd "$initrd" \
  -append "console=ttyS0 quiet loglevel=1 panic=-1 mitigations=off" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$share,mount_tag=hostshare,security_model=none" \
  < /dev/null | sed -u 's/\r$//'
qemu_status=${PIPESTATUS[0]}
set -e
if [[ -f $share/status ]]; then
  exit "$(cat "$share/status")"
fi
echo "ipvs-vm: the guest reported no exit status (qemu exited with $qemu_status)" >&2
exit 125
