#!/usr/bin/env bash
# The whole test suite: install what is needed (idempotent), lint, then pytest.
# The IPVS tests run inside a qemu guest with Debian's kernel (tests/backends/ipvs/test_ipvs_vm.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -ra "$@"
