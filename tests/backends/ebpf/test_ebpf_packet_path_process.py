"""``svcproxy backend ebpf --ebpf-packet-path bpf`` as a process in node1's namespace of
the two-node lab, fed by the real frontend: NodePorts from the LAN reach endpoints on
both nodes with no nftables or iptables rule in the node, kill -9 during traffic breaks
no flow, the restarted backend adopts the pinned maps and links and applies a change,
and --cleanup removes the tc links and every pin.

Everything made here (namespaces, cgroup, bpffs mount, pins, links, processes) is
removed at the end, also when the test fails.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from svcproxy.backends.ebpf import libbpf
from svcproxy.backends.ebpf.packet_loader import _tcx_info
from tests.backends.ebpf.test_ebpf_process import eventually
from tests.support import packet_path
from tests.support.lab import manifests as m
from tests.support.lab.client import probe, summarize
from tests.support.lab.echo import EchoServer
from tests.support.lab.netns import call_in, ns_exec
from tests.support.lab.topology import Lab
from tests.support.packet_path import CLIENT, NODE1, PODS, SPEC

CGROUP2 = Path("/sys/fs/cgroup/unified")
SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]
TCP_PORT, UDP_PORT = 30090, 30091
LOCAL_PORT, HEALTH_PORT = 30092, 32090  # an eTP Local LoadBalancer and its health check
AFTER_KILL = 200  # connections the traffic must complete after the kill


def _why_not() -> str:
    why = packet_path.missing("nsenter", "nft")
    if not why and not (CGROUP2 / "cgroup.procs").exists():
        why = f"needs cgroup v2 at {CGROUP2}"
    return why


pytestmark = [pytest.mark.netns, pytest.mark.skipif(bool(_why_not()), reason=_why_not())]


def _write(directory: Path, pods: list[str]) -> None:
    ports = [m.port("tcp", 80, 8080, "TCP", TCP_PORT), m.port("udp", 80, 8080, "UDP", UDP_PORT)]
    m.write(directory, "web.yaml", [
        m.node(SPEC.node("node1")), m.node(SPEC.node("node2")),
        m.service("web", ["10.96.5.1"], ports, type="NodePort"),
        m.endpoint_slice("web", [m.endpoint(PODS[p]) for p in pods],
                         [m.slice_port("tcp", 8080, "TCP"), m.slice_port("udp", 8080, "UDP")]),
        m.service("local", ["10.96.5.2"], [m.port("http", 80, 8080, "TCP", LOCAL_PORT)],
                  type="LoadBalancer", externalTrafficPolicy="Local",
                  healthCheckNodePort=HEALTH_PORT),
        m.endpoint_slice("local", [m.endpoint(PODS["pod-a"])], [m.slice_port("http", 8080)]),
    ])


def _health_check() -> tuple[int, str]:
    """The answer of node1's health-check node port to a GET from here (0 and the error
    while it does not answer: the agent opens it after its first sync)."""
    conn = http.client.HTTPConnection(NODE1.ipv4, HEALTH_PORT, timeout=5)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError as err:
        return 0, str(err)
    finally:
        conn.close()


class Traffic:
    """New TCP connections from the LAN client to the NodePort, in a loop, until stopped."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.seen: Counter[str] = Counter()
        self.done = 0
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.done < 1_000_000:
            got = summarize(probe(self.ns, "tcp", NODE1.ipv4, TCP_PORT, timeout=2.0))
            with self._progress:
                self.seen.update(got.sequence)
                self.done += 1
                self._progress.notify_all()

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def wait(self, count: int, timeout: float = 120.0) -> int:
        with self._progress:
            assert self._progress.wait_for(lambda: self.done >= count, timeout), self.done
            return self.done

    def stop(self) -> Counter[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        return self.seen


class Flow:
    """One UDP flow (a connected socket with a fixed source port) from the LAN client."""

    def __init__(self, ns: str) -> None:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.bind((CLIENT.ipv4, 45000))
            s.connect((NODE1.ipv4, UDP_PORT))
            return s

        self.sock = call_in(ns, make)

    def ask(self) -> str:
        self.sock.send(b"ping\n")
        return self.sock.recv(256).decode().split()[0]


@pytest.fixture
def lab() -> Iterator[Lab]:
    lab = Lab(spec=SPEC)
    servers: list[EchoServer] = []
    try:
        lab.build()
        for name in ("pod-a", "pod-c", "pod-d"):
            servers.append(EchoServer(lab.ns(name), name, (8080,)).start())
        yield lab
    finally:
        for server in servers:
            server.stop()
        lab.destroy()


@pytest.fixture
def bpffs_and_cgroup(lab: Lab) -> Iterator[tuple[Path, Path]]:
    fs = Path(tempfile.mkdtemp(prefix="sptcp-"))
    cgroup = CGROUP2 / f"svcproxy-test-{lab.tag}"
    mounted = False
    try:
        cgroup.mkdir()
        subprocess.run(["mount", "-t", "bpf", "bpf", str(fs)], check=True)
        mounted = True
        yield fs, cgroup
    finally:
        # What a failed test left attached: detached by the cleanup path itself.
        if mounted:
            from svcproxy.backends.ebpf.loader import remove_pins
            from svcproxy.backends.ebpf.packet_loader import remove_packet_pins

            call_in(lab.ns("node1"), remove_packet_pins, fs / "pins")
            remove_pins(fs / "pins")
            subprocess.run(["umount", str(fs)], capture_output=True)
        shutil.rmtree(fs, ignore_errors=True)
        if cgroup.exists():
            cgroup.rmdir()


def _link_ids(tc_dir: Path) -> list[int]:
    ids = []
    for pin in sorted(tc_dir.glob("link_*")):
        fd = libbpf.obj_get(str(pin))
        try:
            ids.append(_tcx_info(fd).id)
        finally:
            os.close(fd)
    return ids


def test_process_serves_survives_kill_adopts_and_cleans_up(
        lab: Lab, bpffs_and_cgroup: tuple[Path, Path], tmp_path: Path,
        frontend_factory: Callable[..., Any]) -> None:
    fs, cgroup = bpffs_and_cgroup
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _write(manifests, ["pod-a", "pod-c"])
    fe = frontend_factory(manifests)
    node = lab.ns("node1")
    client = lab.ns(CLIENT.name)
    log = tmp_path / "backend.log"
    argv = ["nsenter", f"--net=/var/run/netns/{node}", *SVCPROXY, "backend", "ebpf",
            "--api", fe.opts.listen, "--node-name", "node1", "--node-ip", NODE1.ipv4,
            "--min-sync-period", "0", "--healthz-bind-address", "",
            "--metrics-bind-address", "", "--ebpf-cgroup", str(cgroup),
            "--ebpf-pin-dir", str(fs / "pins"), "--ebpf-packet-path", "bpf"]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            procs.append(subprocess.Popen(argv, stdout=out, stderr=out))
        return procs[-1]

    def serves(expected: set[str]) -> None:
        got = summarize(probe(client, "tcp", NODE1.ipv4, TCP_PORT, count=30))
        assert got.answered == expected and not got.errors, got

    traffic = Traffic(client)
    try:
        backend = start()
        eventually(lambda: serves({"pod-a", "pod-c"}), timeout=60, why=log.read_text)
        # The agent's health-check node port answers the LAN as it does with nft: the
        # programs leave it alone (it is no service port), and it counts pod-a.
        def healthy() -> None:
            status, body = call_in(client, _health_check)
            assert status == 200 and '"localEndpoints": 1' in body, (status, body)

        eventually(healthy, timeout=60, why=log.read_text)
        assert ns_exec(node, "nft", "list", "ruleset").strip() == "", "no nftables rule"
        if shutil.which("iptables-save"):
            rules = [r for r in ns_exec(node, "iptables-save").splitlines()
                     if r.startswith("-A")]
            assert rules == [], rules
        flow = Flow(client)
        first = flow.ask()
        dump = subprocess.run([*argv, "--dump"], capture_output=True, text=True, timeout=60)
        assert dump.returncode == 0, dump.stderr
        pod_a, pod_c = PODS["pod-a"].ipv4, PODS["pod-c"].ipv4
        assert (f"tc {NODE1.ipv4}:{TCP_PORT}/tcp -> {pod_a}:8080 (local) {pod_c}:8080 "
                "(remote)") in dump.stdout, dump.stdout
        summary = re.search(r"# (\d+) tc services, .* (\d+) flows \((\d+) SNATed\)",
                            dump.stdout)
        assert summary and int(summary[2]) >= 30 and int(summary[3]) >= 1, dump.stdout
        links = _link_ids(fs / "pins" / "tc")
        assert len(links) == 2, "ingress and egress on eth0"

        traffic.start()
        traffic.wait(20)
        os.kill(backend.pid, signal.SIGKILL)  # kill -9 in the middle of the traffic
        backend.wait(10)
        at_kill = traffic.wait(1)
        traffic.wait(at_kill + AFTER_KILL)  # the traffic outlasts the backend
        assert flow.ask() == first, "the UDP flow keeps its endpoint without the backend"

        start()  # adopts the pinned maps and links
        _write(manifests, ["pod-a", "pod-c", "pod-d"])
        eventually(lambda: serves({"pod-a", "pod-c", "pod-d"}), timeout=60,
                   why=log.read_text)
        seen = traffic.stop()
        assert set(seen) <= {"pod-a", "pod-c", "pod-d"}, seen
        assert flow.ask() == first, "and after the restart"
        assert _link_ids(fs / "pins" / "tc") == links, "the links were updated in place"

        procs[-1].send_signal(signal.SIGTERM)
        procs[-1].wait(20)
        done = subprocess.run([*argv, "--cleanup"], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert not (fs / "pins").exists(), "every pin is gone"
        for link in links:
            shown = subprocess.run(["bpftool", "link", "show", "id", str(link)],
                                   capture_output=True, text=True)
            assert shown.returncode != 0, shown.stdout
        after = summarize(probe(client, "tcp", NODE1.ipv4, TCP_PORT, count=2))
        assert after.errors == Counter({"refused": 2}), after
    finally:
        traffic.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
