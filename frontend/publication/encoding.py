"""Records serialised for the wire and for the state digest, each part once.

A record's ``replace_service`` op (serialised deterministically: maps in key order) is
its service port's bytes and its endpoints' bytes put together (a repeated field is its
elements' bytes one after another), and its digest term is the sum of those parts'
terms. A service port is serialised once per
value and an endpoint once per object: the node classes of a service share their
endpoint objects but the one or two that are local, so a node's own records cost
little more than those parts.
"""

from __future__ import annotations

from svcproxy.convert import (
    DIGEST_MASK,
    endpoint_term_of,
    endpoint_to_pb,
    field_bytes,
    key_to_pb,
    port_key_field,
    service_to_pb,
    term_of,
)
from svcproxy.model import Endpoint, ServicePort, ServicePortKey, ServicePortState

# Cached parts past which the caches start again (records and endpoints no longer in
# use would otherwise be kept for good).
MAX_RECORDS = 500_000
MAX_PARTS = 2_000_000
REPLACE_SERVICE = 7  # Op.replace_service


class RecordEncoder:
    """A record's serialised ``replace_service`` op and its digest term, cached."""

    def __init__(self) -> None:
        self._records: dict[int, tuple[ServicePortState, bytes, int]] = {}
        # By value: field 1 of a ServicePortState, and the term.
        self._services: dict[ServicePort, tuple[bytes, int]] = {}
        # By object: field 2 of a ServicePortState, and the term in the port it is in.
        self._endpoints: dict[int, tuple[Endpoint, ServicePortKey, bytes, int]] = {}

    def op(self, rec: ServicePortState) -> bytes:
        """The serialised ``Op`` replacing the record's service port with ``rec``."""
        return self._encoded(rec)[1]

    def term(self, rec: ServicePortState) -> int:
        """The record's digest term (``convert.record_term`` of its message)."""
        return self._encoded(rec)[2]

    def _encoded(self, rec: ServicePortState) -> tuple[ServicePortState, bytes, int]:
        hit = self._records.get(id(rec))
        if hit is not None and hit[0] is rec:
            return hit
        if len(self._records) > MAX_RECORDS or \
                len(self._endpoints) + len(self._services) > MAX_PARTS:
            self.__init__()  # type: ignore[misc]
        svc = rec.service
        service = self._services.get(svc)
        if service is None:
            data = service_to_pb(svc).SerializeToString(deterministic=True)
            service = self._services[svc] = (field_bytes(1, data), term_of(b"s", data))
        parts = [service[0]]
        total = service[1]
        key = svc.key
        key_bytes = None
        for _, ep in sorted(rec.endpoints.items()):
            known = self._endpoints.get(id(ep))
            if known is None or known[0] is not ep or (known[1] is not key
                                                       and known[1] != key):
                if key_bytes is None:
                    key_bytes = port_key_field(key_to_pb(key))
                data = endpoint_to_pb(ep).SerializeToString(deterministic=True)
                known = self._endpoints[id(ep)] = (ep, key, field_bytes(2, data),
                                                   endpoint_term_of(key_bytes, data))
            parts.append(known[2])
            total += known[3]
        hit = self._records[id(rec)] = (rec, field_bytes(REPLACE_SERVICE, b"".join(parts)),
                                        total & DIGEST_MASK)
        return hit
