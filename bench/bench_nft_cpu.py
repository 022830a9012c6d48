"""The nft backend's own CPU, the kernel left out, and digests of the text it would apply.

For comparing two checkouts of a refactoring on a loaded machine: the same digests mean
the same transactions (so the same kernel work), and process CPU time is far less
disturbed by other work than wall time. 10,000 services x 10 endpoints: a full sync,
then 200 endpoint changes of one service port. Run with the same PYTHONHASHSEED on both
sides for equal delta digests (element order follows set order).

Usage: PYTHONHASHSEED=0 .venv/bin/python bench/bench_nft_cpu.py [CHECKOUT_DIR]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
from pathlib import Path


def _checkout() -> str:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", nargs="?", default=str(Path(__file__).parent.parent),
                        metavar="CHECKOUT_DIR", help="the tree to measure (default this one)")
    return str(parser.parse_args().checkout)


sys.path.insert(0, _checkout())

from endpoint_swap import swap_one_endpoint  # noqa: E402

from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.sdk import Changes  # noqa: E402
from tests.support.nft_fixtures import CONFIG, big_state  # noqa: E402


class Keep:
    """A runner that keeps the text instead of applying it."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def apply(self, text: str) -> None:
        self.texts.append(text)

    def check(self, text: str) -> None:
        pass


def main() -> None:
    state = big_state(10_000, 10)
    runner = Keep()
    backend = NftBackend(CONFIG, runner)
    gc.collect()
    t0 = time.process_time()
    backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))
    full = time.process_time() - t0
    full_digest = hashlib.sha256(runner.texts[-1].encode()).hexdigest()[:12]
    key = sorted(state.services)[5_000]
    cpu = []
    deltas = hashlib.sha256()
    for i in range(200):
        state = swap_one_endpoint(state, key, 2_000_000 + i)
        t0 = time.process_time()
        backend.sync(state, Changes(frozenset({key})))
        cpu.append(time.process_time() - t0)
        deltas.update(runner.texts[-1].encode())
    cpu.sort()
    print(f"full sync CPU {full:.2f} s (text {full_digest}); one change CPU median "
          f"{1e3 * cpu[100]:.2f} ms, p90 {1e3 * cpu[180]:.2f} ms "
          f"(delta texts {deltas.hexdigest()[:12]})")


if __name__ == "__main__":
    main()
