"""The cyclic collector around a backend's cold start: off from the agent's start to its
first sync (what a cold start loads lives on), then the loaded state is frozen and
collection resumes; never left off when the first sync does not come."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from svcproxy.agent import collector
from svcproxy.agent.config import NodeConfig
from svcproxy.model import NodeInfo
from svcproxy.sdk.backend import NodeState
from tests.conftest import wait_for
from tests.running_agent import dump_agent

CONFIG = NodeConfig(node_name="node1", node_ips=("192.168.50.2",))


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    collector.resume_collector_after_start()
    gc.unfreeze()
    if was:
        gc.enable()


def test_paused_from_the_start_to_the_first_sync_then_the_loaded_state_frozen() -> None:
    gc.enable()
    collector.pause_collector_for_start()
    assert not gc.isenabled()
    with dump_agent(CONFIG) as running:
        time.sleep(0.1)
        assert not gc.isenabled(), "collection resumed before the first sync"
        loaded = [object() for _ in range(1000)]
        running.source.push(NodeState("node1", 1, NodeInfo("node1"), {}), [])
        wait_for(gc.isenabled, timeout=30)
        assert gc.get_freeze_count() >= len(loaded)


def test_a_collector_already_off_is_left_off() -> None:
    gc.disable()
    collector.pause_collector_for_start()
    collector.resume_collector_after_start()
    assert not gc.isenabled()


def test_resumed_after_the_limit_when_no_sync_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "START_PAUSE_LIMIT", 0.05)
    gc.enable()
    collector.pause_collector_for_start()
    assert not gc.isenabled()
    deadline = time.monotonic() + 5
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gc.isenabled()
