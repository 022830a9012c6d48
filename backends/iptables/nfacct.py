"""kube-proxy's nfacct counters: named packet counters in the kernel (nfnetlink_acct).

kube-proxy creates two accounting objects and references them from its rules with
``-m nfacct --nfacct-name NAME``: ``ct_state_invalid_dropped_pkts`` on the KUBE-FORWARD
rule dropping conntrack-INVALID packets, and ``localhost_nps_accepted_pkts`` on the
KUBE-NODEPORTS rules of NodePorts reached on 127.0.0.0/8. Its /metrics reads them back
as ``kubeproxy_iptables_ct_state_invalid_dropped_packets_total`` and
``kubeproxy_iptables_localhost_nodeports_accepted_packets_total``.

This is a small client of the nfnetlink_acct protocol (NETLINK_NETFILTER, subsystem
7): create an object, read its packet count, list the objects, delete one (``--cleanup``:
the kernel refuses while a rule still references it). With a command prefix ``ip netns exec NS``
(tests, benchmarks) the socket is opened inside that namespace: a short-lived thread
enters it (setns changes only the calling thread's namespace) and the socket stays
bound to it.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import threading
from collections.abc import Sequence

from svcproxy.sdk import netlink

log = logging.getLogger(__name__)

INVALID_DROPPED = "ct_state_invalid_dropped_pkts"
LOCALHOST_NODEPORTS = "localhost_nps_accepted_pkts"
COUNTERS = (INVALID_DROPPED, LOCALHOST_NODEPORTS)

NETLINK_NETFILTER = netlink.NETLINK_NETFILTER
NFNL_SUBSYS_ACCT = 7
MSG_NEW, MSG_GET, MSG_DEL = 0, 1, 3
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
NFACCT_NAME, NFACCT_PKTS = 1, 2
NAME_MAX = 32
TIMEOUT = 5.0  # seconds for the kernel's answer (it always answers: data, ACK or error)
_GENMSG = struct.Struct("=BBH")  # nfgenmsg: family, version, res_id


class NfacctError(OSError):
    """The kernel refused an nfacct request (or has no nfacct)."""


def _name(name: str) -> bytes:
    raw = name.encode() + b"\0"
    if len(raw) > NAME_MAX:
        raise ValueError(f"nfacct name {name!r} is longer than {NAME_MAX - 1} bytes")
    return netlink.attr(NFACCT_NAME, raw)


class Nfacct:
    """nfacct objects of one network namespace."""

    def __init__(self, prefix: Sequence[str] = ()) -> None:
        self._path = netlink.netns_path(prefix)
        self._sock: socket.socket | None = None
        self._seq = 0
        self._lock = threading.Lock()

    def _socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = netlink.open_socket(NETLINK_NETFILTER, self._path, TIMEOUT)
        return self._sock

    def _request(self, msg: int, flags: int, payload: bytes) -> list[tuple[int, bytes]]:
        """Send one request; the messages of the answer, up to its ACK, its error, its
        one reply or (a dump) its end."""
        with self._lock:
            sock = self._socket()
            self._seq += 1
            body = _GENMSG.pack(socket.AF_UNSPEC, 0, 0) + payload
            kind = (NFNL_SUBSYS_ACCT << 8) | msg
            sock.send(netlink.message(kind, netlink.NLM_F_REQUEST | flags, self._seq, body))
            dump = flags & netlink.NLM_F_DUMP == netlink.NLM_F_DUMP
            return self._answer(sock, self._seq, dump)

    @staticmethod
    def _answer(sock: socket.socket, seq: int, dump: bool) -> list[tuple[int, bytes]]:
        # The reply to a GET of one object carries NLM_F_MULTI too, without an end.
        replies: list[tuple[int, bytes]] = []
        while True:
            for kind, _flags, got, body in netlink.messages(sock.recv(65536)):
                if got != seq:
                    continue
                if kind == netlink.NLMSG_ERROR:
                    if code := netlink.error_code(body):
                        raise NfacctError(code, os.strerror(code))
                    return replies
                if kind == netlink.NLMSG_DONE:
                    return replies
                replies.append((kind, body))
                if not dump:
                    return replies

    def create(self, name: str) -> None:
        """Make the object ``name`` (an existing one is kept, with its counts)."""
        try:
            self._request(MSG_NEW, NLM_F_CREATE | NLM_F_EXCL | netlink.NLM_F_ACK, _name(name))
        except NfacctError as err:
            if err.errno != errno.EEXIST:
                raise

    def packets(self, name: str) -> int:
        """Packets counted by ``name`` so far."""
        for _, body in self._request(MSG_GET, 0, _name(name)):
            value = netlink.attrs(body, _GENMSG.size).get(NFACCT_PKTS)
            if value is not None:
                return int(struct.unpack(">Q", value)[0])
        raise NfacctError(errno.ENODATA, f"nfacct {name}: no packet count in the answer")

    def names(self) -> list[str]:
        """Every object's name in this namespace."""
        found = []
        for _, body in self._request(MSG_GET, netlink.NLM_F_DUMP, b""):
            raw = netlink.attrs(body, _GENMSG.size).get(NFACCT_NAME)
            if raw is not None:
                found.append(raw.split(b"\0", 1)[0].decode(errors="replace"))
        return found

    def delete(self, name: str) -> bool:
        """Remove the object ``name``; False if there is none. Raises (EBUSY) while a
        rule references it."""
        try:
            self._request(MSG_DEL, netlink.NLM_F_ACK, _name(name))
        except NfacctError as err:
            if err.errno == errno.ENOENT:
                return False
            raise
        return True

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def remove_counters(nfacct: Nfacct) -> list[str]:
    """``--cleanup``: delete kube-proxy's counters (after our rules, which reference
    them, are gone). One still referenced by a rule that is not ours is left, with a
    warning. Returns the failures."""
    failures = []
    for name in COUNTERS:
        try:
            if nfacct.delete(name):
                log.info("Removed the nfacct counter %s", name)
        except NfacctError as err:
            if err.errno == errno.EBUSY:
                log.warning("nfacct counter %s left: a rule that is not svcproxy's still "
                            "references it", name)
            else:
                failures.append(f"nfacct {name}: {err.strerror}")
        except OSError as err:  # no nfnetlink_acct (no socket): nothing was created
            log.debug("No nfacct counters to remove: %s", err)
            break
    return failures
