"""Conntrack reconciler at 10,000 UDP entries, in a network namespace this script creates.

Prints, side by side: dumping the table over svcproxy's ctnetlink client and over
pyroute2's Conntrack (its per-entry cost, measured on fewer entries), deciding which
flows are stale (pure), and deleting them in batches. Run as root:
    .venv/bin/python bench/bench_conntrack.py [ENTRIES]
"""

from __future__ import annotations

import subprocess
import sys
import time

from svcproxy.agent.conntrack_netlink import Ctnetlink, Flow
from svcproxy.agent.conntrack_reconciler import stale_flows
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import NodeState

NS = "svcp-bench-ct"
PYROUTE2_SAMPLE = 1000


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
        table.close()
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
