"""The changelog: each view's records and its revisioned history of changes.

``Changelog.publish`` takes what a batch touched in the store, has the services
recomputed, diffs each view's old and new records and appends the ops (and the
state digest after them) to the views that changed, under one new revision. A view
is made when a client first asks for it (nothing is computed for a node nobody
watches): a copy of its zone's shared records with its own on top, and their digest
from terms computed once. Before sync nothing is published (nothing is served yet);
``start`` computes every service listed once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from svcproxy.convert import DIGEST_MASK
from svcproxy.frontend import metrics
from svcproxy.frontend.computation.compute import NodeClassCache
from svcproxy.frontend.computation.records import ServiceRecords
from svcproxy.frontend.gctuning import collector_paused
from svcproxy.frontend.publication.digests import Digests, add_digest, node_delta, nodes_term
from svcproxy.frontend.publication.views import CLUSTER_VIEW, NodeView
from svcproxy.frontend.publication.wire import WireOp, delete_node, diff_with_digest, set_node
from svcproxy.frontend.store.store import ObjKey, Store, Touched, node_info
from svcproxy.model import ServicePortKey, ServicePortState

log = logging.getLogger(__name__)
# Called after each published revision with the ops of every view it changed.
PublishListener = Callable[[int, dict[str, list[WireOp]]], None]
Pending = dict[str, list[WireOp]]


class Changelog:
    """The views (one per node watched or known, and the cluster's) and their history."""

    def __init__(self, store: Store, records: ServiceRecords, history_limit: int = 20000
                 ) -> None:
        self.store = store
        self.records = records
        self.history_limit = history_limit
        # Revisions start at the start time in microseconds, so a restarted
        # frontend never serves a revision an older instance handed out.
        self.revision = int(time.time() * 1e6)
        self.digests = Digests()
        self.views: dict[str, NodeView] = {}
        # Zone -> its shared records and the sum of their digest terms.
        self._shared_terms: dict[str, tuple[dict[ServicePortKey, ServicePortState], int]] = {}
        self.listeners: list[PublishListener] = []
        self.started = False

    def _new_view(self, name: str) -> NodeView:
        return NodeView(name, self.revision, self.history_limit)

    # ---- views ---------------------------------------------------------
    def view(self, name: str) -> NodeView:
        """The view of a node (``CLUSTER_VIEW``: of every node), made on first use."""
        view = self.views.get(name)
        if view is None:
            view = self.views[name] = self._new_view(name)
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
        view.history.clear()
        view.history_ops = 0
        view.history_start = view.revision = self.revision
        view.digest = (nodes_term(view) + total) & DIGEST_MASK

    def _shared_total(self, zone: str, shared: dict[ServicePortKey, ServicePortState]) -> int:
        """The sum of the digest terms of a zone's shared records (unmasked)."""
        hit = self._shared_terms.get(zone)
        if hit is None or hit[0] is not shared:
            hit = self._shared_terms[zone] = (
                shared, sum(map(self.digests.record_term, shared.values())))
        return hit[1]

    def watch(self, name: str) -> NodeView:
        """The view of ``name``, counted as watched by one more stream."""
        view = self.view(name)
        view.watchers += 1
        metrics.CLIENTS.inc()
        return view

    def unwatch(self, view: NodeView) -> None:
        """One stream of ``view`` ended."""
        view.watchers -= 1
        metrics.CLIENTS.dec()
        self.release(view)

    def release(self, view: NodeView) -> None:
        """Forget a view nobody watches and no Node backs."""
        if not view.watchers and view.name and view.name not in self.store.nodes:
            self.views.pop(view.name, None)

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
    def publish(self, touched: Touched) -> None:
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
            return
        self.revision += 1
        metrics.REVISION.set(self.revision)
        for name, ops in changed.items():
            view = self.views[name]
            view.append(self.revision, ops, view.digest)
            metrics.BATCH_OPS.observe(len(ops))
        for listener in self.listeners:
            listener(self.revision, changed)
        for name in touched.nodes:
            if name not in self.store.nodes and name in self.views:
                self.release(self.views[name])

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
