"""Three nodes report what they applied, one of them the nft backend in its own network
namespace (the standard lab's node1) and two dump agents: after a change, GetFleet shows
each applied at the revision it is served with the frontend's digest, and node1's kernel
indeed routes the new Service (a real connection from the client pod)."""

from __future__ import annotations

from pathlib import Path

import pytest

from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.fleet_lab import agents, nodes, wait_state
from tests.support.lab import manifests as m
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import ScenarioLab, missing_requirements

pytestmark = pytest.mark.netns
_why = missing_requirements()
NODES = ("node1", "node-b", "node-c")
CLUSTER_IP = "10.96.9.3"


def test_three_nodes_one_with_nft_in_a_namespace_report_what_they_applied(
        tmp_path: Path) -> None:
    if _why:
        pytest.skip(_why)
    lab = ScenarioLab(BackendCase("nft", ("--report-min-interval", "0")))
    try:
        lab.start()
        api = f"unix://{lab.socket}"
        with agents(api, tmp_path) as started:
            started.start("node-b")
            started.start("node-c")
            before = {n: wait_state(api, n, pb.NODE_APPLIED).applied_revision for n in NODES}
            lab.apply("three.yaml", [
                m.service("three", [CLUSTER_IP], [m.port("http", 80, 8080)]),
                m.endpoint_slice("three", [m.endpoint(lab.spec.pod("pod-a"), 4)],
                                 [m.slice_port("http", 8080)], 4)])

            def applied_anew() -> None:
                seen = nodes(api)
                for name in NODES:
                    got = seen[name]
                    assert got.state == pb.NODE_APPLIED and got.connected, got
                    assert got.applied_revision > before[name], got
                    assert got.applied_revision == got.served_revision, got
                    assert got.applied_digest == got.served_digest, got
            lab.eventually(applied_anew, timeout=30)
            backends = {name: got.backend for name, got in nodes(api).items()}
            assert backends == {"node1": "nft", "node-b": "dump", "node-c": "dump"}
            answered = lab.probe("client", "tcp", CLUSTER_IP, 80, 4, timeout=2.0)
            assert answered.answered == {"pod-a"} and not answered.errors, answered
    finally:
        lab.stop()
