"""Churn against the stand-in apiserver, shared by tests/frontend/test_churn.py and bench_churn.py.

A real frontend (ApiserverSource) watches tests/support/fakeapiserver.py while ``Churn`` changes
every kind of object at full speed. Watchers: SDK NodeStateClients (live, or through a
``Relay`` the test cuts and restores) and raw gRPC streams that read slowly. At the end
each watcher must equal GetNodeState, which must equal what a fresh engine computes from
the apiserver's objects.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from svcproxy.convert import node_from_pb, state_from_pb
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.sources.events import Replace
from svcproxy.model import ServicePortKey, ServicePortState
from svcproxy.sdk.client import EPOCH_KEY, NodeStateClient, open_channel, server_epoch
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.frontend.publication.test_stream_model import DocClient, OutOfSync
from tests.support.fakeapiserver import FakeApiserver

NODES = ["n1", "n2", "n3", "n4"]
ZONES = ["z1", "z2"]
State = dict[ServicePortKey, ServicePortState]


class Relay:
    """A TCP relay from 127.0.0.1 to ``target`` (a unix socket path or host:port) that
    the test can cut (every connection closed, new ones refused) and restore."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _connect(self) -> socket.socket:
        if self.target.startswith("/"):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(self.target)
            return sock
        host, _, port = self.target.rpartition(":")
        return socket.create_connection((host, int(port)))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            try:
                upstream = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.open = False
        with self._lock:
            conns, self._conns = self._conns, set()
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self._listener.close()


class SlowWatcher:
    """A raw gRPC Watch that sleeps between reads (so gRPC flow control holds the
    frontend back), applies batches as nodestate.proto says, and resumes by itself."""

    def __init__(self, target: str, node: str, pause: float) -> None:
        self.target, self.node, self.pause = target, node, pause
        self.doc = DocClient()
        self.epoch: str | None = None
        self.digest_errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the document between batches, for state()
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch()
            except (grpc.RpcError, AssertionError, OutOfSync, ValueError):
                pass
            self._stop.wait(0.05)

    def _watch(self) -> None:
        with open_channel(self.target) as channel:
            stub = pb_grpc.NodeStateServiceStub(channel)
            meta = ((EPOCH_KEY, self.epoch),) if self.epoch and self.doc.revision else ()
            self._call = call = stub.Watch(pb.WatchRequest(
                node_name=self.node, since_revision=self.doc.revision), metadata=meta)
            pending: list[pb.WatchEvent] = []
            for event in call:
                pending.append(event)
                if not event.more:
                    with self._lock:
                        try:
                            self.doc.apply(pending)
                        except (AssertionError, OutOfSync):
                            self.digest_errors += 1
                            self.doc.revision = 0
                            raise
                    self.epoch = server_epoch(call)
                    pending = []
                time.sleep(self.pause)
                if self._stop.is_set():
                    return

    def state(self) -> State:
        """The state after the last whole batch (read while no batch is being applied:
        the watcher's thread changes the document's dicts)."""
        with self._lock:
            services = [(svc, list(eps.values())) for svc, eps in self.doc.services.values()]
        return {key_state.key: key_state for key_state in (
            state_from_pb(pb.ServicePortState(service=svc, endpoints=eps))
            for svc, eps in services)}

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(5)


def _num(name: str) -> int:
    return sum(map(ord, name)) * 7 + len(name)


def _service(name: str, rng: random.Random) -> dict[str, Any]:
    ports = [{"name": "http", "port": rng.choice([80, 8080]), "protocol": "TCP",
              "targetPort": "http"}]
    if rng.random() < 0.3:
        ports.append({"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"})
    kind = rng.choice(["ClusterIP"] * 6 + ["NodePort", "LoadBalancer"])
    spec: dict[str, Any] = {
        "type": kind, "clusterIP": f"10.96.0.{_num(name) % 250 + 1}", "ports": ports,
        "internalTrafficPolicy": rng.choice(["Cluster", "Local"])}
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": "default"}, "spec": spec}
    if kind != "ClusterIP":
        spec["externalTrafficPolicy"] = rng.choice(["Cluster", "Local"])
    if kind == "LoadBalancer":
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": f"192.0.2.{_num(name) % 250}"}]}}
    if rng.random() < 0.3:
        spec["trafficDistribution"] = "PreferClose"
    if rng.random() < 0.05:
        # No longer a service svcproxy programs (its ports leave every node), or again one.
        spec.update(type="ClusterIP", clusterIP="None")
        spec.pop("externalTrafficPolicy", None)
        obj.pop("status", None)
    return obj


def _slice(name: str, svc: str, rng: random.Random) -> dict[str, Any]:
    eps = []
    # Slices of one service may share addresses (as the EndpointSlice controller's do
    # while it moves endpoints): every frontend keeps the same copy.
    for ip in rng.sample(range(1, 30), rng.randint(0, 6)):
        ready = rng.random() < 0.7
        ep: dict[str, Any] = {
            "addresses": [f"10.{1 + _num(svc) % 200}.0.{ip}"], "nodeName": rng.choice(NODES),
            "zone": rng.choice(ZONES),
            "conditions": {"ready": ready, "serving": ready or rng.random() < 0.5,
                           "terminating": not ready and rng.random() < 0.5}}
        if rng.random() < 0.3:
            ep["hints"] = {"forZones": [{"name": rng.choice(ZONES)}]}
            if rng.random() < 0.3:
                ep["hints"]["forNodes"] = [{"name": rng.choice(NODES)}]
        eps.append(ep)
    return {"metadata": {"name": name, "namespace": "default",
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4", "endpoints": eps,
            "ports": [{"name": "http", "port": rng.choice([8080, 9090]), "protocol": "TCP"},
                      {"name": "dns", "port": 53, "protocol": "UDP"}]}


def _node(name: str, rng: random.Random) -> dict[str, Any]:
    return {"metadata": {"name": name,
                         "labels": {"topology.kubernetes.io/zone": rng.choice(ZONES)}}}


class Churn:
    """Random changes of every kind to the stand-in's objects."""

    def __init__(self, fake: FakeApiserver, services: int, seed: int = 1) -> None:
        self.fake = fake
        self.rng = random.Random(seed)
        self.names = [f"s{i}" for i in range(services)]
        self.changes = 0
        # What exists, kept here: asking the stand-in copies every object.
        self.services: set[str] = set()
        self.slices: set[str] = set()
        self.nodes: set[str] = set()
        for name in NODES[:3]:
            self._create("Node", name, _node(name, self.rng))
        for name in self.names:
            self._create("Service", name, _service(name, self.rng))
            self._create("EndpointSlice", f"{name}-a", _slice(f"{name}-a", name, self.rng))

    def _held(self, kind: str) -> set[str]:
        return {"Service": self.services, "EndpointSlice": self.slices, "Node": self.nodes}[kind]

    def _create(self, kind: str, name: str, obj: dict[str, Any]) -> None:
        self.fake.create(kind, obj)
        self._held(kind).add(name)

    def _delete(self, kind: str, name: str) -> None:
        self.fake.delete(kind, {"metadata": {"name": name}})
        self._held(kind).discard(name)

    def step(self) -> None:
        """One change: re-create a service (with a new slice), update (its type, policies,
        headless or not) or delete one, add, change or delete a slice (endpoints shared
        with the service's other slice, readiness, terminating, zone and node hints,
        ports), or add, re-zone or delete a node."""
        rng, fake = self.rng, self.fake
        name = rng.choice(self.names)
        roll = rng.random()
        if roll < 0.1:
            if name in self.services:
                self._delete("Service", name)
            for slice_name in (f"{name}-a", f"{name}-b"):
                if slice_name in self.slices:
                    self._delete("EndpointSlice", slice_name)
            self._create("Service", name, _service(name, rng))
            self._create("EndpointSlice", f"{name}-a", _slice(f"{name}-a", name, rng))
        elif roll < 0.2:
            if name in self.services:
                fake.update("Service", _service(name, rng))
        elif roll < 0.25:
            if name in self.services:
                self._delete("Service", name)
        elif roll < 0.9:
            slice_name = f"{name}-{rng.choice('ab')}"
            if slice_name in self.slices and rng.random() < 0.15:
                self._delete("EndpointSlice", slice_name)
            elif slice_name in self.slices:
                fake.update("EndpointSlice", _slice(slice_name, name, rng))
            else:
                self._create("EndpointSlice", slice_name, _slice(slice_name, name, rng))
        else:
            node = rng.choice(NODES)
            if node in self.nodes and rng.random() < 0.3:
                self._delete("Node", node)
            elif node in self.nodes:
                fake.update("Node", _node(node, rng))
            else:
                self._create("Node", node, _node(node, rng))
        self.changes += 1


def truth(fake: FakeApiserver, node: str) -> State:
    """What a fresh engine computes for ``node`` from the apiserver's objects."""
    engine = Engine()
    engine.submit([Replace(kind, list(fake.objects(kind).values()))  # type: ignore[arg-type]
                   for kind in ("Service", "EndpointSlice", "Node")])
    return dict(engine.changelog.view(node).records)


def get_node_state(target: str, node: str) -> State:
    with open_channel(target) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        out: State = {}
        token = ""
        while True:
            page = stub.GetNodeState(pb.GetNodeStateRequest(node_name=node, page_token=token),
                                     timeout=10)
            for msg in page.services:
                rec = state_from_pb(msg)
                out[rec.key] = rec
            token = page.next_page_token
            if not token:
                return out


def comparable(state: State) -> dict[ServicePortKey, Any]:
    """Trigger times say when the frontend saw a change: not part of the comparison."""
    return {k: (dataclasses.replace(r.service, trigger_time=0.0), dict(r.endpoints))
            for k, r in state.items()}


def sdk_state(client: NodeStateClient) -> State:
    with client._cond:
        return dict(client._services)


def node_of(client: NodeStateClient) -> Any:
    return client._node


def all_exact(fake: FakeApiserver, target: str, watchers: dict[str, list[Callable[[], State]]]
              ) -> bool:
    """Whether every watcher equals GetNodeState equals the objects, for every node (False
    while GetNodeState fails: a frontend restarting or too loaded to answer in time)."""
    for node, states in watchers.items():
        want = comparable(truth(fake, node))
        try:
            if comparable(get_node_state(target, node)) != want:
                return False
        except grpc.RpcError:
            return False
        if any(comparable(state()) != want for state in states):
            return False
    return True


def differences(fake: FakeApiserver, target: str,
                watchers: dict[str, list[Callable[[], State]]]) -> list[str]:
    """What differs, for a failure message: per node, GetNodeState and each watcher."""
    out = []
    for node, states in watchers.items():
        want = comparable(truth(fake, node))
        got = comparable(get_node_state(target, node))
        if got != want:
            out.append(f"{node}: GetNodeState differs in {_diff_keys(got, want)}")
        for i, state in enumerate(states):
            have = comparable(state())
            if have != want:
                out.append(f"{node} watcher {i}: differs in {_diff_keys(have, want)}")
    return out


def _diff_keys(a: dict[ServicePortKey, Any], b: dict[ServicePortKey, Any]) -> list[str]:
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    return [f"{k.name}/{k.port_name}" for k in keys]


__all__ = ["Churn", "Relay", "SlowWatcher", "all_exact", "node_from_pb", "sdk_state"]
