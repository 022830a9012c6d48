"""What the typed paths for listed objects (endpointslice.py, service.py) share:
the metadata's struct and checks, and the bounds under which a typed decoding stands in
for ``check_size``. Each check says whether validation.py would accept the value as it
is; False means "take the general path" (which says why, or accepts it after all).
"""

from __future__ import annotations

import json
import re
from typing import TypeVar

import msgspec

from svcproxy.frontend.edge.checker import MAX_ANNOTATIONS_BYTES
from svcproxy.frontend.edge.limits import ObjectLimits
from svcproxy.frontend.edge.names import (
    DNS1123_LABEL,
    QUALIFIED,
    is_qualified_name,
    matches,
)

# ``check_size`` counts at most 8 per byte of JSON (a scalar is 8, text its length, a
# key its length + 3, a container 2), with room for the kind and apiVersion a listed
# item is completed with; the longest name Kubernetes allows.
BYTES_PER_BYTE = 8
NAME = 253
T = TypeVar("T")


class OwnerRef(msgspec.Struct, forbid_unknown_fields=True):
    apiVersion: str | None = None
    kind: str | None = None
    name: str | None = None
    uid: str | None = None
    controller: bool | None = None
    blockOwnerDeletion: bool | None = None


class ManagedFields(msgspec.Struct, forbid_unknown_fields=True):
    manager: str | None = None
    operation: str | None = None
    apiVersion: str | None = None
    time: str | None = None
    fieldsType: str | None = None
    subresource: str | None = None
    fieldsV1: msgspec.Raw = msgspec.Raw(b"null")


class Meta(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    generation: int | None = None
    creationTimestamp: str | None = None
    generateName: str | None = None
    finalizers: list[str] | None = None
    ownerReferences: list[OwnerRef] | None = None
    managedFields: list[ManagedFields] | None = None


def decoded(decoder: msgspec.json.Decoder[T], data: bytes | msgspec.Raw, limits: ObjectLimits,
            depth: int) -> T | None:
    """``data`` (an item's JSON) decoded into ``decoder``'s structs (at most ``depth``
    levels deep) when within the limits whatever it holds and the names' limits are
    Kubernetes' own; None otherwise, or when not of the structs' shape."""
    if limits.max_depth < depth or limits.max_name_length < NAME or \
            BYTES_PER_BYTE * len(data) > limits.max_object_bytes:
        return None
    try:
        return decoder.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def metadata_ok(meta: Meta, name_pattern: re.Pattern[str], name_limit: int,
                limits: ObjectLimits) -> bool:
    """The name (``name_pattern``, at most ``name_limit``), namespace, labels,
    annotations and managedFields valid as they are."""
    name, namespace = meta.name, meta.namespace
    if not name or len(name) > name_limit or not matches(name_pattern, name):
        return False
    if namespace and (len(namespace) > 63 or not matches(DNS1123_LABEL, namespace)):
        return False
    if meta.labels and not labels_ok(meta.labels):
        return False
    if meta.annotations and not annotations_ok(meta.annotations):
        return False
    return not meta.managedFields or fields_ok(meta.managedFields, limits)


def labels_ok(labels: dict[str, str]) -> bool:
    """Qualified-name keys, label values."""
    for key, value in labels.items():
        if not is_qualified_name(key) or len(value) > 63 or \
                not (value == "" or QUALIFIED.fullmatch(value)):
            return False
    return True


def annotations_ok(annotations: dict[str, str]) -> bool:
    """Qualified-name keys, ASCII values (others: the general path checks their UTF-8),
    their total size within Kubernetes' limit."""
    size = 0
    for key, value in annotations.items():
        if not is_qualified_name(key) or not value.isascii():
            return False
        size += len(key) + len(value)
    return size <= MAX_ANNOTATIONS_BYTES


def fields_ok(entries: list[ManagedFields], limits: ObjectLimits) -> bool:
    """Each fieldsV1 (left as JSON) within the depth limit, counted from its brackets (a
    bound: it is 4 levels in), and read by ``json`` as the general path reads it."""
    for entry in entries:
        data = bytes(entry.fieldsV1)
        if 4 + data.count(b"{") + data.count(b"[") > limits.max_depth:
            return False
        try:
            json.loads(data)
        except ValueError:
            return False
    return True
