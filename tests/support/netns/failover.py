"""Two frontend replicas and the nft backend on node1, for failover with real packets.

The standard lab (tests/support/netns/harness.py) with a second frontend on the same manifests;
the backend is given both (``--api unix://a,unix://b``). ``kill`` sends SIGKILL to the
replica the backend streams from, changes a Service while it is down, and measures how
long until the backend streams from the other replica (its log) and until the change
answers real connections; a prober makes new connections through a ClusterIP all along.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections import Counter
from dataclasses import dataclass

from tests.support.lab import manifests as m
from tests.support.lab.processes import Process, backend_argv, frontend, wait_for_path
from tests.support.netns.backends import BackendCase
from tests.support.netns.harness import NODE, ScenarioLab

STEADY = ("failover-steady", ("10.96.7.1",), ("pod-a", "pod-b"))
CHANGED = ("failover-changed", ("10.96.7.2",))
SWAP = ("pod-c", "pod-d")


@dataclass(frozen=True, slots=True)
class Kill:
    moved: float  # SIGKILL -> the backend streams from the other replica (s)
    applied: float  # SIGKILL -> the change made during the outage answers connections (s)


class FailoverLab:
    """The lab, a second frontend, the backend on both, and a prober."""

    def __init__(self) -> None:
        self.lab = ScenarioLab(BackendCase("nft"))
        self.sockets = (self.lab.dir / "api.sock", self.lab.dir / "api-b.sock")
        self.replicas: dict[str, Process] = {}
        self.probes: Counter[str] = Counter()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._generation = 0

    def start(self) -> FailoverLab:
        lab = self.lab.start()
        self._write_services(SWAP[0])
        assert lab.frontend is not None
        self.replicas[self._target(0)] = lab.frontend
        self.replicas[self._target(1)] = self._frontend(1)
        assert lab.agent is not None
        lab.agent.stop()
        argv = backend_argv(lab.lab.ns(NODE), "nft", ",".join(self.replicas), NODE)
        lab.agent = Process(argv, lab.dir / "backend-ha.log").start()
        lab.eventually(self.current, timeout=30)
        self.wait_answer(STEADY[1][0], set(STEADY[2]))
        self.wait_answer(CHANGED[1][0], {SWAP[0]})
        self._prober = threading.Thread(target=self._probe, daemon=True)
        self._prober.start()
        return self

    def stop_probing(self) -> None:
        self._stop.set()
        if self._prober is not None:
            self._prober.join(5)

    def stop(self) -> None:
        self.stop_probing()
        for proc in self.replicas.values():
            proc.stop()
        self.lab.stop()

    def _target(self, index: int) -> str:
        return f"unix://{self.sockets[index]}"

    def _frontend(self, index: int) -> Process:
        sock = self.sockets[index]
        sock.unlink(missing_ok=True)
        proc = frontend(self.lab.manifests, sock, self.lab.dir / f"frontend-{index}.log")
        proc.start()
        wait_for_path(sock, process=proc)
        return proc

    def _write_services(self, pod: str) -> None:
        name, cips, pods = STEADY
        docs = [m.service(name, cips, [m.port("http", 80, 8080)]),
                m.endpoint_slice(name, [m.endpoint(self.lab.spec.pod(p), 4) for p in pods],
                                 [m.slice_port("http", 8080)], 4)]
        name, cips = CHANGED
        self._generation += 1
        docs += [m.service(name, cips, [m.port("http", 80, 8080)]),
                 m.endpoint_slice(name, [m.endpoint(self.lab.spec.pod(pod), 4)],
                                  [m.slice_port("http", 8080)], 4)]
        self.lab.apply("failover.yaml", docs)

    def _probe(self) -> None:
        """New connections through the steady ClusterIP until stopped."""
        while not self._stop.is_set():
            seen = self.lab.probe("client", "tcp", STEADY[1][0], 80, 5, timeout=1.0)
            self.probes["ok"] += sum(seen.names.values())
            for error, n in seen.errors.items():
                self.probes[error] += n

    def answers(self, ip: str) -> frozenset[str]:
        seen = self.lab.probe("client", "tcp", ip, 80, 4, timeout=0.5)
        return seen.answered if not seen.errors else frozenset()

    def wait_answer(self, ip: str, pods: set[str], timeout: float = 30.0) -> float:
        """Seconds until connections to ``ip`` are answered by exactly ``pods``."""
        start = time.monotonic()
        while self.answers(ip) != pods:
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{ip} never answered by {pods}\n{self.lab.logs()}")
        return time.monotonic() - start

    def current(self) -> str:
        """The replica the backend streams from now (its last 'watching' log line)."""
        agent = self.lab.agent
        assert agent is not None
        for line in reversed(agent.log.read_text(errors="replace").splitlines()):
            if " watching " in line and " at unix://" in line:
                return line.rsplit(" at ", 1)[1].strip()
        raise AssertionError("the backend is not watching yet")

    def _moved_at(self, target: str, after: float) -> float | None:
        """When (Unix time) the backend logged watching ``target`` after ``after``."""
        agent = self.lab.agent
        assert agent is not None
        for line in agent.log.read_text(errors="replace").splitlines():
            if line.endswith(f" at {target}") and " watching " in line:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                at = stamp.timestamp()
                if at >= after:
                    return at
        return None

    def kill(self) -> Kill:
        """SIGKILL the replica in use, change a Service, measure, restart the replica."""
        used = self.current()
        other = next(t for t in self.replicas if t != used)
        pod = SWAP[self._generation % 2]
        killed_wall, killed = time.time(), time.monotonic()
        popen = self.replicas[used].popen
        assert popen is not None
        popen.kill()
        self._write_services(pod)
        self.wait_answer(CHANGED[1][0], {pod})
        applied = time.monotonic() - killed
        deadline = time.monotonic() + 10
        moved_at = None
        while moved_at is None and time.monotonic() < deadline:
            moved_at = self._moved_at(other, killed_wall - 0.01)
            time.sleep(0.02)
        assert moved_at is not None, f"never moved to {other}\n{self.lab.logs()}"
        popen.wait()
        index = [self._target(0), self._target(1)].index(used)
        self.replicas[used] = self._frontend(index)
        return Kill(max(0.0, moved_at - killed_wall), applied)
