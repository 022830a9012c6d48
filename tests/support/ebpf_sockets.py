"""The ebpf socket tests' world: a network namespace and a cgroup the test made, echo
servers on the namespace's loopback (the endpoints), the backend's cgroup programs, and
client processes in that cgroup (``Client`` connects and counts, ``Holder`` keeps
sockets open); ``service`` the records the backend is given. Everything ``SocketWorld`` made
(namespace, cgroup, bpffs mount, pins, links, processes) ``stop`` removes."""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.backends.ebpf.loader import OBJECT, Layout
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk import Changes, NodeConfig, NodeState
from tests.support.lab.netns import enter
from tests.support.lab.topology import Namespaces, addresses

CGROUP2 = Path("/sys/fs/cgroup/unified")
EPS4 = [f"10.244.0.{i}" for i in range(1, 5)]
EPS6 = [f"fd00:244::{i}" for i in range(1, 5)]
NODE_IP = "192.168.77.10"
PORT = 8080


def missing() -> str:
    """Why real sockets through the cgroup programs cannot be tested here ("" when they
    can)."""
    if os.geteuid() != 0:
        return "needs root"
    if not (CGROUP2 / "cgroup.procs").exists():
        return f"needs cgroup v2 at {CGROUP2}"
    if shutil.which("ip") is None:
        return "needs iproute2"
    if not OBJECT.exists():
        return f"{OBJECT} not built (python -m svcproxy.backends.ebpf.build)"
    return ""


def marks() -> list[pytest.MarkDecorator]:
    """A module's ``pytestmark``: network namespaces, skipped where ``missing`` says."""
    why = missing()
    return [pytest.mark.netns, pytest.mark.skipif(bool(why), reason=why)]


# The client: a separate process (so it can live in the test cgroup) that takes one
# JSON command per line and answers one JSON line.
CLIENT = r'''
import json, socket, sys
held = {}
def fam(h): return socket.AF_INET6 if ":" in h else socket.AF_INET
def err(e):
    return {"error": {111: "refused", 101: "unreachable", 113: "unreachable"}.get(
        e.errno, "timeout" if isinstance(e, TimeoutError) else str(e))}
def once(c):
    kind = socket.SOCK_STREAM if c["proto"] == "tcp" else socket.SOCK_DGRAM
    with socket.socket(fam(c["host"]), kind) as s:
        s.settimeout(c.get("timeout", 2.0))
        try:
            s.connect((c["host"], c["port"]))
            if kind == socket.SOCK_DGRAM:
                s.send(b"hello\n")
            data = s.recv(2048).decode().split()
            return {"name": data[0], "seen": data[1], "peer": s.getpeername()[0]}
        except OSError as e:
            return err(e)
def sendto(c):
    with socket.socket(fam(c["host"]), socket.SOCK_DGRAM) as s:
        s.settimeout(c.get("timeout", 2.0))
        try:
            s.sendto(b"hello\n", (c["host"], c["port"]))
            data, src = s.recvfrom(2048)
            return {"name": data.decode().split()[0], "from": [src[0], src[1]]}
        except OSError as e:
            return err(e)
def hold(c):
    s = socket.socket(fam(c["host"]), socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect((c["host"], c["port"]))
    held[c["id"]] = s
    return {"name": s.recv(2048).decode().split()[0]}
def ping(c):
    s = held[c["id"]]
    try:
        s.sendall(b"ping\n")
        data = s.recv(2048).decode().split()
        return {"name": data[0] if data else "", "error": "" if data else "closed"}
    except OSError as e:
        return err(e)
for line in sys.stdin:
    c = json.loads(line)
    op = c["op"]
    if op == "ready":
        out = {"ok": True}
    elif op == "connect":
        out = [once(c) for _ in range(c.get("count", 1))]
    elif op == "sendto":
        out = [sendto(c) for _ in range(c.get("count", 1))]
    elif op == "hold":
        out = hold(c)
    else:
        out = ping(c)
    print(json.dumps(out), flush=True)
'''


class Echo:
    """Servers on every endpoint address: a TCP greeting ``<addr> <peer>``, then echoes
    each line prefixed with ``<addr>``; UDP answers ``<addr> <peer>``."""

    def __init__(self, ns: str, addresses: list[str]) -> None:
        self.ns, self.addresses = ns, addresses
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> Echo:
        self._thread.start()
        assert self._ready.wait(5), "echo servers did not start"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _serve(self) -> None:
        enter(self.ns)
        sel = selectors.DefaultSelector()
        for addr in self.addresses:
            fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(fam, kind)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((addr, PORT))
                if kind == socket.SOCK_STREAM:
                    s.listen(128)
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, ("listen", addr))
        self._ready.set()
        while not self._stop.is_set():
            for key, _ in sel.select(0.1):
                role, addr = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    if role == "listen" and sock.type == socket.SOCK_STREAM:
                        conn, peer = sock.accept()
                        conn.sendall(f"{addr} {peer[0]}\n".encode())
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ, ("conn", addr))
                    elif role == "listen":
                        _, peer = sock.recvfrom(2048)
                        sock.sendto(f"{addr} {peer[0]}\n".encode(), peer)
                    else:
                        data = sock.recv(2048)
                        if not data:
                            sel.unregister(sock)
                            sock.close()
                        else:
                            sock.sendall(f"{addr} ".encode() + data)
                except OSError:
                    pass
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()


class LineProcess:
    """Python ``script`` in namespace ``ns``, moved into ``cgroup`` before it makes any
    socket (it waits for its first command, ``ready``): one JSON command a line in, one
    JSON answer a line out; ``what`` names it when it dies."""

    def __init__(self, script: str, ns: str, cgroup: Path, what: str) -> None:
        self.what = what
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-u", "-c", script],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        (cgroup / "cgroup.procs").write_text(f"{self.proc.pid}\n")
        assert self.call(op="ready") == {"ok": True}

    def call(self, **command: Any) -> Any:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"{self.what} process died"
        return json.loads(line)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


class Client(LineProcess):
    """The client process (``CLIENT``), in ``cgroup``."""

    def __init__(self, ns: str, cgroup: Path) -> None:
        super().__init__(CLIENT, ns, cgroup, "the client")

    def connect(self, proto: str, host: str, port: int = 80, count: int = 1) -> list[dict]:
        return self.call(op="connect", proto=proto, host=host, port=port, count=count)

    def names(self, proto: str, host: str, port: int = 80, count: int = 20) -> Counter[str]:
        return Counter(r.get("name") or r["error"] for r in self.connect(proto, host, port,
                                                                          count))


CONFIG = NodeConfig(node_name="node1", node_ips=(NODE_IP,))


class SocketWorld:
    """A namespace, a cgroup, a bpffs mount, echo servers, a client and the backend."""

    def __init__(self, in_process: bool = True) -> None:
        self.in_process = in_process
        self.namespaces = Namespaces()
        self.ns = self.namespaces.ns("ebpf")
        self.cgroup = CGROUP2 / f"svcproxy-test-{self.namespaces.tag}"
        self.bpffs = Path(tempfile.mkdtemp(prefix="spebpf-"))
        self.layout = Layout(pin_dir=self.bpffs / "pins", cgroup=self.cgroup)
        self.echo: Echo | None = None
        self.client: Client | None = None
        self.backend: EbpfBackend | None = None
        self.revision = 0
        self.services: dict[ServicePortKey, ServicePortState] = {}

    def start(self) -> SocketWorld:
        self.namespaces.add_ns("ebpf")
        addresses(self.ns, "lo", *(f"{addr}/32" for addr in EPS4),
                  *(f"{addr}/128" for addr in EPS6), f"{NODE_IP}/32")
        self.cgroup.mkdir()
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.bpffs)], check=True)
        self.echo = Echo(self.ns, EPS4 + EPS6).start()
        self.client = Client(self.ns, self.cgroup)
        if self.in_process:
            self.backend = EbpfBackend(CONFIG, self.layout).start()
        return self

    def stop(self) -> None:
        for step in (self._stop_backend, self._stop_client, self._stop_echo):
            try:
                step()
            except Exception:  # noqa: BLE001 - keep removing the rest
                pass
        subprocess.run(["umount", str(self.bpffs)], capture_output=True)
        shutil.rmtree(self.bpffs, ignore_errors=True)
        if self.cgroup.exists():
            self.cgroup.rmdir()
        self.namespaces.destroy()

    def _stop_backend(self) -> None:
        if self.backend is not None:
            self.backend.cleanup()
        elif self.layout.pin_dir.exists():
            EbpfBackend(CONFIG, self.layout).cleanup()

    def _stop_client(self) -> None:
        if self.client is not None:
            self.client.stop()

    def _stop_echo(self) -> None:
        if self.echo is not None:
            self.echo.stop()

    def set(self, record: ServicePortState) -> None:
        """Set one service port and sync only it, as a change from the frontend."""
        self.services[record.key] = record
        self.sync(Changes(frozenset({record.key})))

    def delete(self, key: ServicePortKey) -> None:
        self.services.pop(key, None)
        self.sync(Changes(frozenset({key})))

    def full_sync(self) -> None:
        self.sync(Changes(frozenset(self.services), full=True, reason="periodic"))

    def sync(self, changes: Changes) -> None:
        """The backend's sync of ``changes`` to what ``services`` holds now."""
        self.revision += 1
        assert self.backend is not None
        self.backend.sync(NodeState("node1", self.revision, None, dict(self.services)),
                          changes)


def service(name: str, cips: tuple[str, ...], eps: list[str], proto: str = "TCP",
            internal: list[str] | None = None, external: list[str] | None = None,
            **extra: Any) -> ServicePortState:
    """A service port 80 -> 8080 on ``eps``; ``internal``/``external`` narrow the frontend's
    flags (default: every endpoint carries both)."""
    key = ServicePortKey("default", name, "http", Protocol(proto))
    extra.setdefault("has_endpoints", bool(eps))
    svc = ServicePort(key, cluster_ips=cips, port=80, **extra)
    inside = set(eps if internal is None else internal)
    outside = set(eps if external is None else external)
    return ServicePortState(svc, {ip: Endpoint(ip, PORT, internal=ip in inside,
                                               external=ip in outside) for ip in eps})


# What a destroyed UDP socket's next send() gets: it is disconnected (EDESTADDRREQ), or
# the error the destroy left (ECONNABORTED).
DESTROYED = (errno.EDESTADDRREQ, errno.ECONNABORTED)

# One JSON command per line, one JSON answer per line; sockets held by id.
HOLDER = r'''
import json, socket, sys
held = {}
def ask(s):
    try:
        s.send(b"hello\n")
        return {"name": s.recv(2048).decode().split()[0]}
    except OSError as e:
        return {"errno": e.errno or 0, "error": str(e)}
for line in sys.stdin:
    c = json.loads(line)
    if c["op"] == "ready":
        out = {"ok": True}
    elif c["op"] == "open":
        kind = socket.SOCK_DGRAM if c["proto"] == "udp" else socket.SOCK_STREAM
        s = socket.socket(socket.AF_INET6 if ":" in c["host"] else socket.AF_INET, kind)
        s.settimeout(3)
        s.connect((c["host"], 80))
        held[c["id"]] = s
        out = ask(s) if kind == socket.SOCK_DGRAM else {
            "name": s.recv(2048).decode().split()[0]}
    else:
        out = ask(held[c["id"]])
    print(json.dumps(out), flush=True)
'''


class Holder(LineProcess):
    """A process (``HOLDER``) in the cgroup and namespace of ``world`` that keeps its
    sockets open."""

    def __init__(self, world: SocketWorld) -> None:
        super().__init__(HOLDER, world.ns, world.cgroup, "the holder")
