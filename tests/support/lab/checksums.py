"""Turn a device's transmit checksum offload off (``ethtool -K DEV tx off``, through the
SIOCETHTOOL ioctl: no ethtool binary needed).

A veth whose sender offloads checksums hands the peer packets whose L4 checksum field
holds only the pseudo-header's sum (CHECKSUM_PARTIAL), and nothing on the way checks it;
with offload off, the sender writes whole checksums and every receiver verifies them,
so a program that rewrites packets is caught when it gets a checksum wrong (the XDP
tests need it: XDP sees checksums as they are in the packet).
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct

from .netns import call_in

SIOCETHTOOL = 0x8946
ETHTOOL_STXCSUM = 0x17


def _off(device: str) -> None:
    with socket.socket() as s:
        request = array.array("B", struct.pack("II", ETHTOOL_STXCSUM, 0))
        address, _ = request.buffer_info()
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, struct.pack("16sP", device.encode(), address))


def tx_checksums_off(ns: str, device: str = "eth0") -> None:
    """Whole checksums on what ``device`` in ``ns`` sends from now on."""
    call_in(ns, _off, device)
