"""The conntrack reconciler's decision (pure) and its run against a real conntrack table in a
namespace this test creates: a stale flow from before the backend started is deleted, valid
ones stay; under many syncs it runs at most once per interval, and a flow a sync makes stale
goes in that sync."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterable

from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.conntrack_netlink import Ctnetlink, Flow
from svcproxy.sdk.conntrack_reconciler import ConntrackReconciler, stale_flows
from svcproxy.sdk.metrics import AgentMetrics
from tests.agent.test_agent_conntrack_netns import PODS, SERVICE_IP, Lab, dnat_to, lab, service
from tests.support.waiting import wait_for

__all__ = ["lab"]  # the namespaces fixture

DNS = ServicePortKey("kube-system", "dns", "dns", Protocol.UDP)
SYSLOG = ServicePortKey("ops", "syslog", "syslog", Protocol.UDP)


def state(*ports: tuple[ServicePortKey, str, int, int, dict[str, bool]]) -> NodeState:
    services = {}
    for key, ip, port, node_port, eps in ports:
        endpoints = {a: Endpoint(a, 5353, ready=r, serving=r) for a, r in eps.items()}
        svc = ServicePort(key, cluster_ips=(ip,), port=port, node_port=node_port,
                          has_endpoints=any(eps.values()))
        services[key] = ServicePortState(svc, endpoints)
    return NodeState("node", 1, None, services)


def flow(dst: str, dport: int, reply: str, src: str = "10.0.0.1", proto: int = 17) -> Flow:
    return Flow(4, proto, src, dst, 40000, dport, reply)


def test_stale_flows_as_kube_proxy_decides() -> None:
    new = state((DNS, "10.96.0.10", 53, 30053, {"10.244.1.5": True, "10.244.1.6": False}),
                (SYSLOG, "10.96.0.20", 514, 0, {}))
    flows = {
        "to a serving endpoint": flow("10.96.0.10", 53, "10.244.1.5"),
        "to an endpoint not serving": flow("10.96.0.10", 53, "10.244.1.6"),
        "to an endpoint gone": flow("10.96.0.10", 53, "10.244.9.9"),
        "not DNATed, now has endpoints": flow("10.96.0.10", 53, "10.96.0.10"),
        "not DNATed, still none": flow("10.96.0.20", 514, "10.96.0.20"),
        "node port, endpoint gone": flow("192.168.1.10", 30053, "10.244.9.9"),
        "node port, serving": flow("192.168.1.10", 30053, "10.244.1.5"),
        "not a service": flow("10.50.0.1", 53, "10.244.9.9"),
        "another port of the IP": flow("10.96.0.10", 54, "10.244.9.9"),
        "TCP is not ours": flow("10.96.0.10", 53, "10.244.9.9", proto=6),
    }
    stale = set(stale_flows(flows.values(), new))
    assert {name for name, f in flows.items() if f in stale} == {
        "to an endpoint not serving", "to an endpoint gone", "not DNATed, now has endpoints",
        "node port, endpoint gone"}
    # A deleted service's flows are found through the change from the old state.
    old = state((DNS, "10.96.0.10", 53, 0, {"10.244.1.5": True}))
    gone = flow("10.96.0.10", 53, "10.244.1.5")
    assert stale_flows([gone], state(), old) == [gone]
    assert stale_flows([gone], state()) == []


def test_reconciler_deletes_a_stale_flow_from_before_it_started(lab: Lab) -> None:
    lab.nft(dnat_to("pod1", "pod2"))
    first = lab.ask()
    assert first in PODS, first
    remaining = "pod2" if first == "pod1" else "pod1"
    # While the backend was down, the endpoint went away and the rules were rewritten.
    lab.nft(dnat_to(remaining))
    assert lab.ask() == first, "the stale entry keeps the flow on the removed endpoint"
    table = Ctnetlink(lab.ns("node"))
    reconciler = ConntrackReconciler(lambda: Ctnetlink(lab.ns("node")), families=(4,),
                                     min_interval=0)
    try:
        valid = Flow(4, 17, "10.200.0.9", SERVICE_IP, 41000, 53, PODS[remaining])
        other = Flow(4, 17, "10.200.0.9", "10.50.0.1", 41000, 53, "10.50.0.1")
        tcp = Flow(4, 6, "10.200.0.9", SERVICE_IP, 41000, 53, PODS[first])
        assert table.add([(valid, 5353), (other, 53), (tcp, 5353)]) == 3
        metrics = AgentMetrics(families=("IPv4",))
        reconciler.metrics = metrics
        assert reconciler.after_sync(None, service(remaining)) == 1  # a fresh start: no old
        left = table.dump(4, 17)
        assert not any(f.reply_src == PODS[first] for f in left)
        assert valid in left and other in left
        assert any(f.orig_dport == 53 for f in table.dump(4, 6)), "TCP is left alone"
        assert lab.ask() == remaining
        assert metrics.conntrack_deleted_total.labels(ip_family="IPv4")._value.get() == 1
        reconciler.after_sync(None, service(remaining))  # later runs: on their own thread
        wait_for(lambda: reconciler.runs == 2)
        assert metrics.conntrack_deleted_total.labels(ip_family="IPv4")._value.get() == 1
    finally:
        reconciler.close()
        table.close()


def test_entries_parse_back_in_both_families() -> None:
    from svcproxy.sdk.conntrack_netlink import add_message, parse_flow

    for f in (flow("10.96.0.10", 53, "10.244.1.5"),
              Flow(6, 132, "fd00::1", "fd00:96::a", 40000, 5000, "fd00:244::5"),
              Flow(4, 17, "10.0.0.1", "10.96.0.10", 1, 65535, "10.96.0.10")):
        message = add_message(f, 5353, 30, 1)
        assert parse_flow(message, 16, len(message)) == f


def test_many_syncs_run_it_at_most_once_per_interval_and_a_stale_flow_still_goes(lab: Lab
                                                                                 ) -> None:
    """Syncs every 10 ms (--min-sync-period 0 under churn) for 2.5 intervals: the first runs
    at once, then at most one whole run per interval; the sync that makes a flow stale is
    the last one, and the flow is gone when that sync is over, as after kube-proxy's."""
    interval = 1.0
    lab.nft(dnat_to("pod1", "pod2"))
    first = lab.ask()
    assert first in PODS, first
    remaining = "pod2" if first == "pod1" else "pod1"
    both = service("pod1", "pod2")
    reconciler = ConntrackReconciler(lambda: Ctnetlink(lab.ns("node")), families=(4,),
                                     min_interval=interval)
    try:
        reconciler.after_sync(None, both)
        assert reconciler.runs == 1, "the first sync reconciles at once"
        start, syncs = time.monotonic(), 0
        while time.monotonic() - start < 2.5 * interval:
            reconciler.after_sync(both, both)
            syncs += 1
            time.sleep(0.01)
        elapsed = time.monotonic() - start
        assert syncs >= 20
        assert 2 <= reconciler.runs <= 2 + elapsed / interval, (reconciler.runs, syncs)

        lab.nft(dnat_to(remaining))
        assert lab.ask() == first, "the stale entry keeps the flow on the removed endpoint"
        runs = reconciler.runs
        assert reconciler.after_sync(both, service(remaining)) == 1
        assert PODS[first] not in lab.entries()
        assert lab.ask() == remaining
        assert reconciler.runs == runs, "not by a whole run"
    finally:
        reconciler.close()


class StandInTable:
    """The conntrack table in memory; counts dumps."""

    def __init__(self, flows: list[Flow]) -> None:
        self.flows = list(flows)
        self.dumps = 0
        self.lock = threading.Lock()

    def dump(self, family: int, protocol: int, dport: int = 0, dst: str = "") -> list[Flow]:
        with self.lock:
            self.dumps += 1
            return [f for f in self.flows if f.family == family and f.protocol == protocol
                    and dport in (0, f.orig_dport) and dst in ("", f.orig_dst)]

    def delete(self, flows: Iterable[Flow]) -> int:
        gone = set(flows)
        with self.lock:
            before = len(self.flows)
            self.flows = [f for f in self.flows if f not in gone]
            return before - len(self.flows)


def test_a_deferred_run_sees_every_change_since_the_last_run() -> None:
    """A service port deleted by a sync inside the interval whose own deletion fails (the
    table cannot be opened), then syncs that no longer name it: the deferred run still
    deletes its flows (it compares with the state it last reconciled, not with the previous
    sync's)."""
    dns = state((DNS, "10.96.0.10", 53, 0, {"10.244.1.5": True}))
    gone = flow("10.96.0.10", 53, "10.244.1.5")
    table = StandInTable([gone])
    opened = iter([table])

    def open_table() -> StandInTable:
        return next(opened, None) or _refuse()

    reconciler = ConntrackReconciler(open_table, families=(4,), min_interval=1.5)
    try:
        assert reconciler.after_sync(None, dns) == 0
        assert reconciler.after_sync(dns, state()) == 0  # deferred
        assert reconciler.after_sync(state(), state()) == 0
        assert table.flows == [gone]
        wait_for(lambda: not table.flows)
        assert reconciler.runs == 2 and table.dumps == 2 * 2  # UDP and SCTP per run
    finally:
        reconciler.close()


def _refuse() -> StandInTable:
    raise OSError(errno.EPERM, "ctnetlink refused")


def test_a_dump_towards_one_address_and_port_holds_those_entries_alone(lab: Lab) -> None:
    """In both families (the kernel filters IPv4 addresses; IPv6 ones are checked here)."""
    table = Ctnetlink(lab.ns("node"))
    try:
        made = [Flow(4, 17, "10.200.0.9", dst, 42000 + i, port, "10.244.1.5")
                for i, (dst, port) in enumerate((("10.96.0.10", 53), ("10.96.0.10", 53),
                                                 ("10.96.0.10", 54), ("10.96.0.11", 53)))]
        made += [Flow(6, 17, "fd00::9", dst, 42000 + i, port, "fd00:244::5")
                 for i, (dst, port) in enumerate((("fd00:96::a", 53), ("fd00:96::a", 54),
                                                  ("fd00:96::a", 54), ("fd00:96::b", 54)))]
        assert table.add([(f, 5353) for f in made]) == len(made)
        for family, dsts in ((4, ("10.96.0.10", "10.96.0.11")), (6, ("fd00:96::a",
                                                                     "fd00:96::b"))):
            for port in (53, 54):
                want = {f for f in made if f.family == family and f.orig_dport == port}
                assert set(table.dump(family, 17, port)) == want, (family, port)
                for dst in dsts:
                    assert set(table.dump(family, 17, port, dst)) == {
                        f for f in want if f.orig_dst == dst}, (family, port, dst)
    finally:
        table.close()


def test_a_sync_deletes_the_flows_it_made_stale_with_dumps_towards_them_alone() -> None:
    """A sync that removes endpoints of a few UDP service ports dumps the entries towards
    those alone (one dump each) and deletes the stale ones before it returns; one that
    touches many reads the table once; flows still valid stay."""
    def ports(count: int, gone: bool) -> NodeState:
        return state(*((ServicePortKey("ns", f"s{i}", "dns", Protocol.UDP), f"10.96.1.{i}",
                        53, 0, {"10.244.1.5": not gone, "10.244.1.6": True})
                       for i in range(1, count + 1)))

    for count, dumps in ((2, 2), (30, 1)):
        stale = [flow(f"10.96.1.{i}", 53, "10.244.1.5") for i in range(1, count + 1)]
        valid = [flow(f"10.96.1.{i}", 53, "10.244.1.6") for i in range(1, count + 1)]
        table = StandInTable(stale + valid)
        reconciler = ConntrackReconciler(lambda t=table: t, families=(4,), min_interval=60)
        try:
            before, after = ports(count, gone=False), ports(count, gone=True)
            reconciler.after_sync(None, before)
            table.dumps = 0
            assert reconciler.after_sync(before, after, frozenset(after.services)) == count
            assert table.flows == valid and table.dumps == dumps, (count, table.dumps)
            assert reconciler.after_sync(after, after, frozenset()) == 0
            assert table.dumps == dumps, "a sync that changed nothing reads nothing"
        finally:
            reconciler.close()
