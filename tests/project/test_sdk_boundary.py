"""Built-in backends are built as a stranger's would be: they import only svcproxy.sdk."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import svcproxy.sdk
import svcproxy.sdk.testing
import svcproxy.testing
from svcproxy.sdk.plugins import installed_backends
from tests.support.paths import REPO

ROOT = REPO
BUILT_INS = sorted(p.parent.name for p in (ROOT / "backends").glob("*/cli.py"))


def svcproxy_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import of a svcproxy module in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, m) for line, m in found if m.split(".")[0] == "svcproxy"]


@pytest.mark.parametrize("name", BUILT_INS)
def test_backend_imports_only_the_sdk_and_itself(name: str) -> None:
    allowed = ("svcproxy.sdk", f"svcproxy.backends.{name}")
    wrong = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in sorted((ROOT / "backends" / name).rglob("*.py"))
             for line, module in svcproxy_imports(path)
             if not any(module == a or module.startswith(a + ".") for a in allowed)]
    assert not wrong, "import these through svcproxy.sdk instead:\n" + "\n".join(wrong)


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from svcproxy.model import Endpoint\nimport svcproxy.sdk.agent\n"
                   "from svcproxy.sdk import Backend\nfrom . import names\n")
    assert [m for _, m in svcproxy_imports(bad)] == [
        "svcproxy.model", "svcproxy.sdk.agent", "svcproxy.sdk"]


def test_every_built_in_is_registered() -> None:
    assert set(BUILT_INS) <= installed_backends().keys()


def test_public_surface_is_documented_and_importable() -> None:
    for name in svcproxy.sdk.__all__:
        value = getattr(svcproxy.sdk, name)
        if callable(value):
            doc = (value.__doc__ or "").strip()
            generated = isinstance(value, type) and doc.startswith(f"{value.__name__}(")
            assert doc and not generated, f"svcproxy.sdk.{name} has no docstring"
    assert (ROOT / "svcproxy" / "sdk" / "py.typed").exists()


# The names of API_VERSION 1.x. Removing or renaming one is a breaking change: it needs
# API_VERSION (2, 0) and this set rewritten with it; adding one raises the minor version.
STABLE_V1 = {
    "API_VERSION", "DEFAULT_AFFINITY_TIMEOUT", "ENTRY_POINT_GROUP", "Applied", "Backend",
    "BackendPlugin", "Changes", "Delta", "Endpoint", "LoadBalancerIngress", "NodeConfig",
    "NodeInfo", "NodeState", "NodeStateClient", "Protocol", "ServicePort", "ServicePortKey",
    "ServicePortState", "ServiceType", "SessionAffinity", "StagedBackend", "TrafficPolicy",
    "add_agent_arguments", "cidr_list", "config_from_args", "ip_family", "node_port_ips",
    "node_to_pb", "normalize_cidr", "normalize_ip", "of_family", "parse_duration",
    "primary_node_ips", "run", "run_agent", "state_to_pb", "tls_credentials",
    "FamilyContext", "LocalTraffic", "NodeContext", "interface_addresses", "resolve_context",
}


def test_names_are_stable_within_the_major_version() -> None:
    major, minor = svcproxy.sdk.API_VERSION
    assert major == 1, "a new major version: rewrite STABLE_V1 for it"
    missing = STABLE_V1 - set(svcproxy.sdk.__all__)
    assert not missing, f"removed without a new major API_VERSION: {sorted(missing)}"
    added = set(svcproxy.sdk.__all__) - STABLE_V1
    assert not added or minor > 0, f"added {sorted(added)}: raise API_VERSION's minor"
    assert set(svcproxy.sdk.testing.__all__) >= {"FakeSource"}
    assert set(svcproxy.testing.__all__) >= {"FakeCluster"}  # needs the frontend: not the SDK
