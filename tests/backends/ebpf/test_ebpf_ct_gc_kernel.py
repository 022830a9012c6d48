"""The GC pass's delete against a real LRU hash map (root, no namespace needed: the map
belongs to this process and goes with its fd): an entry is removed only while it holds
the value the pass judged; one a packet changed since stays, with the packet's value."""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterator
from contextlib import nullcontext

import pytest

from svcproxy.backends.ebpf import ct_gc_native, libbpf
from svcproxy.backends.ebpf.ct_gc import (
    CTS_REPLIED,
    CtTimeouts,
    gc_pass,
    read_raw,
    remove_unchanged,
)
from svcproxy.backends.ebpf.libbpf import Map
from svcproxy.backends.ebpf.packet_layout import CT_KEY, CT_VAL
from tests.backends.ebpf.test_ebpf_ct_gc import TCP, UDP, _flow, python_only
from tests.support.boot_clock import NS, clock_past

BPF_MAP_TYPE_LRU_HASH = 9

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="BPF maps need root")
HELPERS = [pytest.param("c", marks=pytest.mark.skipif(
               not ct_gc_native.available() and shutil.which("cc") is None,
               reason="no C compiler: the GC's helper cannot be built here")),
           "python"]


@pytest.fixture
def ct() -> Iterator[Map]:
    create = libbpf.lib().bpf_map_create
    create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                       ctypes.c_uint32, ctypes.c_void_p]
    create.restype = ctypes.c_int
    fd = libbpf.check(create(BPF_MAP_TYPE_LRU_HASH, b"test_ct", CT_KEY.size, CT_VAL.size,
                             1024, None), "create an LRU hash")
    try:
        yield Map("test_ct", fd, CT_KEY.size, CT_VAL.size)
    finally:
        os.close(fd)


def _key(i: int) -> bytes:
    return CT_KEY.pack(bytes((10, 0, 0, i)) + bytes(12), bytes(16), b"\0\1", b"\0\2", 6, 4,
                       0, 0)


def _value(last: int) -> bytes:
    return CT_VAL.pack(bytes(16), bytes(16), b"\0\3", b"\0\4", 0, 1, 1, last)


@pytest.mark.parametrize("helper", HELPERS)
def test_only_entries_still_as_judged_are_removed(ct: Map, helper: str) -> None:
    judged = {_key(i): _value(100) for i in range(1, 6)}
    ct.update_many(list(judged), list(judged.values()))
    touched = _value(200)  # a packet of flow 2 after the pass read the map
    ct.update(_key(2), touched)
    ct.delete(_key(3))  # flow 3 evicted (or ended) meanwhile
    if helper == "c":
        assert ct_gc_native.available(), "run python -m svcproxy.backends.ebpf.build"
        assert remove_unchanged(ct, judged) == 3
    else:
        with python_only():
            assert remove_unchanged(ct, judged) == 3
    keys, values = read_raw(ct)
    assert (keys, values) == (_key(2), touched), "flow 2 stays, with the packet's value"


@pytest.mark.parametrize("helper", HELPERS)
def test_a_pass_removes_the_expired_flows_and_keeps_the_live_ones(ct: Map, helper: str) -> None:
    now = clock_past(121)  # the oldest flow's age, since boot
    # Established, idle past every lifetime but close-wait's and its own; UDP, 5 s idle.
    live = {**_flow(1, TCP, CTS_REPLIED, now - 121 * NS), **_flow(2, UDP, 0, now - 5 * NS)}
    dead = {**_flow(3, TCP, 0, now - 61 * NS), **_flow(4, UDP, CTS_REPLIED, now - 121 * NS)}
    entries = {**live, **dead}
    ct.update_many(list(entries), list(entries.values()))
    with python_only() if helper == "python" else nullcontext():
        assert ct_gc_native.available() == (helper == "c")
        result = gc_pass(ct, CtTimeouts())
    assert (result.expired, result.flows) == (4, 2)
    keys, values = read_raw(ct)
    held = {keys[i:i + CT_KEY.size]: values[j:j + CT_VAL.size]
            for i, j in zip(range(0, len(keys), CT_KEY.size),
                            range(0, len(values), CT_VAL.size), strict=True)}
    assert held == live
