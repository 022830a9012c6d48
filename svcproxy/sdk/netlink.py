"""Netlink messages and attributes, built and read with ``struct``; and a socket for them
in any network namespace, with the dumps of nftables' tables.

The one reader and writer of netlink framing for every kernel client in svcproxy
(rtnetlink, generic netlink for IPVS, nfnetlink for conntrack, nfacct and nftables); a
backend author speaking another netlink family can use it too. The framing functions
are pure; ``open_socket`` and ``NftablesReader`` (the nft and iptables-nft backends'
reader of their rules, chains, sets and the ruleset's generation) do the I/O.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
ATTR_HEADER = struct.Struct("=HH")  # nlattr: length, type
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_ERRNO = struct.Struct("=i")


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    """One netlink message: its header, then ``body``."""
    return HEADER.pack(HEADER.size + len(body), kind, flags, seq, 0) + body


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes."""
    length = ATTR_HEADER.size + len(payload)
    return ATTR_HEADER.pack(length, kind) + payload + b"\0" * (-length % 4)


def nested(kind: int, *children: bytes) -> bytes:
    """An attribute holding ``children``, flagged NLA_F_NESTED."""
    return attr(kind | NLA_F_NESTED, b"".join(children))


def message_spans(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(type, flags, seq, body start, body end) of each message in a received buffer;
    stops at a truncated or malformed header."""
    at = 0
    while at + HEADER.size <= len(data):
        length, kind, flags, seq, _pid = HEADER.unpack_from(data, at)
        if length < HEADER.size:
            return
        yield kind, flags, seq, at + HEADER.size, min(at + length, len(data))
        at += (length + 3) & ~3


def messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, body) of each message in a received buffer."""
    for kind, flags, seq, start, end in message_spans(data):
        yield kind, flags, seq, data[start:end]


def error_code(data: bytes, at: int = 0) -> int:
    """The errno (positive, 0 for an ACK) of the NLMSG_ERROR body at ``at``."""
    return -int(_ERRNO.unpack_from(data, at)[0])


def attr_spans(data: bytes, start: int = 0, end: int | None = None
               ) -> Iterator[tuple[int, int, int]]:
    """(type without flags, payload start, payload end) of the attributes in
    ``data[start:end]``; stops at a truncated or malformed one."""
    end = len(data) if end is None else end
    while start + ATTR_HEADER.size <= end:
        length, kind = ATTR_HEADER.unpack_from(data, start)
        if length < ATTR_HEADER.size or start + length > end:
            return
        yield kind & NLA_TYPE_MASK, start + ATTR_HEADER.size, start + length
        start += (length + 3) & ~3


def iter_attrs(data: bytes, start: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each attribute from ``start`` on."""
    for kind, a, b in attr_spans(data, start):
        yield kind, data[a:b]


def attrs(data: bytes, start: int = 0) -> dict[int, bytes]:
    """The attributes from ``start`` on, by type (the last of each type)."""
    return {kind: data[a:b] for kind, a, b in attr_spans(data, start)}


# ---- a socket in a network namespace ---------------------------------------------------
NETLINK_NETFILTER = 12
CLONE_NEWNET = 0x40000000


def netns_path(prefix: Sequence[str]) -> str | None:
    """The namespace a command prefix runs in (``ip netns exec NAME``), None: ours."""
    if len(prefix) >= 4 and tuple(prefix[:3]) == ("ip", "netns", "exec"):
        return f"/run/netns/{prefix[3]}"
    return None


def open_socket(protocol: int, netns: str | None = None, timeout: float = 10.0,
                rcvbuf: int = 1 << 22) -> socket.socket:
    """A netlink socket of ``protocol`` in the namespace at ``netns`` (None: this one),
    made by a short-lived thread that enters it (setns changes only the calling
    thread's namespace; the socket stays bound to the one it was made in)."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                libc = ctypes.CDLL(None, use_errno=True)
                with open(netns, "rb") as ns:
                    if libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                        code = ctypes.get_errno()
                        raise OSError(code, f"setns {netns}: {os.strerror(code)}")
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            sock.settimeout(timeout)
            made.append(sock)
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            made.append(err)

    if netns is None:
        make()
    else:
        thread = threading.Thread(target=make, name="netlink-netns", daemon=True)
        thread.start()
        thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


# ---- nftables' tables (nfnetlink subsystem NFNL_SUBSYS_NFTABLES) -------------------------
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM = 4, 7, 10, 13
NFT_MSG_GETGEN = 16
NFTA_GEN_ID = 1
NFGENMSG = struct.Struct("=BBH")  # nfgenmsg: family, version, res_id


class KernelError(OSError):
    """The kernel answered a request with an error (its errno); the socket stays usable.
    ``FileNotFoundError`` is not a subclass: test ``errno == errno.ENOENT``."""


class NftablesReader:
    """Requests to nftables in one namespace (``netns``: its path, None: ours) on one
    socket, opened on first use and closed after any error (the next request opens
    another). One request at a time: callers sharing a reader between threads lock."""

    def __init__(self, netns: str | None = None, timeout: float = 10.0) -> None:
        self.netns = netns
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._seq = 0

    def spans(self, msg: int, family: int, payload: bytes, dump: bool = True
              ) -> Iterator[tuple[bytes, int, int]]:
        """(buffer, body start, body end) of every message answering one request (a dump,
        or one GET), without copying the bodies; each body starts with its nfgenmsg.
        Raises OSError with the kernel's errno (ENOENT: no such table or chain); after
        any other error (a timeout) the socket is closed."""
        sock = self._socket()
        self._seq += 1
        seq = self._seq
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
        try:
            sock.send(message((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq,
                              NFGENMSG.pack(family, 0, 0) + payload))
            while True:
                data = sock.recv(1 << 20)
                for mtype, _flags, got, start, end in message_spans(data):
                    if got != seq:
                        continue
                    if mtype == NLMSG_DONE:
                        return
                    if mtype == NLMSG_ERROR:
                        code = error_code(data, start)
                        if code:
                            raise KernelError(code, os.strerror(code))
                        return
                    yield data, start, end
                    if not dump:
                        return
        except KernelError:
            raise
        except OSError:
            self.close()
            raise

    def bodies(self, msg: int, family: int, payload: bytes, dump: bool = True
               ) -> Iterator[bytes]:
        """The bodies (nfgenmsg first) of every message answering one request."""
        for data, start, end in self.spans(msg, family, payload, dump):
            yield data[start:end]

    def generation(self) -> int:
        """The ruleset's generation: every committed transaction, of any table, adds one."""
        for body in self.bodies(NFT_MSG_GETGEN, socket.AF_UNSPEC, b"", dump=False):
            return struct.unpack(">I", attrs(body, NFGENMSG.size)[NFTA_GEN_ID])[0]
        raise OSError("no generation in the kernel's answer")

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = open_socket(NETLINK_NETFILTER, self.netns, self.timeout)
        return self._sock

    def close(self) -> None:
        """Close the socket (a later request opens another)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# ---- nftables' change events (multicast group NFNLGRP_NFTABLES) --------------------------
NFNLGRP_NFTABLES = 7
NFT_MSG_NEWTABLE, NFT_MSG_DELTABLE = 0, 2
NFT_MSG_NEWCHAIN, NFT_MSG_DELCHAIN = 3, 5
NFT_MSG_NEWRULE, NFT_MSG_DELRULE = 6, 8
NFT_MSG_NEWGEN = 15
_TABLE_NAME, _CHAIN_TABLE, _CHAIN_NAME, _RULE_TABLE, _RULE_CHAIN = 1, 1, 3, 1, 2
# Per event: where its table and chain names are (attribute numbers); "" for a table's.
_NAMES = {NFT_MSG_NEWTABLE: (_TABLE_NAME, -1), NFT_MSG_DELTABLE: (_TABLE_NAME, -1),
          NFT_MSG_NEWCHAIN: (_CHAIN_TABLE, _CHAIN_NAME),
          NFT_MSG_DELCHAIN: (_CHAIN_TABLE, _CHAIN_NAME),
          NFT_MSG_NEWRULE: (_RULE_TABLE, _RULE_CHAIN), NFT_MSG_DELRULE: (_RULE_TABLE, _RULE_CHAIN)}
# (family, table, chain): a chain whose rules (or itself) a transaction changed; chain ""
# for the table itself (created or deleted).
Touched = tuple[int, str, str]


class NftablesEvents:
    """What committed nftables transactions changed in one namespace (``netns``: its
    path, None: ours), from the kernel's change events: subscribed at construction, so
    every transaction committed after it is seen. ``drain`` returns, per transaction
    since the last drain, its generation and the tables and chains whose rules it
    changed (sets and elements are left out). Events are lost when the socket's buffer
    overflows (a large transaction, or no drain for long): then ``drain`` says so."""

    def __init__(self, netns: str | None = None, rcvbuf: int = 1 << 24) -> None:
        self._sock = open_socket(NETLINK_NETFILTER, netns, rcvbuf=rcvbuf)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        except OSError:
            pass  # SO_RCVBUF's, capped by net.core.rmem_max
        self._sock.bind((0, 1 << (NFNLGRP_NFTABLES - 1)))
        self._sock.setblocking(False)
        self._group: set[Touched] = set()
        # After a loss: events of transactions up to this generation may be missing from
        # the group received next (None: none missing).
        self._suspect: int | None = None

    def drain(self, generation: Callable[[], int] | None = None
              ) -> tuple[list[tuple[int, set[Touched]]], bool]:
        """(the transactions received since the last drain: (generation, what it
        touched), whether events were lost meanwhile). ``generation`` (the ruleset's,
        read now) lets a loss end cleanly: the events left of a transaction whose end
        was dropped are discarded, and the next transaction counts as whole if it was
        committed after the loss (without it, the next one counts as lost too)."""
        done: list[tuple[int, set[Touched]]] = []
        lost = False
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno != 105:  # ENOBUFS: events dropped; the queue goes on
                    raise
                lost = True
                continue
            lost = self._take(data, done) or lost
        if lost and self._group:
            self._group = set()
            self._suspect = generation() if generation is not None else 1 << 32
        return done, lost

    def _take(self, data: bytes, done: list[tuple[int, set[Touched]]]) -> bool:
        """The events of one buffer into ``done`` (whole transactions) and the group
        under way; True if a transaction ended that may miss events (see drain)."""
        lost = False
        for kind, _flags, _seq, start, end in message_spans(data):
            if kind >> 8 != NFNL_SUBSYS_NFTABLES or end - start < NFGENMSG.size:
                continue
            msg = kind & 0xFF
            if msg == NFT_MSG_NEWGEN:
                found = attrs(data[start:end], NFGENMSG.size).get(NFTA_GEN_ID)
                if found is not None:
                    gen = struct.unpack(">I", found)[0]
                    if self._suspect is not None and gen <= self._suspect:
                        lost = True
                    self._suspect = None
                    done.append((gen, self._group))
                self._group = set()
                continue
            names = _NAMES.get(msg)
            if names is None:
                continue
            named = attrs(data[start:end], NFGENMSG.size)
            table, chain = named.get(names[0], b""), named.get(names[1], b"")
            self._group.add((data[start], _name(table), _name(chain)))
        return lost

    def close(self) -> None:
        self._sock.close()


def _name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")
