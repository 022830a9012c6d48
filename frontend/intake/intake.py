"""The store's door: every object is read, or refused alone, here.

Whatever the source, an object is read by its kind's one pass (``READERS``: each of
Kubernetes' rules checks a field and gives the value the object is built of, see
edge/validation.py), or by the typed decode of a listed object of the common shape
(``decode``), the same reading made faster. A refused one is logged once (source, file,
object, field, reason) and counted in ``svcproxy_frontend_rejected_objects_total``; an
unexpected exception refuses that object only. Values Kubernetes lets through but
svcproxy cannot use (a bad trigger-time annotation, an EndpointSlice port out of
1-65535) degrade that field alone (docs/edge-fields.md), with a log line and
``svcproxy_frontend_degraded_fields_total``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from typing import Any, TypeAlias

import msgspec

from svcproxy.frontend.edge.endpointslice import decode_slice, read_endpoint_slice
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.node import read_node
from svcproxy.frontend.edge.objects import EndpointSlice, Node, Service
from svcproxy.frontend.edge.service import decode_service, read_service
from svcproxy.frontend.edge.validation import object_key
from svcproxy.frontend.edge.verdict import Verdict, shortened
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.sources.events import RawObject

log = logging.getLogger("svcproxy.frontend.engine")
Parsed: TypeAlias = Service | EndpointSlice | Node
# Each kind's one pass (edge/service.py, endpointslice.py, node.py): its object, None
# when refused, and its verdict.
Reader: TypeAlias = Callable[[Any, ObjectLimits], tuple[Parsed | None, Verdict]]
READERS: dict[str, Reader] = {
    "Service": read_service, "EndpointSlice": read_endpoint_slice, "Node": read_node}
_MEMORY = 10000
_INDEX = re.compile(r"\[\d+\]")
# (kind, namespace, name, file and position, reading of the file) of an object said of.
MemoKey: TypeAlias = tuple[str, str, str, str, int]
# The keys a manifest object carries: where it is ("FILE (document N)") and the number
# of the reading of its file that found it (manifests.py).
FILE_KEYS = ("__source__", "__read__")
# A RawObject's typed path (one for each of events.RAW_KINDS): its object, or None.
_TYPED: dict[str, Callable[[bytes | msgspec.Raw, ObjectLimits], Service | EndpointSlice | None]] \
    = {"Service": decode_service, "EndpointSlice": decode_slice}


def describe(kind: str, obj: Any) -> str:
    """``Service ns/name from FILE`` (what a log line names)."""
    ns, name = (shortened(text) for text in object_key(kind, obj))
    where = obj.get("__source__") if isinstance(obj, dict) else None
    return f"{kind} {ns + '/' if ns else ''}{name or '<unnamed>'}" + (
        f" from {where}" if where else "")


def _bounded(text: str) -> str:
    """``text``, or when longer than any valid name its start and a digest of it: what the
    intake remembers of a refused object is bounded whatever its name."""
    if len(text) <= 253:
        return text
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
    return f"{text[:64]}...{digest.hexdigest()}"


class Intake:
    """Validates and parses objects for one store; ``source`` labels its metric."""

    def __init__(self, source: str = "apiserver", limits: ObjectLimits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        # What was last said about an object, so an unchanged refusal is logged once.
        self._said: dict[MemoKey, str] = {}

    def decode(self, raw: RawObject) -> Service | EndpointSlice | dict[str, Any] | None:
        """A listed object's JSON: its object when of the common shape (valid as it is, see
        edge/service.py and edge/endpointslice.py), else its dict, for
        ``parse`` to say why or read it."""
        parsed = _TYPED[raw.kind](raw.data, self.limits)
        if parsed is not None:
            return parsed
        try:
            return raw.decoded()  # type: ignore[no-any-return]
        except ValueError:  # what msgspec reads but json does not (a 5,000-digit number)
            return None  # refused alone by ``parse``, as not a mapping

    def parse(self, kind: str, obj: Any, served: bool) -> Parsed | None:
        """The object read, or None when refused (``served``: a valid version is in use);
        a Service or EndpointSlice from ``decode`` is valid as it is."""
        if type(obj) is EndpointSlice or type(obj) is Service:
            if self._said:  # as _accepted: nothing to warn of, what was said is forgotten
                self._said.pop((kind, *obj.key, "", 0), None)
            return obj
        try:
            parsed, verdict = READERS[kind](obj, self.limits)
        except Exception as err:  # noqa: BLE001 - one object's failure is its own
            log.exception("unexpected error reading %s", describe(kind, obj))
            self._refuse(kind, obj, "internal_error", f"{type(err).__name__}: {err}", served)
            return None
        if parsed is None:
            self._refuse(kind, obj, verdict.errors[0].reason, verdict.summary(), served)
            return None
        self._accepted(kind, obj, verdict)
        return parsed

    def _key(self, kind: str, obj: Any) -> MemoKey:
        """What the memo remembers an object by: kind, namespace and name, and where a
        manifest file holds it and which reading of that file (``FILE_KEYS``), so every
        refused object of each file version is said once, however many share no name."""
        ns, name = object_key(kind, obj)
        where, version = (obj.get(k) for k in FILE_KEYS) if type(obj) is dict else ("", 0)
        return (kind, _bounded(ns), _bounded(name), where if type(where) is str else "",
                version if type(version) is int else 0)

    def _once(self, key: MemoKey, text: str) -> bool:
        if self._said.get(key) == text:
            return False
        if len(self._said) >= _MEMORY:
            self._said.clear()
        self._said[key] = text
        return True

    def _refuse(self, kind: str, obj: Any, reason: str, message: str, served: bool) -> None:
        if not self._once(self._key(kind, obj), "refused: " + message):
            return
        metrics.REJECTED_OBJECTS.labels(self.source, kind, reason).inc()
        then = ("its last valid version stays served" if served
                else "it is not served")
        log.error("rejected %s (source %s): %s; %s", describe(kind, obj), self.source,
                  message, then)

    def _accepted(self, kind: str, obj: Any, verdict: Verdict) -> None:
        if not self._said and not verdict.warnings:
            return  # nothing said about any object: nothing to forget
        key = self._key(kind, obj)
        if not verdict.warnings:
            self._said.pop(key, None)
            return
        text = "; ".join(str(w) for w in verdict.warnings)
        if self._once(key, "warned: " + text):
            for warning in verdict.warnings:
                metrics.DEGRADED_FIELDS.labels(kind, field_label(warning.field)).inc()
            log.warning("%s (source %s): %s", describe(kind, obj), self.source, text)


def field_label(where: str) -> str:
    """A field's path without its indexes (endpoints[3].zone: endpoints[].zone), the
    degraded-fields metric's bounded label."""
    return _INDEX.sub("[]", where)
