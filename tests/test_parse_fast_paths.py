"""The parser's fast paths for the common shapes give what the general path gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.frontend.sources.kubevalidation import (
    _FORBIDDEN_IPV4,
    CANONICAL_IPV4,
    _ipv4_problem,
)
from svcproxy.frontend.store.objects import canonical_ip, parse_endpoint_slice
from svcproxy.model import normalize_ip

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
