"""Compile the BPF programs: ``python -m svcproxy.backends.ebpf.build [--force]``.

Run by scripts/setup.sh and by the package build; needs clang. Recompiles only when
a source, or a header of bpf/ (which the sources include), is newer than its object.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

BPF_DIR = Path(__file__).parent / "bpf"


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


if __name__ == "__main__":
    for obj in build(force="--force" in sys.argv[1:]):
        print(obj)
