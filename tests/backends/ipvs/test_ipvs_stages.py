"""The ipvs backend's stages (render, diff, apply) on the SDK's StagedBackend.

The applied state is the SDK's (``backend.applied``: one PortPlan per service port); a
change renders and sends only its service port; a full sync, a new node context or a
failed apply rebuilds from what the kernel holds. The kernel is the in-memory stand-in
of tests/support/ipvs/standin.py (no IPVS here); real packets: tests/backends/ipvs/test_ipvs_vm.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svcproxy.backends.ipvs import genl
from svcproxy.backends.ipvs.backend import IpvsBackend, SyncError
from svcproxy.backends.ipvs.genl import DestId, ServiceId
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.backends.ipvs.render import render_port
from svcproxy.model import LoadBalancerIngress, ServiceType, TrafficPolicy
from svcproxy.sdk import Applied, Changes, NodeConfig, NodeState, ServicePortState, StagedBackend
from svcproxy.sdk import resolve_context as resolve
from tests.support.ipvs.standin import StandInIpvs, StandInRoute, stand_in
from tests.support.ipvs.states import endpoint, node_state, port_state

CONFIG = NodeConfig("node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("10.100.0.1",))


@pytest.fixture
def backend() -> Iterator[IpvsBackend]:
    b = IpvsBackend(CONFIG, IpvsOptions(graceful_termination_timeout=0), families=(4,))
    yield b


def web(i: int, *pods: int, **service: object) -> ServicePortState:
    return port_state(f"web{i}", f"10.96.0.{i}", [endpoint(f"10.244.{p}.2") for p in pods],
                      **service)


def full(state: NodeState, reason: str = "initial") -> Changes:
    return Changes(frozenset(state.services), full=True, reason=reason)


def changed(*records: ServicePortState) -> Changes:
    return Changes(frozenset(r.key for r in records))


def sid(i: int) -> ServiceId:
    return ServiceId("TCP", f"10.96.0.{i}", 80)


def test_the_applied_state_is_the_sdks_one_plan_per_service_port(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(backend, monkeypatch)
    state = node_state([web(1, 1, 2), web(2, 3)])
    backend.sync(state, full(state))
    assert isinstance(backend, StagedBackend) and isinstance(backend.applied, Applied)
    assert backend.ctx is not None
    assert dict(backend.applied) == {k: render_port(r, backend.ctx)
                                     for k, r in state.services.items()}


def test_a_change_renders_and_sends_only_its_service_port(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an agent's node context too (the state's context is None): a change is
    not a rebuild, the kernel is not read back."""
    ipvs, _route, recorded = stand_in(backend, monkeypatch)
    ports = [web(i, 1) for i in range(1, 6)]
    first = node_state(ports)
    backend.sync(first, full(first))
    rendered: list[str] = []
    render = backend.render

    def counted(state: NodeState, record: ServicePortState) -> object:
        rendered.append(record.key.name)
        return render(state, record)

    monkeypatch.setattr(backend, "render", counted)
    dumps, sent, ipset = ipvs.dumps, len(ipvs.sent), len(recorded.ipset)

    moved = web(3, 2)
    backend.sync(node_state([moved if p.key == moved.key else p for p in ports], 2),
                 changed(moved))
    assert rendered == ["web3"]
    assert ipvs.dumps == dumps, "a change does not read the kernel back"
    assert {r.sid for r in ipvs.sent[sent:]} == {sid(3)}
    assert ipvs.dests_of[sid(3)] == {DestId("10.244.2.2", 8080): 1}
    assert recorded.ipset[ipset:] == [
        "add KUBE-LOOP-BACK 10.244.2.2,tcp:8080,10.244.2.2 -exist\n"], "only the new entry"


def test_the_diff_stage_gives_the_changed_plan_with_the_one_it_replaces(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in(backend, monkeypatch)
    a, b = web(1, 1), web(2, 1)
    first = node_state([a, b])
    backend.sync(first, full(first))
    assert not backend.diff(first, Changes(frozenset({a.key, b.key})))
    a2 = web(1, 2)
    delta = backend.diff(node_state([a2], 2), changed(a2, b))
    assert not delta.rebuild
    assert delta.set == {a.key: render_port(a2, backend.ctx)}  # type: ignore[arg-type]
    assert delta.previous == {a.key: backend.applied[a.key]}
    assert delta.removed == {b.key: backend.applied[b.key]}


def test_an_invalid_version_keeps_the_last_valid_plan(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    ipvs, _route, _recorded = stand_in(backend, monkeypatch)
    a = web(1, 1)
    first = node_state([a])
    backend.sync(first, full(first))
    bad = ServicePortState(replace(a.service, port=70000), a.endpoints)
    delta = backend.diff(node_state([bad], 2), changed(bad))
    assert not delta, "the last valid version's plan is what is applied already"
    assert a.key in backend.refusals
    backend.sync(node_state([bad], 3), Changes(frozenset(), full=True, reason="initial"))
    assert set(ipvs.servers) == {sid(1)}, "kept through a rebuild (a reconnect)"


def test_a_resync_repairs_drift_sends_nothing_else_and_an_hourly_one_rebuilds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic resync reads the kernel back and repairs what was changed behind the
    backend's back (within one sync period, as a reconnect does); with nothing changed
    it renders and sends nothing (a change never waits behind a rewrite); once
    ``full_sync_interval`` has passed since the last rebuild it rewrites every ipset and
    the rules."""
    now = [0.0]
    backend = IpvsBackend(CONFIG, IpvsOptions(), families=(4,), clock=lambda: now[0])
    ipvs, route, recorded = stand_in(backend, monkeypatch)
    state = node_state([web(1, 1, 2), web(2, 3)])
    backend.sync(state, full(state))
    del ipvs.servers[sid(2)], ipvs.dests_of[sid(2)]  # changed behind the backend's back
    route.addresses.discard((7, "10.96.0.1"))
    foreign = ServiceId("TCP", "10.96.0.99", 80)
    ipvs.servers[foreign] = genl.ServiceSpec(foreign)
    ipvs.dests_of[foreign] = {}

    now[0] = 10.0
    backend.sync(state, full(state, "periodic"))
    assert set(ipvs.servers) == {sid(1), sid(2)}
    assert ipvs.dests_of[sid(2)] == {DestId("10.244.3.2", 8080): 1}
    assert route.bound() == {"10.96.0.1", "10.96.0.2"}

    sent, ipset, rules = len(ipvs.sent), len(recorded.ipset), len(recorded.iptables)
    now[0] = 3609.0
    backend.sync(state, full(state, "periodic"))
    assert (len(ipvs.sent), len(recorded.ipset), len(recorded.iptables)) == (sent, ipset, rules)

    now[0] = 3610.0
    backend.sync(state, full(state, "periodic"))
    assert "swap" in recorded.ipset[ipset], "every ipset rewritten"
    assert len(recorded.iptables) > rules, "the rules rewritten"

    del ipvs.servers[sid(1)], ipvs.dests_of[sid(1)]
    backend.sync(state, full(state, "initial"))  # a reconnect: full, not periodic
    assert set(ipvs.servers) == {sid(1), sid(2)}


def test_after_a_failed_apply_the_next_sync_rebuilds(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    ipvs, route, _recorded = stand_in(backend, monkeypatch)
    a, b = web(1, 1), web(2, 1)
    first = node_state([a])
    backend.sync(first, full(first))
    route.fail = True  # binding b's address fails: nobody's failure, the sync fails
    second = node_state([a, b], 2)
    with pytest.raises(SyncError):
        backend.sync(second, changed(b))
    assert not backend.applied.known
    route.fail = False
    dumps = ipvs.dumps
    a2 = web(1, 2)
    third = node_state([a2, b], 3)
    backend.sync(third, changed(a2))
    assert ipvs.dumps == dumps + 1, "the kernel is read back"
    assert set(backend.applied) == {a.key, b.key}
    assert ipvs.dests_of[sid(1)] == {DestId("10.244.2.2", 8080): 1}
    assert route.bound() == {"10.96.0.1", "10.96.0.2"}


def test_a_new_node_context_moves_the_node_ports(
        backend: IpvsBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    ipvs, _route, _recorded = stand_in(
        backend, monkeypatch, node_addresses=[(1, "10.100.0.1"), (2, "10.100.0.9")])
    np = web(1, 1, type=ServiceType.NODE_PORT, node_port=30001)
    here = replace(CONFIG, node_port_addresses=("10.100.0.1/32",))
    first = NodeState("node1", 1, None, {np.key: np}, resolve(here, None, ["10.100.0.1"]))
    backend.sync(first, full(first))
    assert ServiceId("TCP", "10.100.0.1", 30001) in ipvs.servers
    there = replace(CONFIG, node_port_addresses=("10.100.0.9/32",))
    moved = replace(first, revision=2, context=resolve(there, None, ["10.100.0.9"]))
    backend.sync(moved, Changes())
    node_ports = {s.address for s in ipvs.servers if s.port == 30001}
    assert node_ports == {"10.100.0.9"}


POOL = [
    web(1, 1), web(1, 1, 2), web(1),
    web(2, 2, 3, external_ips=("203.0.113.2",),
        external_traffic_policy=TrafficPolicy.LOCAL),
    web(2, 3, type=ServiceType.NODE_PORT, node_port=30002),
    web(3, 1, type=ServiceType.LOAD_BALANCER, node_port=30003,
        load_balancer_ingress=(LoadBalancerIngress("198.51.100.3"),),
        external_traffic_policy=TrafficPolicy.LOCAL),
    web(3, 2),
    web(4, 1, 2, 3, external_ips=("10.96.0.1",)),  # an address another service has
]
KEYS = sorted({p.key for p in POOL})


def programmed(ipvs: StandInIpvs, route: StandInRoute) -> tuple[object, ...]:
    """What the kernel serves: virtual servers with their live real servers (firewall-mark
    ones by their real servers: marks are allocated in order), bound addresses."""
    live = {s: frozenset(d for d, w in ipvs.dests_of[s].items() if w)
            for s in ipvs.servers}
    plain = {s: d for s, d in live.items() if not s.is_fwmark}
    marked = sorted(sorted(d) for s, d in live.items() if s.is_fwmark)
    return plain, marked, route.bound(), route.routes


def entries(backend: IpvsBackend) -> set[tuple[str, str]]:
    """The ipset entries the backend wrote, the firewall marks left out."""
    return {(name, e.split(" skbmark ")[0]) for name, e in backend.kernel.entries}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(-len(KEYS), len(POOL) - 1), min_size=1,
                                   max_size=4), st.booleans()), min_size=1, max_size=6))
def test_changes_one_by_one_end_where_a_rebuild_does(
        monkeypatch: pytest.MonkeyPatch, steps: list[tuple[list[int], bool]]) -> None:
    """Any sequence of changes (a service port set to another version, or removed: a
    negative index), each sent as a change or left to a periodic resync, programs what
    one rebuild from the last state programs."""
    backend = IpvsBackend(CONFIG, IpvsOptions(graceful_termination_timeout=0), families=(4,))
    ipvs, route, _ = stand_in(backend, monkeypatch)
    current: dict[object, ServicePortState] = {}
    state = node_state([])
    backend.sync(state, full(state))
    for revision, (step, periodic) in enumerate(steps, 2):
        keys = set()
        for index in step:
            if index < 0:
                gone = KEYS[-index - 1]
                current.pop(gone, None)
                keys.add(gone)
            else:
                current[POOL[index].key] = POOL[index]
                keys.add(POOL[index].key)
        state = node_state(current.values(), revision)
        backend.sync(state, full(state, "periodic") if periodic
                     else Changes(frozenset(keys)))  # type: ignore[arg-type]
    fresh = IpvsBackend(CONFIG, IpvsOptions(), families=(4,))
    fresh_ipvs, fresh_route, _ = stand_in(fresh, monkeypatch)
    fresh.sync(state, full(state))
    assert programmed(ipvs, route) == programmed(fresh_ipvs, fresh_route)
    assert entries(backend) == entries(fresh)
    marks = {int(e.split(" skbmark ")[1], 16) for _, e in backend.kernel.entries
             if " skbmark " in e}
    assert marks == {s.port for s in ipvs.servers if s.is_fwmark}
    assert dict(backend.applied) == dict(fresh.applied)


def test_the_families_and_the_iptables_are_the_node_contexts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend programs the families the node context has, with the iptables it
    names (the one the agent found on the node), and writes no sysctl itself."""
    from svcproxy.backends.ipvs import apply
    from svcproxy.sdk import ProxyMode

    backend = IpvsBackend(CONFIG, IpvsOptions())
    _ipvs, _route, recorded = stand_in(backend, monkeypatch)
    invoked: list[tuple[int, str]] = []
    monkeypatch.setattr(apply, "iptables_restore",
                        lambda family, text, mode="": invoked.append((family, mode)))
    state = replace(node_state([web(1, 1)]), context=resolve(
        CONFIG, None, mode=backend.proxy_mode, ip_families=(4,), iptables="legacy"))
    backend.sync(state, full(state))
    assert backend.families == (4,) and invoked == [(4, "legacy")]
    assert "inet6" not in recorded.ipset[-1], "no IPv6 ipsets on a node without IPv6"
    assert backend.proxy_mode == ProxyMode("ipvs")
    dual = replace(state, revision=2, context=resolve(CONFIG, None, mode=backend.proxy_mode))
    invoked.clear()
    backend.sync(dual, full(dual))
    assert backend.families == (4, 6) and invoked == [(4, "nft"), (6, "nft")]
    assert "inet6" in recorded.ipset[-1]
