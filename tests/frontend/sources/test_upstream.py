"""--upstream: a frontend chained to another serves every node exactly the same state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from svcproxy.convert import state_from_pb
from svcproxy.frontend.main import FrontendOptions
from svcproxy.frontend.sources.events import Delete, Upsert
from svcproxy.model import ServicePortKey, ServicePortState
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.examples import copy_examples, web_slice
from tests.support.frontend import RunningFrontend
from tests.support.objects import endpoint, node, service, slice_
from tests.support.waiting import wait_for

NODES = ("node-a", "node-b", "node-z", "")


def node_state(fe: RunningFrontend, name: str) -> dict[ServicePortKey, ServicePortState]:
    """GetNodeState as records, trigger times aside (they round-trip at microseconds)."""
    import grpc

    with grpc.insecure_channel(fe.opts.listen) as ch:
        api = pb_grpc.NodeStateServiceStub(ch)
        if name:
            services = list(api.GetNodeState(pb.GetNodeStateRequest(node_name=name),
                                             timeout=10).services)
        else:  # the cluster's: its snapshot (GetNodeState needs a node name)
            services = []
            for event in api.WatchCluster(pb.ClusterWatchRequest(), timeout=10):
                services += [op.replace_service for op in event.ops
                             if op.HasField("replace_service")]
                if not event.more:
                    break
    out = {}
    for rec in map(state_from_pb, services):
        out[rec.key] = dataclasses.replace(
            rec, service=dataclasses.replace(rec.service, trigger_time=0.0))
    return out


def same_everywhere(up: RunningFrontend, down: RunningFrontend) -> Callable[[], bool]:
    return lambda: all(node_state(up, n) == node_state(down, n) for n in NODES)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[tuple[RunningFrontend, RunningFrontend]]:
    up = RunningFrontend(FrontendOptions(manifests=copy_examples(tmp_path),
                                         listen=f"unix://{tmp_path}/up.sock",
                                         metrics_bind_address="")).start()
    down = RunningFrontend(FrontendOptions(upstream=f"unix://{tmp_path}/up.sock",
                                           listen=f"unix://{tmp_path}/down.sock",
                                           metrics_bind_address="")).start()
    try:
        yield up, down
    finally:
        down.stop()
        up.stop()


def hinted(ip: str, node_name: str, zone: str, **kw: Any) -> dict[str, Any]:
    ep = endpoint(ip, node_name, **kw)
    ep.update(zone=zone, hints={"forZones": [{"name": zone}]})
    return ep


def test_chained_frontend_serves_the_same_state(chain) -> None:  # type: ignore[no-untyped-def]
    up, down = chain
    wait_for(lambda: down.engine.synced.is_set(), timeout=20)
    wait_for(same_everywhere(up, down), timeout=20)
    assert node_state(down, "node-a"), "the examples have services"

    # Topology hints, Local policies, terminating endpoints, a second family:
    # everything the per-node selection depends on must survive the chain.
    up.submit([
        Upsert("Node", node("node-a", "zone-a")), Upsert("Node", node("node-b", "zone-b")),
        Upsert("Service", service("zoned", ip="10.96.9.9", type="NodePort",
                                  externalTrafficPolicy="Local",
                                  internalTrafficPolicy="Local",
                                  trafficDistribution="PreferClose")),
        Upsert("EndpointSlice", slice_("zoned-1", "zoned", [
            hinted("10.244.1.5", "node-a", "zone-a"),
            hinted("10.244.2.5", "node-b", "zone-b"),
            hinted("10.244.2.6", "node-b", "zone-b", ready=False, serving=True,
                   terminating=True)])),
        Upsert("EndpointSlice", slice_("zoned-6", "zoned", [endpoint("fd00::5", "node-a")],
                                       family="IPv6")),
    ])
    wait_for(same_everywhere(up, down), timeout=20)
    zoned = ServicePortKey("default", "zoned", "http", "TCP")  # type: ignore[arg-type]
    rec = node_state(down, "node-b")[zoned]
    assert {e.ip for e in rec.internal_endpoints()} == {"10.244.2.5"}

    up.submit([Upsert("EndpointSlice", web_slice(2)), Delete("Service", "default", "zoned")])
    wait_for(same_everywhere(up, down), timeout=20)
    assert zoned not in node_state(down, "node-a")


def test_chained_frontend_follows_an_upstream_restart(tmp_path: Path) -> None:
    manifests = copy_examples(tmp_path)
    opts = FrontendOptions(manifests=manifests, listen=f"unix://{tmp_path}/up.sock",
                           metrics_bind_address="")
    up = RunningFrontend(opts).start()
    down = RunningFrontend(FrontendOptions(upstream=opts.listen,
                                           listen=f"unix://{tmp_path}/down.sock",
                                           metrics_bind_address="")).start()
    try:
        wait_for(same_everywhere(up, down), timeout=20)
        assert any(k.name == "api" for k in node_state(down, "node-a"))
        up.stop()
        (manifests / "api.yaml").unlink()
        up = RunningFrontend(opts).start()
        wait_for(same_everywhere(up, down), timeout=20)
        assert not any(k.name == "api" for k in node_state(down, "node-a"))
    finally:
        down.stop()
        up.stop()
