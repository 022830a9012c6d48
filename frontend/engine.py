"""The frontend's core: cluster store → per-node records → revisioned views.

``Engine.submit`` takes a batch of source events, updates the store, recomputes
only the services the batch touched (once per node class, see compute.py),
diffs each view's old and new records and appends the ops to the views that
changed. Runs on the asyncio loop; sources in other threads use
``submit_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from svcproxy.convert import DIGEST_MASK, node_term, node_to_pb, record_term, state_to_pb
from svcproxy.frontend import metrics
from svcproxy.frontend.compute import EMPTY_BASE, NodeClassCache, service_base
from svcproxy.frontend.events import KINDS, Delete, Event, Kind, Replace, Upsert
from svcproxy.frontend.gctuning import collector_paused, settle_long_lived_state
from svcproxy.frontend.initial import InitialFill, TermCache
from svcproxy.frontend.intake import Intake
from svcproxy.frontend.kubevalidation import object_key
from svcproxy.frontend.limits import MESSAGE_BYTES
from svcproxy.frontend.objects import EndpointSlice, Node, Service
from svcproxy.frontend.views import NodeView
from svcproxy.frontend.wire import (
    WireOp,
    chunk_events,
    delete_node,
    diff_with_digest,
    replace_service,
    set_node,
)
from svcproxy.model import NodeInfo, ServicePortState

log = logging.getLogger(__name__)
ObjKey = tuple[str, str]
CLUSTER_VIEW = ""
# Called after each published revision with the ops of every view it changed.
PublishListener = Callable[[int, dict[str, list[WireOp]]], None]


def node_info(node: Node) -> NodeInfo:
    return NodeInfo(node.name, node.zone, node.pod_cidrs, node.addresses, node.labels,
                    node.terminating)


@dataclass
class _Touched:
    services: set[ObjKey] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)


def _obj_key(kind: Kind, obj: dict[str, Any]) -> ObjKey:
    return object_key(kind, obj)


class Engine:
    def __init__(self, proxy_name: str = "", history_limit: int = 20000) -> None:
        self.proxy_name = proxy_name
        self.history_limit = history_limit
        self.services: dict[ObjKey, Service] = {}
        self.slices: dict[ObjKey, EndpointSlice] = {}
        self.slices_of: dict[ObjKey, set[ObjKey]] = {}
        self.nodes: dict[str, Node] = {}
        self.caches: dict[ObjKey, NodeClassCache] = {}
        # Revisions start at the start time in microseconds, so a restarted
        # frontend never serves a revision an older instance handed out.
        self.revision = int(time.time() * 1e6)
        self.views: dict[str, NodeView] = {CLUSTER_VIEW: self._new_view(CLUSTER_VIEW)}
        self._listed: set[Kind] = set()
        # Services changed before sync: computed once, at sync (nothing is served before).
        self._dirty: set[ObjKey] = set()
        self.synced = asyncio.Event()
        self._snapshot_ops: dict[int, tuple[ServicePortState, WireOp]] = {}
        self._terms: dict[int, tuple[ServicePortState, int]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listeners: list[PublishListener] = []
        # Validates every object whatever the source (main.py sets its source and limits).
        self.intake = Intake()

    # ---- sources -------------------------------------------------------
    def submit_threadsafe(self, events: Sequence[Event]) -> None:
        """Hand a batch from another thread to the loop."""
        assert self.loop is not None, "Engine.loop must be set before sources start"
        self.loop.call_soon_threadsafe(self.submit, list(events))

    def submit(self, events: Iterable[Event]) -> None:
        """Apply one batch of source events and publish the resulting changes."""
        if self.synced.is_set():
            self._submit(events)
        else:
            with collector_paused():
                self._submit(events)

    def _submit(self, events: Iterable[Event]) -> None:
        touched = _Touched()
        for ev in events:
            try:
                if isinstance(ev, Replace):
                    self._replace(ev.kind, ev.objs, touched)
                    self._listed.add(ev.kind)
                elif isinstance(ev, Upsert):
                    self._upsert(ev.kind, ev.obj, touched)
                elif isinstance(ev, Delete):
                    self._delete(ev.kind, (ev.namespace, ev.name), touched)
            except Exception:  # noqa: BLE001 - one event's failure must not lose the batch
                log.exception("unexpected error applying %s; the rest of the batch goes on",
                              type(ev).__name__)
                metrics.REJECTED_OBJECTS.labels(self.intake.source, ev.kind,
                                                "internal_error").inc()
            metrics.WATCH_EVENTS.labels(type(ev).__name__.lower()).inc()
        self._publish(touched)
        if not self.synced.is_set() and self._listed >= set(KINDS):
            log.info("frontend synced: %d services, %d endpoint slices, %d nodes",
                     len(self.services), len(self.slices), len(self.nodes))
            self._start_serving()
            settle_long_lived_state()
            self.synced.set()

    def _parse(self, kind: Kind, obj: dict[str, Any]) -> Service | EndpointSlice | Node | None:
        """The object validated and parsed, or None (refused alone, logged and counted)."""
        ns, name = _obj_key(kind, obj)
        served = (name in self.nodes if kind == "Node" else
                  (ns, name) in (self.services if kind == "Service" else self.slices))
        return self.intake.parse(kind, obj, served)

    def _upsert(self, kind: Kind, obj: dict[str, Any], touched: _Touched) -> None:
        parsed = self._parse(kind, obj)
        if isinstance(parsed, Service):
            if self.services.get(parsed.key) != parsed:
                self.services[parsed.key] = parsed
                touched.services.add(parsed.key)
        elif isinstance(parsed, EndpointSlice):
            old = self.slices.get(parsed.key)
            if old is not None and old.service_name != parsed.service_name:
                self._delete("EndpointSlice", parsed.key, touched)
                old = None
            if old is None or (old.ports, old.endpoints) != (parsed.ports, parsed.endpoints):
                self.slices[parsed.key] = parsed
                svc = (parsed.namespace, parsed.service_name)
                self.slices_of.setdefault(svc, set()).add(parsed.key)
                touched.services.add(svc)
        elif isinstance(parsed, Node):
            if self.nodes.get(parsed.name) != parsed:
                self.nodes[parsed.name] = parsed
                touched.nodes.add(parsed.name)

    def _delete(self, kind: Kind, key: ObjKey, touched: _Touched) -> None:
        if kind == "Service":
            if self.services.pop(key, None) is not None:
                touched.services.add(key)
        elif kind == "EndpointSlice":
            old = self.slices.pop(key, None)
            if old is not None:
                svc = (old.namespace, old.service_name)
                self.slices_of.get(svc, set()).discard(key)
                touched.services.add(svc)
        elif self.nodes.pop(key[1], None) is not None:
            touched.nodes.add(key[1])

    def _replace(self, kind: Kind, objs: list[dict[str, Any]], touched: _Touched) -> None:
        store: dict[Any, Any] = {"Service": self.services, "EndpointSlice": self.slices,
                                 "Node": self.nodes}[kind]
        listed = {_obj_key(kind, o) for o in objs}
        for key in list(store):
            full = ("", key) if kind == "Node" else key
            if full not in listed:
                self._delete(kind, full, touched)
        for obj in objs:
            self._upsert(kind, obj, touched)

    def _start_serving(self) -> None:
        """At sync: no revision before it can be resumed from, each service listed is
        computed once (per node class) and every view gets its records and digest once."""
        self.revision += 1
        fill = InitialFill({name: self._zone(name) for name in self.views})
        for svc in self._dirty:
            self._compute_initial(svc, fill)
        self._dirty.clear()
        terms = TermCache()
        for view in self.views.values():
            view.history.clear()
            view.history_ops = 0
            view.history_start = view.revision = self.revision
            view.records, total = fill.view(view.name, terms)
            view.digest = (self._nodes_term(view) + total) & DIGEST_MASK

    def _compute_initial(self, svc: ObjKey, fill: InitialFill) -> None:
        """Compute one service for sync; a failure leaves it out alone (logged, counted)."""
        try:
            cache = NodeClassCache(service_base(
                self.services.get(svc), (self.slices[k] for k in self.slices_of.get(svc, ())),
                self.proxy_name))
            fill.add(cache)
        except Exception:  # noqa: BLE001 - one service's failure stays its own
            log.exception("computing service %s/%s failed: it is served without it until "
                          "it changes again", *svc)
            metrics.SERVICE_ERRORS.inc()
            return
        if cache.base.ports:
            self.caches[svc] = cache
        else:
            self.caches.pop(svc, None)
        if not self.slices_of.get(svc):
            self.slices_of.pop(svc, None)

    # ---- computation ---------------------------------------------------
    def _new_view(self, name: str) -> NodeView:
        return NodeView(name, self.revision, self.history_limit)

    def record_term(self, rec: ServicePortState) -> int:
        """The digest term of a record (cached per record object)."""
        hit = self._terms.get(id(rec))
        if hit is None or hit[0] is not rec:
            if len(self._terms) > 1_000_000:
                self._terms = {}
            hit = self._terms[id(rec)] = (rec, record_term(state_to_pb(rec)))
        return hit[1]

    def _digest(self, view: NodeView) -> int:
        """The state digest of ``view`` computed from scratch."""
        total = self._nodes_term(view)
        total += sum(self.record_term(r) for r in view.records.values())
        return total & DIGEST_MASK

    def _nodes_term(self, view: NodeView) -> int:
        """The digest terms of the nodes in ``view`` (unmasked)."""
        nodes = list(view.nodes.values()) + ([view.node] if view.node else [])
        return sum(node_term(node_to_pb(n)) for n in nodes)

    def _zone(self, name: str) -> str:
        node = self.nodes.get(name)
        return node.zone if node else ""

    def view(self, name: str) -> NodeView:
        """The view of a node, created (with all current records) on first use."""
        view = self.views.get(name)
        if view is None:
            view = self.views[name] = self._new_view(name)
            zone = self._zone(name)
            for cache in self.caches.values():
                view.records.update(cache.records(name, zone))
            if name in self.nodes:
                view.node = node_info(self.nodes[name])
            if self.synced.is_set():
                # A view forgotten and made again must not resume its old clients: its
                # history starts at a revision none of them can hold.
                self.revision += 1
                view.history_start = view.revision = self.revision
                view.digest = self._digest(view)
        return view

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
        if not view.watchers and view.name and view.name not in self.nodes:
            self.views.pop(view.name, None)

    def _publish(self, touched: _Touched) -> None:
        for name in touched.nodes:
            if name in self.nodes:
                self.view(name)
        pending: dict[str, list[WireOp]] = {}
        self._publish_nodes(touched.nodes, pending)
        if self.synced.is_set():
            for svc in touched.services:
                self._publish_service(svc, pending)
        else:
            self._dirty |= touched.services
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
            if name not in self.nodes and name in self.views:
                self.release(self.views[name])

    def _publish_nodes(self, names: set[str], pending: dict[str, list[WireOp]]) -> None:
        cluster = self.views[CLUSTER_VIEW]
        for name in names:
            node = self.nodes.get(name)
            info = node_info(node) if node else None
            op = set_node(info) if info else delete_node(name)
            pending.setdefault(CLUSTER_VIEW, []).append(op)
            _add_digest(cluster, _node_delta(cluster.nodes.get(name), info))
            if info:
                cluster.nodes[name] = info
            else:
                cluster.nodes.pop(name, None)
            view = self.views.get(name)
            if view is None:
                continue
            old_zone = view.node.zone if view.node else ""
            _add_digest(view, _node_delta(view.node, info))
            view.node = info
            pending.setdefault(name, []).append(op)
            if (info.zone if info else "") != old_zone:
                self._recompute_view(view, pending)

    def _recompute_view(self, view: NodeView, pending: dict[str, list[WireOp]]) -> None:
        """A node's zone changed: every service may now select differently for it."""
        zone = self._zone(view.name)
        ops = pending.setdefault(view.name, [])
        for cache in self.caches.values():
            new = cache.records(view.name, zone)
            for key, rec in new.items():
                diff, delta = diff_with_digest(view.records.get(key), rec, self.record_term)
                ops += diff
                _add_digest(view, delta)
            view.records.update(new)

    def _publish_service(self, svc: ObjKey, pending: dict[str, list[WireOp]]) -> None:
        old_cache = self.caches.get(svc)
        old_keys = {p.service.key for p in (old_cache.base if old_cache else EMPTY_BASE).ports}
        synced = self.synced.is_set()
        try:
            base = service_base(self.services.get(svc),
                                (self.slices[k] for k in self.slices_of.get(svc, ())),
                                self.proxy_name)
            cache = NodeClassCache(base)
            memo: dict[tuple[int, int], Any] = {}
            plan = [self._view_change(view, old_keys, cache, synced, memo)
                    for view in self.views.values()]
        except Exception:  # noqa: BLE001 - one service's failure stays its own
            log.exception("computing service %s/%s failed: it keeps its previous records "
                          "until it changes again", *svc)
            metrics.SERVICE_ERRORS.inc()
            return
        if base.ports:
            self.caches[svc] = cache
        else:
            self.caches.pop(svc, None)
        if not self.slices_of.get(svc):
            self.slices_of.pop(svc, None)
        for view, new, ops, deltas in plan:
            if synced:
                # Nothing has been served before sync: the first snapshot carries it all.
                pending.setdefault(view.name, []).extend(ops)
                for delta in deltas:
                    _add_digest(view, delta)
            view.set_records(old_keys, new)

    def _view_change(self, view: NodeView, old_keys: set[Any], cache: NodeClassCache,
                     synced: bool, memo: dict[tuple[int, int], Any]
                     ) -> tuple[NodeView, Any, list[WireOp], list[int]]:
        """What a service's new version does to one view, changing nothing yet: its new
        records, the ops and the digest deltas. ``memo`` holds the diff of each (old, new)
        pair of record objects, computed once for every view of a node class; it keeps
        the objects so that their ids are not reused."""
        new = cache.records(view.name, self._zone(view.name))
        ops: list[WireOp] = []
        deltas: list[int] = []
        if synced:
            for key in old_keys | new.keys():
                old_rec, new_rec = view.records.get(key), new.get(key)
                if old_rec == new_rec:
                    continue
                pair = (id(old_rec), id(new_rec))
                hit = memo.get(pair)
                if hit is None:
                    diff, delta = diff_with_digest(old_rec, new_rec, self.record_term)
                    hit = memo[pair] = (old_rec, new_rec, diff, delta)
                ops += hit[2]
                deltas.append(hit[3])
        return view, new, ops, deltas

    # ---- streams -------------------------------------------------------
    def catch_up(self, view: NodeView, since: int) -> tuple[int, Iterable[bytes]]:
        """Where a stream whose client last applied ``since`` starts: its cursor and the
        messages to send first (what it missed, or a reset and a snapshot when ``since``
        is 0 or no longer in the history)."""
        if since and view.can_resume(since) and since <= self.revision:
            missed = view.messages_since(since) if view.revision > since else []
            if missed is not None:
                return self.revision, missed
        if since:
            metrics.RESETS.inc()
            log.info("node %s: revision %d is not in the history; sending a reset and a "
                     "full snapshot", view.name or "<cluster>", since)
        return self.revision, self.snapshot(view, reset=since != 0)

    def snapshot(self, view: NodeView, reset: bool = False) -> Iterator[bytes]:
        """The messages of a full snapshot of ``view`` at the current revision, encoded
        one at a time as the stream writes them: a stream holds the list of its ops
        (bytes shared with every other stream) and the one message being written."""
        return _measured(chunk_events(self.revision, self.snapshot_ops(view), reset=reset,
                                      limit=MESSAGE_BYTES, digest=view.digest))

    def snapshot_ops(self, view: NodeView) -> list[bytes]:
        """The ops that build ``view`` from nothing (serialised records are cached)."""
        out = [set_node(n).data for n in view.nodes.values()]
        if view.node is not None:
            out.append(set_node(view.node).data)
        live: dict[int, tuple[ServicePortState, WireOp]] = {}
        for rec in view.records.values():
            hit = self._snapshot_ops.get(id(rec))
            if hit is None or hit[0] is not rec:
                hit = (rec, replace_service(rec))
            live[id(rec)] = hit
            out.append(hit[1].data)
        self._snapshot_ops.update(live)
        if len(self._snapshot_ops) > 4 * max(1, len(live)) + 100000:
            self._snapshot_ops = live
        return out

    def service_op(self, rec: ServicePortState) -> bytes:
        """The serialised replace_service op of ``rec``, from the snapshot ops' cache."""
        hit = self._snapshot_ops.get(id(rec))
        if hit is None or hit[0] is not rec:
            if len(self._snapshot_ops) > 1_000_000:
                self._snapshot_ops = {}
            hit = self._snapshot_ops[id(rec)] = (rec, replace_service(rec))
        return hit[1].data


def _measured(msgs: Iterator[bytes]) -> Iterator[bytes]:
    size = 0
    for msg in msgs:
        size += len(msg)
        yield msg
    metrics.SNAPSHOT_BYTES.observe(size)


def _node_delta(old: NodeInfo | None, new: NodeInfo | None) -> int:
    """How a node's change moves the state digest."""
    if old == new:
        return 0
    return ((node_term(node_to_pb(new)) if new else 0)
            - (node_term(node_to_pb(old)) if old else 0))


def _add_digest(view: NodeView, delta: int) -> None:
    if view.digest is not None and delta:
        view.digest = (view.digest + delta) & DIGEST_MASK


def known_nodes(engine: Engine) -> list[NodeInfo]:
    return [node_info(engine.nodes[n]) for n in sorted(engine.nodes)]


Submit = Callable[[Sequence[Event]], None]
