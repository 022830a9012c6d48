"""A small threaded HTTP server in the background, shared by healthz, metrics and node ports."""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

_WILDCARDS = ("", "0.0.0.0", "::")
BIND_RETRY_INTERVAL = 5.0  # kube-proxy retries its healthz and metrics servers every 5 s


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = field(default=())


Route = Callable[[str], Response]


def parse_bind_address(text: str, default_port: int) -> tuple[str, int]:
    """"host:port", "[v6]:port", ":port" or a bare IP (kube-proxy adds its default port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    try:
        number = int(port) if port else default_port
    except ValueError as err:
        raise ValueError(f"invalid bind address {text!r}: port must be a number") from err
    if not 0 <= number <= 65535:
        raise ValueError(f"invalid bind address {text!r}: port out of range")
    return host, number


def _ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM):
            return True
    except OSError:
        return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    dual_stack = False

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup of the host (socket.getfqdn),
        which stalls for seconds on a node whose resolver does not answer."""
        if self.dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


def _handler(route: Route) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            response = route(self.path.split("?", 1)[0])
            self.send_response(response.status)
            for name, value in response.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


class BackgroundHTTPServer:
    """Serves ``route`` on host:port from a daemon thread until ``close``.

    A wildcard host ("", 0.0.0.0, ::) listens on IPv4 and IPv6 like Go does.
    Binding happens in the constructor, so a busy port raises OSError there.
    """

    def __init__(self, host: str, port: int, route: Route, name: str = "http") -> None:
        server_class: type[_Server] = type("Server", (_Server,), {})
        if host in _WILDCARDS and _ipv6_available():
            server_class.address_family = socket.AF_INET6
            server_class.dual_stack = True
            host = "::"
        elif ":" in host:
            server_class.address_family = socket.AF_INET6
        elif host == "":
            host = "0.0.0.0"
        self._server = server_class((host, port), _handler(route))
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"{name}:{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class RoutedServer:
    """A BackgroundHTTPServer whose routes are this object's ``_route`` method."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self._server = BackgroundHTTPServer(host, port, self._route, name=name)

    @property
    def port(self) -> int:
        return self._server.port

    def close(self) -> None:
        self._server.close()

    def _route(self, path: str) -> Response:
        raise NotImplementedError


class _Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=_Closable)


class BindRetry(Generic[S]):
    """Calls ``bind`` every ``interval`` s from a daemon thread until it returns a server
    rather than raising OSError, or until ``close``, which also closes that server."""

    def __init__(self, bind: Callable[[], S], name: str,
                 interval: float = BIND_RETRY_INTERVAL) -> None:
        self._bind, self._name, self._interval = bind, name, interval
        self._closed = threading.Event()
        self.server: S | None = None
        self._thread = threading.Thread(target=self._run, name=f"bind-retry:{name}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        attempts = 0
        while not self._closed.wait(self._interval):
            attempts += 1
            try:
                self.server = self._bind()
            except OSError as err:
                log.debug("The %s server still cannot listen: %s", self._name, err)
                continue
            log.info("The %s server is listening (after %d retries)", self._name, attempts)
            return

    def close(self) -> None:
        """Stop retrying (waits for an attempt under way) and close what was bound."""
        self._closed.set()
        self._thread.join()
        if self.server is not None:
            self.server.close()
