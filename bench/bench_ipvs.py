"""IPVS backend benchmark, against the iptables backend on the same kernel.

Runs in the IPVS guest (``scripts/ipvs-vm/run.sh .venv/bin/python bench/bench_ipvs.py``):
figures are relative, the guest is emulated (TCG). For N services x 10
endpoints (ClusterIP, TCP) it prints the time of the first full sync and of
one endpoint change at that scale, each backend in a fresh network namespace.

``--stand-in`` runs the ipvs backend on this host instead, on the in-memory kernel of
the tests (tests/support/ipvs/standin.py; ipsets and rules recorded, not loaded): the
backend's own work (render, diff, requests), in CPU seconds of this process.

Usage: bench_ipvs.py [--sizes 1000,5000] [--endpoints 10] [--backends ipvs,iptables]
                     [--stand-in]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.model import Endpoint, ServicePortState  # noqa: E402
from svcproxy.sdk.backend import Backend, Changes, NodeState  # noqa: E402
from svcproxy.sdk.config import NodeConfig  # noqa: E402
from tests.support.ipvs.states import endpoint, node_state, port_state  # noqa: E402
from tests.support.lab.netns import enter  # noqa: E402

CONFIG = NodeConfig(node_name="node1", cluster_cidrs=("10.244.0.0/16",), node_ips=("10.1.0.1",))


def services(count: int, endpoints: int) -> list[ServicePortState]:
    return [
        port_state(f"s{i}", f"10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}",
                   [endpoint(f"10.{200 + e}.{i // 250 % 250}.{i % 250 + 1}", is_local=False)
                    for e in range(endpoints)])
        for i in range(count)
    ]


def ipvs_backend() -> Backend:
    from svcproxy.backends.ipvs.backend import IpvsBackend
    from svcproxy.backends.ipvs.options import IpvsOptions

    return IpvsBackend(CONFIG, IpvsOptions(), (4,))


def iptables_backend() -> Backend:
    from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions

    return IptablesBackend(CONFIG, IptablesOptions(families=(4,)))


BACKENDS: dict[str, Callable[[], Backend]] = {"ipvs": ipvs_backend, "iptables": iptables_backend}


def one_endpoint_changed(ports: list[ServicePortState]) -> tuple[NodeState, Changes]:
    """The middle service's first endpoint replaced by another address."""
    middle = ports[len(ports) // 2]
    first = min(middle.endpoints)
    moved: dict[str, Endpoint] = dict(middle.endpoints)
    del moved[first]
    moved["10.250.250.250"] = replace(middle.endpoints[first], ip="10.250.250.250")
    changed = ServicePortState(middle.service, moved)
    new = [changed if p is middle else p for p in ports]
    return node_state(new, 2), Changes(services=frozenset({middle.key}))


def _routes_to_endpoints(ns: str) -> None:
    """A link and a route to the endpoints: IPVS refuses real servers it cannot route to."""
    for argv in (["link", "add", "bv0", "type", "veth", "peer", "name", "bv1"],
                 ["link", "set", "bv0", "up"], ["link", "set", "bv1", "up"],
                 ["addr", "add", "10.1.0.1/24", "dev", "bv0"],
                 ["route", "add", "10.192.0.0/10", "via", "10.1.0.2"]):
        subprocess.run(["ip", "-n", ns, *argv], check=True)


def measure(name: str, count: int, endpoints: int) -> tuple[float, float]:
    """(full sync seconds, one endpoint change seconds) in a fresh namespace."""
    ns = f"bench{os.getpid()}{name[:3]}{count}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    _routes_to_endpoints(ns)
    pool = ThreadPoolExecutor(1, initializer=enter, initargs=(ns,))
    try:
        backend = pool.submit(BACKENDS[name]).result()
        ports = services(count, endpoints)
        state = node_state(ports, 1)
        pool.submit(backend.sync, node_state([], 0), Changes(full=True, reason="initial")).result()
        started = time.monotonic()
        everything = Changes(services=frozenset(state.services), full=True, reason="initial")
        pool.submit(backend.sync, state, everything).result()
        full = time.monotonic() - started
        changed_state, changes = one_endpoint_changed(ports)
        started = time.monotonic()
        pool.submit(backend.sync, changed_state, changes).result()
        one = time.monotonic() - started
        pool.submit(backend.cleanup).result()
        close = getattr(backend, "close", None)
        if close is not None:
            pool.submit(close).result()
        return full, one
    finally:
        pool.shutdown()
        subprocess.run(["ip", "netns", "del", ns], check=False)


def measure_stand_in(count: int, endpoints: int) -> tuple[float, float]:
    """(full sync, one endpoint change) CPU seconds of the ipvs backend on the stand-in."""
    import pytest

    from svcproxy.backends.ipvs.backend import IpvsBackend
    from svcproxy.backends.ipvs.options import IpvsOptions
    from tests.support.ipvs.standin import stand_in

    patches = pytest.MonkeyPatch()
    try:
        backend = IpvsBackend(CONFIG, IpvsOptions(), (4,))
        stand_in(backend, patches)
        ports = services(count, endpoints)
        state = node_state(ports, 1)
        backend.sync(node_state([], 0), Changes(full=True, reason="initial"))
        started = time.process_time()
        backend.sync(state, Changes(services=frozenset(state.services), full=True,
                                    reason="initial"))
        full = time.process_time() - started
        changed_state, changes = one_endpoint_changed(ports)
        started = time.process_time()
        backend.sync(changed_state, changes)
        return full, time.process_time() - started
    finally:
        patches.undo()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--backends", default="ipvs,iptables")
    parser.add_argument("--stand-in", action="store_true",
                        help="the ipvs backend on this host's in-memory stand-in kernel")
    args = parser.parse_args()
    guest = "in the IPVS guest (TCG)" if os.environ.get("SVCPROXY_IPVS_GUEST") else "on the host"
    if args.stand_in:
        guest, args.backends = "on the host's stand-in kernel, CPU time", "ipvs"
    print(f"# services x {args.endpoints} endpoints, {guest}")
    print(f"{'backend':<9} {'services':>8} {'full sync s':>12} {'1 endpoint change ms':>21}")
    for size in (int(s) for s in args.sizes.split(",")):
        for name in args.backends.split(","):
            if args.stand_in:
                full, one = measure_stand_in(size, args.endpoints)
            else:
                full, one = measure(name, size, args.endpoints)
            print(f"{name:<9} {size:>8} {full:>12.2f} {one * 1000:>21.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
