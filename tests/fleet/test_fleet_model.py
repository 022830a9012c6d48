"""The fleet's pure parts with made-up times: node states, the cluster-wide programming
latency, the addresses a wait parses, and what a wait counts."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from svcproxy.frontend.fleet.conditions import Address, parse_address, routes_to
from svcproxy.frontend.fleet.latency import MAX_FOLLOWED, ClusterLatency
from svcproxy.frontend.fleet.model import Fleet, Report, Served, State
from svcproxy.frontend.fleet.waits import Wait
from svcproxy.frontend.publication.wire import WireOp
from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    TrafficPolicy,
)

KEY = ServicePortKey("shop", "web", "http", Protocol.TCP)


def report(revision: int, digest: int | None = 7) -> Report:
    return Report(revision=revision, epoch="e", digest=digest, applied_time=0.0)


def connected_fleet(*names: str, lag_warning: float = 10.0) -> Fleet:
    fleet = Fleet(lag_warning)
    fleet.connections(names, now=0.0)
    return fleet


def test_states_follow_reports_publications_and_time() -> None:
    fleet = connected_fleet("a")
    a = fleet.nodes["a"]
    assert fleet.update_state(a, Served(5, 7), 0.0) is None and a.state is State.UNKNOWN
    fleet.reported("a", report(5), 1.0)
    fleet.update_state(a, Served(5, 7), 1.0)
    assert a.state is State.APPLIED
    fleet.published(6, ["a"], now=2.0)
    fleet.update_state(a, Served(6, 8), 2.5)
    assert a.state is State.SYNCING and a.lag_seconds(2.5) == 0.5
    fleet.update_state(a, Served(6, 8), 12.5)
    assert a.state is State.LAGGING
    fleet.reported("a", report(6, digest=9), 13.0)
    fleet.update_state(a, Served(6, 8), 13.0)
    assert a.state is State.DISAGREEING and not a.pending
    fleet.reported("a", report(6, digest=8), 14.0)
    assert fleet.update_state(a, Served(6, 8), 14.0) is State.DISAGREEING
    assert a.state is State.APPLIED
    fleet.connections([], now=15.0)
    fleet.update_state(a, Served(6, 8), 15.0)
    assert a.state is State.DISCONNECTED
    assert fleet.forget(15.0 + fleet.forget_after + 1) == ["a"]


def test_a_node_that_never_reports_is_unknown_however_long_it_is_behind() -> None:
    fleet = connected_fleet("silent", lag_warning=1.0)
    silent = fleet.nodes["silent"]
    fleet.published(6, ["silent"], now=0.0)
    fleet.update_state(silent, Served(6, 1), 1000.0)
    assert silent.state is State.UNKNOWN
    assert fleet.counts()["UNKNOWN"] == 1 and fleet.counts()["LAGGING"] == 0


def test_pending_batches_are_bounded_and_keep_the_oldest_time() -> None:
    fleet = connected_fleet("a")
    fleet.reported("a", report(1), 0.0)
    for revision in range(2, 1000):
        fleet.published(revision, ["a"], now=float(revision))
    a = fleet.nodes["a"]
    assert len(a.pending) <= 256 and a.pending[0] == (2, 2.0) and a.pending[-1][0] == 999
    fleet.reported("a", report(999), 1000.0)
    assert not a.pending


def test_cluster_latency_is_observed_when_the_last_counted_node_applied() -> None:
    seen: list[float] = []
    latency = ClusterLatency(seen.append)
    latency.published(10, trigger_time=100.0, nodes=["a", "b"], now=100.5)
    latency.applied("a", 10, now=101.0)
    assert seen == []
    latency.applied("b", 9, now=102.0)  # not that revision yet
    assert seen == []
    latency.applied("b", 11, now=103.0)
    assert seen == [3.0]
    latency.published(12, trigger_time=200.0, nodes=["a", "b"], now=200.0)
    latency.left("b", now=201.0)
    latency.applied("a", 12, now=202.0)
    assert seen == [3.0, 2.0]
    latency.published(13, trigger_time=0.0, nodes=["a"], now=300.0)  # no trigger time
    for revision in range(14, 14 + MAX_FOLLOWED + 5):
        latency.published(revision, 1.0, ["a"], now=2.0)
    assert len(latency.followed) == MAX_FOLLOWED and latency.dropped == 5


@pytest.mark.parametrize(("text", "address"), [
    ("10.0.0.1", Address("10.0.0.1")), ("10.0.0.1:8080", Address("10.0.0.1", 8080)),
    ("fd00::1", Address("fd00::1")), ("[fd00::1]:80", Address("fd00::1", 80)),
    ("FD00:0::1", Address("fd00::1"))])
def test_addresses(text: str, address: Address) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["", "10.0.0.300", "10.0.0.1:0", "10.0.0.1:65536",
                                  "[fd00::1]x", "pod-a", "10.0.0.1:http"])
def test_not_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)


def record(etp_local: bool = False, **endpoint: object
           ) -> dict[ServicePortKey, ServicePortState]:
    ep = Endpoint(ip="10.0.0.1", port=8080, **endpoint)  # type: ignore[arg-type]
    service = ServicePort(KEY, type=ServiceType.NODE_PORT, external_traffic_policy=(
        TrafficPolicy.LOCAL if etp_local else TrafficPolicy.CLUSTER))
    return {KEY: ServicePortState(service, {"10.0.0.1": ep})}


@pytest.mark.parametrize("sets", ["internal", "external"])
def test_an_address_in_the_internal_or_external_set_is_routed_to(sets: str) -> None:
    assert routes_to(record(**{sets: True}), Address("10.0.0.1"))
    assert routes_to(record(**{sets: True}), Address("10.0.0.1", 8080))
    assert not routes_to(record(**{sets: True}), Address("10.0.0.1", 9090))


def test_the_cluster_set_routes_only_where_external_traffic_is_short_circuited() -> None:
    assert routes_to(record(etp_local=True, cluster=True), Address("10.0.0.1"))
    assert not routes_to(record(cluster=True), Address("10.0.0.1"))


def test_an_address_in_no_routed_set_is_not_routed_to() -> None:
    # A node's serving, terminating pod with ready ones elsewhere: in its local set (no
    # local endpoint is ready), in no set traffic uses.
    assert not routes_to(record(ready=False, terminating=True, local=True),
                         Address("10.0.0.1"))


@dataclass
class View:
    revision: int
    records: dict[ServicePortKey, ServicePortState]
    history_start: int = 0
    history: list[tuple[int, list[WireOp]]] = field(default_factory=list)


def test_a_wait_counts_reporting_nodes_and_lost_ones_only_for_a_while() -> None:
    fleet = connected_fleet("a", "b", "silent")
    for name in ("a", "b"):
        fleet.reported(name, report(5), 0.0)
        fleet.update_state(fleet.nodes[name], Served(5, 7), 0.0)
    routed = View(5, record(internal=True))
    gone = View(6, {})
    wait = Wait.endpoint_gone(Address("10.0.0.1"), lost_after=10.0)
    views = {"a": gone, "b": routed, "silent": gone}
    progress = wait.progress(fleet, views, now=1.0)
    assert progress.counted == ("a", "b") and progress.unknown == ("silent",)
    assert progress.behind == ("a", "b")  # a has not applied revision 6 yet
    fleet.reported("a", report(6), 2.0)
    assert wait.progress(fleet, views, now=2.0).behind == ("b",)
    fleet.connections(["a", "silent"], now=3.0)  # b disconnects
    assert wait.progress(fleet, views, now=12.0).behind == ("b",)
    assert wait.progress(fleet, views, now=13.5).done


def test_the_cluster_latency_has_the_per_node_latencys_buckets() -> None:
    from svcproxy.frontend.fleet.metrics import NETWORK_PROGRAMMING_BUCKETS as CLUSTER
    from svcproxy.sdk.metrics import NETWORK_PROGRAMMING_BUCKETS as PER_NODE

    assert CLUSTER == PER_NODE
