"""Backends translate the frontend's decision and never re-decide endpoint selection.

The frontend sends kube-proxy's whole categorisation (Endpoint.internal/external/cluster/
local, ServicePort.has_endpoints/has_local_endpoints); a backend that reads an endpoint's
conditions, node or hints is choosing endpoints itself, with a rule of its own.
"""

from __future__ import annotations

import ast

from tests.support.paths import REPO

BACKENDS = REPO / "backends"
# Endpoint fields that only the frontend's selection may read.
CONDITIONS = {"ready", "serving", "terminating", "is_local", "hint_zones", "hint_nodes"}


def condition_reads(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of every read of an endpoint condition in ``source``."""
    return [(node.lineno, node.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in CONDITIONS
            and isinstance(node.ctx, ast.Load)]


def test_the_check_finds_a_re_decision() -> None:
    found = condition_reads("ready = [e for e in eps if e.ready or e.serving and e.terminating]")
    assert {attr for _, attr in found} == {"ready", "serving", "terminating"}
    assert condition_reads("cluster = [e for e in eps if e.cluster]") == []


def test_no_backend_reads_endpoint_conditions() -> None:
    files = sorted(BACKENDS.rglob("*.py"))
    assert len(files) > 20, "the backends were found"
    offences = [f"{path.relative_to(BACKENDS.parent)}:{line}: .{attr}"
                for path in files
                for line, attr in condition_reads(path.read_text())]
    assert not offences, "backends re-decide endpoint selection:\n" + "\n".join(offences)
