"""``svcproxy backend ebpf`` as a process, fed by the real frontend: kill -9 during
traffic loses no connection, a restarted backend adopts the kernel's maps, --dump
prints them, /metrics shows their sizes, --cleanup removes every link and pin."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ebpf_sockets import EPS4, NODE_IP, PORT, SocketWorld, marks
from tests.support.lab.netns import enter
from tests.support.world_fixture import running

pytestmark = marks()

SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]
# A hammer stops when the test says so; the limit only bounds a test that never does.
HAMMER_LIMIT = 1_000_000
# Connections the hammer must complete after the kill: the traffic outlasts it.
AFTER_KILL = 300

# The hammer: a process in the test's cgroup connecting (and reading the greeting) in a
# loop on a thread of its own, from "start" until "stop"; "count" says how many so far.
HAMMER = r"""
import collections, json, socket, sys, threading
stop, seen, done = threading.Event(), collections.Counter(), [0]
def once(host, port):
    with socket.socket() as s:
        s.settimeout(2.0)
        try:
            s.connect((host, port))
            return s.recv(2048).decode().split()[0]
        except OSError as e:
            return {111: "refused", 101: "unreachable", 113: "unreachable"}.get(
                e.errno, "timeout" if isinstance(e, TimeoutError) else str(e))
def loop(host, port, limit):
    while not stop.is_set() and done[0] < limit:
        seen[once(host, port)] += 1
        done[0] += 1
for line in sys.stdin:
    c = json.loads(line)
    if c["op"] == "start":
        worker = threading.Thread(target=loop, args=(c["host"], c["port"], c["limit"]))
        worker.start()
        out = {"ok": True}
    elif c["op"] == "count":
        out = {"count": done[0], "running": worker.is_alive()}
    else:
        stop.set()
        worker.join()
        out = {"count": done[0], "seen": dict(seen)}
    print(json.dumps(out), flush=True)
"""


def _manifests(directory: Path, endpoints: list[str]) -> None:
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": "node1", "labels": {"kubernetes.io/hostname": "node1"}},
         "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "t"},
         "spec": {"type": "ClusterIP", "clusterIP": "10.96.1.1", "clusterIPs": ["10.96.1.1"],
                  "ipFamilies": ["IPv4"],
                  "ports": [{"name": "http", "port": 80, "targetPort": PORT,
                             "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "web-1", "namespace": "t",
                      "labels": {"kubernetes.io/service-name": "web"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
         "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "nodeName": "node1"}
                       for ip in endpoints]},
    ]
    tmp = directory / ".web.tmp"
    tmp.write_text(yaml.safe_dump_all(docs))
    os.replace(tmp, directory / "web.yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Hammer:
    """Connections to one service address until stopped (``HAMMER``), from a process
    moved into ``cgroup`` before it makes any socket."""

    def __init__(self, ns: str, cgroup: Path) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-u", "-c", HAMMER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        (cgroup / "cgroup.procs").write_text(f"{self.proc.pid}\n")

    def call(self, **command: Any) -> Any:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "hammer process died"
        return json.loads(line)

    def wait_count(self, at_least: int, timeout: float = 120.0) -> int:
        """Block until ``at_least`` connections are done (the hammer still running)."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.call(op="count")
            assert now["running"], f"the hammer stopped by itself at {now['count']}"
            if now["count"] >= at_least:
                return int(now["count"])
            assert time.monotonic() < deadline, f"{now['count']} of {at_least} connections"
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


class BackendProcess:
    def __init__(self, world: SocketWorld, api: str, log: Path) -> None:
        self.world, self.api, self.log = world, api, log
        self.metrics_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self, *extra: str) -> list[str]:
        w = self.world
        # nsenter, not ip netns exec: that one remounts /sys, hiding the test's cgroup.
        return ["nsenter", f"--net=/var/run/netns/{w.ns}", *SVCPROXY, "backend", "ebpf",
                "--api", self.api,
                "--node-name", "node1", "--node-ip", NODE_IP, "--min-sync-period", "0",
                "--healthz-bind-address", "",
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--ebpf-cgroup", str(w.cgroup), "--ebpf-pin-dir", str(w.layout.pin_dir),
                *extra]

    def start(self) -> BackendProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=out)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(10)

    def run(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*extra), capture_output=True, text=True, timeout=60)

    def metrics(self) -> str:
        box: dict[str, str] = {}

        def scrape() -> None:
            enter(self.world.ns)
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    box["text"] = r.read().decode()
            except OSError as err:  # not listening yet (a restart): nothing to read
                box["text"] = f"no metrics: {err}"

        t = threading.Thread(target=scrape)
        t.start()
        t.join()
        return box["text"]


def eventually(check: Callable[[], Any], timeout: float = 20.0, why: Callable[[], str] = str,
               ) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError as err:
            if time.monotonic() > deadline:
                raise AssertionError(f"{err}\n{why()}") from None
            time.sleep(0.1)


@pytest.fixture
def world() -> Iterator[SocketWorld]:
    yield from running(SocketWorld(in_process=False))


def test_kill_restart_dump_metrics_cleanup(world: SocketWorld, tmp_path: Path,
                                           frontend_factory: Callable[..., Any]) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _manifests(manifests, EPS4[:2])
    fe = frontend_factory(manifests)
    backend = BackendProcess(world, fe.opts.listen, tmp_path / "backend.log")
    hammer = Hammer(world.ns, world.cgroup)
    client = world.client
    assert client is not None
    logs = lambda: backend.log.read_text()  # noqa: E731
    try:
        backend.start()

        def serves(expected: set[str]) -> None:
            seen = client.names("tcp", "10.96.1.1", count=20)
            assert set(seen) == expected, seen

        eventually(lambda: serves(set(EPS4[:2])), why=logs)
        # The nft backend runs in the same agent for the packet path (the default).
        def nft_programmed() -> None:
            tables = subprocess.run(["ip", "netns", "exec", world.ns, "nft", "list", "tables"],
                                    capture_output=True, text=True).stdout
            assert "ip svcproxy" in tables, tables

        eventually(nft_programmed, why=logs)
        held = [client.call(op="hold", id=str(i), host="10.96.1.1", port=80)["name"]
                for i in range(4)]
        hammer.call(op="start", host="10.96.1.1", port=80, limit=HAMMER_LIMIT)
        hammer.wait_count(1)  # the traffic has started
        backend.kill()  # kill -9 in the middle of the traffic
        at_kill = hammer.wait_count(1)
        hammer.wait_count(at_kill + AFTER_KILL)  # the traffic outlasts the kill
        results = hammer.call(op="stop")
        assert results["count"] < HAMMER_LIMIT, "the hammer ran until the test stopped it"
        assert set(results["seen"]) <= set(EPS4[:2]), results
        assert [client.call(op="ping", id=str(i))["name"] for i in range(4)] == held

        dump = backend.run("--dump")
        assert dump.returncode == 0, dump.stderr
        assert "10.96.1.1:80/tcp -> 10.244.0.1:8080 10.244.0.2:8080" in dump.stdout, dump.stdout

        backend.start()  # adopts the pinned maps and links
        _manifests(manifests, EPS4[2:])
        eventually(lambda: serves(set(EPS4[2:])), why=logs)
        assert [client.call(op="ping", id=str(i))["name"] for i in range(4)] == held

        text = eventually(lambda: _has(backend.metrics(), 'svcproxy_ebpf_map_entries'
                                       '{map="sp_services"} 1.0'), why=logs)
        assert 'svcproxy_ebpf_map_entries{map="sp_endpoints"} 2.0' in text
        assert 'svcproxy_ebpf_map_update_failures_total{map="sp_services"} 0.0' in text

        backend.kill(signal.SIGTERM)
        done = backend.run("--cleanup")
        assert done.returncode == 0, done.stderr
        assert not world.layout.pin_dir.exists(), "every pin is gone"
        if shutil.which("bpftool"):
            shown = subprocess.run(["bpftool", "cgroup", "show", str(world.cgroup)],
                                   capture_output=True, text=True, check=True).stdout
            assert "sp_" not in shown and not shown.strip(), shown
        assert set(client.names("tcp", "10.96.1.1", count=3)) == {"unreachable"}
        tables = subprocess.run(["ip", "netns", "exec", world.ns, "nft", "list", "tables"],
                                capture_output=True, text=True).stdout
        assert "svcproxy" not in tables, "--cleanup removed the nft tables too"
    finally:
        backend.kill()
        hammer.stop()


def _has(text: str, line: str) -> str:
    assert line in text, text
    return text
