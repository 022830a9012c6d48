"""End to end: churn at full speed through the stand-in apiserver, the real frontend and
real SDK watchers (live, lagging at the gRPC level, cut and restored, across a frontend
restart) - every watcher ends equal to GetNodeState, which equals what the objects say."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.churn import NODES, Churn, Relay, SlowWatcher, all_exact, sdk_state
from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
from tests.support.waiting import wait_for

CHANGES = 2000


def test_every_watcher_ends_exact_after_churn_cuts_and_a_restart(
        frontend_factory: Callable[..., Any], tmp_path: Path) -> None:
    fake = FakeApiserver(bookmark_interval=0.2)
    churn = Churn(fake, services=40, seed=11)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url)
    fe = frontend_factory(None, kubeconfig=str(kubeconfig))
    sock = fe.opts.listen.removeprefix("unix://")
    live, cut = Relay(sock), Relay(sock)
    watched = ["n1", "n2", "n4"]
    clients = [NodeStateClient(f"127.0.0.1:{relay.port}", node, max_backoff=0.2)
               for relay in (live, cut) for node in watched]
    cluster = NodeStateClient(f"127.0.0.1:{cut.port}", "", cluster=True, max_backoff=0.2)
    slow = [SlowWatcher(f"127.0.0.1:{live.port}", node, pause=0.01) for node in ("n1", "n3")]
    try:
        for client in clients + [cluster]:
            client.start()
        wait_for(lambda: all(c.take() is not None for c in clients), timeout=20)
        start = time.monotonic()
        for i in range(CHANGES):
            churn.step()
            if i % 250 == 100:
                cut.cut()
            elif i % 250 == 200:
                cut.restore()
            if i == CHANGES // 2:
                # The frontend restarts: every watcher resumes against a new instance.
                fe.stop()
                fe = frontend_factory(None, kubeconfig=str(kubeconfig))
                sock = fe.opts.listen.removeprefix("unix://")
                live.target = cut.target = sock
                live.cut()
                live.restore()
        cut.restore()
        rate = CHANGES / (time.monotonic() - start)
        watchers: dict[str, list[Callable[[], Any]]] = {n: [] for n in NODES}
        for client in clients:
            watchers[client.node_name].append(lambda c=client: sdk_state(c))
        for watcher in slow:
            watchers[watcher.node].append(watcher.state)
        target = f"127.0.0.1:{live.port}"
        wait_for(lambda: all_exact(fake, target, watchers), timeout=40, interval=0.5)
        # The cluster watcher holds every node the apiserver has, as objects say.
        nodes = set(n for _, n in fake.objects("Node"))
        wait_for(lambda: set(cluster.nodes()) == nodes, timeout=10)
        assert rate > 50, f"only {rate:.0f} changes/s"
        assert all(c.mismatches == 0 for c in clients + [cluster])
        assert all(w.digest_errors == 0 for w in slow)
    finally:
        for client in clients + [cluster]:
            client.stop()
        for watcher in slow:
            watcher.stop()
        live.close()
        cut.close()
        fake.close()


def test_a_diverged_sdk_counts_it_and_heals_with_a_snapshot(
        frontend_factory: Callable[..., Any], tmp_path: Path) -> None:
    """A future bug that loses an op is seen (digest) and healed (snapshot)."""
    fake = FakeApiserver(bookmark_interval=0.2)
    churn = Churn(fake, services=5, seed=3)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url)
    fe = frontend_factory(None, kubeconfig=str(kubeconfig))
    client = NodeStateClient(fe.opts.listen, "n1", max_backoff=0.2)
    seen: list[str] = []
    client.on_mismatch = seen.append
    apply_op = client._apply_op
    lost: list[pb.Op] = []

    def buggy(op: pb.Op) -> None:
        # Dropped as a bug would, until the client sees it: a loss that a later op of the
        # same batch undoes (the port re-created, say) leaves nothing to see.
        if not client.mismatches and op.WhichOneof("op") in (
                "set_endpoint", "delete_endpoint", "set_service"):
            lost.append(op)
            return
        apply_op(op)

    client._apply_op = buggy  # type: ignore[method-assign]
    try:
        client.start()
        wait_for(lambda: client.take() is not None, timeout=20)
        resets = client.resets
        for _ in range(200):
            churn.step()
        target = fe.opts.listen
        wait_for(lambda: client.resets > resets and all_exact(
            fake, target, {"n1": [lambda: sdk_state(client)]}), timeout=30, interval=0.3)
        assert lost and client.mismatches >= 1 and seen == ["n1"] * client.mismatches
    finally:
        client.stop()
        fake.close()
