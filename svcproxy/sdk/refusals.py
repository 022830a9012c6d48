"""One service port's failure stays its own: refusals found, kept and reported.

When the kernel (or the tool in front of it) refuses a transaction, a backend calls
``isolate_versions`` (or ``isolate``) to split the service ports it carried into those
the dataplane takes and those it refuses, applies the first, and records the second in
its ``Refusals``. A
refused service port is tried again when its record changes (a new version of the
Service or its endpoints) and, unchanged, after a backoff (1 s, doubling to 60 s: what
the kernel refused may be fixed meanwhile, a foreign rule removed); the node agent
reports the refused ones (log line, metric, ``/healthz`` detail) from
``backend.refusals``.

``invalid_values`` refuses a record up front when a value that reaches a rule is not
what its field holds (an address that is not one, a port beyond 65535): a frontend
that is not ours may send anything, and the renderers put these values in rules
as they are.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from svcproxy.model import ServicePortKey, ServicePortState

log = logging.getLogger("svcproxy.backend.refused")

T = TypeVar("T")

MAX_AFFINITY_TIMEOUT = 86400  # Kubernetes' limit for sessionAffinityConfig.clientIP
MAX_ERROR = 500  # characters of the kernel's error kept per refusal
RETRY_FIRST = 1.0  # seconds before a refused service port is tried again, unchanged
RETRY_MAX = 60.0  # the backoff doubles up to this


@dataclass(frozen=True, slots=True)
class Refusal:
    """One refused service port: the version refused (None: its removal), why, and when
    it is tried again unchanged (``Refusals.clock``; inf: only when it changes)."""

    record: ServicePortState | None
    error: str
    retry_at: float = float("inf")
    backoff: float = RETRY_FIRST


def describe(key: ServicePortKey) -> str:
    """``ns/name:port/PROTO`` with anything unprintable escaped (for logs)."""
    text = f"{key.namespace}/{key.name}:{key.port_name}/{key.protocol.value}"
    return text.encode("unicode_escape").decode()[:300]


class Refusals(Mapping[ServicePortKey, Refusal]):
    """The service ports a backend's dataplane refused, until they change (thread-safe
    to read: the agent's HTTP threads read it while the sync thread writes)."""

    def __init__(self, backend: str, clock: Callable[[], float] = time.monotonic,
                 retry_first: float = RETRY_FIRST, retry_max: float = RETRY_MAX) -> None:
        self.backend = backend
        self.total = 0  # refusals recorded so far (a changed version refused again counts)
        self.clock = clock
        self.retry_first = retry_first
        self.retry_max = retry_max
        self._items: dict[ServicePortKey, Refusal] = {}
        self._lock = threading.Lock()

    def __getitem__(self, key: ServicePortKey) -> Refusal:
        return self._items[key]

    def __iter__(self) -> Iterator[ServicePortKey]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def holds(self, key: ServicePortKey, record: ServicePortState | None) -> bool:
        """True when exactly this version of the service port was refused and its retry
        is not due yet."""
        refusal = self._items.get(key)
        return (refusal is not None and refusal.record == record
                and refusal.retry_at > self.clock())

    def refuse(self, key: ServicePortKey, record: ServicePortState | None, error: str,
               *, retry: bool = True) -> None:
        """Record a refusal, logged once per version refused; ``retry``: try it again
        unchanged after the backoff (doubled at each refusal of the same version), else
        only once it changes (a value no dataplane takes)."""
        error = " ".join(error.split())[:MAX_ERROR]
        old = self._items.get(key)
        if old is not None and old.record == record:
            backoff = min(old.backoff * 2, self.retry_max)
            retry_at = self.clock() + backoff if retry else float("inf")
            with self._lock:
                self._items[key] = replace(old, error=error, retry_at=retry_at,
                                           backoff=backoff)
            log.debug("Backend %s: service port %s refused again (%s); next try in %.3gs",
                      self.backend, describe(key), error, backoff)
            return
        first = self.retry_first
        with self._lock:
            self._items[key] = Refusal(record, error,
                                       self.clock() + first if retry else float("inf"), first)
            self.total += 1
        when = f"in {first:.3g}s (with backoff) and when it changes" if retry else \
            "when it changes"
        log.error("Backend %s: the dataplane refused service port %s: %s; its previous "
                  "rules (if any) stay, the other services are applied, and it is retried "
                  "%s", self.backend, describe(key), error, when)

    def due(self) -> list[ServicePortKey]:
        """The refused service ports whose retry is due."""
        now = self.clock()
        return [k for k, r in list(self._items.items()) if r.retry_at <= now]

    def retry_in(self) -> float | None:
        """Seconds until the next retry is due (0: one is), or None when none waits."""
        first = min((r.retry_at for r in list(self._items.values())), default=float("inf"))
        return None if first == float("inf") else max(0.0, first - self.clock())

    def clear(self, key: ServicePortKey) -> None:
        """The service port was applied (or is gone): no longer refused."""
        if key in self._items:
            with self._lock:
                self._items.pop(key, None)
            log.info("Backend %s: service port %s is no longer refused",
                     self.backend, describe(key))

    def prune(self, live: Container[ServicePortKey]) -> None:
        """Forget refusals of service ports that are gone from the state."""
        for key in [k for k in self._items if k not in live]:
            self.clear(key)

    def errors(self) -> dict[ServicePortKey, str]:
        """A copy: refused service port -> the error that refused it."""
        with self._lock:
            return {k: r.error for k, r in self._items.items()}


class TooManyRefused(RuntimeError):
    """More items failed than ``isolate``'s limit: the fault is not theirs (the
    dataplane refuses everything); the message is the last error."""


def isolate(items: Sequence[T], accepts: Callable[[list[T], list[T]], str | None],
            error: str | None, limit: int | None = None,
            ) -> tuple[list[T], list[tuple[T, str]]]:
    """Split ``items``, which failed together with ``error`` (None: not tried), into (accepted,
    [(refused item, its error)]) by bisection.

    ``accepts(accepted, group)`` tries the items accepted so far plus ``group`` and
    returns None if the dataplane takes them, else the error. The accepted list only
    grows on success, so the last successful try holds exactly the accepted items.
    A group that fails is halved until single items remain; with k refused items
    of n this costs about 2k·log2(n) tries. More than ``limit`` refused items raise
    TooManyRefused.
    """
    accepted: list[T] = []
    refused: list[tuple[T, str]] = []
    pending: list[tuple[list[T], str | None]] = [(list(items), error)]
    while pending:
        group, failed = pending.pop()
        if failed is None:
            failed = accepts(accepted, group)
        if failed is None:
            accepted.extend(group)
        elif len(group) == 1:
            refused.append((group[0], failed))
            if limit is not None and len(refused) > limit:
                raise TooManyRefused(failed)
        elif group:
            half = len(group) // 2
            pending += [(group[half:], None), (group[:half], None)]
    return accepted, refused


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Ordered)
R = TypeVar("R")


MAX_NAMED = 4  # rounds of dropping the keys an error names before bisecting


def isolate_versions(
    records: Mapping[K, R], previous: Mapping[K, R],
    accepts: Callable[[list[tuple[K, R]]], str | None], error: str,
    named: Callable[[str], Iterable[K]] | None = None,
) -> tuple[dict[K, R], dict[K, str]]:
    """Which version of each key the dataplane takes, after ``records`` failed whole.

    ``accepts(items)`` tries exactly ``items`` and returns the error or None. When
    ``named(error)`` says which keys the error of the last try points at (a line of the
    transaction), those are set aside first (a few rounds, one try each, while the
    error moves); what still fails is bisected; then the keys set aside are tried again
    on top of what was accepted (a tool's pointer may be wrong: nothing is refused on
    its word alone). Each refused key then gets its ``previous`` version back if the
    dataplane takes that. Returns (key -> version accepted, key -> error for every key
    whose version in ``records`` was refused). Raises TooManyRefused when more than a
    tenth of the records (and more than 10) fail: then the fault is the node's.
    """
    limit = max(10, len(records) // 10)
    remaining = dict(records)
    aside: dict[K, str] = {}
    failed: str | None = error
    rounds = MAX_NAMED if named is not None else 0
    while named is not None and failed is not None and rounds:
        rounds -= 1
        keys = [k for k in dict.fromkeys(named(failed)) if k in remaining]
        if not keys or len(aside) + len(keys) > limit:
            break
        for key in keys:
            aside[key] = failed
            del remaining[key]
        before, failed = failed, accepts(sorted(remaining.items(), key=_first))
        if failed == before:
            break
    accepted: list[tuple[K, R]] = sorted(remaining.items(), key=_first)
    refused: dict[K, str] = {}
    if failed is not None:
        accepted, more = isolate(accepted, lambda a, g: accepts(a + g), failed, limit)
        refused.update((k, err) for (k, _), err in more)
    if aside:
        base = list(accepted)
        again, guilty = isolate(sorted(((k, records[k]) for k in aside), key=_first),
                                lambda a, g: accepts(base + a + g), None,
                                limit - len(refused))
        accepted += again
        refused.update((k, aside[k]) for (k, _), _err in guilty)
    older = [(k, old) for k in sorted(refused)
             if (old := previous.get(k)) is not None and old is not records.get(k)]
    if older:
        base = list(accepted)
        more_old, _ = isolate(older, lambda a, g: accepts(base + a + g), None)
        accepted += more_old
    return dict(accepted), refused


def _first(item: tuple[K, R]) -> K:
    return item[0]


def invalid_values(record: ServicePortState) -> str | None:
    """Why a value of the record cannot be put in a rule as it is, or None.

    About a microsecond per address (inet_pton); the message names the field.
    """
    svc = record.service
    if not (1 <= svc.port <= 65535 and 0 <= svc.node_port <= 65535
            and 0 <= svc.health_check_node_port <= 65535
            and 0 <= svc.session_affinity_timeout <= MAX_AFFINITY_TIMEOUT):
        return _invalid_number(record)
    ips = [*svc.cluster_ips, *svc.external_ips]
    ips += [i.ip for i in svc.load_balancer_ingress]
    for address, endpoint in record.endpoints.items():
        if address != endpoint.ip:
            return f"endpoint key {address[:64]!r} is not its endpoint's address"
        if not 1 <= endpoint.port <= 65535:
            return f"endpoint port {endpoint.port} is out of range"
        ips.append(endpoint.ip)
    if not all(map(_canonical_ip, ips)):
        return _invalid_address(record)
    for text in svc.load_balancer_source_ranges:
        if not _cidr(text):
            return f"loadBalancerSourceRange {text[:64]!r} is not a CIDR"
    return None


def _invalid_number(record: ServicePortState) -> str | None:
    svc = record.service
    for field, value, low in (("port", svc.port, 1), ("nodePort", svc.node_port, 0),
                              ("healthCheckNodePort", svc.health_check_node_port, 0)):
        if not low <= value <= 65535:
            return f"{field} {value} is out of range"
    return f"sessionAffinity timeout {svc.session_affinity_timeout}s is out of range"


def _invalid_address(record: ServicePortState) -> str | None:
    svc = record.service
    addresses: list[tuple[str, str]] = [("clusterIP", a) for a in svc.cluster_ips]
    addresses += [("externalIP", a) for a in svc.external_ips]
    addresses += [("loadBalancer ingress IP", i.ip) for i in svc.load_balancer_ingress]
    addresses += [("endpoint", e.ip) for e in record.endpoints.values()]
    for field, text in addresses:
        if not _canonical_ip(text):
            return f"{field} {text[:64]!r} is not an IP address"
    return None


def _canonical_ip(text: str) -> bool:
    """An IPv4 or IPv6 address as inet_pton reads it (no leading zeros, no spaces, no
    zone): made of hex digits, dots and colons only, so it cannot break a rule."""
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in text else socket.AF_INET, text)
    except (OSError, ValueError):
        return False
    return True


def _cidr(text: str) -> bool:
    try:
        return "%" not in text and bool(ipaddress.ip_network(text, strict=False))
    except ValueError:
        return False
