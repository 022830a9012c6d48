"""What a source (manifests, apiserver) tells the frontend: raw Kubernetes objects.

Objects are the JSON dicts the apiserver serves (camelCase keys, with
``metadata``); the frontend parses and validates them. A sink is any callable
taking a batch of events; it is thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

Kind = Literal["Service", "EndpointSlice", "Node"]
KINDS: tuple[Kind, ...] = ("Service", "EndpointSlice", "Node")
# The kinds whose listed items are handed on as JSON (RawObject), for the store's intake
# to decode straight into its objects when of the common shape (typed_*.py).
RAW_KINDS: tuple[Kind, ...] = ("Service", "EndpointSlice")


@dataclass(frozen=True, slots=True)
class Upsert:
    """An object was created or changed."""

    kind: Kind
    obj: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    """An object was deleted (namespace is "" for Nodes)."""

    kind: Kind
    namespace: str
    name: str


class RawObject(msgspec.Struct, frozen=True, gc=False):
    """A listed object still as the apiserver's JSON (of a kind in RAW_KINDS: the store
    decodes it, straight into its object when of the common shape). A Struct: made in C,
    one per listed item, in the reflector threads."""

    kind: Kind
    api_version: str
    data: bytes | msgspec.Raw

    def decoded(self) -> Any:
        """The JSON as a listed dict is: decoded, with kind and apiVersion filled in."""
        obj = json.loads(bytes(self.data))
        if isinstance(obj, dict):
            obj.setdefault("kind", self.kind)
            obj.setdefault("apiVersion", self.api_version)
        return obj


@dataclass(frozen=True, slots=True)
class Replace:
    """The complete current set of one kind (initial list or relist after 410 Gone).

    Objects of that kind not listed are deleted. After a Replace of every kind
    the frontend has synced and starts serving. A listing may come in parts (the
    apiserver's pages, handed on as they arrive so they are parsed while the next is
    fetched): ``first`` on its first part, ``last`` on its last; a part's objects are
    applied at once, the deletions and the kind's sync at the last part. A listing
    that never ends is forgotten at the next ``first``.
    """

    kind: Kind
    objs: list[dict[str, Any] | RawObject] = field(default_factory=list)
    first: bool = True
    last: bool = True


Event = Upsert | Delete | Replace
Sink = Callable[[Sequence[Event]], None]
