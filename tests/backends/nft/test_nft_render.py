"""The nft backend's renderer and delta planner, without a kernel."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.backends.nft import names
from svcproxy.backends.nft.context import family_context, from_node_context
from svcproxy.backends.nft.render import ServiceObjects, render_service
from svcproxy.backends.nft.render_skeleton import lb_declarations, render_skeleton
from svcproxy.backends.nft.render_table import build_table, commit, full_text, plan_delta
from svcproxy.model import (
    NodeInfo,
    Protocol,
    ServicePortKey,
    SessionAffinity,
    TrafficPolicy,
)
from svcproxy.sdk import resolve_context
from tests.support.nft_fixtures import CONFIG, endpoint, key, lb_service, service, state_of

CTX4 = family_context(CONFIG, None, 4)
CTX6 = family_context(CONFIG, None, 6)


def verdicts(rules: ServiceObjects | None, container: str) -> dict[str, str]:
    assert rules is not None
    return {k: v for c, k, v in rules.elements if c == container}


def test_cluster_ip_dnats_through_the_shared_map_of_its_endpoint_count() -> None:
    record = state_of(service("web"), endpoint("10.244.1.10"), endpoint("10.244.1.11"),
                      endpoint("10.244.2.10", port=9))
    rules = render_service(record, CTX4)
    assert verdicts(rules, "service-ips") == {"10.96.0.10 . tcp . 80": "goto lb-3"}
    assert verdicts(rules, "endpoints-3") == {
        "10.96.0.10 . tcp . 80 . 0": "10.244.1.10 . 8080",
        "10.96.0.10 . tcp . 80 . 1": "10.244.1.11 . 8080",
        "10.96.0.10 . tcp . 80 . 2": "10.244.2.10 . 9",
    }
    assert rules.lb_sizes == {3} and not rules.chains
    assert set(verdicts(rules, "hairpin")) == {
        "10.244.1.10 . 10.244.1.10", "10.244.1.11 . 10.244.1.11", "10.244.2.10 . 10.244.2.10"}


def test_shared_lb_chain_masquerades_off_cluster_sources_and_picks_uniformly() -> None:
    chain = lb_declarations(CTX4, 3)[1]
    assert "ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade" in chain
    assert "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map " \
        "@endpoints-3" in chain


def test_external_traffic_picks_endpoints_with_a_uniform_cascade() -> None:
    svc = replace(lb_service(), load_balancer_source_ranges=())
    record = state_of(svc, endpoint("10.244.1.10"), endpoint("10.244.1.11"),
                      endpoint("10.244.2.10", port=9))
    rules = render_service(record, CTX4)
    policy = names.external_policy_chain(names.service_base(svc.key))
    # P(i) = 1/(n-i) * prod_{j<i} (1 - 1/(n-j)) = 1/n for every endpoint.
    assert rules.chains[policy] == (
        "numgen random mod 3 0 meta l4proto tcp dnat to 10.244.1.10:8080",
        "numgen random mod 2 0 meta l4proto tcp dnat to 10.244.1.11:8080",
        "meta l4proto tcp dnat to 10.244.2.10:9",
    )


def test_no_endpoints_reject_and_local_policy_without_local_endpoints_drops() -> None:
    empty = render_service(state_of(service("web", has_endpoints=False)), CTX4)
    assert verdicts(empty, "no-endpoint-services") == {
        "10.96.0.10 . tcp . 80": "goto reject-chain"}
    assert not verdicts(empty, "service-ips")
    local = service("web", internal_traffic_policy=TrafficPolicy.LOCAL)
    remote_only = render_service(state_of(local, endpoint("10.244.2.10", internal=False)), CTX4)
    assert verdicts(remote_only, "no-endpoint-services") == {"10.96.0.10 . tcp . 80": "drop"}


def test_external_policy_local_short_circuits_pods_and_the_node() -> None:
    svc = replace(lb_service(), external_traffic_policy=TrafficPolicy.LOCAL,
                  load_balancer_source_ranges=())
    record = state_of(svc, endpoint("10.244.1.10", local=True),
                      endpoint("10.244.2.10", external=False))
    rules = render_service(record, CTX4)
    ext_name = names.external_chain(names.service_base(svc.key))
    ext = rules.chains[ext_name]
    assert ext[0].startswith("ip saddr { 10.244.0.0/16 } goto ")
    assert "fib saddr type local jump mark-for-masquerade" in ext
    assert not any(r == "jump mark-for-masquerade" for r in ext), "source IP preserved"
    policy = ext[-1].removeprefix("goto ")
    assert rules.chains[policy] == ("meta l4proto tcp dnat to 10.244.1.10:8080",)
    assert verdicts(rules, "service-nodeports") == {"tcp . 30080": f"goto {ext_name}"}


def test_local_policy_without_local_endpoints_short_circuits_then_drops() -> None:
    """The external chain sends pod and node traffic to the cluster set and drops the
    rest; nothing is dropped before it (kube-proxy's short-circuit)."""
    svc = replace(lb_service(), external_traffic_policy=TrafficPolicy.LOCAL)
    rules = render_service(state_of(svc, endpoint("10.244.2.10", external=False)), CTX4)
    assert not verdicts(rules, "no-endpoint-services")
    assert not verdicts(rules, "no-endpoint-nodeports")
    ext_name = names.external_chain(names.service_base(svc.key))
    ext = rules.chains[ext_name]
    assert ext[-1] == "drop"
    assert "fib saddr type local goto" in ext[-2]
    short = ext[-2].rsplit(" ", 1)[-1]
    assert rules.chains[short] == ("meta l4proto tcp dnat to 10.244.2.10:8080",)
    assert verdicts(rules, "service-nodeports") == {"tcp . 30080": f"goto {ext_name}"}


def test_source_ranges_allow_lb_ips_when_the_node_is_in_range() -> None:
    rules = render_service(state_of(lb_service(), endpoint("10.244.1.10")), CTX4)
    fw = names.firewall_chain(names.service_base(lb_service().key))
    assert rules.chains[fw] == ("ip saddr != { 192.168.50.0/24, 192.168.60.10 } drop",)
    outside = replace(lb_service(), load_balancer_source_ranges=("203.0.113.0/24",))
    rules = render_service(state_of(outside, endpoint("10.244.1.10")), CTX4)
    assert rules.chains[fw] == ("ip saddr != { 203.0.113.0/24 } drop",)


def test_affinity_uses_timed_sets_per_endpoint() -> None:
    svc = service("web", session_affinity=SessionAffinity.CLIENT_IP, session_affinity_timeout=7)
    rules = render_service(state_of(svc, endpoint("10.244.1.10")), CTX4)
    (name, decl), = rules.sets.items()
    assert "timeout 7s" in decl and "flags dynamic,timeout" in decl
    assert any(f"update @{name} {{ ip saddr }}" in r for rs in rules.chains.values() for r in rs)


def test_ipv6_rules_only_for_services_with_an_ipv6_cluster_ip() -> None:
    record = state_of(lb_service(), endpoint("fd00:244:0:1::a"), endpoint("10.244.1.10"))
    rules6 = render_service(record, CTX6)
    dnats = [r for rs in rules6.chains.values() for r in rs if "dnat" in r]
    assert dnats == ["meta l4proto tcp dnat to [fd00:244:0:1::a]:8080"]
    assert render_service(state_of(service("v4only"), endpoint("10.244.1.10")), CTX6) is None


def test_delta_of_one_endpoint_touches_only_that_service() -> None:
    a = state_of(service("a", "10.96.0.1"), endpoint("10.244.1.10"), endpoint("10.244.1.11"))
    b = state_of(service("b", "10.96.0.2"), endpoint("10.244.1.12"), endpoint("10.244.1.13"))
    applied = {r.key: render_service(r, CTX4) for r in (a, b)}
    table = build_table(CTX4, applied)
    swapped = state_of(a.service, endpoint("10.244.1.10"), endpoint("10.244.1.20"))
    delta = plan_delta(table, applied, {a.key: render_service(swapped, CTX4)})
    assert sorted(delta.text.splitlines()) == sorted([
        "delete element ip svcproxy endpoints-2 { 10.96.0.1 . tcp . 80 . 1 }",
        "delete element ip svcproxy hairpin { 10.244.1.11 . 10.244.1.11 }",
        "add element ip svcproxy endpoints-2 { 10.96.0.1 . tcp . 80 . 1 : 10.244.1.20 . 8080 }",
        "add element ip svcproxy hairpin { 10.244.1.20 . 10.244.1.20 }",
    ])
    commit(table, delta)
    applied.update(delta.services)
    assert plan_delta(table, applied, {a.key: render_service(swapped, CTX4)}).empty
    shrunk = plan_delta(table, applied, {
        a.key: render_service(state_of(a.service, endpoint("10.244.1.10")), CTX4)})
    assert "map endpoints-1" in shrunk.text and "chain lb-1" in shrunk.text
    assert "10.96.0.1 . tcp . 80 : goto lb-1" in shrunk.text


def test_shared_cluster_ip_element_stays_while_one_port_remains() -> None:
    http = state_of(service("web", key=key("web", "http")), endpoint("10.244.1.10"))
    dns = state_of(service("web", key=key("web", "dns"), port=53), endpoint("10.244.1.10"))
    applied = {r.key: render_service(r, CTX4) for r in (http, dns)}
    table = build_table(CTX4, applied)
    delta = plan_delta(table, applied, {dns.key: None})
    assert "delete element ip svcproxy cluster-ips" not in delta.text
    commit(table, delta)
    del applied[dns.key]
    last = plan_delta(table, applied, {http.key: None})
    assert "delete element ip svcproxy cluster-ips { 10.96.0.10 }" in last.text


def test_a_full_text_replaces_the_table_with_every_object_and_element() -> None:
    a = state_of(service("a", "10.96.0.1", session_affinity=SessionAffinity.CLIENT_IP),
                 endpoint("10.244.1.10"))
    b = state_of(service("b", "10.96.0.2"), endpoint("10.244.1.12"))
    applied = {r.key: render_service(r, CTX4) for r in (a, b)}
    text = full_text(build_table(CTX4, applied), applied)
    assert text.startswith("add table ip svcproxy\ndelete table ip svcproxy\n")
    assert "map endpoints-1" in text and "chain lb-1" in text
    assert "10.96.0.1 . tcp . 80 : goto" in text and "10.96.0.2 . tcp . 80 : goto lb-1" in text


def test_node_ports_from_the_node_context() -> None:
    """The node context's NodePort addresses, without loopback; a family the CIDRs leave
    open (None) is every local address but loopback, matched with fib."""
    config = replace(CONFIG, node_ips=("192.168.50.2", "10.244.1.1", "fd00:50::2", "fd00::1"))
    assert family_context(config, None, 4).nodeport_ips == ("192.168.50.2",)
    assert family_context(config, None, 6).nodeport_ips == ("fd00:50::2",)
    cidrs = replace(config, node_port_addresses=("127.0.0.0/8", "192.168.50.0/24"))
    assert family_context(cidrs, None, 4).nodeport_ips == ("192.168.50.2",)
    ctx6 = family_context(cidrs, None, 6)
    assert ctx6.nodeport_ips is None
    assert "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap " \
        "@service-nodeports" in render_skeleton(ctx6)
    for ctx in (ctx6, family_context(cidrs, None, 4)):
        nodeport_set = next(ln for ln in render_skeleton(ctx).splitlines() if "nodeport-ips" in ln)
        assert nodeport_set.count("comment") == 1, "nft refuses a second comment"
    node = resolve_context(cidrs, None, ("192.168.50.2", "127.0.0.1"))
    assert from_node_context(node, 4) == family_context(cidrs, None, 4)


def test_local_traffic_detection_modes() -> None:
    prefix = replace(CONFIG, detect_local_mode="InterfaceNamePrefix",
                     pod_interface_name_prefix="veth")
    assert family_context(prefix, None, 4).local_match == 'iifname "veth*"'
    bridge = replace(CONFIG, detect_local_mode="BridgeInterface", pod_bridge_interface="cbr0")
    assert family_context(bridge, None, 4).nonlocal_match == 'iifname != "cbr0"'
    node = NodeInfo("node1", pod_cidrs=("10.244.1.0/24", "fd00:244:0:1::/64"))
    per_node = replace(CONFIG, detect_local_mode="NodeCIDR")
    ctx = family_context(per_node, node, 6)
    assert (ctx.local_match, ctx.nonlocal_match) == (
        "ip6 saddr { fd00:244:0:1::/64 }", "ip6 saddr != { fd00:244:0:1::/64 }")
    assert family_context(replace(CONFIG, cluster_cidrs=()), None, 4).local_match == ""
    two = replace(CONFIG, cluster_cidrs=("10.244.0.0/16", "10.245.0.0/16"))
    assert family_context(two, None, 4).local_match == "ip saddr { 10.244.0.0/16, 10.245.0.0/16 }"


# Hostile parts, and safe ones around Kubernetes' limits (15 and 63 characters).
_NAME_PARTS = st.text(alphabet="az09-._/:é *\U0001f600", max_size=70) | st.sampled_from(
    [14, 15, 16, 62, 63, 64]).map(lambda n: "a-" * (n // 2) + "b" * (n % 2))


@settings(max_examples=400, deadline=None)
@given(_NAME_PARTS, _NAME_PARTS, _NAME_PARTS, st.sampled_from(list(Protocol)))
def test_service_base_is_its_definition(ns: str, name: str, port: str,
                                        proto: Protocol) -> None:
    """The base name's fast path (safe parts kept as they are, base32 by table) gives what
    its definition does: base32 of BLAKE2b-40 over the readable name, each part made safe
    and cut to Kubernetes' limit."""
    readable = f"{ns}/{name}/{proto.value.lower()}/{port}"
    digest = hashlib.blake2b(readable.encode(errors="surrogatepass"), digest_size=5).digest()
    safe = [re.sub(r"[^A-Za-z0-9_.-]", "_", text[:limit])
            for text, limit in ((ns, 63), (name, 63), (port, 15))]
    expected = f"{base64.b32encode(digest).decode()}-{safe[0]}/{safe[1]}/" \
        f"{proto.value.lower()}/{safe[2]}"
    assert names.service_base(ServicePortKey(ns, name, port, proto)) == expected
