"""A stand-in Kubernetes apiserver for tests, speaking the real list/watch HTTP protocol.

It serves Services, EndpointSlices (discovery.k8s.io/v1) and Nodes:

- ``GET .../services`` returns a JSON ``ServiceList`` whose ``metadata.resourceVersion``
  is a global, monotonically increasing counter; ``limit``/``continue`` page through a
  consistent snapshot (an expired token answers HTTP 410 ``Expired``).
- ``GET .../services?watch=true&resourceVersion=N`` streams chunked JSON lines
  ``{"type": ..., "object": ...}`` of every change after N, BOOKMARK events when
  ``allowWatchBookmarks=true``, and ends after ``timeoutSeconds``. A resourceVersion
  older than the retained history yields one ``ERROR`` event carrying a 410 Status,
  exactly like the apiserver's watch cache (or, with ``gone_as_status``, an HTTP 410
  response, as when the apiserver serves the watch from etcd).

Tests change the cluster with :meth:`FakeApiserver.create` / ``update`` / ``delete``
(unchecked, as what etcd holds), or through ``submit`` and a client's POST, which the
model of the apiserver's validation and allocators (tests/support/kubemodel.py) answers with
201 or 422 Invalid as kube-apiserver v1.28 would; they provoke failures with
``compact``, ``expire_watches``, ``drop_connections`` and ``stop``/``start`` (an
apiserver restart that keeps its data, as etcd does).
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import itertools
import json
import re
import select
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support import kubemodel
from tests.support.faketokens import TokenIssuer


@dataclass(frozen=True)
class _Resource:
    """One served collection."""

    kind: str
    api_version: str
    base: str
    plural: str
    namespaced: bool


RESOURCES: dict[str, _Resource] = {
    "Service": _Resource("Service", "v1", "/api/v1", "services", True),
    "EndpointSlice": _Resource(
        "EndpointSlice", "discovery.k8s.io/v1", "/apis/discovery.k8s.io/v1", "endpointslices", True
    ),
    "Node": _Resource("Node", "v1", "/api/v1", "nodes", False),
    "Pod": _Resource("Pod", "v1", "/api/v1", "pods", True),
}
_BY_PATH = {(r.base, r.plural): r for r in RESOURCES.values()}
# What the allocators hand out (kube-apiserver's defaults).
SERVICE_CIDRS = (ipaddress.ip_network("10.96.0.0/12"), ipaddress.ip_network("fd00:10:96::/108"))
NODE_PORTS = (30000, 32767)
_POD_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
_TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
_PATH = re.compile(
    r"^(?P<base>/api/v1|/apis/discovery\.k8s\.io/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)$"
)


@dataclass(frozen=True)
class _Change:
    """One entry of the watch history."""

    rv: int
    kind: str
    type: str
    obj: dict[str, Any]


@dataclass(eq=False)
class _Watcher:
    """One open watch stream and the changes queued for it (like a cacheWatcher)."""

    kind: str
    namespace: str | None
    queue: deque[_Change]
    expire_generation: int
    drop_generation: int


@dataclass
class _Snapshot:
    """The consistent list a continue token pages through."""

    rv: int
    items: list[bytes]


@dataclass
class WatchRequest:
    """A watch the stand-in received (for tests to inspect)."""

    kind: str
    resource_version: str
    bookmarks: bool


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status failure object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta["name"]


@dataclass
class _State:
    """The cluster store, its resourceVersion counter and watch history."""

    history_size: int
    rv: int = 1000
    compacted_rv: int = 1000
    objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in RESOURCES}
    )
    history: deque[_Change] = field(default_factory=deque)
    snapshots: dict[int, _Snapshot] = field(default_factory=dict)
    expire_generation: int = 0
    drop_generation: int = 0


class FakeApiserver:
    """The stand-in apiserver; ``url`` is where it listens (127.0.0.1, random port)."""

    def __init__(
        self,
        *,
        history_size: int = 1000,
        bookmark_interval: float = 0.2,
        token: str | None = None,
        gone_as_status: bool = False,
    ) -> None:
        self.bookmark_interval = bookmark_interval
        self.token = token
        self.gone_as_status = gone_as_status
        self.list_requests: list[tuple[str, dict[str, str]]] = []
        self.watch_requests: list[WatchRequest] = []
        self._state = _State(history_size=history_size)
        self._cond = threading.Condition()
        self._snapshot_ids = itertools.count(1)
        # Each stored object's JSON as a list item (without kind and apiVersion), by kind
        # and key, made as it is stored: a list joins them, as etcd keeps objects encoded
        # (json.dumps of each page took 0.6 s of the stand-in's CPU to list 10,000
        # services, on the cores the client it serves runs on).
        self._encoded: dict[str, dict[tuple[str, str], bytes]] = {kind: {} for kind in RESOURCES}
        self._connections: set[socket.socket] = set()
        self._watchers: set[_Watcher] = set()
        # ServiceAccount tokens and their TokenReviews (tests/support/faketokens.py).
        self.tokens = TokenIssuer(self._pod)
        # Cleared: list requests wait until it is set again (a slow apiserver).
        self.lists_open = threading.Event()
        self.lists_open.set()
        self._port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.start()

    @property
    def url(self) -> str:
        """The base URL clients use."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        with self._cond:
            return self._state.rv

    def objects(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        """The current objects of a kind, keyed by (namespace, name)."""
        with self._cond:
            return copy.deepcopy(self._state.objects[kind])

    def active_watches(self, kind: str) -> int:
        """How many watch streams of a kind are open right now."""
        with self._cond:
            return sum(1 for w in self._watchers if w.kind == kind)

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object and return it as served (with resourceVersion, uid...)."""
        res = RESOURCES[kind]
        stored = copy.deepcopy(obj)
        stored["kind"], stored["apiVersion"] = kind, res.api_version
        meta = stored.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self._cond:
            if _key(stored) in self._state.objects[kind]:
                raise KeyError(f"{kind} {_key(stored)} already exists")
            return self._record(kind, "ADDED", stored)

    def submit(self, kind: str, obj: Any) -> tuple[int, dict[str, Any]]:
        """Create ``obj`` as a client's POST does: validated by the model of the apiserver's
        rules (tests/support/kubemodel.py) and, for a Service, by its allocators (a cluster IP in
        SERVICE_CIDR not held by another, a node port in NODE_PORTS not held by another);
        (201, the stored object) or (422, an Invalid Status naming each cause), or 409
        when it exists. ``create`` stays the unchecked way in (what etcd holds)."""
        causes = kubemodel.causes(kind, obj)
        if not causes and kind == "Service":
            causes = self._allocation_causes(obj)
        if causes:
            name = obj.get("metadata", {}).get("name", "") if isinstance(obj, dict) else ""
            status = _status(422, "Invalid", f"{kind} {name!r} is invalid: " + ", ".join(
                f"{where}: {why}" for where, why in causes))
            status["details"] = {"name": name, "kind": kind, "causes": [
                {"reason": "FieldValueInvalid", "field": where, "message": why}
                for where, why in causes]}
            return 422, status
        try:
            return 201, self.create(kind, obj)
        except KeyError as err:
            return 409, _status(409, "AlreadyExists", str(err))

    def _allocation_causes(self, obj: dict[str, Any]) -> list[tuple[str, str]]:
        """The cluster IP and node port allocators' refusals (ipallocator, portallocator)."""
        spec = obj.get("spec") or {}
        ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
        out = []
        with self._cond:
            held_ips, held_ports = set(), set()
            for other in self._state.objects["Service"].values():
                other_spec = other.get("spec") or {}
                held_ips |= set(other_spec.get("clusterIPs") or [other_spec.get("clusterIP")])
                held_ports |= {p.get("nodePort") for p in other_spec.get("ports") or []}
        for i, text in enumerate(ips):
            if text == "None":
                continue
            ip = kubemodel.as_v4(kubemodel.parse_ip(text))
            if not any(ip in net for net in SERVICE_CIDRS if net.version == ip.version):
                out.append((f"spec.clusterIPs[{i}]", "provided IP is not in the valid range"))
            elif text in held_ips:
                out.append((f"spec.clusterIPs[{i}]", "provided IP is already allocated"))
        for i, port in enumerate(spec.get("ports") or []):
            node_port = port.get("nodePort") or 0
            if node_port and not NODE_PORTS[0] <= node_port <= NODE_PORTS[1]:
                out.append((f"spec.ports[{i}].nodePort", "provided port is not in the valid "
                            "range"))
            elif node_port and node_port in held_ports:
                out.append((f"spec.ports[{i}].nodePort", "provided port is already allocated"))
        return out

    def update(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace an existing object (keeping its uid) and return it as served."""
        with self._cond:
            old = self._state.objects[kind][_key(self._with_namespace(kind, obj))]
            stored = copy.deepcopy(obj)
            stored["kind"], stored["apiVersion"] = kind, RESOURCES[kind].api_version
            meta = stored.setdefault("metadata", {})
            for field_name in ("namespace", "uid", "creationTimestamp"):
                if field_name in old["metadata"]:
                    meta[field_name] = old["metadata"][field_name]
            return self._record(kind, "MODIFIED", stored)

    def delete(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Delete an object; the DELETED event carries it with a new resourceVersion."""
        with self._cond:
            key = _key(self._with_namespace(kind, obj))
            stored = copy.deepcopy(self._state.objects[kind][key])
            return self._record(kind, "DELETED", stored)

    def too_old(self, resource_version: str) -> bool:
        """Whether a watch from this resourceVersion would get 410 Gone."""
        with self._cond:
            return resource_version not in ("", "0") and (
                int(resource_version) < self._state.compacted_rv
            )

    def compact(self) -> None:
        """Forget all history: watching from any older resourceVersion now gets 410 Gone."""
        with self._cond:
            self._state.history.clear()
            self._state.compacted_rv = self._state.rv
            self._state.snapshots.clear()

    def expire_watches(self) -> None:
        """Send every open watch an ERROR 410 "too old resource version" and end it."""
        with self._cond:
            self._state.expire_generation += 1
            self._cond.notify_all()

    def drop_connections(self) -> None:
        """Cut every open connection abruptly (no terminating chunk), as a network fault."""
        with self._cond:
            self._state.drop_generation += 1
            conns = list(self._connections)
            self._cond.notify_all()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def start(self) -> None:
        """Listen (again, on the same port after :meth:`stop`)."""
        server = ThreadingHTTPServer(("127.0.0.1", self._port), _make_handler(self))
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and cut every connection; the stored objects survive."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self.drop_connections()

    def close(self) -> None:
        """Stop for good."""
        self.stop()

    def _pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._cond:
            return copy.deepcopy(self._state.objects["Pod"].get((namespace, name)))

    def _with_namespace(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = dict(obj.get("metadata", {}))
        if RESOURCES[kind].namespaced:
            meta.setdefault("namespace", "default")
        return {"metadata": meta}

    def _record(self, kind: str, type_: str, stored: dict[str, Any]) -> dict[str, Any]:
        """Bump the resourceVersion, apply and append to history (caller holds the lock)."""
        state = self._state
        state.rv += 1
        stored["metadata"]["resourceVersion"] = str(state.rv)
        if type_ == "DELETED":
            del state.objects[kind][_key(stored)]
            del self._encoded[kind][_key(stored)]
        else:
            state.objects[kind][_key(stored)] = stored
            item = {k: v for k, v in stored.items() if k not in ("kind", "apiVersion")}
            self._encoded[kind][_key(stored)] = json.dumps(item).encode()
        change = _Change(state.rv, kind, type_, copy.deepcopy(stored))
        state.history.append(change)
        for watcher in self._watchers:
            if watcher.kind == kind and _in_namespace(stored, watcher.namespace):
                watcher.queue.append(change)
        while len(state.history) > state.history_size:
            state.compacted_rv = state.history.popleft().rv
        self._cond.notify_all()
        return copy.deepcopy(stored)

    def list_page(
        self, res: _Resource, namespace: str | None, params: dict[str, str]
    ) -> tuple[int, dict[str, Any] | bytes]:
        """Answer one list request: (HTTP status, body, as JSON when bytes)."""
        self.lists_open.wait()
        with self._cond:
            self.list_requests.append((res.kind, dict(params)))
            token = params.get("continue")
            if token:
                snap_id, start = json.loads(base64.urlsafe_b64decode(token))
                snap = self._state.snapshots.get(snap_id)
                if snap is None or snap.rv < self._state.compacted_rv:
                    message = "The provided continue parameter is too old"
                    return 410, _status(410, "Expired", message)
            else:
                snap_id, start = next(self._snapshot_ids), 0
                snap = _Snapshot(self._state.rv, self._list_items(res.kind, namespace))
        limit = int(params.get("limit") or 0) or len(snap.items) or 1
        items, rest = snap.items[start : start + limit], snap.items[start + limit :]
        meta: dict[str, Any] = {"resourceVersion": str(snap.rv)}
        if rest:
            with self._cond:
                self._state.snapshots[snap_id] = snap
            raw = json.dumps([snap_id, start + limit]).encode()
            meta["continue"] = base64.urlsafe_b64encode(raw).decode()
            meta["remainingItemCount"] = len(rest)
        head = json.dumps({"kind": f"{res.kind}List", "apiVersion": res.api_version,
                           "metadata": meta}).encode()
        return 200, head[:-1] + b', "items": [' + b", ".join(items) + b"]}"

    def _list_items(self, kind: str, namespace: str | None) -> list[bytes]:
        """The objects' JSON (``_record`` keeps it), sorted, as items of a list."""
        encoded = self._encoded[kind]
        return [encoded[key] for key in sorted(encoded)
                if namespace is None or key[0] == namespace]

    def watch(
        self, res: _Resource, namespace: str | None, params: dict[str, str], send: _Sender
    ) -> None:
        """Stream one watch until timeout, expiry, a dropped connection or shutdown."""
        rv_param = params.get("resourceVersion", "")
        bookmarks = params.get("allowWatchBookmarks") == "true"
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        with self._cond:
            self.watch_requests.append(WatchRequest(res.kind, rv_param, bookmarks))
            watcher = self._register(res, namespace, rv_param)
        if watcher is None:
            send.event("ERROR", self._too_old(int(rv_param)))
            return
        try:
            self._stream(res, watcher, bookmarks, deadline, send)
        finally:
            with self._cond:
                self._watchers.discard(watcher)

    def _register(self, res: _Resource, namespace: str | None, rv_param: str) -> _Watcher | None:
        """A watcher primed with what it missed since rv_param; None if that is too old."""
        state = self._state
        if rv_param in ("", "0"):
            backlog = [
                _Change(state.rv, res.kind, "ADDED", obj)
                for obj in self._watch_objects(res.kind, namespace)
            ]
        elif int(rv_param) < state.compacted_rv:
            return None
        else:
            backlog = [
                c
                for c in state.history
                if c.rv > int(rv_param) and c.kind == res.kind and _in_namespace(c.obj, namespace)
            ]
        watcher = _Watcher(
            res.kind, namespace, deque(backlog), state.expire_generation, state.drop_generation
        )
        self._watchers.add(watcher)
        return watcher

    def _stream(
        self,
        res: _Resource,
        watcher: _Watcher,
        bookmarks: bool,
        deadline: float | None,
        send: _Sender,
    ) -> None:
        state = self._state
        next_bookmark = time.monotonic() + self.bookmark_interval
        while True:
            with self._cond:
                if state.drop_generation != watcher.drop_generation or self._server is None:
                    raise ConnectionAbortedError("dropped by the test")
                if send.peer_closed():
                    raise ConnectionResetError("the client went away")
                if state.expire_generation != watcher.expire_generation:
                    send.event("ERROR", self._too_old(state.rv - 1))
                    return
                changes = list(watcher.queue)
                watcher.queue.clear()
                current = state.rv
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            for change in changes:
                send.event(change.type, change.obj)
            if bookmarks and now >= next_bookmark:
                send.event("BOOKMARK", self._bookmark(res, current))
                next_bookmark = now + self.bookmark_interval
            wake = [next_bookmark if bookmarks else now + 1.0, now + 0.1]
            if deadline is not None:
                wake.append(deadline)
            with self._cond:
                if not watcher.queue and state.expire_generation == watcher.expire_generation:
                    self._cond.wait(max(0.0, min(wake) - time.monotonic()))

    def _watch_objects(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for o in self._state.objects[kind].values()
            if _in_namespace(o, namespace)
        ]

    def _too_old(self, pos: int) -> dict[str, Any]:
        return _status(
            410, "Expired", f"too old resource version: {pos} ({self._state.compacted_rv})"
        )

    @staticmethod
    def _bookmark(res: _Resource, rv: int) -> dict[str, Any]:
        return {
            "kind": res.kind,
            "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(rv)},
        }

    def register(self, conn: socket.socket) -> None:
        """Track a client connection so it can be cut."""
        with self._cond:
            self._connections.add(conn)

    def unregister(self, conn: socket.socket) -> None:
        """Forget a closed client connection."""
        with self._cond:
            self._connections.discard(conn)


def _in_namespace(obj: dict[str, Any], namespace: str | None) -> bool:
    return namespace is None or obj.get("metadata", {}).get("namespace") == namespace


class _Sender:
    """Writes one chunked watch response."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self._handler = handler

    def event(self, type_: str, obj: dict[str, Any]) -> None:
        """Write one JSON line as its own chunk."""
        line = json.dumps({"type": type_, "object": obj}).encode() + b"\n"
        self._handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self._handler.wfile.flush()

    def peer_closed(self) -> bool:
        """Whether the client has closed its end (a watch client never sends anything)."""
        conn = self._handler.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            return bool(readable) and conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def end(self) -> None:
        """Terminate the chunked body."""
        self._handler.wfile.write(b"0\r\n\r\n")
        self._handler.wfile.flush()


def _make_handler(api: FakeApiserver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out as separate writes: without this, Nagle and the
        # client's delayed ACK add 40 ms to every response (a Go apiserver sets it too).
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            api.register(self.connection)

        def finish(self) -> None:
            api.unregister(self.connection)
            try:
                super().finish()
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            """Stay quiet; pytest output is for assertions."""

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            match = _PATH.match(urlsplit(self.path).path)
            res = match and _BY_PATH.get((match["base"], match["plural"]))
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                self._json(401, _status(401, "Unauthorized", "Unauthorized"))
            elif urlsplit(self.path).path == _TOKEN_REVIEWS:
                self._json(201, api.tokens.review(body))
            elif match and res and res.kind != "Pod":
                if res.namespaced and isinstance(body, dict):
                    body.setdefault("metadata", {})["namespace"] = match["ns"] or "default"
                self._json(*api.submit(res.kind, body))
            else:
                self._json(405, _status(405, "MethodNotAllowed", "only tokenreviews"))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            params = {k: v[-1] for k, v in parse_qs(url.query).items()}
            match = _PATH.match(url.path)
            res = match and _BY_PATH.get((match["base"], match["plural"]))
            pod = _POD_PATH.match(url.path)
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                self._json(401, _status(401, "Unauthorized", "Unauthorized"))
            elif pod:
                found = api._pod(pod["ns"], pod["name"])
                self._json(*((200, found) if found else (404, _status(
                    404, "NotFound", f'pods "{pod["name"]}" not found'))))
            elif not match or not res:
                self._json(404, _status(404, "NotFound", f"the server could not find {url.path}"))
            elif params.get("watch") in ("true", "1"):
                self._watch(res, match["ns"], params)
            else:
                self._json(*api.list_page(res, match["ns"], params))

        def _json(self, code: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _watch(self, res: _Resource, namespace: str | None, params: dict[str, str]) -> None:
            rv = params.get("resourceVersion", "")
            if api.gone_as_status and api.too_old(rv):
                self._json(410, _status(410, "Expired", f"too old resource version: {rv}"))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            sender = _Sender(self)
            try:
                api.watch(res, namespace, params, sender)
                sender.end()
            except OSError:
                self.close_connection = True

    return Handler


def write_kubeconfig(path: Path, url: str, token: str = "stand-in-token") -> Path:
    """Write a kubeconfig for ``url`` the way a user's would look; return its path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": token}}],
        "contexts": [
            {"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester"}}
        ],
        "current-context": "stand-in",
    }
    path.write_text(json.dumps(config, indent=2))
    return path
