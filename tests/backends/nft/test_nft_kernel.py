"""The nft backend against the real kernel, in a network namespace per test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from svcproxy.backends.nft import names
from svcproxy.backends.nft.apply import NftError, NftRunner
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.backends.nft.libnft import LibNftRunner
from svcproxy.model import Protocol, SessionAffinity
from svcproxy.sdk import Changes, NodeState, resolve_context
from tests.support.lab.netns import call_in, ns_exec
from tests.support.netns.harness import netns_or_skip, scratch_netns
from tests.support.nft_fixtures import (
    CONFIG,
    endpoint,
    key,
    lb_service,
    node_state,
    service,
    state_of,
)

pytestmark = pytest.mark.netns


@pytest.fixture
def netns() -> Iterator[str]:
    with netns_or_skip("spnft") as name:
        yield name


def nft(ns: str, *args: str) -> str:
    return ns_exec(ns, "nft", *args)


def backend(ns: str) -> NftBackend:
    return NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", ns)))


def everything(state: NodeState) -> Changes:
    return Changes(frozenset(state.services), full=True, reason="initial")


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "handle"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def kernel_content(ns: str) -> dict[str, Any]:
    """Our tables as comparable data: rules per chain in order, elements as sets."""
    out: dict[str, Any] = {}
    for item in json.loads(nft(ns, "-j", "list", "ruleset"))["nftables"]:
        kind, body = next(iter(item.items()))
        if kind == "metainfo" or body.get("table") not in (None, names.TABLE):
            continue
        body = _strip(body)
        if kind == "rule":
            out.setdefault(("rules", body["family"], body["chain"]), []).append(body["expr"])
        elif kind in ("set", "map"):
            elems = body.pop("elem", [])
            out[(kind, body["family"], body["name"])] = (
                json.dumps(body, sort_keys=True), sorted(json.dumps(e) for e in elems))
        else:
            out[(kind, body.get("family"), body.get("name"))] = json.dumps(body, sort_keys=True)
    return out


def affinity_clients(ns: str) -> dict[tuple[str, str], dict[str, int]]:
    """(family, affinity set) -> client address -> seconds left, of our tables."""
    found = {}
    for family in ("ip", "ip6"):
        for item in json.loads(nft(ns, "-j", "list", "table", family, names.TABLE))["nftables"]:
            body = item.get("set")
            if body is not None and body["name"].startswith("affinity-"):
                found[(family, body["name"])] = {e["elem"]["val"]: e["elem"]["expires"]
                                                 for e in body.get("elem", [])}
    return found


def changing_states() -> list[NodeState]:
    """A sequence of states exercising adds, removals, policy and affinity changes."""
    web = state_of(service("web", "10.96.0.1"), endpoint("10.244.1.10"), endpoint("10.244.1.11"))
    lb = state_of(lb_service(), endpoint("10.244.1.12", local=True), endpoint("fd00:244::c"))
    states = [node_state(web, lb)]
    states.append(node_state(state_of(web.service, endpoint("10.244.1.10")), lb))
    sticky = replace(web.service, session_affinity=SessionAffinity.CLIENT_IP)
    states.append(node_state(state_of(sticky, endpoint("10.244.1.10")), lb))
    states.append(node_state(state_of(replace(sticky, session_affinity_timeout=60),
                                      endpoint("10.244.1.13")), lb))
    states.append(node_state(state_of(replace(web.service, has_endpoints=False)), lb))
    states.append(node_state(lb))
    return states


def test_deltas_leave_the_kernel_as_a_full_sync_would(netns: str) -> None:
    with scratch_netns("spnftb") as other:
        incremental = backend(netns)
        states = changing_states()
        incremental.sync(states[0], everything(states[0]))
        for before, after in zip(states, states[1:], strict=False):
            changed = frozenset(before.services) | frozenset(after.services)
            incremental.sync(after, Changes(changed))
            assert incremental.last and incremental.last.mode == "delta"
            fresh = backend(other)
            fresh.sync(after, everything(after))
            assert kernel_content(netns) == kernel_content(other)
            fresh.cleanup()


def test_a_bad_service_is_refused_alone_and_retried_when_it_changes(netns: str) -> None:
    b = backend(netns)
    good = node_state(state_of(service("web", "10.96.0.1"), endpoint("10.244.1.10")))
    b.sync(good, everything(good))
    before = nft(netns, "list", "table", "ip", names.TABLE)
    bad = node_state(state_of(service("web", "10.96.0.1"), endpoint("10.244.1.10")),
                     state_of(service("bad", "10.96.0.2"), endpoint("10.244.1.300")))
    b.sync(bad, Changes(frozenset({key("bad")})))
    assert nft(netns, "list", "table", "ip", names.TABLE) == before
    assert "10.244.1.300" in b.refusals[key("bad")].error
    b.sync(bad, everything(bad))
    assert "10.96.0.2" not in nft(netns, "list", "table", "ip", names.TABLE)
    fixed = node_state(state_of(service("web", "10.96.0.1"), endpoint("10.244.1.10")),
                       state_of(service("bad", "10.96.0.2"), endpoint("10.244.1.30")))
    b.sync(fixed, Changes(frozenset({key("bad")})))
    assert not b.refusals
    assert "10.96.0.2" in nft(netns, "list", "table", "ip", names.TABLE)


def test_node_ports_on_every_local_address_load(netns: str) -> None:
    """A node context with NodePorts on every address (an agent whose backend asks for
    kube-proxy's "all", as ebpf composed with nft does, or --nodeport-addresses 0.0.0.0/0)
    loads in both families and matches NodePorts with fib (nft once refused the tables:
    a duplicated comment in the nodeport-ips set)."""
    svc = state_of(lb_service(), endpoint("10.244.1.10"), endpoint("fd00:244::a"))
    plain = node_state(svc)
    state = replace(plain, context=resolve_context(CONFIG, plain.node, node_port_default="all"))
    b = backend(netns)
    b.sync(state, everything(state))
    assert not b.refusals
    for ipx, loopback in (("ip", "127.0.0.0/8"), ("ip6", "::1")):
        chain = nft(netns, "list", "chain", ipx, names.TABLE, "services")
        assert f"fib daddr type local {ipx} daddr != {loopback}" in chain
        assert "unused" in nft(netns, "list", "set", ipx, names.TABLE, "nodeport-ips")


def test_cleanup_deletes_only_our_tables(netns: str) -> None:
    nft(netns, "add", "table", "inet", "keepme")
    b = backend(netns)
    state = node_state(state_of(lb_service(), endpoint("10.244.1.10"), endpoint("fd00:244::a")))
    b.sync(state, everything(state))
    assert f"table ip6 {names.TABLE}" in nft(netns, "list", "tables")
    b.cleanup()
    assert nft(netns, "list", "tables").split("\n") == ["table inet keepme", ""]
    b.cleanup()


def test_same_port_on_tcp_udp_and_sctp_loads(netns: str) -> None:
    records = [state_of(service("dns", key=key("dns", p.value.lower(), p)), endpoint("10.244.1.10"))
               for p in Protocol]
    b = backend(netns)
    b.sync(node_state(*records), everything(node_state(*records)))
    listing = nft(netns, "list", "map", "ip", names.TABLE, "service-ips")
    for proto in ("tcp", "udp", "sctp"):
        assert f"10.96.0.10 . {proto} . 80" in listing


class Counting(NftRunner):
    """An NftRunner that counts the transactions it applies."""

    applied: int = 0

    def apply(self, text: str) -> None:
        object.__setattr__(self, "applied", self.applied + 1)
        super().apply(text)


def test_periodic_resync_with_nothing_changed_writes_nothing(netns: str) -> None:
    """A resync is a diff against what was applied: no transaction when nothing changed
    (so a change behind it never waits for a rewrite), affinity state kept; a change
    that comes with it is applied as a delta of that service port alone."""
    svc = service("web", session_affinity=SessionAffinity.CLIENT_IP)
    plain = state_of(service("db", "10.96.0.11"), endpoint("10.244.1.11"), endpoint("fd00::b"))
    state = node_state(state_of(svc, endpoint("10.244.1.10")), plain)
    runner = Counting(("ip", "netns", "exec", netns))
    b = NftBackend(CONFIG, runner)
    b.sync(state, everything(state))
    full = kernel_content(netns)
    aff = names.affinity_set(names.service_base(svc.key), "10.244.1.10", 8080, 10800)
    nft(netns, "add", "element", "ip", names.TABLE, aff, "{ 192.168.50.100 }")
    before = runner.applied
    b.sync(state, Changes(frozenset(state.services), full=True, reason="periodic"))
    assert runner.applied == before
    assert "192.168.50.100" in nft(netns, "list", "set", "ip", names.TABLE, aff)
    moved = state_of(plain.service, endpoint("10.244.1.12"), endpoint("fd00::b"))
    changed = replace(state, services={**state.services, moved.key: moved}, revision=2)
    b.sync(changed, Changes(frozenset(changed.services), full=True, reason="periodic"))
    assert runner.applied == before + 1 and b.last and b.last.mode == "delta"
    assert b.last.services == 1
    nft(netns, "flush", "set", "ip", names.TABLE, aff)
    with scratch_netns("spnftf") as fresh:
        backend(fresh).sync(changed, everything(changed))
        assert kernel_content(netns) == kernel_content(fresh)
    assert kernel_content(netns) != full


def test_a_resync_repairs_a_flushed_map_and_the_hourly_one_rewrites_everything(
        netns: str) -> None:
    """The first periodic resync puts back a map someone flushed (the drift check, issue
    27: before, it stayed flushed for an hour), writing only that service port's objects;
    once ``full_sync_interval`` has passed the resync rewrites the tables whole."""
    now = [0.0]
    state = node_state(state_of(service("web"), endpoint("10.244.1.10")))
    b = backend(netns)
    b.clock = lambda: now[0]
    b.sync(state, everything(state))
    full = kernel_content(netns)
    periodic = Changes(frozenset(state.services), full=True, reason="periodic")
    nft(netns, "flush", "map", "ip", names.TABLE, "service-ips")
    now[0] = b.full_sync_interval - 1
    b.sync(state, periodic)
    assert kernel_content(netns) == full and b.last and b.last.mode == "repair"
    now[0] = b.full_sync_interval
    b.sync(state, periodic)
    assert kernel_content(netns) == full and b.last and b.last.mode == "replace"


@pytest.mark.parametrize("reason", ["periodic", "changes", "restart"])
def test_a_rebuild_keeps_the_session_affinity_clients(netns: str, reason: str) -> None:
    """A rebuild replaces the tables, but the clients an affinity set learnt from packets
    stay, with the time they had left (kube-proxy's nftables mode keeps them through
    its full syncs): the hourly resync, a reconnect's full sync, a restarted backend."""
    now = [0.0]
    svc = replace(service("web", session_affinity=SessionAffinity.CLIENT_IP,
                          session_affinity_timeout=600), cluster_ips=("10.96.0.10", "fd00:96::10"))
    gone = service("old", "10.96.0.12", session_affinity=SessionAffinity.CLIENT_IP)
    state = node_state(state_of(svc, endpoint("10.244.1.10"), endpoint("fd00::a")),
                       state_of(gone, endpoint("10.244.1.12")))
    b = backend(netns)
    b.clock = lambda: now[0]
    b.sync(state, everything(state))
    base = names.service_base(svc.key)
    aff4 = names.affinity_set(base, "10.244.1.10", 8080, 600)
    aff6 = names.affinity_set(base, "fd00::a", 8080, 600)
    old = names.affinity_set(names.service_base(gone.key), "10.244.1.12", 8080, 10800)
    nft(netns, "add", "element", "ip", names.TABLE, aff4,
        "{ 192.168.50.100 expires 300s, 192.168.50.101 }")
    nft(netns, "add", "element", "ip6", names.TABLE, aff6, "{ fd00:50::100 }")
    nft(netns, "add", "element", "ip", names.TABLE, old, "{ 192.168.50.102 }")
    kept = state_of(svc, endpoint("10.244.1.10"), endpoint("fd00::a"))
    after = node_state(kept, revision=2)
    if reason == "periodic":
        now[0] = b.full_sync_interval
        b.sync(after, Changes(frozenset(after.services), full=True, reason="periodic"))
    elif reason == "changes":
        b.sync(after, Changes(frozenset(after.services), full=True, reason="changes"))
    else:
        b = backend(netns)
        b.sync(after, everything(after))
    assert b.last and b.last.mode == "replace"
    sets = affinity_clients(netns)
    assert set(sets[("ip", aff4)]) == {"192.168.50.100", "192.168.50.101"}
    assert sets[("ip", aff4)]["192.168.50.100"] <= 300, "with the time it had left"
    assert 300 < sets[("ip", aff4)]["192.168.50.101"] <= 600
    assert set(sets[("ip6", aff6)]) == {"fd00:50::100"}
    assert ("ip", old) not in sets, "a service port gone takes its set along"


def test_libnftables_runner_matches_nft_f(netns: str) -> None:
    """The in-process runner (small updates) and nft -f (large ones) program the same."""
    states = changing_states()

    def run_all() -> None:
        b = NftBackend(CONFIG, LibNftRunner())
        b.sync(states[0], everything(states[0]))
        for state in states[1:]:
            b.sync(state, Changes(frozenset(states[0].services) | frozenset(state.services)))
        with pytest.raises(NftError):
            b.runner.apply("add element ip svcproxy nosuchmap { 1.2.3.4 }\n")

    call_in(netns, run_all)
    with scratch_netns("spnftc") as other:
        backend(other).sync(states[-1], everything(states[-1]))
        assert kernel_content(netns) == kernel_content(other)
