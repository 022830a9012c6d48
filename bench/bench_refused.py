"""What "one service's failure stays one service's" costs the nft backend; prints figures.

Run as root (creates network namespaces). Side by side in one run, alternating:

1. The common path: a full sync of N services x 10 endpoints and one endpoint change,
   with the up-front value checks on and off (the only work added when nothing is
   refused) -> ratios.
2. The failure path at N: a full sync in which the kernel refuses one service port
   (a conflicting element before the backend's, "File exists"): time to find it from
   nft's error location, next to the plain full sync; and the bisection alone (no
   location used) at 1,000 services.

The machine is shared: besides the alternating ratio, the time spent inside the value
checks during each full sync is printed (the added work, measured where it runs).

Usage: .venv/bin/python bench/bench_refused.py [--services N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from endpoint_swap import swap_one_endpoint  # noqa: E402

from svcproxy.backends.nft import backend as nft_backend  # noqa: E402
from svcproxy.backends.nft.apply import NftRunner  # noqa: E402
from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.backends.nft.libnft import LibNftRunner  # noqa: E402
from svcproxy.backends.nft.names import TABLE  # noqa: E402
from svcproxy.sdk import Changes, NodeState  # noqa: E402
from svcproxy.sdk.refusals import invalid_values  # noqa: E402
from tests.support.lab.netns import call_in  # noqa: E402
from tests.support.netns.harness import scratch_netns  # noqa: E402
from tests.support.nft_fixtures import CONFIG, big_state  # noqa: E402

SPENT = [0.0]  # seconds inside the value checks during the last timed sync


def _timed_check(record: object) -> str | None:
    t0 = time.perf_counter()
    try:
        return invalid_values(record)  # type: ignore[arg-type]
    finally:
        SPENT[0] += time.perf_counter() - t0


@contextmanager
def checks(on: bool) -> Iterator[None]:
    """The backend's up-front value check (timed), or none (what the code did before)."""
    saved = nft_backend.invalid_values
    nft_backend.invalid_values = _timed_check if on else (lambda record: None)  # type: ignore
    try:
        yield
    finally:
        nft_backend.invalid_values = saved


def full(state: NodeState) -> Changes:
    return Changes(frozenset(state.services), full=True, reason="initial")


def common_path(state: NodeState, on: bool) -> tuple[float, float]:
    """(full sync seconds, median one-change seconds) in a fresh namespace."""
    with checks(on), scratch_netns(f"sprefbench-{'on' if on else 'off'}-") as ns:
        def run() -> tuple[float, float]:
            backend = NftBackend(CONFIG, LibNftRunner(), families=(4,))
            SPENT[0] = 0.0
            t0 = time.perf_counter()
            backend.sync(state, full(state))
            first = time.perf_counter() - t0
            if on:
                print(f"   (checks on: {SPENT[0]:.3f} s of a {first:.2f} s full sync in the "
                      f"checks, {100 * SPENT[0] / first:.1f}%)", flush=True)
            key = sorted(state.services)[len(state.services) // 2]
            now, times = state, []
            for i in range(15):
                now = swap_one_endpoint(now, key, 3_000_000 + i)
                t0 = time.perf_counter()
                backend.sync(now, Changes(frozenset({key})))
                times.append(time.perf_counter() - t0)
            return first, statistics.median(times)
        return call_in(ns, run)


class Conflicting:
    """A conflicting element for one service's address, just before the backend's."""

    def __init__(self, ns: str, element: str) -> None:
        self.runner = NftRunner(("ip", "netns", "exec", ns))
        self.element = element
        self.checks = 0

    def _with(self, text: str) -> str:
        head = f"add element ip {TABLE} service-ips "
        if self.element.split(" :")[0] + " :" not in text:
            return text
        lines = text.split("\n")
        at = next(i for i, line in enumerate(lines) if line.startswith(head))
        lines[at - 1] += f"; {head}{{ {self.element} }}"
        return "\n".join(lines)

    def apply(self, text: str) -> None:
        self.runner.apply(self._with(text))

    def check(self, text: str) -> None:
        self.checks += 1
        self.runner.check(self._with(text))


def failure_path(state: NodeState, use_location: bool) -> tuple[float, float, int]:
    """(plain full sync s, full sync with one refused service s, checks it took)."""
    victim = sorted(state.services)[len(state.services) // 3]
    cip = state.services[victim].service.cluster_ips[0]
    with scratch_netns("sprefbench-fail-") as ns:
        plain = NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", ns)), families=(4,))
        t0 = time.perf_counter()
        plain.sync(state, full(state))
        plain_s = time.perf_counter() - t0
        plain.cleanup()
        runner = Conflicting(ns, f"{cip} . tcp . 80 : drop")
        backend = NftBackend(CONFIG, runner, families=(4,))
        saved = nft_backend.named_in_error
        if not use_location:
            nft_backend.named_in_error = lambda *args: []  # type: ignore[assignment]
        try:
            t0 = time.perf_counter()
            backend.sync(state, full(state))
            refused_s = time.perf_counter() - t0
        finally:
            nft_backend.named_in_error = saved
        assert list(backend.refusals) == [victim], backend.refusals
        return plain_s, refused_s, runner.checks


def per_object(state: NodeState) -> float:
    records = list(state.services.values())
    t0 = time.perf_counter()
    for record in records:
        invalid_values(record)
    return (time.perf_counter() - t0) / len(records)


def best(runs: list[tuple[float, float]], pick: Callable[[tuple[float, float]], float]) -> float:
    return min(pick(r) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    state = big_state(args.services, 10)
    print(f"== {args.services} services x 10 endpoints, nft backend (libnftables)")
    print(f"   value check per service port (10 endpoints): {1e6 * per_object(state):.1f} us")
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        off.append(common_path(state, False))
        on.append(common_path(state, True))
    full_on, full_off = best(on, lambda r: r[0]), best(off, lambda r: r[0])
    one_on, one_off = best(on, lambda r: r[1]), best(off, lambda r: r[1])
    print(f"   full sync, best of {args.rounds}: checks on {full_on:.2f} s, off {full_off:.2f} s"
          f" -> {full_on / full_off:.3f}")
    print(f"   one endpoint change, best median: on {1e3 * one_on:.1f} ms, off "
          f"{1e3 * one_off:.1f} ms -> {one_on / one_off:.3f}")
    plain, refused, tries = failure_path(state, use_location=True)
    print(f"   full sync with one service refused by the kernel (nft -f, error location "
          f"used): {refused:.2f} s, {tries} checks; plain full sync {plain:.2f} s")
    small = big_state(1000, 10)
    plain, refused, tries = failure_path(small, use_location=False)
    print(f"   1,000 services, bisection only: {refused:.2f} s, {tries} checks; plain full "
          f"sync {plain:.2f} s")


if __name__ == "__main__":
    main()
