"""Write services and endpoint sets so that no lookup ever sees a half-updated service.

A service whose endpoints change gets a new endpoint set: its slots are written
under a fresh set id first, then the service entry switches to it in one map
update, then the old set's slots are deleted. A program that read the old entry
and misses an old slot reads the entry again (see ``pick`` in the C source). A
full sync reads what the kernel holds and writes only the differences, so a
service that stays is never missing, and a restarted backend adopts the maps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .drift import MapDrift, compare
from .layout import KernelEntry, ServiceValue, ep_key
from .libbpf import BpfError, Map
from .render import Entry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WriteReport:
    """What one apply wrote (for logs, metrics and benchmarks)."""

    services_written: int = 0
    services_deleted: int = 0
    slots_written: int = 0
    slots_deleted: int = 0


def read_kernel(services: Map, endpoints: Map) -> tuple[dict[bytes, KernelEntry], set[int]]:
    """The services map with each entry's endpoint set, and the set ids nobody points at."""
    sets: dict[int, dict[int, bytes]] = {}
    for key, value in endpoints.items():
        set_id, slot = int.from_bytes(key[:4], "little"), int.from_bytes(key[4:], "little")
        sets.setdefault(set_id, {})[slot] = value
    applied: dict[bytes, KernelEntry] = {}
    for key, raw in services.items():
        service = ServiceValue.unpack(raw)
        members = sets.get(service.set_id, {}) if service.count else {}
        slots = tuple(members.get(i) for i in range(service.count))
        complete = all(s is not None for s in slots)
        applied[key] = KernelEntry(service, slots if complete else None)  # type: ignore[arg-type]
    used = {a.value.set_id for a in applied.values()}
    return applied, set(sets) - used


class Tables:
    """The services and endpoints maps and what this process knows they hold."""

    def __init__(self, services: Map, endpoints: Map,
                 on_failure: Callable[[str], None] = lambda _map: None) -> None:
        self.services = services
        self.endpoints = endpoints
        self.on_failure = on_failure
        self.applied: dict[bytes, KernelEntry] | None = None  # None: unknown, read the kernel
        self.next_set = 1
        self.slot_count = 0
        # What this process wrote, as the maps hold it (key -> value bytes): None when
        # unknown, then made from ``applied`` when ``verify`` needs it.
        self._written: tuple[dict[bytes, bytes], dict[bytes, bytes]] | None = None
        self._orphans: set[int] = set()  # sets nobody points at, found by ``read_back``
        self._read = False  # ``read_back`` since the last ``full``

    def read_back(self) -> None:
        """Learn what the maps hold (how a restarted backend adopts the pins); the
        endpoint sets nobody points at are deleted by the next ``full``."""
        applied, orphans = self._guard(self.endpoints.name, read_kernel,
                                       self.services, self.endpoints)
        self.applied = applied
        self.slot_count = sum(a.value.count for a in applied.values())
        used = {a.value.set_id for a in applied.values()} | orphans
        self.next_set = max(used, default=0) + 1
        self._written = None
        self._orphans = orphans
        self._read = True

    def full(self, desired: Mapping[bytes, Entry], reread: bool = True) -> WriteReport:
        """Make the maps hold exactly ``desired``, writing the differences: against what
        they hold (read back now, or by ``read_back`` since the last ``full``), or with
        ``reread`` False against what this process wrote."""
        if reread or self.applied is None:
            self.read_back()
        applied = self.applied
        assert applied is not None
        changes: dict[bytes, Entry | None] = {k: None for k in applied if k not in desired}
        changes.update(desired)
        report = self.apply(changes)
        if self._read:
            self._written = None  # read back with incomplete sets: made again when needed
            self._read = False
        orphans, self._orphans = self._orphans, set()
        if orphans:
            self._delete_sets(orphans)
            log.info("Removed %d endpoint sets no service used", len(orphans))
        return report

    def compare(self) -> MapDrift:
        """Read both maps and compare them with what this process wrote (read only)."""
        if self.applied is None:
            raise RuntimeError("the maps' contents are unknown: run a full sync")
        held = self._guard(self.services.name, self.services.read_all)
        slots = self._guard(self.endpoints.name, self.endpoints.read_all)
        written = self._written_maps()
        if (held, slots) == written:
            return MapDrift()
        return compare(self.applied, written, held, slots)

    def repair(self, drift: MapDrift) -> None:
        """Undo ``drift`` (what ``compare`` found): entries and slots nobody wrote are
        deleted at once; a service whose entry or slots differ is forgotten, so that the
        next ``full`` or ``apply`` writes it again (a new set, then the switch, as any
        change)."""
        assert self.applied is not None
        if drift.foreign:
            self._guard(self.services.name, self.services.delete_many, sorted(drift.foreign))
        if drift.stray:
            self._guard(self.endpoints.name, self.endpoints.delete_many, sorted(drift.stray))
        for key in drift.services:
            have = self.applied.get(key)
            if have is not None:
                self.applied[key] = KernelEntry(have.value, None)

    def _written_maps(self) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        """(services, endpoints) as this process wrote them."""
        if self._written is None:
            assert self.applied is not None
            services: dict[bytes, bytes] = {}
            slots: dict[bytes, bytes] = {}
            for key, have in self.applied.items():
                services[key] = have.value.pack()
                slots.update(zip(_slot_keys(have.value), have.slots or (), strict=False))
            self._written = (services, slots)
        return self._written

    def _delete_sets(self, set_ids: Iterable[int]) -> None:
        wanted = set(set_ids)
        keys = [k for k, _ in self.endpoints.items()
                if int.from_bytes(k[:4], "little") in wanted]
        self._guard(self.endpoints.name, self.endpoints.delete_many, keys)

    def _new_set(self) -> int:
        set_id = self.next_set
        self.next_set = set_id + 1 if set_id < 0xFFFFFFFF else 1
        return set_id

    def apply(self, changes: Mapping[bytes, Entry | None]) -> WriteReport:
        """Write the entries of ``changes`` (None: delete) in the safe order."""
        if self.applied is None:
            raise RuntimeError("the maps' contents are unknown: run a full sync")
        applied = self.applied
        slot_keys: list[bytes] = []
        slot_values: list[bytes] = []
        svc_keys: list[bytes] = []
        svc_values: list[bytes] = []
        svc_gone: list[bytes] = []
        retired: list[bytes] = []
        after: dict[bytes, KernelEntry | None] = {}
        for key, want in changes.items():
            have = applied.get(key)
            if want is None:
                if have is not None:
                    svc_gone.append(key)
                    retired += _slot_keys(have.value)
                    after[key] = None
                continue
            slots = want.slots
            if have is not None and have.slots == slots:
                value = ServiceValue(have.value.set_id, len(slots), want.flags,
                                     want.affinity_timeout, want.service_id)
                if value == have.value:
                    continue
            else:
                value = ServiceValue(self._new_set() if slots else 0, len(slots), want.flags,
                                     want.affinity_timeout, want.service_id)
                slot_keys += [ep_key(value.set_id, i) for i in range(len(slots))]
                slot_values += slots
                if have is not None:
                    retired += _slot_keys(have.value)
            svc_keys.append(key)
            svc_values.append(value.pack())
            after[key] = KernelEntry(value, slots)
        try:
            # New sets first, then services that go (making room in a full map), then the
            # switches, then the sets nobody points at any more.
            self._guard(self.endpoints.name, self.endpoints.update_many, slot_keys, slot_values)
            self._guard(self.services.name, self.services.delete_many, svc_gone)
            self._guard(self.services.name, self.services.update_many, svc_keys, svc_values)
            self._guard(self.endpoints.name, self.endpoints.delete_many, retired)
        except BpfError:
            self.applied = None
            self._written = None
            raise
        if self._written is not None:
            services, written_slots = self._written
            for key in retired:
                written_slots.pop(key, None)
            written_slots.update(zip(slot_keys, slot_values, strict=True))
            for key in svc_gone:
                services.pop(key, None)
            services.update(zip(svc_keys, svc_values, strict=True))
        for key, entry in after.items():
            old = applied.pop(key, None)
            self.slot_count -= old.value.count if old else 0
            if entry is not None:
                applied[key] = entry
                self.slot_count += entry.value.count
        return WriteReport(len(svc_keys), len(svc_gone), len(slot_keys), len(retired))

    def _guard(self, name: str, fn: Callable[..., object], *args: object):  # type: ignore[no-untyped-def]
        """Run one map operation; count a failure against map ``name``."""
        try:
            return fn(*args)
        except BpfError:
            self.on_failure(name)
            raise


def _slot_keys(value: ServiceValue) -> list[bytes]:
    return [ep_key(value.set_id, i) for i in range(value.count)]
