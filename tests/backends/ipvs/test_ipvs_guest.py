"""The IPVS backend against a real IPVS kernel, with real connections.

Runs only inside the qemu guest (tests/backends/ipvs/test_ipvs_vm.py starts it there with
SVCPROXY_IPVS_GUEST=1). Each test drives the backend in-process inside a node
namespace it creates; the client connects from its own namespace.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from svcproxy.backends.ipvs import apply, genl
from svcproxy.backends.ipvs import ipsets as S
from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs import rules as R
from svcproxy.backends.ipvs.backend import IpvsBackend
from svcproxy.backends.ipvs.names import SCHEDULER_ANNOTATION
from svcproxy.backends.ipvs.netlink import IpvsNetlink, Request
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.model import ServiceType, SessionAffinity
from svcproxy.sdk import Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.node_context import ContextResolver
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.support.ipvs.lab import CLIENT_IPS, IpvsLab, counts, pod_ip
from tests.support.ipvs.states import changed, endpoint, full, node_state, port_state
from tests.support.lab.netns import enter, ns_exec

pytestmark = [pytest.mark.ipvs, pytest.mark.netns]
IN_GUEST = os.environ.get("SVCPROXY_IPVS_GUEST") == "1"
if not IN_GUEST:
    pytest.skip("runs inside the IPVS guest: tests/backends/ipvs/test_ipvs_vm.py starts it there",
                allow_module_level=True)

CONFIG = NodeConfig(node_name="node1", cluster_cidrs=("10.244.0.0/16",),
                    node_ips=("10.100.0.1",))


@pytest.fixture(scope="module")
def lab() -> Iterator[IpvsLab]:
    built = IpvsLab(pods=3).build()
    try:
        yield built
    finally:
        built.destroy()


class Driver:
    """The backend inside the lab's node namespace, and what the kernel holds there."""

    def __init__(self, lab: IpvsLab, options: IpvsOptions) -> None:
        self.lab = lab
        self.backend = lab.on_node(IpvsBackend, CONFIG, options, (4,))
        # As the agent: the node context resolved in the node's namespace, where the mode's
        # sysctls (IPVS conntrack, forwarding...) are set before the first sync.
        self.context = lab.on_node(ContextResolver.for_backend(CONFIG, self.backend), None)
        self.revision = 0

    def state(self, ports: tuple[object, ...]) -> NodeState:
        self.revision += 1
        return replace(node_state(ports, self.revision),  # type: ignore[arg-type]
                       context=self.context)

    def sync(self, *ports: object, reason: str = "") -> None:
        state = self.state(ports)
        changes = full(reason or ("initial" if self.revision == 1 else "periodic"))
        self.lab.on_node(self.backend.sync, state, changes)

    def partial(self, *ports: object, gone: tuple[object, ...] = ()) -> None:
        state = self.state(ports)
        keys = changed(*ports, *gone)  # type: ignore[arg-type]
        self.lab.on_node(self.backend.sync, state, keys)

    def services(self) -> dict[genl.ServiceId, genl.ServiceSpec]:
        return {s.id: s for s in self.lab.on_node(_dump_services)}

    def dests(self, sid: genl.ServiceId) -> dict[genl.DestId, genl.DestStats]:
        return {d.id: d for d in self.lab.on_node(_dump_dests, sid)}


def _dump_services() -> list[genl.ServiceSpec]:
    sock = IpvsNetlink()
    try:
        return sock.services()
    finally:
        sock.close()


def _dump_dests(sid: genl.ServiceId) -> list[genl.DestStats]:
    sock = IpvsNetlink()
    try:
        return sock.dests(sid)
    finally:
        sock.close()


@pytest.fixture
def make(lab: IpvsLab) -> Iterator[object]:
    made: list[Driver] = []

    def factory(**options: object) -> Driver:
        made.append(Driver(lab, IpvsOptions(**options)))  # type: ignore[arg-type]
        return made[-1]

    try:
        yield factory
    finally:
        for driver in made:
            lab.on_node(driver.backend.cleanup)
            lab.on_node(driver.backend.close)


def pods(*indexes: int) -> list[object]:
    return [endpoint(pod_ip(i)) for i in indexes]


def test_rr_alternates_exactly_over_nat_real_servers(lab: IpvsLab, make) -> None:
    d = make()
    d.sync(port_state("web", "10.96.0.10", pods(1, 2, 3)))
    names = lab.names("10.96.0.10", 80, 9)
    assert sorted(set(names)) == ["pod1", "pod2", "pod3"]
    assert names[:3] * 3 == names, f"rr must repeat one order exactly: {names}"
    sid = genl.ServiceId("TCP", "10.96.0.10", 80)
    assert d.services()[sid].scheduler == "rr"
    assert {x.fwd_method for x in d.dests(sid).values()} == {genl.FWD_MASQ}
    assert "10.96.0.10" in lab.on_node(apply.link_addresses, d.backend.ifindex)


def test_wrr_spreads_in_proportion_to_weights(lab: IpvsLab, make) -> None:
    d = make(scheduler="wrr")
    svc = port_state("web", "10.96.0.11", pods(1, 2, 3))
    d.sync(svc)
    assert counts(lab.names("10.96.0.11", 80, 9)) == {"pod1": 3, "pod2": 3, "pod3": 3}
    held = lab.open("10.96.0.11", 80)
    try:
        drained = held.first
        keep = [i for i in (1, 2, 3) if f"pod{i}" != drained]
        d.partial(port_state("web", "10.96.0.11", pods(*keep)))
        sid = genl.ServiceId("TCP", "10.96.0.11", 80)
        weights = {x.id.address: x.weight for x in d.dests(sid).values()}
        assert weights[pod_ip(int(drained[-1]))] == 0
        seen = counts(lab.names("10.96.0.11", 80, 8))
        assert seen == {f"pod{i}": 4 for i in keep}, "a weight-0 real server gets nothing"
    finally:
        held.close()


def test_sh_annotation_keeps_a_client_on_one_pod(lab: IpvsLab, make) -> None:
    d = make()
    sticky = port_state("sticky", "10.96.0.12", pods(1, 2, 3),
                        annotations=[(SCHEDULER_ANNOTATION, "sh")])
    plain = port_state("plain", "10.96.0.13", pods(1, 2, 3))
    d.sync(sticky, plain)
    for source in CLIENT_IPS:
        assert len(set(lab.names("10.96.0.12", 80, 8, source))) == 1
    assert len(set(lab.names("10.96.0.13", 80, 6))) == 3
    found = d.services()
    assert found[genl.ServiceId("TCP", "10.96.0.12", 80)].scheduler == "sh"
    assert found[genl.ServiceId("TCP", "10.96.0.13", 80)].scheduler == "rr"


def test_client_ip_affinity_is_ipvs_persistence(lab: IpvsLab, make) -> None:
    d = make()
    svc = port_state("aff", "10.96.0.14", pods(1, 2, 3),
                     session_affinity=SessionAffinity.CLIENT_IP)
    d.sync(svc)
    assert len(set(lab.names("10.96.0.14", 80, 8))) == 1
    spec = d.services()[genl.ServiceId("TCP", "10.96.0.14", 80)]
    assert spec.persistence_timeout == 10800


def test_graceful_termination_keeps_established_connections(lab: IpvsLab, make) -> None:
    """A drained real server keeps its established connection for as long as the
    timeout allows (kube-proxy's 600 s here: no machine is that slow), new ones go to
    the other pod."""
    d = make(graceful_termination_timeout=600.0, graceful_check_interval=0.5)
    sid = genl.ServiceId("TCP", "10.96.0.15", 80)
    d.sync(port_state("drain", "10.96.0.15", pods(1, 2)))
    held = lab.open("10.96.0.15", 80)
    try:
        gone = held.first
        stay = "pod2" if gone == "pod1" else "pod1"
        d.partial(port_state("drain", "10.96.0.15", pods(int(stay[-1]))))
        assert d.dests(sid)[genl.DestId(pod_ip(int(gone[-1])), 8080)].weight == 0
        assert set(lab.names("10.96.0.15", 80, 6)) == {stay}
        assert held.ask() == gone, "the established connection still reaches its pod"
        assert genl.DestId(pod_ip(int(gone[-1])), 8080) in d.dests(sid)
    finally:
        held.close()


def test_a_drained_real_server_is_deleted_once_its_timeout_ends(lab: IpvsLab, make) -> None:
    """Past --ipvs-graceful-termination-timeout the drained real server goes, even with
    a connection still open (waited for, at most a minute)."""
    d = make(graceful_termination_timeout=1.0, graceful_check_interval=0.5)
    sid = genl.ServiceId("TCP", "10.96.0.15", 80)
    d.sync(port_state("drain", "10.96.0.15", pods(1, 2)))
    held = lab.open("10.96.0.15", 80)
    try:
        stay = "pod2" if held.first == "pod1" else "pod1"
        d.partial(port_state("drain", "10.96.0.15", pods(int(stay[-1]))))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(d.dests(sid)) > 1:
            time.sleep(0.5)
        assert list(d.dests(sid)) == [genl.DestId(pod_ip(int(stay[-1])), 8080)]
    finally:
        held.close()


def test_no_endpoints_refused_and_unused_port_rejected(lab: IpvsLab, make) -> None:
    d = make()
    d.sync(port_state("empty", "10.96.0.16", []), port_state("web", "10.96.0.17", pods(1)))
    with pytest.raises(ConnectionRefusedError):
        lab.names("10.96.0.16", 80, 1)
    with pytest.raises(ConnectionRefusedError):
        lab.names("10.96.0.17", 81, 1)
    assert lab.names("10.96.0.17", 80, 1) == ["pod1"]


def _add_foreign(address: str) -> None:
    sock = IpvsNetlink()
    try:
        spec = genl.ServiceSpec(genl.ServiceId("TCP", address, 80), "wlc")
        assert not sock.apply([Request("foreign", genl.genl_body(*genl.add_service(spec)))])
    finally:
        sock.close()


def test_exclude_cidrs_are_never_touched(lab: IpvsLab, make) -> None:
    d = make(exclude_cidrs=("192.168.77.0/24",))
    lab.on_node(_add_foreign, "192.168.77.1")
    lab.on_node(_add_foreign, "192.168.88.1")
    d.sync(port_state("web", "10.96.0.18", pods(1)))
    kept = set(d.services())
    assert genl.ServiceId("TCP", "192.168.77.1", 80) in kept
    assert genl.ServiceId("TCP", "192.168.88.1", 80) not in kept
    lab.on_node(d.backend.cleanup)
    assert set(d.services()) == {genl.ServiceId("TCP", "192.168.77.1", 80)}
    assert lab.on_node(apply.link_index, "kube-ipvs0") is None
    assert not set(S.all_set_names()) & lab.on_node(apply.ipset_names)
    assert "KUBE-SERVICES" not in lab.on_node(apply.iptables_save, 4, "nat")
    lab.on_node(_delete_service, genl.ServiceId("TCP", "192.168.77.1", 80))


def _delete_service(sid: genl.ServiceId) -> None:
    sock = IpvsNetlink()
    try:
        sock.apply([Request("del", genl.genl_body(*genl.del_service(sid)))])
    finally:
        sock.close()


def _many(count: int) -> list[object]:
    """``count`` NodePort services with one endpoint each."""
    return [
        port_state(f"s{i}", f"10.97.{i // 250}.{i % 250 + 1}", [endpoint(pod_ip(1 + i % 3))],
                   node_port=30000 + i, type=ServiceType.NODE_PORT)
        for i in range(count)
    ]


def _node_ipv4_addresses(lab: IpvsLab) -> set[str]:
    lines = ns_exec(lab.node, "ip", "-4", "-o", "addr", "show").splitlines()
    return {line.split()[3].split("/")[0] for line in lines
            if line.split()[1] not in ("lo", "kube-ipvs0")}


def _our_rules() -> int:
    chains = sorted(set(N.NAT_CHAINS) | set(N.FILTER_CHAINS) | set(N.MANGLE_CHAINS))
    return sum(R.count_rules(apply.iptables_save(4, t), chains) for t in N.TABLES)


def test_iptables_rule_count_constant_from_10_to_1000_services(lab: IpvsLab, make) -> None:
    d = make()
    d.sync(*_many(10))
    small = lab.on_node(_our_rules)
    assert small > 20
    d.sync(*_many(1000))
    assert lab.on_node(_our_rules) == small
    found = d.services()  # one dump: 5,000 virtual servers take a while in the guest
    nodeports = {sid.address for sid in found if sid.port == 30999}
    assert nodeports == _node_ipv4_addresses(lab), (
        "no --node-port-addresses: NodePorts on every address of the node (kube-ipvs0's and "
        "loopback aside), as kube-proxy")
    assert len(found) == 1000 * (1 + len(nodeports)), "a ClusterIP and the NodePorts"
    assert len(lab.on_node(apply.link_addresses, d.backend.ifindex)) == 1000
    assert "30999" in ns_exec(lab.node, "ipset", "list", "KUBE-NODE-PORT-TCP")
    assert lab.names("10.97.3.250", 80, 1) == [f"pod{1 + 999 % 3}"]
    assert lab.names("10.100.0.1", 30999, 1) == [f"pod{1 + 999 % 3}"]


def test_a_rebuild_with_nothing_changed_sends_nothing_to_ipvs(lab: IpvsLab, make) -> None:
    """A rebuild (here a reconnect's full sync) reads the kernel back (IPv4 and IPv6
    service addresses on kube-ipvs0 included) and finds nothing to change: no IPVS
    request, no address unbound and bound again (it would be missing while the ipsets
    and rules are rewritten); a periodic resync sends nothing either; a change after
    them sends only its own request."""
    d = make()
    web = port_state("web", "10.96.0.19", pods(1, 2))
    six = port_state("six", "fd00:96::19", [])
    d.sync(web, six)
    sent: list[str] = []
    for sock in (d.backend.ipvs, d.backend.route):
        send = sock.apply

        def recording(requests, send=send):  # type: ignore[no-untyped-def]
            sent.extend(r.what for r in requests)
            return send(requests)

        sock.apply = recording
    d.sync(web, six, reason="initial")
    d.sync(web, six, reason="periodic")
    assert sent == []
    assert lab.names("10.96.0.19", 80, 2) != []
    d.partial(port_state("web", "10.96.0.19", pods(1, 2, 3)))
    assert sent == ["add real server 10.244.3.2:8080 to TCP/10.96.0.19:80"]


def _tamper(sid: genl.ServiceId, dest: genl.DestId, gone: genl.ServiceId) -> None:
    """Someone else deletes one real server and one virtual server."""
    sock = IpvsNetlink()
    try:
        assert not sock.apply([
            Request("del dest", genl.genl_body(*genl.del_dest(sid, dest))),
            Request("del service", genl.genl_body(*genl.del_service(gone)))])
    finally:
        sock.close()


def test_drift_is_repaired_by_the_next_periodic_resync(
        lab: IpvsLab, make, monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic resync (what the agent runs every --sync-period) reads the kernel back:
    on a clean kernel (ClusterIP, NodePort, externalTrafficPolicy Local with an external
    IP, a load balancer with source ranges: every ipset kind's spelling) it writes
    nothing; after a real server and a virtual server are deleted behind its back, it
    sends exactly their requests again and connections reach every pod."""
    from svcproxy.model import LoadBalancerIngress, TrafficPolicy

    d = make()
    web = port_state("drift", "10.96.0.20", pods(1, 2))
    gone = port_state("gone", "10.96.0.21", pods(3))
    local = port_state("local", "10.96.0.22", pods(1), node_port=30222, type=ServiceType.NODE_PORT,
                       external_ips=("192.0.2.22",), health_check_node_port=30223,
                       external_traffic_policy=TrafficPolicy.LOCAL)
    lb = port_state("lb", "10.96.0.23", pods(2), type=ServiceType.LOAD_BALANCER,
                    load_balancer_ingress=(LoadBalancerIngress("198.51.100.23"),),
                    load_balancer_source_ranges=("203.0.113.0/24",))
    d.sync(web, gone, local, lb)
    sent: list[str] = []
    for sock in (d.backend.ipvs, d.backend.route):
        send = sock.apply

        def recording(requests, send=send):  # type: ignore[no-untyped-def]
            sent.extend(r.what for r in requests)
            return send(requests)

        sock.apply = recording
    restores: list[str] = []
    restore = apply.ipset_restore
    monkeypatch.setattr(apply, "ipset_restore", lambda text: (text and restores.append(text),
                                                               restore(text)))
    d.sync(web, gone, local, lb, reason="periodic")
    assert (sent, restores) == ([], []), "a clean kernel is no drift"

    sid = genl.ServiceId("TCP", "10.96.0.20", 80)
    lost = genl.DestId(pod_ip(2), 8080)
    lab.on_node(_tamper, sid, lost, genl.ServiceId("TCP", "10.96.0.21", 80))
    assert set(lab.names("10.96.0.20", 80, 4)) == {"pod1"}
    with pytest.raises(ConnectionRefusedError):
        lab.names("10.96.0.21", 80, 1)

    d.sync(web, gone, local, lb, reason="periodic")
    assert sorted(sent) == sorted([
        f"add real server {lost} to TCP/10.96.0.20:80",
        "add virtual server TCP/10.96.0.21:80",
        f"add real server {genl.DestId(pod_ip(3), 8080)} to TCP/10.96.0.21:80"])
    assert restores == []
    assert sorted(set(lab.names("10.96.0.20", 80, 4))) == ["pod1", "pod2"]
    assert lab.names("10.96.0.21", 80, 1) == ["pod3"]


RUNNER_PERIOD = 2.0  # seconds: --sync-period of the runner test (a resync of 2 services
# takes well under a second in the guest)
RUNNER_WAIT = 300.0  # at most this for the syncs waited for (the emulated guest, loaded)


class Watched(IpvsBackend):
    """The ipvs backend, counting the syncs it finished by reason; ``paused`` (held by
    the test) keeps any sync from running while it breaks something."""

    def __init__(self) -> None:
        super().__init__(CONFIG, IpvsOptions(), (4,))
        self.done: dict[str, int] = {}
        self.changed = threading.Condition()
        self.paused = threading.Lock()

    def sync(self, state: NodeState, changes: Changes) -> None:
        try:
            with self.paused:
                super().sync(state, changes)
        finally:
            with self.changed:
                for reason in (changes.reason, "any"):
                    self.done[reason] = self.done.get(reason, 0) + 1
                self.changed.notify_all()

    def wait(self, reason: str, more: int) -> None:
        """Until ``more`` syncs of ``reason`` finished from now (at most RUNNER_WAIT)."""
        with self.changed:
            target = self.done.get(reason, 0) + more
            assert self.changed.wait_for(lambda: self.done.get(reason, 0) >= target,
                                         RUNNER_WAIT), f"no {reason} sync in {RUNNER_WAIT}s"


def _in_namespace(ns: str, run: Callable[[], None]) -> Callable[[], None]:
    def entered() -> None:
        enter(ns)
        run()
    return entered


def _held() -> tuple[dict[genl.ServiceId, list[tuple[genl.DestId, int]]], list[str]]:
    """Every virtual server with its real servers (weights), and our ipsets' entries."""
    sock = IpvsNetlink()
    try:
        servers = {s.id: sorted((d.id, d.weight) for d in sock.dests(s.id))
                   for s in sock.services()}
    finally:
        sock.close()
    ours = set(S.all_set_names((4,)))
    entries = sorted(line for line in apply.ipset_save().splitlines()
                     if line.startswith("add ") and line.split()[1] in ours)
    return servers, entries


def test_drift_is_repaired_within_one_period_under_the_sync_runner(lab: IpvsLab) -> None:
    """The backend under the node agent's sync runner (``--sync-period`` 2 s): a real
    server, a virtual server and an ipset entry deleted out of band (the service whose
    KUBE-CLUSTER-IP entry is gone refuses connections: KUBE-IPVS-FILTER) are back after
    the first periodic resync that began after the change, and connections reach every
    pod again."""
    backend = lab.on_node(Watched)
    context = lab.on_node(ContextResolver.for_backend(CONFIG, backend), None)
    web = port_state("rweb", "10.96.0.30", pods(1, 2))
    gone = port_state("rgone", "10.96.0.31", pods(3))
    source = FakeSource()
    runner = SyncRunner(source, backend, health=ProxyHealth(timeout=60), poll=0.05,
                        sync_period=RUNNER_PERIOD, min_sync_period=0.0)
    thread = threading.Thread(target=_in_namespace(lab.node, runner.run), daemon=True)
    thread.start()
    try:
        source.push(replace(node_state((web, gone), 1), context=context))
        backend.wait("initial", 1)
        before = lab.on_node(_held)
        sid = genl.ServiceId("TCP", "10.96.0.30", 80)
        with backend.paused:
            lab.on_node(_tamper, sid, genl.DestId(pod_ip(2), 8080),
                        genl.ServiceId("TCP", "10.96.0.31", 80))
            assert set(lab.names("10.96.0.30", 80, 4)) == {"pod1"}
            with pytest.raises(ConnectionRefusedError):
                lab.names("10.96.0.31", 80, 1)
            lab.on_node(apply.run, ["ipset", "del", N.set_name(N.CLUSTER_IP, 4),
                                    "10.96.0.30,tcp:80"])
            with pytest.raises(ConnectionRefusedError):  # KUBE-IPVS-FILTER rejects it now
                lab.names("10.96.0.30", 80, 1)
            assert lab.on_node(_held) != before
        backend.wait("periodic", 1)  # the first resync that began after the change
        assert lab.on_node(_held) == before
        assert sorted(set(lab.names("10.96.0.30", 80, 4))) == ["pod1", "pod2"]
        assert lab.names("10.96.0.31", 80, 1) == ["pod3"]
    finally:
        runner.stop()
        thread.join(timeout=60)
        lab.on_node(backend.cleanup)
        lab.on_node(backend.close)
