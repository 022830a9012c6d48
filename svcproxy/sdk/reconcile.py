"""A reset costs the dataplane nothing: what the new snapshot changed, nothing more.

When the frontend answers a resume with a reset (its history no longer reaches the
client's revision, or the client moved to another replica, whose revisions mean
nothing here), the client rebuilds its state from the snapshot. The backend then gets
only the service ports whose records differ from what the client held before (and a
node change if the node or, for a cluster watch, the node set differs), not a full
sync: nothing is flushed, nothing rewritten that did not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState


@dataclass(frozen=True, slots=True)
class BeforeReset:
    """What the client held, and had not yet handed out, when a reset arrived."""

    services: dict[ServicePortKey, ServicePortState]
    node: NodeInfo | None
    nodes: dict[str, NodeInfo]
    full: bool
    dirty: frozenset[ServicePortKey]
    node_changed: bool
    triggers: frozenset[float]


def changed_services(old: Mapping[ServicePortKey, ServicePortState],
                     new: Mapping[ServicePortKey, ServicePortState]) -> set[ServicePortKey]:
    """The service ports added, removed or different between two states (for the
    dataplane: the trigger time, which replicas may stamp differently, is not compared)."""
    return {k for k in old.keys() | new.keys() if not _same(old.get(k), new.get(k))}


def _same(a: ServicePortState | None, b: ServicePortState | None) -> bool:
    if a is None or b is None or a == b:
        return a == b
    return a.endpoints == b.endpoints and (
        replace(a.service, trigger_time=0.0) == replace(b.service, trigger_time=0.0))


def trigger_times(records: Mapping[ServicePortKey, ServicePortState],
                  keys: set[ServicePortKey]) -> set[float]:
    """The trigger times of the changed records (for the programming-latency metric)."""
    return {r.service.trigger_time for k in keys if (r := records.get(k)) is not None
            and r.service.trigger_time}
