"""The fleet, pure: each node's latest report beside what it is served, and its state.

``Fleet`` is told what happens (a node's streams, a batch published for its view, a
report) with the time it happened, and answers each node's state from what it was told
and what the node is served now (``Served``, read from its view by the adapter). No I/O,
no clock of its own: tested with made-up times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from svcproxy.model import ServicePortKey

# Per node, the publish times of the batches it has not applied (the oldest gives the lag
# in seconds); beyond this many the newest is overwritten, the oldest kept.
MAX_PENDING = 256


class State(StrEnum):
    """FleetNodeState's values (proto names without NODE_)."""

    UNKNOWN = "UNKNOWN"
    APPLIED = "APPLIED"
    SYNCING = "SYNCING"
    LAGGING = "LAGGING"
    DISAGREEING = "DISAGREEING"
    DISCONNECTED = "DISCONNECTED"


# The states in which a node is counted as behind or wrong (a log line on entering and on
# leaving them).
TROUBLED = frozenset({State.LAGGING, State.DISAGREEING})


@dataclass(frozen=True, slots=True)
class Report:
    """One node's report, validated (reports.py)."""

    revision: int
    epoch: str
    digest: int | None
    applied_time: float
    refused: tuple[tuple[ServicePortKey, str], ...] = ()
    refused_count: int = 0
    backend: str = ""
    backend_version: str = ""
    full_sync: bool = False
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Served:
    """What a node's view holds now: the revision of its newest batch, the digest there,
    and how many of its batches came after a given applied revision."""

    revision: int
    digest: int | None
    lag_revisions: int = 0


@dataclass(slots=True)
class NodeRecord:
    """What the fleet knows of one node."""

    name: str
    report: Report | None = None
    received: float = 0.0  # unix time of the report
    connected: bool = False
    disconnected_at: float | None = None
    pending: deque[tuple[int, float]] = field(default_factory=deque)
    state: State = State.UNKNOWN

    def lag_seconds(self, now: float) -> float:
        """Since the oldest batch not applied was published (0 when none is)."""
        return max(0.0, now - self.pending[0][1]) if self.pending else 0.0


def state_of(record: NodeRecord, served: Served | None, now: float,
             lag_warning: float) -> State:
    """A node's state (FleetNodeState's comments say each)."""
    report = record.report
    if not record.connected:
        return State.DISCONNECTED if report is not None else State.UNKNOWN
    if report is None or served is None:
        return State.UNKNOWN
    if report.revision >= served.revision:
        if (report.revision == served.revision and report.digest is not None
                and served.digest is not None and report.digest != served.digest):
            return State.DISAGREEING
        return State.APPLIED
    if record.lag_seconds(now) > lag_warning:
        return State.LAGGING
    return State.SYNCING


class Fleet:
    """Every node that watches or reported, by name; see the module docstring."""

    def __init__(self, lag_warning: float = 10.0, forget_after: float = 300.0) -> None:
        self.lag_warning = lag_warning
        self.forget_after = forget_after
        self.nodes: dict[str, NodeRecord] = {}

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(self.nodes.values())

    def record(self, name: str) -> NodeRecord:
        found = self.nodes.get(name)
        if found is None:
            found = self.nodes[name] = NodeRecord(name)
        return found

    def connections(self, connected: Iterable[str], now: float) -> set[str]:
        """The nodes watching now are ``connected``: the names whose connection changed."""
        connected = set(connected)
        changed = set()
        for name in connected:
            record = self.record(name)
            if not record.connected:
                record.connected, record.disconnected_at = True, None
                changed.add(name)
        for record in self.nodes.values():
            if record.connected and record.name not in connected:
                record.connected, record.disconnected_at = False, now
                record.pending.clear()
                changed.add(record.name)
        return changed

    def published(self, revision: int, names: Iterable[str], now: float) -> None:
        """A batch at ``revision`` was published for the views of ``names``."""
        nodes = self.nodes
        for name in names:
            record = nodes.get(name)
            if record is None or not record.connected:
                continue
            if record.report is not None and record.report.revision >= revision:
                continue
            if len(record.pending) >= MAX_PENDING:
                record.pending[-1] = (revision, record.pending[-1][1])
            else:
                record.pending.append((revision, now))

    def reported(self, name: str, report: Report, now: float) -> NodeRecord:
        """A node's newest report (an older revision than the one held replaces it too:
        the node was reset)."""
        record = self.record(name)
        record.report, record.received = report, now
        if not record.connected and record.disconnected_at is None:
            record.disconnected_at = now  # reported, not watching: forgotten in time
        pending = record.pending
        while pending and pending[0][0] <= report.revision:
            pending.popleft()
        return record

    def forget(self, now: float) -> list[str]:
        """Forget the nodes disconnected for longer than ``forget_after``."""
        gone = [r.name for r in self.nodes.values() if not r.connected and (
            r.disconnected_at is None or now - r.disconnected_at > self.forget_after)]
        for name in gone:
            del self.nodes[name]
        return gone

    def update_state(self, record: NodeRecord, served: Served | None,
                     now: float) -> State | None:
        """Set ``record``'s state from what it is served; the previous state when it
        changed, else None."""
        new = state_of(record, served, now, self.lag_warning)
        if new == record.state:
            return None
        old, record.state = record.state, new
        return old

    def counts(self) -> dict[str, int]:
        """Nodes by state (every state, 0 included)."""
        out = dict.fromkeys(State, 0)
        for record in self.nodes.values():
            out[record.state] += 1
        return {str(k): v for k, v in out.items()}
