"""The node-side client: a typed local copy of one node's state, kept current.

``NodeStateClient`` watches the frontend in a background thread, applies each
batch once it is complete (a consistent point), remembers what changed, and
reconnects by itself, resuming from its last revision (the frontend answers a
resume it can no longer serve with a reset and a full snapshot). It acts on the
statuses the proto documents: INVALID_ARGUMENT for a resume (a revision ahead of the
frontend's, sent without an epoch) makes it watch again from 0, the snapshot replacing
its state as a reset does; INVALID_ARGUMENT for a watch from 0 (an invalid node name)
stops it with ``error`` set, as retrying cannot help; any other status is retried::

    client = NodeStateClient("127.0.0.1:12090", "node-1")
    client.start()
    for state, changes in client.updates():
        print(state.revision, sorted(map(str, changes.services)))
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import grpc

from svcproxy.convert import (
    DIGEST_MASK,
    digest_term,
    endpoint_from_pb,
    endpoint_term,
    endpoint_to_pb,
    key_from_pb,
    node_from_pb,
    node_term,
    op_subject,
    record_terms,
    service_from_pb,
    service_term,
    state_from_pb,
)
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.credentials import ClientTLS, TokenFile
from svcproxy.sdk.reconcile import BeforeReset, changed_services, trigger_times
from svcproxy.sdk.targets import Targets
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


def tls_credentials(ca: Path | None, cert: Path | None = None,
                    key: Path | None = None) -> grpc.ChannelCredentials | None:
    """Client TLS from PEM files (a CA to trust; a certificate and key for mutual TLS),
    or None for plaintext when neither a CA nor a certificate is given."""
    if not (ca or cert):
        return None
    if bool(cert) != bool(key):
        raise ValueError("a client certificate and its key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes() if ca else None,
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None)


# How a node's channel to the frontend is set up (any gRPC client of the API should do
# the same; see the README's API section).
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30000),
    # Keep pinging while the watch is quiet (gRPC's default stops after two pings
    # without data, and a frontend gone without a reset would then never be noticed);
    # the frontend accepts these pings (frontend/serving/server.py).
    ("grpc.http2.max_pings_without_data", 0),
    # A connection of its own, even when a process watches several nodes.
    ("grpc.use_local_subchannel_pool", 1),
    # No bandwidth-probing PING on received data: with it every small batch costs the
    # frontend a read, a PING ack and two thread wake-ups per client, which doubled its
    # CPU per change and put the fan-out to 1,000 nodes past 100 ms. A fixed 16 MB
    # window instead lets a snapshot arrive in about one round trip.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 16 << 20),
]


def open_channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A channel to the frontend: HOST:PORT or unix:///path, TLS when credentials are given."""
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)


EPOCH_KEY = "svcproxy-epoch"


def server_epoch(call: grpc.Call) -> str | None:
    """The epoch a frontend announced in a stream's initial metadata."""
    for key, value in call.initial_metadata() or ():
        if key == EPOCH_KEY:
            return str(value)
    return None


class Taken(NamedTuple):
    """The state a take handed out: its revision, the epoch of the frontend that handed
    it out (None: not announced) and its digest (WatchEvent.digest's)."""

    revision: int
    epoch: str | None
    digest: int


class WatchRefused(Exception):
    """The frontend refused the watch request itself (INVALID_ARGUMENT from revision 0,
    e.g. a node name no Kubernetes Node can have): fix the request, retrying cannot help."""

    def __init__(self, target: str, node_name: str, details: str) -> None:
        self.target = target
        self.node_name = node_name
        self.details = details
        super().__init__(f"the frontend at {target} refused to watch "
                         f"{f'node {node_name!r}' if node_name else 'the cluster'} "
                         f"(INVALID_ARGUMENT): {details}")


class NodeStateClient:
    """Keeps a node's state in sync with the frontend; see the module docstring."""

    def __init__(self, target: str | Sequence[str], node_name: str, *,
                 credentials: grpc.ChannelCredentials | ClientTLS | None = None,
                 cluster: bool = False, max_backoff: float = 5.0,
                 token: TokenFile | None = None) -> None:
        # Several addresses (a list or "a,b"): another replica when a stream breaks.
        self.targets = Targets(target)
        self.node_name = node_name
        # Fixed credentials, or ClientTLS re-read on reconnect when the files change.
        self.credentials = credentials
        self.token = token
        # The epoch of the replica our revision came from (see frontend/admission/epoch.py).
        self.epoch: str | None = None
        self.cluster = cluster
        self.max_backoff = max_backoff
        self.revision = 0
        self.connected = False
        self.resets = 0
        self._services: dict[ServicePortKey, ServicePortState] = {}
        self._node: NodeInfo | None = None
        self._nodes: dict[str, NodeInfo] = {}
        self._synced = False
        self._dirty: set[ServicePortKey] = set()
        self._endpoint_changes = 0
        self._node_changed = False
        self._full = True
        self._triggers: set[float] = set()
        # The state digest (see WatchEvent.digest) and the terms it sums.
        self._digest = 0
        self._service_terms: dict[ServicePortKey, int] = {}
        self._record_terms: dict[ServicePortKey, int] = {}
        self._node_terms: dict[str, int] = {}
        # Set when our state turned out different from the frontend's, or our revision
        # means nothing to it: the next stream asks for a snapshot and replaces
        # everything with it (counted in resets).
        self._out_of_sync = False
        # Batches after which our state differed from the frontend's (each healed by a
        # snapshot); on_mismatch is called with the node name each time.
        self.mismatches = 0
        # Ops this client could not apply (the watch failed on each, naming it);
        # on_undecodable is called with the node name each time.
        self.undecodable = 0
        self.on_undecodable: Callable[[str], None] | None = None
        self.on_mismatch: Callable[[str], None] | None = None
        # Set when the frontend refused the request itself: the client has stopped for
        # good (``stopped``); on_error is called with it (from the watch thread).
        self.error: WatchRefused | None = None
        self.on_error: Callable[[WatchRefused], None] | None = None
        # What the last take handed out: the revision, its epoch and the state's digest.
        self.taken: Taken | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="svcproxy-watch", daemon=True)

    # ---- public API ----------------------------------------------------
    def start(self) -> None:
        """Start watching in a background thread (once; ``started`` tells)."""
        self._thread.start()

    @property
    def started(self) -> bool:
        """Whether ``start`` was called (a client that was never started never syncs)."""
        return self._thread.ident is not None

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` was called or the frontend refused the request (``error``)."""
        return self._stop.is_set() or self.error is not None

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def has_changes(self) -> bool:
        return self._synced and (self._full or bool(self._dirty) or self._node_changed)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until changes are pending (True), or ``timeout`` passes or the client
        stops (False). A wait begun after ``error`` stopped it lasts its ``timeout``
        (a loop that does not check ``stopped`` idles instead of spinning)."""
        with self._cond:
            error = self.error
            return self._cond.wait_for(
                lambda: self.has_changes() or self._stop.is_set() or self.error is not error,
                timeout) and not self.stopped

    def take(self) -> tuple[NodeState, Changes] | None:
        """A consistent copy of the state and what changed since the previous take.

        None until the first snapshot has arrived.
        """
        with self._cond:
            if not self._synced:
                return None
            state = NodeState(self.node_name, self.revision, self._node,
                              MappingProxyType(dict(self._services)))
            full = self._full
            changes = Changes(
                services=frozenset(self._services) if full else frozenset(self._dirty),
                node_changed=self._node_changed or full, full=full,
                reason="initial" if full else "changes",
                trigger_times=tuple(sorted(self._triggers)))
            self._dirty = set()
            self._endpoint_changes = 0
            self._node_changed = self._full = False
            self._triggers = set()
            self.taken = Taken(self.revision, self.epoch, self._digest)
            return state, changes

    def pending(self) -> tuple[int, int]:
        """(service ports, endpoint changes) waiting for the next take."""
        with self._cond:
            return len(self._dirty), self._endpoint_changes

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node seen (cluster watches carry them all)."""
        with self._cond:
            return dict(self._nodes)

    def updates(self, timeout: float | None = None) -> Iterator[tuple[NodeState, Changes]]:
        """Yield (state, changes) at each consistent point until stopped."""
        while not self.stopped:
            if self.wait(timeout):
                taken = self.take()
                if taken is not None:
                    yield taken

    @property
    def target(self) -> str:
        """The frontend address in use (or tried next)."""
        return self.targets.current

    # ---- the watch loop -------------------------------------------------
    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            failed = self.target
            try:
                self._watch_once()
                backoff = 0.1
            except (grpc.RpcError, OSError, ValueError) as err:
                if self._stop.is_set():
                    break
                code = err.code() if isinstance(err, grpc.RpcError) else err
                if isinstance(err, grpc.RpcError) and code == grpc.StatusCode.INVALID_ARGUMENT:
                    if self._refused(err):
                        continue  # at once, from revision 0
                    break
                log.warning("watch of %s at %s failed (%s)%s; resuming from revision %d",
                            self.node_name or "<cluster>", failed, code,
                            _said(err) + _unreachable(err, failed, self.connected),
                            self.revision)
            finally:
                if self.connected:
                    self.targets.succeeded()
                    backoff = 0.1
                self.connected = False
            if not self.targets.failed():
                continue  # another replica at once
            self._stop.wait(backoff)
            backoff = min(self.max_backoff, backoff * 2)

    def _refused(self, err: grpc.RpcError) -> bool:
        """INVALID_ARGUMENT: for a resume (a revision this frontend did not hand out, sent
        without an epoch), drop the revision and watch from 0, the snapshot replacing
        the state as a reset's does (True); for a watch from 0 the request itself is
        invalid: set ``error`` and stop (False)."""
        details = err.details() or ""
        if self.revision:
            log.warning("the frontend at %s refused to resume %s from revision %d (%s); "
                        "watching from revision 0 for a full snapshot", self.target,
                        self.node_name or "<cluster>", self.revision, details)
            with self._cond:
                self.revision = 0
                self._out_of_sync = True
            return True
        error = WatchRefused(self.target, self.node_name, details)
        log.error("%s; not retrying", error)
        with self._cond:
            self.error = error
            self._cond.notify_all()
        if self.on_error is not None:
            self.on_error(error)
        return False

    def channel(self) -> grpc.Channel:
        """A new channel to the frontend in use, with this client's credentials (the
        caller closes it); calls on it send ``call_metadata()``."""
        return self._channel()

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata of a call made for this client (its token, if any)."""
        return self.token.metadata() if self.token is not None else ()

    def _channel(self) -> grpc.Channel:
        credentials = self.credentials
        if isinstance(credentials, ClientTLS):
            credentials = credentials.credentials()
        return open_channel(self.target, credentials)

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        out = self.token.metadata() if self.token is not None else ()
        if self.epoch is not None and self.revision:
            out += ((EPOCH_KEY, self.epoch),)
        return out

    def _watch_once(self) -> None:
        with self._channel() as channel:
            stub = pb_grpc.NodeStateServiceStub(channel)
            metadata = self._metadata()
            if self.cluster:
                call = stub.WatchCluster(pb.ClusterWatchRequest(since_revision=self.revision),
                                         metadata=metadata)
            else:
                call = stub.Watch(pb.WatchRequest(node_name=self.node_name,
                                                  since_revision=self.revision),
                                  metadata=metadata)
            self._call = call
            pending: list[pb.WatchEvent] = []
            epoch = None
            for event in call:
                if not self.connected:
                    self.connected = True
                    epoch = server_epoch(call)
                    log.info("watching %s at %s", self.node_name or "<cluster>", self.target)
                pending.append(event)
                if not event.more:
                    # Our revision is now this replica's: resume (and report) with its epoch.
                    self.epoch = epoch
                    self._apply(pending)
                    pending = []
                    if self._out_of_sync:
                        call.cancel()
                        return

    def _apply(self, events: list[pb.WatchEvent]) -> None:
        """Apply one complete batch under the lock: the state is consistent after it."""
        with self._cond:
            before = None
            if events[0].reset or not self._synced or self._out_of_sync:
                if events[0].reset or self._out_of_sync:
                    self.resets += 1
                    log.info("rebuilding the state of %s from a snapshot",
                             self.node_name or "<cluster>")
                    before = self._before_reset()
                self._services.clear()
                self._nodes.clear()
                self._node = None
                self._full = True
                self._clear_digest()
                self._out_of_sync = False
            for event in events:
                for op in event.ops:
                    try:
                        self._apply_op(op)
                    except (ValueError, TypeError, KeyError) as err:
                        # Never from a value the wire carries (the decoders are total,
                        # see wirevalues.py): named, counted, and the stream resumed.
                        self.undecodable += 1
                        if self.on_undecodable is not None:
                            self.on_undecodable(self.node_name)
                        raise ValueError(f"could not apply {op_subject(op)}: {err}") from err
            if before is not None and not before.full:
                self._reconcile(before)
            self.revision = events[-1].revision
            if not self._synced:
                log.info("applied the first state of %s: %d service ports at revision %d",
                         self.node_name or "<cluster>", len(self._services), self.revision)
            self._synced = True
            self._check_digest(events[-1])
            self._cond.notify_all()

    def _clear_digest(self) -> None:
        self._digest = 0
        self._service_terms.clear()
        self._record_terms.clear()
        self._node_terms.clear()

    def _check_digest(self, last: pb.WatchEvent) -> None:
        """Compare our state's digest with the frontend's; on a difference, count it and
        ask for a snapshot (the next stream starts from revision 0)."""
        if not self._out_of_sync and (not last.HasField("digest")
                                      or last.digest == self._digest):
            return
        self.mismatches += 1
        log.error("the state of %s at revision %d differs from the frontend's (digest "
                  "%016x, ours %016x); asking for a full snapshot", self.node_name
                  or "<cluster>", last.revision, last.digest, self._digest)
        self._out_of_sync = True
        self.revision = 0
        if self.on_mismatch is not None:
            self.on_mismatch(self.node_name)

    def _add_digest(self, delta: int) -> None:
        self._digest = (self._digest + delta) & DIGEST_MASK

    def _set_record_term(self, key: ServicePortKey, term: int) -> None:
        self._add_digest(term - self._record_terms.get(key, 0))
        self._record_terms[key] = term

    def _before_reset(self) -> BeforeReset | None:
        if not self._synced:
            return None
        return BeforeReset(dict(self._services), self._node, dict(self._nodes), self._full,
                           frozenset(self._dirty), self._node_changed,
                           frozenset(self._triggers))

    def _reconcile(self, before: BeforeReset) -> None:
        """After a reset's snapshot: hand out only what differs from before it."""
        changed = changed_services(before.services, self._services)
        self._full = False
        self._dirty = set(before.dirty | changed)
        self._triggers = set(before.triggers) | trigger_times(self._services, changed)
        self._node_changed = before.node_changed or before.node != self._node or (
            self.cluster and before.nodes != self._nodes)
        log.info("reset reconciled: %d service ports differ from the previous state",
                 len(changed))

    def _touch(self, key: ServicePortKey, record: ServicePortState | None) -> None:
        self._dirty.add(key)
        if record is not None and record.service.trigger_time:
            self._triggers.add(record.service.trigger_time)

    def _apply_op(self, op: pb.Op) -> None:
        which = op.WhichOneof("op")
        if which == "replace_service":
            rec = state_from_pb(op.replace_service)
            key = rec.service.key
            self._services[key] = rec
            self._endpoint_changes += len(rec.endpoints)
            self._touch(key, rec)
            self._service_terms[key], term = record_terms(op.replace_service)
            self._set_record_term(key, term)
        elif which == "set_service":
            svc = service_from_pb(op.set_service)
            old = self._services.get(svc.key)
            rec = ServicePortState(svc, old.endpoints if old else {})
            self._services[svc.key] = rec
            self._touch(svc.key, rec)
            term = service_term(op.set_service)
            self._set_record_term(svc.key, self._record_terms.get(svc.key, 0) + term
                                  - self._service_terms.get(svc.key, 0))
            self._service_terms[svc.key] = term
        elif which == "delete_service":
            key = key_from_pb(op.delete_service)
            self._services.pop(key, None)
            self._touch(key, None)
            self._add_digest(-self._record_terms.pop(key, 0))
            self._service_terms.pop(key, None)
        elif which in ("set_endpoint", "delete_endpoint"):
            self._apply_endpoint_op(op, which)
        elif which == "set_node":
            node = node_from_pb(op.set_node)
            self._nodes[node.name] = node
            term = node_term(op.set_node)
            self._add_digest(term - self._node_terms.get(node.name, 0))
            self._node_terms[node.name] = term
            if node.name == self.node_name:
                self._node = node
            # A cluster watch reports a change of any node.
            self._node_changed |= self.cluster or node.name == self.node_name
        elif which == "delete_node":
            self._nodes.pop(op.delete_node, None)
            self._add_digest(-self._node_terms.pop(op.delete_node, 0))
            if op.delete_node == self.node_name:
                self._node = None
            self._node_changed |= self.cluster or op.delete_node == self.node_name

    def _apply_endpoint_op(self, op: pb.Op, which: str) -> None:
        msg = op.set_endpoint if which == "set_endpoint" else op.delete_endpoint
        key = key_from_pb(msg.service)
        old = self._services.get(key)
        if old is None:
            log.error("endpoint op for unknown service port %s: out of sync", key)
            self._out_of_sync = True
            return
        endpoints = dict(old.endpoints)
        if which == "set_endpoint":
            ep = endpoint_from_pb(op.set_endpoint.endpoint)
            was = endpoints.get(ep.ip)
            endpoints[ep.ip] = ep
            delta = digest_term(b"e", op.set_endpoint)
        else:
            was = endpoints.pop(op.delete_endpoint.ip, None)
            delta = 0
        if was is not None:
            delta -= endpoint_term(msg.service, endpoint_to_pb(was))
        self._set_record_term(key, self._record_terms.get(key, 0) + delta)
        rec = ServicePortState(old.service, endpoints)
        self._services[key] = rec
        self._endpoint_changes += 1
        self._touch(key, rec)


_CALLER_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def _unreachable(err: Exception, target: str, connected: bool) -> str:
    """What to check when a watch failed before anything came back (UNAVAILABLE: no
    frontend answered at ``target``)."""
    if connected or not isinstance(err, grpc.RpcError) \
            or err.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    return (f" - is the frontend running at {target}? Check that it is started and "
            "listening there (svcproxy frontend --listen), and this client's address "
            "(--api or $SVCPROXY_API)")


def _said(err: Exception) -> str:
    """What the frontend said with a failed call (its status message names the caller and
    what it may read when it refuses one), and what to do about a refusal."""
    if not isinstance(err, grpc.RpcError) or not isinstance(err, grpc.Call):
        return ""
    details = err.details() or ""
    said = f": {details}" if details else ""
    if err.code() in _CALLER_REFUSED:
        said += (" - the frontend refused this caller: give it the credentials (client "
                 "certificate or token) of this node's identity, or have the frontend "
                 "authorize it; retrying with backoff")
    return said
