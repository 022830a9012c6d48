"""``--ebpf-pod-devices``: the devices pods' traffic enters the node by (each pod's host
end of its veth, as Calico's eBPF dataplane attaches to ``cali*``), found by name pattern.

The tc programs on them serve what the socket programs cannot take: processes outside
``--ebpf-cgroup`` and SCTP. A matching device that appears later is attached at the next
sync or link event; the pins of one that went (its links went with it) are removed.
"""

from __future__ import annotations

import fnmatch
import logging
import socket
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)


def patterns(text: str) -> tuple[str, ...]:
    """``cali*,tap*`` as its patterns (shell-style: ``*``, ``?``, ``[...]``)."""
    return tuple(p for p in (part.strip() for part in text.split(",")) if p)


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


def sweep(tc_dir: Path, wanted: Iterable[str], present: Iterable[str]) -> list[str]:
    """Remove the link pins of matching devices that are not ``present`` any more (a pod's
    veth goes with its pod, and its links with it); returns the devices swept."""
    wanted, here = tuple(wanted), set(present)
    gone: set[str] = set()
    for pin in tc_dir.glob("link_*_*gress"):
        device = pin.name[len("link_"):].rsplit("_", 1)[0]
        if device not in here and any(fnmatch.fnmatchcase(device, p) for p in wanted):
            pin.unlink(missing_ok=True)
            gone.add(device)
    for device in sorted(gone):
        log.info("--ebpf-pod-devices: %s is gone; its tc pins are removed", device)
    return sorted(gone)
