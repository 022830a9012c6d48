"""Changes as pre-serialised protobuf ops, and watch events built from them.

An op is serialised once, when the change is computed, and shared by every
node and every client that needs it; a ``WatchEvent`` is then assembled by
concatenating op bytes (a repeated message field is exactly that on the wire),
so fanning one change out to a thousand clients costs no re-serialisation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from svcproxy.convert import endpoint_to_pb, key_to_pb, node_to_pb, service_to_pb, state_to_pb
from svcproxy.model import NodeInfo, ServicePortKey, ServicePortState
from svcproxy.v1 import nodestate_pb2 as pb

OpKey = tuple[object, ...]
MAX_MESSAGE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class WireOp:
    """One serialised ``Op``; ``key`` names what it sets, so a later op on it supersedes it."""

    key: OpKey
    data: bytes
    # Replaces or deletes a whole service port, so earlier ops on its endpoints are moot.
    wipes: bool = False


def _op(**kwargs: object) -> bytes:
    return pb.Op(**kwargs).SerializeToString()  # type: ignore[arg-type]


def replace_service(state: ServicePortState) -> WireOp:
    return WireOp(("svc", state.key), _op(replace_service=state_to_pb(state)), wipes=True)


def delete_service(key: ServicePortKey) -> WireOp:
    return WireOp(("svc", key), _op(delete_service=key_to_pb(key)), wipes=True)


def set_node(node: NodeInfo) -> WireOp:
    return WireOp(("node", node.name), _op(set_node=node_to_pb(node)))


def delete_node(name: str) -> WireOp:
    return WireOp(("node", name), _op(delete_node=name))


def diff_records(old: ServicePortState | None,
                 new: ServicePortState | None) -> list[WireOp]:
    """The ops that turn ``old`` into ``new`` (either may be None)."""
    if new is None:
        return [] if old is None else [delete_service(old.key)]
    if old is None:
        return [replace_service(new)]
    key = new.key
    ops = []
    if old.service != new.service:
        ops.append(WireOp(("svc", key), _op(set_service=service_to_pb(new.service))))
    pkey = key_to_pb(key)
    for ip, ep in new.endpoints.items():
        if old.endpoints.get(ip) != ep:
            ops.append(WireOp(("ep", key, ip), _op(set_endpoint=pb.EndpointOp(
                service=pkey, endpoint=endpoint_to_pb(ep)))))
    for ip in old.endpoints.keys() - new.endpoints.keys():
        ops.append(WireOp(("ep", key, ip), _op(delete_endpoint=pb.EndpointRef(
            service=pkey, ip=ip))))
    return ops


def coalesce(batches: Iterable[Iterable[WireOp]]) -> list[WireOp]:
    """Latest state wins: one op per key, ops made moot by a later replace/delete dropped."""
    out: dict[OpKey, WireOp] = {}
    eps_of: dict[object, set[OpKey]] = {}
    for batch in batches:
        for op in batch:
            if op.wipes:
                for k in eps_of.pop(op.key[1], ()):
                    out.pop(k, None)
            elif op.key[0] == "ep":
                eps_of.setdefault(op.key[1], set()).add(op.key)
            out.pop(op.key, None)
            out[op.key] = op
    return list(out.values())


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_event(revision: int, ops: Iterable[bytes], *, reset: bool = False,
                 more: bool = False) -> bytes:
    """A serialised ``WatchEvent`` (fields 1 revision, 2 reset, 3 more, 4 ops)."""
    parts = [b"\x08", _varint(revision)]
    if reset:
        parts.append(b"\x10\x01")
    if more:
        parts.append(b"\x18\x01")
    for data in ops:
        parts += (b"\x22", _varint(len(data)), data)
    return b"".join(parts)


def chunk_events(revision: int, ops: list[bytes], *, reset: bool = False,
                 limit: int = MAX_MESSAGE_BYTES) -> Iterator[bytes]:
    """One batch split into messages under ``limit`` bytes; all but the last say more=True."""
    start, size = 0, 0
    for i, data in enumerate(ops):
        if size and size + len(data) > limit:
            yield encode_event(revision, ops[start:i], reset=reset and start == 0, more=True)
            start, size = i, 0
        size += len(data) + 6
    yield encode_event(revision, ops[start:], reset=reset and start == 0)
