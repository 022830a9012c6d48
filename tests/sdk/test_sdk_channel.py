"""The SDK's connection to the frontend: quiet while it receives.

A node's client that answered every batch (gRPC's bandwidth-probing PING) would cost
the frontend a read, a PING ack and two thread wake-ups per node and change: with a
thousand nodes that doubled the frontend's CPU per change.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from svcproxy.frontend.sources.events import Upsert
from svcproxy.sdk.client import NodeStateClient
from tests.support.examples import copy_examples, web_slice
from tests.support.waiting import wait_for

BATCHES = 20


def bytes_sent_to(port: int) -> int:
    """Payload bytes the client side of the one connection to ``port`` has sent."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    sent = re.findall(r"bytes_sent:(\d+)", out)
    assert len(sent) == 1, f"expected one connection to port {port}: {out}"
    return int(sent[0])


def test_a_watching_node_sends_nothing_per_batch(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path), listen="127.0.0.1:0")
    port = fe.frontend.port
    client = NodeStateClient(f"127.0.0.1:{port}", "node-a")
    client.start()
    try:
        wait_for(client.has_changes)
        client.take()
        before = bytes_sent_to(port)
        for n in range(BATCHES):
            fe.submit([Upsert("EndpointSlice", web_slice(n % 3 + 1))])
            wait_for(lambda: client.revision == fe.engine.changelog.revision)
        sent = bytes_sent_to(port) - before
        # A PING frame is 17 bytes: one per batch would be 340.
        print("SENT", sent)
        assert sent < 17 * BATCHES // 2, f"the client sent {sent} bytes for {BATCHES} batches"
    finally:
        client.stop()
