"""A rolling update with real packets: two nodes with the nft backend, clients making new
connections all along, an endpoint made terminating and its server then stopped.

The standard lab (tests/support/netns/harness.py) runs the frontend and node1's backend; node2
gets a backend of its own. Service ``roll`` has pod-a (node1) and pod-c (node2). Two
probers make new connections all along: the client pod through the ClusterIP (node1's
rules) and an external client through node2's NodePort (node2's rules). ``roll_out``
makes pod-c's endpoint terminating as the EndpointSlice controller does when the pod is
deleted, optionally waits as a preStop hook would (``svcproxy wait --endpoint-gone``),
stops pod-c's server, and counts the connections that failed; ``bring_back`` restarts it
and waits until every node routes to it again.

Conntrack keeps each connection's routing choice, whatever the rules say later, so two
things that are conntrack's and a pod's, not the routing the wait is about, are kept out:

* The server stops as a draining one does: it first lets the connections begun before
  the stop end. A SYN sent to pod-c just before a node applied, and lost, comes back a
  second later along its conntrack entry; an abrupt stop would refuse it.
* No prober uses a source port twice in a run (``SOURCE_PORTS``, below the kernel's
  ephemeral range). With the kernel's choice a client's port comes back after about
  3,000 connections to the same address, and a new connection on it follows an older
  one's entry to where that pointed: a reset connection's entry (CLOSE, 10 s) or an
  unanswered SYN's (SYN_SENT, 120 s) sends it to pod-c after every node applied, and a
  pod still holding the port in TIME_WAIT loses its SYN.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections import Counter

import grpc

from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.lab import manifests as m
from tests.support.lab.client import attempt
from tests.support.lab.echo import EchoServer
from tests.support.lab.netns import call_in
from tests.support.lab.plan import SERVER_PORTS
from tests.support.lab.processes import SVCPROXY, Process, backend_argv
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import NODE, ScenarioLab
from tests.support.waiting import wait_for

CLUSTER_IP = "10.96.9.1"
NODE_PORT = 30990
VICTIM, STAYS = "pod-c", "pod-a"
REPORT_FLAGS = ("--report-min-interval", "0")
PROBE_TIMEOUT = 3.0
PROBE_GAP = 0.005
PROBE_BATCH = 5
SOURCE_PORTS = range(1024, 32768)


class RollingLab:
    """See the module docstring; ``start``, then ``roll_out``/``bring_back``, ``stop``."""

    def __init__(self) -> None:
        self.lab = ScenarioLab(BackendCase("nft", REPORT_FLAGS))
        self.node2: Process | None = None
        self.failures: Counter[str] = Counter()
        self.attempts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._probers: list[threading.Thread] = []
        self._begun: dict[str, float | None] = {}  # each prober's connection under way

    @property
    def api(self) -> str:
        return f"unix://{self.lab.socket}"

    def start(self) -> RollingLab:
        lab = self.lab.start()
        self.node2 = Process(backend_argv(lab.lab.ns("node2"), "nft", self.api, "node2",
                                          REPORT_FLAGS), lab.dir / "backend-node2.log").start()
        self._write(victim_ready=True)
        self.wait("--endpoint-ready", lab.spec.pod(VICTIM).ipv4)
        lab.eventually(lambda: self._answered_by_both(), timeout=30)
        node2_ip = lab.spec.node("node2").ipv4
        self._probers = [
            threading.Thread(target=self._probe, args=("client", CLUSTER_IP, 80), daemon=True),
            threading.Thread(target=self._probe, args=("ext-ok", node2_ip, NODE_PORT),
                             daemon=True)]
        for prober in self._probers:
            prober.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for prober in self._probers:
            prober.join(5)
        if self.node2 is not None:
            self.node2.stop()
        self.lab.stop()

    def _write(self, victim_ready: bool) -> None:
        spec = self.lab.spec
        victim = m.endpoint(spec.pod(VICTIM), 4, ready=victim_ready, serving=True,
                            terminating=not victim_ready)
        self.lab.apply("roll.yaml", [
            m.service("roll", [CLUSTER_IP], [m.port("http", 80, 8080, node_port=NODE_PORT)],
                      type="NodePort"),
            m.endpoint_slice("roll", [m.endpoint(spec.pod(STAYS), 4), victim],
                             [m.slice_port("http", 8080)], 4)])

    def _answered_by_both(self) -> None:
        for client, ip, port in (("client", CLUSTER_IP, 80),
                                 ("ext-ok", self.lab.spec.node("node2").ipv4, NODE_PORT)):
            seen = self.lab.probe(client, "tcp", ip, port, 12, timeout=1.0)
            assert seen.answered == {STAYS, VICTIM} and not seen.errors, (client, seen)

    def _probe(self, client: str, ip: str, port: int) -> None:
        """New connections from ``client`` until stopped, in batches a few milliseconds
        apart; errors counted by kind."""
        call_in(self.lab.lab.ns(client), self._probe_here, client, ip, port)

    def _probe_here(self, client: str, ip: str, port: int) -> None:
        """``_probe`` inside the client's namespace. A connection gets PROBE_TIMEOUT to be
        answered: the machine is shared, and one the dataplane sends to a stopped server
        is refused at once anyway."""
        ports = itertools.cycle(p for p in SOURCE_PORTS if p not in SERVER_PORTS)
        while not self._stop.is_set():
            for _ in range(PROBE_BATCH):
                with self._lock:
                    self._begun[client] = time.monotonic()
                reply = attempt("tcp", ip, port, PROBE_TIMEOUT, source_port=next(ports))
                with self._lock:
                    self._begun[client] = None
                    self.attempts += 1
                    if reply.error:
                        self.failures[reply.error] += 1
            self._stop.wait(PROBE_GAP)

    def counts(self) -> tuple[int, int]:
        """(attempts, failures) so far."""
        with self._lock:
            return self.attempts, sum(self.failures.values())

    def failure_kinds(self) -> Counter[str]:
        with self._lock:
            return Counter(self.failures)

    def wait(self, *what: str, timeout: str = "30s") -> None:
        """``svcproxy wait`` as a preStop hook runs it; fails the test if it times out."""
        done = subprocess.run([*SVCPROXY, "wait", "--api", self.api, *what, "--timeout",
                               timeout, "--quiet"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{done.stderr}\n{self.lab.logs()}"

    def roll_out(self, with_wait: bool) -> int:
        """pod-c terminating, (the wait,) its server stopped, then a few more probes: the
        connections that failed meanwhile."""
        _, failed_before = self.counts()
        self._write(victim_ready=False)
        if with_wait:
            self.wait("--endpoint-gone", self.lab.spec.pod(VICTIM).ipv4)
        self._drain()
        server = next(s for s in self.lab.servers if s.name == VICTIM)
        server.stop()
        self._settle()
        return self.counts()[1] - failed_before

    def bring_back(self) -> None:
        """pod-c's server again, ready, routed to by every node."""
        spec = self.lab.spec
        self.lab.servers = [s for s in self.lab.servers if s.name != VICTIM]
        self.lab.servers.append(EchoServer(self.lab.lab.ns(VICTIM), VICTIM,
                                           SERVER_PORTS).start())
        self._write(victim_ready=True)
        self.wait_rpc(pb.WaitFleetRequest(endpoint_ready=spec.pod(VICTIM).ipv4))

    def wait_rpc(self, request: pb.WaitFleetRequest, timeout: float = 30.0) -> None:
        """WaitFleet itself (what ``svcproxy wait`` calls), without a process's start."""
        with grpc.insecure_channel(self.api) as channel:
            stub = pb_grpc.NodeStateServiceStub(channel)
            progress = list(stub.WaitFleet(request, timeout=timeout))
        assert progress and progress[-1].done, (progress, self.lab.logs())

    def _drain(self) -> None:
        """Until the connections begun before now have ended (each within its timeouts),
        as a server drains its listener before it exits."""
        since = time.monotonic()

        def drained() -> bool:
            with self._lock:
                return all(begun is None or begun >= since for begun in self._begun.values())
        wait_for(drained, timeout=30, interval=0.005)

    def _settle(self, probes: int = 40) -> None:
        """Until the probers made ``probes`` more connections (a node still routing to
        the stopped server would fail some of them)."""
        start, _ = self.counts()
        deadline = time.monotonic() + 30
        while self.counts()[0] < start + probes and time.monotonic() < deadline:
            time.sleep(0.01)


__all__ = ["NODE", "RollingLab"]
