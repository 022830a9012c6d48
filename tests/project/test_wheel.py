"""The wheel a backend author installs, built and installed with no index and no network:
``pip wheel . --no-deps --no-build-isolation -w dist/`` in a checkout with the build's
tools (scripts/setup.sh's venv), then ``pip install`` of that one file elsewhere. A clang
that fails (not only a missing one) leaves the ebpf programs out and the build goes on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.support.paths import REPO

REPO = REPO
# A clean checkout: no generated code, no built BPF object, no build output.
_SKIP = shutil.ignore_patterns(".venv", ".git", "build", "dist", "site", "*.egg-info",
                               "__pycache__", ".pytest_cache", ".ruff_cache", ".cache", "v1",
                               "*.o")
FAILING_CLANG = "#!/bin/sh\necho 'clang: error: unable to execute command' >&2\nexit 1\n"


def run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def test_the_wheel_installs_offline_and_a_failing_clang_does_not_break_it(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_SKIP)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "clang").write_text(FAILING_CLANG)
    (tools / "clang").chmod(0o755)
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}", PIP_NO_INDEX="1")
    said = run(sys.executable, "-m", "pip", "wheel", "-v", ".", "--no-deps",
               "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", cwd=src, env=env)
    assert "the package is built without them" in said
    (wheel,) = (tmp_path / "dist").glob("svcproxy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"svcproxy/v1/nodestate_pb2.py", "svcproxy/v1/documented.binpb",
            "svcproxy/backends/ebpf/bpf/svcproxy_sock.bpf.c"} <= names
    assert not any(n.endswith(".o") for n in names)

    # A fresh venv that borrows this one's dependencies, and the wheel by file, offline.
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    ours = sysconfig.get_path("purelib")
    Path(site, "00-deps.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index",
        "--no-deps", wheel)
    where = run(python, "-c", "import svcproxy.v1.nodestate_pb2, svcproxy; "
                "print(svcproxy.__file__)", cwd=tmp_path).strip()
    assert where.startswith(str(venv)), f"svcproxy came from {where}, not the wheel"
    assert run(venv / "bin" / "svcproxy", "--version", cwd=tmp_path).strip() == "svcproxy 0.1.0"
    listed = run(venv / "bin" / "svcproxy", "backend", cwd=tmp_path)
    for name in ("dump", "ebpf", "iptables", "ipvs", "nft"):
        assert f"\n{name} " in f"\n{listed}", listed
