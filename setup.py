"""Generates the protobuf code from proto/ whenever the package is built."""

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent


def _plugin(name: str) -> str:
    """A protoc plugin script: next to this Python, else on PATH (pip's isolated build
    environment puts the build requirements' scripts there, not next to the interpreter)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"setup: {name} not found; install mypy-protobuf (a build requirement)")
    return found


def generate_protos() -> None:
    """Run grpcio-tools' protoc on proto/*.proto into svcproxy/v1/ (code, and the
    descriptors with their comments that reflection serves)."""
    out = ROOT / "svcproxy" / "v1"
    out.mkdir(exist_ok=True)
    (out / "__init__.py").write_text('"""Generated from proto/ by the build; do not edit."""\n')
    protos = sorted(p.name for p in (ROOT / "proto").glob("*.proto"))
    plugins = [f"--plugin=protoc-gen-{n}={_plugin('protoc-gen-' + n)}"
               for n in ("mypy", "mypy_grpc")]
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-Isvcproxy/v1=proto",
         *plugins, "--python_out=.", "--grpc_python_out=.", "--mypy_out=.", "--mypy_grpc_out=.",
         # The same files with their comments, for reflection (grpcurl describe).
         "--include_source_info", "--descriptor_set_out=svcproxy/v1/documented.binpb",
         *[f"svcproxy/v1/{p}" for p in protos]],
        cwd=ROOT, check=True,
    )


def compile_bpf() -> None:
    """Build the ebpf backend's C helpers (Maglev, CT GC) with the host's C compiler
    whenever there is one, and its programs when clang is there and works; a missing or
    failing compiler leaves its part out (Python does the helpers' work; the backend says
    so when started, and how to build the programs) and never fails the package's build."""
    build = ROOT / "backends" / "ebpf" / "build.py"
    subprocess.run([sys.executable, str(build), "--native"], cwd=ROOT, check=False)
    if shutil.which("clang") is None:
        print("setup: clang not found; the ebpf backend's programs are not built")
        return
    try:
        subprocess.run([sys.executable, str(build), "--bpf"], cwd=ROOT, check=True)
    except subprocess.CalledProcessError as err:
        print(f"setup: building the ebpf backend's programs failed ({err}); the package is "
              "built without them (python -m svcproxy.backends.ebpf.build builds them later)")


class BuildWithProtos(build_py):
    def run(self) -> None:
        generate_protos()
        compile_bpf()
        super().run()


if __name__ == "__main__":
    generate_protos()
    setup(cmdclass={"build_py": BuildWithProtos})
