"""The SDK survives a frontend restart and converges without restarting the backend."""

from __future__ import annotations

from pathlib import Path

from svcproxy.sdk.client import NodeStateClient
from tests.support.examples import WEB, copy_examples
from tests.support.lab.processes import frontend
from tests.support.waiting import wait_for


def test_backend_state_converges_across_frontend_restart(tmp_path: Path) -> None:
    d = copy_examples(tmp_path)
    sock = tmp_path / "api.sock"
    proc = frontend(d, sock, tmp_path / "frontend.log").start()
    client = NodeStateClient(f"unix://{sock}", "node-a", max_backoff=0.5)
    client.start()
    try:
        wait_for(client.has_changes, timeout=20)
        state, _ = client.take()  # type: ignore[misc]
        assert len(state.services[WEB].endpoints) == 3
        proc.stop()
        wait_for(lambda: not client.connected)
        # While the frontend is down the cluster changes: one web pod goes away.
        web = d / "web.yaml"
        text = web.read_text()
        cut = text.index("- addresses: [10.244.2.10]")
        web.write_text(text[:cut])
        (d / "api.yaml").unlink()
        proc = frontend(d, sock, tmp_path / "frontend.log").start()
        wait_for(lambda: client.connected and client.has_changes(), timeout=20)
        state, changes = client.take()  # type: ignore[misc]
        # A restarted frontend cannot resume: the SDK rebuilds from its snapshot, and the
        # backend is handed only what differs (no full sync, nothing else rewritten).
        assert not changes.full
        assert {k.name for k in changes.services} == {"web", "api"}
        assert set(state.services[WEB].endpoints) == {"10.244.1.10", "10.244.1.11"}
        assert not any(k.name == "api" for k in state.services)
        assert client.resets == 1
    finally:
        client.stop()
        proc.stop()
