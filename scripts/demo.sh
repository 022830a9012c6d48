#!/usr/bin/env bash
# The main job on its embedded default: install what is needed, then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
SVCPROXY_WITH_QEMU=0 bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
