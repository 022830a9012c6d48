"""No two public classes with one name for two things (issue 29, item 4).

A public class is a module-level ``class`` whose name has no leading underscore, in a
module of the product (``svcproxy/``, ``frontend/``, ``backends/``: pyproject.toml's
package-dir) or of ``tests/support/``. The helpers there are the tests' shared API,
imported by name from many test files, so a reader meets their names as often as the
product's. A test module's own classes are its private fixtures, named for that file
alone: two test files may each have a ``World``. ``svcproxy/v1`` is generated from the
proto and git-ignored; its names are the proto's. A re-export (``from x import Name``)
is not a definition: one class, one name, wherever it is imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Where each package's sources are (pyproject.toml's package-dir), and the tests' helpers.
SOURCES = {"svcproxy": ROOT / "svcproxy", "svcproxy.frontend": ROOT / "frontend",
           "svcproxy.backends": ROOT / "backends", "tests.support": ROOT / "tests" / "support"}
GENERATED = (ROOT / "svcproxy" / "v1",)


def module_files(sources: Mapping[str, Path]) -> dict[str, Path]:
    """Every module under ``sources`` by dotted name, generated code left out."""
    found: dict[str, Path] = {}
    for prefix, base in sources.items():
        for path in sorted(base.rglob("*.py")):
            if any(path.is_relative_to(g) for g in GENERATED):
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import, also inside a module-level if/try/with."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.With):
            yield from _module_level(stmt.body)
            yield from _module_level(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody,
                          *(h.body for h in stmt.handlers)):
                yield from _module_level(block)


def public_classes(path: Path) -> set[str]:
    """The public classes ``path`` defines (imports are not definitions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {stmt.name for stmt in _module_level(tree.body)
            if isinstance(stmt, ast.ClassDef) and not stmt.name.startswith("_")}


def shared_names(modules: Mapping[str, Path]) -> dict[str, list[str]]:
    """Each public class name defined in more than one module, with those modules."""
    where: defaultdict[str, list[str]] = defaultdict(list)
    for module, path in sorted(modules.items()):
        for name in public_classes(path):
            where[name].append(module)
    return {name: mods for name, mods in sorted(where.items()) if len(mods) > 1}


def test_the_check_finds_a_name_defined_twice_and_only_that(tmp_path: Path) -> None:
    """Two definitions are reported; a re-export, a private or a nested class is not."""
    (tmp_path / "a.py").write_text("class Spec:\n    class Inner: ...\nclass _Hidden: ...\n")
    (tmp_path / "b.py").write_text(
        "from a import Spec as Spec\nif True:\n    class Inner: ...\nclass _Hidden: ...\n")
    (tmp_path / "c.py").write_text("try:\n    class Spec: ...\nexcept ImportError:\n    pass\n")
    modules = module_files({"pkg": tmp_path})
    assert shared_names(modules) == {"Spec": ["pkg.a", "pkg.c"]}


def test_no_public_class_name_means_two_things() -> None:
    """Every public class name of the product and tests/support is defined once."""
    shared = shared_names(module_files(SOURCES))
    assert not shared, "public classes with one name in two modules (rename one to what it " \
        "holds):\n" + "\n".join(f"  {name}: {', '.join(mods)}" for name, mods in shared.items())
