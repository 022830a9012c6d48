"""Changes as pre-serialised protobuf ops, and watch events built from them.

An op is serialised once, when the change is computed, and shared by every
node and every client that needs it; a ``WatchEvent`` is then assembled by
concatenating op bytes (a repeated message field is exactly that on the wire),
so fanning one change out to a thousand clients costs no re-serialisation. A service
port's ops come from the snapshots' ``RecordEncoder`` (one encoder, one set of bytes,
for snapshots and changes); only node ops go through protobuf messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from svcproxy.convert import DIGEST_MASK, node_to_pb
from svcproxy.frontend.publication.encoding import (
    SIZES,
    RecordEncoder,
    _varint,
    delete_endpoint_op,
    delete_service_op,
    key_field,
    set_endpoint_op,
)
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.v1 import nodestate_pb2 as pb

OpKey = tuple[object, ...]
MAX_MESSAGE_BYTES = 1 << 20
# The largest Watch message (bar a single bigger op): a stream whose client does not read
# holds the message it is writing (in gRPC and in Python), so this is what a stalled
# stream costs. 16 KiB is HTTP/2's default frame size, so a message is one frame; smaller
# messages only add gRPC's per-message cost (a 4 MB snapshot: ~260 messages, ~20 ms).
MESSAGE_BYTES = 16 << 10


@dataclass(frozen=True, slots=True)
class WireOp:
    """One serialised ``Op``: ``kind`` is the Op's oneof field, ``key`` what it changes
    (("svc", port key), ("ep", port key, ip) or ("node", name))."""

    key: OpKey
    data: bytes
    kind: str = ""


def _op(**kwargs: object) -> bytes:
    return pb.Op(**kwargs).SerializeToString()  # type: ignore[arg-type]


def replace_service(state: ServicePortState, encoder: RecordEncoder | None = None) -> WireOp:
    return WireOp(("svc", state.key), (encoder or RecordEncoder()).op(state),
                  "replace_service")


def delete_service(key: ServicePortKey) -> WireOp:
    return WireOp(("svc", key), delete_service_op(key_field(key)), "delete_service")


def set_node(node: NodeInfo) -> WireOp:
    return WireOp(("node", node.name), _op(set_node=node_to_pb(node)), "set_node")


def delete_node(name: str) -> WireOp:
    return WireOp(("node", name), _op(delete_node=name), "delete_node")


def diff_records(old: ServicePortState | None,
                 new: ServicePortState | None) -> list[WireOp]:
    """The ops that turn ``old`` into ``new`` (either may be None)."""
    return diff_with_digest(old, new, RecordEncoder())[0]


def diff_with_digest(old: ServicePortState | None, new: ServicePortState | None,
                     encoder: RecordEncoder) -> tuple[list[WireOp], int]:
    """The ops that turn ``old`` into ``new``, and how much they change the state digest;
    every op and term comes from ``encoder`` (the snapshots' encoder, and its caches)."""
    if new is None:
        return ([], 0) if old is None else ([delete_service(old.key)], -encoder.term(old))
    if old is None:
        return [replace_service(new, encoder)], encoder.term(new)
    key = new.key
    ops = []
    delta = 0
    svc_op, svc_term, port_key = encoder.service(new.service)
    if old.service != new.service:
        ops.append(WireOp(("svc", key), svc_op, "set_service"))
        delta += svc_term - encoder.service(old.service)[1]
    endpoint = encoder.endpoint
    for ip, ep in new.endpoints.items():
        was = old.endpoints.get(ip)
        if was != ep:
            part = endpoint(ep, port_key)
            ops.append(WireOp(("ep", key, ip), set_endpoint_op(port_key, part[2]),
                              "set_endpoint"))
            delta += part[3]
            if was is not None:
                delta -= endpoint(was, port_key)[3]
    for ip in old.endpoints.keys() - new.endpoints.keys():
        ops.append(WireOp(("ep", key, ip), delete_endpoint_op(port_key, ip), "delete_endpoint"))
        delta -= endpoint(old.endpoints[ip], port_key)[3]
    return ops, delta


class _Port:
    """What a client must learn about one service port from a run of ops."""

    __slots__ = ("base", "service", "endpoints")

    def __init__(self) -> None:
        # The latest replace_service/delete_service: it sets the whole port.
        self.base: WireOp | None = None
        # The latest set_service after the base.
        self.service: WireOp | None = None
        # The latest op per endpoint after the base.
        self.endpoints: dict[object, WireOp] = {}

    def add(self, op: WireOp) -> None:
        if op.kind in ("replace_service", "delete_service"):
            self.base, self.service, self.endpoints = op, None, {}
        elif op.kind == "set_service":
            self.service = op
        elif self.base is not None and self.base.kind == "delete_service" \
                and self.service is None:
            return  # an endpoint op on a deleted port changes nothing
        else:
            self.endpoints[op.key] = op

    def ops(self) -> list[WireOp]:
        head = [op for op in (self.base, self.service) if op is not None]
        return head + list(self.endpoints.values())


def coalesce(batches: Iterable[Iterable[WireOp]]) -> list[WireOp]:
    """One op list with the effect of applying ``batches`` in order (see the Op
    semantics in nodestate.proto): per service port the latest replace/delete, then the
    latest set_service after it, then the latest op of each endpoint after it; the
    latest op per node. Ops on different keys commute, so ports and nodes keep the
    order they were first seen in."""
    ports: dict[object, _Port] = {}
    nodes: dict[object, WireOp] = {}
    for batch in batches:
        for op in batch:
            if op.key[0] == "node":
                nodes[op.key] = op
            else:
                port = ports.get(op.key[1])
                if port is None:
                    port = ports[op.key[1]] = _Port()
                port.add(op)
    out = list(nodes.values())
    for port in ports.values():
        out += port.ops()
    return out


class _OpHeads(dict[int, bytes]):
    """The tag and size before an op of each size in a ``WatchEvent`` (field 4)."""

    def __missing__(self, size: int) -> bytes:
        head = b"\x22" + SIZES[size]
        if size < 1 << 16:
            self[size] = head
        return head


_OP_HEADS = _OpHeads()


def encode_event(revision: int, ops: Iterable[bytes], *, reset: bool = False,
                 more: bool = False, digest: int | None = None) -> bytes:
    """A serialised ``WatchEvent`` (fields 1 revision, 2 reset, 3 more, 4 ops, 5 digest)."""
    parts = [b"\x08", _varint(revision)]
    if reset:
        parts.append(b"\x10\x01")
    if more:
        parts.append(b"\x18\x01")
    if digest is not None:
        parts += (b"\x29", (digest & DIGEST_MASK).to_bytes(8, "little"))
    heads = _OP_HEADS
    for data in ops:
        parts += (heads[len(data)], data)
    return b"".join(parts)


def chunk_events(revision: int, ops: list[bytes], *, reset: bool = False,
                 limit: int = MAX_MESSAGE_BYTES, digest: int | None = None) -> Iterator[bytes]:
    """One batch split into messages under ``limit`` bytes; all but the last say more=True,
    the last carries ``digest`` (the state digest once the batch is applied)."""
    start, size = 0, 0
    for i, data in enumerate(ops):
        if size and size + len(data) > limit:
            yield encode_event(revision, ops[start:i], reset=reset and start == 0, more=True)
            start, size = i, 0
        size += len(data) + 6
    yield encode_event(revision, ops[start:], reset=reset and start == 0, digest=digest)
