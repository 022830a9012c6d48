#!/usr/bin/env bash
# Installs everything svcproxy needs on a fresh Debian machine, idempotently:
# system packages (apt-get), a virtualenv in .venv, the Python packages, and the
# protobuf code generated from proto/. Safe to run again; does little the second time.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(nftables iptables ipset conntrack iproute2 procps kmod)
# The ebpf backend: clang builds its programs, libbpf loads them, bpftool inspects them.
APT_PACKAGES+=(clang libbpf-dev libbpf1 bpftool)
if [[ "${SVCPROXY_WITH_QEMU:-1}" == 1 ]]; then
  APT_PACKAGES+=(qemu-system-x86 linux-image-amd64 busybox-static cpio)
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A venv left without pip (an interrupted first run) is made again.
if [[ ! -x .venv/bin/python || ! -x .venv/bin/pip ]]; then
  echo "setup: creating .venv"
  python3 -m venv --clear .venv
fi
stamp=.venv/.svcproxy-installed
want=$(cat pyproject.toml setup.py proto/*.proto | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" || ! -d svcproxy/v1 ]]; then
  echo "setup: installing Python packages into .venv"
  .venv/bin/pip install -q --upgrade pip setuptools wheel
  .venv/bin/pip install -q "grpcio-tools==1.85.1" "mypy-protobuf==5.1.0"
  .venv/bin/pip install -q --no-build-isolation -e ".[test]"
  echo "$want" > "$stamp"
fi

# The ebpf backend's programs (recompiled only when a source changed).
.venv/bin/python -m svcproxy.backends.ebpf.build >/dev/null
