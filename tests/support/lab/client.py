"""Clients: open connections (or send datagrams) from inside a namespace and
record who answered, with the source address they saw, or how it failed."""

from __future__ import annotations

import errno
import socket
from collections import Counter
from dataclasses import dataclass

from .netns import call_in


@dataclass(frozen=True, slots=True)
class Reply:
    """One attempt: the answering pod and the source it saw, or an error name."""

    name: str = ""
    source: str = ""
    port: int = 0  # the pod port that answered
    error: str = ""  # "refused", "timeout", "unreachable", "reset" or an errno name


_ERRORS = {
    errno.ECONNREFUSED: "refused",
    errno.EHOSTUNREACH: "unreachable",
    errno.ENETUNREACH: "unreachable",
    errno.ECONNRESET: "reset",
    errno.ETIMEDOUT: "timeout",
}


def _error(err: OSError) -> str:
    if isinstance(err, TimeoutError | socket.timeout):
        return "timeout"
    return _ERRORS.get(err.errno or 0, errno.errorcode.get(err.errno or 0, str(err)))


def _parse(data: bytes) -> Reply:
    parts = data.decode(errors="replace").split()
    if len(parts) != 3 or not parts[2].isdigit():
        return Reply(error="garbled")
    name, source, port = parts
    return Reply(name=name, source=source.removeprefix("::ffff:"), port=int(port))


def attempt(proto: str, host: str, port: int, timeout: float, source: str = "",
            source_port: int = 0) -> Reply:
    """One connection (``tcp``) or datagram (``udp``) from the calling thread's namespace,
    from ``source`` and ``source_port`` when given (else the kernel's choice)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as s:
        s.settimeout(timeout)
        try:
            if source or source_port:
                s.bind((source, source_port))
            s.connect((host, port))
            if kind == socket.SOCK_DGRAM:
                s.send(b"ping\n")
                return _parse(s.recv(2048))
            chunks = []
            while chunk := s.recv(2048):
                chunks.append(chunk)
            return _parse(b"".join(chunks))
        except OSError as err:
            return Reply(error=_error(err))


def _many(proto: str, host: str, port: int, count: int, timeout: float, source: str) -> list[Reply]:
    return [attempt(proto, host, port, timeout, source) for _ in range(count)]


def probe(
    ns: str,
    proto: str,
    host: str,
    port: int,
    count: int = 1,
    timeout: float = 1.0,
    source: str = "",
) -> list[Reply]:
    """``count`` fresh connections (``tcp``) or sockets (``udp``) from inside ``ns``."""
    return call_in(ns, _many, proto, host, port, count, timeout, source)


@dataclass(frozen=True, slots=True)
class Summary:
    names: Counter[str]
    sources: frozenset[str]
    ports: frozenset[int]
    errors: Counter[str]
    # Each attempt in order: the pod that answered or the error's name.
    sequence: tuple[str, ...] = ()

    @property
    def answered(self) -> frozenset[str]:
        return frozenset(self.names)


def summarize(replies: list[Reply]) -> Summary:
    return Summary(
        names=Counter(r.name for r in replies if not r.error),
        sources=frozenset(r.source for r in replies if not r.error),
        ports=frozenset(r.port for r in replies if not r.error),
        errors=Counter(r.error for r in replies if r.error),
        sequence=tuple(r.error or r.name for r in replies),
    )
