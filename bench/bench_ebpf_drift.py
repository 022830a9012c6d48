"""The ebpf backend's drift check at scale: one periodic resync (read both maps back,
compare them with what was written, write what differs) at N services x M endpoints.

Run as root: it makes one cgroup (under the cgroup v2 mount) and one bpffs mount, and
removes them at the end. Prints, as the median of --rounds (CPU time of this process,
kernel time of the map reads included): the verify pass alone (``Tables.verify``: two
batched map reads and the comparison), the whole periodic resync with nothing changed,
and the resync that repairs one deleted service entry.

Usage: .venv/bin/python bench/bench_ebpf_drift.py [--services 10000] [--endpoints 10]
       [--rounds 5]
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_ebpf import CGROUP2, CONFIG, load_state  # noqa: E402
from svcproxy.backends.ebpf.backend import EbpfBackend  # noqa: E402
from svcproxy.backends.ebpf.loader import Layout  # noqa: E402
from svcproxy.backends.ebpf.names import MAP_SERVICES  # noqa: E402
from svcproxy.sdk import Changes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tag = secrets.token_hex(3)
    cgroup = CGROUP2 / f"svcproxy-bench-drift-{tag}"
    bpffs = Path(tempfile.mkdtemp(prefix="spbench-drift-"))
    cgroup.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    backend = EbpfBackend(CONFIG, Layout(pin_dir=bpffs / "pins", cgroup=cgroup))
    try:
        backend.start()
        state = load_state(args.services, args.endpoints)
        backend.sync(state, Changes(frozenset(state.services), full=True, reason="initial"))
        tables = backend.tables
        assert tables is not None
        periodic = Changes(frozenset(state.services), full=True, reason="periodic")
        verify, clean, repair = [], [], []
        for _ in range(args.rounds):
            t0 = time.process_time()
            assert not tables.compare()
            verify.append(time.process_time() - t0)
            t0 = time.process_time()
            backend.sync(state, periodic)
            clean.append(time.process_time() - t0)
            assert backend.last is not None and backend.last.writes.services_written == 0
            services = backend.programs.maps[MAP_SERVICES]  # type: ignore[union-attr]
            services.delete(next(iter(tables.applied)))  # type: ignore[arg-type]
            t0 = time.process_time()
            backend.sync(state, periodic)
            repair.append(time.process_time() - t0)
            assert backend.last is not None and backend.last.writes.services_written == 1
        entries = len(tables.applied or {}) + tables.slot_count
        print(f"{args.services} services x {args.endpoints} endpoints ({entries} map entries), "
              f"median of {args.rounds}:")
        print(f"  verify pass (read both maps, compare): {statistics.median(verify) * 1e3:.0f} ms")
        print(f"  periodic resync, nothing changed:      {statistics.median(clean) * 1e3:.0f} ms")
        print(f"  periodic resync, one entry repaired:   {statistics.median(repair) * 1e3:.0f} ms")
    finally:
        backend.cleanup()
        subprocess.run(["umount", str(bpffs)], check=False)
        shutil.rmtree(bpffs, ignore_errors=True)
        cgroup.rmdir()


if __name__ == "__main__":
    main()
