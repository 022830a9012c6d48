"""``--ebpf-pod-devices``: the devices pods' traffic enters the node by (each pod's host
end of its veth, as Calico's eBPF dataplane attaches to ``cali*``), found by name pattern.

The tc programs on them serve what the socket programs cannot take: processes outside
``--ebpf-cgroup`` and SCTP. A matching device that appears later is attached when the
kernel says it came (``LinkMonitor``: rtnetlink's link notifications), and at every sync
in case one was missed; the pins of one that went are removed then (``device_pins.py``).
"""

from __future__ import annotations

import argparse
import fnmatch
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from svcproxy.sdk import netlink

log = logging.getLogger(__name__)


IFNAMSIZ = 16  # a device's name is at most 15 bytes (the kernel's dev_valid_name)
_VALID = ("shell-style patterns of device names, comma-separated: '*' any run, '?' one "
          "character, '[...]' one of a set (e.g. cali*,lxc*,tap[0-9]*)")


def patterns(text: str) -> tuple[str, ...]:
    """``cali*,tap*`` as its patterns (shell-style: ``*``, ``?``, ``[...]``); a pattern
    no device name can match is refused with what is valid (``--ebpf-pod-devices``'s
    argparse type)."""
    found = tuple(p for p in (part.strip() for part in text.split(",")) if p)
    for pattern in found:
        problem = pattern_problem(pattern)
        if problem:
            raise argparse.ArgumentTypeError(f"{pattern!r} {problem}; expected {_VALID}")
    return found


def pattern_problem(pattern: str) -> str:
    """Why no device name can match ``pattern`` ('' when one can): a character the
    kernel refuses in a name ('/', ':', whitespace), an unclosed '[', or more than 15
    characters at the least (pure)."""
    if any(c in "/:" or c.isspace() for c in pattern):
        return "holds a character no device name has ('/', ':' or whitespace)"
    shortest = _shortest_match(pattern)
    if shortest is None:
        return "has a '[' without its ']' (to match a '[' itself write [[])"
    if shortest >= IFNAMSIZ:
        return f"matches only names of {shortest} characters or more, and names have at most 15"
    return ""


def _shortest_match(pattern: str) -> int | None:
    """How many characters a name matching ``pattern`` has at the least (None: a '['
    is not closed); brackets read as ``fnmatch`` reads them."""
    i, length = 0, 0
    while i < len(pattern):
        c = pattern[i]
        i += 1
        if c == "*":
            continue
        if c == "[":
            j = i + (pattern[i:i + 1] == "!")
            j += pattern[j:j + 1] == "]"
            j = pattern.find("]", j)
            if j < 0:
                return None
            i = j + 1
        length += 1
    return length


def matching(wanted: Iterable[str], named: Iterable[str] = ()) -> tuple[str, ...]:
    """The devices of this network namespace whose name matches a pattern of ``wanted``,
    those in ``named`` (``--ebpf-devices``) aside, sorted."""
    wanted = tuple(wanted)
    if not wanted:
        return ()
    skip = set(named)
    return tuple(sorted(name for _, name in socket.if_nameindex()
                        if name not in skip and any(fnmatch.fnmatchcase(name, p)
                                                    for p in wanted)))


RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR = 0x1, 0x10, 0x100
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_DELADDR = 16, 17, 20, 21
IFLA_IFNAME = 3
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One rtnetlink notification: a device came, changed or went (``name``), or one of
    its addresses did (``name`` empty); ``overflow``: some were lost, look at them all."""

    index: int
    name: str = ""
    gone: bool = False
    overflow: bool = False


def link_events(data: bytes) -> list[LinkEvent]:
    """The link and address notifications of one netlink datagram (pure)."""
    events = []
    for kind, _flags, _seq, body in netlink.messages(data):
        if kind in (RTM_NEWLINK, RTM_DELLINK) and len(body) >= _IFINFOMSG.size:
            index = _IFINFOMSG.unpack_from(body)[2]
            raw = netlink.attrs(body, _IFINFOMSG.size).get(IFLA_IFNAME, b"")
            events.append(LinkEvent(index, raw.split(b"\0", 1)[0].decode(errors="replace"),
                                    gone=kind == RTM_DELLINK))
        elif kind in (RTM_NEWADDR, RTM_DELADDR) and len(body) >= _IFADDRMSG.size:
            events.append(LinkEvent(_IFADDRMSG.unpack_from(body)[4]))
    return events


class LinkMonitor:
    """Calls ``on_event`` from a thread of its own for each batch of link and address
    notifications of the network namespace it was made in (``start``)."""

    def __init__(self, on_event: Callable[[list[LinkEvent]], None]) -> None:
        self.on_event = on_event
        self._sock: socket.socket | None = None
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> LinkMonitor:
        """Subscribe (in the caller's namespace) and start the thread."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                             socket.NETLINK_ROUTE)
        sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR))
        self._sock = sock
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="ebpf-link-monitor",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._sock is not None
        while True:
            ready, _, _ = select.select([self._sock.fileno(), self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                events = link_events(self._sock.recv(1 << 16))
            except OSError as err:  # ENOBUFS: notifications were dropped
                log.debug("Link notifications lost (%s): looking at every device", err)
                events = [LinkEvent(0, overflow=True)]
            if not events:
                continue
            try:
                self.on_event(events)
            except Exception:  # noqa: BLE001 - the next sync retries; the monitor goes on
                log.exception("Handling a link event failed; the next sync tries again")

    def stop(self) -> None:
        """Stop the thread and close the socket."""
        if self._thread is not None:
            os.write(self._wake_w, b"x")
            self._thread.join()
            self._thread = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def concerns(events: Iterable[LinkEvent], wanted: Iterable[str], named: Iterable[str],
             attached: Iterable[int]) -> bool:
    """Whether any of ``events`` may change what is attached or the devices' addresses:
    a device of ``named`` or matching ``wanted`` came or went, an attached one changed,
    or notifications were lost (pure)."""
    wanted, named, indexes = tuple(wanted), set(named), set(attached)
    return any(e.overflow or e.index in indexes or e.name in named
               or (e.name and any(fnmatch.fnmatchcase(e.name, p) for p in wanted))
               for e in events)
