"""The parser's fast paths for the common shapes give what the general path gives."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest.mock import patch

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from svcproxy.frontend.computation.compute import merge_endpoints
from svcproxy.frontend.sources import kubevalidation
from svcproxy.frontend.sources.kubevalidation import (
    _FORBIDDEN_IPV4,
    CANONICAL_IPV4,
    ObjectLimits,
    _ipv4_problem,
    _plain_ipv4_endpoint,
    _walk,
    validate_endpoint_slice,
)
from svcproxy.frontend.store.objects import SvcPort, canonical_ip, parse_endpoint_slice
from svcproxy.model import Protocol, normalize_ip
from tests.hostile import endpoint_slice, spoiled

OCTET = st.one_of(st.integers(0, 300).map(str), st.sampled_from(["00", "01", "007", "256", ""]))
IPV4ISH = st.lists(OCTET, min_size=3, max_size=5).map(".".join)
TEXT = st.one_of(IPV4ISH, st.text(max_size=20), st.sampled_from(
    ["::1", "fd00::01", "1.2.3.4 ", " 1.2.3.4", "1.2.3.4\n", "١.٢.٣.٤", "::ffff:1.2.3.4"]))


@given(TEXT)
def test_canonical_ip_is_normalize_ip(text: str) -> None:
    assert canonical_ip(text) == normalize_ip(text)


FLAG = st.one_of(st.none(), st.booleans())
CONDITIONS = st.fixed_dictionaries({}, optional={"ready": FLAG, "serving": FLAG,
                                                 "terminating": FLAG})
ENDPOINT = st.fixed_dictionaries(
    {"addresses": st.lists(IPV4ISH, min_size=1, max_size=2), "conditions": CONDITIONS},
    optional={"nodeName": st.sampled_from(["", "n1", "node-b"]),
              "zone": st.sampled_from(["", "z1"])})


def _slice(endpoints: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "s-a", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "s"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}


@given(st.lists(ENDPOINT, max_size=4))
def test_plain_endpoints_parse_as_the_general_path_does(endpoints: list[dict[str, Any]]) -> None:
    # Empty hints mean no hints, but take the general path.
    general = [dict(ep, hints={}) for ep in endpoints]
    try:
        fast = parse_endpoint_slice(_slice(endpoints), seen_at=1.0)
    except ValueError as err:
        fast_error: str | None = str(err)
    else:
        fast_error = None
    try:
        slow = parse_endpoint_slice(_slice(general), seen_at=1.0)
    except ValueError as err:
        assert fast_error is not None and fast_error == str(err)
    else:
        assert fast_error is None and fast == slow


@given(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(
    [0, 0x7F000001, 0x7FFFFFFF, 0xA9FE0001, 0xA9FF0000, 0xE0000001, 0xE0000100, 0x80000000])))
def test_forbidden_canonical_ipv4_by_prefix_is_the_rule(n: int) -> None:
    text = ".".join(str(n >> shift & 255) for shift in (24, 16, 8, 0))
    assert CANONICAL_IPV4.fullmatch(text)
    assert text.startswith(_FORBIDDEN_IPV4) == (_ipv4_problem(n) is not None)


# A plain endpoint as large as the plain shape allows, with a targetRef.
WIDE_ENDPOINT = {"addresses": ["255.255.255.254", "100.100.100.100"],
                 "conditions": {"ready": True, "serving": True, "terminating": False},
                 "nodeName": "n" * 253, "zone": "z" * 63, "hostname": None, "hints": None,
                 "targetRef": {"kind": "Pod", "namespace": "ns", "name": "web-0", "uid": "u"}}
PLAIN_SLICE = dict(endpoint_slice(ips=("10.244.1.5", "10.244.1.6")),
                   endpoints=[WIDE_ENDPOINT, endpoint_slice()["endpoints"][0]])
LIMITS = st.sampled_from([
    ObjectLimits(), ObjectLimits(max_object_bytes=1300), ObjectLimits(max_object_bytes=900),
    ObjectLimits(max_object_bytes=1300, max_depth=3), ObjectLimits(max_depth=2),
    ObjectLimits(max_name_length=5)])


def _walked(value: Any) -> int:
    budget = [10**9]
    _walk(value, 2, budget, ObjectLimits())
    return 10**9 - budget[0]


@settings(max_examples=300, deadline=None)
@given(spoiled(WIDE_ENDPOINT))
@example(dict(WIDE_ENDPOINT, conditions={"ready": True, "x" * 5000: True}))
@example(dict(WIDE_ENDPOINT, deprecatedTopology={"a": "b" * 5000}))
@example(dict(WIDE_ENDPOINT, targetRef={"kind": "Pod", "x": {"y": "z" * 5000}}))
@example(dict(WIDE_ENDPOINT, targetRef={"kind": "Pod", "x": "z" * 5000}))
def test_a_plain_endpoints_size_bound_is_never_below_the_walks_count(ep: Any) -> None:
    bound = _plain_ipv4_endpoint(ep, 253)
    assert not bound or bound >= _walked(ep)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spoiled(PLAIN_SLICE), LIMITS)
def test_a_slice_of_plain_endpoints_gets_the_general_verdict(obj: Any,
                                                             limits: ObjectLimits) -> None:
    fast = validate_endpoint_slice(obj, limits)
    with patch.object(kubevalidation, "_plain_endpoints", return_value=None), \
            patch.object(kubevalidation, "_plain_ipv4_endpoint", return_value=0):
        general = validate_endpoint_slice(obj, limits)
    assert (fast.errors, fast.warnings) == (general.errors, general.warnings)


@given(st.lists(ENDPOINT, max_size=4))
def test_merged_endpoints_are_whole_dataclasses(endpoints: list[dict[str, Any]]) -> None:
    try:
        parsed = parse_endpoint_slice(_slice(endpoints), seen_at=1.0)
    except ValueError:
        return
    port = SvcPort("p", Protocol.TCP, 80, 0, "80")
    for ep in merge_endpoints(port, [parsed]):
        same = replace(ep)  # the keyword __init__, from every field
        assert ep == same and hash(ep) == hash(same) and repr(ep) == repr(same)

