"""Conntrack reconciler at 10,000 UDP entries, in a network namespace this script creates.

Prints, side by side: dumping the table over svcproxy's ctnetlink client and over
pyroute2's Conntrack (its per-entry cost, measured on fewer entries), deciding which
flows are stale (pure), and deleting them in batches. Then a burst of syncs (one every
10 ms for 5 s, the table at ENTRIES valid flows) through the reconciler as it was (a run in
every sync) and as it is (rate-limited: at most once a second, later runs on a thread of
their own): runs, their time in the table, the sync thread's time in the hook. Last, a sync
that removes one service's endpoint: its flows deleted in that sync (a dump of the entries
towards that service alone), next to a whole run.
Run as root:
    .venv/bin/python bench/bench_conntrack.py [ENTRIES]
"""

from __future__ import annotations

import argparse
import subprocess
import time

from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.conntrack_netlink import Ctnetlink, Flow
from svcproxy.sdk.conntrack_reconciler import MIN_INTERVAL, ConntrackReconciler, stale_flows

NS = "svcp-bench-ct"
PYROUTE2_SAMPLE = 1000
BURST, SYNC_EVERY = 5.0, 0.01


def node_state(services: int) -> NodeState:
    out = {}
    for i in range(services):
        key = ServicePortKey("bench", f"svc{i}", "dns", Protocol.UDP)
        ip = f"10.96.{i // 250}.{i % 250 + 1}"
        eps = {f"10.244.{i // 250}.{i % 250 + 1}": Endpoint(f"10.244.{i // 250}.{i % 250 + 1}",
                                                             5353)}
        out[key] = ServicePortState(ServicePort(key, cluster_ips=(ip,), port=53,
                                                has_endpoints=True), eps)
    return NodeState("node", 1, None, out)


def main(entries: int) -> None:
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        table = Ctnetlink(NS)
        services = max(1, entries // 10)
        flows = []
        for i in range(entries):
            s = i % services
            stale = i % 2 == 1  # every other flow goes to an endpoint that is gone
            endpoint = f"10.245.{s // 250}.{s % 250 + 1}" if stale else \
                f"10.244.{s // 250}.{s % 250 + 1}"
            flows.append((Flow(4, 17, f"10.1.{i // 250 % 250}.{i % 250 + 1}",
                               f"10.96.{s // 250}.{s % 250 + 1}", 20000 + i // 62500,
                               53, endpoint), 5353))
        table.add(flows)
        state = node_state(services)
        t0 = time.perf_counter()
        dumped = table.dump(4, 17)
        t1 = time.perf_counter()
        stale = stale_flows(dumped, state)
        t2 = time.perf_counter()
        deleted = table.delete(stale)
        t3 = time.perf_counter()
        print(f"entries {len(dumped)}, services {services}, stale {len(stale)}")
        print(f"svcproxy ctnetlink dump:    {t1 - t0:7.3f} s ({(t1 - t0) / len(dumped) * 1e6:.0f} "
              "us/entry)")
        print(f"decide (pure):              {t2 - t1:7.3f} s")
        print(f"batched delete:             {t3 - t2:7.3f} s ({deleted} deleted, "
              f"{(t3 - t2) / max(deleted, 1) * 1e6:.0f} us/entry)")
        print(f"reconcile total:            {t3 - t0:7.3f} s")
        from pyroute2 import Conntrack
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        ct = Conntrack(netns=NS)
        t4 = time.perf_counter()
        sample = 0
        for _ in ct.dump_entries(tuple_orig=NFCTAttrTuple(proto=17)):
            sample += 1
            if sample == PYROUTE2_SAMPLE:
                break
        t5 = time.perf_counter()
        ct.close()
        per = (t5 - t4) / max(sample, 1)
        ours = (t1 - t0) / len(dumped)
        print(f"pyroute2 Conntrack dump:    {per * 1e6:7.0f} us/entry over {sample} entries "
              f"(x{per / ours:.0f} ours; {per * len(dumped):.1f} s for {len(dumped)})")
        table.add([(Flow(4, 17, f"10.2.{i // 250 % 250}.{i % 250 + 1}", flow.orig_dst,
                         30000 + i // 62500, 53, flow.reply_src), 5353)
                   for i, (flow, _) in enumerate(flows) if i % 2 == 1])
        print(f"burst of syncs every {SYNC_EVERY * 1000:.0f} ms for {BURST:.0f} s, "
              f"{len(table.dump(4, 17))} valid entries:")
        for label, limited in (("in every sync", False), ("rate-limited", True)):
            burst(label, limited, state)
        one_endpoint_gone(state)
        table.close()
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


class Timed:
    """A Ctnetlink that adds up the time spent in dumps and deletes."""

    def __init__(self) -> None:
        self.table = Ctnetlink(NS)
        self.seconds = 0.0

    def dump(self, family: int, protocol: int) -> list[Flow]:
        t0 = time.perf_counter()
        try:
            return self.table.dump(family, protocol)
        finally:
            self.seconds += time.perf_counter() - t0

    def delete(self, flows: list[Flow]) -> int:
        t0 = time.perf_counter()
        try:
            return self.table.delete(flows)
        finally:
            self.seconds += time.perf_counter() - t0


def every_sync(timed: Timed, state: NodeState) -> None:
    """The hook as it was: a whole run (both protocols) in every sync."""
    flows = [f for proto in (17, 132) for f in timed.dump(4, proto)]
    stale = stale_flows(flows, state, state)
    if stale:
        timed.delete(stale)


def burst(label: str, limited: bool, state: NodeState) -> None:
    """Syncs every SYNC_EVERY for BURST seconds, each followed by the reconciler's hook."""
    timed = Timed()
    reconciler = ConntrackReconciler(lambda: timed, families=(4,), min_interval=MIN_INTERVAL)
    syncs, hook, runs = 0, 0.0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < BURST:
        t0 = time.perf_counter()
        if limited:
            reconciler.after_sync(state, state, frozenset())  # as the runner: none changed
        else:
            every_sync(timed, state)
            runs += 1
        hook += time.perf_counter() - t0
        syncs += 1
        time.sleep(SYNC_EVERY)
    wall = time.perf_counter() - start
    time.sleep(MIN_INTERVAL + 0.5)  # a deferred run finishes
    reconciler.close()
    timed.table.close()
    runs = reconciler.runs if limited else runs
    print(f"  {label:14s} {syncs:4d} syncs, {runs:3d} runs, {timed.seconds:5.2f} s in the table "
          f"({timed.seconds / max(runs, 1):.2f} s/run); sync thread in the hook {hook:5.2f} s "
          f"of {wall:.1f} s")


def one_endpoint_gone(state: NodeState) -> None:
    """A sync after which service 0 has no endpoint: the time the sync spends in the hook."""
    reconciler = ConntrackReconciler(lambda: Ctnetlink(NS), families=(4,), min_interval=60)
    t0 = time.perf_counter()
    reconciler.after_sync(None, state)
    t1 = time.perf_counter()
    for key in sorted(state.services)[:2]:  # the first opens its socket
        t1 = time.perf_counter()
        sps = state.services[key]
        new = NodeState("node", 2, None, {**state.services, key: ServicePortState(sps.service,
                                                                                   {})})
        deleted = reconciler.after_sync(state, new, frozenset([key]))
        t2 = time.perf_counter()
        print(f"a sync removing {key.name}'s endpoint: {deleted} entries deleted in the sync, "
              f"{(t2 - t1) * 1000:.1f} ms in the hook (a whole run: {t1 - t0:.2f} s)")
        state = new
    reconciler.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entries", nargs="?", type=int, default=10_000,
                        help="UDP entries in the table (default %(default)s)")
    main(parser.parse_args().entries)
