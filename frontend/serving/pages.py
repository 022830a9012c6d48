"""GetNodeState and ListNodes answers that fit a default client: pages of one listing.

A listing is a node's service ports at one revision, sorted, filtered by namespace and
service name, as serialised ``ServicePortState`` bytes (from the engine's cache of
snapshot ops, so nothing is serialised twice), or the nodes at one revision, by name. A
page takes items from it until ``page_size`` or ``PAGE_BYTES``; its token names the
listing and where the next page starts. The last listings are kept, so every page of
one listing is at one revision.
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from hashlib import blake2b

from svcproxy.convert import node_to_pb
from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import check_filters, check_node_name, invalid
from svcproxy.frontend.edge.objects import Node
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.wire import _varint
from svcproxy.frontend.store.store import node_info
from svcproxy.model import ServicePortKey
from svcproxy.v1 import nodestate_pb2 as pb

# A page's budget: under gRPC's default 4 MiB receive limit, with room to spare.
PAGE_BYTES = 3 << 20
KEPT_LISTINGS = 128
ListingKey = tuple[str, int, str, str]  # node ("" for ListNodes), revision, namespace, service


@dataclass(frozen=True, slots=True)
class Listing:
    revision: int
    node: bytes  # serialised NodeInfo, b"" when the node is unknown (or ListNodes)
    # Serialised replace_service ops (shared with the snapshots), sorted: a listing holds
    # one reference per service port; for ListNodes, serialised NodeInfos.
    items: list[bytes]


def _field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _unwrap(op: bytes) -> memoryview:
    """The message inside a serialised one-field message (an Op's replace_service),
    without a copy."""
    pos = 1
    while op[pos] & 0x80:
        pos += 1
    return memoryview(op)[pos + 1:]


def _order(key: ServicePortKey) -> tuple[str, str, str, str]:
    """Sort order of service ports (a tuple compares ~5x faster than the dataclass)."""
    return key.namespace, key.name, key.port_name, key.protocol.value


def listing_check(node: str, namespace: str, service: str) -> str:
    """What a token says of the request it goes with: its node and filters, hashed."""
    return blake2b(f"{node}/{namespace}/{service}".encode(), digest_size=4).hexdigest()


def encode_token(revision: int, offset: int, check: str) -> str:
    return base64.urlsafe_b64encode(f"{revision}.{offset}.{check}".encode()
                                    ).decode().rstrip("=")


def decode_token(token: str, method: str = "GetNodeState") -> tuple[int, int, str]:
    """(revision, offset, listing check) of a page token; INVALID_ARGUMENT when it is not
    one."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        revision, offset, check = raw.split(".")
        parts = int(revision), int(offset), check
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise invalid(method, _NOT_OURS) from err
    if parts[0] <= 0 or parts[1] <= 0:
        raise invalid(method, _NOT_OURS)
    return parts


_NOT_OURS = ("page_token is not a next_page_token this frontend handed out; start again "
             "without page_token")


# ListNodes' listings: no node has the empty name, so no GetNodeState listing has it.
NODES_CHECK = listing_check("", "", "")


class NodeStatePages:
    """Answers GetNodeState (serialised ``NodeState``) and ListNodes (serialised
    ``ListNodesResponse``) from the engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._listings: OrderedDict[ListingKey, Listing] = OrderedDict()
        # ListNodes: the serial of its last listing and the Node objects it was made from.
        self._node_serial = 0
        self._node_sources: dict[str, Node] = {}

    def answer(self, request: pb.GetNodeStateRequest) -> bytes:
        """One page of the node's state; Refused for an invalid request."""
        method = "GetNodeState"
        check_node_name(method, request.node_name)
        check_filters(method, request.namespace, request.service)
        check = listing_check(request.node_name, request.namespace, request.service)
        token = _token(method, request.page_size, request.page_token, check)
        revision, offset = self._position(method, token)
        key = (request.node_name, revision, request.namespace, request.service)
        listing = self._listing(key, lambda: self._list(*key))
        end = _page_end(method, listing.items, offset, request.page_size)
        parts = [b"\x08", _varint(listing.revision)]
        if listing.node:
            parts.append(_field(2, listing.node))
        for op in listing.items[offset:end]:
            data = _unwrap(op)
            parts += (b"\x1a", _varint(len(data)), data)
        if end < len(listing.items):
            parts.append(_field(4, encode_token(listing.revision, end, check).encode()))
        return b"".join(parts)

    def nodes(self, request: pb.ListNodesRequest) -> bytes:
        """One page of the nodes; Refused for an invalid request."""
        token = _token("ListNodes", request.page_size, request.page_token, NODES_CHECK)
        serial, offset = token or (self._node_listing(), 0)
        listing = self._listings.get(("", serial, "", ""))
        if listing is None:
            if serial > self._node_serial:
                raise invalid("ListNodes", _NOT_OURS)
            raise Refused("ABORTED", "the listing of page_token is no longer held: start "
                          "again without page_token")
        end = _page_end("ListNodes", listing.items, offset, request.page_size)
        parts = [_field(1, node) for node in listing.items[offset:end]]
        parts += (b"\x10", _varint(listing.revision))
        if end < len(listing.items):
            parts.append(_field(3, encode_token(serial, end, NODES_CHECK).encode()))
        return b"".join(parts)

    def _node_listing(self) -> int:
        """The serial of a held listing of the nodes as they are now, made if needed.
        Nodes may change without the revision moving (no view to publish to), so a
        nodes listing is named by a serial of its own (never below the revision, so a
        restarted frontend's serials do not meet an earlier one's) and is reused only
        while the store holds the very Node objects it was made from."""
        nodes = self.engine.store.nodes
        key = ("", self._node_serial, "", "")
        same = (key in self._listings and len(nodes) == len(self._node_sources)
                and all(nodes.get(name) is obj for name, obj in self._node_sources.items()))
        if same:
            self._listings.move_to_end(key)
            return self._node_serial
        revision = self.engine.changelog.revision
        self._node_serial = max(revision, self._node_serial + 1)
        self._node_sources = dict(nodes)
        self._keep(("", self._node_serial, "", ""), Listing(revision, b"", [
            node_to_pb(node_info(nodes[name])).SerializeToString() for name in sorted(nodes)]))
        return self._node_serial

    def _position(self, method: str, token: tuple[int, int] | None) -> tuple[int, int]:
        """Where a page starts: (revision, offset) of its token, or the first page now."""
        current = self.engine.changelog.revision
        if token is None:
            return current, 0
        if token[0] > current:
            raise invalid(method, (
                f"page_token is of revision {token[0]}, which this frontend has not reached "
                f"(it is at {current}): it was not handed out here; start again without "
                "page_token"))
        return token

    def _listing(self, key: ListingKey, make: Callable[[], Listing]) -> Listing:
        listing = self._listings.get(key)
        if listing is not None:
            self._listings.move_to_end(key)
            return listing
        if key[1] != self.engine.changelog.revision:
            raise Refused("ABORTED", (
                f"the listing of page_token (revision {key[1]}) is no longer held: the "
                f"state changed since (now revision {self.engine.changelog.revision}); "
                "start again without page_token"))
        listing = make()
        self._keep(key, listing)
        return listing

    def _keep(self, key: ListingKey, listing: Listing) -> None:
        self._listings[key] = listing
        while len(self._listings) > KEPT_LISTINGS:
            self._listings.popitem(last=False)

    def _list(self, name: str, revision: int, namespace: str, service: str) -> Listing:
        """The listing of node ``name`` now: its view's, or computed without making one
        (a one-off question about a name keeps nothing but the listing)."""
        engine = self.engine
        info, records = engine.changelog.state(name)
        keys = sorted((k for k in records
                       if (not namespace or k.namespace == namespace)
                       and (not service or k.name == service)), key=_order)
        services = [engine.snapshots.service_op(records[k]) for k in keys]
        node = node_to_pb(info).SerializeToString() if info else b""
        return Listing(revision, node, services)


def _token(method: str, page_size: int, token: str, check: str) -> tuple[int, int] | None:
    """(revision, offset) of a request's page_token, None without one; Refused for a
    negative page_size or a token that is not one of this request's listing."""
    if page_size < 0:
        raise invalid(method, "page_size must be 0 (as many as fit) or more")
    if not token:
        return None
    revision, offset, token_check = decode_token(token, method)
    if token_check != check:
        raise invalid(method, (
            "page_token is the next page of another listing: send it to the same method "
            "with the first page's node_name, namespace and service, or start again "
            "without page_token"))
    return revision, offset


def _page_end(method: str, items: list[bytes], offset: int, page_size: int) -> int:
    """Where the page starting at ``offset`` ends: ``page_size`` items, cut at
    PAGE_BYTES (a single larger item goes alone)."""
    if offset > len(items):
        raise invalid(method, "page_token is past the end of its listing; start again "
                      "without page_token")
    limit = page_size or len(items)
    end, size = offset, 0
    while end < len(items) and end - offset < limit:
        size += len(items[end]) + 4
        if size > PAGE_BYTES and end > offset:
            break
        end += 1
    return end
