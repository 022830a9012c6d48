"""``pip install .`` in a fresh virtualenv with build isolation: the build declares what it
needs (the protobuf generators) and the wheel it builds (``pip wheel .`` runs the same
PEP 517 build) carries the generated code. One test: it installs every dependency."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

REPO = REPO
_SKIP = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                               ".pytest_cache", ".ruff_cache", ".cache", "v1")


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                          timeout=600)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_pip_install_and_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_SKIP)  # a clean checkout: no generated svcproxy/v1
    assert not (src / "svcproxy" / "v1").exists()
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip = venv / "bin" / "pip"
    run(pip, "install", "-q", src)  # build isolation: only [build-system] requires
    assert run(venv / "bin" / "svcproxy", "--version").strip() == "svcproxy 0.1.0"
    listed = run(venv / "bin" / "svcproxy", "backend")
    for name in ("iptables", "ipvs", "nft", "dump"):
        assert f"\n{name} " in f"\n{listed}"
    run(venv / "bin" / "python", "-c", "import svcproxy.v1.nodestate_pb2_grpc")
    # The installed files are the wheel's: the generated code and the entry points are in it.
    (record,) = venv.glob("lib/python*/site-packages/svcproxy-*.dist-info/RECORD")
    files = {line.split(",")[0] for line in record.read_text().splitlines()}
    assert {"svcproxy/v1/nodestate_pb2.py", "svcproxy/v1/nodestate_pb2_grpc.py",
            "svcproxy/v1/documented.binpb",  # the proto's comments, for reflection
            "svcproxy/kubeproxy/cli.py", "svcproxy/frontend/pipeline/engine.py"} <= files
    assert any(f.endswith("entry_points.txt") for f in files)
