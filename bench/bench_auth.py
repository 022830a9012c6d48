"""What authentication costs a call: unary and Watch, side by side in one run.

    .venv/bin/python bench/bench_auth.py [--calls 400] [--watches 200]

Five frontends (each its own process, serving the example cluster on loopback):
plaintext without authentication, ServiceAccount tokens with the review cached, tokens
reviewed on every call (TokenReview and the pod read, against the stand-in apiserver
in this process through the official client), TLS without client certificates, and
mutual TLS with a node certificate. One client per frontend makes GetNodeState calls
and opens Watch streams (until the first message) on one connection, and prints the
median and p99 per call and the ratio to plaintext.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from svcproxy.cli.devcerts import CA  # noqa: E402
from svcproxy.v1 import nodestate_pb2 as pb  # noqa: E402
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc  # noqa: E402
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "svcproxy.cli", "frontend", "--manifests",
         str(ROOT / "examples" / "cluster"), "--listen", f"127.0.0.1:{port}",
         "--metrics-bind-address", "", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"localhost:{port}"


def timed(call: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return out


class Client:
    """One connection to one frontend, timing its calls."""

    def __init__(self, target: str, creds: grpc.ChannelCredentials | None,
                 metadata: tuple) -> None:
        self.channel = (grpc.secure_channel(target, creds) if creds
                        else grpc.insecure_channel(target))
        self.stub = pb_grpc.NodeStateServiceStub(self.channel)
        self.metadata = metadata
        self.unary_times: list[float] = []
        self.watch_times: list[float] = []

    def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                self.unary()
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def unary(self) -> None:
        self.stub.GetNodeState(pb.GetNodeStateRequest(node_name="node-a"),
                               metadata=self.metadata, timeout=10)

    def watch(self) -> None:
        call = self.stub.Watch(pb.WatchRequest(node_name="node-a"), metadata=self.metadata,
                               timeout=10)
        next(call)
        call.cancel()

    def round(self, calls: int, watches: int) -> None:
        self.unary_times += timed(self.unary, calls)
        self.watch_times += timed(self.watch, watches)


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--watches", type=int, default=200)
    opts = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    api = FakeApiserver(token="frontend")
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", api.url, "frontend")
    pod = api.create("Pod", {"metadata": {"name": "backend-a", "namespace": "svcproxy"},
                             "spec": {"nodeName": "node-a"}})
    token = api.tokens.issue("svcproxy", "svcproxy-backend", audiences=("svcproxy",), pod=pod)
    bearer = (("authorization", f"Bearer {token}"),)
    ca = CA(tmp, "ca")
    server = ca.issue("server", "frontend", server=True)
    node = ca.issue("node-a", "system:node:node-a", ("system:nodes",))
    tls_args = ["--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    token_args = ["--token-audience", "svcproxy", "--authentication-kubeconfig",
                  str(kubeconfig)]
    server_only = grpc.ssl_channel_credentials(ca.file.read_bytes())
    mutual = grpc.ssl_channel_credentials(ca.file.read_bytes(), *node.pem())
    variants: dict[str, tuple[list[str], grpc.ChannelCredentials | None, tuple]] = {
        "plaintext, anonymous": ([], None, ()),
        "token, review cached": ([*token_args, "--token-cache-ttl", "60"], None, bearer),
        "token, reviewed per call": ([*token_args, "--token-cache-ttl", "0"], None, bearer),
        "TLS, anonymous": (tls_args, server_only, ()),
        "mutual TLS, node cert": ([*tls_args, "--tls-client-ca", str(ca.file)], mutual, ()),
    }
    procs = []
    try:
        clients = {}
        for name, (args, creds, metadata) in variants.items():
            proc, target = start(args)
            procs.append(proc)
            clients[name] = Client(target, creds, metadata)
        for client in clients.values():
            client.ready()
            timed(client.unary, 20)
        rounds = 20  # interleaved, so a busy moment of the machine hits every variant
        for _ in range(rounds):
            for client in clients.values():
                client.round(opts.calls // rounds, opts.watches // rounds)
        base = clients["plaintext, anonymous"]
        base_u, base_w = statistics.median(base.unary_times), statistics.median(base.watch_times)
        print(f"{'':28} {'GetNodeState p50/p99 (us)':>28} {'x':>6} "
              f"{'Watch to 1st msg p50/p99 (us)':>32} {'x':>6}")
        for name, c in clients.items():
            unary, watch = c.unary_times, c.watch_times
            print(f"{name:28} {p(unary, .5):13.0f} / {p(unary, .99):9.0f}    "
                  f"{statistics.median(unary) / base_u:6.2f} {p(watch, .5):17.0f} / "
                  f"{p(watch, .99):9.0f}    {statistics.median(watch) / base_w:6.2f}")
        print(f"TokenReviews answered by the stand-in apiserver: {api.tokens.reviews}")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        api.close()


if __name__ == "__main__":
    main()
