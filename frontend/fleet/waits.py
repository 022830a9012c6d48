"""One wait for the fleet (WaitFleet), pure: which counted nodes have not applied yet.

Counted: every connected node that reports, and a node that reported and disconnected,
until ``lost_after`` seconds after it did (it gets a snapshot when it returns). A node
that does not report (UNKNOWN) cannot be waited for: it is named apart, never counted.

For an endpoint, the wait remembers, per node, the first revision of its view at which
the view was as asked (the address routed nowhere, or the endpoint ready): the node is
done once it applied that revision; the view turning back resets it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from svcproxy.frontend.fleet.conditions import (
    Address,
    ViewLike,
    changed_after,
    has_ready,
    of_service,
    routes_to,
)
from svcproxy.frontend.fleet.model import Fleet, NodeRecord, State

DEFAULT_LOST_AFTER = 10.0


@dataclass(frozen=True, slots=True)
class Progress:
    counted: tuple[str, ...]
    behind: tuple[str, ...]
    unknown: tuple[str, ...]

    @property
    def done(self) -> bool:
        return not self.behind


@dataclass(slots=True)
class Wait:
    """``as_asked(view)`` tells whether a view is as asked (endpoint waits); ``service``
    (namespace, name, up to revision) makes it a wait for a Service's changes."""

    as_asked: Callable[[ViewLike], bool] | None = None
    service: tuple[str, str, int] | None = None
    lost_after: float = DEFAULT_LOST_AFTER
    _targets: dict[str, int | None] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)
    _done: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def endpoint_gone(cls, address: Address, lost_after: float) -> Wait:
        return cls(lambda view: not routes_to(view.records, address), lost_after=lost_after)

    @classmethod
    def endpoint_ready(cls, ip: str, lost_after: float) -> Wait:
        return cls(lambda view: has_ready(view.records, ip), lost_after=lost_after)

    def counts(self, record: NodeRecord, now: float) -> bool:
        """Whether ``record`` is waited for."""
        if record.report is None or record.state is State.UNKNOWN:
            return False
        if record.connected:
            return True
        return (record.disconnected_at is not None
                and now - record.disconnected_at <= self.lost_after)

    def node_done(self, record: NodeRecord, view: ViewLike | None) -> bool:
        assert record.report is not None
        applied = record.report.revision
        if view is None:
            return False
        if self.service is not None:
            namespace, name, upto = self.service
            return not changed_after(view, applied, upto, of_service(namespace, name))
        return (target := self._target(record.name, view)) is not None and applied >= target

    def _target(self, name: str, view: ViewLike) -> int | None:
        """The first revision of ``view`` seen as asked (None: not as asked now)."""
        if self._seen.get(name) != view.revision:
            self._seen[name] = view.revision
            assert self.as_asked is not None
            if not self.as_asked(view):
                self._targets[name] = None
            elif self._targets.get(name) is None:
                self._targets[name] = view.revision
        return self._targets.get(name)

    def progress(self, fleet: Fleet, views: Mapping[str, ViewLike], now: float,
                 changed: set[str] | None = None) -> Progress:
        """Where the wait is; only the nodes in ``changed`` (None: every node) are
        decided again, the others' answers are remembered."""
        counted, behind, unknown = [], [], []
        done = self._done
        for record in fleet:
            name = record.name
            if not self.counts(record, now):
                if record.connected and record.report is None:
                    unknown.append(name)
                continue
            counted.append(name)
            if changed is None or name in changed or name not in done:
                done[name] = self.node_done(record, views.get(name))
            if not done[name]:
                behind.append(name)
        return Progress(tuple(sorted(counted)), tuple(sorted(behind)), tuple(sorted(unknown)))
