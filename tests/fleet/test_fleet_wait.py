"""``svcproxy wait``: the real command, against the real frontend and node agents in
processes of their own (``svcproxy backend dump``, whose output is each backend's own
record of what it applied). A SIGSTOPped agent holds the wait back and is named at the
timeout; one that disconnected stops counting after --node-lost-after."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from svcproxy.frontend.sources.events import Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.examples import copy_examples
from tests.support.fleet_lab import SVCPROXY, Agents, agents, wait_state
from tests.support.objects import endpoint, slice_

GONE = "10.244.1.10"
NEW = "10.244.1.99"
# The timeout of a wait expected to time out (the command's start included).
LATE = "4s"


def wait_cmd(api: str, *args: str, timeout: str = "60s") -> list[str]:
    return [SVCPROXY, "wait", "--api", api, *args, "--timeout", timeout]


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def node_a_applied(fe) -> None:  # type: ignore[no-untyped-def]
    """Wait until node-a applied every change so far (node-b is the one behind)."""
    revision = fe._loop.run(lambda: fe.engine.changelog.view("node-a").revision, 10)
    wait_state(fe.opts.listen, "node-a", pb.NODE_APPLIED, applied_revision=revision)


def web_without_gone(*extra: str) -> dict:
    """Service web's slice without GONE (and with ``extra`` ready endpoints on node-a)."""
    eps = [endpoint("10.244.1.11", node="node-a"), endpoint("10.244.2.10", node="node-b"),
           *(endpoint(ip, node="node-a") for ip in extra)]
    return slice_("web-abc12", "web", eps, ns="shop", port=8080)


def applied_ips(started: Agents, node: str) -> set[str]:
    """The endpoint IPs of Service web in the last sync the node's backend wrote."""
    lines = [json.loads(line) for line in
             started.output_file(node).read_text().splitlines() if line.strip()]
    held: dict[str, set[str]] = {}  # by ServicePortKey's str
    for line in lines:
        if line["type"] == "snapshot":
            held = {}
        for record in line.get("services", []) + line.get("set", []):
            key = record["service"]["key"]
            if key["namespace"] == "shop" and key["name"] == "web":
                port = f":{key['portName']}" if key.get("portName") else ""
                name = f"shop/web{port}/{key.get('protocol', 'TCP').lower()}"
                held[name] = {e["ip"] for e in record.get("endpoints", [])}
        for deleted in line.get("deleted", []):
            held.pop(deleted, None)
    return set().union(*held.values())


@pytest.fixture
def fleet(frontend_factory, tmp_path: Path):  # type: ignore[no-untyped-def]
    fe = frontend_factory(copy_examples(tmp_path))
    with agents(fe.opts.listen, tmp_path) as started:
        started.start("node-a")
        started.start("node-b")
        wait_state(fe.opts.listen, "node-a", pb.NODE_APPLIED)
        wait_state(fe.opts.listen, "node-b", pb.NODE_APPLIED)
        yield fe, started


def test_endpoint_gone_returns_only_once_the_last_node_applied_the_removal(fleet) -> None:  # type: ignore[no-untyped-def]
    fe, started = fleet
    api = fe.opts.listen
    assert GONE in applied_ips(started, "node-a") and GONE in applied_ips(started, "node-b")
    started.pause("node-b")
    fe.submit([Upsert("EndpointSlice", web_without_gone())])
    node_a_applied(fe)
    late = run(wait_cmd(api, "--endpoint-gone", GONE, timeout=LATE))
    assert late.returncode == 1
    assert "1 of 2 nodes still behind: node-b" in late.stderr, late.stderr
    assert GONE not in applied_ips(started, "node-a")
    assert GONE in applied_ips(started, "node-b")  # it holds the endpoint still
    waiting = subprocess.Popen(wait_cmd(api, "--endpoint-gone", GONE),
                               stderr=subprocess.PIPE, text=True)
    try:
        started.resume("node-b")
        assert waiting.wait(60) == 0, waiting.stderr.read() if waiting.stderr else ""
    finally:
        waiting.kill()
        waiting.wait()
    # When it returned, node-b's own backend had applied the removal.
    assert GONE not in applied_ips(started, "node-b")


def test_a_service_revision_and_a_ready_endpoint_are_waited_for(fleet) -> None:  # type: ignore[no-untyped-def]
    fe, started = fleet
    api = fe.opts.listen
    started.pause("node-b")
    fe.submit([Upsert("EndpointSlice", web_without_gone(NEW))])
    node_a_applied(fe)
    late = run(wait_cmd(api, "--service", "shop/web", timeout=LATE))
    assert late.returncode == 1 and "still behind: node-b" in late.stderr, late.stderr
    assert run(wait_cmd(api, "--service", "kube-system/dns", timeout="20s")).returncode == 0
    late = run(wait_cmd(api, "--endpoint-ready", NEW, timeout=LATE))
    assert late.returncode == 1 and "still behind: node-b" in late.stderr, late.stderr
    started.resume("node-b")
    ready = run(wait_cmd(api, "--endpoint-ready", NEW))
    assert ready.returncode == 0, ready.stderr
    assert NEW in applied_ips(started, "node-a") and NEW in applied_ips(started, "node-b")
    assert run(wait_cmd(api, "--service", "shop/web")).returncode == 0


def test_a_node_that_disconnected_stops_counting_after_node_lost_after(fleet) -> None:  # type: ignore[no-untyped-def]
    fe, started = fleet
    api = fe.opts.listen
    started.pause("node-b")
    fe.submit([Upsert("EndpointSlice", web_without_gone())])
    started.kill("node-b")  # gone before it applied the removal
    wait_state(api, "node-b", pb.NODE_DISCONNECTED)
    counted = run(wait_cmd(api, "--endpoint-gone", GONE, "--node-lost-after", "1h",
                           timeout=LATE))
    assert counted.returncode == 1 and "still behind: node-b" in counted.stderr, counted.stderr
    lost = run(wait_cmd(api, "--endpoint-gone", GONE, "--node-lost-after", "1s"))
    assert lost.returncode == 0, lost.stderr


def test_wait_refuses_what_is_not_an_address(fleet) -> None:  # type: ignore[no-untyped-def]
    fe, _ = fleet
    bad = run(wait_cmd(fe.opts.listen, "--endpoint-gone", "10.244.1.300"))
    assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr, bad.stderr
