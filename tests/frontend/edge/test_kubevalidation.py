"""Kubernetes' validation rules at the frontend's edge: table tests and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.computation.compute import service_base
from svcproxy.frontend.edge.endpointslice import (
    _plain_ipv4_endpoint,
    read_endpoint_slice,
    validate_endpoint_slice,
)
from svcproxy.frontend.edge.limits import ObjectLimits, check_size
from svcproxy.frontend.edge.node import read_node, validate_node
from svcproxy.frontend.edge.objects import EndpointSlice, Node, Service
from svcproxy.frontend.edge.service import read_service, validate_service
from svcproxy.frontend.edge.validation import validate
from svcproxy.frontend.publication.wire import replace_service, set_node
from svcproxy.frontend.sources.upstream_objects import service_objects
from svcproxy.frontend.store.store import node_info
from svcproxy.model import (
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from tests.support.hostile import (
    ANY_OBJECT,
    HOSTILE_VALUES,
    endpoint_slice,
    node,
    service,
    set_path,
    spoiled,
)


def _service(obj: Any) -> Service:
    """The Service ``read_service`` makes of ``obj``, which it accepts."""
    parsed, verdict = read_service(obj)
    assert parsed is not None, verdict.summary()
    return parsed


def _read_node(obj: Any) -> Node:
    """The Node ``read_node`` makes of ``obj``, which it accepts."""
    parsed, verdict = read_node(obj)
    assert parsed is not None, verdict.summary()
    return parsed


def _read_slice(obj: Any, seen_at: float | None = None) -> EndpointSlice:
    """The slice ``read_endpoint_slice`` makes of ``obj``, which it accepts."""
    parsed, verdict = read_endpoint_slice(obj, seen_at=seen_at)
    assert parsed is not None, verdict.summary()
    return parsed

REFUSED_SERVICES = [
    ("spec.ports.0.targetPort", 70000, "invalid_port"),
    ("spec.ports.0.targetPort", "HTTP", "invalid_port"),
    ("spec.ports.0.targetPort", "a b", "invalid_port"),
    ("spec.ports.0.targetPort", "8080", "invalid_port"),
    ("spec.ports.0.targetPort", "a-very-long-port-name", "invalid_port"),
    ("spec.ports.0.name", "HTTP", "invalid_name"),
    ("spec.ports.0.name", "a b", "invalid_name"),
    ("spec.ports.0.port", 0, "invalid_port"),
    ("spec.ports.0.port", 65536, "invalid_port"),
    ("spec.ports.0.port", True, "invalid_port"),
    ("spec.ports.0.port", "80", "invalid_port"),
    ("spec.ports.0.protocol", "ICMP", "invalid_protocol"),
    ("spec.ports.0.protocol", "tcp", "invalid_protocol"),
    ("spec.ports.0.nodePort", 30080, "invalid_value"),  # ClusterIP may not have one
    ("spec.ports.0.nodePort", 70000, "invalid_port"),
    ("spec.ports", [{"name": "a", "port": 80}, {"name": "b", "port": 80}], "duplicate"),
    ("spec.ports", [{"name": "a", "port": 80}, {"name": "a", "port": 81}], "duplicate"),
    ("spec.ports", [{"port": 80}, {"port": 81}], "malformed"),
    ("spec.ports", [], "malformed"),
    ("spec.ports", "80", "malformed"),
    ("spec.clusterIP", "0.0.0.0", "forbidden_ip"),
    ("spec.clusterIP", "127.0.0.1", "forbidden_ip"),
    ("spec.clusterIP", "224.0.0.1", "forbidden_ip"),
    ("spec.clusterIP", "239.1.2.3", "forbidden_ip"),
    ("spec.clusterIP", "169.254.1.1", "forbidden_ip"),
    ("spec.clusterIP", "255.255.255.255", "forbidden_ip"),
    ("spec.clusterIP", "10.0.0.300", "invalid_ip"),
    ("spec.clusterIP", " 10.96.0.10", "invalid_ip"),
    ("spec.clusterIPs", ["::1"], "forbidden_ip"),
    ("spec.clusterIPs", ["fe80::1"], "forbidden_ip"),
    ("spec.clusterIPs", ["ff02::1"], "forbidden_ip"),
    # a zone index (Python's ipaddress reads one, Go's parser and so Kubernetes do not)
    ("spec.clusterIPs", ["fd00::10%eth0"], "invalid_ip"),
    ("spec.externalIPs", ["2001:db8::7%1"], "invalid_ip"),
    ("spec.loadBalancerSourceRanges", ["fd00::%eth0/64"], "invalid_ip"),
    ("status.loadBalancer.ingress", [{"ip": "2001:db8::100%lo"}], "invalid_ip"),
    ("spec.clusterIPs", ["10.96.0.10", "10.96.0.11"], "ip_family"),
    ("spec.clusterIPs", ["10.96.0.10", "fd00::1", "fd00::2"], "too_many"),
    ("spec.clusterIPs", ["10.96.0.11"], "invalid_value"),  # differs from clusterIP
    ("spec.ports.0.appProtocol", "a b", "invalid_value"),
    ("spec.ports.0.appProtocol", "", "invalid_value"),
    ("spec.ports.0.appProtocol", "example.com/" + "h" * 64, "invalid_value"),
    ("spec.ports.0.appProtocol", 2, "invalid_value"),
    ("spec.ipFamilies", ["IPv6"], "ip_family"),  # the cluster IP is IPv4
    ("spec.ipFamilies", ["IPv4", "IPv4"], "duplicate"),
    ("spec.ipFamilies", ["IPv5"], "invalid_value"),
    ("spec.ipFamilies", [["IPv4"]], "invalid_value"),
    ("spec.ipFamilies", "IPv4", "malformed"),
    ("spec.ipFamilyPolicy", "DualStack", "invalid_value"),
    ("spec", {"clusterIP": "None", "ipFamilies": ["IPv6", "IPv6"]}, "duplicate"),
    ("spec.type", "Bogus", "invalid_value"),
    ("spec.type", ["ClusterIP"], "invalid_value"),
    ("spec.externalIPs", ["127.0.0.1"], "forbidden_ip"),
    ("spec.externalIPs", ["169.254.169.254"], "forbidden_ip"),
    ("spec.externalIPs", ["0.0.0.0"], "forbidden_ip"),
    ("spec.externalIPs", "192.0.2.1", "malformed"),
    ("spec.sessionAffinity", "Sticky", "invalid_value"),
    ("spec.externalTrafficPolicy", "Nowhere", "invalid_value"),
    ("spec.internalTrafficPolicy", "local", "invalid_value"),
    ("spec.trafficDistribution", "Anywhere", "invalid_value"),
    ("spec.loadBalancerSourceRanges", ["10.0.0.0/99"], "invalid_ip"),
    ("spec.loadBalancerSourceRanges", ["10.0.0.0"], "invalid_ip"),
    ("spec.loadBalancerSourceRanges", ["10.0.0.0/" + "3" * 5000], "invalid_ip"),
    # GetLoadBalancerSourceRanges: each entry one CIDR (only the annotation is split)
    ("spec.loadBalancerSourceRanges", ["10.0.0.0/8,192.168.0.0/16"], "invalid_ip"),
    ("spec.loadBalancerSourceRanges", [" "], "invalid_ip"),
    # the source ranges annotation only with type LoadBalancer (the base is ClusterIP)
    ("metadata.annotations", {"service.beta.kubernetes.io/load-balancer-source-ranges": ""},
     "forbidden"),
    # *string enums: set to "" is set, and not one of the values (field.NotSupported)
    ("spec.ipFamilyPolicy", "", "invalid_value"),
    ("spec.internalTrafficPolicy", "", "invalid_value"),
    ("spec.trafficDistribution", "", "invalid_value"),
    # ValidateService: no sessionAffinityConfig with the affinity None (unset is None)
    ("spec.sessionAffinityConfig", {"clientIP": {"timeoutSeconds": 60}}, "forbidden"),
    ("spec.sessionAffinityConfig", {}, "forbidden"),
    ("spec.healthCheckNodePort", -1, "invalid_port"),
    ("spec", "x", "malformed"),
    ("metadata", "web", "malformed"),
    ("metadata", ["web"], "malformed"),
    ("metadata.name", "a/b", "invalid_name"),
    ("metadata.name", "a;b", "invalid_name"),
    ("metadata.name", "a\nb", "invalid_name"),
    ("metadata.name", "web\n", "invalid_name"),
    ("metadata.name", "x" * 300, "invalid_name"),
    ("metadata.name", "x" * 64, "invalid_name"),
    ("metadata.name", "Web", "invalid_name"),
    ("metadata.name", "1web", "invalid_name"),  # DNS-1035: a letter first
    ("metadata.name", "", "malformed"),
    ("metadata.name", ["web"], "malformed"),
    ("metadata.namespace", "Shop", "invalid_name"),
    ("metadata.namespace", "a.b", "invalid_name"),
    ("metadata.labels", {"a b": "x"}, "invalid_name"),
    ("metadata.labels", {"app": 5}, "malformed"),
    ("metadata.labels", {"app": "a b"}, "invalid_value"),
    ("metadata.annotations", {"svcproxy.io/x": ["y"]}, "malformed"),
    # the limit is on bytes: 280,000 in UTF-8
    ("metadata.annotations", {"svcproxy.io/x": "é" * 140_000}, "too_large"),
    ("status.loadBalancer.ingress", [{"ip": "nope"}], "invalid_ip"),
    ("status.loadBalancer.ingress", [{"ip": "192.0.2.1", "ipMode": "Tunnel"}], "invalid_value"),
    ("status.loadBalancer.ingress", [{"ip": "192.0.2.1", "ipMode": ""}], "invalid_value"),
    # ValidateLoadBalancerStatus: an ipMode only with an ip
    ("status.loadBalancer.ingress", [{"hostname": "lb.example.com", "ipMode": "VIP"}],
     "forbidden"),
    ("status.loadBalancer.ingress", [{"ip": "", "ipMode": "Proxy"}], "forbidden"),
    # ValidateService's cross-field rules (the base service is a ClusterIP one)
    ("spec.externalTrafficPolicy", "Cluster", "invalid_value"),
    ("spec.healthCheckNodePort", 30100, "invalid_value"),
    ("spec.clusterIP", None, "invalid_value"),  # clusterIPs without clusterIP
    ("spec", {"clusterIPs": [""], "ports": [{"port": 80}]}, "invalid_value"),
    ("spec.ipFamilies", ["IPv4", "IPv6"], "invalid_value"),  # SingleStack below
    ("metadata.annotations", {"service.kubernetes.io/topology-mode": "Auto",
                              "service.kubernetes.io/topology-aware-hints": "Disabled"},
     "invalid_value"),
]


@pytest.mark.parametrize("path,value,reason", REFUSED_SERVICES,
                         ids=[f"{p}={v!r:.30}" for p, v, _ in REFUSED_SERVICES])
def test_services_kubernetes_refuses_are_refused(path: str, value: Any, reason: str) -> None:
    # loadBalancerSourceRanges: on a LoadBalancer, the one type that may carry them
    base = service(type="LoadBalancer") if "SourceRanges" in path else \
        service(ipFamilyPolicy="SingleStack") if path == "spec.ipFamilies" else service()
    obj = set_path(base, path, value)
    verdict = validate_service(obj)
    assert not verdict.ok
    assert verdict.errors[0].reason == reason, verdict.summary()
    assert verdict.errors[0].field and verdict.summary()
    assert read_service(obj) == (None, verdict)


SOURCE_RANGES = "service.beta.kubernetes.io/load-balancer-source-ranges"


@pytest.mark.parametrize("value,ok", [
    ("", True), ("  ", True), ("1.2.3.4/8,  5.6.7.8/16", True), (" 10.0.0.0/8 ", True),
    ("10.0.0.1/32,", False), ("10.0.0.1/32, ", False), ("10.0.0.1/32,,10.0.0.2/32", False),
    ("foo.bar", False), ("10.0.0.1/33", False), ("10.0.0.1", False), ("10.0.0.1/32,*", False),
])
def test_the_source_ranges_annotation_is_checked_as_get_load_balancer_source_ranges_reads_it(
        value: str, ok: bool) -> None:
    """Without spec.loadBalancerSourceRanges, ValidateService checks the annotation: once
    trimmed, empty (allow all) or CIDRs split on commas, each trimmed; svcproxy checks it
    and does not read it (kube-proxy reads the field alone)."""
    obj = set_path(service(type="LoadBalancer"), "metadata.annotations", {SOURCE_RANGES: value})
    verdict = validate_service(obj)
    assert verdict.ok == ok, verdict.summary()
    assert ok or verdict.errors[0].field == f"metadata.annotations.{SOURCE_RANGES}"
    if ok:
        assert _service(obj).load_balancer_source_ranges == ()
    ranged = set_path(obj, "spec.loadBalancerSourceRanges", ["10.0.0.0/8"])
    assert validate_service(ranged).ok, "with the field set, the annotation is not read"


REFUSED_SLICES = [
    ("endpoints.0.addresses", ["fd00::1"], "ip_family"),
    ("endpoints.0.addresses", ["127.0.0.1"], "forbidden_ip"),
    ("endpoints.0.addresses", ["169.254.169.254"], "forbidden_ip"),
    ("endpoints.0.addresses", ["0.0.0.0"], "forbidden_ip"),
    ("endpoints.0.addresses", ["224.0.0.5"], "forbidden_ip"),
    ("endpoints.0.addresses", ["10.0.0.1; drop"], "invalid_ip"),
    ("endpoints.0.addresses", ["fd00::5%eth0"], "invalid_ip"),
    ("endpoints.0.addresses", [], "malformed"),
    ("endpoints.0.addresses", ["10.0.0.1"] * 101, "too_many"),
    ("endpoints.0.conditions.ready", "no", "malformed"),
    ("endpoints.0.conditions.serving", 1, "malformed"),
    ("endpoints.0.nodeName", "node a", "invalid_name"),
    ("endpoints.0.nodeName", "Node", "invalid_name"),
    ("endpoints.0.hints", {"forZones": [{"name": f"z{i}"} for i in range(9)]}, "too_many"),
    ("endpoints.0.hints", {"forZones": [{"name": "z"}, {"name": "z"}]}, "duplicate"),
    ("endpoints.0", "10.0.0.1", "malformed"),
    ("endpoints", [{"addresses": ["10.0.0.1"]}] * 1001, "too_many"),
    ("addressType", "IPv5", "invalid_value"),
    ("addressType", None, "invalid_value"),
    ("ports.0.name", "HTTP", "invalid_name"),
    ("ports.0.protocol", "ICMP", "invalid_protocol"),
    ("ports.0.appProtocol", "a/b/c", "invalid_value"),
    ("ports", [{"name": "a", "port": 1}, {"name": "a", "port": 2}], "duplicate"),
    ("metadata.name", "Bad_Name", "invalid_name"),
    ("metadata.name", "x" * 254, "invalid_name"),
    ("metadata.labels", {}, "malformed"),
    # set, even to "", is validated (ValidateNodeName, ValidateDNS1123Label of a *string)
    ("endpoints.0.nodeName", "", "malformed"),
    ("endpoints.0.hostname", "", "malformed"),
    ("endpoints.0.hostname", "Web", "invalid_name"),
    ("endpoints.0.zone", 5, "malformed"),
    ("endpoints.0.deprecatedTopology", {"topology.kubernetes.io/zone": "a"}, "invalid_value"),
    ("endpoints.0.deprecatedTopology", {"a": "b c"}, "invalid_value"),
    ("endpoints.0.deprecatedTopology", {f"k{i}": "v" for i in range(17)}, "too_many"),
    ("endpoints.0.hints", {"forZones": [{"name": "zone a"}]}, "invalid_value"),
    ("endpoints.0.hints", {"forZones": [{}, {"name": ""}]}, "duplicate"),
    ("endpoints.0.hints", {"forNodes": [{"name": ""}]}, "malformed"),
    ("ports.0.protocol", "", "invalid_protocol"),  # only unset defaults to TCP
    ("ports.0.port", "80", "invalid_port"),
    ("ports.0.port", 2**31, "invalid_port"),  # an int32: the apiserver cannot decode it
]


@pytest.mark.parametrize("path,value,reason", REFUSED_SLICES,
                         ids=[f"{p}={v!r:.30}" for p, v, _ in REFUSED_SLICES])
def test_slices_kubernetes_refuses_are_refused(path: str, value: Any, reason: str) -> None:
    verdict = validate_endpoint_slice(set_path(endpoint_slice(), path, value))
    assert not verdict.ok
    assert verdict.errors[0].reason == reason, verdict.summary()


@pytest.mark.parametrize("address", [
    "db", "db.", "x" * 64 + ".example.com", ".".join(["x" * 60] * 5), "db..example.com",
    "db.example.com..", "Db.example.com", "", 5])
def test_fqdn_addresses_kubernetes_refuses_are_refused(address: Any) -> None:
    verdict = validate_endpoint_slice(endpoint_slice(family="FQDN", ips=(address,)))
    assert not verdict.ok and verdict.errors[0].reason in ("invalid_name", "malformed"), \
        verdict.summary()


@pytest.mark.parametrize("make", [service, endpoint_slice])
def test_an_annotation_with_a_lone_surrogate_is_kept_as_go_keeps_it(make: Any) -> None:
    """A YAML "\\ud800" (or JSON escape) is no UTF-8; Go's decoder stores U+FFFD in its
    place, so the apiserver keeps the object: it is served, the annotation counted at the
    size of its U+FFFD."""
    obj = set_path(make(), "metadata.annotations", {"svcproxy.io/x": "a\ud800b"})
    validator = validate_service if make is service else validate_endpoint_slice
    verdict = validator(obj)
    assert verdict.ok, verdict.summary()
    big = set_path(make(), "metadata.annotations", {"svcproxy.io/x": "\ud800" * 90_000})
    assert validator(big).errors[0].reason == "too_large"  # 270,000 bytes once replaced


@pytest.mark.parametrize("name", [".", "", "db..example.com", "db.example.com..", "Db"])
def test_external_names_kubernetes_refuses_are_refused(name: str) -> None:
    obj = {**service(), "spec": {"type": "ExternalName", "externalName": name}}
    verdict = validate_service(obj)
    assert not verdict.ok and verdict.errors[0].field == "spec.externalName", verdict.summary()


@pytest.mark.parametrize("path,value,reason", [
    ("metadata.name", "Node_1", "invalid_name"),
    ("spec.podCIDRs", ["10.0.0.0/33"], "invalid_ip"),
    ("spec.podCIDRs", ["fd00::%1/64"], "invalid_ip"),
    ("spec.podCIDRs", ["fd00::/" + "1" * 4301], "invalid_ip"),
    ("spec.podCIDRs", ["10.0.0.0/24", "fd00::/64", "10.1.0.0/24"], "too_many"),
    ("spec.taints", [{"key": "a b", "effect": "NoSchedule"}], "invalid_name"),
    ("spec.taints", [{"key": "a", "effect": "Sometimes"}], "invalid_value"),
    ("spec.taints", [{"key": "a"}], "invalid_value"),  # the effect is required
    ("spec.taints", [{"key": "a", "value": "b c", "effect": "NoSchedule"}], "invalid_value"),
    ("spec.taints", [{"key": "a", "effect": "NoSchedule"}] * 2, "duplicate"),
    ("spec.podCIDRs", ["10.0.0.0/24", "10.1.0.0/24"], "ip_family"),
    ("spec.podCIDRs", ["fd00::/64", "fd00::/64"], "ip_family"),
    # ValidateCIDR trims nothing (only loadBalancerSourceRanges' entries are trimmed)
    ("spec.podCIDRs", [" 10.0.0.0/24"], "invalid_ip"),
    ("spec", {"podCIDR": "10.0.0.0/24 "}, "invalid_ip"),  # podCIDRs unset: converted
])
def test_nodes_kubernetes_refuses_are_refused(path: str, value: Any, reason: str) -> None:
    verdict = validate_node(set_path(node(), path, value))
    assert not verdict.ok and verdict.errors[0].reason == reason, verdict.summary()


@pytest.mark.parametrize("obj", [
    service(), service(ip="010.096.000.010", clusterIPs=["010.096.000.010"]),
    service(clusterIP="None", clusterIPs=["None"], ports=[]),
    service(ip="10.96.0.10", clusterIPs=["10.96.0.10", "fd00::10"]),
    {**service(), "spec": {"type": "ExternalName", "externalName": "db.example.com"}},
    service(type="LoadBalancer", ports=[{"name": "a", "port": 80, "nodePort": 30080},
                                        {"name": "b", "port": 80, "protocol": "UDP"}],
            loadBalancerSourceRanges=[" 192.168.1.0/24 "], externalTrafficPolicy="Local",
            sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}}),
    service(type="LoadBalancer", loadBalancerSourceRanges=["10.0.0.0/0008", "fd00::/00064"]),
    service(ports=[{"port": 53, "protocol": "UDP", "targetPort": "dns-udp"}]),
    # annotation keys are qualified names whatever their case (ValidateAnnotations)
    set_path(service(), "metadata.annotations", {"Example.COM/Note": "x", "A_b": "é" * 1000}),
    service(ports=[{"port": 443, "appProtocol": "kubernetes.io/h2c"}], ipFamilies=["IPv4"],
            ipFamilyPolicy="SingleStack"),
    service(ip="fd00::10", ipFamilies=["IPv6", "IPv4"], ipFamilyPolicy="PreferDualStack"),
    service(ip="10.96.0.10", clusterIPs=["10.96.0.10", "fd00::10"],
            ipFamilies=["IPv4", "IPv6"], ipFamilyPolicy="RequireDualStack"),
    service(ip="None", ipFamilies=["IPv6"], ports=[]),  # headless: no IP to match
    service(sessionAffinity="None", sessionAffinityConfig=None),  # null is unset
    # an ipMode is defaulted (VIP) when an ip has none; an entry with no ip has none
    set_path(service(type="LoadBalancer"), "status.loadBalancer.ingress",
             [{"ip": "192.0.2.1"}, {"hostname": "lb.example.com"}, {"ip": "192.0.2.2",
                                                                    "ipMode": "Proxy"}]),
    endpoint_slice(), endpoint_slice(ips=("fd00::1",), family="IPv6"),
    set_path(endpoint_slice(), "ports.0.appProtocol", "kubernetes.io/ws"),
    endpoint_slice(family="FQDN", endpoints=[{"addresses": ["db.example.com"]}]),
    # a trailing dot marks a name fully qualified (IsFullyQualifiedDomainName, and a CNAME)
    endpoint_slice(family="FQDN", endpoints=[{"addresses": ["db.example.com."]}]),
    {**service(), "spec": {"type": "ExternalName", "externalName": "db.example.com."}},
    endpoint_slice(endpoints=[{"addresses": ["10.0.0.1"]}] * 1000),
    node(),
], ids=lambda o: f"{o['kind']}-{len(str(o))}")
def test_valid_objects_are_accepted(obj: dict[str, Any]) -> None:
    verdict = validate(obj["kind"], obj)
    assert verdict.ok, verdict.summary()


ACCEPTED_SLICES = [
    # validateEndpoints has no rule for zone (a real kube-apiserver v1.28 stores these)
    ("endpoints.0.zone", "zone a"), ("endpoints.0.zone", "Zone_A/ü" + "z" * 80),
    ("endpoints.0.hostname", None), ("endpoints.0.nodeName", None),
    ("endpoints.0.hints", {"forZones": [{"name": ""}, {"name": "zone-a"}]}),  # a label value
    ("endpoints.0.deprecatedTopology", {"kubernetes.io/hostname": "node-a"}),
    ("ports.0.appProtocol", None), ("ports.0.protocol", None), ("ports.0.name", None),
]


@pytest.mark.parametrize("path,value", ACCEPTED_SLICES,
                         ids=[f"{p}={v!r:.30}" for p, v in ACCEPTED_SLICES])
def test_slices_kubernetes_accepts_are_served(path: str, value: Any) -> None:
    obj = set_path(endpoint_slice(), path, value)
    verdict = validate_endpoint_slice(obj)
    assert verdict.ok and not verdict.warnings, verdict.summary()
    parsed = _read_slice(obj)
    assert parsed.endpoints[0].addresses == ("10.244.1.5",)
    if path == "endpoints.0.zone":
        assert parsed.endpoints[0].zone == value


@pytest.mark.parametrize("port", [0, -1, 65536, 2**31 - 1, -(2**31)])
def test_a_slice_port_kubernetes_accepts_but_no_kernel_takes_degrades_that_port(
        port: int) -> None:
    """validatePorts has no rule for the number: the port is left out, with a warning
    naming it, and the slice's other ports and endpoints are served."""
    obj = set_path(endpoint_slice(), "ports", [{"name": "http", "port": 8080},
                                               {"name": "odd", "port": port}])
    verdict = validate_endpoint_slice(obj)
    assert verdict.ok, verdict.summary()
    assert [(w.field, w.reason) for w in verdict.warnings] == [("ports[1].port", "degraded")]
    parsed = _read_slice(obj)
    assert [p.name for p in parsed.ports] == ["http"] and parsed.endpoints


def test_ipv4_mapped_addresses_and_ranges_are_read_as_go_reads_them() -> None:
    """To Go an IPv4-mapped address is IPv4 (To4() != nil): IsValidIPv4Address takes it
    in an IPv4 slice, the cluster IP's family is IPv4, ::ffff:a.b.c.d/(96+n) is a.b.c.d/n."""
    obj = endpoint_slice(ips=("::ffff:10.244.1.5",))
    assert validate_endpoint_slice(obj).ok
    assert _read_slice(obj).endpoints[0].addresses == ("10.244.1.5",)
    assert not validate_endpoint_slice(endpoint_slice(ips=("::ffff:10.244.1.5",),
                                                      family="IPv6")).ok
    svc = service(ip="::ffff:10.96.0.10", ipFamilies=["IPv4"], type="LoadBalancer",
                  loadBalancerSourceRanges=["::ffff:192.168.1.0/120", "::ffff:1.2.3.4/64"])
    assert validate_service(svc).ok, validate_service(svc).summary()
    parsed = _service(svc)
    assert parsed.cluster_ips == ("10.96.0.10",)
    assert parsed.load_balancer_source_ranges == ("192.168.1.0/24", "::/64")
    obj = set_path(node(), "spec.podCIDRs", ["::ffff:10.244.1.0/120", "fd00::/64"])
    assert validate_node(obj).ok, validate_node(obj).summary()
    assert _read_node(obj).pod_cidrs == ("10.244.1.0/24", "fd00::/64")


def test_a_zone_indexed_ip_is_refused_in_an_ipv6_slice_and_ignored_as_a_node_address() -> None:
    verdict = validate_endpoint_slice(endpoint_slice(ips=("fd00::5%eth0",), family="IPv6"))
    assert not verdict.ok and verdict.errors[0].reason == "invalid_ip", verdict.summary()
    obj = set_path(node(), "status.addresses", [
        {"type": "InternalIP", "address": "fd00::1%eth0"},
        {"type": "ExternalIP", "address": "١٠.0.0.1"},  # Arabic-Indic digits: 10.0.0.1
        {"type": "InternalIP", "address": "192.168.0.10"}])
    verdict = validate_node(obj)
    assert verdict.ok and "ignored" in str(verdict.warnings[0]), verdict.warnings
    assert _read_node(obj).addresses == ("192.168.0.10",)


def test_node_addresses_are_read_as_kube_proxy_reads_them() -> None:
    """kube-proxy reads a Node's addresses with netutils.ParseIPSloppy (no trimming) and
    takes an IPv4-mapped IPv6 address as IPv4: padded ones are skipped, mapped ones are
    their IPv4 address, leading zeros are read sloppily."""
    obj = set_path(node(), "status.addresses", [
        {"type": "InternalIP", "address": " 192.168.0.1"},
        {"type": "InternalIP", "address": "192.168.0.2\n"},
        {"type": "InternalIP", "address": "::ffff:192.168.0.3"},
        {"type": "ExternalIP", "address": "010.0.0.4"},
        {"type": "ExternalIP", "address": "::ffff:192.168.0.3"},
        {"type": "InternalIP", "address": "fd00::5"},
        {"type": "InternalIP", "address": "00010.0.0.6"}])  # Go's dtoi: any leading zeros
    assert _read_node(obj).addresses == ("192.168.0.3", "10.0.0.4", "fd00::5", "10.0.0.6")
    warned = [w.field for w in validate_node(obj).warnings]
    assert warned == ["status.addresses[0].address", "status.addresses[1].address"], warned


def test_a_node_address_of_a_type_kubernetes_does_not_know_is_ignored_not_refused() -> None:
    """Kubernetes validates no Node status (ValidateNode, ValidateNodeUpdate): refusing the
    Node for it would lose its zone, labels and pod CIDRs."""
    obj = set_path(node(), "status.addresses", [
        {"type": "Mystery", "address": "192.168.0.1"},
        {"type": "InternalIP", "address": "192.168.0.10"}])
    verdict = validate_node(obj)
    assert verdict.ok and "Mystery" in str(verdict.warnings[0]), verdict.summary()
    assert _read_node(obj).addresses == ("192.168.0.10",)
    taints = [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoExecute"},
              {"key": "example.com/b", "value": "c", "effect": "PreferNoSchedule"}]
    assert validate_node(set_path(node(), "spec.taints", taints)).ok


def test_bad_trigger_time_is_a_warning_not_a_refusal() -> None:
    obj = endpoint_slice()
    obj["metadata"]["annotations"] = {
        "endpoints.kubernetes.io/last-change-trigger-time": "0001-01-01T00:00:00+01:00"}
    verdict = validate_endpoint_slice(obj)
    assert verdict.ok and "last-change-trigger-time" in str(verdict.warnings[0])
    assert _read_slice(obj, seen_at=5.0).trigger_time == 5.0


def test_size_and_depth_are_bounded_with_aliases_counted_expanded() -> None:
    limits = ObjectLimits(max_object_bytes=10_000, max_depth=10)
    deep: Any = "x"
    for _ in range(20):
        deep = [deep]
    assert check_size({"spec": deep}, limits).reason == "too_deep"  # type: ignore[union-attr]
    shared: Any = ["y" * 50]
    for _ in range(8):  # a DAG: 2**8 references to one list, as YAML aliases make
        shared = [shared, shared]
    big = check_size({"a": shared}, ObjectLimits(max_object_bytes=10_000, max_depth=64))
    assert big is not None and big.reason == "too_large" and "--max-object-bytes" in str(big)
    assert check_size(service(), limits) is None
    assert validate_service(service(name="abc"), ObjectLimits(max_name_length=2)).errors


def _parse(obj: dict[str, Any]) -> Any:
    return {"Service": _service, "EndpointSlice": _read_slice,
            "Node": _read_node}[obj["kind"]](obj)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_OBJECT)
def test_any_spoiled_object_is_judged_and_what_passes_parses_and_encodes(obj: Any) -> None:
    verdict = validate(obj["kind"], obj)  # never raises
    if not verdict.ok:
        assert verdict.errors[0].reason and verdict.summary()
        return
    parsed = _parse(obj)  # what passes parses
    if obj["kind"] == "Service":
        slice_ = _parse(endpoint_slice(svc=parsed.name, ns=parsed.namespace))
        for port in service_base(parsed, [slice_]).ports:
            assert replace_service(ServicePortState(
                port.service, {e.ip: e for e in port.endpoints})).data
    elif obj["kind"] == "Node":
        assert set_node(node_info(parsed)).data


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["Service", "EndpointSlice", "Node"]), HOSTILE_VALUES)
def test_any_value_at_all_gets_a_verdict(kind: str, value: Any) -> None:
    verdict = validate(kind, value)
    assert not verdict.ok or isinstance(value, dict)


def test_what_an_upstream_frontend_sends_passes_the_same_rules() -> None:
    key = ServicePortKey("shop", "web", "http", Protocol.TCP)
    port = ServicePort(key, ServiceType.CLUSTER_IP, ("10.96.0.10",), 80, trigger_time=-1e300)
    eps = {f"10.1.{i // 250}.{i % 250 + 1}": Endpoint(f"10.1.{i // 250}.{i % 250 + 1}", 8080,
                                                      node_name="node-a")
           for i in range(2500)}
    svc, slices = service_objects([ServicePortState(port, eps)])
    assert validate("Service", svc).ok, validate("Service", svc).summary()
    assert len(slices) == 3 and all(validate("EndpointSlice", s).ok for s in slices)
    assert sum(len(s["endpoints"]) for s in slices) == 2500


@settings(max_examples=300, deadline=None)
@given(spoiled(endpoint_slice()["endpoints"][0]))
def test_the_fast_path_for_plain_endpoints_accepts_nothing_the_full_rules_refuse(
        ep: Any) -> None:
    full = validate_endpoint_slice(endpoint_slice(endpoints=[ep], ips=()))
    quick = _plain_ipv4_endpoint(ep, 253)
    assert not quick or full.ok, full.summary()
