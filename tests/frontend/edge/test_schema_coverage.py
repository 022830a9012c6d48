"""The property tests that hold each kind's typed decode to its general path set every
field of the kind's schema: a field added to a schema is compared at once, or this fails
naming it."""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from svcproxy.frontend.edge import endpointslice, service
from tests.frontend.edge.test_parse_fast_paths import TYPED_SERVICE, TYPED_SLICE


def _structs(t: mi.Type) -> list[mi.Type]:
    """The struct, list or dict types a field's type may hold (its None left out)."""
    if isinstance(t, mi.UnionType):
        return [s for u in t.types for s in _structs(u)]
    return [t] if isinstance(t, mi.StructType | mi.ListType | mi.VarTupleType) else []


def _schema(t: mi.Type, where: str) -> set[str]:
    """Every field path of the schema under ``t``."""
    if isinstance(t, mi.ListType | mi.VarTupleType):
        return {p for s in _structs(t.item_type) for p in _schema(s, f"{where}[]")}
    assert isinstance(t, mi.StructType)
    out = set()
    for f in t.fields:
        out.add(f"{where}.{f.encode_name}")
        out |= {p for s in _structs(f.type) for p in _schema(s, f"{where}.{f.encode_name}")}
    return out


def _set(t: mi.Type, value: Any, where: str) -> set[str]:
    """The field paths of the schema under ``t`` that ``value`` sets."""
    if isinstance(t, mi.ListType | mi.VarTupleType):
        return {p for item in value or () for s in _structs(t.item_type)
                for p in _set(s, item, f"{where}[]")}
    out = set()
    for f in t.fields:
        if f.encode_name in value:
            out.add(f"{where}.{f.encode_name}")
            out |= {p for s in _structs(f.type)
                    for p in _set(s, value[f.encode_name], f"{where}.{f.encode_name}")}
    return out


@pytest.mark.parametrize("schema, example", [(endpointslice._Slice, TYPED_SLICE),
                                             (service._Service, TYPED_SERVICE)])
def test_the_typed_examples_set_every_field_of_their_schema(
        schema: type[msgspec.Struct], example: dict[str, Any]) -> None:
    t = mi.type_info(schema)
    assert sorted(_schema(t, "") - _set(t, example, "")) == []
