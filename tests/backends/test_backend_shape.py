"""One shape per backend (issue 29 item 4): every ``backends/<name>/`` holds the same
modules, so a reader who knows one backend finds their way in another.

* ``render.py``: the render stage, pure (no I/O: it imports no module that reaches the
  kernel, a process or a file); more of it in ``render_*.py`` beside it;
* ``apply.py``: the kernel side (the transactions, the programs, the syscalls);
* ``names.py``, ``cli.py`` (the entry point's ``add_arguments`` and ``create``),
  ``drift.py`` (what the kernel no longer holds as applied), ``backend.py`` (the backend,
  on the SDK's ``StagedBackend``), ``README.md`` (its page of the documentation);
* no public class named as a public name of ``svcproxy.sdk`` (two things, one name: a
  reader of ``Applied`` must know which it is).

The shape is a dataplane's. A backend that programs nothing (``dataplane = False``: the
``dump`` backend, which prints the state) has no kernel to apply to or drift from; it is the
guide's smallest complete backend, and is checked to stay that: one ``Backend`` class in
``backend.py``, its ``cli.py``, its page ``docs/backends/<name>.md``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

import svcproxy.sdk
from tests.support.paths import REPO

BACKENDS = REPO / "backends"
MODULES = ("render.py", "apply.py", "names.py", "cli.py", "drift.py", "backend.py",
           "README.md")
# What a pure render may not import (I/O: processes, sockets, files, the kernel).
IMPURE = {"subprocess", "socket", "ctypes", "os", "shutil", "tempfile", "threading",
          "pathlib", "select", "fcntl", "mmap", "urllib", "http", "requests", "grpc"}
NOT_DATAPLANES = ("dump",)


def shape_faults(directory: Path) -> list[str]:
    """What of the shape ``directory`` lacks (empty: it has the shape)."""
    faults = [f"no {name}" for name in MODULES if not (directory / name).exists()]
    for path in sorted(directory.glob("render*.py")):
        for module in _imports(path):
            if module.split(".")[0] in IMPURE:
                faults.append(f"{path.name} imports {module} (render is pure)")
    public = set(svcproxy.sdk.__all__)
    for path in sorted(directory.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name in public:
                faults.append(f"{path.name}: class {node.name} is also svcproxy.sdk's")
    return faults


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def staged(module: ModuleType) -> bool:
    """Whether ``module`` defines a backend on the SDK's ``StagedBackend``."""
    return any(isinstance(value, type) and issubclass(value, svcproxy.sdk.StagedBackend)
               and value.__module__ == module.__name__ for value in vars(module).values())


def _backends() -> list[str]:
    return sorted(p.name for p in BACKENDS.iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize("name", [n for n in _backends() if n not in NOT_DATAPLANES])
def test_every_backend_has_the_same_modules(name: str) -> None:
    faults = shape_faults(BACKENDS / name)
    if not faults and not staged(importlib.import_module(f"svcproxy.backends.{name}.backend")):
        faults.append("backend.py defines no StagedBackend")
    assert not faults, f"backends/{name}: " + "; ".join(faults)


@pytest.mark.parametrize("name", NOT_DATAPLANES)
def test_a_backend_that_programs_nothing_is_one_class_and_its_cli(name: str) -> None:
    module = importlib.import_module(f"svcproxy.backends.{name}.backend")
    backends = [value for value in vars(module).values()
                if isinstance(value, type) and issubclass(value, svcproxy.sdk.Backend)
                and value.__module__ == module.__name__]
    assert len(backends) == 1 and backends[0].dataplane is False, backends
    assert sorted(p.name for p in (BACKENDS / name).glob("*.py")) == [
        "__init__.py", "backend.py", "cli.py"]
    assert (REPO / "docs" / "backends" / f"{name}.md").exists()


def test_the_check_finds_each_fault(tmp_path: Path) -> None:
    """A backend missing a module, with an impure render and a class named as the SDK's:
    each fault is named; a backend module without a StagedBackend is found."""
    (tmp_path / "render_table.py").write_text("import subprocess\n")
    (tmp_path / "drift.py").write_text("class Applied:\n    pass\n")
    faults = shape_faults(tmp_path)
    assert {"no render.py", "no apply.py", "no names.py", "no cli.py", "no backend.py",
            "no README.md"} <= set(faults)
    assert "render_table.py imports subprocess (render is pure)" in faults
    assert "drift.py: class Applied is also svcproxy.sdk's" in faults
    assert not staged(importlib.import_module("svcproxy.backends.dump.backend"))
    assert staged(importlib.import_module("svcproxy.backends.nft.backend"))
