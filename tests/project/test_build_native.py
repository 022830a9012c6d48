"""The package build's ebpf step (setup.py's ``compile_bpf``) in a clean copy of the
checkout: the C helpers are built with the host's C compiler whether clang is missing,
failing or there, the BPF objects only by a clang that works, and nothing fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

FAILING_CLANG = "#!/bin/sh\necho 'clang: error: unable to execute command' >&2\nexit 1\n"
HELPERS = {"libsvcproxy_ct_gc.so", "libsvcproxy_maglev.so"}
pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")


def _tools_without_clang(tmp_path: Path, clang: str | None) -> Path:
    """A PATH directory with every tool of /usr/bin but clang (``clang``: a script of
    that name instead)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if not tool.name.startswith("clang"):
            (tools / tool.name).symlink_to(tool)
    if clang is not None:
        (tools / "clang").write_text(clang)
        (tools / "clang").chmod(0o755)
    return tools


def _build(tmp_path: Path, path: str) -> tuple[Path, str]:
    """setup.compile_bpf() in a copy of setup.py and backends/ebpf without built files."""
    src = tmp_path / "src"
    (src / "backends").mkdir(parents=True)
    shutil.copy(REPO / "setup.py", src)
    shutil.copytree(REPO / "backends" / "ebpf", src / "backends" / "ebpf",
                    ignore=shutil.ignore_patterns("*.o", "*.so", "*.tmp", "__pycache__"))
    env = dict(os.environ, PATH=path)
    env.pop("CC", None)
    proc = subprocess.run([sys.executable, "-c", "import setup; setup.compile_bpf()"],
                          cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc
    return src / "backends" / "ebpf", proc.stdout + proc.stderr


def _built(ebpf: Path) -> tuple[set[str], set[str]]:
    return ({p.name for p in (ebpf / "native").glob("*.so")},
            {p.name for p in (ebpf / "bpf").glob("*.o")})


def test_without_clang_the_helpers_are_built_with_cc(tmp_path: Path) -> None:
    """Before: setup.py skipped build.py when clang was missing, so Python did the
    helpers' work although cc was there."""
    ebpf, said = _build(tmp_path, str(_tools_without_clang(tmp_path, None)))
    assert _built(ebpf) == (HELPERS, set()), said
    assert "clang not found; the ebpf backend's programs are not built" in said


def test_with_a_failing_clang_the_helpers_are_built_and_the_build_goes_on(
        tmp_path: Path) -> None:
    ebpf, said = _build(tmp_path, str(_tools_without_clang(tmp_path, FAILING_CLANG)))
    assert _built(ebpf) == (HELPERS, set()), said
    assert "the package is built without them" in said


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang")
def test_with_clang_both_are_built(tmp_path: Path) -> None:
    ebpf, said = _build(tmp_path, os.environ["PATH"])
    helpers, objects = _built(ebpf)
    assert helpers == HELPERS and objects == {"svcproxy_sock.bpf.o", "svcproxy_tc.bpf.o"}, said
