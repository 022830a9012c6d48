"""Records serialised for the wire and for the state digest, each part once.

A record's ``replace_service`` op (serialised deterministically: maps in key order) is
its service port's bytes and its endpoints' bytes put together (a repeated field is its
elements' bytes one after another), and its digest term is the sum of those parts'
terms. A service port is serialised once per value and an endpoint once per object: the
node classes of a service share their endpoint objects but the one or two that are
local, so a node's own records cost little more than those parts.

Endpoints and service ports are written here field by field (``endpoint_field``,
``service_field``), not through protobuf messages: a node's first snapshot holds every
service port and endpoint of the cluster, and building then serialising a message each
was most of its cost (tested equal to the deterministic serialisation of
``convert.endpoint_to_pb`` and ``convert.service_to_pb``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from hashlib import blake2b

from svcproxy.convert import _AFFINITY, _POLICY, _PROTO, _TYPE, DIGEST_MASK, term_of
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServicePortState
from svcproxy.wirevalues import REPLACE, timestamp_parts

# New cache entries allowed between two sweeps, at least (see ``RecordEncoder.sweep``):
# a small world is not swept on every change.
SWEEP_FLOOR = 4096
# What the by-value caches of strings and ports hold at most before they start again
# (their values are a cluster's node names, zones and ports: few).
MAX_VALUES = 10_000
# Op's fields: set_service 1, delete_service 2, set_endpoint 3, delete_endpoint 4,
# replace_service 7.
_SET_SERVICE, _DELETE_SERVICE, _SET_ENDPOINT, _DELETE_ENDPOINT, _REPLACE_SERVICE = (
    b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x3a")
_UINT64 = (1 << 64) - 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Sizes(dict[int, bytes]):
    """Varints of the sizes fields have and of small integer fields (ports, timeouts),
    made once each (values past 64 Ki each time)."""

    def __missing__(self, size: int) -> bytes:
        out = _varint(size)
        if size < 1 << 16:
            self[size] = out
        return out


SIZES = _Sizes()


def _bools(*tags: int) -> list[bytes]:
    """The bytes of every combination of four bool fields (index: bit i = field i true)."""
    return [b"".join(bytes((tags[bit] << 3, 1)) for bit in range(4) if i >> bit & 1)
            for i in range(16)]


# Endpoint fields 3-6 (ready, serving, terminating, is_local) and 11-14 (internal,
# external, cluster, local).
_CONDITIONS = _bools(3, 4, 5, 6)
_SELECTION = _bools(11, 12, 13, 14)


class _Strings(dict[str, bytes]):
    """One string field's serialisation by value (node names, zones: few values)."""

    def __init__(self, number: int) -> None:
        super().__init__()
        self.tag = bytes((number << 3 | 2,))

    def __missing__(self, value: str) -> bytes:
        data = value.encode("utf-8", REPLACE)
        if len(self) > MAX_VALUES:
            self.clear()
        self[value] = out = self.tag + SIZES[len(data)] + data
        return out


_NODE_NAMES, _ZONES = _Strings(7), _Strings(8)
_HINT_ZONES, _HINT_NODES = _Strings(9), _Strings(10)


class _Ports(dict[int, bytes]):
    """An endpoint's port field by value."""

    def __missing__(self, port: int) -> bytes:
        if len(self) > MAX_VALUES:
            self.clear()
        self[port] = out = b"\x10" + _varint(port & _UINT64) if port else b""
        return out


_PORTS = _Ports()


def _string(tag: bytes, value: str) -> bytes:
    """A string field, valid UTF-8 whatever ``value`` holds (wirevalues.utf8)."""
    data = value.encode("utf-8", REPLACE)
    return tag + SIZES[len(data)] + data


def _strings(tag: bytes, values: tuple[str, ...]) -> bytes:
    """A repeated string field (every element written, empty ones too)."""
    if len(values) == 1:  # most ClusterIPs: no list to join
        return _string(tag, values[0])
    return b"".join([_string(tag, v) for v in values]) if values else b""


def _int(tag: bytes, value: int) -> bytes:
    """An int32/int64/enum field (a negative one as ten bytes, as protobuf does)."""
    return tag + SIZES[value & _UINT64] if value else b""


def _message(tag: bytes, body: bytes) -> bytes:
    return tag + SIZES[len(body)] + body


def key_field(key: ServicePortKey) -> bytes:
    """``key`` as field 1 of a ``ServicePort`` (and of an ``EndpointOp``, what an endpoint's
    digest term hashes first)."""
    return _message(b"\x0a", b"".join((
        _string(b"\x0a", key.namespace) if key.namespace else b"",
        _string(b"\x12", key.name) if key.name else b"",
        _string(b"\x1a", key.port_name) if key.port_name else b"",
        _int(b"\x20", _PROTO[key.protocol]))))


def _map_order(item: tuple[str, str]) -> bytes:
    """upb's deterministic order of map keys: by bytes, a key before its own prefixes
    (0xff never occurs in UTF-8)."""
    return item[0].encode("utf-8", REPLACE) + b"\xff"


def service_message(svc: ServicePort, key: bytes) -> bytes:
    """The deterministic serialisation of ``convert.service_to_pb(svc)`` (maps in key
    order), its ``key_field`` given."""
    body = [key, _int(b"\x10", _TYPE[svc.type]), _strings(b"\x1a", svc.cluster_ips),
            _int(b"\x20", svc.port), _int(b"\x28", svc.node_port),
            _strings(b"\x32", svc.external_ips)]
    for ingress in svc.load_balancer_ingress:
        body.append(_message(b"\x3a", (_string(b"\x0a", ingress.ip) if ingress.ip else b"")
                             + (_string(b"\x12", ingress.ip_mode) if ingress.ip_mode
                                else b"")))
    body += (_strings(b"\x42", svc.load_balancer_source_ranges),
             _int(b"\x48", _AFFINITY[svc.session_affinity]),
             _int(b"\x50", svc.session_affinity_timeout),
             _int(b"\x58", _POLICY[svc.internal_traffic_policy]),
             _int(b"\x60", _POLICY[svc.external_traffic_policy]),
             _int(b"\x68", svc.health_check_node_port),
             _string(b"\x72", svc.traffic_distribution) if svc.traffic_distribution else b"",
             b"\x78\x01" if svc.has_endpoints else b"")
    for name, value in sorted(dict(svc.options).items(), key=_map_order):
        body.append(_message(b"\x82\x01", _string(b"\x0a", name) + _string(b"\x12", value)))
    trigger = timestamp_parts(svc.trigger_time)  # None: none, or past a Timestamp
    if trigger is not None:
        seconds, nanos = trigger
        body.append(_message(b"\x8a\x01", _int(b"\x08", seconds) + _int(b"\x10", nanos)))
    if svc.has_local_endpoints:
        body.append(b"\x90\x01\x01")
    return b"".join(body)


def endpoint_field(ep: Endpoint) -> bytes:
    """``ep`` as field 2 of a ``ServicePortState`` (an ``EndpointOp``'s too): the tag, the
    size and the deterministic serialisation of ``convert.endpoint_to_pb(ep)``."""
    ip = ep.ip.encode("utf-8", REPLACE)
    body = b"".join((
        b"\x0a" + SIZES[len(ip)] + ip if ip else b"", _PORTS[ep.port],
        _CONDITIONS[ep.ready + 2 * ep.serving + 4 * ep.terminating + 8 * ep.is_local],
        _NODE_NAMES[ep.node_name] if ep.node_name else b"",
        _ZONES[ep.zone] if ep.zone else b"",
        b"".join([_HINT_ZONES[z] for z in ep.hint_zones]) if ep.hint_zones else b"",
        b"".join([_HINT_NODES[n] for n in ep.hint_nodes]) if ep.hint_nodes else b"",
        _SELECTION[ep.internal + 2 * ep.external + 4 * ep.cluster + 8 * ep.local]))
    return b"\x12" + SIZES[len(body)] + body


def set_endpoint_op(port_key: bytes, endpoint: bytes) -> bytes:
    """A serialised ``set_endpoint`` op from the port's ``key_field`` and ``endpoint_field``."""
    return _message(_SET_ENDPOINT, port_key + endpoint)


def delete_endpoint_op(port_key: bytes, ip: str) -> bytes:
    """A serialised ``delete_endpoint`` op of ``ip`` in the port of ``key_field`` ``port_key``."""
    return _message(_DELETE_ENDPOINT, port_key + (_string(b"\x12", ip) if ip else b""))


def delete_service_op(port_key: bytes) -> bytes:
    """A serialised ``delete_service`` op: the key's message under field 2, not 1."""
    return _DELETE_SERVICE + port_key[1:]


# The records a sweep keeps: every collection of records something live holds now.
LiveRecords = Callable[[], Iterable[Iterable[ServicePortState]]]


def _nothing_live() -> Iterable[Iterable[ServicePortState]]:
    return ()


class RecordEncoder:
    """Records' serialised ``replace_service`` ops and digest terms, and the parts they are
    made of (a service port's ``set_service`` op, an endpoint's field), each cached.

    The caches are bounded by what is live, by sweeps: once as many entries were added
    since the last sweep as it kept (``SWEEP_FLOOR`` at least), ``sweep`` keeps only the
    entries of the records ``live`` names (the views' records) and of their service
    ports and endpoints, so a superseded version goes at the next sweep and the caches
    hold at most twice the live set of the last sweep plus ``SWEEP_FLOOR``. A sweep costs
    one pass over the live records, once per as many new entries: O(1) per change
    amortised. Not weak references: the model's frozen slotted classes have no weakref
    slot and a callback per dead object costs more than a pass; not an LRU: what is live
    is known exactly, so nothing live is evicted and nothing dead is kept for its
    recency. Without ``live`` a sweep keeps nothing (the caches start again)."""

    def __init__(self, live: LiveRecords = _nothing_live, floor: int = SWEEP_FLOOR) -> None:
        self.live = live
        self.floor = floor
        self.sweeps = 0
        self._allowance = floor
        self._added = 0
        self._records: dict[int, tuple[ServicePortState, bytes, int]] = {}
        # By the hash of the value (hashing a service port's 18 fields is what costs: a
        # miss then hashes it once, not twice), the value and its serialised set_service
        # op (field 1 of a ServicePortState too), its term, and the port's key_field.
        self._services: dict[int, tuple[ServicePort, tuple[bytes, int, bytes]]] = {}
        # The same by object (hashing a service port's 18 fields is what costs).
        self._service_ids: dict[int, tuple[ServicePort, tuple[bytes, int, bytes]]] = {}
        # By object: the port's key field, field 2 of a ServicePortState, and the term
        # in that port.
        self._endpoints: dict[int, tuple[Endpoint, bytes, bytes, int]] = {}

    def op(self, rec: ServicePortState) -> bytes:
        """The serialised ``Op`` replacing the record's service port with ``rec``."""
        hit = self._records.get(id(rec))
        return (hit if hit is not None and hit[0] is rec else self._encoded(rec))[1]

    def ops(self, records: Iterable[ServicePortState]) -> list[bytes]:
        """``op`` of each record (a snapshot's: most are cached)."""
        cache = self._records
        out = []
        for rec in records:
            hit = cache.get(id(rec))
            out.append(hit[1] if hit is not None and hit[0] is rec else self._encoded(rec)[1])
        return out

    def term(self, rec: ServicePortState) -> int:
        """The record's digest term (``convert.record_term`` of its message)."""
        hit = self._records.get(id(rec))
        return (hit if hit is not None and hit[0] is rec else self._encoded(rec))[2]

    def service(self, svc: ServicePort) -> tuple[bytes, int, bytes]:
        """The serialised ``set_service`` op of ``svc``, its digest term (``convert.
        service_term``) and its port's ``key_field``."""
        known = self._service_ids.get(id(svc))
        if known is not None and known[0] is svc:
            return known[1]
        if self._added > self._allowance:
            self.sweep()
        self._added += 1
        value = hash(svc)
        same = self._services.get(value)
        if same is not None and (same[0] is svc or same[0] == svc):
            hit = same[1]
        else:
            key = key_field(svc.key)
            data = service_message(svc, key)
            hit = (_message(_SET_SERVICE, data), term_of(b"s", data), key)
            self._services[value] = (svc, hit)
        self._service_ids[id(svc)] = (svc, hit)
        return hit

    def endpoint(self, ep: Endpoint, port_key: bytes) -> tuple[Endpoint, bytes, bytes, int]:
        """``ep``, ``port_key``, ``endpoint_field(ep)`` and its digest term in that port
        (``convert.endpoint_term``)."""
        known = self._endpoints.get(id(ep))
        if known is None or known[0] is not ep or (known[1] is not port_key
                                                   and known[1] != port_key):
            if self._added > self._allowance:
                self.sweep()
            self._added += 1
            data = endpoint_field(ep)
            known = self._endpoints[id(ep)] = (ep, port_key, data, int.from_bytes(
                blake2b(b"e" + port_key + data, digest_size=8).digest(), "little"))
        return known

    def sizes(self) -> dict[str, int]:
        """How many entries each cache holds."""
        return {"records": len(self._records), "services": len(self._services),
                "service_objects": len(self._service_ids), "endpoints": len(self._endpoints)}

    def sweep(self) -> None:
        """Keep only the entries of live records, their service ports and endpoints; the
        next sweep comes after as many new entries as this one kept (``floor`` at least)."""
        live: dict[int, ServicePortState] = {}
        for records in self.live():
            live.update(zip(map(id, records), records, strict=True))
        self._records = {k: v for k, v in self._records.items() if k in live}
        services = {id(rec.service) for rec in live.values()}
        self._service_ids = {k: v for k, v in self._service_ids.items() if k in services}
        hits = {id(v[1]) for v in self._service_ids.values()}
        self._services = {k: v for k, v in self._services.items() if id(v[1]) in hits}
        endpoints: set[int] = set()
        for rec in live.values():
            endpoints.update(map(id, rec.endpoints.values()))
        self._endpoints = {k: v for k, v in self._endpoints.items() if k in endpoints}
        kept = sum(self.sizes().values())
        self._allowance = max(self.floor, kept)
        self._added = 0
        self.sweeps += 1

    def _encoded(self, rec: ServicePortState) -> tuple[ServicePortState, bytes, int]:
        """Encode ``rec`` (not in the cache) and cache it."""
        if self._added > self._allowance:
            self.sweep()
        self._added += 1
        service, total, port_key = self.service(rec.service)
        parts = [service]
        endpoint = self.endpoint
        eps = rec.endpoints
        for ip in sorted(eps):
            known = endpoint(eps[ip], port_key)
            parts.append(known[2])
            total += known[3]
        hit = self._records[id(rec)] = (rec, _message(_REPLACE_SERVICE, b"".join(parts)),
                                        total & DIGEST_MASK)
        return hit
