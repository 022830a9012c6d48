"""SCTP packets crafted for the packet-path tests (this machine's kernel has no SCTP
sockets): an INIT and its INIT ACK with their CRC32c, sent and read with raw IP
sockets (IPv4 and IPv6) in the lab's namespaces.

What a test built on this proves: the addresses and ports each side sees after the
programs' rewrites, the verification tag and chunk kept, and a CRC32c that a
receiving kernel's ``sctp_rcv`` would accept. What it cannot: an association between
real SCTP sockets (INIT, COOKIE ECHO, data, SHUTDOWN), multi-homing.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from tests.support.lab.netns import call_in

IPPROTO_SCTP = 132
INIT, INIT_ACK = 1, 2
IPV6_RECVPKTINFO = 49  # <linux/in6.h>; Python's socket module lacks it on some builds


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    return table


CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """RFC 9260 appendix B's CRC32c (Castagnoli), as sctp_rcv checks it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Sctp:
    """One SCTP packet as a receiver sees it: its addresses, ports, tag, chunk type,
    and whether its CRC32c is right."""

    source: str
    destination: str
    sport: int
    dport: int
    tag: int
    chunk: int
    crc_ok: bool


def sctp_packet(sport: int, dport: int, tag: int, chunk: int) -> bytes:
    """An SCTP packet with one INIT or INIT ACK chunk, its CRC32c filled in as Linux
    writes it (little-endian)."""
    body = struct.pack("!BBHIIHHI", chunk, 0, 20, 0x1234567, 65535, 1, 1, 42)
    header = struct.pack("!HHI", sport, dport, tag) + bytes(4)
    crc = crc32c(header + body)
    return header[:8] + struct.pack("<I", crc) + body


def parse_sctp(sctp: bytes, source: str, destination: str) -> Sctp:
    """The SCTP packet ``sctp`` (from its common header on) sent from ``source`` to
    ``destination``."""
    sport, dport, tag = struct.unpack("!HHI", sctp[:8])
    (crc,) = struct.unpack("<I", sctp[8:12])
    crc_ok = crc32c(sctp[:8] + bytes(4) + sctp[12:]) == crc
    return Sctp(source, destination, sport, dport, tag, sctp[12], crc_ok)


def raw_socket(ns: str, family: int = 4) -> socket.socket:
    """A raw IPv4 or IPv6 socket for SCTP in ``ns`` (it stays in ``ns``); an IPv6 one
    reports each packet's destination (IPV6_RECVPKTINFO); 3 s timeout."""
    def make() -> socket.socket:
        af = socket.AF_INET if family == 4 else socket.AF_INET6
        s = socket.socket(af, socket.SOCK_RAW, IPPROTO_SCTP)
        if family == 6:
            s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
        s.settimeout(3)
        return s
    sock: socket.socket = call_in(ns, make)
    return sock


def _read(sock: socket.socket) -> Sctp:
    if sock.family == socket.AF_INET:
        packet = sock.recv(65535)  # an IPv4 raw socket reads the IP header too
        ihl = (packet[0] & 0x0F) * 4
        return parse_sctp(packet[ihl:], socket.inet_ntoa(packet[12:16]),
                          socket.inet_ntoa(packet[16:20]))
    data, ancillary, _, peer = sock.recvmsg(65535, socket.CMSG_SPACE(20))
    destination = next(socket.inet_ntop(socket.AF_INET6, raw[:16])
                       for level, kind, raw in ancillary
                       if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO)
    return parse_sctp(data, peer[0], destination)


def receive(sock: socket.socket, dport: int) -> Sctp:
    """The next SCTP packet to ``dport`` that ``sock`` reads (others are skipped)."""
    for _ in range(50):
        got = _read(sock)
        if got.dport == dport:
            return got
    raise AssertionError(f"no SCTP packet to port {dport}")


def exchange(client_ns: str, host: str, port: int, endpoint_ns: str,
             sport: int) -> tuple[Sctp, Sctp]:
    """An INIT from ``client_ns`` to ``host``:``port``, what the endpoint received
    (on its port 8080); then the endpoint's INIT ACK to where it came from, what the
    client received."""
    family = 6 if ":" in host else 4
    client, endpoint = raw_socket(client_ns, family), raw_socket(endpoint_ns, family)
    try:
        client.sendto(sctp_packet(sport, port, 0, INIT), (host, 0))
        arrived = receive(endpoint, 8080)
        answer = sctp_packet(8080, arrived.sport, 0x1234567, INIT_ACK)
        endpoint.sendto(answer, (arrived.source, 0))
        back = receive(client, sport)
        return arrived, back
    finally:
        client.close()
        endpoint.close()
