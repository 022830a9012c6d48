"""A node agent run on a thread for a test, and one with the dump backend writing to a buffer."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from svcproxy.backends.dump.backend import DumpBackend
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent
from svcproxy.sdk.testing import FakeSource


@contextmanager
def running(agent: NodeAgent) -> Iterator[NodeAgent]:
    """``agent`` runs on a thread until the block ends; then it is stopped and closed."""
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(5)
        agent.close()


class DumpAgent(NamedTuple):
    source: FakeSource
    agent: NodeAgent
    out: io.StringIO


@contextmanager
def dump_agent(config: NodeConfig) -> Iterator[DumpAgent]:
    """A running agent fed by a FakeSource, its dump backend's lines written to ``out``
    (no health-check node ports)."""
    source, out = FakeSource(), io.StringIO()
    agent = NodeAgent(source, DumpBackend(out), config, health_check_node_ports=False,
                      poll=0.02)
    with running(agent):
        yield DumpAgent(source, agent, out)
