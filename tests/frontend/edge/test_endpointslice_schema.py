"""The EndpointSlice's schema drives its typed decode and the rules' plain-shape check:
a field the schema names keeps an endpoint on both fast paths, any other sends it to the
general path, which gives the same verdict and object."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import patch

import pytest

from svcproxy.frontend.edge import endpointslice
from svcproxy.frontend.edge.endpointslice import (
    CONDITIONS,
    _plain_ipv4_endpoint,
    decode_slice,
    read_endpoint_slice,
    validate_endpoint_slice,
)
from svcproxy.frontend.edge.limits import ObjectLimits
from tests.support.hostile import endpoint_slice

# An endpoint with every field the schema names, each set to a value of the plain shape.
EVERY_FIELD: dict[str, Any] = {
    "addresses": ["10.244.1.5"], "conditions": {"ready": True, "serving": True,
                                                "terminating": False},
    "nodeName": "node-a", "zone": "zone-a", "hostname": None, "hints": None,
    "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "u"}}
# Fields Kubernetes has that the schema does not name (the general path reads them).
OTHER_FIELDS = [("deprecatedTopology", {"a": "b"}), ("hints", {"forZones": [{"name": "z"}]}),
                ("hostname", "web-0"), ("somethingNew", 1)]


def _slice(ep: dict[str, Any]) -> dict[str, Any]:
    return dict(endpoint_slice(), endpoints=[ep])


def _general(obj: dict[str, Any]) -> tuple[Any, Any]:
    """The verdict and the slice read with the plain-shape check switched off."""
    with patch.object(endpointslice, "_plain_endpoints", return_value=None), \
            patch.object(endpointslice, "_plain_ipv4_endpoint", return_value=0):
        parsed, verdict = read_endpoint_slice(obj, seen_at=1.0)
    return (verdict.errors, verdict.warnings), parsed


def test_the_schema_names_the_fields_of_the_plain_shape() -> None:
    assert set(EVERY_FIELD) == set(endpointslice._Endpoint.__struct_fields__)
    assert CONDITIONS == ("ready", "serving", "terminating")


@pytest.mark.parametrize("field", sorted(EVERY_FIELD))
def test_each_field_of_the_schema_keeps_an_endpoint_on_both_fast_paths(field: str) -> None:
    """With the field alone (or all of them), the endpoint is plain to the rules and the
    slice's JSON takes the typed decode, which makes what validation and parse make."""
    for ep in ({"addresses": ["10.244.1.5"], field: EVERY_FIELD[field]}, EVERY_FIELD):
        obj = _slice(ep)
        assert _plain_ipv4_endpoint(ep, 253), ep
        parsed, verdict = read_endpoint_slice(obj, seen_at=1.0)
        assert verdict.ok and not verdict.warnings
        assert ((verdict.errors, verdict.warnings), parsed) == _general(obj)
        typed = decode_slice(json.dumps(obj).encode(), ObjectLimits(), seen_at=1.0)
        assert typed == parsed


@pytest.mark.parametrize("field, value", OTHER_FIELDS)
def test_a_field_the_schema_does_not_take_goes_the_general_path(field: str, value: Any) -> None:
    obj = _slice(dict(EVERY_FIELD, **{field: value}))
    assert not _plain_ipv4_endpoint(obj["endpoints"][0], 253)
    assert decode_slice(json.dumps(obj).encode(), ObjectLimits(), seen_at=1.0) is None
    verdict = validate_endpoint_slice(obj)
    assert verdict.ok, verdict.summary()
    assert (verdict.errors, verdict.warnings) == _general(obj)[0]


@pytest.mark.parametrize("key", CONDITIONS)
def test_each_condition_of_the_schema_is_checked_by_the_rules(key: str) -> None:
    """validateEndpoints reads the schema's conditions: a string where a boolean goes is
    refused at that condition's path, by the typed decode as by the rules."""
    obj = _slice(dict(EVERY_FIELD, conditions={key: "yes"}))
    verdict = validate_endpoint_slice(obj)
    assert [p.field for p in verdict.errors] == [f"endpoints[0].conditions.{key}"]
    assert decode_slice(json.dumps(obj).encode(), ObjectLimits(), seen_at=1.0) is None
