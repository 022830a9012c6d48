"""Endpoint selection, table-driven over kube-proxy's CategorizeEndpoints rules."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svcproxy.frontend.computation.selection import categorize
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServiceType, TrafficPolicy

KEY = ServicePortKey("ns", "svc", "http", "TCP")  # type: ignore[arg-type]


def ep(ip: str, *, ready: bool = True, serving: bool | None = None, term: bool = False,
       local: bool = False, zones: tuple[str, ...] = (), nodes: tuple[str, ...] = ()) -> Endpoint:
    return Endpoint(ip=ip, port=80, ready=ready, serving=ready if serving is None else serving,
                    terminating=term, is_local=local, node_name="me" if local else "other",
                    hint_zones=zones, hint_nodes=nodes)


@dataclass
class Case:
    name: str
    endpoints: list[Endpoint]
    internal: set[str]
    external: set[str]
    has_endpoints: bool = True
    itp: TrafficPolicy = TrafficPolicy.CLUSTER
    etp: TrafficPolicy = TrafficPolicy.CLUSTER
    zone: str = "a"
    type: ServiceType = ServiceType.NODE_PORT
    extra: dict[str, object] = field(default_factory=dict)


L = TrafficPolicy.LOCAL
CASES = [
    Case("ready endpoints only", [ep("1"), ep("2", ready=False, serving=False)],
         {"1"}, {"1"}),
    Case("no endpoints at all: reject", [], set(), set(), has_endpoints=False),
    Case("only unready, not serving: reject", [ep("1", ready=False, serving=False)],
         set(), set(), has_endpoints=False),
    Case("terminating fallback when nothing is ready",
         [ep("1", ready=False, serving=True, term=True), ep("2", ready=False, serving=False,
                                                            term=True)],
         {"1"}, {"1"}),
    Case("terminating ignored while a ready endpoint exists",
         [ep("1"), ep("2", ready=False, serving=True, term=True)], {"1"}, {"1"}),
    Case("ETP Local: external uses local only, internal all",
         [ep("1", local=True), ep("2")], {"1", "2"}, {"1"}, etp=L),
    Case("ETP Local with no local endpoint: external empty, service still has endpoints",
         [ep("2")], {"2"}, set(), etp=L),
    Case("ETP Local on a ClusterIP service is ignored (no external traffic)",
         [ep("1", local=True), ep("2")], {"1", "2"}, {"1", "2"}, etp=L,
         type=ServiceType.CLUSTER_IP),
    Case("ITP Local: internal uses local only", [ep("1", local=True), ep("2")],
         {"1"}, {"1", "2"}, itp=L),
    Case("ITP Local with no local endpoint: dropped, not rejected", [ep("2")],
         set(), {"2"}, itp=L),
    Case("Local falls back to local serving-terminating endpoints",
         [ep("1", ready=False, serving=True, term=True, local=True), ep("2")],
         {"1"}, {"2"}, itp=L),
    Case("Local does not use a remote terminating endpoint",
         [ep("1", ready=False, serving=True, term=True), ep("2", ready=False, serving=False)],
         set(), {"1"}, itp=L),
    Case("zone hints used when every endpoint is hinted and the zone appears",
         [ep("1", zones=("a",)), ep("2", zones=("b",))], {"1"}, {"1"}),
    Case("hints ignored when one ready endpoint has none",
         [ep("1", zones=("a",)), ep("2")], {"1", "2"}, {"1", "2"}),
    Case("hints ignored when no endpoint is hinted for this zone",
         [ep("1", zones=("b",)), ep("2", zones=("c",))], {"1", "2"}, {"1", "2"}),
    Case("hints ignored when the node has no zone",
         [ep("1", zones=("a",)), ep("2", zones=("b",))], {"1", "2"}, {"1", "2"}, zone=""),
    Case("unready endpoints need no hint",
         [ep("1", zones=("a",)), ep("2", ready=False, serving=False)], {"1"}, {"1"}),
    Case("PreferSameNode: node hints win over zone hints",
         [ep("1", zones=("a",), nodes=("me",)), ep("2", zones=("a",), nodes=("other",))],
         {"1"}, {"1"}),
    Case("PreferSameNode without a hint for this node falls back to zones",
         [ep("1", zones=("a",), nodes=("x",)), ep("2", zones=("b",), nodes=("y",))],
         {"1"}, {"1"}),
    Case("topology does not apply to Local policy",
         [ep("1", zones=("b",), local=True), ep("2", zones=("a",))], {"1"}, {"2"}, itp=L),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_categorize(case: Case) -> None:
    svc = ServicePort(KEY, type=case.type, internal_traffic_policy=case.itp,
                      external_traffic_policy=case.etp)
    sel = categorize(svc, case.endpoints, "me", case.zone)
    assert sel.internal == case.internal
    assert sel.external == case.external
    assert sel.has_endpoints == case.has_endpoints


endpoints = st.lists(st.builds(
    lambda i, r, s, t, loc: ep(str(i), ready=r, serving=s or r, term=t, local=loc),
    st.integers(0, 20), st.booleans(), st.booleans(), st.booleans(), st.booleans()),
    max_size=8, unique_by=lambda e: e.ip)


@given(endpoints, st.sampled_from(list(TrafficPolicy)), st.sampled_from(list(TrafficPolicy)))
def test_selection_invariants(eps: list[Endpoint], itp: TrafficPolicy,
                              etp: TrafficPolicy) -> None:
    """Selected endpoints are always usable, local when a policy is Local, and exist
    whenever a usable endpoint exists under Cluster policy."""
    svc = ServicePort(KEY, type=ServiceType.NODE_PORT, internal_traffic_policy=itp,
                      external_traffic_policy=etp)
    sel = categorize(svc, eps, "me", "")
    for e in eps:
        if e.ip in sel.internal | sel.external:
            assert e.ready or (e.serving and e.terminating)
        if e.ip in sel.internal and itp is TrafficPolicy.LOCAL:
            assert e.is_local
        if e.ip in sel.external and etp is TrafficPolicy.LOCAL:
            assert e.is_local
    usable = any(e.ready or (e.serving and e.terminating) for e in eps)
    assert sel.has_endpoints == usable
    if usable and itp is TrafficPolicy.CLUSTER:
        assert sel.internal


SETS = [
    ("ETP Local without a local endpoint: node traffic short-circuits to the cluster set",
     [ep("2"), ep("3")], {"2", "3"}, set(), L, TrafficPolicy.CLUSTER),
    ("ETP Local with a local endpoint", [ep("1", local=True), ep("2")], {"1", "2"}, {"1"},
     L, TrafficPolicy.CLUSTER),
    ("both Local: the cluster set is still known (for the short-circuit)",
     [ep("1", local=True), ep("2")], {"1", "2"}, {"1"}, L, L),
    ("local set falls back to local terminating; cluster set to every terminating",
     [ep("1", ready=False, serving=True, term=True, local=True),
      ep("2", ready=False, serving=True, term=True)], {"1", "2"}, {"1"}, L, L),
    ("topology narrows the cluster set only", [ep("1", zones=("a",)), ep("2", zones=("b",)),
                                               ep("3", zones=("b",), local=True)],
     {"1"}, {"3"}, L, TrafficPolicy.CLUSTER),
]


@pytest.mark.parametrize("case", SETS, ids=[c[0] for c in SETS])
def test_cluster_and_local_sets(case: tuple) -> None:
    _name, eps, cluster, local, etp, itp = case
    svc = ServicePort(KEY, type=ServiceType.LOAD_BALANCER, internal_traffic_policy=itp,
                      external_traffic_policy=etp)
    sel = categorize(svc, eps, "me", "a")
    assert (sel.cluster, sel.local, sel.has_local) == (cluster, local, bool(local))


def test_whole_categorisation_on_the_wire() -> None:
    """node_records marks every set on the endpoints and has_local_endpoints on the port;
    all of it survives the proto and changes the digest term."""
    from svcproxy import convert
    from svcproxy.frontend.computation.compute import PortBase, ServiceBase, node_records

    svc = ServicePort(KEY, type=ServiceType.LOAD_BALANCER, external_traffic_policy=L,
                      has_endpoints=True)
    # As merged (PortBase): marked with the selection of a node that hosts neither.
    remote = Endpoint("10.0.0.2", 80, node_name="other", internal=True, cluster=True)
    local = Endpoint("10.0.0.1", 80, node_name="me", internal=True, cluster=True)
    base = ServiceBase((PortBase(svc, (local, remote)),), frozenset({"me", "other"}),
                       frozenset(), False)
    here = node_records(base, "me", "")[KEY]
    there = node_records(base, "elsewhere", "")[KEY]
    flags = {ip: (e.internal, e.external, e.cluster, e.local)
             for ip, e in here.endpoints.items()}
    assert flags == {"10.0.0.1": (True, True, True, True),
                     "10.0.0.2": (True, False, True, False)}
    assert here.service.has_local_endpoints and not there.service.has_local_endpoints
    assert [e.ip for e in there.cluster_endpoints()] == ["10.0.0.1", "10.0.0.2"]
    assert not there.external_endpoints() and not there.local_set()
    for record in (here, there):
        msg = convert.state_to_pb(record)
        assert convert.state_from_pb(msg) == record
        term = convert.record_term(msg)
        msg.endpoints[0].cluster = not msg.endpoints[0].cluster
        assert convert.record_term(msg) != term, "the digest covers the new fields"
        msg.endpoints[0].cluster = not msg.endpoints[0].cluster
        msg.service.has_local_endpoints = not msg.service.has_local_endpoints
        assert convert.record_term(msg) != term


def test_each_family_is_categorised_on_its_own() -> None:
    """IPv4 has only a terminating endpoint, IPv6 a ready one: each family keeps its own
    (kube-proxy runs one proxier per family), rather than IPv4 losing its only one."""
    from svcproxy.frontend.computation.selection import categorize_by_family

    svc = ServicePort(KEY, type=ServiceType.CLUSTER_IP)
    eps = [ep("10.0.0.1", ready=False, serving=True, term=True), ep("fd00::1")]
    assert categorize(svc, eps, "me", "a").cluster == {"fd00::1"}
    both = categorize_by_family(svc, eps, "me", "a")
    assert both.cluster == both.internal == {"10.0.0.1", "fd00::1"}
