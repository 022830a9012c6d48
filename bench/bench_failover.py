"""Failover with real packets: kill -9 the frontend replica the nft backend streams from.

    sudo .venv/bin/python bench/bench_failover.py [--kills 20]

The lab of tests/support/netns/failover.py: two frontend replicas on the same manifests, the
nft backend in a network namespace given both; a prober makes new TCP connections
through a ClusterIP all along. Each kill changes a Service during the outage, then
restarts the killed replica. Prints, over the kills: SIGKILL -> the backend streams
from the other replica, SIGKILL -> the change answers real connections (p50, p99, max),
and how many connections failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.netns.failover import FailoverLab  # noqa: E402
from tests.support.netns.harness import missing_requirements  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    opts = parser.parse_args()
    why = missing_requirements()
    if why:
        raise SystemExit(f"bench_failover: {why}")
    lab = FailoverLab()
    try:
        lab.start()
        kills = [lab.kill() for _ in range(opts.kills)]
        lab.stop_probing()
    finally:
        lab.stop()
    for label, values in (("SIGKILL -> streaming from the other replica",
                           [k.moved for k in kills]),
                          ("SIGKILL -> outage's change answers connections",
                           [k.applied for k in kills])):
        print(f"{label:48} p50 {pct(values, .5):5.0f} ms  p99 {pct(values, .99):5.0f} ms  "
              f"max {max(values) * 1000:5.0f} ms  ({len(values)} kills)")
    failed = sum(n for k, n in lab.probes.items() if k != "ok")
    print(f"connections through the ClusterIP: {lab.probes['ok']} answered, {failed} failed "
          f"{dict((k, n) for k, n in lab.probes.items() if k != 'ok') or ''}")


if __name__ == "__main__":
    main()
