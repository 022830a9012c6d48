#!/usr/bin/env bash
# Builds the IPVS guest's initramfs: static busybox, the guest's /init, and the
# virtio / 9p / overlay modules of the guest kernel with their dependencies.
# Usage: build-initramfs.sh KERNEL_VERSION OUTPUT.cpio.gz
set -euo pipefail
kver=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
moddir=/lib/modules/$kver
wanted=(virtio_pci 9pnet_virtio 9p overlay)

[[ -f $moddir/modules.dep ]] || { echo "ipvs-vm: no $moddir/modules.dep (install linux-image-amd64)" >&2; exit 1; }
command -v busybox >/dev/null || { echo "ipvs-vm: busybox not found (install busybox-static)" >&2; exit 1; }

declare -A seen=()
order=()
# Appends a module's path after its dependencies' (depth first, each once).
add_module() {
  local rel=$1 dep
  [[ -n ${seen[$rel]:-} ]] && return
  seen[$rel]=1
  for dep in $(awk -v m="$rel:" '$1 == m { $1 = ""; print }' "$moddir/modules.dep"); do
    add_module "$dep"
  done
  order+=("$rel")
}
for name in "${wanted[@]}"; do
  rel=$(awk -v n="/$name.ko" -F: 'index($1, n) && substr($1, length($1) - length(n) + 1) == n { print $1; exit }' \
    "$moddir/modules.dep")
  [[ -n $rel ]] || { echo "ipvs-vm: module $name not in $moddir" >&2; exit 1; }
  add_module "$rel"
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,proc,sys,dev,host,upper,merged,share,mods}
cp "$(command -v busybox)" "$stage/bin/busybox"
for applet in sh mount umount insmod mkdir chroot cat echo poweroff sync sleep ln; do
  ln -s busybox "$stage/bin/$applet"
done
: > "$stage/mods/order"
for rel in "${order[@]}"; do
  base=$(basename "$rel")
  case $base in
    *.ko.xz) xz -dc "$moddir/$rel" > "$stage/mods/${base%.xz}"; base=${base%.xz} ;;
    *.ko.zst) zstd -qdc "$moddir/$rel" > "$stage/mods/${base%.zst}"; base=${base%.zst} ;;
    *) cp "$moddir/$rel" "$stage/mods/$base" ;;
  esac
  echo "$base" >> "$stage/mods/order"
done
install -m 0755 "$here/init.sh" "$stage/init"
install -m 0755 "$here/guest-modprobe.sh" "$stage/sbin/guest-modprobe"
(cd "$stage" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
