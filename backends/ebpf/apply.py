"""Apply: a delta of service ports (the SDK's ``StagedBackend``) written to the maps, which
are keyed by address.

``stage`` hands the delta to the claims (which service port's entry each address holds,
``claims.py``) and lists the addresses whose entry may have changed; ``write`` has
``Tables`` write them in the safe order (new endpoint set, then the switch, then the
old set deleted: ``tables.py``). A rebuild (the first sync, after a failure or a
reconnect, a new node context) reads what the kernel holds and writes the differences,
so a restarted backend adopts the pinned maps and no service that stays is ever
missing. Drift (``find_drift``: both maps read back in batches and compared with what
this process wrote) is undone by the next write: entries nobody wrote are deleted, the
service ports whose entries were lost or altered written again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

from svcproxy.sdk import Delta, Drift, ServicePortKey

from .claims import AddressClaims
from .drift import MapDrift
from .layout import ServiceAddress
from .render import Entry, ServicePortEntries
from .tables import Tables, WriteReport


@dataclass(frozen=True, slots=True)
class Staged:
    """What one write changes: packed addresses -> entry (None: delete); ``full``: the
    maps must hold exactly ``changes`` (then no None), anything else of ours deleted."""

    changes: dict[bytes, Entry | None] = field(default_factory=dict)
    full: bool = False


class MapApply:
    """The claims and the maps of one path (the socket programs' or the tc programs')."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.claims = AddressClaims()
        self.drift = MapDrift()  # what the last ``find_drift`` found, undone by ``settle``
        self._settled: Staged | None = None

    def find_drift(self) -> Drift[ServicePortKey]:
        """The service ports whose entries the maps lost or altered; entries or slots
        nobody wrote are skeleton drift (a rebuild deletes them). Read only."""
        self.drift = MapDrift()
        if self.tables.applied is None:
            return Drift()
        drift = self.drift = self.tables.compare()
        if drift.foreign or drift.stray:
            return Drift(skeleton=f"the maps hold {drift}")
        owners = (self.claims.owner(ServiceAddress.unpack(k)) for k in drift.services)
        return Drift(frozenset(k for k in owners if k is not None))

    def stage(self, delta: Delta[ServicePortKey, ServicePortEntries]) -> Staged:
        """Take ``delta`` into the claims; what the maps must change for it."""
        if delta.rebuild:
            self.claims = AddressClaims.of(delta.set)
            return Staged({a.pack(): e for a, e in self.claims.entries.items()}, full=True)
        gone = ((k, None) for k in delta.removed)
        touched = self.claims.update(chain(delta.set.items(), gone))
        entries = self.claims.entries
        changes: dict[bytes, Entry | None] = {a.pack(): entries.get(a) for a in touched}
        for key in self.drift.services:  # lost or altered: written again as they were
            entry = entries.get(ServiceAddress.unpack(key))
            if entry is not None:
                changes[key] = entry
        return Staged(changes)

    def settle(self, staged: Staged) -> None:
        """Make what ``Tables`` knows current before ``staged`` is written: the drift found
        undone, or, for a rebuild, the maps read back (``tables.applied`` then holds what
        the kernel had, e.g. the endpoints a restarted backend's first sync removes)."""
        drift, self.drift = self.drift, MapDrift()
        if drift:
            self.tables.repair(drift)
        elif staged.full:
            self.tables.read_back()
        self._settled = staged

    def write(self, staged: Staged) -> WriteReport:
        """Write ``staged`` (``settle`` first, if it was not)."""
        if self._settled is not staged:
            self.settle(staged)
        self._settled = None
        tables = self.tables
        if staged.full:
            desired = {k: e for k, e in staged.changes.items() if e is not None}
            return tables.full(desired, reread=False)
        return tables.apply(staged.changes)
