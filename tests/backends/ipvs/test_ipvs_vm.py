"""Runs the IPVS tests inside a real IPVS kernel (Debian's, under qemu; see
scripts/ipvs-vm/run.sh): this machine's kernel has no IPVS.

One guest boot runs the backend's guest tests and the shared scenario suite
parametrized to ipvs; a failure shows the guest's output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

REPO = REPO
RUN = REPO / "scripts" / "ipvs-vm" / "run.sh"
GUEST_TESTS = ("tests/backends/ipvs/test_ipvs_guest.py", "tests/backends/test_scenarios.py")
TIMEOUT = 2700
COMPILED = ("svcproxy", "frontend", "backends", "tests")


def _missing() -> str:
    if os.environ.get("SVCPROXY_IPVS_GUEST") == "1":
        return "already inside the IPVS guest"
    if os.geteuid() != 0:
        return "needs root (the guest runs network namespaces as root)"
    if shutil.which("qemu-system-x86_64") is None:
        return "needs qemu-system-x86 (bash scripts/setup.sh)"
    if not list(Path("/boot").glob("vmlinuz-*")):
        return "needs linux-image-amd64 (bash scripts/setup.sh)"
    return ""


def _guest_pytest_args() -> list[str]:
    wanted = [t for t in GUEST_TESTS if (REPO / t).exists()]
    select = os.environ.get("SVCPROXY_IPVS_VM_SELECT", "")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "tests.support.ipvs.slow_guest", "-x", "--durations=10", *wanted]
    if "tests/backends/test_scenarios.py" in wanted:
        args += ["-k", select or "ipvs or test_ipvs_guest"]
    elif select:
        args += ["-k", select]
    return args


@pytest.mark.ipvs
def test_ipvs_suite_passes_in_a_real_ipvs_kernel() -> None:
    why = _missing()
    if why:
        pytest.skip(why)
    # The guest's root is this one, read-only under a throw-away overlay: byte-compile
    # here, where it costs a second, what the guest would compile at every boot (20-25x
    # slower there).
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *COMPILED], cwd=REPO,
                   capture_output=True, check=False)
    done = subprocess.run(
        [str(RUN), *_guest_pytest_args()], cwd=REPO, capture_output=True, text=True,
        timeout=TIMEOUT + 60, env={**os.environ, "SVCPROXY_IPVS_VM_TIMEOUT": str(TIMEOUT)},
    )
    output = done.stdout + done.stderr
    print(output[-4000:])
    assert done.returncode == 0, f"IPVS guest tests failed (exit {done.returncode}):\n{output}"
