"""The changelog: each view's records and its revisioned history of changes.

``Changelog.publish`` takes what a batch touched in the store, has the services
recomputed, diffs each view's old and new records and appends the ops (and the
state digest after them) to the views that changed, under one new revision. A view
is made when a stream first asks for it (nothing is computed for a node nobody
watches; a one-off GetNodeState reads ``state`` without one): a copy of its zone's
shared records with its own on top, and their digest from terms computed once. Before
sync nothing is published (nothing is served yet); ``start`` computes every service
listed once.

What it keeps is bounded (``ViewBounds``, docs/memory.md): the histories in bytes, per
view and in total, oldest first; the views in number, a view nobody watches for a name
that is no Node going after ``idle_seconds`` (or sooner, to make room); the encoder's
caches by the records the views hold.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from svcproxy.convert import DIGEST_MASK
from svcproxy.frontend.computation.compute import NodeClassCache
from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.publication.digests import Digests, add_digest, node_delta, nodes_term
from svcproxy.frontend.publication.encoding import SWEEP_FLOOR, RecordEncoder
from svcproxy.frontend.publication.views import CLUSTER_VIEW, NodeView
from svcproxy.frontend.publication.wire import WireOp, delete_node, diff_with_digest, set_node
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.runtime.gctuning import collector_paused
from svcproxy.frontend.store.store import ChangedKeys, ObjKey, Store, node_info
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState

log = logging.getLogger(__name__)
# Called after each published revision with the ops of every view it changed.
PublishListener = Callable[[int, dict[str, list[WireOp]]], None]
Pending = dict[str, list[WireOp]]
# --history-max-bytes: every view's history together, in bytes charged (views.charge).
HISTORY_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class ViewBounds:
    """What the changelog keeps at most, besides ``history_limit`` ops per view."""

    # Every view's history together (--history-max-bytes); one view's is at most an
    # eighth of it. Past it the oldest batches of any view go first.
    history_bytes: int = HISTORY_BYTES
    # Views at once (--max-views); a new name past it is refused (TooManyViews) unless
    # a view nobody needs can go to make room.
    max_views: int = 10_000
    # A view nobody watches, for a name that is no Node, goes after this long...
    idle_seconds: float = 120.0
    # ...or sooner, when more than this many such views are kept.
    idle_views: int = 128
    # New entries the encoder's caches take between two sweeps at least.
    cache_floor: int = SWEEP_FLOOR

    @property
    def view_history_bytes(self) -> int:
        return max(1, self.history_bytes // 8)


DEFAULT_BOUNDS = ViewBounds()


class TooManyViews(Exception):
    """A view for a new name would be past ``ViewBounds.max_views``."""


class Changelog:
    """The views (one per node watched or known, and the cluster's) and their history."""

    def __init__(self, store: Store, records: ServiceRecords, history_limit: int = 20000,
                 bounds: ViewBounds = DEFAULT_BOUNDS) -> None:
        self.store = store
        self.records = records
        self.history_limit = history_limit
        self.bounds = bounds
        # Every view's history_bytes together.
        self.history_bytes = 0
        # Views nobody needs (no watcher, no Node): name -> since when, oldest first.
        self._idle: OrderedDict[str, float] = OrderedDict()
        self.clock: Callable[[], float] = time.monotonic
        # Revisions start at the start time in microseconds, so a restarted
        # frontend never serves a revision an older instance handed out.
        self.revision = int(time.time() * 1e6)
        self.digests = Digests(RecordEncoder(self._live_records, bounds.cache_floor))
        self.views: dict[str, NodeView] = {}
        # Zone -> its shared records and the sum of their digest terms.
        self._shared_terms: dict[str, tuple[dict[ServicePortKey, ServicePortState], int]] = {}
        self.listeners: list[PublishListener] = []
        self.started = False

    def _new_view(self, name: str) -> NodeView:
        return NodeView(name, self.revision, self.history_limit,
                        self.bounds.view_history_bytes)

    def _live_records(self) -> Iterator[Iterable[ServicePortState]]:
        """The records the views hold (what the encoder's caches keep at a sweep)."""
        for view in self.views.values():
            yield view.records.values()

    # ---- views ---------------------------------------------------------
    def view(self, name: str) -> NodeView:
        """The view of a node (``CLUSTER_VIEW``: of every node), made on first use;
        TooManyViews when it would be one past ``max_views`` that are all needed."""
        view = self.views.get(name)
        if view is None:
            self._make_room()
            view = self.views[name] = self._new_view(name)
            self._note_idle(view)
            if self.started:
                # A view made (or forgotten and made again) must not resume its old
                # clients: its history starts at a revision none of them can hold.
                self.revision += 1
                with collector_paused():
                    self._fill(view)
        return view

    def _fill(self, view: NodeView) -> None:
        """Give ``view`` its nodes, records and digest at the current revision."""
        nodes = self.store.nodes
        if view.name == CLUSTER_VIEW:
            view.nodes = {name: node_info(nodes[name]) for name in sorted(nodes)}
        else:
            view.node = node_info(nodes[view.name]) if view.name in nodes else None
        shared = self.records.shared(self.store.zone(view.name))
        total = self._shared_total(self.store.zone(view.name), shared)
        records = dict(shared)
        term = self.digests.record_term
        for own in self.records.own(view.name):
            for key, rec in own.items():
                old = shared.get(key)
                total += term(rec) - (term(old) if old is not None else 0)
            records.update(own)
        view.records = records
        self.history_bytes -= view.history_bytes
        view.clear_history(self.revision)
        view.digest = (nodes_term(view) + total) & DIGEST_MASK

    def _shared_total(self, zone: str, shared: dict[ServicePortKey, ServicePortState]) -> int:
        """The sum of the digest terms of a zone's shared records (unmasked)."""
        hit = self._shared_terms.get(zone)
        if hit is None or hit[0] is not shared:
            hit = self._shared_terms[zone] = (
                shared, sum(map(self.digests.record_term, shared.values())))
        return hit[1]

    def state(self, name: str) -> tuple[NodeInfo | None, Mapping[ServicePortKey,
                                                                ServicePortState]]:
        """Node ``name`` and its records now: its view's, or computed without making a
        view when it has none (a one-off GetNodeState keeps nothing)."""
        view = self.views.get(name)
        if view is not None:
            return view.node, view.records
        node = self.store.nodes.get(name)
        return (node_info(node) if node else None), self.records.node_records(name)

    def watch(self, name: str) -> NodeView:
        """The view of ``name``, counted as watched by one more stream (TooManyViews as
        ``view``)."""
        view = self.view(name)
        view.watchers += 1
        self._idle.pop(name, None)
        metrics.CLIENTS.inc()
        return view

    def unwatch(self, view: NodeView) -> None:
        """One stream of ``view`` ended (the view goes ``idle_seconds`` after its last
        stream if no Node has its name)."""
        view.watchers -= 1
        metrics.CLIENTS.dec()
        if self.views.get(view.name) is view:
            self._note_idle(view)

    def release(self, view: NodeView) -> None:
        """Forget now a view nobody watches and no Node backs (made for one use)."""
        name = view.name
        if self.views.get(name) is view and not self._needed(view):
            self._drop(name)

    def _needed(self, view: NodeView) -> bool:
        return bool(view.watchers) or view.is_cluster or view.name in self.store.nodes

    def _note_idle(self, view: NodeView) -> None:
        """Note when a view became one nobody needs (or that it is needed again)."""
        if self._needed(view):
            self._idle.pop(view.name, None)
        elif view.name not in self._idle:
            self._idle[view.name] = self.clock()
            while len(self._idle) > self.bounds.idle_views:
                self._drop(next(iter(self._idle)))

    def _drop(self, name: str) -> None:
        view = self.views.pop(name)
        self._idle.pop(name, None)
        self.history_bytes -= view.history_bytes

    def expire(self) -> None:
        """Forget the views nobody needed for ``idle_seconds``."""
        limit = self.clock() - self.bounds.idle_seconds
        idle = self._idle
        while idle:
            name, since = next(iter(idle.items()))
            if since > limit:
                break
            self._drop(name)

    def _make_room(self) -> None:
        """Room for one more view: the oldest one nobody needs goes if there are
        ``max_views``; TooManyViews if every one is needed."""
        self.expire()
        if len(self.views) < self.bounds.max_views:
            return
        if self._idle:
            self._drop(next(iter(self._idle)))
            return
        metrics.VIEWS_REFUSED.inc()
        raise TooManyViews(
            f"this frontend already serves {len(self.views)} views (--max-views), each "
            "watched or of a Node: watch the name of an existing Node, end streams that "
            "are not needed, or start the frontend with a higher --max-views")

    # ---- sync ----------------------------------------------------------
    def start(self) -> None:
        """At sync: no revision before it can be resumed from, each service listed is
        computed once (its node classes when a view needs them) and every view made
        before gets its first state."""
        self.revision += 1
        self.records.compute_deferred()
        for view in self.views.values():
            self._fill(view)
        self.started = True

    # ---- publishing ----------------------------------------------------
    def publish(self, touched: ChangedKeys) -> None:
        """Publish what a batch changed, as one revision of every view it changed."""
        if not self.started:
            self.records.compute_settled(touched.services)
            return
        pending: Pending = {}
        self._publish_nodes(touched.nodes, pending)
        for svc in touched.services:
            self._publish_service(svc, pending)
        changed = {n: ops for n, ops in pending.items() if ops}
        if not changed:
            if touched.services or touched.nodes:
                # No view changed, but what a node without one is answered may have:
                # GetNodeState's listings are named by the revision.
                self.revision += 1
                metrics.REVISION.set(self.revision)
            return
        self.revision += 1
        metrics.REVISION.set(self.revision)
        for name, ops in changed.items():
            view = self.views[name]
            before = view.history_bytes
            view.append(self.revision, ops, view.digest)
            self.history_bytes += view.history_bytes - before
            metrics.BATCH_OPS.observe(len(ops))
        if self.history_bytes > self.bounds.history_bytes:
            self._trim_histories()
        for listener in self.listeners:
            listener(self.revision, changed)
        for name in touched.nodes:
            if name in self.views:
                self._note_idle(self.views[name])
        self.expire()

    def _trim_histories(self) -> None:
        """Every view's history together back under the budget (to 15/16 of it, so that
        this runs once per sixteenth of it): the oldest batches first, of any view."""
        target = self.bounds.history_bytes * 15 // 16
        heap = [(v.history[0][0], name) for name, v in self.views.items() if v.history]
        heapq.heapify(heap)
        while heap and self.history_bytes > target:
            _, name = heapq.heappop(heap)
            view = self.views[name]
            self.history_bytes -= view.drop_oldest()
            if view.history:
                heapq.heappush(heap, (view.history[0][0], name))

    def _publish_nodes(self, names: set[str], pending: Pending) -> None:
        cluster = self.views.get(CLUSTER_VIEW)
        for name in names:
            node = self.store.nodes.get(name)
            info = node_info(node) if node else None
            op = set_node(info) if info else delete_node(name)
            if cluster is not None:
                pending.setdefault(CLUSTER_VIEW, []).append(op)
                add_digest(cluster, node_delta(cluster.nodes.get(name), info))
                if info:
                    cluster.nodes[name] = info
                else:
                    cluster.nodes.pop(name, None)
            view = self.views.get(name)
            if view is None:
                continue
            old_zone = view.node.zone if view.node else ""
            add_digest(view, node_delta(view.node, info))
            view.node = info
            pending.setdefault(name, []).append(op)
            if (info.zone if info else "") != old_zone:
                self._recompute_view(view, pending)

    def _recompute_view(self, view: NodeView, pending: Pending) -> None:
        """A node's zone changed: every service may now select differently for it."""
        zone = self.store.zone(view.name)
        ops = pending.setdefault(view.name, [])
        for cache in self.records.caches.values():
            new = cache.records(view.name, zone)
            for key, rec in new.items():
                diff, delta = diff_with_digest(view.records.get(key), rec,
                                               self.digests.encoder)
                ops += diff
                add_digest(view, delta)
            view.records.update(new)

    def _publish_service(self, svc: ObjKey, pending: Pending) -> None:
        old_keys = self.records.port_keys(svc)
        try:
            cache = self.records.compute(svc)
            memo: dict[tuple[int, int], Any] = {}
            plan = [self._view_change(view, old_keys, cache, memo)
                    for view in self.views.values()]
        except Exception:  # noqa: BLE001 - one service's failure stays its own
            log.exception("computing service %s/%s failed: it keeps its previous records "
                          "until it changes again", *svc)
            metrics.SERVICE_ERRORS.inc()
            return
        self.records.keep(svc, cache)
        for view, new, ops, deltas in plan:
            pending.setdefault(view.name, []).extend(ops)
            for delta in deltas:
                add_digest(view, delta)
            view.set_records(old_keys, new)

    def _view_change(self, view: NodeView, old_keys: set[ServicePortKey],
                     cache: NodeClassCache, memo: dict[tuple[int, int], Any]
                     ) -> tuple[NodeView, Any, list[WireOp], list[int]]:
        """What a service's new version does to one view, changing nothing yet: its new
        records, the ops and the digest deltas. ``memo`` holds the diff of each (old, new)
        pair of record objects, computed once for every view of a node class; it keeps
        the objects so that their ids are not reused."""
        new = cache.records(view.name, self.store.zone(view.name))
        ops: list[WireOp] = []
        deltas: list[int] = []
        for key in old_keys | new.keys():
            old_rec, new_rec = view.records.get(key), new.get(key)
            if old_rec == new_rec:
                continue
            pair = (id(old_rec), id(new_rec))
            hit = memo.get(pair)
            if hit is None:
                diff, delta = diff_with_digest(old_rec, new_rec, self.digests.encoder)
                hit = memo[pair] = (old_rec, new_rec, diff, delta)
            ops += hit[2]
            deltas.append(hit[3])
        return view, new, ops, deltas
