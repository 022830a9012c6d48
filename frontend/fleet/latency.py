"""The cluster-wide network programming latency (pure): from an EndpointSlice change's
trigger time until every connected, reporting node whose view the change reached has
applied it (svcproxy_frontend_cluster_programming_latency_seconds).

A change is followed from the revision it was published at with the nodes it must reach;
a node leaves the set when it reports that revision (or a later one), disconnects or
stops reporting; once the set is empty the latency is observed. At most MAX_FOLLOWED
changes are followed (the oldest beyond is dropped, counted in ``dropped``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MAX_FOLLOWED = 1000


@dataclass(slots=True)
class _Change:
    trigger_time: float
    waiting: set[str] = field(default_factory=set)


class ClusterLatency:
    """Changes being followed by revision; ``observe`` gets each latency in seconds."""

    def __init__(self, observe: Callable[[float], None]) -> None:
        self.observe = observe
        self.followed: OrderedDict[int, _Change] = OrderedDict()
        self.dropped = 0

    def published(self, revision: int, trigger_time: float, nodes: Iterable[str],
                  now: float) -> None:
        """A change triggered at ``trigger_time`` (unix), published at ``revision`` for
        ``nodes`` (those counted: connected and reporting)."""
        waiting = set(nodes)
        if not trigger_time:
            return
        if not waiting:
            self.observe(max(0.0, now - trigger_time))
            return
        self.followed[revision] = _Change(trigger_time, waiting)
        while len(self.followed) > MAX_FOLLOWED:
            self.followed.popitem(last=False)
            self.dropped += 1

    def applied(self, node: str, revision: int, now: float) -> None:
        """``node`` reported ``revision`` applied."""
        for rev, change in self.followed.items():
            if rev > revision:
                break
            change.waiting.discard(node)
        self._complete(now)

    def left(self, node: str, now: float) -> None:
        """``node`` is no longer counted (disconnected, or not reporting)."""
        for change in self.followed.values():
            change.waiting.discard(node)
        self._complete(now)

    def _complete(self, now: float) -> None:
        done = [rev for rev, change in self.followed.items() if not change.waiting]
        for rev in done:
            change = self.followed.pop(rev)
            self.observe(max(0.0, now - change.trigger_time))
