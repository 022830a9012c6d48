"""The fleet's adapter: feeds the pure model from the engine and answers the API.

It listens to the changelog's publications, polls which views are watched (a stream
worker's streams are counted in the main process's views too), and every ``tick``
seconds updates each node's state (a node falls behind with time alone), the metrics
and one log line per node that falls behind or disagrees, and per recovery. Report and
GetFleet are answered by ``answer`` (bytes, as every unary call); WatchFleet and WaitFleet
are async generators of messages. Everything runs on the engine's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from svcproxy.convert import key_to_pb
from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import check_filters, check_node_name, invalid
from svcproxy.frontend.fleet import metrics
from svcproxy.frontend.fleet.conditions import (
    ViewLike,
    changed_after,
    of_endpoint,
    of_port,
    parse_address,
)
from svcproxy.frontend.fleet.encode import FROM_PB, counts_pb, node_pb
from svcproxy.frontend.fleet.latency import ClusterLatency
from svcproxy.frontend.fleet.model import TROUBLED, Fleet, NodeRecord, Served, State
from svcproxy.frontend.fleet.reports import MAX_NODES, ReportRates, check_report
from svcproxy.frontend.fleet.waits import DEFAULT_LOST_AFTER, Progress, Wait
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.wire import WireOp
from svcproxy.model import ServicePortKey
from svcproxy.v1 import nodestate_pb2 as pb

log = logging.getLogger(__name__)
DEFAULT_PAGE = 500
MAX_PAGE = 5000
MAX_NAMED = 100
# A wait looks at the fleet at most this often (reports and batches between are one look).
WAIT_COALESCE = 0.02


@dataclass(slots=True, eq=False)
class _Subscriber:
    """A WatchFleet or WaitFleet stream: what changed since it last looked."""

    dirty: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    event: asyncio.Event = field(default_factory=asyncio.Event)


class FleetService:
    """See the module docstring; ``start`` on the loop, ``stop`` at the end."""

    def __init__(self, engine: Engine, epoch: str, lag_warning: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.epoch = epoch
        self.clock = clock
        self.fleet = Fleet(lag_warning)
        self.latency = ClusterLatency(metrics.CLUSTER_LATENCY.observe)
        self.rates = ReportRates()
        self.tick = max(0.05, min(1.0, lag_warning / 4))
        self._subscribers: set[_Subscriber] = set()
        self._triggers: dict[ServicePortKey, float] = {}
        self._task: asyncio.Task[None] | None = None
        engine.changelog.listeners.append(self._on_publish)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._ticking())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # ---- what the node is served -----------------------------------------
    def view(self, name: str) -> ViewLike | None:
        return self.engine.changelog.views.get(name) if name else None

    def served(self, record: NodeRecord) -> Served | None:
        view = self.engine.changelog.views.get(record.name)
        if view is None:
            return None
        applied = record.report.revision if record.report is not None else 0
        lag = view.batches_after(applied) if applied < view.revision else 0
        return Served(view.revision, view.digest, lag)

    # ---- events ----------------------------------------------------------
    def _changed(self, names: set[str], removed: set[str] | frozenset[str] = frozenset()
                 ) -> None:
        for sub in self._subscribers:
            sub.dirty |= names
            sub.removed |= removed
            sub.event.set()

    def _update(self, record: NodeRecord, now: float) -> bool:
        """Set a node's state; log a fall behind or a recovery. True when it changed."""
        served = self.served(record)
        old = self.fleet.update_state(record, served, now)
        if old is None:
            return False
        new = record.state
        if new in TROUBLED and old not in TROUBLED:
            report = record.report
            log.warning("node %s is %s: applied revision %d, served %d (%d batches, %.1f s "
                        "behind; --lag-warning %g s)%s", record.name, new.value.lower(),
                        report.revision if report else 0, served.revision if served else 0,
                        served.lag_revisions if served else 0, record.lag_seconds(now),
                        self.fleet.lag_warning, _digests(record, served))
        elif old in TROUBLED and new not in TROUBLED:
            log.info("node %s recovered: %s, no longer %s", record.name, new.value.lower(),
                     old.value.lower())
        if new in (State.UNKNOWN, State.DISCONNECTED):
            self.latency.left(record.name, now)
        return True

    def _on_publish(self, revision: int, changed: dict[str, list[WireOp]]) -> None:
        now = self.clock()
        nodes = self.fleet.nodes
        names = [name for name in changed if name in nodes]
        self.fleet.published(revision, names, now)
        counted = [n for n in names if nodes[n].connected and nodes[n].report is not None]
        trigger = self._trigger_time(changed)
        if trigger:
            self.latency.published(revision, trigger, counted, now)
        for name in names:
            self._update(nodes[name], now)
        self._changed(set(names))

    def _trigger_time(self, changed: dict[str, list[WireOp]]) -> float:
        """The newest trigger time of the endpoint changes of a batch not seen before (0:
        none)."""
        views, newest, seen = self.engine.changelog.views, 0.0, set()
        for name, ops in changed.items():
            records = views[name].records if name in views else {}
            for op in ops:
                key = op.key[1]
                if op.key[0] == "node" or key in seen:
                    continue
                seen.add(key)
                record = records.get(key)  # type: ignore[call-overload]
                if record is None:  # gone: its memo goes too (bounded by what is live)
                    self._triggers.pop(key, None)  # type: ignore[call-overload]
                    continue
                trigger = record.service.trigger_time
                if trigger and trigger > self._triggers.get(key, 0.0):  # type: ignore[arg-type]
                    self._triggers[key] = trigger  # type: ignore[index]
                    newest = max(newest, trigger)
        return newest

    def _refresh(self) -> None:
        """Connections, forgotten nodes, states and metrics, from the views now."""
        now = self.clock()
        watched = [n for n, v in self.engine.changelog.views.items() if n and v.watchers]
        changed = self.fleet.connections(watched, now)
        gone = self.fleet.forget(now)
        self.rates.forget(gone)
        for name in gone:
            self.latency.left(name, now)
        for record in self.fleet:
            if self._update(record, now):
                changed.add(record.name)
        if changed or gone:
            self._changed(changed, set(gone))
        self._export()

    def _export(self) -> None:
        for state, count in self.fleet.counts().items():
            metrics.NODES.labels(state).set(count)
        metrics.LAGGING.set(sum(r.state is State.LAGGING for r in self.fleet))
        refusing: dict[tuple[str, str], int] = {}
        for record in self.fleet:
            if record.report is not None and record.connected:
                for svc in {(k.namespace, k.name) for k, _ in record.report.refused}:
                    refusing[svc] = refusing.get(svc, 0) + 1
        metrics.REFUSING.clear()
        for (namespace, service), count in refusing.items():
            metrics.REFUSING.labels(namespace, service).set(count)

    async def _ticking(self) -> None:
        while True:
            try:
                self._refresh()
            except Exception:  # noqa: BLE001 - the fleet view never stops serving
                log.exception("updating the fleet view failed")
            await asyncio.sleep(self.tick)

    # ---- Report ----------------------------------------------------------
    def report(self, request: pb.NodeReport) -> bytes:
        """Keep a node's report; ReportAnswer's bytes, or Refused."""
        name = request.node_name
        if name not in self.fleet.nodes and len(self.fleet.nodes) >= MAX_NODES:
            metrics.REPORTS.labels("too_many_nodes").inc()
            raise Refused("RESOURCE_EXHAUSTED", (
                f"this frontend keeps the reports of {MAX_NODES} nodes, and node {name!r} "
                "is not watching it: report to the frontend the node watches"))
        try:
            check_node_name("Report", name)
            self.rates.admit(name)
            report = check_report(request, self.engine.changelog.revision, self.epoch)
        except Refused as err:
            metrics.REPORTS.labels(_result(err)).inc()
            raise
        now = self.clock()
        record = self.fleet.reported(name, report, now)
        self.latency.applied(name, report.revision, now)
        self._update(record, now)
        self._changed({name})
        metrics.REPORTS.labels("accepted").inc()
        view = self.engine.changelog.views.get(name)
        return pb.ReportAnswer(
            served_revision=view.revision if view else 0).SerializeToString()

    # ---- GetFleet --------------------------------------------------------
    def get_fleet(self, request: pb.GetFleetRequest) -> bytes:
        """One page of the fleet (GetFleetRequest's comments); Refused when invalid."""
        if request.node_name:
            check_node_name("GetFleet", request.node_name)
        check_filters("GetFleet", request.namespace, request.service)
        if request.namespace and not request.service:
            raise invalid("GetFleet", "namespace counts service ports only with service: "
                          "give service too (or neither)")
        if not 0 <= request.page_size <= MAX_PAGE:
            raise invalid("GetFleet", f"page_size is at most {MAX_PAGE} (0: "
                          f"{DEFAULT_PAGE})")
        states = {FROM_PB.get(s) for s in request.states}
        if None in states:
            raise invalid("GetFleet", "states holds a value that is no FleetNodeState")
        now = self.clock()
        size = request.page_size or DEFAULT_PAGE
        answer = pb.Fleet(revision=self.engine.changelog.revision,
                          lag_warning_seconds=self.fleet.lag_warning)
        counts_pb(answer.nodes_by_state, self.fleet.counts())
        names = sorted(n for n in self.fleet.nodes if n > request.page_token and (
            not request.node_name or n == request.node_name) and (
            not states or self.fleet.nodes[n].state in states))
        for name in names[:size]:
            record = self.fleet.nodes[name]
            answer.nodes.append(node_pb(record, self.served(record), now))
        if len(names) > size:
            answer.next_page_token = names[size - 1]
        if request.service and not request.page_token:
            self._progress(answer, request.namespace, request.service)
        return answer.SerializeToString()

    def _progress(self, answer: pb.Fleet, namespace: str, service: str) -> None:
        """Per service port of the Service(s), and per endpoint of it: on how many nodes
        its current decision is applied."""
        ports: dict[ServicePortKey, list[int]] = {}
        endpoints: dict[ServicePortKey, dict[str, list[int]]] = {}
        for record in self.fleet:
            view = self.engine.changelog.views.get(record.name)
            if view is None or not record.connected or record.report is None:
                continue
            refused, applied = {k for k, _ in record.report.refused}, record.report.revision
            for key, state in view.records.items():
                if key.name != service or (namespace and key.namespace != namespace):
                    continue
                counts = ports.setdefault(key, [0, 0, 0])
                counts[0] += 1
                counts[1] += not changed_after(view, applied, view.revision, of_port(key))
                counts[2] += key in refused
                for ip in state.endpoints:
                    seen = endpoints.setdefault(key, {}).setdefault(ip, [0, 0])
                    seen[0] += 1
                    seen[1] += not changed_after(view, applied, view.revision,
                                                 of_endpoint(key, ip))
        for key in sorted(ports, key=lambda k: (k.namespace, k.name, k.port_name,
                                                k.protocol.value)):
            nodes, applied_nodes, refused_nodes = ports[key]
            progress = answer.services.add(service=key_to_pb(key), nodes=nodes,
                                           applied_nodes=applied_nodes,
                                           refused_nodes=refused_nodes)
            for ip, (held, done) in sorted(endpoints.get(key, {}).items()):
                progress.endpoints.add(ip=ip, nodes=held, applied_nodes=done)

    # ---- WatchFleet --------------------------------------------------------
    async def watch(self, request: pb.WatchFleetRequest) -> AsyncIterator[bytes]:
        """The fleet, then its changes (FleetUpdate's comments)."""
        if request.node_name:
            check_node_name("WatchFleet", request.node_name)
        sub = _Subscriber()
        self._subscribers.add(sub)
        try:
            yield self._update_msg(True, set(self.fleet.nodes), set(), request.node_name)
            while True:
                await sub.event.wait()
                sub.event.clear()
                dirty, removed = sub.dirty, sub.removed
                sub.dirty, sub.removed = set(), set()
                if request.node_name:
                    dirty &= {request.node_name}
                    removed &= {request.node_name}
                if dirty or removed:
                    yield self._update_msg(False, dirty, removed, request.node_name)
        finally:
            self._subscribers.discard(sub)

    def _update_msg(self, full: bool, names: set[str], removed: set[str],
                    only: str) -> bytes:
        now = self.clock()
        msg = pb.FleetUpdate(full=full, removed=sorted(removed))
        for name in sorted(names):
            record = self.fleet.nodes.get(name)
            if record is not None and (not only or name == only):
                msg.nodes.append(node_pb(record, self.served(record), now))
        counts_pb(msg.nodes_by_state, self.fleet.counts())
        return msg.SerializeToString()

    # ---- WaitFleet ---------------------------------------------------------
    def wait_for(self, request: pb.WaitFleetRequest) -> Wait:
        """The wait a request asks for; Refused when it is not one."""
        asked = [bool(request.endpoint_gone), bool(request.endpoint_ready),
                 bool(request.service)]
        if sum(asked) != 1:
            raise invalid("WaitFleet", "set exactly one of endpoint_gone, endpoint_ready "
                          "and service")
        lost = request.node_lost_after_seconds or DEFAULT_LOST_AFTER
        if not 0 < lost < 86400:
            raise invalid("WaitFleet", "node_lost_after_seconds is more than 0 and less "
                          "than a day")
        try:
            if request.endpoint_gone:
                return Wait.endpoint_gone(parse_address(request.endpoint_gone), lost)
            if request.endpoint_ready:
                address = parse_address(request.endpoint_ready)
                if address.port:
                    raise ValueError("endpoint_ready is an IP, without a port")
                return Wait.endpoint_ready(address.ip, lost)
        except ValueError as err:
            raise invalid("WaitFleet", str(err)) from None
        namespace, _, name = request.service.partition("/")
        if not namespace or not name:
            raise invalid("WaitFleet", "service is NAMESPACE/NAME")
        check_filters("WaitFleet", namespace, name)
        upto = request.revision or self.engine.changelog.revision
        return Wait(service=(namespace, name, upto), lost_after=lost)

    async def wait(self, request: pb.WaitFleetRequest) -> AsyncIterator[bytes]:
        """Progress messages until the wait is done (WaitFleetProgress's comments)."""
        wait = self.wait_for(request)
        sub = _Subscriber()
        self._subscribers.add(sub)
        last: Progress | None = None
        changed: set[str] | None = None  # the first time: every node
        try:
            while True:
                sub.event.clear()
                progress = wait.progress(self.fleet, self.engine.changelog.views,
                                         self.clock(), changed)
                if progress != last:
                    yield _progress_msg(progress)
                    last = progress
                if progress.done:
                    return
                # Nodes also stop counting with time alone (node_lost_after).
                try:
                    await asyncio.wait_for(sub.event.wait(), self.tick)
                except TimeoutError:
                    pass
                await asyncio.sleep(WAIT_COALESCE)  # a burst of reports: one look
                changed, sub.dirty = sub.dirty, set()
        finally:
            self._subscribers.discard(sub)


def _progress_msg(progress: Progress) -> bytes:
    return pb.WaitFleetProgress(
        done=progress.done, nodes_behind=progress.behind[:MAX_NAMED],
        nodes_counted=len(progress.counted), nodes_behind_count=len(progress.behind),
        nodes_unknown=progress.unknown[:MAX_NAMED]).SerializeToString()


def _digests(record: NodeRecord, served: Served | None) -> str:
    if record.state is not State.DISAGREEING or record.report is None or served is None:
        return ""
    return f"; digest {record.report.digest or 0:016x}, served {served.digest or 0:016x}"


def _result(err: Refused) -> str:
    return {"INVALID_ARGUMENT": "invalid", "FAILED_PRECONDITION": "other_epoch",
            "RESOURCE_EXHAUSTED": "rate_limited"}.get(err.code_name, err.code_name.lower())
