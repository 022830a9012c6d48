"""Compile the BPF programs: ``python -m svcproxy.backends.ebpf.build [--force]
[--native | --bpf]``.

Run by scripts/setup.sh and by the package build. It first builds the host helpers of
native/ (the Maglev table builder, the CT GC) with the host's C compiler, if any: a
missing or failing one only leaves them out (Python does their work). Then the BPF
objects, which need clang; recompiled only when a source, or a header of bpf/ (which the
sources include), is newer than its object. ``--native`` builds the helpers alone (it
never fails), ``--bpf`` the objects alone.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

BPF_DIR = Path(__file__).parent / "bpf"
NATIVE_DIR = Path(__file__).parent / "native"


def clang_argv(source: Path, output: Path) -> list[str]:
    """clang for the BPF target; the multiarch dir holds asm/types.h on Debian."""
    multiarch = f"/usr/include/{platform.machine()}-linux-gnu"
    return ["clang", "-O2", "-g", "-Wall", "-target", "bpf",
            f"-I{multiarch}", "-c", str(source), "-o", str(output)]


def build(force: bool = False) -> list[Path]:
    """Compile every bpf/*.bpf.c whose object is missing or older; returns the objects."""
    objects = []
    headers = max((h.stat().st_mtime for h in BPF_DIR.glob("*.h")), default=0.0)
    for source in sorted(BPF_DIR.glob("*.bpf.c")):
        output = source.with_suffix(".o")
        objects.append(output)
        newest = max(source.stat().st_mtime, headers)
        if not force and output.exists() and output.stat().st_mtime >= newest:
            continue
        if shutil.which("clang") is None:
            raise SystemExit(f"cannot build {output.name}: clang is not installed "
                             "(apt-get install clang libbpf-dev)")
        subprocess.run(clang_argv(source, output), check=True)
    return objects


def build_native(force: bool = False) -> list[Path]:
    """Compile every native/*.c into lib<name>.so with the host's C compiler (``$CC``,
    cc, gcc or clang); never fails: a helper that cannot be built is left out, said so,
    and its Python twin does the work. Returns the libraries there."""
    libraries = []
    for source in sorted(NATIVE_DIR.glob("*.c")):
        output = NATIVE_DIR / f"libsvcproxy_{source.stem}.so"
        if force or not output.exists() or output.stat().st_mtime < source.stat().st_mtime:
            _compile_native(source, output)
        if output.exists():
            libraries.append(output)
    return libraries


def _compile_native(source: Path, output: Path) -> None:
    """One shared library, written atomically; a failure is printed, not raised."""
    compilers = [c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c]
    compiler = next((shutil.which(c) for c in compilers if shutil.which(c)), None)
    if compiler is None:
        print(f"build: no C compiler; {output.name} is not built (Python does its work)")
        return
    partial = output.with_suffix(".so.tmp")
    proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wall", str(source),
                           "-o", str(partial)], capture_output=True, text=True)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        print(f"build: {compiler} failed on {source.name}; {output.name} is not built "
              f"(Python does its work): {proc.stderr.strip()[-500:]}")
        return
    partial.replace(output)


if __name__ == "__main__":
    _args = set(sys.argv[1:])
    if "--bpf" not in _args:
        for lib in build_native(force="--force" in _args):
            print(lib)
    if "--native" not in _args:
        for obj in build(force="--force" in _args):
            print(obj)
