"""The iptables backend's own work, without the iptables tools: CPU seconds per sync.

    .venv/bin/python bench/bench_iptables_cpu.py [--services 10000] [--endpoints 10]
        [--changes 50] [--rounds 3]

The kernel side of a sync (iptables-restore) is the tools' cost and varies with the
machine's load; what the backend itself adds (render, diff, plan, restore text) is
Python and is measured here in process CPU time (``time.process_time``, less sensitive
to other work on the machine than wall time), with the iptables programs replaced by a
recorder and no kernel touched. Prints, per round: the full sync, one endpoint change
(p50 and p90 over ``--changes``), a periodic sync with nothing to do (p50 of 5), the
hourly full resync, the size of the full sync's restore input and the process's peak
RSS (state included; the recorded inputs are dropped between rounds). Run two versions
of the backend alternately (same state, same machine) to compare them.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_iptables import make_state, pct, with_one_change  # noqa: E402

from svcproxy.sdk.backend import Changes  # noqa: E402
from svcproxy.sdk.config import NodeConfig  # noqa: E402
from tests.support.iptables_fakes import RecordingIptables, stand_in  # noqa: E402


def cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def one_round(args: argparse.Namespace) -> dict[str, float]:
    from svcproxy.backends.iptables import backend as module

    stand_in()
    state = make_state(args.services, args.endpoints)
    backend = module.IptablesBackend(NodeConfig("bench", cluster_cidrs=("10.0.0.0/8",)),
                                     module.IptablesOptions(mode="nft", families=(4,),
                                                            localhost_nodeports=False))
    full = cpu(lambda: backend.sync(state, Changes(full=True, reason="initial")))
    size = len(RecordingIptables.restored[0])
    changes = []
    for n in range(args.changes):
        state, change = with_one_change(state, args.services, args.endpoints, n)
        changes.append(cpu(lambda s=state, c=change: backend.sync(s, c)))
    periodic = Changes(services=frozenset(state.services), full=True, reason="periodic")
    noop = [cpu(lambda: backend.sync(state, periodic)) for _ in range(5)]
    hourly = cpu(lambda: backend.sync(state, Changes(full=True, reason="hourly")))
    RecordingIptables.restored = []
    return {"full": full, "change_p50": statistics.median(changes),
            "change_p90": pct(changes, 0.9), "noop": statistics.median(noop), "bytes": size,
            "hourly": hourly, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.services} services x {args.endpoints} endpoints, CPU seconds of the "
          "backend's own work (iptables programs recorded, not run)")
    for n in range(args.rounds):
        r = one_round(args)
        print(f"round {n + 1}: full sync {r['full']:.2f} s, one change p50 "
              f"{r['change_p50'] * 1000:.1f} ms p90 {r['change_p90'] * 1000:.1f} ms, "
              f"periodic with nothing to do {r['noop'] * 1000:.1f} ms, hourly full resync "
              f"{r['hourly']:.2f} s, restore input {r['bytes'] / 1e6:.1f} MB, peak RSS "
              f"{r['rss']:.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
