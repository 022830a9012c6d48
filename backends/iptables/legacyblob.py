"""iptables-legacy: a digest of one table as the kernel holds it, without iptables-save.

The table's blob is read as ``iptables-save`` itself reads it (linux/netfilter_ipv4/
ip_tables.h, netfilter_ipv6/ip6_tables.h): ``IPT_SO_GET_INFO`` (its size, hooks and
entry count), then ``IPT_SO_GET_ENTRIES`` (every rule, as the kernel holds it) on a raw
socket in the node's namespace. Each rule's packet and byte counters change with
traffic, not with the rules: they are zeroed before hashing. The digest says only
whether the table changed; what changed is found with ``iptables-save``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import socket
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from svcproxy.sdk.netlink import CLONE_NEWNET, netns_path

SO_GET_INFO, SO_GET_ENTRIES = 64, 65  # IPT_SO_GET_* and IP6T_SO_GET_* (IPT_BASE_CTL)
TABLE_NAME = 32  # XT_TABLE_MAXNAMELEN
INFO = struct.Struct(f"={TABLE_NAME}sI5I5III")  # name, valid_hooks, hooks, underflows, num, size
ENTRIES_HEADER = 40  # struct ipt_get_entries / ip6t_get_entries: name, size, padding


@dataclass(frozen=True, slots=True)
class EntryLayout:
    """Where a family's rule entry (struct ipt_entry / ip6t_entry) holds its length and
    its counters."""

    level: int
    domain: int
    next_offset: int
    counters: int


LAYOUTS = {
    4: EntryLayout(socket.IPPROTO_IP, socket.AF_INET, next_offset=90, counters=96),
    6: EntryLayout(socket.IPPROTO_IPV6, socket.AF_INET6, next_offset=142, counters=152),
}
COUNTERS = 16  # struct xt_counters: packets, bytes
_U16 = struct.Struct("=H")
_libc = ctypes.CDLL(None, use_errno=True)


class TableBlobs:
    """Digests of one family's legacy tables in one namespace (``prefix``: the command
    prefix the backend's iptables run through, ``ip netns exec NAME`` or none)."""

    def __init__(self, family: int, prefix: Sequence[str] = ()) -> None:
        self.layout = LAYOUTS[family]
        self.netns = netns_path(prefix)
        self._sock: socket.socket | None = None

    def digest(self, table: str) -> bytes:
        """The table's rules (counters zeroed) hashed; OSError if it cannot be read
        (ENOENT: no such table; EAGAIN: it changed between the two reads)."""
        fd = self._socket().fileno()
        name = table.encode().ljust(TABLE_NAME, b"\0")
        info = _getsockopt(fd, self.layout.level, SO_GET_INFO,
                           ctypes.create_string_buffer(name, INFO.size))
        size = INFO.unpack(info)[-1]
        request = ctypes.create_string_buffer(name + struct.pack("=I", size),
                                              ENTRIES_HEADER + size)
        blob = memoryview(_getsockopt(fd, self.layout.level, SO_GET_ENTRIES, request))
        _zero_counters(blob, self.layout)
        digest = hashlib.blake2b(info[TABLE_NAME:], digest_size=16)
        digest.update(blob)
        return digest.digest()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = _raw_socket(self.layout.domain, self.netns)
        return self._sock


def _zero_counters(blob: memoryview, layout: EntryLayout) -> None:
    """Zero every entry's counters in ``blob`` (the header, then entries back to back)."""
    offset, end = ENTRIES_HEADER, len(blob)
    counters, length_at, zeros = layout.counters, layout.next_offset, bytes(COUNTERS)
    length = _U16.unpack_from
    while offset < end:
        blob[offset + counters:offset + counters + COUNTERS] = zeros
        step = length(blob, offset + length_at)[0]
        if step == 0:
            raise OSError(0, "iptables blob: an entry of length 0")
        offset += step


def _getsockopt(fd: int, level: int, option: int, buf: ctypes.Array[ctypes.c_char],
                ) -> memoryview:
    """getsockopt into ``buf``, which holds the request (Python's passes no input): the
    bytes the kernel wrote."""
    length = ctypes.c_uint(len(buf))
    if _libc.getsockopt(fd, level, option, buf, ctypes.byref(length)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"getsockopt {option}: {os.strerror(code)}")
    return memoryview(buf).cast("B")[:length.value]


def _raw_socket(domain: int, netns: str | None) -> socket.socket:
    """A raw socket in the namespace at ``netns`` (None: this one), made by a thread
    that enters it (the socket stays bound to the namespace it was made in)."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                with open(netns, "rb") as ns:
                    if _libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                        code = ctypes.get_errno()
                        raise OSError(code, f"setns {netns}: {os.strerror(code)}")
            made.append(socket.socket(domain, socket.SOCK_RAW, socket.IPPROTO_RAW))
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            made.append(err)

    thread = threading.Thread(target=make, name="iptables-blob-netns", daemon=True)
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]
