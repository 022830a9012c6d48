"""Destroy the connected UDP sockets of an endpoint that left its service (Cilium's
terminatePodConnections).

A UDP socket that ``connect()``ed to a service was connected to the endpoint the socket
program chose; when that endpoint leaves the service, nothing would ever move it, and
the application would keep sending into nothing. So the backend finds those sockets
(``sp_revnat`` names each balanced socket by its cookie, with the endpoint and the
service it stands for), looks for them in the network namespace of every thread of
``--ebpf-cgroup``'s processes with sock_diag, and destroys them (``SOCK_DESTROY``,
kernels built with ``CONFIG_INET_DIAG_DESTROY``): the application's next call fails with
ECONNABORTED, and a new ``connect()`` picks a current endpoint. TCP sockets are left to their own
timeouts, as kube-proxy leaves them.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from .libbpf import Map

log = logging.getLogger(__name__)

UDP = socket.IPPROTO_UDP
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY, SOCK_DESTROY = 20, 21
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
CLONE_NEWNET = 0x40000000
TCP_ESTABLISHED = 1  # a connected UDP socket's state

NLMSG = struct.Struct("=IHHII")
# struct inet_diag_req_v2 {u8 family, protocol, ext, pad; u32 states; inet_diag_sockid id}
# struct inet_diag_sockid {be16 sport, dport; be32 src[4], dst[4]; u32 if; u32 cookie[2]}
REQ = struct.Struct("=BBBxI")
SOCKID = struct.Struct("=2s2s16s16sIQ")
# sp_revnat: key {u64 cookie; ep_val ep (20 bytes); u32 reserved}, value: the service's ep_val
REV_KEY = struct.Struct("=Q20s4x")
V4_MAPPED = bytes(10) + b"\xff\xff"

_libc = ctypes.CDLL(None, use_errno=True)


def removed_endpoints(before: Mapping[bytes, tuple[bytes, ...] | None],
                      after: Mapping[bytes, tuple[bytes, ...] | None]) -> dict[
                          bytes, set[bytes]]:
    """Per UDP service key of ``before``, the endpoint slots it had that ``after`` (the
    same keys, None: gone) lacks (pure)."""
    removed: dict[bytes, set[bytes]] = {}
    for key, old in before.items():
        if key[18] != UDP or not old:
            continue
        gone = set(old) - set(after.get(key) or ())
        if gone:
            removed[key] = gone
    return removed


def _service_of(svc_key: bytes) -> bytes:
    """The sp_revnat value a socket of this service key holds (address, port, family)."""
    return svc_key[:18] + svc_key[19:20] + b"\0"


def doomed_cookies(revnat: Iterable[tuple[bytes, bytes]],
                   removed: Mapping[bytes, set[bytes]]) -> dict[int, bytes]:
    """Socket cookie -> endpoint slot of each balanced socket whose endpoint left the
    service it was balanced for (pure)."""
    wanted = {(_service_of(k), ep) for k, eps in removed.items() for ep in eps}
    found: dict[int, bytes] = {}
    for key, value in revnat:
        cookie, ep = REV_KEY.unpack(key)
        if (value[:19] + b"\0", ep[:19] + b"\0") in wanted:
            found[cookie] = ep[:19] + b"\0"
    return found


def _tasks(pid: str) -> list[str]:
    """The /proc paths of every thread of ``pid`` (a thread may be in a namespace of its
    own, as one that entered a pod's)."""
    try:
        return [f"/proc/{pid}/task/{tid}" for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def cgroup_namespaces(cgroup: Path) -> list[int]:
    """Open fds of the network namespaces of every thread of every process in ``cgroup``
    and below, one per namespace (the caller closes them)."""
    seen: set[tuple[int, int]] = set()
    fds: list[int] = []
    for procs in [cgroup / "cgroup.procs", *cgroup.rglob("cgroup.procs")]:
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for task in (t for pid in pids for t in _tasks(pid)):
            try:
                fd = os.open(f"{task}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                os.close(fd)
                continue
            seen.add((st.st_dev, st.st_ino))
            fds.append(fd)
    return fds


def _diag_socket_in(ns_fd: int) -> socket.socket:
    """A sock_diag netlink socket of the network namespace ``ns_fd`` (made in a thread
    that enters it: a socket stays in the namespace it was made in)."""
    box: dict[str, object] = {}

    def make() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(ns_fd, CLONE_NEWNET) != 0:
                box["error"] = OSError(ctypes.get_errno(), "setns")
                return
            try:
                box["sock"] = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
            finally:
                _libc.setns(own, CLONE_NEWNET)
        finally:
            os.close(own)

    thread = threading.Thread(target=make, name="sock-diag-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["sock"]  # type: ignore[return-value]


def _request(family: int, sockid: bytes) -> bytes:
    return REQ.pack(family, UDP, 0, 1 << TCP_ESTABLISHED) + sockid


def _messages(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of the netlink answers, until DONE (or an error's ack)."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + NLMSG.size <= len(data):
            length, kind, _flags, _seq, _pid = NLMSG.unpack_from(data, offset)
            if length < NLMSG.size:
                return
            yield kind, data[offset + NLMSG.size:offset + length]
            if kind in (NLMSG_DONE, NLMSG_ERROR):
                return
            offset += (length + 3) & ~3


def udp_sockets(sock: socket.socket, family: int) -> Iterator[bytes]:
    """The inet_diag_sockid of every connected UDP socket of ``family`` there."""
    body = _request(family, bytes(SOCKID.size))
    sock.send(NLMSG.pack(NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY,
                         NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
    for kind, payload in _messages(sock):
        if kind == SOCK_DIAG_BY_FAMILY:
            yield payload[4:4 + SOCKID.size]


def destroy(sock: socket.socket, family: int, sockid: bytes) -> int:
    """SOCK_DESTROY of one socket; 0 or the errno."""
    body = _request(family, sockid)
    sock.send(NLMSG.pack(NLMSG.size + len(body), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 2, 0)
              + body)
    for kind, payload in _messages(sock):
        if kind == NLMSG_ERROR:
            return -struct.unpack_from("=i", payload)[0]
    return 0


def _endpoint_of(family: int, sockid: bytes) -> bytes:
    """The peer of a dumped socket as an ep_val (IPv4-mapped peers as IPv4)."""
    _sport, dport, _src, dst, _if, _cookie = SOCKID.unpack(sockid)
    if family == socket.AF_INET:
        return dst[:4] + bytes(12) + dport + b"\x04\0"
    if dst[:12] == V4_MAPPED:
        return dst[12:] + bytes(12) + dport + b"\x04\0"
    return dst + dport + b"\x06\0"


def terminate(cgroup: Path, doomed: Mapping[int, bytes]) -> list[int]:
    """Destroy the sockets of ``doomed`` (cookie -> endpoint) found in the namespaces of
    ``cgroup``'s processes; returns the cookies destroyed."""
    done: list[int] = []
    if not doomed:
        return done
    for ns_fd in cgroup_namespaces(cgroup):
        try:
            sock = _diag_socket_in(ns_fd)
        except OSError as err:
            log.debug("Skipping a network namespace: %s", err)
            continue
        finally:
            os.close(ns_fd)
        with sock:
            for family in (socket.AF_INET, socket.AF_INET6):
                for sockid in list(udp_sockets(sock, family)):
                    cookie = SOCKID.unpack(sockid)[5]
                    if doomed.get(cookie) != _endpoint_of(family, sockid):
                        continue
                    result = destroy(sock, family, sockid)
                    if result == 0:
                        done.append(cookie)
                    elif result == errno.EOPNOTSUPP:
                        log.warning("This kernel cannot destroy sockets (CONFIG_INET_DIAG_"
                                    "DESTROY): UDP sockets of removed endpoints stay "
                                    "connected to them")
                        return done
                    elif result != errno.ENOENT:
                        log.warning("Destroying a UDP socket of a removed endpoint: %s",
                                    os.strerror(result))
    return done


def terminate_removed(revnat: Map, cgroup: Path,
                      removed: Mapping[bytes, set[bytes]]) -> int:
    """Destroy the connected UDP sockets balanced to endpoints that left their service
    and forget their reverse translations; returns how many were destroyed."""
    if not removed:
        return 0
    doomed = doomed_cookies(revnat.items(), removed)
    done = terminate(cgroup, doomed)
    if done:
        keys = [REV_KEY.pack(c, doomed[c]) for c in done]
        revnat.delete_many(keys)
        log.info("Destroyed %d connected UDP sockets of removed endpoints", len(done))
    return len(done)
