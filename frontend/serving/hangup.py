"""Closing the connections of streams the frontend ended for not reading.

grpc.aio gives a server no way to cancel one call at the HTTP/2 level (no RST_STREAM):
a stream's status (``context.abort``, ``set_code``, or the handler cancelled) goes out
as trailers, which gRPC core queues behind the message the client does not read, so
the client is never told, and core keeps the call (and its per-address slot) until the
client goes. What the library does allow is closing the connection under it: the
frontend shuts down its own socket of the stream's TCP connection, gRPC core then
fails every call on it, the client sees UNAVAILABLE at once and reconnects (the SDK
resumes from its revision), and the ended calls finish, which frees their slots.

A TCP peer is found by the remote address of the sockets this process holds
(``/proc/self/fd``), each looked at through a duplicate of its descriptor, so the
socket shut down is the one matched even if gRPC closes that descriptor meanwhile.
Unix socket clients have no address to tell them apart (gRPC names each "unix:", and
says nothing of the connection a call came on): when one of their streams is ended,
every connection accepted on the frontend's unix sockets is closed (``UNIX``), and
each of those clients reconnects and resumes (the SDK does it from its revision).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Collection

log = logging.getLogger(__name__)

Remote = tuple[str, int]
UNIX: Remote = ("unix:", 0)  # every client of the frontend's unix sockets


def remote_of(peer: str) -> Remote | None:
    """The TCP remote end of ``context.peer()`` ("ipv4:10.0.0.1:4242" -> ("10.0.0.1",
    4242)); ``UNIX`` for a unix socket client; None for anything else."""
    kind, _, rest = peer.partition(":")
    if kind == "unix":
        return UNIX
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _normal(host.strip("[]")), int(port)
    except ValueError:
        return None


def _normal(host: str) -> str:
    """An address as text, an IPv4-mapped IPv6 address as its IPv4 address."""
    address = ipaddress.ip_address(host.partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def close_connections(remotes: Collection[Remote]) -> int:
    """Shut down every TCP socket of this process whose remote end is in ``remotes``
    (and, with ``UNIX`` among them, every unix stream socket accepted on a named
    socket: the frontend's clients); how many were."""
    unix = UNIX in remotes
    closed = 0
    fds = "/proc/self/fd"
    for name in os.listdir(fds):
        try:
            if not os.readlink(f"{fds}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM:
                continue
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                host, port = sock.getpeername()[:2]
                if (_normal(host), port) in remotes:
                    sock.shutdown(socket.SHUT_RDWR)
                    closed += 1
            elif unix and sock.family == socket.AF_UNIX and _accepted(sock):
                sock.shutdown(socket.SHUT_RDWR)
                closed += 1
        except OSError:
            pass  # not connected (a listening socket), or already gone
        finally:
            sock.close()  # the duplicate only
    return closed


def _accepted(sock: socket.socket) -> bool:
    """Whether a unix socket is a connection a listening named socket accepted (its
    own name is the listener's; a client's socket has none, a listener accepts)."""
    return bool(sock.getsockname()) and not sock.getsockopt(socket.SOL_SOCKET,
                                                             socket.SO_ACCEPTCONN)
