"""Model-based proof of the stream contract (issue 11).

Random sequences of changes to services, slices and nodes go through the real Engine.
Clients connect, fall behind for any number of batches, disconnect (their view may be
forgotten and made again), resume from their revision and are fed exactly what a
stream would send them (``Snapshots.catch_up``, then ``NodeView.messages_since`` as in
stream.write_stream, batches split over several messages). After every delivery the
client's state must equal the view's (what GetNodeState answers), both for the SDK's
apply code and for ``DocClient``, a client written from nodestate.proto's comments
alone, which also checks every digest the server sends.
"""

from __future__ import annotations

import dataclasses
from hashlib import blake2b
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from svcproxy.convert import digest_term, node_to_pb, state_to_pb
from svcproxy.frontend.engine import Engine
from svcproxy.frontend.publication import snapshots as snapshots_module
from svcproxy.frontend.publication import views as views_module
from svcproxy.frontend.publication.views import NodeView
from svcproxy.frontend.publication.wire import (
    WireOp,
    coalesce,
    delete_node,
    diff_records,
    replace_service,
    set_node,
)
from svcproxy.frontend.sources.events import Delete, Event, Replace, Upsert
from svcproxy.model import Endpoint as ModelEndpoint
from svcproxy.model import NodeInfo, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb

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


def batches(msgs: Any) -> list[list[pb.WatchEvent]]:
    out: list[list[pb.WatchEvent]] = []
    pending: list[pb.WatchEvent] = []
    for data in msgs:
        event = pb.WatchEvent.FromString(data)
        pending.append(event)
        if not event.more:
            out.append(pending)
            pending = []
    assert not pending, "a stream's messages ended mid-batch"
    return out


class Client:
    """One watcher: the SDK's and the DocClient's state, and its stream's cursor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sdk = NodeStateClient("127.0.0.1:1", name or "", cluster=not name)
        self.doc = DocClient()
        self.view: NodeView | None = None
        self.cursor = 0

    def receive(self, msgs: Any) -> None:
        for batch in batches(msgs):
            self.sdk._apply(batch)
            assert not self.sdk._out_of_sync, "the SDK found itself out of sync"
            self.doc.apply(batch)


def _service(name: str, ports: list[tuple[str, str, int]], kind: str, itp: str, etp: str,
             dist: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterIP": f"10.96.0.{SERVICES.index(name) + 1}", "type": kind,
        "ports": [{"name": n, "protocol": p, "port": port, "targetPort": n}
                  for n, p, port in ports],
        "internalTrafficPolicy": itp}
    if kind == "NodePort":
        spec["externalTrafficPolicy"] = etp
    if dist:
        spec["trafficDistribution"] = dist
    return {"kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": spec}


# Valid ports only (an invalid object is refused and its last valid version kept).
ports_st = st.lists(st.sampled_from([("http", "TCP", 80), ("http", "UDP", 80),
                                     ("dns", "UDP", 53), ("dns", "TCP", 53)]),
                    min_size=1, max_size=2, unique_by=lambda p: p[0])
service_st = st.builds(_service, st.sampled_from(SERVICES), ports_st,
                       st.sampled_from(["ClusterIP", "NodePort"]),
                       st.sampled_from(["Cluster", "Local"]), st.sampled_from(["Cluster", "Local"]),
                       st.sampled_from(["", "PreferClose"]))
endpoint_st = st.fixed_dictionaries({
    "addresses": st.sampled_from(IPS).map(lambda ip: [ip]),
    "nodeName": st.sampled_from(NODES + ["n4"]),
    "zone": st.sampled_from(["z1", "z2"]),
    "conditions": st.fixed_dictionaries({"ready": st.booleans(), "serving": st.booleans(),
                                         "terminating": st.booleans()}),
    "hints": st.sampled_from(["z1", "z2"]).map(lambda z: {"forZones": [{"name": z}]}),
})


def _slice(svc: str, index: int, eps: list[dict[str, Any]], ports: list[tuple[str, str, int]],
           hinted: bool) -> dict[str, Any]:
    if not hinted:
        eps = [{k: v for k, v in e.items() if k != "hints"} for e in eps]
    if index:
        # Slices of one service never share an address: which copy of a duplicate wins
        # on a tie depends on the order the engine holds the slices in.
        eps = [{**e, "addresses": [e["addresses"][0].replace(".0.0.", ".0.1.")]} for e in eps]
    return {"kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"{svc}-{index}", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": [{"name": n, "port": 8000 + port, "protocol": p} for n, p, port in ports],
            "endpoints": eps}


slice_st = st.builds(_slice, st.sampled_from(SERVICES), st.integers(0, 1),
                     st.lists(endpoint_st, max_size=4), ports_st, st.booleans())
node_st = st.builds(lambda name, zone: {"kind": "Node", "metadata": {
    "name": name, "labels": {"topology.kubernetes.io/zone": zone} if zone else {}}},
    st.sampled_from(NODES), st.sampled_from(["", "z1", "z2"]))
event_st = st.one_of(
    service_st.map(lambda o: Upsert("Service", o)),
    slice_st.map(lambda o: Upsert("EndpointSlice", o)),
    node_st.map(lambda o: Upsert("Node", o)),
    st.sampled_from(SERVICES).map(lambda n: Delete("Service", "default", n)),
    st.tuples(st.sampled_from(SERVICES), st.integers(0, 1)).map(
        lambda t: Delete("EndpointSlice", "default", f"{t[0]}-{t[1]}")),
    st.sampled_from(NODES).map(lambda n: Delete("Node", "", n)),
)


class StreamModel(RuleBasedStateMachine):
    """Clients at any resume point and any coalescing window end equal to the view."""

    def __init__(self) -> None:
        super().__init__()
        # Small messages, so batches are split (more=true), and a short history, so
        # resumes also end in resets.
        self._limits = (views_module.MESSAGE_BYTES, snapshots_module.MESSAGE_BYTES)
        views_module.MESSAGE_BYTES = snapshots_module.MESSAGE_BYTES = 300
        self.engine = Engine(history_limit=12)
        self.clients: list[Client] = []
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}

    def teardown(self) -> None:
        views_module.MESSAGE_BYTES, snapshots_module.MESSAGE_BYTES = self._limits

    @initialize(objs=st.lists(st.one_of(service_st, slice_st, node_st), max_size=6))
    def sync(self, objs: list[dict[str, Any]]) -> None:
        kinds: dict[str, list[dict[str, Any]]] = {"Service": [], "EndpointSlice": [],
                                                  "Node": []}
        for obj in objs:
            self._store(Upsert(obj["kind"], obj))
        for (kind, _, _), obj in self.objects.items():
            kinds[kind].append(obj)
        self.engine.submit([Replace(k, v) for k, v in kinds.items()])  # type: ignore[arg-type]
        assert self.engine.synced.is_set()

    @rule(events=st.lists(event_st, min_size=1, max_size=4))
    def change(self, events: list[Event]) -> None:
        self.engine.submit(events)
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

    @rule(name=st.sampled_from(WATCHED))
    def connect(self, name: str) -> None:
        client = Client(name)
        self.clients.append(client)
        self._start(client)

    def _start(self, client: Client) -> None:
        """A stream starts: Watch(since_revision = the client's revision)."""
        client.view = self.engine.changelog.watch(client.name)
        client.cursor, first = self.engine.snapshots.catch_up(client.view, client.sdk.revision)
        assert client.doc.revision == client.sdk.revision
        client.receive(first)
        self._check(client)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """A stream writes what its view got since its cursor (coalesced)."""
        client = data.draw(st.sampled_from(self.clients))
        if client.view is None:
            self._start(client)
            return
        view = client.view
        if view.revision <= client.cursor:
            return
        msgs = view.messages_since(client.cursor)
        if msgs is None:
            client.cursor, msgs = self.engine.snapshots.catch_up(view, client.cursor)
        else:
            client.cursor = view.revision
        client.receive(msgs)
        self._check(client)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        """The stream breaks; the client resumes from its revision later."""
        client = data.draw(st.sampled_from(self.clients))
        if client.view is not None:
            self.engine.changelog.unwatch(client.view)
            client.view = None

    def _check(self, client: Client) -> None:
        assert client.view is not None
        want = expected(client.view)
        assert client.doc.state() == want
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
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestStreamModel = StreamModel.TestCase


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
    from pathlib import Path

    text = (Path(__file__).parent.parent / "proto" / "nodestate.proto").read_text()
    comment = " ".join(line.strip().removeprefix("// ") for line in text.splitlines()
                       if line.strip().startswith("//"))
    assert "a term is BLAKE2b-64 (BLAKE2b with an 8-byte digest size, unkeyed" in comment
    node = pb.NodeInfo(name="n1", zone="z", labels={"b": "2", "a": "1"})
    data = b"n" + node.SerializeToString(deterministic=True)
    sent = digest_term(b"n", node)  # the frontend's and the SDK's
    assert sent == _term(b"n", node) == int.from_bytes(
        blake2b(data, digest_size=8).digest(), "little")
    assert sent != int.from_bytes(blake2b(data).digest()[:8], "little")
