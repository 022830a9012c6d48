"""A small lab for the IPVS guest tests: a node, a client and routed pods.

client (10.100.0.2, .3) -- node (runs the backend in-process, in its own thread
inside the node namespace) -- pod i (10.244.i.2, its own veth). Pods answer
every line a TCP connection sends (and the connection itself) with their name,
so one long-lived connection can show which pod still serves it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from tests.support.lab.netns import enter, sysctl
from tests.support.lab.topology import Namespaces, addresses, default_routes, veth

T = TypeVar("T")
POD_PORT = 8080
CLIENT_IPS = ("10.100.0.2", "10.100.0.3")
NODE_IP = "10.100.0.1"


def pod_ip(index: int) -> str:
    return f"10.244.{index}.2"


class PodServer:
    """Answers each connection (and each line on it) with the pod's name."""

    def __init__(self, ns: str, name: str) -> None:
        self.ns, self.name = ns, name
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.listener: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True, name=f"pod-{name}")

    def start(self) -> PodServer:
        self.thread.start()
        if not self.ready.wait(10) or self.listener is None:
            raise RuntimeError(f"pod server {self.name} did not start")
        return self

    def stop(self) -> None:
        self.stopped.set()
        if self.listener is not None:
            self.listener.close()

    def _serve(self) -> None:
        enter(self.ns)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", POD_PORT))
        sock.listen(128)
        self.listener = sock
        self.ready.set()
        while not self.stopped.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(60)
            try:
                conn.sendall(f"{self.name}\n".encode())
                while conn.recv(64):
                    conn.sendall(f"{self.name}\n".encode())
            except OSError:
                return


class IpvsLab(Namespaces):
    """The lab's namespaces and links, and its pod servers; ``destroy`` stops the servers
    and deletes every namespace it made."""

    def __init__(self, pods: int) -> None:
        super().__init__()
        self.node = self.ns("node")
        self.client = self.ns("client")
        self.pods = [self.ns(f"pod{i}") for i in range(1, pods + 1)]
        self.servers: list[PodServer] = []
        self.node_thread = ThreadPoolExecutor(1, initializer=enter, initargs=(self.node,))
        self.client_thread = ThreadPoolExecutor(1, initializer=enter, initargs=(self.client,))

    def _build(self) -> None:
        self.add_ns("node")
        self.add_ns("client")
        for index in range(1, len(self.pods) + 1):
            self.add_ns(f"pod{index}")
        sysctl(self.node, "net.ipv4.ip_forward", "1")
        link = f"c{self.tag}"
        veth(self.node, link, self.client, "eth0")
        addresses(self.node, link, f"{NODE_IP}/24")
        addresses(self.client, "eth0", *(f"{address}/24" for address in CLIENT_IPS))
        default_routes(self.client, "eth0", NODE_IP)
        for index, pod in enumerate(self.pods, start=1):
            link = f"p{index}{self.tag}"
            veth(self.node, link, pod, "eth0")
            addresses(self.node, link, f"10.244.{index}.1/24")
            addresses(pod, "eth0", f"{pod_ip(index)}/24")
            default_routes(pod, "eth0", f"10.244.{index}.1")
            self.servers.append(PodServer(pod, f"pod{index}").start())

    def destroy(self) -> None:
        for server in self.servers:
            server.stop()
        self.node_thread.shutdown(wait=True)
        self.client_thread.shutdown(wait=True)
        super().destroy()

    def on_node(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn`` in the node namespace (always the same thread)."""
        return self.node_thread.submit(fn, *args).result(timeout=300)

    def names(self, host: str, port: int, count: int, source: str = CLIENT_IPS[0]) -> list[str]:
        """The pod answering each of ``count`` new connections from the client."""
        return self.client_thread.submit(_names, host, port, count, source).result(timeout=120)

    def open(self, host: str, port: int, source: str = CLIENT_IPS[0]) -> LongConnection:
        return self.client_thread.submit(LongConnection, host, port, source).result(timeout=30)


def _names(host: str, port: int, count: int, source: str) -> list[str]:
    result = []
    for _ in range(count):
        with socket.create_connection((host, port), timeout=3, source_address=(source, 0)) as s:
            result.append(s.makefile().readline().strip())
    return result


class LongConnection:
    """One TCP connection kept open; ``ask`` sends a line and returns the answering pod."""

    def __init__(self, host: str, port: int, source: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=5,
                                             source_address=(source, 0))
        self.reader = self.sock.makefile()
        self.first = self.reader.readline().strip()

    def ask(self) -> str:
        self.sock.sendall(b"again\n")
        return self.reader.readline().strip()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def counts(names: Iterable[str]) -> dict[str, int]:
    result: dict[str, int] = {}
    for name in names:
        result[name] = result.get(name, 0) + 1
    return result
