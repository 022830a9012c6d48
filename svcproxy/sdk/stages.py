"""Render -> diff -> apply, with the applied state tracked once for every backend.

A backend renders what the dataplane must hold (pure: state in, values out), diffs
it against what it applied before, and applies only the difference. ``Applied``
remembers what the last successful apply left, so a periodic resync costs a diff,
not a rewrite; after a failed apply it forgets, and the next sync rebuilds::

    class FileBackend(StagedBackend[str]):
        def render(self, state, record):
            return f"{record.service.cluster_ips} -> {sorted(record.endpoints)}"

        def apply(self, delta):
            ...  # write delta.set and delta.repair, remove delta.removed;
                 # delta.rebuild: replace all

        def find_drift(self, state):
            ...  # read the dataplane, compare it with self.applied: Drift(keys that differ)

Values must compare by value (frozen dataclasses, tuples, strings): an item whose
rendering did not change is not applied again.

Drift (someone else changed what we programmed): on every periodic resync the stages
ask ``find_drift`` which applied items the dataplane no longer holds as applied, and
hand those to ``apply`` in ``Delta.repair``, with their applied values (not rendered
again); a drifted skeleton (what every item relies on) makes the resync a rebuild to
the applied values. A backend that does not override ``find_drift`` is repaired only
by rebuilds (``full_sync_interval``, ``repair_reason``).
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.refusals import Refusals, describe, invalid_values

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

__all__ = ["Applied", "Delta", "Drift", "StagedBackend"]

log = logging.getLogger(__name__)

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Delta(Generic[K, V]):
    """What one apply must change.

    ``rebuild``: what the dataplane holds is unknown (first sync, or the previous apply
    failed); apply must make it hold exactly ``set`` and remove anything else it owns.
    Otherwise ``set`` holds the new and changed items (``previous`` their applied
    values, for the changed ones), ``removed`` what to take away (with its applied
    value), and ``repair`` applied items the dataplane lost or altered (``find_drift``
    said so): apply must make the dataplane hold their value (unchanged) again, whatever
    part of it is there now. A key is in at most one of ``set``, ``removed``, ``repair``.
    """

    rebuild: bool
    set: Mapping[K, V] = field(default_factory=dict)
    removed: Mapping[K, V] = field(default_factory=dict)
    previous: Mapping[K, V] = field(default_factory=dict)
    repair: Mapping[K, V] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.rebuild or bool(self.set) or bool(self.removed) or bool(self.repair)


@dataclass(frozen=True, slots=True)
class Drift(Generic[K]):
    """What ``StagedBackend.find_drift`` found in the dataplane that is not as applied.

    ``items``: applied keys whose objects are missing, altered or joined by others of
    theirs (they are written again from their applied values); ``skeleton``: why what
    every item relies on (a table, a base chain, a shared map) is not as applied, or "":
    then everything applied is rewritten (a rebuild). Empty: the dataplane is as applied.
    """

    items: frozenset[K] = frozenset()
    skeleton: str = ""

    def __bool__(self) -> bool:
        return bool(self.items) or bool(self.skeleton)


def _without_none(items: Mapping[K, V | None]) -> dict[K, V]:
    """``items`` less those whose value is None, in order: a copy of a dict keeps its
    keys' hashes (a comprehension hashes every key again, a Python call for a
    dataclass's), and there are usually few to take out."""
    out = dict(items)
    for key in [k for k, v in out.items() if v is None]:
        del out[key]
    return out  # type: ignore[return-value]


class Applied(Mapping[K, V]):
    """What the last successful apply left in the dataplane, item by item (read only
    as a mapping; changed only by ``commit`` and ``invalidate``).

    During ``StagedBackend.apply`` it still holds the old values: the delta being applied
    is committed only after ``apply`` returns (and then only the part it took), so
    ``apply`` can compare each new value with ``self.applied[key]`` to write only what
    differs. An ``apply`` that raises makes it forget everything (``invalidate``): the
    next sync rebuilds."""

    def __init__(self) -> None:
        self._items: dict[K, V] = {}
        self._known = False

    @property
    def known(self) -> bool:
        """False before the first commit and after ``invalidate``."""
        return self._known

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def diff(self, desired: Mapping[K, V | None], *, full: bool) -> Delta[K, V]:
        """The delta from what is applied to ``desired``.

        ``full``: ``desired`` is everything wanted (an applied key it lacks is removed);
        otherwise it covers only the keys that may have changed, None meaning "gone".
        """
        if not self._known:
            return Delta(True, _without_none(desired))
        items = self._items
        changed: dict[K, V] = {}
        removed: dict[K, V] = {}
        previous: dict[K, V] = {}
        for key, value in desired.items():
            old = items.get(key, _MISSING)
            if value is None:
                if old is not _MISSING:
                    removed[key] = old  # type: ignore[assignment]
            elif old is not value and old != value:
                changed[key] = value
                if old is not _MISSING:
                    previous[key] = old  # type: ignore[assignment]
        if full:
            removed.update((k, v) for k, v in items.items() if k not in desired)
        return Delta(False, changed, removed, previous)

    def commit(self, delta: Delta[K, V]) -> None:
        """Record that ``delta`` was applied."""
        if delta.rebuild:
            self._items = dict(delta.set)
        else:
            for key in delta.removed:
                self._items.pop(key, None)
            self._items.update(delta.set)
        self._known = True

    def invalidate(self) -> None:
        """Forget: the dataplane may hold anything (an apply failed half-way)."""
        self._items = {}
        self._known = False


class StagedBackend(Backend, Generic[V]):
    """A backend whose ``sync`` is render -> diff -> apply, one value per service port.

    Subclasses write ``render`` (pure) and ``apply``; ``sync`` does the rest: a full
    render on a full sync or a node change, a partial one otherwise, the diff against
    ``self.applied``, and the bookkeeping after success or failure.

    ``render`` may read the record and ``state.node``, nothing else: a record that is
    the very object rendered before, for an equal node, is not rendered again, so a
    periodic resync with nothing changed costs a lookup per service port.

    Changes made behind the backend's back (a firewall reload, a foreign rule) are
    found on every periodic resync by ``find_drift`` (the kernel compared with
    ``self.applied``) and only what differs is written again (``Delta.repair``). They
    are also repaired by a rebuild to the applied values (not rendered again) plus any
    changes: on every full sync that is not a periodic resync (after a reconnect), on
    the first periodic resync once ``full_sync_interval`` seconds have passed since the
    last rebuild (an hour, as kube-proxy's full syncs; None: never; 0: every resync),
    when ``find_drift`` reports the skeleton drifted, and whenever ``repair_reason``
    names one (a backend adds its own).

    A backend that keeps ``self.refusals`` (a ``Refusals``) has its service ports
    screened before ``render``: a version the dataplane refused keeps its applied value
    until its retry is due (``Refusals``' backoff; it is then rendered and tried again
    although its record did not change, and ``retry_in`` tells the node agent when to
    sync for it), and a record with values no rule may hold (``invalid_values``) is
    refused until it changes, keeping its applied value. ``render`` then sees only
    records to render.
    """

    full_sync_interval: float | None = 3600.0
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self.applied: Applied[ServicePortKey, V] = Applied()
        self._sources: dict[ServicePortKey, ServicePortState | None] = {}
        self._node: NodeInfo | None = None
        self._pending: tuple[bool, dict[ServicePortKey, ServicePortState | None]] = (False, {})
        self._last_rebuild: float | None = None

    @abstractmethod
    def render(self, state: NodeState, record: ServicePortState) -> V | None:
        """What the dataplane must hold for one service port (None: nothing)."""

    @abstractmethod
    def apply(self, delta: Delta[ServicePortKey, V]) -> Delta[ServicePortKey, V] | None:
        """Change the dataplane by ``delta``; raise if it was not applied.

        Return None when all of it was applied. A dataplane that refused some items
        alone (and took the others) returns the part it took, a delta of the same kind:
        the refused items keep their applied value (a rebuild: none) and are not rendered
        again until their record changes.
        """

    def diff(self, state: NodeState, changes: Changes) -> Delta[ServicePortKey, V]:
        """Render what may have changed and compare it with what is applied."""
        same_node = state.node == self._node
        full = changes.full or not same_node or not self.applied.known
        reuse = self.applied.known and same_node
        keys: Iterable[ServicePortKey] = state.services if full else changes.services
        if full and reuse:
            # Everything applied is known and its records are at hand: only the service
            # ports whose record is another object, and those gone, can differ.
            keys, full = self._moved(state), False
        retry = self._retries(state) if reuse else frozenset()
        if retry:
            keys = list(keys)
            listed = set(keys)
            keys += [k for k in retry if k not in listed]
        desired: dict[ServicePortKey, V | None] = {}
        sources: dict[ServicePortKey, ServicePortState | None] = {}
        for key in keys:
            record = sources[key] = state.services.get(key)
            if record is None:
                desired[key] = None
            elif reuse and self._sources.get(key) is record and key not in retry:
                desired[key] = self.applied.get(key)
            else:
                desired[key] = self._render_screened(state, record)
        self._pending = (full, sources)
        self._node = state.node
        delta = self.applied.diff(desired, full=full)
        if delta.rebuild:
            return delta
        if self.repair_reason(changes):
            return self._as_rebuild(delta)
        if changes.reason == "periodic":
            return self._repairing(state, delta)
        return delta

    def _render_screened(self, state: NodeState, record: ServicePortState) -> V | None:
        """``render``, unless the record is refused (its retry not due) or holds a value
        no rule may hold (then refused until it changes): its applied value then."""
        refusals = self._refusals()
        if refusals is not None:
            key = record.key
            if refusals and refusals.holds(key, record):
                return self.applied.get(key)
            reason = invalid_values(record)
            if reason is not None:
                refusals.refuse(key, record, f"invalid value: {reason}", retry=False)
                return self.applied.get(key)
        return self.render(state, record)

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        """Compare what the dataplane holds with ``self.applied`` (called on every periodic
        resync, before ``apply``): the applied service ports whose objects differ, or the
        skeleton's drift. It must be cheap (one read of the dataplane, a comparison: it
        runs every sync period at 10,000 services) and read only; the default checks
        nothing. Objects of others (a foreign chain in our table) are not drift."""
        return Drift()

    def _repairing(self, state: NodeState, delta: Delta[ServicePortKey, V]
                   ) -> Delta[ServicePortKey, V]:
        """``delta`` plus the repair of what ``find_drift`` reports (a rebuild for the
        skeleton)."""
        drift = self.find_drift(state)
        if drift.skeleton:
            log.warning("Backend %s: %s (changed behind its back): rewriting everything "
                        "applied", self.name, drift.skeleton)
            return self._as_rebuild(delta)
        applied = self.applied
        repair = {k: applied[k] for k in drift.items
                  if k in applied and k not in delta.set and k not in delta.removed}
        if not repair:
            return delta
        shown = ", ".join(describe(k) for k in sorted(repair)[:5])
        more = f" and {len(repair) - 5} more" if len(repair) > 5 else ""
        log.warning("Backend %s: %d service ports changed behind its back (%s%s): writing "
                    "them again", self.name, len(repair), shown, more)
        return replace(delta, repair=repair)

    def _retries(self, state: NodeState) -> frozenset[ServicePortKey]:
        """Refused service ports whose retry is due (rendered again although unchanged)."""
        refusals = self._refusals()
        if not refusals:
            return frozenset()
        return frozenset(k for k in refusals.due() if k in state.services)

    def _refusals(self) -> Refusals | None:
        """The backend's ``self.refusals`` (a ``Refusals``), if it keeps one."""
        refusals = getattr(self, "refusals", None)
        return refusals if isinstance(refusals, Refusals) else None

    def retry_in(self) -> float | None:
        """Seconds until a refused service port is due for another try (0: now), or None
        when none waits: the node agent syncs then, without a change."""
        refusals = self._refusals()
        return refusals.retry_in() if refusals is not None else None

    def repair_reason(self, changes: Changes) -> str:
        """Why this sync must rewrite everything applied although it is known, or "": a
        full sync that is not the periodic one (after a reconnect or a retry: what the
        dataplane holds may have changed meanwhile), or the first periodic resync once
        ``full_sync_interval`` has passed since the last rebuild. Backends extend it (a
        canary chain found gone)."""
        if changes.reason != "periodic":
            return f"full sync ({changes.reason})" if changes.full else ""
        interval, last = self.full_sync_interval, self._last_rebuild
        if interval is None or last is None:
            return ""
        return "full sync interval" if self.clock() - last >= interval else ""

    def _as_rebuild(self, delta: Delta[ServicePortKey, V]) -> Delta[ServicePortKey, V]:
        """``delta`` as a rebuild: the applied values with the delta applied to them."""
        values = {k: v for k, v in self.applied.items() if k not in delta.removed}
        values.update(delta.set)
        return Delta(True, values)

    def _moved(self, state: NodeState) -> list[ServicePortKey]:
        """Service ports whose record is not the one last rendered, or that are gone
        (or whose removal the dataplane refused)."""
        sources, services = self._sources, state.services
        moved: list[ServicePortKey] = []
        known = 0  # keys of the state that were rendered before (each key hashed once)
        for key, record in services.items():
            source = sources.get(key)
            if source is not None:
                known += 1
                if source is record:
                    continue
            moved.append(key)
        if known != len(sources):
            moved += [k for k in sources if k not in services]
        return moved

    def sync(self, state: NodeState, changes: Changes) -> None:
        delta = self.diff(state, changes)
        done: Delta[ServicePortKey, V] | None = None
        if delta:
            try:
                done = self.apply(delta)
            except BaseException:
                self.applied.invalidate()
                self._sources = {}
                raise
        self.applied.commit(delta if done is None else done)
        if delta.rebuild:
            self._last_rebuild = self.clock()
        self._remember()

    def _remember(self) -> None:
        """Which record each applied value came from (after a successful apply)."""
        full, sources = self._pending
        applied = self.applied
        if full:
            self._sources = _without_none(sources)
            # A removal the dataplane refused: None keeps it to be removed again.
            self._sources.update((k, None) for k in applied if k not in self._sources)
            return
        for key, record in sources.items():
            if record is None and key not in applied:
                self._sources.pop(key, None)
            else:
                self._sources[key] = record
