"""Listed EndpointSlices of the common shape, decoded from their JSON straight into the
store's objects (msgspec's typed decoding, in C) instead of dicts then validation.py and
parse. Only what those would accept as it is: anything else, or any doubt (a field not
listed here, hints, an IPv6 or FQDN slice, limits below the defaults), is
None, and the caller takes the general path, which says why and gives the same object.
"""

from __future__ import annotations

import time

import msgspec

from svcproxy.frontend.edge.addresses import ALLOWED_IPV4
from svcproxy.frontend.edge.checker import PROTOCOLS
from svcproxy.frontend.edge.endpointslice import (
    MAX_ENDPOINT_ADDRESSES,
    MAX_SLICE_ENDPOINTS,
    MAX_SLICE_PORTS,
    SERVICE_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION,
    trigger_time_problem,
)
from svcproxy.frontend.edge.limits import ObjectLimits
from svcproxy.frontend.edge.metadata import NAME, Meta, decoded, metadata_ok
from svcproxy.frontend.edge.names import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    is_app_protocol,
    matches,
)
from svcproxy.frontend.edge.objects import (
    EndpointSlice,
    SliceEndpoint,
    SlicePort,
    parse_time,
)
from svcproxy.model import Protocol

Scalar = str | int | float | bool | None


class _Conditions(msgspec.Struct, forbid_unknown_fields=True):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class _Endpoint(msgspec.Struct, forbid_unknown_fields=True):
    addresses: tuple[str, ...]
    conditions: _Conditions | None = None
    nodeName: str | None = None
    zone: str | None = None
    hostname: str | None = None
    targetRef: dict[str, Scalar] | None = None


class _Port(msgspec.Struct, forbid_unknown_fields=True):
    name: str | None = None
    protocol: str | None = None
    port: int | None = None
    appProtocol: str | None = None


class _Slice(msgspec.Struct, forbid_unknown_fields=True):
    metadata: Meta
    addressType: str
    endpoints: list[_Endpoint] | None = None
    ports: list[_Port] | None = None
    kind: str | None = None
    apiVersion: str | None = None


_DECODER = msgspec.json.Decoder(_Slice)
_DEPTH = 3  # these structs are at most 3 levels deep


def decode_slice(data: bytes | msgspec.Raw, limits: ObjectLimits,
                 seen_at: float | None = None) -> EndpointSlice | None:
    """The EndpointSlice the general path would make of ``data`` (an item's JSON), or
    None when not of the common shape (then take the general path)."""
    obj = decoded(_DECODER, data, limits, _DEPTH)
    if obj is None:
        return None
    meta = obj.metadata
    if obj.addressType != "IPv4" or not metadata_ok(meta, DNS1123_SUBDOMAIN, NAME, limits):
        return None
    service = (meta.labels or {}).get(SERVICE_NAME_LABEL)
    annotations = meta.annotations or {}
    trigger_text = annotations.get(TRIGGER_TIME_ANNOTATION)
    if not service or trigger_text is not None and trigger_time_problem(trigger_text):
        return None
    ports = _ports(obj.ports or [])
    endpoints = _endpoints(obj.endpoints or [])
    if ports is None or endpoints is None:
        return None
    trigger = parse_time(trigger_text)
    return EndpointSlice(meta.namespace or "default", meta.name, service, "IPv4", ports,
                         endpoints, trigger or (seen_at if seen_at is not None else time.time()))


def _ports(ports: list[_Port]) -> tuple[SlicePort, ...] | None:
    if len(ports) > MAX_SLICE_PORTS:
        return None
    names: set[str] = set()
    out = []
    for p in ports:
        name = p.name or ""
        if name and (len(name) > 63 or not matches(DNS1123_LABEL, name)) or name in names:
            return None
        names.add(name)
        protocol = "TCP" if p.protocol is None else p.protocol
        if protocol not in PROTOCOLS or \
                p.appProtocol is not None and not is_app_protocol(p.appProtocol):
            return None
        if p.port is None:
            continue
        if not 1 <= p.port <= 65535:  # degraded (or refused): the general path says so
            return None
        out.append(SlicePort(name, Protocol(protocol), p.port))
    return tuple(out)


# Node name and zone pairs found valid (a cluster has a few hundred): one look-up each.
_PLACES: set[tuple[str | None, str]] = set()


def _place_ok(node: str | None, zone: str) -> bool:
    """A node name valid when set (ValidateNodeName, "" is not), a zone (no rule) of at
    most 63 ASCII characters (others: the general path, which reads any)."""
    if (node, zone) in _PLACES:
        return True
    if node is not None and (len(node) > NAME or not DNS1123_SUBDOMAIN.fullmatch(node)) or \
            len(zone) > 63 or not zone.isascii():
        return False
    if len(_PLACES) > 10_000:
        _PLACES.clear()
    _PLACES.add((node, zone))
    return True


def _endpoints(endpoints: list[_Endpoint]) -> tuple[SliceEndpoint, ...] | None:
    if len(endpoints) > MAX_SLICE_ENDPOINTS:
        return None
    out: list[SliceEndpoint] = []
    append = out.append
    allowed = ALLOWED_IPV4.fullmatch
    places = _PLACES
    for ep in endpoints:
        addresses = ep.addresses
        if len(addresses) == 1 and ep.hostname is None:
            if not allowed(addresses[0]):
                return None
        else:
            if not 0 < len(addresses) <= MAX_ENDPOINT_ADDRESSES or ep.hostname is not None:
                return None
            for address in addresses:
                if not allowed(address):
                    return None
            addresses = tuple(dict.fromkeys(addresses))
        node, zone = ep.nodeName, ep.zone or ""
        if (node, zone) not in places and not _place_ok(node, zone):
            return None
        node = node or ""
        cond = ep.conditions
        if cond is None:
            append(SliceEndpoint(addresses, True, True, False, node, zone, (), ()))
            continue
        ready = True if cond.ready is None else cond.ready
        append(SliceEndpoint(addresses, ready, ready if cond.serving is None else cond.serving,
                             cond.terminating is True, node, zone, (), ()))
    return tuple(out)
