"""The fleet tests' pieces: node agents as processes of their own (``svcproxy backend``),
and the fleet as GetFleet answers it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc

from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.support.paths import REPO
from tests.support.waiting import wait_for

ROOT = REPO
SVCPROXY = str(Path(sys.executable).parent / "svcproxy")
AGENT_FLAGS = ("--healthz-bind-address", "", "--metrics-bind-address", "",
               "--min-sync-period", "0", "--report-min-interval", "50ms",
               "--node-ip", "192.0.2.2")


class Agents:
    """Node agent processes started by a test, stopped (SIGCONT first) at its end."""

    def __init__(self, api: str, log_dir: Path) -> None:
        self.api = api
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, command: Sequence[str] = (SVCPROXY, "backend", "dump")
              ) -> subprocess.Popen[bytes]:
        """An agent for ``node``: ``command`` (``svcproxy backend dump``) with the API's
        address, the node's name and AGENT_FLAGS."""
        cmd = list(command)
        log = open(self.log_dir / f"agent-{node}.log", "wb")  # noqa: SIM115 - the process's
        out = open(self.output_file(node), "wb")  # noqa: SIM115
        proc = subprocess.Popen([*cmd, "--api", self.api, "--node-name", node, *AGENT_FLAGS],
                                stdout=out, stderr=log, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        log.close()
        out.close()
        self.procs[node] = proc
        return proc

    def pause(self, node: str) -> None:
        os.kill(self.procs[node].pid, signal.SIGSTOP)

    def resume(self, node: str) -> None:
        os.kill(self.procs[node].pid, signal.SIGCONT)

    def kill(self, node: str) -> None:
        """SIGKILL: a stopped agent dies without running again (nothing more applied)."""
        proc = self.procs.pop(node)
        proc.kill()
        proc.wait()

    def stop(self, node: str) -> None:
        proc = self.procs.pop(node)
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def output_file(self, node: str) -> Path:
        """Where the agent's backend writes (the dump backend: a JSON line per sync)."""
        return self.log_dir / f"out-{node}.jsonl"

    def log(self, node: str) -> str:
        return (self.log_dir / f"agent-{node}.log").read_text(errors="replace")

    def close(self) -> None:
        for node in list(self.procs):
            self.stop(node)


@contextmanager
def agents(api: str, log_dir: Path) -> Iterator[Agents]:
    started = Agents(api, log_dir)
    try:
        yield started
    finally:
        started.close()


def fleet(target: str, request: pb.GetFleetRequest | None = None,
          credentials: grpc.ChannelCredentials | None = None) -> pb.Fleet:
    channel = (grpc.secure_channel(target, credentials) if credentials
               else grpc.insecure_channel(target))
    with channel:
        return pb_grpc.NodeStateServiceStub(channel).GetFleet(
            request or pb.GetFleetRequest(), timeout=10)


def nodes(target: str) -> dict[str, pb.FleetNode]:
    return {n.node_name: n for n in fleet(target).nodes}


def wait_state(target: str, node: str, state: int, timeout: float = 30.0,
               **fields: object) -> pb.FleetNode:
    """Wait until GetFleet shows ``node`` in ``state`` (and with ``fields``); the node."""
    seen: dict[str, pb.FleetNode] = {}

    def reached() -> bool:
        try:
            seen.update(nodes(target))
        except grpc.RpcError as err:  # polled past --unary-qps-per-peer: ask again later
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
                raise
            return False
        found = seen.get(node)
        return found is not None and found.state == state and all(
            getattr(found, k) == v for k, v in fields.items())

    try:
        wait_for(reached, timeout=timeout, interval=0.25)  # within 5 calls/s per peer
    except AssertionError:
        raise AssertionError(f"node {node} not {pb.FleetNodeState.Name(state)} "  # type: ignore[arg-type]
                             f"{fields}: {seen.get(node)}") from None
    return seen[node]
