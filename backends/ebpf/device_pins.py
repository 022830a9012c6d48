"""The pins the packet path keeps per device, and their removal when the device goes or
is no longer served: tcx links (``link_<device>_ingress`` / ``_egress``), XDP links
(``link_<device>_xdp_<mode>``), the clsact fallback's filters and qdisc marker
(``clsact.py``).

A device that is deleted takes its links, filters and qdisc with it, but not their pins:
those are removed when the kernel says it went (or at the next sync), not only at
``--cleanup``. A device still here that left ``--ebpf-devices`` or stopped matching
``--ebpf-pod-devices`` has its programs detached as well.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import clsact, libbpf
from .libbpf import BpfError
from .names import LINK_PREFIX, device_of_pin

log = logging.getLogger(__name__)

HOOK_SUFFIXES = ("_ingress", "_egress")


def _device_of_link(name: str) -> str:
    """The device of a link pin's name ('' when it is no per-device link)."""
    rest = name.removeprefix(LINK_PREFIX)
    if "_xdp_" in rest:
        return device_of_pin(rest.rpartition("_xdp_")[0])
    for suffix in HOOK_SUFFIXES:
        if rest.endswith(suffix):
            return device_of_pin(rest.removesuffix(suffix))
    return ""


def link_pins(tc_dir: Path, device: str) -> list[Path]:
    """``device``'s tcx and XDP link pins."""
    return [p for p in tc_dir.glob(f"{LINK_PREFIX}*") if _device_of_link(p.name) == device]


def pinned_devices(tc_dir: Path) -> set[str]:
    """Every device something of the packet path is pinned for."""
    found = {_device_of_link(p.name) for p in tc_dir.glob(f"{LINK_PREFIX}*")}
    return (found - {""}) | clsact.devices(tc_dir)


def release(tc_dir: Path, device: str) -> list[str]:
    """Detach whatever of ours still runs on ``device`` and remove its pins; returns
    their names."""
    removed = []
    for pin in link_pins(tc_dir, device):
        try:
            fd = libbpf.obj_get(str(pin))
            try:
                libbpf.lib().bpf_link_detach(fd)
            finally:
                os.close(fd)
        except BpfError as err:
            log.warning("Detaching %s: %s", pin, err.strerror)
        pin.unlink(missing_ok=True)
        removed.append(pin.name)
    return removed + clsact.detach(tc_dir, device)


def sweep(tc_dir: Path, wanted: Iterable[str]) -> list[str]:
    """Release the devices with pins that are gone or not ``wanted`` (logged once each);
    returns them, sorted."""
    wanted = set(wanted)
    done = []
    for device in sorted(pinned_devices(tc_dir)):
        try:
            socket.if_nametoindex(device)
            here = True
        except OSError:
            here = False
        if here and device in wanted:
            continue
        removed = release(tc_dir, device)
        if here:
            log.info("%s is no longer served by the packet path: its tc programs are "
                     "detached (%s)", device, ", ".join(removed))
        else:
            log.info("%s is gone; its tc pins are removed (%s)", device, ", ".join(removed))
        done.append(device)
    return done



def dump_lines(tc_dir: Path) -> Iterator[str]:
    """``--dump``: how each device runs the tc programs (tcx links or the clsact
    fallback), from the pins."""
    tcx = {_device_of_link(p.name) for p in tc_dir.glob(f"{LINK_PREFIX}*")
           if p.name.endswith(HOOK_SUFFIXES) and "_xdp_" not in p.name}
    for device in sorted(tcx - {""}):
        yield f"tc {device}: tcx links"
    yield from clsact.dump_lines(tc_dir)
