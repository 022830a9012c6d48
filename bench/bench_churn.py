"""Churn benchmark: changes of every kind at full speed, every watcher exact at the end.

    .venv/bin/python bench/bench_churn.py [--services 200] [--changes 5000]
        [--watchers 3] [--slow 2] [--cuts 10] [--stream-workers 1] [--restarts 0]

The stand-in apiserver (tests/support/fakeapiserver.py) and the watchers run in this process;
the frontend runs as ``svcproxy frontend --kubeconfig`` in its own process, as in
production. Watchers: ``--watchers`` live SDK NodeStateClients per node (one node of
each kind: with local endpoints, in another zone, not a Node), the same number again
through a TCP relay cut and restored ``--cuts`` times during the churn, and ``--slow``
raw gRPC streams sleeping 10 ms between reads. With ``--stream-workers N`` the frontend
serves on TCP with N processes (the watchers spread over them); ``--restarts K`` kills
the frontend (SIGKILL) K times during the churn and starts it again. Changes
(tests/support/churn.py): services re-created with new slices, updated, deleted; slices with
endpoints added and removed, readiness and terminating flips, port changes; nodes added,
re-zoned, deleted. Prints:

- changes per second made (the driver), and end to end: from the first change until
  every watcher is exact;
- time from the last change to every watcher equal to GetNodeState equal to what a
  fresh engine computes from the objects (polled every 50 ms);
- state-digest mismatches the watchers saw (0 expected).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.sdk.client import NodeStateClient, open_channel  # noqa: E402
from svcproxy.v1 import nodestate_pb2 as pb  # noqa: E402
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.churn import (  # noqa: E402
    NODES,
    Churn,
    Relay,
    SlowWatcher,
    all_exact,
    differences,
    get_node_state,
    sdk_state,
)
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig  # noqa: E402


def start_frontend(kubeconfig: Path, listen: str, workers: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--kubeconfig", str(kubeconfig),
         "--listen", listen, "--metrics-bind-address", "", "--stream-workers", str(workers)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def last_revision(target: str) -> int:
    """The frontend's revision, as GetNodeState answers it."""
    with open_channel(target) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        return int(stub.GetNodeState(pb.GetNodeStateRequest(node_name="n1", page_size=1),
                                     timeout=30).revision)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> float:
    """Seconds until ``predicate()`` held (raises after ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if predicate():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - the frontend may still be starting
            pass
        time.sleep(interval)
    raise SystemExit(f"not exact within {timeout} s")


def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-churn-"))
    fake = FakeApiserver(bookmark_interval=0.5)
    churn = Churn(fake, services=args.services, seed=args.seed)
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", fake.url)
    sock = tmp / "api.sock"
    if args.stream_workers > 1:
        target = relayed = f"127.0.0.1:{free_port()}"
    else:
        target, relayed = f"unix://{sock}", str(sock)
    proc = start_frontend(kubeconfig, target, args.stream_workers)
    wait(lambda: get_node_state(target, "n1") is not None, 30)
    cut = Relay(relayed)
    watched = ["n1", "n2", "n4"]
    clients = [NodeStateClient(t, node, max_backoff=0.2)
               for t in (target, f"127.0.0.1:{cut.port}") for node in watched
               for _ in range(args.watchers)]
    slow = [SlowWatcher(target, NODES[i % 3], pause=0.01) for i in range(args.slow)]
    try:
        for client in clients:
            client.start()
        wait(lambda: all(c.take() is not None for c in clients), 60)
        every = max(1, args.changes // (2 * args.cuts + 1))
        restart_every = args.changes // (args.restarts + 1) if args.restarts else 0
        start = time.monotonic()
        for i in range(args.changes):
            churn.step()
            if (i + 1) % every == 0:
                (cut.restore if not cut.open else cut.cut)()
            if restart_every and (i + 1) % restart_every == 0 and i + 1 < args.changes:
                proc.kill()
                proc.wait(10)
                proc = start_frontend(kubeconfig, target, args.stream_workers)
        end = time.monotonic()
        cut.restore()
        watchers: dict[str, list[Callable[[], Any]]] = {n: [] for n in NODES}
        for client in clients:
            watchers[client.node_name].append(lambda c=client: sdk_state(c))
        for watcher in slow:
            watchers[watcher.node].append(watcher.state)
        try:
            settle = wait(lambda: all_exact(fake, target, watchers), args.settle_timeout)
        except SystemExit:
            print("\n".join(differences(fake, target, watchers)))
            # Behind (still reading what gRPC buffered) or wrong for good: the revisions say.
            print("revisions behind GetNodeState's: SDK " + " ".join(
                f"{c.node_name}:{last_revision(target) - c.revision}" for c in clients)
                + "; slow " + " ".join(f"{w.node}:{last_revision(target) - w.doc.revision}"
                                       for w in slow))
            raise
        mismatches = sum(c.mismatches for c in clients) + sum(w.digest_errors for w in slow)
        print(f"{args.changes} changes over {args.services} services "
              f"({args.stream_workers} stream processes, {args.restarts} restarts): "
              f"{args.changes / (end - start):.0f} changes/s made; "
              f"{len(clients) + len(slow)} watchers ({len(clients) // 2} live, "
              f"{len(clients) // 2} cut {args.cuts} times, {len(slow)} slow readers)")
        total = end - start + settle
        print(f"first change -> every watcher exact: {total:.1f} s, {args.changes / total:.0f} "
              "changes/s end to end")
        print(f"last change -> every watcher exact: {settle * 1000:.0f} ms "
              f"(includes one GetNodeState per node and a fresh engine's computation "
              f"per poll); digest mismatches: {mismatches}")
    finally:
        for client in clients:
            client.stop()
        for watcher in slow:
            watcher.stop()
        cut.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            print("the frontend did not stop within 30 s of SIGTERM: killed")
            proc.kill()
            proc.wait(10)
        fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--changes", type=int, default=5000)
    parser.add_argument("--watchers", type=int, default=3,
                        help="live SDK watchers per watched node (as many again cut)")
    parser.add_argument("--slow", type=int, default=2, help="slow raw gRPC readers")
    parser.add_argument("--cuts", type=int, default=10, help="times the relay is cut")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stream-workers", type=int, default=1,
                        help="frontend processes serving streams (more than 1: on TCP)")
    parser.add_argument("--settle-timeout", type=float, default=120.0,
                        help="seconds after the last change for every watcher to be exact "
                        "(slow readers at thousands of services take minutes: each reads "
                        "what gRPC buffered for it, 16 MB, at 100 messages a second)")
    parser.add_argument("--restarts", type=int, default=0,
                        help="times the frontend is killed and started again")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    run(args)


if __name__ == "__main__":
    main()
