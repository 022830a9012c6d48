"""The traffic bench_packet_path.py sends, each function run inside one namespace (a
thread entered into it): new TCP connections, a bounded UDP burst sent with sendmmsg
(through ctypes: batches of 64 datagrams per system call, so Python is not the floor of
the packet rate), and the UDP counters of the receiving pod."""

from __future__ import annotations

import ctypes
import errno
import socket
import time
from dataclasses import dataclass

_libc = ctypes.CDLL(None, use_errno=True)
BATCH = 64

# The pod's server (run with tests/support/lab's Namespaces.start): every TCP connection
# is greeted and closed by the server (its TIME_WAIT stays in the pod, not in the client's
# port range); UDP datagrams land in a socket nobody reads, counted by the kernel
# (InDatagrams, or RcvbufErrors once its small buffer is full) and answered by nothing.
SERVER = """
import socket, sys
port = int(sys.argv[1])
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("0.0.0.0", port))
tcp.listen(1024)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
udp.bind(("0.0.0.0", port))
print("ready", flush=True)
while True:
    conn, _ = tcp.accept()
    try:
        conn.sendall(b"hi\\n")
    except OSError:
        pass
    conn.close()
"""


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(_Iovec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


@dataclass(frozen=True, slots=True)
class Connects:
    """One run of new connections: wall clock, the client thread's CPU (which carries
    the handshake's packets through every hop: veths hand packets on in the sender's
    softirq), and each connect()'s latency (SYN out to SYN/ACK in) in microseconds."""

    count: int
    start: float
    end: float
    cpu: float
    latencies: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Burst:
    """One UDP burst as sent: datagrams the kernel took, wall clock, the sender's CPU."""

    sent: int
    start: float
    end: float
    cpu: float


def connect_loop(host: str, port: int, count: int) -> Connects:
    """``count`` connections to ``host``:``port``, one after another: connect, read the
    greeting until the server closes, close."""
    latencies = []
    cpu0, start = time.thread_time(), time.perf_counter()
    for _ in range(count):
        with socket.socket() as s:
            s.settimeout(5)
            t0 = time.perf_counter()
            s.connect((host, port))
            latencies.append((time.perf_counter() - t0) * 1e6)
            while s.recv(64):
                pass
    return Connects(count, start, time.perf_counter(), time.thread_time() - cpu0,
                    tuple(latencies))


def udp_burst(host: str, port: int, packets: int, size: int = 32) -> Burst:
    """``packets`` datagrams of ``size`` bytes on one connected socket (one flow), in
    sendmmsg batches; a datagram the kernel refuses (ENOBUFS: a full queue) is not
    retried, so the burst is bounded by ``packets`` calls' worth of batches."""
    payload = ctypes.create_string_buffer(size)
    iov = _Iovec(ctypes.cast(payload, ctypes.c_void_p), size)
    vec = (_Mmsghdr * BATCH)()
    for m in vec:
        m.hdr.iov = ctypes.pointer(iov)
        m.hdr.iovlen = 1
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        fd = s.fileno()
        cpu0, start = time.thread_time(), time.perf_counter()
        for left in range(packets, 0, -BATCH):
            n = _libc.sendmmsg(fd, vec, min(BATCH, left), 0)
            if n > 0:
                sent += n
            elif ctypes.get_errno() not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED):
                raise OSError(ctypes.get_errno(), "sendmmsg")
        return Burst(sent, start, time.perf_counter(), time.thread_time() - cpu0)


def udp_received() -> int:
    """Datagrams this namespace's UDP layer took for a socket (InDatagrams plus
    RcvbufErrors: queued, or dropped at a full socket buffer)."""
    with open("/proc/thread-self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    counters = dict(zip(rows[0][1:], (int(v) for v in rows[1][1:]), strict=True))
    return counters["InDatagrams"] + counters["RcvbufErrors"]
