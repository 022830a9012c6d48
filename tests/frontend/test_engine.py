"""The frontend engine: parsing, merging, per-node records, incremental publishing."""

from __future__ import annotations

from typing import Any

import pytest

from svcproxy.frontend.computation import compute
from svcproxy.frontend.edge.endpointslice import read_endpoint_slice
from svcproxy.frontend.edge.service import read_service
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import Delete, Replace, Upsert
from svcproxy.model import Protocol, ServicePortKey
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.objects import KEY, endpoint, engine_with, node, service, slice_


def ops_of(eng: Engine, name: str) -> list[str]:
    view = eng.changelog.views[name]
    return [pb.Op.FromString(op.data).WhichOneof("op") for op in view.history[-1][1]]


def test_endpoints_merged_across_slices_with_target_port_by_name() -> None:
    eng = engine_with(service("web"), node("n1"),
                      slice_("a", "web", [endpoint("10.0.0.1")]),
                      slice_("b", "web", [endpoint("10.0.0.2", node="n2")]),
                      slice_("c", "web", [endpoint("10.0.0.3")], port_name="other"))
    rec = eng.changelog.view("n1").records[KEY]
    assert {ip: e.port for ip, e in rec.endpoints.items()} == {"10.0.0.1": 8080,
                                                                "10.0.0.2": 8080}
    assert rec.endpoints["10.0.0.1"].is_local and not rec.endpoints["10.0.0.2"].is_local


def test_duplicate_address_keeps_non_terminating_copy() -> None:
    eng = engine_with(service("web"), node("n1"),
                      slice_("a", "web", [endpoint("10.0.0.1", ready=False, serving=True,
                                                   terminating=True)]),
                      slice_("b", "web", [endpoint("10.0.0.1")]))
    ep = eng.changelog.view("n1").records[KEY].endpoints["10.0.0.1"]
    assert ep.ready and not ep.terminating


def test_duplicate_address_with_equal_conditions_is_the_same_whatever_the_order() -> None:
    """Two frontends given the same slices in another order serve the same endpoint."""
    svc, _ = read_service(service("web"))
    assert svc is not None
    a, _ = read_endpoint_slice(slice_("a", "web", [endpoint("10.0.0.1", node="n1")]))
    b, _ = read_endpoint_slice(slice_("b", "web", [endpoint("10.0.0.1", node="n2")]))
    assert a is not None and b is not None
    got = {compute.service_base(svc, order).ports[0].endpoints[0].node_name
           for order in ([a, b], [b, a])}
    assert got == {"n1"}


def test_dual_stack_slices_and_loose_input_normalised() -> None:
    eng = engine_with(
        service("web", ip="10.96.000.010", clusterIPs=["10.96.000.010", "fd00::0010"],
                type="LoadBalancer", loadBalancerSourceRanges=[" 192.168.1.7/24 ", "10.0.0.0/8"]),
        node("n1"), slice_("a", "web", [endpoint("010.0.0.1")]),
        slice_("b", "web", [endpoint("fd00:0::1")], family="IPv6"))
    rec = eng.changelog.view("n1").records[KEY]
    assert rec.service.cluster_ips == ("10.96.0.10", "fd00::10")
    assert rec.service.load_balancer_source_ranges == ("192.168.1.0/24", "10.0.0.0/8")
    assert set(rec.endpoints) == {"10.0.0.1", "fd00::1"}


def test_a_source_range_entry_holding_two_ranges_is_refused_as_the_apiserver_refuses_it() -> None:
    """GetLoadBalancerSourceRanges parses each entry as one CIDR (only the annotation is
    split on commas): "a,b" in one entry is no CIDR, the Service is not served; the same
    ranges in the annotation are accepted (and not read, as kube-proxy reads the field)."""
    eng = engine_with(
        service("web", type="LoadBalancer",
                loadBalancerSourceRanges=[" 192.168.1.7/24 ,10.0.0.0/8"]),
        node("n1"), slice_("a", "web", [endpoint("10.0.0.1")]))
    assert KEY not in eng.changelog.view("n1").records
    annotated = service("web", type="LoadBalancer")
    annotated["metadata"]["annotations"] = {
        "service.beta.kubernetes.io/load-balancer-source-ranges": " 192.168.1.7/24 ,10.0.0.0/8"}
    eng = engine_with(annotated, node("n1"), slice_("a", "web", [endpoint("10.0.0.1")]))
    assert eng.changelog.view("n1").records[KEY].service.load_balancer_source_ranges == ()


@pytest.mark.parametrize("svc", [
    service("web", clusterIP="None", clusterIPs=["None"]),
    {**service("web"), "spec": {"type": "ExternalName", "externalName": "x.example"}},
    service("web", labels={"service.kubernetes.io/service-proxy-name": "other-proxy"}),
], ids=["headless", "externalname", "other-proxy"])
def test_unproxied_services_are_skipped(svc: dict[str, Any]) -> None:
    eng = engine_with(svc, node("n1"), slice_("a", "web", [endpoint("10.0.0.1")]))
    assert eng.changelog.view("n1").records == {}


def test_service_proxy_name_matching_ours_is_served() -> None:
    eng = Engine(proxy_name="mine")
    eng.submit([Replace("Service", [service(
        "web", labels={"service.kubernetes.io/service-proxy-name": "mine"})]),
        Replace("EndpointSlice", []), Replace("Node", [])])
    assert KEY in eng.changelog.view("n1").records


def test_malformed_service_is_skipped_others_kept_and_last_good_stays() -> None:
    eng = engine_with(service("web"), service("api", ip="10.96.0.2"), node("n1"))
    counter = metrics.REJECTED_OBJECTS.labels("apiserver", "Service", "invalid_port")
    before = counter._value.get()
    eng.submit([Upsert("Service", service("web", port=99999)),
                Upsert("Service", service("new", ip="10.96.0.3"))])
    records = eng.changelog.view("n1").records
    assert records[KEY].service.port == 80
    assert ServicePortKey("default", "new", "http", Protocol.TCP) in records
    assert counter._value.get() == before + 1


@pytest.mark.parametrize("obj,reason", [
    (service("web", port="eighty"), "not a port number"),
    ({**service("web"), "spec": {"clusterIP": "10.0.0.1",
                                 "ports": [{"port": 80, "protocol": "ICMP"}]}}, "protocol"),
    (service("web", ip="10.0.0.300"), "not an IP"),
    (service("web", loadBalancerSourceRanges=["10.0.0.0/99"]), "not a CIDR"),
])
def test_parse_errors_say_why(obj: dict[str, Any], reason: str) -> None:
    parsed, verdict = read_service(obj)
    assert parsed is None and reason in verdict.summary(), verdict.summary()


def test_slice_without_service_label_is_rejected() -> None:
    bad = slice_("a", "web", [])
    bad["metadata"]["labels"] = {}
    parsed, verdict = read_endpoint_slice(bad)
    assert parsed is None and "kubernetes.io/service-name" in verdict.summary()


def test_one_endpoint_change_publishes_one_endpoint_op() -> None:
    eng = engine_with(service("web"), node("n1"),
                      slice_("a", "web", [endpoint(f"10.0.0.{i}") for i in range(1, 50)]))
    eng.submit([Upsert("EndpointSlice", slice_(
        "a", "web", [endpoint(f"10.0.0.{i}") for i in range(1, 49)]))])
    # set_service carries the new trigger time; one endpoint goes.
    assert ops_of(eng, "n1") == ["set_service", "delete_endpoint"]


def test_nodes_without_local_endpoints_share_records() -> None:
    eng = engine_with(service("web"), node("n1"), node("n2"), node("n3"),
                      slice_("a", "web", [endpoint("10.0.0.1", node="n1")]))
    r1, r2, r3 = (eng.changelog.view(n).records[KEY] for n in ("n1", "n2", "n3"))
    assert r2 is r3
    assert r1 is not r2 and r1.endpoints["10.0.0.1"].is_local


def test_change_recomputes_only_the_touched_service(monkeypatch: pytest.MonkeyPatch) -> None:
    svcs = [service(f"s{i}", ip=f"10.96.{i // 250}.{i % 250 + 1}") for i in range(500)]
    slices = [slice_(f"s{i}", f"s{i}", [endpoint(f"10.1.{i // 250}.{i % 250 + 1}")])
              for i in range(500)]
    eng = engine_with(*svcs, *slices, *(node(f"n{i}") for i in range(20)))
    calls: list[str] = []
    real = compute.node_records
    monkeypatch.setattr(compute, "node_records",
                        lambda base, n, z, *memo: calls.append(n) or real(base, n, z, *memo))
    eng.submit([Upsert("EndpointSlice", slice_("s7", "s7", [endpoint("10.2.0.1")]))])
    # One service, computed once per node class (n1 hosts the endpoint; the rest share).
    assert len(calls) <= 3
    changed = [n for n, v in eng.changelog.views.items() if v.revision == eng.changelog.revision]
    assert len(changed) == len(eng.changelog.views)


def test_local_policy_records_differ_per_node() -> None:
    eng = engine_with(service("web", type="NodePort", externalTrafficPolicy="Local"),
                      node("n1"), node("n2"),
                      slice_("a", "web", [endpoint("10.0.0.1", node="n1")]))
    assert eng.changelog.view("n1").records[KEY].external_endpoints()
    assert not eng.changelog.view("n2").records[KEY].external_endpoints()
    assert eng.changelog.view("n2").records[KEY].service.has_endpoints


def test_zone_change_of_a_node_reselects_topology() -> None:
    hinted = [dict(endpoint("10.0.0.1", node="x"), hints={"forZones": [{"name": "a"}]}),
              dict(endpoint("10.0.0.2", node="y"), hints={"forZones": [{"name": "b"}]})]
    eng = engine_with(service("web"), node("n1", zone="a"), slice_("s", "web", hinted))
    n1 = eng.changelog.view("n1")
    assert [e.ip for e in n1.records[KEY].internal_endpoints()] == ["10.0.0.1"]
    eng.submit([Upsert("Node", node("n1", zone="b"))])
    assert [e.ip for e in n1.records[KEY].internal_endpoints()] == ["10.0.0.2"]


def test_relist_reconciles_deletions() -> None:
    eng = engine_with(service("web"), service("api", ip="10.96.0.2"), node("n1"))
    eng.submit([Replace("Service", [service("web")])])
    assert set(k.name for k in eng.changelog.view("n1").records) == {"web"}
    eng.submit([Delete("Service", "default", "web")])
    assert eng.changelog.view("n1").records == {}


def test_records_split_by_family() -> None:
    eng = engine_with(
        service("web", ip="10.96.0.10", clusterIPs=["10.96.0.10", "fd00::10"],
                externalIPs=["192.0.2.1", "2001:db8::1"],
                type="LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/8", "fd00::/8"]),
        node("n1"), slice_("a", "web", [endpoint("10.0.0.1")]),
        slice_("b", "web", [endpoint("fd00::1")], family="IPv6"))
    rec = eng.changelog.view("n1").records[KEY]
    v4, v6 = rec.family(4), rec.family(6)
    assert v4 is not None and v6 is not None
    assert (v4.service.cluster_ips, v4.service.external_ips, list(v4.endpoints)) == \
        (("10.96.0.10",), ("192.0.2.1",), ["10.0.0.1"])
    assert (v6.service.cluster_ips, v6.service.load_balancer_source_ranges, list(v6.endpoints)) \
        == (("fd00::10",), ("fd00::/8",), ["fd00::1"])
    single = engine_with(service("web"), node("n1")).changelog.view("n1").records[KEY]
    assert single.family(6) is None


def test_objects_whose_annotations_hold_a_lone_surrogate_are_served() -> None:
    """Go's decoder stores U+FFFD for it, so the apiserver keeps both objects."""
    svc = service("web")
    svc["metadata"]["annotations"] = {"svcproxy.io/x": "a\ud800"}
    sl = slice_("web-1", "web", [endpoint("10.0.0.1")])
    sl["metadata"]["annotations"] = {"x": "\udcff"}
    eng = engine_with(svc, sl, node("n1"))
    assert list(eng.changelog.view("n1").records[KEY].endpoints) == ["10.0.0.1"]
