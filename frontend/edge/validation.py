"""Kubernetes' own validation rules for the objects the frontend reads.

One pure function per kind (``validate_service`` in service.py,
``validate_endpoint_slice`` in endpointslice.py, ``validate_node`` in node.py: the
verdict of the kind's one reader, ``read_service`` ..., which also builds the object)
checks the fields svcproxy uses the way the apiserver does (pkg/apis/core/validation,
pkg/apis/discovery/validation): names, port names, port ranges, protocols, enums, IP
syntax and family, the addresses Kubernetes forbids, duplicates and list limits.
``check_size`` (limits.py) bounds any object (size, nesting) first. Nothing here
raises on any input: a problem is returned as data, so every source (apiserver,
manifests, upstream) gets the same verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from svcproxy.frontend.edge.endpointslice import validate_endpoint_slice
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS, ObjectLimits
from svcproxy.frontend.edge.node import validate_node
from svcproxy.frontend.edge.service import validate_service
from svcproxy.frontend.edge.verdict import Verdict

VALIDATORS: dict[str, Callable[[Any, ObjectLimits], Verdict]] = {
    "Service": validate_service, "EndpointSlice": validate_endpoint_slice,
    "Node": validate_node,
}


def validate(kind: str, obj: Any, limits: ObjectLimits = DEFAULT_LIMITS) -> Verdict:
    """The verdict on one object of a kind svcproxy reads."""
    return VALIDATORS[kind](obj, limits)


def object_key(kind: str, obj: Any) -> tuple[str, str]:
    """(namespace, name) of any object, whatever it holds ("" where absent or not text)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return ("", "")
    name = meta.get("name")
    ns = meta.get("namespace")
    if kind == "Node":
        ns = ""
    elif not isinstance(ns, str) or not ns:
        ns = "default"
    return (ns, name if isinstance(name, str) else "")
