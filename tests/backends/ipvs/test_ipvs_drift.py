"""The ipvs backend's drift check on a host without IPVS: the pure comparison of what
the kernel holds with what was applied, and the repair it drives on the in-memory
kernel of tests/support/ipvs/standin.py (the real kernel:
tests/backends/ipvs/test_ipvs_guest.py)."""

from __future__ import annotations

import pytest

from svcproxy.backends.ipvs import genl
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.desired import Desired, TouchedObjects
from svcproxy.backends.ipvs.diff import Kernel
from svcproxy.backends.ipvs.drift import (
    ObjectDrift,
    compare,
    in_our_spelling,
    normalize_entry,
    owners,
    parse_ipset_save,
)
from svcproxy.backends.ipvs.genl import DestId, ServiceId, ServiceSpec
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.backends.ipvs.render import PortPlan, VirtualServer
from svcproxy.model import Protocol
from svcproxy.sdk import Changes, NodeConfig, NodeState, ServicePortKey, ServicePortState
from tests.support.ipvs.standin import StandInIpvs, StandInRoute, stand_in
from tests.support.ipvs.states import endpoint, node_state, port_state

CONFIG = NodeConfig("node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("10.100.0.1",))
S1, S2 = ServiceId("TCP", "10.96.0.1", 80), ServiceId("TCP", "10.96.0.2", 80)
D1, D2 = DestId("10.244.1.2", 8080), DestId("10.244.2.2", 8080)


def mirror() -> Kernel:
    return Kernel(servers={S1: ServiceSpec(S1), S2: ServiceSpec(S2)},
                  dests={S1: {D1: 1, D2: 0}, S2: {D1: 1}},
                  addresses={"10.96.0.1", "10.96.0.2"},
                  entries={("KUBE-CLUSTER-IP", "10.96.0.1,tcp:80")},
                  draining={(S1, D2): 30.0})


def test_entries_compare_in_one_spelling() -> None:
    assert normalize_entry("FD00:0::1,TCP:80") == "fd00::1,tcp:80"
    assert normalize_entry("1.2.3.4,tcp:80,10.1.2.3/8") == "1.2.3.4,tcp:80,10.0.0.0/8"
    assert normalize_entry("1.2.3.4,tcp:80,10.1.2.3/32") == "1.2.3.4,tcp:80,10.1.2.3"
    assert normalize_entry("1.2.3.4,tcp:80 skbmark 0x10000/0xffffffff") == (
        "1.2.3.4,tcp:80 skbmark 0x10000")
    assert normalize_entry("30080") == "30080"
    saved = ("create KUBE-CLUSTER-IP hash:ip,port family inet\n"
             "add KUBE-CLUSTER-IP 10.96.0.1,tcp:80\ncreate OTHER hash:ip\nadd OTHER 1.1.1.1\n")
    present, entries = parse_ipset_save(saved, ["KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP"])
    assert present == {"KUBE-CLUSTER-IP"}
    assert entries == {("KUBE-CLUSTER-IP", "10.96.0.1,tcp:80")}
    ours = [("KUBE-6-CLUSTER-IP", "fd00:0::1,tcp:80")]
    assert in_our_spelling([("KUBE-6-CLUSTER-IP", "fd00::1,tcp:80")], ours) == set(ours)


def test_the_kernel_as_applied_is_no_drift_draining_real_servers_aside() -> None:
    held = mirror()
    held.dests = {S1: {D1: 1}, S2: {D1: 1}}  # the draining one is gone: ours to delete
    assert not compare(mirror(), held)


def test_lost_and_altered_objects_and_foreign_ones() -> None:
    held = mirror()
    other = ServiceId("TCP", "10.96.0.9", 80)
    held.servers = {S1: ServiceSpec(S1, "wlc"), S2: ServiceSpec(S2), other: ServiceSpec(other)}
    held.dests = {S1: {D1: 1, D2: 0}, S2: {D1: 5}}
    held.addresses = {"10.96.0.2", "10.96.0.7"}
    held.entries = set()
    drift = compare(mirror(), held)
    assert drift == ObjectDrift(
        servers=frozenset({S1, S2}), addresses=frozenset({"10.96.0.1"}),
        entries=frozenset({("KUBE-CLUSTER-IP", "10.96.0.1,tcp:80")}),
        foreign=("virtual server TCP/10.96.0.9:80", "address 10.96.0.7"))


def test_drifted_objects_name_the_service_ports_whose_plans_hold_them() -> None:
    keys = [ServicePortKey("default", n, "http", Protocol.TCP) for n in ("a", "b", "c")]
    plans = {
        keys[0]: PortPlan((VirtualServer(ServiceSpec(S1), frozenset({D1})),),
                          addresses=frozenset({"10.96.0.1"})),
        keys[1]: PortPlan((VirtualServer(ServiceSpec(S2), frozenset({D1})),),
                          addresses=frozenset({"10.96.0.2"}),
                          entries=frozenset({("KUBE-CLUSTER-IP", "10.96.0.2,tcp:80")})),
        keys[2]: PortPlan(),
    }
    desired = Desired()
    for key, plan in plans.items():
        desired.replace(key, None, plan, TouchedObjects())
    assert owners(ObjectDrift(servers=frozenset({S1})), plans, desired) == {keys[0]}
    by_entry = ObjectDrift(entries=frozenset({("KUBE-CLUSTER-IP", "10.96.0.2,tcp:80")}))
    assert owners(by_entry, plans, desired) == {keys[1]}
    assert owners(ObjectDrift(addresses=frozenset({"10.96.0.1", "10.96.0.2"})), plans,
                  desired) == set(keys[:2])


def web(i: int, *pods: int) -> ServicePortState:
    return port_state(f"web{i}", f"10.96.0.{i}", [endpoint(f"10.244.{p}.2") for p in pods])


def periodic(state: NodeState) -> Changes:
    return Changes(frozenset(state.services), full=True, reason="periodic")


def _synced(monkeypatch: pytest.MonkeyPatch) -> tuple[IpvsBackend, StandInIpvs, StandInRoute,
                                                      object, NodeState]:
    backend = IpvsBackend(CONFIG, IpvsOptions(), families=(4,))
    ipvs, route, recorded = stand_in(backend, monkeypatch)
    six = port_state("six", "fd00:96::1", [])  # an IPv4 node: no IPv6 sets to hold it
    state = node_state([web(1, 1, 2), web(2, 3), web(3, 1), six])
    backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))
    return backend, ipvs, route, recorded, state


def test_a_periodic_resync_writes_again_only_what_was_changed_behind_its_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend, ipvs, route, recorded, state = _synced(monkeypatch)
    sets = recorded.sets  # type: ignore[attr-defined]
    sent, ipset = len(ipvs.sent), len(recorded.ipset)  # type: ignore[attr-defined]
    backend.sync(state, periodic(state))
    assert (len(ipvs.sent), len(recorded.ipset)) == (sent, ipset), (  # type: ignore[attr-defined]
        "nothing changed: nothing written")

    del ipvs.dests_of[ServiceId("TCP", "10.96.0.1", 80)][DestId("10.244.2.2", 8080)]
    del ipvs.servers[ServiceId("TCP", "10.96.0.2", 80)]
    del ipvs.dests_of[ServiceId("TCP", "10.96.0.2", 80)]
    route.addresses.discard((7, "10.96.0.3"))
    sets.sets["KUBE-CLUSTER-IP"].discard("10.96.0.3,tcp:80")
    backend.sync(state, periodic(state))

    assert [r.what for r in ipvs.sent[sent:]] == [
        "add real server 10.244.2.2:8080 to TCP/10.96.0.1:80",
        "add virtual server TCP/10.96.0.2:80",
        "add real server 10.244.3.2:8080 to TCP/10.96.0.2:80"]
    assert ipvs.dests_of[ServiceId("TCP", "10.96.0.2", 80)] == {DestId("10.244.3.2", 8080): 1}
    assert route.bound() == {"10.96.0.1", "10.96.0.2", "10.96.0.3", "fd00:96::1"}
    assert recorded.ipset[ipset:] == [  # type: ignore[attr-defined]
        "add KUBE-CLUSTER-IP 10.96.0.3,tcp:80 -exist\n"], "only the lost entry"


def test_objects_nobody_applied_and_a_lost_ipset_are_removed_by_a_rebuild(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend, ipvs, route, recorded, state = _synced(monkeypatch)
    foreign = ServiceId("TCP", "10.96.0.99", 80)
    ipvs.servers[foreign] = genl.ServiceSpec(foreign)
    ipvs.dests_of[foreign] = {}
    backend.sync(state, periodic(state))
    assert foreign not in ipvs.servers
    del recorded.sets.sets["KUBE-LOOP-BACK"]  # type: ignore[attr-defined]
    backend.sync(state, periodic(state))
    assert "KUBE-LOOP-BACK" in recorded.sets.sets  # type: ignore[attr-defined]


def test_our_chains_changed_behind_the_backend_rewrite_the_rules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from svcproxy.backends.ipvs import apply

    saved = {"nat": ":KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set "
                    "KUBE-CLUSTER-IP dst,dst -j ACCEPT\n-A OTHER -j ACCEPT\n"}
    backend, _ipvs, _route, recorded, state = _synced(monkeypatch)
    monkeypatch.setattr(apply, "iptables_save", lambda family, table, mode="": saved.get(
        table, ""))
    backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))  # seen
    rules = len(recorded.iptables)  # type: ignore[attr-defined]
    saved["nat"] += "-A OTHER -j DROP\n"  # not ours: no drift
    backend.sync(state, periodic(state))
    assert len(recorded.iptables) == rules  # type: ignore[attr-defined]
    saved["nat"] = saved["nat"].replace("-A KUBE-SERVICES -m set", "-A KUBE-SERVICES -m nope")
    backend.sync(state, periodic(state))
    assert len(recorded.iptables) > rules, "the rules rewritten"  # type: ignore[attr-defined]
