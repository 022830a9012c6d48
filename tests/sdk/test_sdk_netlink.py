"""svcproxy.sdk.netlink: the one reader and writer of netlink framing (the kernel clients
that use it are tested against real kernels in their own tests)."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.sdk import netlink

attributes = st.lists(st.tuples(st.integers(0, netlink.NLA_TYPE_MASK), st.binary(max_size=40)),
                      max_size=8)


@given(attributes, st.binary(max_size=12))
def test_attributes_read_back_as_written(pairs: list[tuple[int, bytes]], head: bytes) -> None:
    data = head + b"".join(netlink.attr(kind, payload) for kind, payload in pairs)
    assert list(netlink.iter_attrs(data, len(head))) == pairs
    assert netlink.attrs(data, len(head)) == dict(pairs)


@given(attributes)
def test_a_nested_attribute_is_flagged_and_read_without_its_flag(
        pairs: list[tuple[int, bytes]]) -> None:
    children = [netlink.attr(kind, payload) for kind, payload in pairs]
    data = netlink.nested(5, *children)
    assert struct.unpack_from("=H", data, 2)[0] == 5 | netlink.NLA_F_NESTED
    [(kind, inner)] = netlink.iter_attrs(data)
    assert kind == 5 and list(netlink.iter_attrs(inner)) == pairs


@given(attributes, st.integers(1, 200))
def test_a_truncated_buffer_yields_only_whole_attributes(pairs: list[tuple[int, bytes]],
                                                         cut: int) -> None:
    data = b"".join(netlink.attr(kind, payload) for kind, payload in pairs)
    seen = list(netlink.iter_attrs(data[:max(0, len(data) - cut)]))
    assert seen == pairs[:len(seen)]


def test_a_batch_of_acks_and_errors_splits_into_messages() -> None:
    buffer = b"".join(netlink.message(netlink.NLMSG_ERROR, 0, seq, struct.pack(
        "=i", -17 if seq else 0) + bytes(16)) for seq in range(3))
    seen = [(kind, seq, netlink.error_code(body))
            for kind, _flags, seq, body in netlink.messages(buffer)]
    assert seen == [(2, 0, 0), (2, 1, 17), (2, 2, 17)]


def test_a_malformed_header_ends_the_buffer() -> None:
    good = netlink.message(16, netlink.NLM_F_MULTI, 7, b"body")
    bad = struct.pack("=IHHII", 3, 16, 0, 8, 0)
    assert list(netlink.messages(good + bad + good)) == [(16, netlink.NLM_F_MULTI, 7, b"body")]
