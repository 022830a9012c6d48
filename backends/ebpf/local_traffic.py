"""kube-proxy's local-traffic detector (``--detect-local-mode``) in the packet path's maps
(``bpf/local_traffic.h``): a new flow from outside to a ClusterIP is masqueraded unless
it is local traffic, as kube-proxy's nftables and iptables modes mark it.

The node context says per family what local traffic is (``LocalTraffic``, read here as
nft reads it for its ``ip saddr`` / ``iifname`` matches): sources in its CIDRs
(ClusterCIDR, NodeCIDR), or packets that arrived on a device whose name has the prefix
(InterfaceNamePrefix) or is the bridge's (BridgeInterface); no detector, nothing is
masqueraded by this rule. ``local_set`` turns that and the devices here into what the
maps hold (pure); ``LocalTrafficMaps`` writes it switch-last: a new set under a new
generation, then spp_local names it in one update, then the old generation is deleted.
A matching device that comes or goes while the settings stay is one element added or
deleted. A restart adopts what the maps hold when it is what is wanted.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from svcproxy.sdk import LocalTraffic, normalize_cidr

from .libbpf import Map, list_keys
from .packet_layout import (
    LOCAL_BY_DEVICE,
    LOCAL_BY_SOURCE,
    LOCAL_CFG,
    LOCAL_DEV_KEY,
    LOCAL_NONE,
    pack_local_cidr,
    unpack_local_cidr,
)
from .pod_devices import LinkEvent

log = logging.getLogger(__name__)

DEVICE_MODES = ("InterfaceNamePrefix", "BridgeInterface")
CFG_KEY = bytes(4)
MODE_NAMES = {LOCAL_NONE: "none (no detector: not masqueraded)",
              LOCAL_BY_SOURCE: "by source address", LOCAL_BY_DEVICE: "by arriving device"}


@dataclass(frozen=True, slots=True)
class LocalSet:
    """One generation's content: each family's mode (IPv4's, IPv6's), the local
    prefixes and the ifindexes of the local devices."""

    modes: tuple[int, int] = (LOCAL_NONE, LOCAL_NONE)
    cidrs: frozenset[str] = field(default_factory=frozenset)
    devices: frozenset[int] = field(default_factory=frozenset)


def _by_device(local: LocalTraffic) -> bool:
    return bool(local.interface) and local.mode in DEVICE_MODES


def _is_local_device(local: LocalTraffic, name: str) -> bool:
    if local.by_interface_prefix:
        return name.startswith(local.interface)
    return name == local.interface


def local_set(families: Mapping[int, LocalTraffic],
              devices: Iterable[tuple[int, str]]) -> LocalSet:
    """What the maps hold for ``families`` (the node context's, per family) with
    ``devices`` (index, name) here (pure)."""
    modes, cidrs, local = [], set(), set()
    devices = tuple(devices)
    for family in (4, 6):
        detector = families.get(family)
        if detector is not None and _by_device(detector):
            modes.append(LOCAL_BY_DEVICE)
            local |= {i for i, name in devices if _is_local_device(detector, name)}
            continue
        # The node's pod CIDRs come from the frontend: only well-formed ones count.
        mine = {n for c in (detector.cidrs if detector else ()) if (n := normalize_cidr(c))}
        modes.append(LOCAL_BY_SOURCE if mine else LOCAL_NONE)
        cidrs |= mine
    return LocalSet((modes[0], modes[1]), frozenset(cidrs), frozenset(local))


class LocalTrafficMaps:
    """spp_local, spp_local_cidrs and spp_local_devices kept at the node context's
    detector; ``write`` from the sync and from the link monitor's thread (the caller
    serializes them)."""

    def __init__(self, cfg: Map, cidrs: Map, devices: Map) -> None:
        self.cfg, self.cidrs, self.devices = cfg, cidrs, devices
        self.families: dict[int, LocalTraffic] | None = None  # the last context's
        self.gen = 0
        self.written: LocalSet | None = None  # the current generation's; None: read it
        self.written_for: dict[int, LocalTraffic] | None = None  # the settings it is of

    def set_context(self, families: Mapping[int, LocalTraffic]) -> None:
        self.families = dict(families)

    def concerns(self, events: Iterable[LinkEvent]) -> bool:
        """Whether a link event may change the local devices (pure but for the state)."""
        families, written = self.families, self.written
        detectors = [d for d in (families or {}).values() if _by_device(d)]
        if not detectors:
            return False
        held = written.devices if written else frozenset()
        return any(e.overflow or e.index in held
                   or (e.name and any(_is_local_device(d, e.name) for d in detectors))
                   for e in events)

    def write(self, devices: Iterable[tuple[int, str]] | None = None) -> None:
        """Make the maps hold the detector of the last context, with ``devices`` (index,
        name; default: those here)."""
        if self.families is None:
            return
        want = local_set(self.families, socket.if_nameindex() if devices is None else devices)
        if self.written is None:
            self._adopt()
        assert self.written is not None
        if want == self.written:
            self.written_for = self.families
            return
        if self.written_for == self.families and want.modes == self.written.modes \
                and want.cidrs == self.written.cidrs:
            self._devices_changed(want)
        else:
            self._switch(want)
        self.written, self.written_for = want, self.families

    def _adopt(self) -> None:
        """Read the generation in use and its content; delete other generations' keys (a
        switch a crash interrupted)."""
        raw = self.cfg.lookup(CFG_KEY)
        gen, mode4, mode6 = LOCAL_CFG.unpack(raw) if raw else (0, LOCAL_NONE, LOCAL_NONE)
        cidrs, devices = set(), set()
        for key in list_keys(self.cidrs):
            key_gen, cidr = unpack_local_cidr(key)
            if key_gen == gen:
                cidrs.add(cidr)
            else:
                self.cidrs.delete(key)
        for key in list_keys(self.devices):
            key_gen, index = LOCAL_DEV_KEY.unpack(key)
            if key_gen == gen:
                devices.add(index)
            else:
                self.devices.delete(key)
        self.gen = gen
        self.written = LocalSet((mode4, mode6), frozenset(cidrs), frozenset(devices))

    def _devices_changed(self, want: LocalSet) -> None:
        """The same settings, devices came or went: each one element in the generation."""
        assert self.written is not None
        for index in sorted(want.devices - self.written.devices):
            self.devices.update(LOCAL_DEV_KEY.pack(self.gen, index), b"\x01")
        for index in sorted(self.written.devices - want.devices):
            self.devices.delete(LOCAL_DEV_KEY.pack(self.gen, index))

    def _switch(self, want: LocalSet) -> None:
        """``want`` under a new generation, the switch, the old generation deleted."""
        old, gen = self.gen, (self.gen + 1) & 0xFFFFFFFF
        for cidr in sorted(want.cidrs):
            self.cidrs.update(pack_local_cidr(gen, cidr), b"\x01")
        for index in sorted(want.devices):
            self.devices.update(LOCAL_DEV_KEY.pack(gen, index), b"\x01")
        self.cfg.update(CFG_KEY, LOCAL_CFG.pack(gen, *want.modes))
        self.gen = gen
        assert self.written is not None
        for cidr in sorted(self.written.cidrs):
            self.cidrs.delete(pack_local_cidr(old, cidr))
        for index in sorted(self.written.devices):
            self.devices.delete(LOCAL_DEV_KEY.pack(old, index))
        log.info("Local traffic (--detect-local-mode): IPv4 %s, IPv6 %s; %d prefixes, "
                 "%d devices", MODE_NAMES[want.modes[0]], MODE_NAMES[want.modes[1]],
                 len(want.cidrs), len(want.devices))


def dump_lines(cfg: Map, cidrs: Map, devices: Map) -> list[str]:
    """``--dump``'s lines: each family's mode and the current generation's content."""
    raw = cfg.lookup(CFG_KEY)
    if raw is None:
        return ["local traffic: none written (not masqueraded)"]
    gen, mode4, mode6 = LOCAL_CFG.unpack(raw)
    prefixes = sorted(c for g, c in map(unpack_local_cidr, list_keys(cidrs)) if g == gen)
    indexes = sorted(i for g, i in map(LOCAL_DEV_KEY.unpack, list_keys(devices)) if g == gen)
    lines = [f"local traffic: IPv4 {MODE_NAMES.get(mode4, mode4)}, "
             f"IPv6 {MODE_NAMES.get(mode6, mode6)} (generation {gen})"]
    if prefixes:
        lines.append("local traffic prefixes: " + " ".join(prefixes))
    if indexes:
        lines.append("local traffic devices: " + " ".join(_device(i) for i in indexes))
    return lines


def _device(index: int) -> str:
    try:
        return f"{socket.if_indextoname(index)} ({index})"
    except OSError:
        return f"({index}, gone)"
