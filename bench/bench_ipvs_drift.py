"""The ipvs backend's drift check: one periodic resync with nothing changed (the kernel
read back and compared with what was applied) at N services x M endpoints.

In the IPVS guest (``scripts/ipvs-vm/run.sh .venv/bin/python bench/bench_ipvs_drift.py``)
it runs on the real kernel in a fresh network namespace and prints wall seconds of the
verify pass alone (``find_drift``: the virtual servers' dump, one real-server dump per
virtual server, addresses, routes, ``ipset save``, iptables-save) and of the whole
periodic resync; the guest is emulated (TCG: Python runs 20-25x slower there).
``--stand-in`` runs it on this host's in-memory kernel of the tests (tests/support/ipvs/standin.py):
the backend's own work (reading the answers, comparing), in CPU seconds of this process.

Usage: bench_ipvs_drift.py [--sizes 1000] [--endpoints 10] [--rounds 3] [--stand-in]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_ipvs import _routes_to_endpoints, ipvs_backend, services  # noqa: E402
from svcproxy.sdk.backend import Changes  # noqa: E402
from tests.support.ipvs.states import node_state  # noqa: E402
from tests.support.lab.netns import enter  # noqa: E402


def _rounds(run: object, backend: object, count: int, endpoints: int, rounds: int,
            clock: object) -> tuple[float, float]:
    """(verify pass, periodic resync) medians, each call through ``run``."""
    state = node_state(services(count, endpoints), 1)
    run(backend.sync, state, Changes(frozenset(state.services), full=True,  # type: ignore
                                     reason="initial"))
    periodic = Changes(frozenset(state.services), full=True, reason="periodic")
    verify, resync = [], []
    for _ in range(rounds):
        t0 = clock()  # type: ignore[operator]
        assert not run(backend.find_drift, state)  # type: ignore[operator, attr-defined]
        verify.append(clock() - t0)  # type: ignore[operator]
        t0 = clock()  # type: ignore[operator]
        run(backend.sync, state, periodic)  # type: ignore[operator, attr-defined]
        resync.append(clock() - t0)  # type: ignore[operator]
    return statistics.median(verify), statistics.median(resync)


def in_guest(count: int, endpoints: int, rounds: int) -> tuple[float, float]:
    ns = f"benchdrift{os.getpid()}{count}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    _routes_to_endpoints(ns)
    pool = ThreadPoolExecutor(1, initializer=enter, initargs=(ns,))
    try:
        backend = pool.submit(ipvs_backend).result()
        result = _rounds(lambda fn, *a: pool.submit(fn, *a).result(), backend, count,
                         endpoints, rounds, time.monotonic)
        pool.submit(backend.cleanup).result()
        pool.submit(backend.close).result()  # type: ignore[attr-defined]
        return result
    finally:
        pool.shutdown()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def on_stand_in(count: int, endpoints: int, rounds: int) -> tuple[float, float]:
    import pytest

    from tests.support.ipvs.standin import stand_in

    patches = pytest.MonkeyPatch()
    try:
        backend = ipvs_backend()
        stand_in(backend, patches)  # type: ignore[arg-type]
        return _rounds(lambda fn, *a: fn(*a), backend, count, endpoints, rounds,
                       time.process_time)
    finally:
        patches.undo()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stand-in", action="store_true",
                        help="on this host's in-memory stand-in kernel (CPU time)")
    args = parser.parse_args()
    where = ("the host's stand-in kernel, CPU s" if args.stand_in
             else "the IPVS guest (TCG), wall s")
    print(f"# services x {args.endpoints} endpoints, on {where}, median of {args.rounds}")
    print(f"{'services':>8} {'verify pass':>12} {'periodic resync':>16}")
    for size in (int(s) for s in args.sizes.split(",")):
        measure = on_stand_in if args.stand_in else in_guest
        verify, resync = measure(size, args.endpoints, args.rounds)
        print(f"{size:>8} {verify:>12.3f} {resync:>16.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
