"""Thin adapter: netlink requests sent in batches, IPVS dumps.

The IPVS family is resolved (and the ip_vs module autoloaded) through pyroute2's
IPVS socket; requests built by ``genl`` and ``rtnl`` are then sent many per
``send`` on a plain netlink socket, each acknowledged, so one sync costs a few
system calls instead of one round trip per object.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from svcproxy.backends.ipvs import genl
from svcproxy.sdk import netlink

SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_ROUTE = 0
NETLINK_GENERIC = 16
BATCH_BYTES = 48 * 1024
# Every ack is its own skb (~1 KiB of receive buffer each): keep a batch's acks
# well inside the buffer.
BATCH_MESSAGES = 256
RCVBUF = 4 * 1024 * 1024
SO_RCVBUFFORCE = 33
DEFAULT_TYPE = -1


class IpvsUnavailable(RuntimeError):
    """The kernel has no IPVS (module missing or not loadable)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One netlink request and a human description for error messages."""

    what: str
    body: bytes
    msg_type: int = DEFAULT_TYPE
    flags: int = netlink.NLM_F_ACK
    ignore: frozenset[int] = frozenset()
    # The virtual server the request is about (to tell which service port a failure is).
    sid: genl.ServiceId | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    request: Request
    errno: int

    def __str__(self) -> str:
        return f"{self.request.what}: {os.strerror(self.errno)}"


def ipvs_request(what: str, built: tuple[int, bytes],
                 sid: genl.ServiceId | None = None) -> Request:
    """A Request for an IPVS (cmd, attrs) pair from ``genl``, about virtual server ``sid``."""
    return Request(what, genl.genl_body(*built), sid=sid)


def resolve_family() -> int:
    """The IPVS generic-netlink family id; raises IpvsUnavailable without IPVS."""
    from pyroute2 import IPVS

    try:
        sock = IPVS()
    except Exception as err:  # noqa: BLE001 - pyroute2 raises several kinds here
        raise IpvsUnavailable(f"no IPVS generic-netlink family: {err}") from err
    try:
        return int(sock.prid)
    finally:
        sock.close()


class NetlinkBatch:
    """A netlink socket that sends requests in batches and collects their acks."""

    def __init__(self, protocol: int, default_type: int = 0) -> None:
        self.default_type = default_type
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def _frame(self, request: Request) -> bytes:
        self.seq += 1
        kind = self.default_type if request.msg_type == DEFAULT_TYPE else request.msg_type
        return genl.frame(kind, request.body, self.seq, request.flags)

    def apply(self, requests: Sequence[Request]) -> list[Failure]:
        """Send every request (in order, batched); return those the kernel refused."""
        failures: list[Failure] = []
        start = 0
        while start < len(requests):
            batch: list[bytes] = []
            pending: dict[int, Request] = {}
            size = 0
            while start < len(requests) and size < BATCH_BYTES and len(batch) < BATCH_MESSAGES:
                data = self._frame(requests[start])
                pending[self.seq] = requests[start]
                batch.append(data)
                size += len(data)
                start += 1
            self.sock.send(b"".join(batch))
            failures.extend(self._collect_acks(pending))
        return failures

    def _collect_acks(self, pending: dict[int, Request]) -> list[Failure]:
        failures: list[Failure] = []
        while pending:
            data = self.sock.recv(RCVBUF)
            for kind, _flags, seq, payload in netlink.messages(data):
                if kind != netlink.NLMSG_ERROR or seq not in pending:
                    continue
                request = pending.pop(seq)
                code = netlink.error_code(payload)
                if code and code not in request.ignore:
                    failures.append(Failure(request, code))
        return failures

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        """The payloads of a dump request."""
        self.seq += 1
        seq = self.seq
        self.sock.send(genl.frame(msg_type, body, seq, netlink.NLM_F_DUMP))
        payloads: list[bytes] = []
        while True:
            data = self.sock.recv(RCVBUF)
            for kind, _flags, mseq, payload in netlink.messages(data):
                if mseq != seq:
                    continue
                if kind == netlink.NLMSG_DONE:
                    return payloads
                if kind == netlink.NLMSG_ERROR:
                    if code := netlink.error_code(payload):
                        raise OSError(code, os.strerror(code))
                    return payloads
                payloads.append(payload)


class IpvsNetlink(NetlinkBatch):
    """Batched IPVS requests and dumps in the current network namespace."""

    def __init__(self, family_id: int | None = None) -> None:
        super().__init__(NETLINK_GENERIC, resolve_family() if family_id is None else family_id)

    def services(self) -> list[genl.ServiceSpec]:
        """Every address:port virtual server in the kernel."""
        payloads = self.dump(self.default_type, genl.genl_body(genl.CMD_GET_SERVICE, b""))
        specs = (genl.parse_service(p) for p in payloads)
        return [s for s in specs if s is not None]

    def dests(self, service: genl.ServiceId) -> list[genl.DestStats]:
        """The real servers of one virtual server, with their connection counts."""
        try:
            payloads = self.dump(self.default_type, genl.genl_body(*genl.dump_dests(service)))
        except OSError as err:
            if err.errno == errno.ESRCH:
                return []
            raise
        return [genl.parse_dest(p, service.family) for p in payloads]
