"""The parser's fast paths for the common shapes give what the general path gives."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import replace
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.computation.compute import merge_endpoints
from svcproxy.frontend.edge import endpointslice
from svcproxy.frontend.edge.addresses import (
    ALLOWED_IPV4,
    CANONICAL_IPV4,
    FORBIDDEN_IPV4,
    ipv4_problem,
)
from svcproxy.frontend.edge.endpointslice import (
    _plain_ipv4_endpoint,
    decode_slice,
    read_endpoint_slice,
    validate_endpoint_slice,
)
from svcproxy.frontend.edge.limits import ObjectLimits, _walk
from svcproxy.frontend.edge.objects import Service, SvcPort, canonical_ip
from svcproxy.frontend.edge.service import decode_service, read_service
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.sources.events import RawObject, Replace
from svcproxy.frontend.store.store import Store
from svcproxy.model import Protocol, normalize_cidr, normalize_ip, parse_ip
from tests.support.hostile import endpoint_slice, spoiled

OCTET = st.one_of(st.integers(0, 300).map(str), st.sampled_from(["00", "01", "007", "256", ""]))
IPV4ISH = st.lists(OCTET, min_size=3, max_size=5).map(".".join)
TEXT = st.one_of(IPV4ISH, st.text(max_size=20), st.sampled_from(
    ["::1", "fd00::01", "1.2.3.4 ", " 1.2.3.4", "1.2.3.4\n", "١.٢.٣.٤", "::ffff:1.2.3.4"]))


@given(TEXT)
def test_canonical_ip_is_normalize_ip(text: str) -> None:
    assert canonical_ip(text) == normalize_ip(text)


def _ip_by_ipaddress(text: str) -> str | None:
    """An IP read by Python's ipaddress alone, leading zeros of IPv4 octets dropped first:
    what normalize_ip's integer fast path must equal."""
    text = text.strip()
    if "%" in text or not text.isascii():
        return None
    parts = text.split(".")
    if ":" not in text and len(parts) == 4 and all(p.isdigit() for p in parts):
        text = ".".join(p.lstrip("0") or "0" for p in parts)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _cidr_by_ipaddress(text: str) -> str | None:
    addr, slash, length = text.strip().partition("/")
    if not slash or not (length.isascii() and length.isdigit()) or any(
            c.isspace() for c in addr):
        return None
    ip = _ip_by_ipaddress(addr)
    try:
        return None if ip is None else str(ipaddress.ip_network(
            f"{ip}/{length.lstrip('0') or '0'}", strict=False))
    except ValueError:
        return None


LENGTH = st.one_of(st.integers(0, 140).map(str), st.sampled_from(["08", "0032", "", "x", " 8",
                                                                   "8 ", "0" * 5000 + "8"]))
CIDR = st.one_of(st.tuples(st.one_of(IPV4ISH, TEXT, st.ip_addresses().map(str)), LENGTH).map(
    "/".join), TEXT)


@given(st.one_of(TEXT, st.ip_addresses().map(str)))
@example("0" * 5000 + "1.0.0.1")
def test_normalize_ip_is_ipaddress_with_leading_zeros_dropped(text: str) -> None:
    assert normalize_ip(text) == _ip_by_ipaddress(text)


@given(st.one_of(TEXT, st.ip_addresses().map(str)))
@example("00010.0.0.1")
def test_normalize_ip_is_parse_ip_of_the_trimmed_text(text: str) -> None:
    """One reader of an IP's text: validation (parse_ip) and parsing (normalize_ip) agree
    on every address; validation refused an octet of four digits or more (0010), which
    Kubernetes, normalize_ip and so the frontend's parsing read."""
    ip = parse_ip(text.strip())
    assert normalize_ip(text) == (None if ip is None else str(ip))


@given(CIDR)
@example("10.0.0.0/" + "0" * 5000 + "8")
def test_normalize_cidr_is_ipaddress_network(text: str) -> None:
    """The IPv4 path in integer arithmetic (a Service's 100,000 source ranges parsed in
    2.8 s, 0.64 s now) clears host bits as ipaddress does; ip_network is the reference."""
    assert normalize_cidr(text) == _cidr_by_ipaddress(text)


FLAG = st.one_of(st.none(), st.booleans())
CONDITIONS = st.fixed_dictionaries({}, optional={"ready": FLAG, "serving": FLAG,
                                                 "terminating": FLAG})
ENDPOINT = st.fixed_dictionaries(
    {"addresses": st.lists(IPV4ISH, min_size=1, max_size=2), "conditions": CONDITIONS},
    optional={"nodeName": st.sampled_from(["", "n1", "node-b"]),
              "zone": st.sampled_from(["", "z1"])})


def _slice(endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "s-a", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}


@given(st.lists(ENDPOINT, max_size=4))
def test_plain_endpoints_parse_as_the_general_path_does(endpoints: list[dict[str, Any]]) -> None:
    # Empty hints mean no hints, but take the general path.
    general = [dict(ep, hints={}) for ep in endpoints]
    fast, fast_verdict = read_endpoint_slice(_slice(endpoints), seen_at=1.0)
    slow, slow_verdict = read_endpoint_slice(_slice(general), seen_at=1.0)
    assert fast_verdict.errors == slow_verdict.errors
    assert fast == slow and (fast is None) == bool(fast_verdict.errors)


@given(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(
    [0, 0x7F000001, 0x7FFFFFFF, 0xA9FE0001, 0xA9FF0000, 0xE0000001, 0xE0000100, 0x80000000])))
def test_forbidden_canonical_ipv4_by_prefix_is_the_rule(n: int) -> None:
    text = ".".join(str(n >> shift & 255) for shift in (24, 16, 8, 0))
    assert CANONICAL_IPV4.fullmatch(text)
    assert text.startswith(FORBIDDEN_IPV4) == (ipv4_problem(n) is not None)
    assert (ALLOWED_IPV4.fullmatch(text) is None) == (ipv4_problem(n) is not None)


@given(TEXT)
def test_an_allowed_ipv4_address_is_canonical_and_not_forbidden(text: str) -> None:
    assert (ALLOWED_IPV4.fullmatch(text) is not None) == (
        CANONICAL_IPV4.fullmatch(text) is not None and not text.startswith(FORBIDDEN_IPV4))


# A plain endpoint as large as the plain shape allows, with a targetRef.
WIDE_ENDPOINT = {"addresses": ["255.255.255.254", "100.100.100.100"],
                 "conditions": {"ready": True, "serving": True, "terminating": False},
                 "nodeName": "n" * 253, "zone": "z" * 63, "hostname": None, "hints": None,
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "web-0", "uid": "u"}}
PLAIN_SLICE = dict(endpoint_slice(ips=("10.244.1.5", "10.244.1.6")),
                   endpoints=[WIDE_ENDPOINT, endpoint_slice()["endpoints"][0]])
LIMITS = st.sampled_from([
    ObjectLimits(), ObjectLimits(max_object_bytes=1300), ObjectLimits(max_object_bytes=900),
    ObjectLimits(max_object_bytes=1300, max_depth=3), ObjectLimits(max_depth=2),
    ObjectLimits(max_name_length=5)])


def _walked(value: Any) -> int:
    budget = [10**9]
    _walk(value, 2, budget, ObjectLimits())
    return 10**9 - budget[0]


@settings(max_examples=300, deadline=None)
@given(spoiled(WIDE_ENDPOINT))
@example(dict(WIDE_ENDPOINT, conditions={"ready": True, "x" * 5000: True}))
@example(dict(WIDE_ENDPOINT, deprecatedTopology={"a": "b" * 5000}))
@example(dict(WIDE_ENDPOINT, targetRef={"kind": "Pod", "x": {"y": "z" * 5000}}))
@example(dict(WIDE_ENDPOINT, targetRef={"kind": "Pod", "x": "z" * 5000}))
def test_a_plain_endpoints_size_bound_is_never_below_the_walks_count(ep: Any) -> None:
    bound = _plain_ipv4_endpoint(ep, 253)
    assert not bound or bound >= _walked(ep)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spoiled(PLAIN_SLICE), LIMITS)
def test_a_slice_of_plain_endpoints_gets_the_general_verdict(obj: Any,
                                                             limits: ObjectLimits) -> None:
    fast = validate_endpoint_slice(obj, limits)
    with patch.object(endpointslice, "_plain_endpoints", return_value=None), \
            patch.object(endpointslice, "_plain_ipv4_endpoint", return_value=0):
        general = validate_endpoint_slice(obj, limits)
    assert (fast.errors, fast.warnings) == (general.errors, general.warnings)


@given(st.lists(ENDPOINT, max_size=4))
def test_merged_endpoints_are_whole_dataclasses(endpoints: list[dict[str, Any]]) -> None:
    parsed, _ = read_endpoint_slice(_slice(endpoints), seen_at=1.0)
    if parsed is None:
        return
    port = SvcPort("p", Protocol.TCP, 80, 0, "80")
    for ep in merge_endpoints(port, [parsed]):
        same = replace(ep)  # the keyword __init__, from every field
        assert ep == same and hash(ep) == hash(same) and repr(ep) == repr(same)



# A listed slice as the apiserver serves it, every field the typed decoding knows set.
TYPED_SLICE = dict(PLAIN_SLICE, endpoints=[
    {k: v for k, v in WIDE_ENDPOINT.items() if k not in ("hints", "hostname")},
    dict(endpoint_slice()["endpoints"][0], hostname=None, hints=None),
    {"addresses": ["10.0.0.9", "10.0.0.9", "10.0.0.8"],
     "conditions": {"ready": False, "serving": True, "terminating": True}},
    {"addresses": ["10.0.0.10"]}], ports=[
    {"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
    {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "all"}, {"port": 9}],
    metadata={"name": "web-1", "namespace": "shop", "uid": "u-1", "resourceVersion": "7",
              "generation": 3, "creationTimestamp": "2026-11-27T05:00:00Z",
              "generateName": "web-", "finalizers": ["example.com/keep"],
              "labels": {"kubernetes.io/service-name": "web",
                                                 "endpointslice.kubernetes.io/managed-by": "x"},
              "annotations": {"endpoints.kubernetes.io/last-change-trigger-time":
                              "2026-11-27T05:00:00Z", "note": "a b"},
              "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                   "uid": "u-0", "controller": True,
                                   "blockOwnerDeletion": True}],
              "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                 "apiVersion": "discovery.k8s.io/v1", "fieldsType": "FieldsV1",
                                 "subresource": "", "time": "2026-11-27T05:00:00Z",
                                 "fieldsV1": {
                                     "f:addressType": {}, "f:endpoints": {}, "f:metadata": {
                                         "f:labels": {".": {}, "f:kubernetes.io/service-name":
                                                      {}}}}}]})
TEXTS = st.one_of(st.sampled_from(["a", "s1", "a.b", "x" * 63]), st.sampled_from(
    ["", "A", "-a", "a_b", "x" * 64, "y" * 254, "é", "a/b", "a\n"]), st.text(max_size=8))
ADDRESSES = st.lists(st.one_of(st.sampled_from(
    ["10.0.0.1", "127.0.0.1", "0.0.0.0", "169.254.0.1", "224.0.0.1", "224.0.1.1", "0.0.0.1"]),
    IPV4ISH), max_size=2)


def _typed_and_general(data: bytes, limits: ObjectLimits) -> None:
    """``decode_slice`` gives what the general path gives, or leaves ``data`` to it."""
    fast = decode_slice(data, limits, seen_at=1.0)
    if fast is None:
        return
    obj = json.loads(data)
    parsed, verdict = read_endpoint_slice(obj, limits, seen_at=1.0)
    assert verdict.ok and not verdict.warnings, verdict.errors or verdict.warnings
    assert parsed == fast


def test_a_listed_slice_of_the_common_shape_takes_the_typed_path() -> None:
    data = json.dumps(TYPED_SLICE).encode()
    assert decode_slice(data, ObjectLimits(), seen_at=1.0) is not None
    _typed_and_general(data, ObjectLimits())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spoiled(TYPED_SLICE), LIMITS)
@example(TYPED_SLICE, ObjectLimits(max_object_bytes=3000))
@example(dict(TYPED_SLICE, addressType="IPv6"), ObjectLimits())
@example(dict(TYPED_SLICE, ports=[{"name": "a"}, {"name": "a", "port": 1}]), ObjectLimits())
@example(dict(TYPED_SLICE, ports=[{"port": 1}, {"port": 2}]), ObjectLimits())
@example(dict(TYPED_SLICE, ports=[{"port": 1, "appProtocol": "a b"}]), ObjectLimits())
def test_a_typed_slice_is_what_the_general_path_makes(obj: Any, limits: ObjectLimits) -> None:
    try:
        data = json.dumps(obj).encode()
    except (TypeError, ValueError):
        return  # not JSON: no apiserver serves it
    _typed_and_general(data, limits)


META = st.fixed_dictionaries({
    "name": TEXTS, "namespace": st.one_of(st.none(), TEXTS),
    "labels": st.dictionaries(TEXTS, TEXTS, max_size=2).map(
        lambda d: dict(d, **{"kubernetes.io/service-name": "web"})),
    "annotations": st.dictionaries(TEXTS, TEXTS, max_size=2)})
PORTS = st.lists(st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.none(), TEXTS),
    "protocol": st.sampled_from([None, "", "TCP", "UDP", "SCTP", "tcp", "HTTP"]),
    "port": st.sampled_from([None, 0, 1, 80, 65535, 65536, -1]),
    "appProtocol": st.sampled_from([None, "http", "kubernetes.io/ws", "", "a b"])}),
    max_size=2)
ENDPOINTS = st.lists(st.fixed_dictionaries({"addresses": ADDRESSES, "conditions": CONDITIONS},
                                           optional={"nodeName": st.one_of(st.none(), TEXTS),
                                                     "zone": st.one_of(st.none(), TEXTS),
                                                     "hostname": st.one_of(st.none(), TEXTS)}),
                     max_size=2)


@settings(max_examples=500, deadline=None)
@given(META)
def test_typed_metadata_is_checked_as_the_general_path_checks_it(meta: dict[str, Any]) -> None:
    obj = dict(TYPED_SLICE, metadata=meta)
    _typed_and_general(json.dumps(obj).encode(), ObjectLimits())


@settings(max_examples=500, deadline=None)
@given(PORTS, ENDPOINTS)
def test_typed_ports_and_endpoints_are_checked_as_the_general_path_checks_them(
        ports: list[Any], endpoints: list[Any]) -> None:
    obj = dict(TYPED_SLICE, ports=ports, endpoints=endpoints)
    _typed_and_general(json.dumps(obj).encode(), ObjectLimits())


@pytest.mark.parametrize("text", [
    # duplicate keys: the last one counts, for json as for msgspec
    '{"metadata": {"name": "a", "name": "B", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4"}',
    '{"metadata": {"name": "B", "name": "a", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4", "addressType": "IPv4"}',
    # escapes, a lone surrogate, numbers json and msgspec read differently
    '{"metadata": {"name": "\\u0061", "labels": {"kubernetes.io/service-name": "w"},'
    ' "annotations": {"x": "\\ud800"}}, "addressType": "IPv4"}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4", "ports": [{"port": 80.0}, {"port": 1e2}]}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4", "ports": [{"port": 80}], "endpoints": [{"addresses": ["1.2.3.4"],'
    ' "targetRef": {"x": NaN}}]}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4", "endpoints": [{"addresses": ["1.2.3.4"], "hints": null}]}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"}},'
    ' "addressType": "IPv4", "endpoints": [{"addresses": ["1.2.3.4"],'
    ' "targetRef": {"x": 1' + "0" * 400 + ', "y": 1e400, "z": ' + "1" * 5000 + '}}]}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"},'
    ' "managedFields": [{"fieldsV1": {"f:a": {"f:b": {}}}}]}, "addressType": "IPv4"}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"},'
    ' "managedFields": [{"fieldsV1": {"f:a": ' + "1" * 5000 + '}}]}, "addressType": "IPv4"}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"},'
    ' "managedFields": [{"fieldsV1": ' + "[" * 61 + "]" * 61 + '}]}, "addressType": "IPv4"}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"},'
    ' "managedFields": [{"fieldsV1": ' + "[" * 59 + "]" * 59 + '}]}, "addressType": "IPv4"}',
    '{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "w"},'
    ' "managedFields": [{"fieldsV1": ' + "[" * 70 + "]" * 70 + '}]}, "addressType": "IPv4"}',
])
def test_json_the_decoders_may_read_differently(text: str) -> None:
    _typed_and_general(text.encode(), ObjectLimits())


# A listed Service as the apiserver serves it, every field the typed decoding knows set.
TYPED_SERVICE: dict[str, Any] = {
    "kind": "Service", "apiVersion": "v1",
    "metadata": {"name": "web", "namespace": "shop", "uid": "u-2", "resourceVersion": "9",
                 "generateName": "web-", "ownerReferences": [
                     {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                      "uid": "u-3", "controller": False, "blockOwnerDeletion": False}],
                 "creationTimestamp": "2026-11-27T05:00:00Z", "generation": 1,
                 "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "x"},
                 "annotations": {"svcproxy.io/b": "2", "svcproxy.io/a": "1", "note": "a b",
                                 "service.kubernetes.io/topology-mode": "Auto"},
                 "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
                 "managedFields": [{"manager": "kubectl", "operation": "Apply",
                                    "apiVersion": "v1", "fieldsType": "FieldsV1",
                                    "time": "2026-11-27T05:00:00Z", "subresource": "status",
                                    "fieldsV1": {"f:spec": {"f:ports": {}}}}]},
    "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
             "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
             "selector": {"app": "web"}, "ports": [
                 {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP",
                  "nodePort": 30080, "appProtocol": "http"},
                 {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP",
                  "nodePort": 30053},
                 {"name": "dns-tcp", "port": 53, "nodePort": 30053}],
             "sessionAffinity": "ClientIP",
             "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
             "externalIPs": ["192.0.2.7", "192.0.2.7", "192.0.2.8"],
             "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
             "healthCheckNodePort": 31000, "allocateLoadBalancerNodePorts": True,
             "loadBalancerClass": "lb", "loadBalancerIP": "", "publishNotReadyAddresses": False,
             "loadBalancerSourceRanges": [],
             "trafficDistribution": "PreferClose", "externalName": ""},
    "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.100", "ipMode": "Proxy"},
                                            {"hostname": "lb.example"}, {"ip": "192.0.2.101"}]}}}
# The bench's Service, as the stand-in apiserver serves it.
PLAIN_SERVICE: dict[str, Any] = {
    "metadata": {"name": "s1", "namespace": "bench", "uid": "u", "resourceVersion": "3",
                 "creationTimestamp": "2026-11-27T05:00:00Z"},
    "spec": {"clusterIP": "10.96.0.2", "ports": [{"name": "p", "port": 80}]}}


def _typed_service_and_general(data: bytes, limits: ObjectLimits) -> Service | None:
    """``decode_service`` gives what the general path gives (on the dict as listed, kind
    and apiVersion filled in), or leaves ``data`` to it."""
    fast = decode_service(data, limits)
    if fast is None:
        return None
    obj = RawObject("Service", "v1", data).decoded()
    parsed, verdict = read_service(obj, limits)
    assert verdict.ok and not verdict.warnings, verdict.errors or verdict.warnings
    assert parsed == fast
    return fast


@pytest.mark.parametrize("obj", [TYPED_SERVICE, PLAIN_SERVICE, dict(
    PLAIN_SERVICE, spec={"clusterIP": "None", "clusterIPs": ["None"]}), dict(
    PLAIN_SERVICE, spec={"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"],
                         "ports": [{"port": 1, "targetPort": 0}],
                         "sessionAffinity": "ClientIP", "type": "NodePort"}, status=None)])
def test_a_listed_service_of_the_common_shape_takes_the_typed_path(obj: Any) -> None:
    assert _typed_service_and_general(json.dumps(obj).encode(), ObjectLimits()) is not None


@pytest.mark.parametrize("obj, limits", [
    (dict(PLAIN_SERVICE, spec={"clusterIP": "fd00::1", "ports": [{"port": 1}]}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIPs": ["10.0.0.1", "fd00::1"], "ports": [{"port": 1}]}),
     None),
    (dict(PLAIN_SERVICE, spec={"type": "ExternalName", "externalName": "a.b"}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIP": "10.0.0.1", "ports": [{"port": 1}],
                               "loadBalancerSourceRanges": ["10.0.0.0/8"]}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIP": "10.0.0.1", "ports": [{"port": 1}], "x": 1}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIP": "010.0.0.1", "ports": [{"port": 1}]}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIP": "10.0.0.1", "ports": [
        {"port": 1, "targetPort": None}]}), None),
    (dict(PLAIN_SERVICE, spec={"clusterIP": "10.0.0.1", "ports": [{"port": 1}],
                               "sessionAffinity": "ClientIP",
                               "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": None}}}),
     None),
    (PLAIN_SERVICE, ObjectLimits(max_name_length=63)),
    (PLAIN_SERVICE, ObjectLimits(max_depth=2)),
    (PLAIN_SERVICE, ObjectLimits(max_object_bytes=1000)),
    (TYPED_SERVICE, ObjectLimits(max_depth=3)),
])
def test_a_service_the_typed_path_doubts_takes_the_general_path(
        obj: Any, limits: ObjectLimits | None) -> None:
    data = json.dumps(obj).encode()
    assert decode_service(data, limits or ObjectLimits()) is None
    decoded = Intake(limits=limits or ObjectLimits()).decode(RawObject("Service", "v1", data))
    assert isinstance(decoded, dict)


def test_listed_raw_services_are_kept_or_refused_as_their_dicts_are() -> None:
    items = [PLAIN_SERVICE, dict(TYPED_SERVICE, metadata=dict(TYPED_SERVICE["metadata"],
                                                              namespace="")),
             dict(PLAIN_SERVICE, spec={"clusterIP": "fd00::1", "ports": [{"port": 1}]},
                  metadata={"name": "v6"}),
             dict(PLAIN_SERVICE, spec={"clusterIP": "224.0.0.9", "ports": [{"port": 1}]},
                  metadata={"name": "bad"})]
    raw = [RawObject("Service", "v1", json.dumps(o).encode()) for o in items]
    by_dicts, by_raw = Store(), Store()
    by_dicts.apply([Replace("Service", [RawObject.decoded(r) for r in raw])])
    by_raw.apply([Replace("Service", raw)])
    assert by_raw.services == by_dicts.services
    assert set(by_raw.services) == {("bench", "s1"), ("default", "web"), ("default", "v6")}
    assert type(Intake().decode(raw[0])) is Service


def _mostly(valid: list[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One of ``valid`` seven times in eight, else a hostile value."""
    return st.integers(0, 7).flatmap(lambda n: st.sampled_from(valid) if n else hostile)


APP_PROTOCOLS = _mostly([None, "http", "kubernetes.io/h2c"], st.one_of(st.sampled_from(
    ["", "a b", "a/b/c", "x" * 64, "/http", "HTTP_2"]), TEXTS))
PORT_NAMES = _mostly(["a", "b", "http", "dns-tcp"], st.one_of(st.none(), TEXTS))
TARGETS = _mostly([8080, "http", 0, ""], st.one_of(st.sampled_from(
    [65535, 65536, -1, "HTTP", "a--b", "-a", "1234", "x" * 16, True]), TEXTS))
SERVICE_PORTS = st.lists(st.fixed_dictionaries({"name": PORT_NAMES, "port": _mostly(
    [80, 53, 443], st.sampled_from([None, 0, 65535, 65536, -1, True]))}, optional={
    "protocol": _mostly([None, "TCP", "UDP"], st.sampled_from(["", "SCTP", "tcp", "HTTP"])),
    "targetPort": TARGETS, "nodePort": _mostly([None, 0], st.sampled_from(
        [30080, 30053, 65536, -1])), "appProtocol": APP_PROTOCOLS}), min_size=1, max_size=3)
IPS = _mostly(["10.96.0.1", "None", ""], st.one_of(st.sampled_from(
    ["224.1.2.3", "239.0.0.1", "240.0.0.1", "255.255.255.255", "255.255.255.254", "fd00::1",
     "10.0.0.01", "127.0.0.1", "0.0.0.0", "169.254.1.1", "224.0.0.1"]), IPV4ISH))
CLUSTER_IPS = st.one_of(IPS.map(lambda ip: {"clusterIP": ip}), IPS.map(
    lambda ip: {"clusterIP": ip, "clusterIPs": [ip]}), IPS.map(lambda ip: {"clusterIPs": [ip]}),
    st.fixed_dictionaries({"clusterIP": IPS, "clusterIPs": st.lists(IPS, max_size=3)}))
TIMEOUTS = st.sampled_from([0, 1, 600, 86400, 86401, -5, True])
AFFINITIES = st.one_of(st.fixed_dictionaries({}, optional={
    "sessionAffinity": _mostly([None, "None", "ClientIP"], st.sampled_from(["", "clientip"])),
    "sessionAffinityConfig": st.fixed_dictionaries({}, optional={
        "clientIP": st.fixed_dictionaries({}, optional={"timeoutSeconds": TIMEOUTS})})}),
    TIMEOUTS.map(lambda t: {"sessionAffinity": "ClientIP",
                            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": t}}}))
SPECS = st.tuples(CLUSTER_IPS, AFFINITIES, st.fixed_dictionaries({
    "ports": SERVICE_PORTS}, optional={
    "type": _mostly([None, "ClusterIP", "NodePort", "LoadBalancer"],
                    st.sampled_from(["", "ExternalName", "Bogus"])),
    "externalIPs": _mostly([[], ["192.0.2.1"], ["192.0.2.1", "192.0.2.1"]], ADDRESSES),
    "internalTrafficPolicy": _mostly([None, "Cluster", "Local"], st.sampled_from(["", "x"])),
    "externalTrafficPolicy": _mostly([None, "Cluster", "Local"], st.sampled_from(["", "x"])),
    "trafficDistribution": _mostly([None, "PreferClose"], st.sampled_from(
        ["", "PreferSameNode", "Far"])),
    "healthCheckNodePort": _mostly([None, 0, 31000], st.sampled_from([65535, 65536, -1])),
    "loadBalancerSourceRanges": _mostly([[]], st.just(["10.0.0.0/8"])),
    "ipFamilies": _mostly([None, [], ["IPv4"]], st.lists(st.sampled_from(
        ["IPv4", "IPv6", "ipv4", ""]), max_size=3)),
    "ipFamilyPolicy": _mostly([None, "SingleStack", "PreferDualStack", "RequireDualStack"],
                              st.sampled_from(["", "DualStack"]))})).map(
        lambda parts: {**parts[0], **parts[1], **parts[2]})
STATUSES = st.fixed_dictionaries({"loadBalancer": st.fixed_dictionaries({}, optional={
    "ingress": st.lists(st.fixed_dictionaries({}, optional={
        "ip": _mostly(["192.0.2.1", ""], st.one_of(st.none(), st.sampled_from(
            ["0.0.0.0", "fd00::1", "10.0.0.01"]), IPV4ISH)),
        "ipMode": _mostly([None, "VIP", "Proxy"], st.sampled_from(["", "Bogus"])),
        "hostname": st.just("lb.example")}), max_size=2)})})
SERVICE_META = st.fixed_dictionaries({"name": _mostly(["web", "a-1", "z" * 63], st.one_of(
    st.sampled_from(["1a", "a.b", "z" * 64]), TEXTS))}, optional={
    "namespace": _mostly([None, "", "shop"], TEXTS),
    "labels": st.dictionaries(_mostly(["app", "service.kubernetes.io/service-proxy-name"],
                                      TEXTS), _mostly(["web", ""], TEXTS), max_size=2),
    "annotations": st.dictionaries(_mostly(
        ["svcproxy.io/x", "note", "service.kubernetes.io/topology-aware-hints",
         "service.kubernetes.io/topology-mode",
         "service.beta.kubernetes.io/load-balancer-source-ranges"],
        st.one_of(st.just("svcproxy.io/"), TEXTS)),
        _mostly(["Auto", "a b", ""], TEXTS), max_size=3)})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spoiled(TYPED_SERVICE), LIMITS)
@example(TYPED_SERVICE, ObjectLimits(max_object_bytes=5000))
@example(dict(TYPED_SERVICE, spec=dict(TYPED_SERVICE["spec"], type="ClusterIP")),
         ObjectLimits())
@example(dict(TYPED_SERVICE, spec=dict(TYPED_SERVICE["spec"], clusterIP="None",
                                       clusterIPs=["None"], type=None)), ObjectLimits())
def test_a_typed_service_is_what_the_general_path_makes(obj: Any, limits: ObjectLimits) -> None:
    try:
        data = json.dumps(obj).encode()
    except (TypeError, ValueError):
        return  # not JSON: no apiserver serves it
    _typed_service_and_general(data, limits)


@settings(max_examples=1000, deadline=None)
@given(SERVICE_META)
def test_typed_service_metadata_is_checked_as_the_general_path_checks_it(
        meta: dict[str, Any]) -> None:
    _typed_service_and_general(json.dumps(dict(PLAIN_SERVICE, metadata=meta)).encode(),
                               ObjectLimits())


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS, STATUSES)
@example({"clusterIP": "224.0.0.1", "ports": [{"port": 1}]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1, "nodePort": 30000}]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"name": "a", "port": 1},
                                             {"name": "b", "port": 1}]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1, "targetPort": "a--b"}]}, {})
@example({"clusterIP": "239.1.1.1", "ports": [{"port": 1}]}, {})
@example({"clusterIP": "None", "type": "NodePort", "ports": [{"port": 1}]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1}], "sessionAffinity": "ClientIP",
          "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1, "appProtocol": "a b"}]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1}], "ipFamilies": ["IPv6"]}, {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1}], "ipFamilies": ["IPv4", "IPv4"]},
         {})
@example({"clusterIP": "10.0.0.1", "ports": [{"port": 1}], "ipFamilyPolicy": "DualStack"}, {})
def test_typed_service_specs_are_checked_as_the_general_path_checks_them(
        spec: dict[str, Any], status: dict[str, Any]) -> None:
    obj = {"metadata": {"name": "web"}, "spec": spec, "status": status}
    _typed_service_and_general(json.dumps(obj).encode(), ObjectLimits())
