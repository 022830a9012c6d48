"""Tiny pod servers: every TCP connection and UDP datagram is answered with
``<pod name> <source address seen> <local port>`` (IPv4 and IPv6, every server port)."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Iterable

from .netns import enter


def _sockets(ports: Iterable[int]) -> list[socket.socket]:
    socks = []
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        for port in ports:
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(family, kind)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((host, port))
                if kind == socket.SOCK_STREAM:
                    s.listen(64)
                s.setblocking(False)
                socks.append(s)
    return socks


def _answer(name: str, sock: socket.socket) -> None:
    if sock.type == socket.SOCK_STREAM:
        conn, peer = sock.accept()
        with conn:
            conn.setblocking(True)
            conn.settimeout(1.0)
            try:
                conn.sendall(f"{name} {peer[0]} {conn.getsockname()[1]}\n".encode())
            except OSError:
                pass
    else:
        try:
            _, peer = sock.recvfrom(2048)
            sock.sendto(f"{name} {peer[0]} {sock.getsockname()[1]}\n".encode(), peer)
        except OSError:
            pass


class EchoServer:
    """Serves inside namespace ``ns`` from a thread until ``stop()``."""

    def __init__(self, ns: str, name: str, ports: Iterable[int]) -> None:
        self.ns, self.name, self.ports = ns, name, tuple(ports)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"echo-{name}", daemon=True)

    def start(self) -> EchoServer:
        self._thread.start()
        self._ready.wait(5)
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _serve(self) -> None:
        try:
            enter(self.ns)
            socks = _sockets(self.ports)
        except BaseException as err:  # noqa: BLE001 - reported by start()
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        with selectors.DefaultSelector() as sel:
            for s in socks:
                sel.register(s, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(0.2):
                    _answer(self.name, key.fileobj)  # type: ignore[arg-type]
        for s in socks:
            s.close()
