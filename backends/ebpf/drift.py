"""Drift (pure): how the maps, as read back, differ from what this process wrote.

Every periodic resync reads both maps in batches (``Tables.compare``); the service ports
whose addresses' entries or endpoint slots were deleted or altered are written again
from their applied values (``Delta.repair``), and entries nobody wrote make the resync a
rebuild that deletes them (``StagedBackend``'s skeleton drift).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .layout import EP_KEY, KernelEntry


@dataclass(frozen=True, slots=True)
class MapDrift:
    """How the maps differ from what this process wrote (``compare``).

    ``services``: applied service keys whose entry is gone or altered, or one of whose
    endpoint slots is; ``foreign``: service keys this process never wrote; ``stray``:
    endpoint slots no applied service points at."""

    services: frozenset[bytes] = frozenset()
    foreign: frozenset[bytes] = frozenset()
    stray: frozenset[bytes] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.services or self.foreign or self.stray)

    def __str__(self) -> str:
        return (f"{len(self.services)} service entries lost or altered, {len(self.foreign)} "
                f"not ours, {len(self.stray)} endpoint slots nobody uses")


def compare(applied: Mapping[bytes, KernelEntry],
            written: tuple[Mapping[bytes, bytes], Mapping[bytes, bytes]],
            services: Mapping[bytes, bytes], endpoints: Mapping[bytes, bytes]) -> MapDrift:
    """What the maps (as read: key -> value bytes) hold that is not as written (pure):
    ``written`` is (services, endpoints) as this process wrote them for ``applied``."""
    wrote_services, wrote_slots = written
    lost = set() if wrote_services == services else {
        k for k, _ in wrote_services.items() - services.items()}
    bad_slots = () if wrote_slots == endpoints else wrote_slots.items() - endpoints.items()
    if bad_slots:
        sets = {EP_KEY.unpack(k)[0] for k, _ in bad_slots}
        lost.update(k for k, have in applied.items()
                    if have.value.count and have.value.set_id in sets)
    return MapDrift(frozenset(lost), frozenset(services.keys() - wrote_services.keys()),
                    frozenset(endpoints.keys() - wrote_slots.keys()))
