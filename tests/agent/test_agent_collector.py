"""The cyclic collector around a cold start: off from the process's start (``svcproxy
frontend`` and ``svcproxy backend``, before their imports) to the first sync (what a cold
start loads lives on), then the loaded state is frozen and collection resumes; never
left off when the first sync does not come."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from svcproxy import collector
from svcproxy.model import NodeInfo
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.config import NodeConfig
from tests.support.paths import REPO
from tests.support.running_agent import dump_agent
from tests.support.waiting import wait_for

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


# ``svcproxy frontend`` counting the collections from its command's start: when it syncs it
# prints them, then whether collection resumed and how much of the heap was frozen.
FRONTEND_PROCESS = """
import gc, json, logging, sys, threading, time
from svcproxy.cli import main
count = [0]
gc.callbacks.append(lambda phase, info: phase == "start" and count.__setitem__(0, count[0] + 1))
def report(before):
    deadline = time.monotonic() + 30
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps({"collections": before, "enabled": gc.isenabled(),
                      "frozen": gc.get_freeze_count()}), flush=True)
class Synced(logging.Handler):
    def emit(self, record):
        if "frontend synced" in record.getMessage():
            threading.Thread(target=report, args=(count[0],), daemon=True).start()
logging.getLogger().addHandler(Synced())
logging.getLogger().setLevel(logging.INFO)
count[0] = 0
sys.exit(main(sys.argv[1:]))
"""


def test_the_frontend_collects_nothing_from_its_start_to_its_sync(tmp_path: Path) -> None:
    """``svcproxy frontend`` ran ~120 collections before its sync (its imports, then the
    listed pages held until the engine was made): 0.1-0.4 s of a 2.4 s cold start at
    10,000 services. None now, and collection resumes after the sync."""
    from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig

    fake = FakeApiserver(token="t")
    try:
        for i in range(50):
            fake.create("Service", {"metadata": {"name": f"s{i}", "namespace": "default"},
                                    "spec": {"clusterIP": f"10.96.0.{i + 1}",
                                             "ports": [{"port": 80}]}})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t")
        proc = subprocess.Popen(
            [sys.executable, "-c", FRONTEND_PROCESS, "frontend", f"--kubeconfig={kubeconfig}",
             f"--listen=unix://{tmp_path / 'api.sock'}", "--metrics-bind-address="],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=REPO)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
        finally:
            proc.kill()
            proc.wait(30)
    finally:
        fake.close()
    assert line, "the frontend ended before syncing"
    seen = json.loads(line)
    assert seen["collections"] == 0, f"{seen['collections']} collections before the sync"
    assert seen["enabled"], "collection did not resume after the sync"
    assert seen["frozen"] > 10000, "the loaded state was not frozen out of the collector"


def test_the_backend_command_pauses_before_its_imports() -> None:
    from svcproxy.cli import main

    gc.enable()
    with pytest.raises(SystemExit) as exited:
        main(["backend", "--version"])
    assert exited.value.code == 0
    assert not gc.isenabled(), "the backend command left the collector on"
