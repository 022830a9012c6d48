"""Differential tests against Kubernetes' rules: generated Services, EndpointSlices and
Nodes go through the stand-in apiserver (its model of kube-apiserver v1.28's validation
and allocators, tests/support/kubemodel.py) and through svcproxy's manifest source. Property:
what the model stores is served (a slice's endpoints reach the node's records), what it
refuses is refused alone (the other objects are served) and logged. Then the same edge
values through a real client's POST, the apiserver source, GetNodeState, Watch and the
SDK."""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.sources.manifests import ManifestSource
from svcproxy.model import Protocol, ServicePortKey
from tests.support import kubemodel
from tests.support.fakeapiserver import FakeApiserver
from tests.support.hostile import endpoint_slice, node, service
from tests.support.refusal_log import refusals_logged
from tests.support.waiting import wait_for

WEB = ServicePortKey("shop", "web", "http", Protocol.TCP)
API = ServicePortKey("shop", "api", "http", Protocol.TCP)
Obj = dict[str, Any]
Mutation = Callable[[Obj], None]

# Written as JSON (YAML's subset, read 3x faster than PyYAML dumps it): characters of the
# BMP, which JSON's \u escapes and YAML's agree on.
TEXT = st.one_of(st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)),
                         max_size=70), st.sampled_from(
    ["", "a", "zone a", "Zone_A", "a.b", "a" * 63, "a" * 64, "é", "node-a", "Node", "-a",
     "a-", "a..b", "x" * 254, "kubernetes.io/x"]))
NAMES = st.one_of(st.none(), TEXT)
IPS = st.sampled_from(["10.244.1.5", "010.244.001.005", "::ffff:10.244.1.5", "127.0.0.1",
                       "169.254.1.1", "0.0.0.0", "224.0.0.1", "239.1.1.1", "fd00::1", "::1",
                       "10.244.1.256", " 10.244.1.5", "fd00::1%eth0", "1.2.3", ""])
PORTS = st.one_of(st.sampled_from([-(2**31) - 1, -(2**31), -1, 0, 1, 8080, 65535, 65536,
                                   2**31 - 1, 2**31, "80", None, True, 1.5]),
                  st.integers(-(2**32), 2**32))


def at(path: str, value: Any) -> Mutation:
    """Set the value at a dotted path (numbers index lists; None is written as null)."""
    def apply(obj: Obj) -> None:
        *parents, last = path.split(".")
        here: Any = obj
        for part in parents:
            here = here[int(part)] if isinstance(here, list) else here.setdefault(part, {})
        if isinstance(here, list):
            here[int(last)] = value
        else:
            here[last] = value
    return apply


SLICE_MUTATIONS = st.one_of(
    st.builds(at, st.just("endpoints.0.zone"), NAMES),
    st.builds(at, st.just("endpoints.0.nodeName"), NAMES),
    st.builds(at, st.just("endpoints.0.hostname"), NAMES),
    st.builds(lambda ip: at("endpoints.0.addresses", [ip]), IPS),
    st.builds(lambda names: at("endpoints.0.hints", {"forZones": [{"name": n} for n in names]}),
              st.lists(TEXT, max_size=9)),
    st.builds(lambda labels: at("endpoints.0.deprecatedTopology", labels),
              st.dictionaries(st.sampled_from(["a", "topology.kubernetes.io/zone", "b c",
                                               "example.com/x"]), TEXT, max_size=3)),
    st.builds(at, st.just("ports.0.port"), PORTS),
    st.builds(at, st.just("ports.0.protocol"), st.sampled_from(
        [None, "", "TCP", "UDP", "SCTP", "tcp", "ICMP"])),
    st.builds(at, st.just("ports.0.appProtocol"), st.one_of(NAMES, st.just(None))),
    st.builds(at, st.just("ports.0.name"), st.sampled_from([None, "", "http", "HTTP", "a" * 64])),
    st.builds(at, st.just("metadata.name"), TEXT),
    st.builds(at, st.just("addressType"), st.sampled_from(["IPv4", "IPv6", "FQDN", "IP", ""])),
)
SOURCE_RANGES = "service.beta.kubernetes.io/load-balancer-source-ranges"
SOURCE_RANGE_TEXT = st.sampled_from([
    "10.0.0.0/8", " 10.0.0.0/8 ", "10.0.0.0/8,192.168.0.0/16", "10.0.0.0/8, 192.168.0.0/16",
    "10.0.0.0/8,", "", " ", "fd00::/64", "::ffff:10.0.0.0/104", "10.0.0.0/33", "10.0.0.1"])
CLUSTER_IPS = st.sampled_from(["10.96.0.10", "010.096.000.010", "::ffff:10.96.0.10",
                               "127.0.0.1", "0.0.0.0", "224.0.0.1", "10.96.0.300", "nope",
                               "fd00:10:96::a", "::1"])
SERVICE_MUTATIONS = st.one_of(
    st.builds(lambda ip: _compose(at("spec.clusterIP", ip), at("spec.clusterIPs", [ip])),
              CLUSTER_IPS),
    st.builds(at, st.just("metadata.name"), TEXT),
    st.builds(at, st.just("spec.ports.0.name"), st.sampled_from(
        [None, "", "http", "HTTP", "a" * 64])),
    st.builds(at, st.just("spec.ports.0.port"), PORTS),
    st.builds(at, st.just("spec.ports.0.protocol"), st.sampled_from(
        [None, "", "TCP", "UDP", "SCTP", "tcp"])),
    st.builds(at, st.just("spec.ports.0.targetPort"), st.one_of(PORTS, NAMES)),
    st.builds(at, st.just("spec.ports.0.appProtocol"), NAMES),
    # In the allocator's range or refused by both (the range is a cluster setting).
    st.builds(lambda port, stype: _compose(at("spec.type", stype),
                                           at("spec.ports.0.nodePort", port)),
              st.sampled_from([None, 0, 30080, -1, 65536, "30080"]),
              st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"])),
    st.builds(lambda ips: at("spec.externalIPs", ips), st.lists(IPS, max_size=2)),
    st.builds(lambda t: _compose(at("spec.sessionAffinity", "ClientIP"), at(
        "spec.sessionAffinityConfig", {"clientIP": {"timeoutSeconds": t}})),
        st.sampled_from([None, 0, 1, 86400, 86401, -1])),
    st.builds(at, st.sampled_from(["spec.internalTrafficPolicy", "spec.externalTrafficPolicy"]),
              st.sampled_from([None, "", "Cluster", "Local", "local"])),
    # ValidateService's cross-field rules: by type, externalTrafficPolicy (externally
    # reachable only), healthCheckNodePort (LoadBalancer + Local only),
    # loadBalancerSourceRanges (LoadBalancer only), with or without externalIPs.
    st.builds(lambda stype, etp, hc, ranges, ips: _compose(
        at("spec.type", stype), at("spec.externalTrafficPolicy", etp),
        at("spec.healthCheckNodePort", hc), at("spec.loadBalancerSourceRanges", ranges),
        at("spec.externalIPs", ips)),
        st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
        st.sampled_from([None, "Cluster", "Local"]), st.sampled_from([None, 0, 30100]),
        st.sampled_from([None, [], ["10.0.0.0/8"]]), st.sampled_from([None, ["192.0.2.7"]])),
    # ExternalName: no cluster IPs, families or family policy.
    st.builds(lambda ip, families, policy: _compose(
        at("spec.type", "ExternalName"), at("spec.externalName", "db.example.com"),
        at("spec.clusterIP", ip), at("spec.clusterIPs", [ip] if ip else None),
        at("spec.ipFamilies", families), at("spec.ipFamilyPolicy", policy)),
        st.sampled_from([None, "", "10.96.0.10", "None"]),
        st.sampled_from([None, [], ["IPv4"]]), st.sampled_from([None, "SingleStack"])),
    # ipFamilyPolicy against the cluster IPs and families given; clusterIPs alone.
    st.builds(lambda ips, families, policy: _compose(
        at("spec.clusterIPs", ips), at("spec.ipFamilies", families),
        at("spec.ipFamilyPolicy", policy)),
        st.sampled_from([["10.96.0.10"], ["10.96.0.10", "fd00:10:96::a"]]),
        st.sampled_from([None, ["IPv4"], ["IPv4", "IPv6"]]),
        st.sampled_from([None, "", "SingleStack", "PreferDualStack", "RequireDualStack"])),
    st.just(at("spec.clusterIP", None)),  # clusterIPs without clusterIP
    # loadBalancerSourceRanges entries (one CIDR each, trimmed) and, without them, the
    # annotation (split on commas), by type.
    st.builds(lambda stype, ranges, note: _compose(
        at("spec.type", stype), at("spec.loadBalancerSourceRanges", ranges),
        at("metadata.annotations", {} if note is None else {SOURCE_RANGES: note})),
        st.sampled_from(["ClusterIP", "LoadBalancer"]),
        st.one_of(st.none(), st.lists(SOURCE_RANGE_TEXT, max_size=2)),
        st.one_of(st.none(), SOURCE_RANGE_TEXT)),
    # *string enums set to "" (or a value), and the affinity's config by affinity.
    st.builds(at, st.just("spec.trafficDistribution"), st.sampled_from(
        [None, "", "PreferClose", "PreferSameZone", "PreferSameNode", "preferClose"])),
    st.builds(lambda affinity, cfg: _compose(at("spec.sessionAffinity", affinity),
                                             at("spec.sessionAffinityConfig", cfg)),
              st.sampled_from([None, "", "None", "ClientIP"]),
              st.sampled_from([None, {}, {"clientIP": {}},
                               {"clientIP": {"timeoutSeconds": 60}}])),
    # the load balancer's status: an ipMode only with an ip, VIP or Proxy.
    st.builds(lambda entries: _compose(at("spec.type", "LoadBalancer"),
                                       at("status.loadBalancer.ingress", entries)),
              st.lists(st.fixed_dictionaries({}, optional={
                  "ip": st.sampled_from(["", "192.0.2.7", "nope"]),
                  "hostname": st.just("lb.example.com"),
                  "ipMode": st.sampled_from(["", "VIP", "Proxy", "vip"])}), max_size=2)),
    st.builds(lambda mode, hints: at("metadata.annotations", {
        k: v for k, v in (("service.kubernetes.io/topology-mode", mode),
                          ("service.kubernetes.io/topology-aware-hints", hints)) if v}),
        st.sampled_from([None, "Auto", "auto"]), st.sampled_from([None, "Auto", "Disabled"])),
)
NODE_MUTATIONS = st.one_of(
    st.builds(at, st.just("metadata.name"), TEXT),
    st.builds(lambda zone: at("metadata.labels", {"topology.kubernetes.io/zone": zone}), TEXT),
    st.builds(lambda cidrs: at("spec.podCIDRs", cidrs), st.lists(st.sampled_from(
        ["10.244.1.0/24", "::ffff:10.244.1.0/120", "::ffff:1.2.3.4/64", "fd00::/64",
         "10.0.0.0/33", "10.0.0.0", "10.0.0.0/0008", "fd00::%1/64", " 10.244.1.0/24",
         "fd00::/64 "]), max_size=3)),
    st.builds(lambda key, effect: at("spec.taints", [{"key": key, "effect": effect}]),
              TEXT, st.sampled_from(["NoSchedule", "NoExecute", "Sometimes", ""])),
    st.builds(lambda kind, address: at("status.addresses", [{"type": kind, "address": address}]),
              st.sampled_from(["InternalIP", "ExternalIP", "Hostname", "Mystery"]), TEXT),
)


def _compose(*mutations: Mutation) -> Mutation:
    def apply(obj: Obj) -> None:
        for mutation in mutations:
            mutation(obj)
    return apply


_API: list[FakeApiserver] = []


def stand_in() -> FakeApiserver:
    """One stand-in for every example (each removes what it stored)."""
    if not _API:
        _API.append(FakeApiserver())
    return _API[0]


def stored_by_the_model(kind: str, obj: Obj) -> bool:
    """Whether the stand-in stores ``obj`` (201); what it stores is removed again."""
    api = stand_in()
    code, body = api.submit(kind, copy.deepcopy(obj))
    if code == 201:
        api.delete(kind, body)
    assert code in (201, 422), body
    return code == 201


def expected_endpoints(obj: Obj) -> set[str]:
    """The addresses web's port http gets from a slice the model stored: its endpoints'
    first addresses read as Go reads them, when it has port http/TCP of a usable number."""
    ports = [p for p in obj.get("ports") or [] if (p.get("name") or "") == "http"
             and (p.get("protocol") or "TCP") == "TCP"]
    number = (ports[0].get("port") or 0) if ports else 0  # null: no number, no endpoint
    if obj.get("addressType") != "IPv4" or not 1 <= number <= 65535:
        return set()
    return {str(kubemodel.as_v4(kubemodel.parse_ip(ep["addresses"][0])))
            for ep in obj["endpoints"]}


def through_manifests(kind: str, obj: Obj) -> tuple[Engine, list[str]]:
    """The example in one file, web's and api's other objects in another, read by the
    manifest source into a fresh engine; the refusals it logged."""
    others = {"Service": [endpoint_slice()], "EndpointSlice": [service()],
              "Node": [service(), endpoint_slice()]}[kind]
    if kind != "Node":
        others.append(node())
    others += [service("api", ip="10.96.0.11"), endpoint_slice("api-1", "api",
                                                               ips=("10.244.2.1",))]
    eng = Engine()
    eng.store.intake = Intake("manifests")
    with tempfile.TemporaryDirectory() as tmp, refusals_logged() as lines:
        Path(tmp, "example.yaml").write_text(json.dumps(obj))
        Path(tmp, "others.yaml").write_text("\n---\n".join(map(json.dumps, others)))
        ManifestSource(Path(tmp), eng.submit, use_inotify=False).load_all()
    return eng, lines


def check(kind: str, obj: Obj) -> None:
    stored = stored_by_the_model(kind, obj)
    eng, lines = through_manifests(kind, obj)
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    held = {"Service": eng.store.services, "EndpointSlice": eng.store.slices}.get(kind)
    if kind == "Node":
        is_served = isinstance(name, str) and name in eng.store.nodes
    else:
        is_served = held is not None and ("shop", name) in held
    mine = [line for line in lines if "example.yaml" in line]
    assert is_served == stored, (stored, lines)
    assert bool(mine) == (not stored), lines
    assert len(lines) == len(mine), f"only the example is refused: {lines}"
    view = eng.changelog.view("node-a").records
    assert set(view[API].endpoints) == {"10.244.2.1"}, "the other objects are served"
    if kind == "EndpointSlice" and stored:
        assert set(view[WEB].endpoints) == expected_endpoints(obj)


COMMON = settings(max_examples=100, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(st.lists(SLICE_MUTATIONS, min_size=1, max_size=3))
@example([at("ports.0.port", None)])  # a port with no number: stored, no endpoint served
def test_slices_the_model_stores_are_served_and_those_it_refuses_refused_alone(
        mutations: list[Mutation]) -> None:
    obj = endpoint_slice()
    for mutation in mutations:
        mutation(obj)
    check("EndpointSlice", obj)


# One example per cross-field rule of ValidateService (and the allocator's family
# policy), refused by the model, and what each rule allows, stored: checked at every
# run, whatever hypothesis draws.
CROSS_FIELD = [
    [_compose(at("spec.externalIPs", ["192.0.2.7"]), at("spec.externalTrafficPolicy", "Local"))],
    [_compose(at("spec.type", "LoadBalancer"), at("spec.externalTrafficPolicy", "Local"),
              at("spec.healthCheckNodePort", 30100),
              at("spec.loadBalancerSourceRanges", ["10.0.0.0/8"]))],
    [_compose(at("spec.type", "ExternalName"), at("spec.externalName", "db.example.com"),
              at("spec.clusterIP", None), at("spec.clusterIPs", None))],
    [at("spec.externalTrafficPolicy", "Cluster")],  # a ClusterIP without externalIPs
    [at("spec.healthCheckNodePort", 30100)],  # not LoadBalancer + Local
    [at("spec.loadBalancerSourceRanges", ["10.0.0.0/8"])],  # not LoadBalancer
    [at("spec.clusterIP", None)],  # clusterIPs without clusterIP
    [_compose(at("spec.clusterIPs", ["10.96.0.10", "fd00:10:96::a"]),
              at("spec.ipFamilyPolicy", "SingleStack"))],
    [_compose(at("spec.type", "ExternalName"), at("spec.externalName", "db.example.com"))],
    [at("metadata.annotations", {"service.kubernetes.io/topology-mode": "Auto",
                                 "service.kubernetes.io/topology-aware-hints": "auto"})],
    # issue 27's looser-than-Kubernetes values, refused by both
    [_compose(at("spec.type", "LoadBalancer"),
              at("spec.loadBalancerSourceRanges", ["10.0.0.0/8,192.168.0.0/16"]))],
    [at("spec.ipFamilyPolicy", "")],
    [at("spec.internalTrafficPolicy", "")],
    [at("spec.trafficDistribution", "")],
    [_compose(at("spec.type", "LoadBalancer"),
              at("status.loadBalancer.ingress", [{"hostname": "lb.example.com",
                                                  "ipMode": "VIP"}]))],
    [at("metadata.annotations", {SOURCE_RANGES: "10.0.0.0/8"})],  # not LoadBalancer
    [at("spec.sessionAffinityConfig", {"clientIP": {"timeoutSeconds": 60}})],
    # and what is stored: the bounds of what is allowed among them
    [_compose(at("spec.sessionAffinity", "ClientIP"),
              at("spec.sessionAffinityConfig", {"clientIP": {"timeoutSeconds": 86400}}))],
    [_compose(at("spec.sessionAffinity", "ClientIP"),
              at("spec.sessionAffinityConfig", {"clientIP": {"timeoutSeconds": 1}}))],
    [_compose(at("spec.type", "LoadBalancer"),
              at("metadata.annotations", {SOURCE_RANGES: "10.0.0.0/8, 192.168.0.0/16"}))],
    [_compose(at("spec.type", "LoadBalancer"),
              at("status.loadBalancer.ingress", [{"ip": "192.0.2.7"},
                                                 {"hostname": "lb.example.com"}]))],
]


def _with_examples(cases: list[list[Mutation]]) -> Callable[[Any], Any]:
    def wrap(test: Any) -> Any:
        for case in reversed(cases):
            test = example(case)(test)
        return test
    return wrap


@COMMON
@given(st.lists(SERVICE_MUTATIONS, min_size=1, max_size=3))
@_with_examples(CROSS_FIELD)
def test_services_the_model_stores_are_served_and_those_it_refuses_refused_alone(
        mutations: list[Mutation]) -> None:
    obj = service()
    for mutation in mutations:
        mutation(obj)
    check("Service", obj)


@COMMON
@given(st.lists(NODE_MUTATIONS, min_size=1, max_size=3))
@example([at("spec.podCIDRs", [" 10.244.1.0/24"])])  # ValidateCIDR trims nothing
def test_nodes_the_model_stores_are_served_and_those_it_refuses_refused_alone(
        mutations: list[Mutation]) -> None:
    obj = node()
    for mutation in mutations:
        mutation(obj)
    check("Node", obj)


# ---- the same edges through a client's POST, the apiserver source and every reader ----
EDGE_SLICES: list[tuple[str, Mutation, bool]] = [
    ("zone", at("endpoints.0.zone", "zone a"), True),
    ("long-zone", at("endpoints.0.zone", "Zone_A/é" + "z" * 80), True),
    ("odd-port", at("ports", [{"name": "http", "port": 8080, "protocol": "TCP"},
                              {"name": "odd", "port": 0, "protocol": "TCP"}]), True),
    ("mapped", at("endpoints.0.addresses", ["::ffff:10.0.0.4"]), True),
    ("empty-hint", at("endpoints.0.hints", {"forZones": [{"name": ""}]}), True),
    ("null-app", at("ports.0.appProtocol", None), True),
    ("empty-hostname", at("endpoints.0.hostname", ""), False),
    ("empty-protocol", at("ports.0.protocol", ""), False),
]


def test_edge_values_a_client_posts_reach_get_node_state_watch_and_the_sdk(
        frontend_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import kubernetes.client as k8s
    from kubernetes.client.exceptions import ApiException

    from svcproxy.frontend.sources.apiserver import load_api_client
    from svcproxy.sdk.client import NodeStateClient
    from tests.support.churn import SlowWatcher, get_node_state, sdk_state
    from tests.support.fakeapiserver import write_kubeconfig

    api = FakeApiserver(token="t")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, "t")
    rest = load_api_client(str(kubeconfig))  # the official client's ApiClient
    watcher = sdk = None
    try:
        core, discovery = k8s.CoreV1Api(rest), k8s.DiscoveryV1Api(rest)
        core.create_node(node("n1"))
        expected: dict[ServicePortKey, set[str]] = {}
        for i, (label, mutation, accepted) in enumerate(EDGE_SLICES):
            svc = service(f"s{i}", ns="default", ip=f"10.96.1.{i + 1}")
            core.create_namespaced_service("default", svc)
            obj = endpoint_slice(f"s{i}-1", f"s{i}", ns="default", ips=(f"10.0.0.{i + 10}",))
            mutation(obj)
            try:
                discovery.create_namespaced_endpoint_slice("default", obj)
                assert accepted, f"{label}: the model should refuse it"
                expected[ServicePortKey("default", f"s{i}", "http", Protocol.TCP)] = {
                    str(kubemodel.as_v4(kubemodel.parse_ip(obj["endpoints"][0]["addresses"][0])))}
            except ApiException as err:
                assert not accepted and err.status == 422, f"{label}: {err}"
                expected[ServicePortKey("default", f"s{i}", "http", Protocol.TCP)] = set()
        fe = frontend_factory(None, kubeconfig=str(kubeconfig))
        watcher = SlowWatcher(fe.opts.listen, "n1", pause=0)
        sdk = NodeStateClient(fe.opts.listen, "n1", max_backoff=0.2)
        sdk.start()

        def endpoints_of(state: dict[ServicePortKey, Any]) -> dict[ServicePortKey, set[str]]:
            return {k: set(state[k].endpoints) for k in expected if k in state}

        for read in (lambda: fe.records("n1"), lambda: get_node_state(fe.opts.listen, "n1"),
                     watcher.state, lambda: sdk_state(sdk)):
            wait_for(lambda read=read: endpoints_of(read()) == expected, timeout=20)
    finally:
        if watcher is not None:
            watcher.stop()
        if sdk is not None:
            sdk.stop()
        rest.close()
        api.close()


@pytest.fixture(autouse=True, scope="module")
def _close_stand_in() -> Iterator[None]:
    yield
    while _API:
        _API.pop().close()
