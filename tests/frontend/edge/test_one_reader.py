"""Each kind has one reader: the rules' pass (read_service, read_endpoint_slice) reads
every field, and the typed decode is an optimisation of it, never a second definition.
A field the schema structs do not name (a new one, added to its rule alone) sends a
listed object to the rules' pass, which reads it; every field the structs name is one
the rules' pass reads, or one this file lists as read by neither path."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from svcproxy.frontend.edge import endpointslice, service
from svcproxy.frontend.edge.endpointslice import decode_slice, read_endpoint_slice
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS
from svcproxy.frontend.edge.objects import EndpointSlice
from svcproxy.frontend.edge.service import decode_service, read_service
from svcproxy.frontend.intake.intake import Intake
from svcproxy.frontend.sources.events import RawObject
from tests.frontend.edge.test_parse_fast_paths import TYPED_SERVICE, TYPED_SLICE

KINDS = {"Service": (service._Service, TYPED_SERVICE, decode_service, "v1"),
         "EndpointSlice": (endpointslice._Slice, TYPED_SLICE, decode_slice,
                           "discovery.k8s.io/v1")}
# Named by the structs so that a listed object holding them keeps the typed path, and
# read by neither path: an object's bookkeeping, and fields kube-proxy does not use.
UNREAD = {
    "Service": {".kind", ".apiVersion", ".spec.selector", ".spec.loadBalancerIP",
                ".spec.loadBalancerClass", ".spec.allocateLoadBalancerNodePorts",
                ".spec.publishNotReadyAddresses", ".status.loadBalancer.ingress[].hostname"},
    "EndpointSlice": {".kind", ".apiVersion", ".metadata.creationTimestamp",
                      ".endpoints[].targetRef"},
}
# The metadata both kinds' structs name (metadata.py's Meta) and neither path reads
# (managedFields: only its size and depth are checked, by check_size's walk and the typed
# decode's bound), with what is under them.
META_UNREAD = (".metadata.uid", ".metadata.resourceVersion", ".metadata.generation",
               ".metadata.generateName", ".metadata.finalizers", ".metadata.ownerReferences",
               ".metadata.managedFields")


def _structs(t: mi.Type) -> list[mi.Type]:
    """The struct and list types a field's type may hold (its None left out)."""
    if isinstance(t, mi.UnionType):
        return [s for u in t.types for s in _structs(u)]
    return [t] if isinstance(t, mi.StructType | mi.ListType | mi.VarTupleType) else []


def _fields(t: mi.Type, where: str) -> dict[str, bool]:
    """Every field path of the schema under ``t``, True for a struct's own path."""
    if isinstance(t, mi.ListType | mi.VarTupleType):
        return {p: s for item in _structs(t.item_type) for p, s in
                _fields(item, f"{where}[]").items()}
    assert isinstance(t, mi.StructType)
    out = {where: True}
    for f in t.fields:
        path = f"{where}.{f.encode_name}"
        out.setdefault(path, False)
        for inner in _structs(f.type):
            out.update(_fields(inner, path))
    return out


def _at(obj: Any, path: str) -> list[dict[str, Any]]:
    """The mappings at ``path`` (".spec.ports[]") in ``obj``."""
    found = [obj]
    for part in filter(None, path.split(".")):
        name, listed = part.removesuffix("[]"), part.endswith("[]")
        found = [v for m in found if isinstance(m.get(name), list | dict)
                 for v in (m[name] if listed else [m[name]])]
    return [m for m in found if isinstance(m, dict)]


STRUCTS = [(kind, path) for kind, (schema, example, _, _) in KINDS.items()
           for path, is_struct in _fields(mi.type_info(schema), "").items()
           if is_struct and _at(example, path)]


@pytest.mark.parametrize("kind, path", STRUCTS, ids=[f"{k}:{p or '.'}" for k, p in STRUCTS])
def test_a_field_no_struct_names_is_read_by_the_rules_pass(kind: str, path: str) -> None:
    """A field added to the rules alone: the listed object holding it leaves the typed
    decode for the rules' pass, which makes of it what the typed path makes of the object
    without it (the rules read what they name; the field here is read by none)."""
    _, example, decode, version = KINDS[kind]
    typed = decode(json.dumps(example).encode(), DEFAULT_LIMITS)
    assert typed is not None
    obj = copy.deepcopy(example)
    for mapping in _at(obj, path):
        mapping["fieldAddedLater"] = "x"
    data = json.dumps(obj).encode()
    assert decode(data, DEFAULT_LIMITS) is None
    intake = Intake()
    listed = intake.decode(RawObject(kind, version, data))  # type: ignore[arg-type]
    assert isinstance(listed, dict)
    assert intake.parse(kind, listed, served=False) == typed


def test_a_field_only_the_rules_name_is_read_from_a_listed_object() -> None:
    """An endpoint's hints are read by the rules alone (the struct says ``hints: None``):
    a listed slice holding them takes the rules' pass and is served with them."""
    obj = copy.deepcopy(TYPED_SLICE)
    obj["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-b"}],
                                    "forNodes": [{"name": "node-b"}]}
    data = json.dumps(obj).encode()
    assert decode_slice(data, DEFAULT_LIMITS) is None
    intake = Intake()
    listed = intake.decode(RawObject("EndpointSlice", "discovery.k8s.io/v1", data))
    read = intake.parse("EndpointSlice", listed, served=False)
    assert isinstance(read, EndpointSlice)
    first = read.endpoints[0]
    assert (first.hint_zones, first.hint_nodes) == (("zone-b",), ("node-b",))
    typed = decode_slice(json.dumps(TYPED_SLICE).encode(), DEFAULT_LIMITS)
    assert typed is not None and read.endpoints[1:] == typed.endpoints[1:]


def test_a_zone_hint_named_null_is_the_empty_zone() -> None:
    """A hint's ``name: null`` is stored by the apiserver as "" (Go's string), which
    IsValidLabelValue allows: the hint names the zone "", never a zone called "None"."""
    obj = copy.deepcopy(TYPED_SLICE)
    obj["endpoints"][0]["hints"] = {"forZones": [{"name": None}]}
    read, verdict = read_endpoint_slice(obj)
    assert verdict.ok and read is not None
    assert read.endpoints[0].hint_zones == ("",)


class _Reads(dict):  # type: ignore[type-arg]
    """A mapping that records the paths of the fields read from it (and from the
    mappings and lists inside it)."""

    def __init__(self, value: dict[str, Any], where: str, reads: set[str]) -> None:
        super().__init__(value)
        self.where, self.reads = where, reads

    def _read(self, key: Any, value: Any) -> Any:
        path = f"{self.where}.{key}"
        self.reads.add(path)
        return _recorded(value, path, self.reads)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._read(key, super().get(key, default))

    def __getitem__(self, key: Any) -> Any:
        return self._read(key, super().__getitem__(key))

    def __contains__(self, key: Any) -> bool:
        self.reads.add(f"{self.where}.{key}")
        return super().__contains__(key)


class _ReadItems(list):  # type: ignore[type-arg]
    def __init__(self, value: list[Any], where: str, reads: set[str]) -> None:
        super().__init__(_recorded(v, f"{where}[]", reads) for v in value)


def _recorded(value: Any, where: str, reads: set[str]) -> Any:
    if isinstance(value, dict):
        return _Reads(value, where, reads)
    if isinstance(value, list):
        return _ReadItems(value, where, reads)
    return value


def _rules_reads(kind: str) -> set[str]:
    """The field paths the rules' pass reads of the kind's typed example and of the
    variants that reach its other branches (ExternalName; hints)."""
    reads: set[str] = set()
    if kind == "Service":
        variants = [TYPED_SERVICE, dict(TYPED_SERVICE, spec={
            **TYPED_SERVICE["spec"], "type": "ExternalName", "externalName": "a.example"})]
        for obj in variants:
            read_service(_recorded(obj, "", reads))
    else:
        hinted = dict(TYPED_SLICE, endpoints=[{"addresses": ["10.0.0.1"], "hints": {
            "forZones": [{"name": "a"}]}}])
        for obj in (TYPED_SLICE, hinted):
            read_endpoint_slice(_recorded(obj, "", reads), seen_at=1.0)
    return reads


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_field_the_structs_name_is_one_the_rules_pass_reads(kind: str) -> None:
    """msgspec.structs.fields of each struct, against the paths the rules' pass reads
    (recorded as it reads them): the typed decode names no field of its own, but for
    those listed in UNREAD, which neither path reads."""
    schema = KINDS[kind][0]
    named = {p for p, is_struct in _fields(mi.type_info(schema), "").items() if not is_struct}
    assert {f.encode_name for f in msgspec.structs.fields(schema)} == {
        p.split(".")[1].removesuffix("[]") for p in named}
    reads = _rules_reads(kind)
    unread = {p for p in named - reads if not p.startswith(META_UNREAD)}
    assert sorted(unread) == sorted(UNREAD[kind])
    assert not {p for p in reads if p in UNREAD[kind] or p.startswith(META_UNREAD)}, \
        "read after all: take it off UNREAD"
