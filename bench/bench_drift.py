"""Benchmark: one periodic verify + repair pass (issue 27's drift check) at scale.

The nft and the iptables backend each program ``--services`` services x ``--endpoints``
endpoints (NodePorts on the first 2,000; the nft and iptables benches' state) in a
network namespace this script creates (it runs itself inside it with ``ip netns
exec``, as a backend runs on its node: libnftables in-process, iptables without a
prefix). Then, ``--rounds`` times each, printed as median (min-max):

1. a periodic resync with nothing changed: the kernel read back and compared with what
   was applied (nft: one netlink dump of each family's table), nothing written.
   iptables-nft, three ways side by side: nothing committed since the last check (the
   ruleset's generation only), someone else committed elsewhere (a foreign table added:
   the kernel's change events name no chain of ours, none is read), and the same with
   the events taken as lost (every chain of ours read over netlink and compared: the
   check before the events). iptables-legacy (``--iptables-mode legacy``): the check
   (the nat and filter tables' blobs read and digested, ``legacyblob``), the read alone,
   the check after a foreign rule (the blob differs: ``iptables-save -t nat`` and ``-t
   filter`` compared), and beside them the check before the blobs (``iptables-save``
   every period) and the read before that (``iptables-save`` of every table);
2. a periodic resync after one element (nft: a service's ``service-ips`` entry) or one
   rule (iptables: a KUBE-SEP DNAT rule) was deleted behind the backend's back: found,
   and that service port's objects written again.

Wall time and CPU time (this process plus its children: nft / iptables-save /
iptables-restore) per pass. nft also shows the read and the comparison apart.

Usage (root): .venv/bin/python bench/bench_drift.py [--services 10000] [--endpoints 10]
    [--rounds 5] [--backends nft,iptables] [--iptables-mode legacy]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions  # noqa: E402
from svcproxy.backends.iptables.drift import read_saved  # noqa: E402
from svcproxy.backends.nft import drift as nft_drift  # noqa: E402
from svcproxy.backends.nft import elements as nft_elements  # noqa: E402
from svcproxy.backends.nft.backend import FamilyView, NftBackend  # noqa: E402
from svcproxy.backends.nft.libnft import LibNftRunner  # noqa: E402
from svcproxy.sdk import Changes, NodeState  # noqa: E402
from tests.support.nft_fixtures import CONFIG, big_state  # noqa: E402


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(action: Callable[[], object]) -> tuple[float, float]:
    """(wall, cpu) seconds of ``action``."""
    c0, t0 = cpu(), time.perf_counter()
    action()
    return time.perf_counter() - t0, cpu() - c0


def show(label: str, samples: list[float], unit: str = "s") -> str:
    scale = 1e3 if unit == "ms" else 1.0
    values = [v * scale for v in samples]
    return (f"{label} {statistics.median(values):.3f} {unit} "
            f"({min(values):.3f}-{max(values):.3f})")


def periodic(state: NodeState) -> Changes:
    return Changes(frozenset(state.services), full=True, reason="periodic")


def bench_nft(state: NodeState, rounds: int) -> None:
    backend = NftBackend(CONFIG, LibNftRunner())
    wall, _ = timed(lambda: backend.sync(state, Changes(frozenset(state.services), full=True,
                                                        reason="initial")))
    print(f"nft: full sync {wall:.1f} s")
    backend.sync(state, periodic(state))  # learns the chains' digests, encodes elements
    clean: list[tuple[float, float]] = []
    reads: list[float] = []
    compares: list[float] = []
    for _ in range(rounds):
        clean.append(timed(lambda: backend.sync(state, periodic(state))))
        assert backend.last is None or backend.last.mode != "repair"
        tables = backend._tables
        assert tables is not None
        for i, f in enumerate(backend.families):
            table = tables[f]
            ctx = table.ctx
            t0 = time.perf_counter()
            view = backend.reader.read(ctx.ipx, ctx.table,
                                       nft_elements.layouts(ctx, table.lb_sizes))
            t1 = time.perf_counter()
            nft_drift.compare(table, FamilyView(backend.applied, i), view,
                              backend._learnt.setdefault(f, nft_drift.Learnt()))
            reads.append(t1 - t0)
            compares.append(time.perf_counter() - t1)
    repaired: list[tuple[float, float]] = []
    for n in range(rounds):
        cip = f"10.96.{n // 250}.{n % 250 + 1}"
        subprocess.run(["nft", "delete", "element", "ip", "svcproxy", "service-ips",
                        f"{{ {cip} . tcp . 80 }}"], check=True)
        repaired.append(timed(lambda: backend.sync(state, periodic(state))))
        assert backend.last is not None and backend.last.mode == "repair"
        listing = subprocess.run(["nft", "list", "map", "ip", "svcproxy", "service-ips"],
                                 capture_output=True, text=True, check=True).stdout
        assert f"{cip} . tcp . 80" in listing
    report(clean, repaired)
    print("     " + show("netlink read (both families)", [sum(reads[i:i + 2]) for i in
                                                          range(0, len(reads), 2)]))
    print("     " + show("comparison (both families)", [sum(compares[i:i + 2]) for i in
                                                        range(0, len(compares), 2)]))
    backend.cleanup()


def bench_iptables(state: NodeState, rounds: int, mode: str = "auto") -> None:
    backend = IptablesBackend(CONFIG, IptablesOptions(families=(4,), mode=mode))
    wall, _ = timed(lambda: backend.sync(state, Changes(frozenset(state.services), full=True,
                                                        reason="initial")))
    print(f"iptables ({backend.mode}, IPv4): full sync {wall:.1f} s")
    first = timed(lambda: backend.sync(state, periodic(state)))
    print("   " + show("first check after the full sync: wall", [first[0]]) + ", "
          + show("cpu", [first[1]]))
    tool = f"iptables-{backend.mode}"
    if backend.mode == "nft":
        written = backend._written[4]
        quiet = [timed(lambda: backend.sync(state, periodic(state))) for _ in range(rounds)]
        assert not any(r.chains_written for r in backend.reports)
        elsewhere: list[tuple[float, float]] = []
        lost: list[tuple[float, float]] = []
        for n in range(rounds):  # someone else commits
            subprocess.run(["nft", "add", "table", "ip", f"other{n}"], check=True)
            elsewhere.append(timed(lambda: backend.sync(state, periodic(state))))
            subprocess.run(["nft", "delete", "table", "ip", f"other{n}"], check=True)
            written.touched = None  # as if the events were lost: every chain read
            lost.append(timed(lambda: backend.sync(state, periodic(state))))
            assert not any(r.chains_written for r in backend.reports)
        print("   " + show("nothing committed since the last check: wall",
                           [w for w, _ in quiet]) + ", " + show("cpu", [c for _, c in quiet]))
        print("   " + show("someone else committed elsewhere (events: nothing read): wall",
                           [w for w, _ in elsewhere]) + ", "
              + show("cpu", [c for _, c in elsewhere]))
        print("   " + show("before: someone else committed, every chain read: wall",
                           [w for w, _ in lost]) + ", " + show("cpu", [c for _, c in lost]))
    else:
        fam = backend._families[4]
        services = {k: r for k, v in backend.applied.items()
                    if (r := v.rules[0]) is not None}
        wanted = {t: list(c) for t, c in fam.planner.top.items()}
        wanted.setdefault("nat", []).extend(c for r in services.values() for c in r.chains)
        blobs = fam.blobs
        assert blobs is not None
        quiet = [timed(lambda: backend.sync(state, periodic(state))) for _ in range(rounds)]
        read = [timed(lambda: [blobs.digest(t) for t in ("nat", "filter")])
                for _ in range(rounds)]
        foreign = []
        for n in range(rounds):  # a rule not ours: the blob differs, iptables-save compared
            subprocess.run([tool, "-A", "INPUT", "-p", "udp", "--dport", str(9 + n),
                            "-j", "ACCEPT"], check=True)
            foreign.append(timed(lambda: backend.sync(state, periodic(state))))
        fam.blobs = None  # the check before the blobs: iptables-save every period
        before = [timed(lambda: backend.sync(state, periodic(state))) for _ in range(rounds)]
        fam.blobs = blobs
        every = [timed(lambda: fam.tool.save_stream(lambda lines: read_saved(lines, wanted)))
                 for _ in range(rounds)]
        assert not any(r.chains_written for r in backend.reports)
        for label, runs in (
                ("check, nothing changed (the nat and filter blobs digested): wall", quiet),
                ("the two blobs read and digested alone: wall", read),
                ("check after a foreign rule (blob differs, iptables-save compared): wall",
                 foreign),
                ("before: check, nothing changed (iptables-save -t nat, -t filter): wall",
                 before),
                ("before that: iptables-save of every table alone: wall", every)):
            print("   " + show(label, [w for w, _ in runs]) + ", "
                  + show("cpu", [c for _, c in runs]))
    repaired: list[tuple[float, float]] = []
    saved_lines = subprocess.run([f"{tool}-save", "-t", "nat"], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
    seps = [line.split()[0][1:] for line in saved_lines if line.startswith(":KUBE-SEP-")]
    for n in range(rounds):
        chain = seps[n]
        subprocess.run([tool, "-t", "nat", "-D", chain, "2"], check=True)  # its DNAT rule
        repaired.append(timed(lambda: backend.sync(state, periodic(state))))
        assert any(r.chains_written for r in backend.reports) and not backend.last_sync_full
    print("   " + show("resync repairing one service port: wall", [w for w, _ in repaired])
          + ", " + show("cpu", [c for _, c in repaired]))
    backend.cleanup()


def report(clean: list[tuple[float, float]], repaired: list[tuple[float, float]]) -> None:
    print("   " + show("resync, nothing changed: wall", [w for w, _ in clean])
          + ", " + show("cpu", [c for _, c in clean]))
    print("   " + show("resync repairing one service port: wall", [w for w, _ in repaired])
          + ", " + show("cpu", [c for _, c in repaired]))


def inside(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    state = big_state(args.services, args.endpoints)
    print(f"{args.services} services x {args.endpoints} endpoints (state built in "
          f"{time.perf_counter() - t0:.1f} s); {os.cpu_count()} CPUs, kernel "
          f"{os.uname().release}", flush=True)
    for name in args.backends.split(","):
        if name == "nft":
            bench_nft(state, args.rounds)
        else:
            bench_iptables(state, args.rounds, args.iptables_mode)
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="nft,iptables")
    parser.add_argument("--iptables-mode", choices=("auto", "nft", "legacy"), default="auto",
                        help="the iptables backend's mode (default %(default)s: nft here)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args)
        return
    name = f"spbench{os.getpid()}-drift"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, sys.executable, __file__, "--inside",
                        *sys.argv[1:]], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


if __name__ == "__main__":
    main()
