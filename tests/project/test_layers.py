"""Layers that only point down: every import of every module, checked against one order.

``LAYERS`` is the order, lowest first. A module belongs to the group of the longest
prefix naming it; it may import its own group and any group of a lower layer, never a
group of its own layer or above. Imports inside functions and under ``TYPE_CHECKING``
count too: a lazy import is still a dependency. No set of packages may import each
other in a circle either (the layers leave that possible only inside one group).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Where each top package's sources are (pyproject.toml's package-dir).
SOURCES = {"svcproxy": ROOT / "svcproxy", "svcproxy.frontend": ROOT / "frontend",
           "svcproxy.backends": ROOT / "backends"}

# Lowest first; each layer is a set of groups, each group a tuple of module prefixes.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"base": ("svcproxy.model", "svcproxy.wirevalues", "svcproxy.loop_thread",
              "svcproxy.durations", "svcproxy.collector", "svcproxy.httpserve")},
    {"api": ("svcproxy.v1", "svcproxy.convert")},
    # The SDK holds the node agent too: run_agent, which it exports, runs all of it.
    {"sdk": ("svcproxy.sdk",)},
    {"kubeproxy": ("svcproxy.kubeproxy",)},
    # Backends are built as a stranger's would be: none imports another.
    {"backends.dump": ("svcproxy.backends.dump",), "backends.nft": ("svcproxy.backends.nft",),
     "backends.iptables": ("svcproxy.backends.iptables",),
     "backends.ipvs": ("svcproxy.backends.ipvs",), "backends.ebpf": ("svcproxy.backends.ebpf",)},
    # The frontend, along its data flow (docs/design.md's table).
    {"frontend.runtime": ("svcproxy.frontend.runtime",)},
    {"frontend.edge": ("svcproxy.frontend.edge",)},
    {"frontend.sources": ("svcproxy.frontend.sources",)},
    {"frontend.intake": ("svcproxy.frontend.intake",)},
    {"frontend.store": ("svcproxy.frontend.store",)},
    {"frontend.computation": ("svcproxy.frontend.computation",)},
    {"frontend.publication": ("svcproxy.frontend.publication",)},
    {"frontend.pipeline": ("svcproxy.frontend.pipeline",)},
    {"frontend.admission": ("svcproxy.frontend.admission",)},
    {"frontend.access": ("svcproxy.frontend.serving.access",)},
    {"frontend.fleet": ("svcproxy.frontend.fleet",)},
    {"frontend.serving": ("svcproxy.frontend.serving",)},
    {"frontend.app": ("svcproxy.frontend",)},
    # What runs the layers below: the svcproxy command (local mode in it) and the
    # testing helper that needs a frontend.
    {"top": ("svcproxy.cli", "svcproxy.testing")},
)

# Upward imports inside frontend/ that are being removed (issue 29), as (importing group,
# imported group). A pair that no longer happens must be deleted here; none may be added.
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset({
})


@dataclass(frozen=True, slots=True)
class Import:
    """One import: who, of what, where."""

    source: str
    target: str
    where: str


def module_files(sources: Mapping[str, Path] = SOURCES) -> dict[str, Path]:
    """Every module of the project by dotted name."""
    found: dict[str, Path] = {}
    for prefix, base in sorted(sources.items(), key=lambda item: -len(item[0])):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join([prefix, *parts]), path)
    return found


def imports_of(name: str, path: Path, text: str, modules: Iterable[str]) -> list[Import]:
    """Every project module ``name``'s source imports (relative imports resolved; for
    ``from package import name`` the submodule when it is one)."""
    known = set(modules)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [s for s in subs if s in known] or [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append(Import(name, target, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


@functools.cache
def _imports(name: str, path: Path, text: str, modules: frozenset[str]) -> tuple[Import, ...]:
    return tuple(imports_of(name, path, text, modules))


def all_imports(extra: Mapping[str, str] | None = None) -> list[Import]:
    """Every import of every module (``extra``: module name -> source, added or replacing
    a file, for the mutant test)."""
    extra = extra or {}
    files = module_files()
    names = frozenset(files) | frozenset(extra)
    found: list[Import] = []
    for name in sorted(names):
        path = files.get(name) or ROOT / "svcproxy" / (name.replace(".", "/") + ".py")
        text = extra[name] if name in extra else path.read_text()
        found += _imports(name, path, text, names)
    return found


def group_of(module: str) -> tuple[int, str]:
    """(layer index, group name) of the longest prefix naming ``module``."""
    best: tuple[int, int, str] | None = None
    for rank, layer in enumerate(LAYERS):
        for group, prefixes in layer.items():
            for prefix in prefixes:
                if module == prefix or module.startswith(prefix + "."):
                    if best is None or len(prefix) > best[0]:
                        best = (len(prefix), rank, group)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return best[1], best[2]


def neutral(module: str, imports: list[Import]) -> bool:
    """A package's ``__init__`` that imports nothing (running it loads nothing)."""
    return module in PACKAGES_WITHOUT_GROUP and not any(i.source == module for i in imports)


PACKAGES_WITHOUT_GROUP = {"svcproxy", "svcproxy.backends"}


def upward(imports: list[Import]) -> list[Import]:
    """The imports of a group of the same layer or above (other than its own group)."""
    wrong = []
    for imp in imports:
        if neutral(imp.target, imports):
            continue
        (src_rank, src), (dst_rank, dst) = group_of(imp.source), group_of(imp.target)
        if src != dst and dst_rank >= src_rank:
            wrong.append(imp)
    return wrong


def groups(imp: Import) -> tuple[str, str]:
    """(importing group, imported group)."""
    return group_of(imp.source)[1], group_of(imp.target)[1]


def package_of(module: str, files: Mapping[str, Path]) -> str:
    path = files.get(module)
    is_package = path is not None and path.name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def cycles(imports: list[Import], files: Mapping[str, Path]) -> list[list[str]]:
    """The strongly connected sets of packages (more than one package each)."""
    edges: dict[str, set[str]] = {}
    for imp in imports:
        a, b = package_of(imp.source, files), package_of(imp.target, files)
        if a != b:
            edges.setdefault(a, set()).add(b)
            edges.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's, iterative over the few dozen packages
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def described(imports: Iterable[Import]) -> str:
    return "\n".join(f"  {i.where}: {i.source} imports {i.target}" for i in imports)


def test_every_module_is_in_a_layer() -> None:
    for name in module_files():
        if name not in PACKAGES_WITHOUT_GROUP:
            group_of(name)


def test_no_import_points_up() -> None:
    found = upward(all_imports())
    wrong = [i for i in found if groups(i) not in KNOWN_UPWARD]
    assert not wrong, "imports of a layer above (move the code down, or it up):\n" + \
        described(wrong)


def test_known_upward_imports_still_exist() -> None:
    seen = {groups(i) for i in upward(all_imports())}
    gone = sorted(KNOWN_UPWARD - seen)
    assert not gone, f"fixed: delete these from KNOWN_UPWARD: {gone}"


def test_no_packages_import_each_other_in_a_circle() -> None:
    imports = [i for i in all_imports() if groups(i) not in KNOWN_UPWARD]
    found = cycles(imports, module_files())
    assert not found, "packages importing each other in a circle:\n" + "\n".join(
        f"  {c}: " + described(i for i in imports if i.source.startswith(tuple(c)) and
                               any(i.target.startswith(p) for p in c if
                                   not i.source.startswith(p)))[:2000] for c in found)


def test_an_upward_import_is_caught() -> None:
    """Mutants: the base model importing the SDK, the SDK a lazy import of the agent, a
    backend another backend, and a circle inside one group."""
    mutants = {
        "svcproxy.model": (ROOT / "svcproxy" / "model.py").read_text()
        + "\n\ndef f():\n    from svcproxy.sdk import Backend\n",
        "svcproxy.sdk.mutant": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    import svcproxy.kubeproxy.cli\n",
        "svcproxy.kubeproxy.mutant": "def f():\n    from svcproxy.cli import local_frontend\n",
        "svcproxy.backends.nft.mutant": "from svcproxy.backends.iptables import render\n",
    }
    for name, text in mutants.items():
        caught = [i for i in upward(all_imports({name: text})) if i.source == name]
        assert caught, f"{name}: {text!r} was not caught"
    assert upward(all_imports({"svcproxy.sdk.ok": "from svcproxy.model import Endpoint\n"})) \
        == upward(all_imports())
    files = module_files()
    circle = [Import("svcproxy.sdk.a.x", "svcproxy.sdk.b.y", ""),
              Import("svcproxy.sdk.b.y", "svcproxy.sdk.a.x", "")]
    assert not upward(circle), "one group: the layers allow it, the circle check does not"
    assert cycles(circle, files) == [["svcproxy.sdk.a", "svcproxy.sdk.b"]]
