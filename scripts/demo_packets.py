"""The real-packet demo: network namespaces, the frontend on examples/cluster,
the nft backend on node-a, and a client pod whose requests to the ``shop/web``
ClusterIP spread across the pods; then a manifest edit scales one pod away and
the spread changes, with nothing restarted. Everything is removed at the end.

Run as root: .venv/bin/python scripts/demo_packets.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.lab.client import probe, summarize  # noqa: E402
from tests.support.lab.echo import EchoServer  # noqa: E402
from tests.support.lab.plan import SERVER_PORTS, LabSpec, NodeSpec, PodSpec  # noqa: E402
from tests.support.lab.processes import Process, backend_argv, frontend, wait_for_path  # noqa: E402
from tests.support.lab.topology import Lab  # noqa: E402

CLUSTER_IP, PORT, REQUESTS = "10.96.0.10", 80, 60
SCALED_AWAY = "10.244.1.11"


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def lab_spec() -> LabSpec:
    """Nodes and pods at the addresses examples/cluster/web.yaml uses."""
    a, b = NodeSpec("node-a", 1), NodeSpec("node-b", 2)
    pods = (PodSpec("web-a1", a, 10), PodSpec("web-a2", a, 11), PodSpec("web-b1", b, 10),
            PodSpec("client", a, 50))
    return LabSpec((a, b), pods, entry="node-a")


def spread(lab: Lab) -> Counter[str]:
    """Who answers ``REQUESTS`` fresh connections from the client pod to the ClusterIP."""
    seen = summarize(probe(lab.ns("client"), "tcp", CLUSTER_IP, PORT, REQUESTS))
    return Counter(dict(seen.names, **{f"({e})": n for e, n in seen.errors.items()}))


def show(counts: Counter[str]) -> None:
    for name, n in sorted(counts.items()):
        print(f"   {name:8} {n:3}  {'#' * n}")


def wait_for_spread(lab: Lab, want: set[str], timeout: float = 30) -> Counter[str]:
    deadline = time.monotonic() + timeout
    while True:
        counts = spread(lab)
        if set(counts) == want or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def scale_away(manifests: Path, address: str) -> None:
    """Remove one endpoint from web.yaml's EndpointSlice, as a scale-down would."""
    path = manifests / "web.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if doc.get("kind") == "EndpointSlice":
            doc["endpoints"] = [e for e in doc["endpoints"] if address not in e["addresses"]]
    tmp = manifests / ".web.yaml.tmp"
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    os.replace(tmp, path)


def main() -> int:
    if os.geteuid() != 0 or shutil.which("nft") is None:
        print("demo_packets: needs root and nft (network namespaces and nftables)")
        return 1
    lab = Lab(lab_spec())
    work = Path(tempfile.mkdtemp(prefix=f"sp{lab.tag}-demo-"))
    manifests = work / "manifests"
    shutil.copytree(ROOT / "examples" / "cluster", manifests)
    servers: list[EchoServer] = []
    procs: list[Process] = []
    try:
        say("Building the lab: namespaces node-a, node-b, pods web-a1, web-a2, web-b1, client")
        lab.build()
        servers = [EchoServer(lab.ns(p.name), p.name, SERVER_PORTS).start() for p in lab.spec.pods]
        sock = work / "api.sock"
        say(f"Frontend on a copy of examples/cluster, serving unix://{sock}")
        procs.append(frontend(manifests, sock, work / "frontend.log").start())
        wait_for_path(sock, process=procs[0])
        say("nft backend on node-a (inside its namespace)")
        argv = backend_argv(lab.ns("node-a"), "nft", f"unix://{sock}", "node-a",
                            ("--metrics-bind-address", "", "--healthz-bind-address", ""))
        procs.append(Process(argv, work / "backend.log").start())

        pods = {"web-a1", "web-a2", "web-b1"}
        say(f"{REQUESTS} connections from pod 'client' to shop/web at {CLUSTER_IP}:{PORT}")
        show(wait_for_spread(lab, pods))
        listing = subprocess.run(
            ["ip", "netns", "exec", lab.ns("node-a"), "nft", "list", "map", "ip", "svcproxy",
             "service-ips"], capture_output=True, text=True).stdout
        print("\n   the dispatch map in node-a's kernel:")
        print("\n".join(f"   {line}" for line in listing.splitlines() if " : " in line))

        say(f"Editing web.yaml: endpoint {SCALED_AWAY} (web-a2) scaled away")
        scale_away(manifests, SCALED_AWAY)
        start = time.monotonic()
        counts = wait_for_spread(lab, pods - {"web-a2"})
        print(f"   new spread, {time.monotonic() - start:.1f} s after the edit "
              "(nothing restarted):")
        show(counts)
        return 0 if set(counts) == pods - {"web-a2"} else 1
    finally:
        say("Cleaning up: processes, namespaces, files")
        for proc in reversed(procs):
            proc.stop()
        for server in servers:
            server.stop()
        lab.destroy()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
