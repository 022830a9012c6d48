"""Model-based proof of the stream contract (issue 11).

Random sequences of changes to services, slices and nodes go through the real Engine.
Clients connect, fall behind for any number of batches, disconnect (their view may be
forgotten and made again), resume from their revision and are fed exactly what a
stream would send them (``Snapshots.catch_up``, then ``NodeView.messages_since`` as in
stream.write_stream, batches split over several messages). After every delivery the
client's state must equal the view's (what GetNodeState answers), both for the SDK's
apply code and for ``DocClient``, a client written from nodestate.proto's comments
alone, which also checks every digest the server sends.

Streams start as the API starts them: through the frontend's EpochInterceptor and its
servicer's ``start_stream``. The frontend may restart (a new process tree: new engine,
new epoch, its revisions from its clock, which may have stepped back behind the
revisions clients hold) and list the same objects; clients resume with the epoch (as
the SDK does) or without it, also ones cut mid-snapshot, and all end equal to the new
frontend's GetNodeState.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import dataclasses
import json
import pickle
from collections import deque
from collections.abc import Callable
from hashlib import blake2b
from typing import Any
from unittest import mock

import grpc
import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis import event as noted
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from svcproxy.convert import digest_term, node_to_pb, state_to_pb
from svcproxy.frontend.admission.epoch import EPOCH_KEY, EpochInterceptor, new_epoch
from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication import snapshots as snapshots_module
from svcproxy.frontend.publication import views as views_module
from svcproxy.frontend.publication.changelog import DEFAULT_BOUNDS, ViewBounds
from svcproxy.frontend.publication.views import NodeView
from svcproxy.frontend.publication.wire import (
    WireOp,
    coalesce,
    delete_node,
    diff_records,
    replace_service,
    set_node,
)
from svcproxy.frontend.serving.pages import NodeStatePages
from svcproxy.frontend.serving.worker import ParentLink, SnapshotFeed
from svcproxy.frontend.serving.workers import StreamWorkers, _Worker
from svcproxy.frontend.sources.events import (
    KINDS,
    Delete,
    Event,
    RawObject,
    Replace,
    Upsert,
)
from svcproxy.model import Endpoint as ModelEndpoint
from svcproxy.model import NodeInfo, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.client import NodeStateClient, server_epoch
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.paths import REPO

NODES = ["n1", "n2", "n3"]
WATCHED = NODES + ["n4", ""]  # n4 is never a Node; "" is the cluster view
SERVICES = ["a", "b", "c"]
IPS = [f"10.0.0.{i}" for i in range(1, 7)]


class OutOfSync(Exception):
    """The server sent an endpoint op for a port the client does not hold."""


def _term(tag: bytes, msg: Any) -> int:
    digest = blake2b(tag + msg.SerializeToString(deterministic=True), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


class DocClient:
    """A client written from the proto's documentation only."""

    def __init__(self) -> None:
        self.services: dict[bytes, tuple[pb.ServicePort, dict[str, pb.Endpoint]]] = {}
        self.nodes: dict[str, pb.NodeInfo] = {}
        self.revision = 0
        # The epoch the stream announced that the revision came from (sent when resuming).
        self.epoch: str | None = None

    def apply(self, batch: list[pb.WatchEvent]) -> None:
        if batch[0].reset or self.revision == 0:
            self.services, self.nodes = {}, {}
        for event in batch:
            for op in event.ops:
                self.op(op)
        self.revision = batch[-1].revision
        if batch[-1].HasField("digest"):
            assert batch[-1].digest == self.digest(), "digest differs"

    def op(self, op: pb.Op) -> None:
        which = op.WhichOneof("op")
        if which == "set_service":
            key = op.set_service.key.SerializeToString()
            old = self.services.get(key)
            self.services[key] = (op.set_service, old[1] if old else {})
        elif which == "delete_service":
            self.services.pop(op.delete_service.SerializeToString(), None)
        elif which == "replace_service":
            svc = op.replace_service.service
            self.services[svc.key.SerializeToString()] = (
                svc, {e.ip: e for e in op.replace_service.endpoints})
        elif which in ("set_endpoint", "delete_endpoint"):
            ref = getattr(op, which)
            port = self.services.get(ref.service.SerializeToString())
            if port is None:
                raise OutOfSync(which)
            if which == "set_endpoint":
                port[1][ref.endpoint.ip] = ref.endpoint
            else:
                port[1].pop(ref.ip, None)
        elif which == "set_node":
            self.nodes[op.set_node.name] = op.set_node
        elif which == "delete_node":
            self.nodes.pop(op.delete_node, None)

    def digest(self) -> int:
        total = sum(_term(b"n", n) for n in self.nodes.values())
        for svc, eps in self.services.values():
            total += _term(b"s", svc)
            total += sum(_term(b"e", pb.EndpointOp(service=svc.key, endpoint=e))
                         for e in eps.values())
        return total % (1 << 64)

    def state(self) -> tuple[dict[bytes, tuple[bytes, dict[str, bytes]]], dict[str, bytes]]:
        return ({k: (s.SerializeToString(deterministic=True),
                     {ip: e.SerializeToString() for ip, e in eps.items()})
                 for k, (s, eps) in self.services.items()},
                {n: m.SerializeToString(deterministic=True) for n, m in self.nodes.items()})


def expected(view: NodeView) -> tuple[dict[bytes, tuple[bytes, dict[str, bytes]]],
                                      dict[str, bytes]]:
    """What GetNodeState says: the view's records and node(s), as the DocClient holds."""
    services = {}
    for rec in view.records.values():
        msg = state_to_pb(rec)
        services[msg.service.key.SerializeToString()] = (
            msg.service.SerializeToString(deterministic=True),
            {e.ip: e.SerializeToString() for e in msg.endpoints})
    nodes = dict(view.nodes)
    if view.node is not None:
        nodes[view.node.name] = view.node
    return services, {n: node_to_pb(i).SerializeToString(deterministic=True)
                      for n, i in nodes.items()}


def batches(msgs: Any, cut: bool = False) -> list[list[pb.WatchEvent]]:
    """The complete batches of a stream's messages; ``cut``: the stream broke after them,
    and a batch it broke in is discarded (the client stays at its previous revision)."""
    out: list[list[pb.WatchEvent]] = []
    pending: list[pb.WatchEvent] = []
    for data in msgs:
        event = pb.WatchEvent.FromString(data)
        pending.append(event)
        if not event.more:
            out.append(pending)
            pending = []
    assert cut or not pending, "a stream's messages ended mid-batch"
    return out


class Client:
    """One watcher: the DocClient's state and, for a client that resumes with the epoch
    as the SDK does, the SDK's; its stream's cursor; the frontend its revision is of."""

    def __init__(self, name: str, peer: str, sends_epoch: bool = True) -> None:
        self.name = name
        self.peer = peer
        # A client that sends no epoch is a DocClient alone (the SDK always sends it).
        self.sdk = NodeStateClient("127.0.0.1:1", name or "", cluster=not name) \
            if sends_epoch else None
        self.doc = DocClient()
        self.view: NodeView | None = None
        self.cursor = 0
        self.generation = 0

    @property
    def revision(self) -> int:
        if self.sdk is not None:
            assert self.sdk.revision == self.doc.revision
        return self.doc.revision

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """A Watch's request metadata: the SDK's own (the epoch of its revision)."""
        if self.sdk is None:
            return ()
        ours = self.sdk._metadata()
        assert ours == (((EPOCH_KEY, self.doc.epoch),) if self.doc.revision else ())
        return ours

    def receive(self, msgs: Any, epoch: str | None = None, generation: int = 0,
                cut: bool = False) -> None:
        """Apply a stream's complete batches; with each, the revision becomes the
        announcing frontend's (as the SDK's watch loop keeps the epoch)."""
        for batch in batches(msgs, cut):
            if self.sdk is not None:
                self.sdk._apply(batch)
                assert not self.sdk._out_of_sync, "the SDK found itself out of sync"
                self.sdk.epoch = epoch
            self.doc.apply(batch)
            self.doc.epoch, self.generation = epoch, generation

    def refused(self, err: Refused) -> None:
        """A Watch refused: only a resume from a revision ahead of the frontend, without
        the epoch (with it, another frontend's revision is a reset); watch from 0."""
        assert err.code_name == "INVALID_ARGUMENT" and self.sdk is None, err.message
        assert "ahead of this frontend's revision" in err.message, err.message
        self.doc.revision = 0


@dataclasses.dataclass
class WatchCall:
    """What EpochInterceptor and server_epoch read of a Watch call, and what it sent."""

    method: str
    metadata: tuple[tuple[str, str], ...]
    sent: tuple[tuple[str, str], ...] = ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    async def send_initial_metadata(self, metadata: Any) -> None:
        self.sent = tuple(metadata)

    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.sent


def through_epoch(interceptor: EpochInterceptor, client: Client) -> tuple[int, str | None]:
    """A client's Watch through the frontend's EpochInterceptor: the since_revision the
    servicer is asked for, and the epoch the client reads from the stream."""
    since = client.revision
    if client.name:
        call = WatchCall("/svcproxy.v1.NodeStateService/Watch", client.metadata())
        request: Any = pb.WatchRequest(node_name=client.name, since_revision=since)
    else:
        call = WatchCall("/svcproxy.v1.NodeStateService/WatchCluster", client.metadata())
        request = pb.ClusterWatchRequest(since_revision=since)
    asked: list[int] = []

    async def servicer(req: Any, _: Any) -> None:
        asked.append(req.since_revision)

    async def continuation(_: Any) -> Any:
        return grpc.unary_stream_rpc_method_handler(servicer)

    handler = _run(interceptor.intercept_service(continuation, call))  # type: ignore[arg-type]
    _run(handler.unary_stream(request, call))
    return asked[0], server_epoch(call)  # type: ignore[arg-type]


class SentPipe:
    """One direction of a stream worker's pipe: pickled messages, delivered when the
    model pumps them (so they lag behind the engine as much as a real pipe may)."""

    def __init__(self) -> None:
        self.queue: deque[bytes] = deque()

    def send(self, message: tuple[object, ...]) -> None:
        self.queue.append(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        pass


def _run(coro: Any) -> Any:
    """Run a coroutine that never waits (the engine has synced) to its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the main process's answer waited")


class WorkerSide:
    """A stream worker as workers.py and worker.py make it, both ends of its pipe in this
    process: the main process's ``StreamWorkers`` feeding it, the worker's ``ParentLink``
    holding the views its streams read."""

    def __init__(self, engine: Engine, record: Callable[[], None]) -> None:
        self.record = record
        self.workers = StreamWorkers(engine, 2, "127.0.0.1:0", None)
        # The main process's servicer: its own streams and its workers' count together.
        self.servicer = self.workers._servicer
        self.worker = _Worker(1, None)  # type: ignore[arg-type]
        self.to_worker = self.worker.pipe = SentPipe()  # type: ignore[assignment]
        self.workers._workers[1] = self.worker
        engine.changelog.listeners.append(self.workers._on_publish)
        # The worker's copies keep what the main views keep (with tiny bounds: tiny).
        config = self.workers.config
        self.link = ParentLink(None, config.history,  # type: ignore[arg-type]
                               config.view_history_bytes)
        self.to_main = self.link.pipe = SentPipe()  # type: ignore[assignment]
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        """The process tree is gone: its streams end where they are."""
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.step()
        self.loop.close()

    def step(self) -> None:
        """The worker's loop runs what is ready (a stream whose answer came resumes)."""
        for _ in range(3):
            self.loop.run_until_complete(asyncio.sleep(0))

    def start(self, coro: Any) -> asyncio.Task[Any]:
        """A stream's coroutine (``ParentLink.watch``, ``catch_up``), run to its request."""
        task = self.loop.create_task(coro)
        self.step()
        return task

    def pump_main(self, count: int, after: Callable[[], None]) -> None:
        """The main process reads ``count`` messages of the worker's (``after`` each)."""
        for _ in range(min(count, len(self.to_main.queue))):
            message = pickle.loads(self.to_main.queue.popleft())
            if message[0] in ("watch", "catchup", "next"):
                _run(self.workers._answer(self.worker, message))
            else:
                self.workers._on_message(self.worker, message)
            after()

    def pump_worker(self, count: int) -> None:
        """The worker reads ``count`` messages of the main process's."""
        for _ in range(min(count, len(self.to_worker.queue))):
            self.link._on_message(pickle.loads(self.to_worker.queue.popleft()))

    def read(self, msgs: Any) -> list[bytes]:
        """A stream's first messages, a snapshot's asked of the main process one at a time
        (what it publishes meanwhile reaches the worker in between)."""
        if isinstance(msgs, list):
            return msgs

        async def take() -> list[bytes]:
            return [msg async for msg in msgs]

        task = self.start(take())
        while not task.done():
            assert self.to_main.queue or self.to_worker.queue, "a request went unanswered"
            self.pump_main(1, self.record)
            self.pump_worker(len(self.to_worker.queue))
            self.step()
        return task.result()


class WorkerClient(Client):
    """A watcher whose stream a stream worker serves."""

    def __init__(self, name: str, peer: str, sends_epoch: bool) -> None:
        super().__init__(name, peer, sends_epoch)
        # The stream waiting for the main process: ParentLink.watch or .catch_up.
        self.task: asyncio.Task[Any] | None = None
        self.kind = ""


def _service(name: str, ports: list[tuple[str, str, int]], kind: str, itp: str, etp: str,
             dist: str, extra: str) -> dict[str, Any]:
    num = SERVICES.index(name) + 1
    spec: dict[str, Any] = {
        "clusterIP": f"10.96.0.{num}", "type": kind,
        "ports": [{"name": n, "protocol": p, "port": port, "targetPort": n}
                  for n, p, port in ports],
        "internalTrafficPolicy": itp}
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    obj: dict[str, Any] = {"kind": "Service", "metadata": meta, "spec": spec}
    if kind in ("NodePort", "LoadBalancer"):
        spec["externalTrafficPolicy"] = etp
    if kind == "LoadBalancer":
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": f"192.0.2.{num}"}]}}
    if dist:
        spec["trafficDistribution"] = dist
    # What makes a service no svcproxy service (or changes only its ServicePort).
    if extra == "headless":
        spec.update(clusterIP="None", type="ClusterIP")
        spec.pop("externalTrafficPolicy", None)
        obj.pop("status", None)
    elif extra == "external-name":
        spec.update(type="ExternalName", externalName="example.com")
        del spec["clusterIP"]
        spec.pop("externalTrafficPolicy", None)
        obj.pop("status", None)
    elif extra == "other-proxy":
        meta["labels"] = {"service.kubernetes.io/service-proxy-name": "other"}
    elif extra == "dual-stack":
        spec["clusterIPs"] = [spec["clusterIP"], f"fd00:96::{num}"]
    elif extra == "affinity":
        spec.update(sessionAffinity="ClientIP", externalIPs=[f"198.51.100.{num}"])
    return obj


# Valid ports only (an invalid object is refused and its last valid version kept).
ports_st = st.lists(st.sampled_from([("http", "TCP", 80), ("http", "UDP", 80),
                                     ("dns", "UDP", 53), ("dns", "TCP", 53)]),
                    min_size=1, max_size=2, unique_by=lambda p: p[0])
service_st = st.builds(_service, st.sampled_from(SERVICES), ports_st,
                       st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]),
                       st.sampled_from(["Cluster", "Local"]), st.sampled_from(["Cluster", "Local"]),
                       st.sampled_from(["", "PreferClose"]),
                       st.sampled_from(["", "", "", "headless", "external-name", "other-proxy",
                                        "dual-stack", "affinity"]))
# Hints for zones, for nodes (PreferSameNode), both, or none.
hints_st = st.sampled_from([None, {"forZones": [{"name": "z1"}]}, {"forZones": [{"name": "z2"}]},
                            {"forNodes": [{"name": "n1"}]}, {"forNodes": [{"name": "n2"}]},
                            {"forZones": [{"name": "z1"}], "forNodes": [{"name": "n3"}]}])


def _endpoint(ip: int, node: str, zone: str, conditions: dict[str, bool],
              hints: dict[str, Any] | None) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [f"10.0.0.{ip}"], "conditions": conditions}
    if node:
        ep["nodeName"] = node
    if zone:
        ep["zone"] = zone
    if hints:
        ep["hints"] = hints
    return ep


endpoint_st = st.builds(
    _endpoint, st.integers(1, 6), st.sampled_from(NODES + ["n4", ""]),
    st.sampled_from(["z1", "z2", ""]),
    # A condition left out reads as Kubernetes says (ready: true, serving: ready).
    st.fixed_dictionaries({}, optional={"ready": st.booleans(), "serving": st.booleans(),
                                        "terminating": st.booleans()}),
    hints_st)
SLICES = ["s0", "s1", "s2", "s3"]


def _slice(name: str, svc: str, eps: list[dict[str, Any]], ports: list[tuple[str, str, int]],
           family: str) -> dict[str, Any]:
    # Slices of one service may share addresses (as the EndpointSlice controller's do
    # while it moves endpoints): the frontend keeps one copy, the same on every replica.
    if family == "IPv6":
        eps = [{**e, "addresses": [e["addresses"][0].replace("10.0.0.", "fd00::")]}
               for e in eps]
    return {"kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": [{"name": n, "port": 8000 + port, "protocol": p} for n, p, port in ports],
            "endpoints": eps}


# A slice's service label may change (the slice moves to another service).
slice_st = st.builds(_slice, st.sampled_from(SLICES), st.sampled_from(SERVICES),
                     st.lists(endpoint_st, max_size=4), ports_st,
                     st.sampled_from(["IPv4", "IPv4", "IPv6"]))


def _node(name: str, zone: str, role: str, draining: bool) -> dict[str, Any]:
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    if role:
        labels["node-role.kubernetes.io/" + role] = ""
    obj: dict[str, Any] = {"kind": "Node", "metadata": {"name": name, "labels": labels},
                           "status": {"addresses": [{"type": "InternalIP",
                                                     "address": f"172.16.0.{name[1:]}"}]}}
    if draining:
        obj["spec"] = {"taints": [{"key": "ToBeDeletedByClusterAutoscaler",
                                   "effect": "NoSchedule"}]}
    return obj


node_st = st.builds(_node, st.sampled_from(NODES), st.sampled_from(["", "z1", "z2"]),
                    st.sampled_from(["", "", "worker"]), st.booleans())
event_st = st.one_of(
    service_st.map(lambda o: Upsert("Service", o)),
    slice_st.map(lambda o: Upsert("EndpointSlice", o)),
    node_st.map(lambda o: Upsert("Node", o)),
    st.sampled_from(SERVICES).map(lambda n: Delete("Service", "default", n)),
    st.sampled_from(SLICES).map(lambda n: Delete("EndpointSlice", "default", n)),
    st.sampled_from(NODES).map(lambda n: Delete("Node", "", n)),
)
KIND_EVENTS = {
    "Service": st.one_of(service_st.map(lambda o: Upsert("Service", o)),
                         st.sampled_from(SERVICES).map(lambda n: Delete("Service", "default", n))),
    "EndpointSlice": st.one_of(
        slice_st.map(lambda o: Upsert("EndpointSlice", o)),
        st.sampled_from(SLICES).map(lambda n: Delete("EndpointSlice", "default", n))),
    "Node": st.one_of(node_st.map(lambda o: Upsert("Node", o)),
                      st.sampled_from(NODES).map(lambda n: Delete("Node", "", n))),
}
KIND_ST = {"Service": service_st, "EndpointSlice": slice_st, "Node": node_st}
API_VERSIONS = {"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1", "Node": "v1"}


def _listed(kind: str, obj: dict[str, Any], raw: bool) -> Any:
    """An object as a listing hands it on: the apiserver source passes Services and
    EndpointSlices as their JSON (RawObject, decoded by the store's typed path)."""
    if raw and kind != "Node":
        return RawObject(kind, API_VERSIONS[kind], json.dumps(obj).encode())  # type: ignore[arg-type]
    return obj


def listing(kind: str, objs: list[dict[str, Any]], cuts: list[int], raw: bool) -> list[Replace]:
    """A kind's listing in parts (the apiserver's pages), cut after the given counts."""
    items = [_listed(kind, o, raw) for o in objs]
    bounds = sorted({min(c, len(items)) for c in cuts} - {0, len(items)})
    edges = [0, *bounds, len(items)]
    parts = [items[a:b] for a, b in zip(edges, edges[1:], strict=False)] or [[]]
    return [Replace(kind, part, first=i == 0, last=i == len(parts) - 1)  # type: ignore[arg-type]
            for i, part in enumerate(parts)]


# A restarted frontend's clock, in microseconds after the last revision handed out:
# behind it (stepped back), its history may reach revisions clients hold.
CLOCK_ST = st.one_of(st.integers(-3, 3), st.integers(-40, 40), st.just(10**6))


class StreamModel(RuleBasedStateMachine):
    """Clients at any resume point and any coalescing window end equal to the view."""

    # What the changelog keeps at most (TinyBoundsStreamModel: every bound tiny).
    bounds = DEFAULT_BOUNDS

    def __init__(self) -> None:
        super().__init__()
        # Small messages, so batches are split (more=true), and a short history, so
        # resumes also end in resets.
        self._limits = (views_module.MESSAGE_BYTES, snapshots_module.MESSAGE_BYTES)
        views_module.MESSAGE_BYTES = snapshots_module.MESSAGE_BYTES = 300
        self.clients: list[Client] = []
        self.worker_clients: list[WorkerClient] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        # How many times the frontend's process tree restarted.
        self.generation = -1
        self._boot(None)

    def _boot(self, clock: float | None) -> None:
        """A frontend process tree starts (its clock reading ``clock``, or the real one):
        engine, servicer, epoch, a stream worker; nothing listed yet."""
        self.generation += 1
        with mock.patch("time.time", return_value=clock) if clock else contextlib.nullcontext():
            self.engine = Engine(history_limit=12, bounds=self.bounds)
        # Revisions above it may be another frontend's (resuming without the epoch).
        self.first_revision = clock * 1e6 if clock else self.engine.changelog.revision
        self.epoch = EpochInterceptor(new_epoch())
        self.side = WorkerSide(self.engine, self._record)
        self.servicer = self.side.servicer
        self.pages = NodeStatePages(self.engine)
        # Per view: what GetNodeState said at each revision it changed (or was made) at.
        self.said: dict[str, list[tuple[int, Any]]] = {}

    def teardown(self) -> None:
        views_module.MESSAGE_BYTES, snapshots_module.MESSAGE_BYTES = self._limits
        self.side.close()

    def _record(self) -> None:
        """Note what each view says now (after anything that may move the revision)."""
        revision = self.engine.changelog.revision
        for name, view in self.engine.changelog.views.items():
            said = self.said.setdefault(name, [])
            if not said or said[-1][0] != revision:
                said.append((revision, expected(view)))

    def _said_at(self, name: str, revision: int) -> Any:
        """What GetNodeState said of view ``name`` at ``revision``."""
        said = self.said[name]
        index = bisect.bisect_right(said, revision, key=lambda entry: entry[0])
        assert index, f"view {name!r} had no state at revision {revision}"
        return said[index - 1][1]

    @initialize(objs=st.lists(st.one_of(service_st, slice_st, node_st), max_size=6),
                data=st.data())
    def sync(self, objs: list[dict[str, Any]], data: st.DataObject) -> None:
        for obj in objs:
            self._store(Upsert(obj["kind"], obj))
        self._list_all(data)

    def _list_all(self, data: st.DataObject) -> None:
        """The first listing: each kind in pages, the kinds' pages interleaved, and watch
        events of the kinds listed already between them (as the apiserver source sends)."""
        pending = {kind: self._listing(kind, self._objects_of(kind), data) for kind in KINDS}
        listed: list[str] = []
        while any(pending.values()):
            kind = data.draw(st.sampled_from([k for k in KINDS if pending[k]]))
            part = pending[kind].pop(0)
            self.engine.submit([part])
            if part.last:
                listed.append(kind)
            if listed and not self.engine.synced.is_set():
                events = data.draw(st.lists(st.one_of(*[KIND_EVENTS[k] for k in listed]),
                                            max_size=2))
                if events:
                    self.engine.submit(events)
                    for event in events:
                        self._store(event)
        assert self.engine.synced.is_set()
        self._record()

    def _objects_of(self, kind: str) -> list[dict[str, Any]]:
        return [obj for (k, _, _), obj in self.objects.items() if k == kind]

    def _listing(self, kind: str, objs: list[dict[str, Any]], data: st.DataObject
                 ) -> list[Replace]:
        cuts = data.draw(st.lists(st.integers(0, 6), max_size=2))
        return listing(kind, objs, cuts, data.draw(st.booleans()))

    @rule(kind=st.sampled_from(KINDS), data=st.data())
    def relist(self, kind: str, data: st.DataObject) -> None:
        """A relist (after 410 Gone, an apiserver restart): the kind's objects now, some
        unchanged, some new or changed, the rest gone; in pages."""
        held = self._objects_of(kind)
        kept = data.draw(st.lists(st.sampled_from(held), unique_by=id)) if held else []
        objs = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                for o in kept + data.draw(st.lists(KIND_ST[kind], max_size=3))}
        for key in [k for k in self.objects if k[0] == kind]:
            del self.objects[key]
        for obj in objs.values():
            self._store(Upsert(kind, obj))  # type: ignore[arg-type]
        for part in self._listing(kind, list(objs.values()), data):
            self.engine.submit([part])
            self._record()

    @rule(events=st.lists(event_st, min_size=1, max_size=4))
    def change(self, events: list[Event]) -> None:
        self.engine.submit(events)
        self._record()
        for event in events:
            self._store(event)

    def _store(self, event: Event) -> None:
        if isinstance(event, Upsert):
            meta = event.obj["metadata"]
            self.objects[(event.kind, meta.get("namespace", ""), meta["name"])] = event.obj
        elif isinstance(event, Delete):
            self.objects.pop((event.kind, event.namespace, event.name), None)

    @invariant()
    def views_equal_a_fresh_engine(self) -> None:
        """What GetNodeState says equals what the objects say, however they got there."""
        fresh = Engine()
        kinds: dict[str, list[dict[str, Any]]] = {"Service": [], "EndpointSlice": [],
                                                  "Node": []}
        for (kind, _, _), obj in self.objects.items():
            kinds[kind].append(obj)
        fresh.submit([Replace(k, v) for k, v in kinds.items()])  # type: ignore[arg-type]
        for name, view in list(self.engine.changelog.views.items()):
            assert _without_triggers(expected(view)) == _without_triggers(
                expected(fresh.changelog.view(name))), name

    @rule(name=st.sampled_from(WATCHED), sends_epoch=st.booleans())
    def connect(self, name: str, sends_epoch: bool) -> None:
        client = Client(name, f"10.2.0.{len(self.clients)}", sends_epoch)
        self.clients.append(client)
        self._start(client)

    def _since(self, client: Client, later: bool = False) -> int | None:
        """The since_revision a client's Watch reaches the servicer with (the epoch
        interceptor's), ``later`` when the main process reads it; None for a client the
        model leaves (see ``_excluded``)."""
        if self._excluded(client, later):
            return None
        since, epoch = through_epoch(self.epoch, client)
        assert epoch == self.epoch.epoch
        if client.revision and client.generation != self.generation:
            noted("resume from another frontend: " + (
                "with the epoch" if client.sdk else
                "ahead, refused" if since > self.engine.changelog.revision else
                "behind its clock"))
        return since

    def _excluded(self, client: Client, later: bool) -> bool:
        """A client that sends no epoch, whose revision is another frontend's and past
        this one's clock at its start (a clock that stepped back), may resume into this
        frontend's unrelated history (the documented limitation): the model leaves it
        (removes it). Such a revision still ahead of this frontend's when its Watch is
        served is INVALID_ARGUMENT (the client watches from 0), and one at or behind
        the clock a reset: both kept. A stream worker's Watch is served when the main
        process reads it, the revision moved meanwhile: there, every revision past the
        clock is left."""
        if (client.sdk is not None or client.generation == self.generation
                or client.revision <= self.first_revision
                or client.revision > self.engine.changelog.revision and not later):
            return False
        noted("excluded: no epoch, the clock stepped back past its revision")
        for clients in (self.clients, self.worker_clients):
            if client in clients:
                clients.remove(client)  # type: ignore[arg-type]
        return True

    def _open(self, client: Client) -> list[bytes] | None:
        """A stream starts as the API starts it (epoch interceptor, then the servicer's
        start_stream): its first messages; None when it did not start."""
        since = self._since(client)
        if since is None:
            return None
        try:
            client.view, client.cursor, first = self.servicer.start_stream(
                client.name, since, client.peer)
        except Refused as err:
            client.refused(err)
            return None
        self._record()
        return list(first)

    def _start(self, client: Client) -> None:
        """A stream starts and writes its first messages."""
        first = self._open(client)
        if first is not None:
            client.receive(first, self.epoch.epoch, self.generation)
            self._check(client)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """A stream writes what its view got since its cursor (coalesced)."""
        client = data.draw(st.sampled_from(self.clients))
        if client.view is None:
            self._start(client)
            return
        msgs = self._next_messages(client)
        if msgs:
            client.receive(msgs, self.epoch.epoch, self.generation)
            self._check(client)

    def _next_messages(self, client: Client) -> list[bytes]:
        """What a client's stream writes next: what it missed, coalesced, or a snapshot."""
        view = client.view
        assert view is not None
        if view.revision <= client.cursor:
            return []
        msgs = view.messages_since(client.cursor)
        if msgs is None:
            client.cursor, snapshot = self.engine.snapshots.catch_up(view, client.cursor)
            return list(snapshot)
        client.cursor = view.revision
        return msgs

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        """The stream breaks; the client resumes from its revision later."""
        self._disconnect(data.draw(st.sampled_from(self.clients)))

    def _disconnect(self, client: Client) -> None:
        if client.view is not None:
            self.engine.changelog.unwatch(client.view)
            self.servicer.slots.release(client.peer)
            client.view = None

    @rule(clock=CLOCK_ST, data=st.data())
    def restart(self, clock: int, data: st.DataObject) -> None:
        """The frontend's process tree ends (kill -9, a rollout) and another starts: a new
        engine, epoch and stream worker, its revisions from its clock, ``clock``
        microseconds after the last revision handed out (behind it: the clock stepped
        back), listing the same objects (changing meanwhile). Each stream ends where it
        is: after its pending messages, within them (mid-batch: the client stays where
        it was), or just after its client watched again (mid-snapshot)."""
        for client in list(self.clients):
            if client.view is None:
                continue
            if data.draw(st.booleans()):
                self._disconnect(client)
                msgs = self._open(client) or []
            else:
                msgs = self._next_messages(client)
            client.receive(msgs[:data.draw(st.integers(0, len(msgs)))], self.epoch.epoch,
                           self.generation, cut=True)
            client.view = None
        for worker_client in self.worker_clients:
            worker_client.view, worker_client.task = None, None
        self.side.close()
        self._boot((self.engine.changelog.revision + clock) / 1e6)
        self._list_all(data)
        noted("restart, clock " + ("behind" if clock < 0 else "ahead"))

    @rule()
    def converge(self) -> None:
        """Every client watches and reads everything: each holds what GetNodeState says
        (nothing another frontend had, or a revision before, that this one has not)."""
        for client in list(self.clients):
            if client.view is None:
                self._start(client)
            if client.view is None and client in self.clients:
                self._start(client)  # after INVALID_ARGUMENT, from 0
            if client in self.clients:
                msgs = self._next_messages(client)
                client.receive(msgs, self.epoch.epoch, self.generation)
                self._check(client)

    @rule(name=st.sampled_from(NODES + ["n4"]), size=st.integers(1, 3), data=st.data())
    def get_node_state(self, name: str, size: int, data: st.DataObject) -> None:
        """GetNodeState in pages, the state changing or the frontend restarting between
        them: every page is of the first page's revision and together they are the view
        then, or the listing is gone (ABORTED: start again). A page token is no client's
        epoch: past a restarted frontend's clock it is the limitation ``_excluded`` says."""
        token, got, want = "", {}, None
        first: pb.NodeState | None = None
        while True:
            try:
                page = pb.NodeState.FromString(self.pages.answer(pb.GetNodeStateRequest(
                    node_name=name, page_size=size, page_token=token)))
            except Refused as err:
                assert token and err.code_name == "ABORTED", err.message
                return
            if first is None:
                first = page
                view = self.engine.changelog.view(name)  # nothing changed since the page
                want = expected(view)
                self.engine.changelog.release(view)
            assert page.revision == first.revision
            for msg in page.services:
                got[msg.service.key.SerializeToString()] = (
                    msg.service.SerializeToString(deterministic=True),
                    {e.ip: e.SerializeToString() for e in msg.endpoints})
            token = page.next_page_token
            if not token:
                break
            between = data.draw(st.sampled_from(["", "change", "restart"]))
            if between == "change":
                self.change(data.draw(st.lists(event_st, min_size=1, max_size=2)))
            elif between == "restart":
                self.restart(data.draw(CLOCK_ST), data)
                if first.revision > self.first_revision:
                    noted("excluded: a page token past the restarted frontend's clock")
                    return
        assert want is not None
        nodes = {first.node.name: first.node.SerializeToString(deterministic=True)} \
            if first.HasField("node") else {}
        assert (got, nodes) == want

    # ---- streams a stream worker serves (workers.py, worker.py) ----------------------
    @rule(name=st.sampled_from(WATCHED), sends_epoch=st.booleans())
    def connect_to_worker(self, name: str, sends_epoch: bool) -> None:
        client = WorkerClient(name, f"10.1.0.{len(self.worker_clients)}", sends_epoch)
        self.worker_clients.append(client)
        self._start_on_worker(client)

    def _start_on_worker(self, client: WorkerClient) -> None:
        """The worker's servicer starts a stream (the worker has the same epoch
        interceptor), unless the model leaves the client."""
        since = self._since(client, later=True)
        if since is not None:
            client.kind, client.task = "watch", self.side.start(self.side.link.watch(
                client.name, since, client.peer))

    @rule(to_main=st.integers(0, 3), to_worker=st.integers(0, 6))
    def pump(self, to_main: int, to_worker: int) -> None:
        """Each process reads some of what the other sent."""
        self.side.pump_main(to_main, self._record)
        self.side.pump_worker(to_worker)

    @precondition(lambda self: self.worker_clients)
    @rule(data=st.data())
    def deliver_on_worker(self, data: st.DataObject) -> None:
        self._deliver_on_worker(data.draw(st.sampled_from(self.worker_clients)))

    def _deliver_on_worker(self, client: WorkerClient) -> bool:
        """One step of the worker's write_stream; whether it sent or asked anything."""
        side = self.side
        if client.task is not None:
            side.step()
            if not client.task.done():
                return False
            task, client.task = client.task, None
            if client.kind == "watch":
                try:
                    client.view, client.cursor, msgs = task.result()
                except Refused as err:
                    client.refused(err)
                    return True
            else:
                client.cursor, msgs = task.result()
            msgs = side.read(msgs)
        elif client.view is None:
            self._start_on_worker(client)
            return True
        else:
            view = client.view
            if view.revision <= client.cursor:
                return False
            msgs = view.messages_since(client.cursor)
            if msgs is None:
                client.kind, client.task = "catchup", side.start(side.link.catch_up(
                    client.name, client.cursor))
                return True
            client.cursor = view.revision
        client.receive(msgs, self.epoch.epoch, self.generation)
        self._check_at(client)
        return True

    @precondition(lambda self: self.worker_clients)
    @rule(data=st.data())
    def disconnect_from_worker(self, data: st.DataObject) -> None:
        """The stream ends, also while it waits for the main process or once its answer
        came but before the stream read it."""
        client = data.draw(st.sampled_from(self.worker_clients))
        link = self.side.link
        task, client.task = client.task, None
        if task is not None and task.done() and task.exception() is not None:
            return  # refused: it held nothing
        if task is not None and task.done():
            # The stream had its answer: its finally closes the snapshot it did not read.
            answer = task.result()
            if client.kind == "watch":
                client.view = answer[0]
            if isinstance(answer[-1], SnapshotFeed):
                answer[-1].close()
        elif task is not None:
            task.cancel()
            self.side.step()
            assert task.cancelled()
            if client.kind == "watch":
                return
        if client.view is not None:
            # WorkerServicer.stream's end: its finally and the call's done callback.
            link.unwatch(client.view)
            link.release(client.peer)
            client.view = None

    @rule()
    def settle(self) -> None:
        """Once both processes have read everything, every stream of the worker is at its
        view's state (no batch was lost on the way), and the main process holds no
        snapshot a stream no longer reads."""
        side = self.side
        for _ in range(1000):
            side.pump_main(len(side.to_main.queue), self._record)
            side.pump_worker(len(side.to_worker.queue))
            moved = [self._deliver_on_worker(c) for c in list(self.worker_clients)]
            if not any(moved) and not side.to_main.queue and not side.to_worker.queue:
                break
        else:
            raise AssertionError("the worker's streams never settled")
        for client in self.worker_clients:
            assert client.view is not None and client.task is None
            self._check_against(client, expected(self.engine.changelog.views[client.name]))
        assert not side.worker.feeds, "snapshots no stream reads are held"
        watching = collections.Counter(c.name for c in self.worker_clients)
        assert side.worker.watching == watching, "streams no client has are counted"
        assert side.worker.peers == collections.Counter(c.peer for c in self.worker_clients)
        assert {n: v.watchers for n, v in side.link.views.items()} == watching

    def _check_at(self, client: Client) -> None:
        """The client's state is what GetNodeState said at the client's revision."""
        self._check_against(client, self._said_at(client.name, client.doc.revision))

    def _check(self, client: Client) -> None:
        assert client.view is not None
        self._check_against(client, expected(client.view))

    def _check_against(self, client: Client, want: Any) -> None:
        """Both the documentation-only client and the SDK hold ``want``."""
        assert client.doc.state() == want
        if client.sdk is None:
            return
        sdk = DocClient()
        sdk.apply([pb.WatchEvent(revision=1, ops=[
            pb.Op(replace_service=state_to_pb(r)) for r in client.sdk._services.values()
        ] + [pb.Op(set_node=node_to_pb(n)) for n in client.sdk._nodes.values()])])
        assert _without_triggers(sdk.state()) == _without_triggers(want)
        assert client.sdk.mismatches == 0

    @invariant()
    def views_hold_their_digest(self) -> None:
        for view in self.engine.changelog.views.values():
            if view.digest is not None:
                doc = DocClient()
                doc.services = {}
                services, nodes = expected(view)
                assert view.digest == _digest_of(services, nodes)


def _digest_of(services: dict[bytes, tuple[bytes, dict[str, bytes]]],
               nodes: dict[str, bytes]) -> int:
    doc = DocClient()
    doc.nodes = {n: pb.NodeInfo.FromString(d) for n, d in nodes.items()}
    doc.services = {k: (pb.ServicePort.FromString(s),
                        {ip: pb.Endpoint.FromString(e) for ip, e in eps.items()})
                    for k, (s, eps) in services.items()}
    return doc.digest()


def _without_triggers(state: tuple[dict[bytes, tuple[bytes, dict[str, bytes]]],
                                   dict[str, bytes]]) -> Any:
    """The SDK holds trigger times as floats (nanoseconds may round): compare without."""
    services = {}
    for key, (svc, eps) in state[0].items():
        msg = pb.ServicePort.FromString(svc)
        msg.ClearField("trigger_time")
        services[key] = (msg.SerializeToString(deterministic=True), eps)
    return services, state[1]


StreamModel.TestCase.settings = settings(
    max_examples=250, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestStreamModel = StreamModel.TestCase


class TinyBoundsStreamModel(StreamModel):
    """The same contract (resume, coalescing, digests) with every memory bound tiny
    (issue 28): histories of a few batches' bytes, the encoder's caches swept on almost
    every new entry, a view nobody needs forgotten at the next change, as many views as
    names watched."""

    bounds = ViewBounds(history_bytes=4000, max_views=len(WATCHED), idle_seconds=0.0,
                        idle_views=1, cache_floor=1)


TinyBoundsStreamModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestStreamModelTinyBounds = TinyBoundsStreamModel.TestCase


# ---- coalescing alone, against the ops' documented meaning ------------------------------
KEYS = [ServicePortKey("default", n, "http", Protocol.TCP) for n in ("p", "q")]
record_st = st.one_of(st.none(), st.builds(
    lambda key, port, eps: ServicePortState(
        ServicePort(key, cluster_ips=("10.96.0.1",), port=port),
        {ip: ModelEndpoint(ip, 8080, ready=ready) for ip, ready in eps.items()}),
    st.sampled_from(KEYS), st.sampled_from([80, 81]),
    st.dictionaries(st.sampled_from(IPS[:4]), st.booleans(), max_size=3)))
node_op_st = st.one_of(
    st.builds(lambda n, z: set_node(NodeInfo(n, z)), st.sampled_from(NODES),
              st.sampled_from(["z1", "z2"])),
    st.sampled_from(NODES).map(delete_node))


@settings(max_examples=300, deadline=None)
@given(start=st.dictionaries(st.sampled_from(KEYS), record_st),
       steps=st.lists(st.tuples(st.sampled_from(KEYS), record_st, st.lists(node_op_st,
                                                                            max_size=1)),
                      max_size=12),
       window=st.tuples(st.integers(0, 12), st.integers(0, 12)))
def test_coalesced_ops_have_the_effect_of_the_batches(
        start: dict[ServicePortKey, ServicePortState | None],
        steps: list[tuple[ServicePortKey, ServicePortState | None, list[WireOp]]],
        window: tuple[int, int]) -> None:
    """Applying any window of batches coalesced equals applying them one by one."""
    held = {k: r for k, r in start.items() if r is not None and r.key == k}
    batches = []
    for key, rec, node_ops in steps:
        if rec is not None and rec.key != key:
            rec = ServicePortState(dataclasses.replace(rec.service, key=key), rec.endpoints)
        batches.append(diff_records(held.get(key), rec) + node_ops)
        held[key] = rec  # type: ignore[assignment]
    lo, hi = sorted(window)
    initial = [pb.Op.FromString(replace_service(r).data) for r in start.values()
               if r is not None]

    def run(groups: list[list[WireOp]]) -> Any:
        doc = DocClient()
        doc.apply([pb.WatchEvent(revision=1, ops=initial)])
        for rev, ops in enumerate(groups, 2):
            doc.apply([pb.WatchEvent(revision=rev, ops=[pb.Op.FromString(o.data)
                                                         for o in ops])])
        return doc.state()

    one_by_one = run(batches)
    assert run(batches[:lo] + [coalesce(batches[lo:hi])] + batches[hi:]) == one_by_one


def test_the_proto_defines_the_digest_term_the_frontend_computes() -> None:
    """The proto said "the first 8 bytes of BLAKE2b": a client taking BLAKE2b-512's
    first bytes (what those words say) would never match and would reset forever."""

    text = (REPO / "proto" / "nodestate.proto").read_text()
    comment = " ".join(line.strip().removeprefix("// ") for line in text.splitlines()
                       if line.strip().startswith("//"))
    assert "a term is BLAKE2b-64 (BLAKE2b with an 8-byte digest size, unkeyed" in comment
    node = pb.NodeInfo(name="n1", zone="z", labels={"b": "2", "a": "1"})
    data = b"n" + node.SerializeToString(deterministic=True)
    sent = digest_term(b"n", node)  # the frontend's and the SDK's
    assert sent == _term(b"n", node) == int.from_bytes(
        blake2b(data, digest_size=8).digest(), "little")
    assert sent != int.from_bytes(blake2b(data).digest()[:8], "little")


# ---- a stream worker's streams that end at any point give back what they held ---------
def _synced_engine() -> Engine:
    engine = Engine(history_limit=2)
    engine.submit([Replace("Service", [_service("a", [("http", "TCP", 80)], "ClusterIP",
                                                "Cluster", "Cluster", "", "")]),
                   Replace("EndpointSlice", [_slice("s0", "a", [_endpoint(
                       1, "n1", "z1", {}, None)], [("http", "TCP", 80)], "IPv4")]),
                   Replace("Node", [_node("n1", "z1", "", False)])])
    return engine


def _held(side: WorkerSide, engine: Engine) -> Any:
    """What the main process and the worker count for streams, and the snapshots kept."""
    side.pump_main(len(side.to_main.queue), lambda: None)
    return (dict(side.worker.feeds), dict(side.worker.watching), dict(side.worker.peers),
            dict(side.link.views), engine.changelog.views["n1"].watchers,
            dict(side.workers._servicer.slots.per_peer))


def test_a_worker_stream_that_leaves_as_its_answer_comes_holds_nothing() -> None:
    """The answer to a new stream came (its snapshot kept by the main process, the view
    counted, the peer's slot taken), but the client left before the stream resumed: it
    was all held until the worker died (100 such at one address: every later stream of
    that address refused)."""
    engine = _synced_engine()
    side = WorkerSide(engine, lambda: None)
    try:
        task = side.start(side.link.watch("n1", 0, "10.1.0.1"))
        side.pump_main(1, lambda: None)
        assert side.worker.feeds  # the snapshot is read one message at a time
        side.pump_worker(1)  # the answer is in; the stream has not resumed
        task.cancel()
        side.step()
        assert task.cancelled()
        assert _held(side, engine) == ({}, {}, {}, {}, 0, {})
    finally:
        side.close()


def test_a_worker_stream_that_leaves_during_a_catch_up_holds_no_snapshot() -> None:
    """A stream behind its worker's history asks for a catch-up (a snapshot): leaving
    before or after the answer came, the main process keeps no snapshot for it."""
    for answered in (False, True):
        engine = _synced_engine()
        side = WorkerSide(engine, lambda: None)
        try:
            watch = side.start(side.link.watch("n1", 0, "10.1.0.1"))
            while not watch.done():
                side.pump_main(1, lambda: None)
                side.pump_worker(1)
                side.step()
            view, cursor, first = watch.result()
            side.read(first)
            for ip in (2, 3, 4):  # past the history of two ops
                engine.submit([Upsert("EndpointSlice", _slice("s0", "a", [_endpoint(
                    ip, "n1", "z1", {}, None)], [("http", "TCP", 80)], "IPv4"))])
            side.pump_worker(len(side.to_worker.queue))
            assert view.messages_since(cursor) is None
            task = side.start(side.link.catch_up("n1", cursor))
            side.pump_main(1, lambda: None)
            if answered:
                side.pump_worker(1)
            task.cancel()
            side.step()
            side.pump_worker(len(side.to_worker.queue))
            side.link.unwatch(view)
            side.link.release("10.1.0.1")
            assert _held(side, engine) == ({}, {}, {}, {}, 0, {}), answered
        finally:
            side.close()
