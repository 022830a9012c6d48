"""What a node has applied, decided from its view and its applied revision (pure).

A node that applied revision A holds its view's state at A. The view keeps its current
records and its history of batches (revision, ops, each op keyed by what it changes), so
whether a change is in A is a question about the batches after A: none touching it means
the node holds the change. Where the history no longer reaches A, the answer is "not
applied" (it will be once the node catches up).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from svcproxy.model import ServicePortKey, ServicePortState

OpKeyTest = Callable[[tuple[object, ...]], bool]


class ViewLike(Protocol):
    """What conditions read of a NodeView (publication/views.py)."""

    revision: int
    history_start: int
    records: dict[ServicePortKey, ServicePortState]

    @property
    def history(self) -> Iterable[tuple[Any, ...]]: ...


def changed_after(view: ViewLike, applied: int, upto: int, touches: OpKeyTest) -> bool:
    """Whether a batch of ``view`` after ``applied`` and at most ``upto`` has an op that
    ``touches`` (True, too, when the history no longer reaches ``applied``)."""
    if applied >= min(upto, view.revision):
        return False
    if applied < view.history_start:
        return True
    for batch in reversed(view.history):  # type: ignore[call-overload]
        revision, ops = batch[0], batch[1]  # (revision, ops, ...): a batch of the view
        if revision <= applied:
            break
        if revision <= upto and any(touches(op.key) for op in ops):
            return True
    return False


def of_service(namespace: str, name: str) -> OpKeyTest:
    """Ops on any port of the Service ``namespace``/``name``."""
    def touches(key: tuple[object, ...]) -> bool:
        port = key[1]
        return (key[0] in ("svc", "ep") and isinstance(port, ServicePortKey)
                and port.name == name and port.namespace == namespace)
    return touches


def of_port(port: ServicePortKey) -> OpKeyTest:
    """Ops on the service port ``port``."""
    def touches(key: tuple[object, ...]) -> bool:
        return key[0] in ("svc", "ep") and key[1] == port
    return touches


def of_endpoint(port: ServicePortKey, ip: str) -> OpKeyTest:
    """Ops on the endpoint ``ip`` of ``port``, and on the whole port (a replace_service
    sets every endpoint)."""
    def touches(key: tuple[object, ...]) -> bool:
        return key[1] == port and (key[0] == "svc" or (key[0] == "ep" and key[2] == ip))
    return touches


@dataclass(frozen=True, slots=True)
class Address:
    """An endpoint address asked about: an IP, and a target port (0: any)."""

    ip: str
    port: int = 0


def parse_address(text: str) -> Address:
    """``IP``, ``IP:PORT`` or ``[IPv6]:PORT``; ValueError saying what is wrong."""
    host, port = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r} is not [IPv6]:PORT")
        port = rest[1:]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    try:
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address, IP:PORT or [IPv6]:PORT") from None
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"the port of {text!r} is not a number from 1 to 65535")
    return Address(ip, int(port) if port else 0)


def routes_to(records: Mapping[ServicePortKey, ServicePortState], address: Address) -> bool:
    """Whether a node holding ``records`` sends new connections to ``address``: an
    endpoint with its IP (and target port) is in the internal or external set of some
    service port, or in its cluster set where an externalTrafficPolicy Local service
    short-circuits pods' and the node's traffic to it (the frontend's sets include the
    terminating fallback). The local set alone routes nothing: with a Local policy it is
    the external (or internal) set."""
    for record in records.values():
        ep = record.endpoints.get(address.ip)
        if ep is None or (address.port and ep.port != address.port):
            continue
        if ep.internal or ep.external or (
                ep.cluster and record.service.external_policy_local):
            return True
    return False


def has_ready(records: Mapping[ServicePortKey, ServicePortState], ip: str) -> bool:
    """Whether some service port holds a ready endpoint with ``ip``."""
    return any(ep.ready for record in records.values()
               if (ep := record.endpoints.get(ip)) is not None)
