"""The tc connection tracking's lifetimes and GC judgement, without a kernel: the
timeouts kube-proxy's flags give, the lifetime of each protocol and state, and which
entries a pass removes."""

from __future__ import annotations

import argparse
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.backends.ebpf import ct_gc_native
from svcproxy.backends.ebpf.ct_gc import (
    CTS_FIN_FWD,
    CTS_FIN_REV,
    CTS_REPLIED,
    CTS_RST,
    CtTimeouts,
    _forward_key_of,
    _reply_key_of,
    expired_entries,
)
from svcproxy.backends.ebpf.packet_cli import add_packet_arguments, ct_timeouts
from svcproxy.backends.ebpf.packet_layout import CT_FORWARD, CT_KEY, CT_REPLY, CT_VAL
from tests.support.boot_clock import NS

TCP, UDP = socket.IPPROTO_TCP, socket.IPPROTO_UDP


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_packet_arguments(parser)  # type: ignore[arg-type]
    return parser.parse_args(list(argv))


def test_flags_give_kube_proxys_defaults_and_zero_means_the_kernels() -> None:
    assert ct_timeouts(_args()) == CtTimeouts(tcp_syn=60, tcp_established=86400,
                                              tcp_close_wait=3600, tcp_fin=10, udp=30,
                                              udp_stream=120)
    tuned = ct_timeouts(_args("--conntrack-tcp-timeout-established", "2h",
                              "--conntrack-tcp-timeout-close-wait", "0",
                              "--conntrack-udp-timeout", "5s",
                              "--conntrack-udp-timeout-stream", "1m30s"))
    assert (tuned.tcp_established, tuned.tcp_close_wait, tuned.udp, tuned.udp_stream) == (
        7200, 60, 5, 90)


def test_lifetime_per_protocol_and_state() -> None:
    t = CtTimeouts()
    assert t.lifetime(TCP, 0) == 60, "a SYN not answered yet"
    assert t.lifetime(TCP, CTS_REPLIED) == 86400
    assert t.lifetime(TCP, CTS_REPLIED | CTS_FIN_FWD) == 3600
    assert t.lifetime(TCP, CTS_REPLIED | CTS_FIN_REV) == 3600
    assert t.lifetime(TCP, CTS_REPLIED | CTS_FIN_FWD | CTS_FIN_REV) == 10
    assert t.lifetime(TCP, CTS_REPLIED | CTS_RST) == 10
    assert t.lifetime(UDP, 0) == 30 and t.lifetime(UDP, CTS_REPLIED) == 120


def _flow(i: int, proto: int, state: int, last: int) -> dict[bytes, bytes]:
    client, svc = bytes((10, 1, 0, i)) + bytes(12), bytes((10, 96, 0, 1)) + bytes(12)
    ep, snat = bytes((10, 244, 0, i)) + bytes(12), bytes((192, 168, 0, 1)) + bytes(12)
    cport, nport, sport, eport = (b"\x9c\x40", (40000 + i).to_bytes(2, "big"), b"\x00\x50",
                                  b"\x1f\x90")
    fwd = CT_KEY.pack(client, svc, cport, sport, proto, 4, CT_FORWARD, 0)
    rep = CT_KEY.pack(ep, snat, eport, nport, proto, 4, CT_REPLY, 0)
    return {fwd: CT_VAL.pack(snat, ep, nport, eport, 1, state, 1, last),
            rep: CT_VAL.pack(svc, client, sport, cport, 1, 0, 0, last)}


def test_the_pairing_matches_the_programs_entries() -> None:
    (fwd, fval), (rep, rval) = _flow(1, TCP, 0, 0).items()
    assert _reply_key_of(fwd, fval) == rep and _forward_key_of(rep, rval) == fwd


def test_a_pass_removes_expired_flows_with_their_replies_and_keeps_live_ones() -> None:
    now = 10_000 * NS
    live = {**_flow(1, TCP, CTS_REPLIED, now - 3600 * NS),  # established, an hour idle
            **_flow(2, UDP, CTS_REPLIED, now - 100 * NS),
            **_flow(3, TCP, 0, now + NS)}  # touched after the clock was read
    dead = {**_flow(4, TCP, 0, now - 61 * NS), **_flow(5, UDP, 0, now - 31 * NS),
            **_flow(6, TCP, CTS_REPLIED | CTS_FIN_FWD | CTS_FIN_REV, now - 11 * NS)}
    # A reply whose forward entry is gone lives on its own time (the first lifetime).
    orphan_old = dict(list(_flow(7, UDP, 0, now - 31 * NS).items())[1:])
    orphan_new = dict(list(_flow(8, UDP, 0, now - 5 * NS).items())[1:])
    entries = {**live, **dead, **orphan_old, **orphan_new}
    removed, flows = expired_entries(entries, CtTimeouts(), now)
    assert set(removed) == set(dead) | set(orphan_old)
    assert flows == 3
    # A reply entry whose flow's forward entry now leads elsewhere is judged alone.
    (fwd, fval), (rep, rval) = _flow(9, TCP, CTS_REPLIED, now).items()
    moved = CT_VAL.pack(*CT_VAL.unpack(fval)[:2], b"\x00\x01", *CT_VAL.unpack(fval)[3:])
    stale = CT_VAL.pack(*CT_VAL.unpack(rval)[:-1], now - 61 * NS)
    removed, _ = expired_entries({fwd: moved, rep: stale}, CtTimeouts(), now)
    assert removed == [rep]


def test_kube_proxys_conntrack_section_sets_the_lifetimes() -> None:
    """``svcproxy kube-proxy`` with a KubeProxyConfiguration: conntrack.* become the ebpf
    backend's --conntrack-* values, as kube-proxy applies them to nf_conntrack."""
    from svcproxy.backends.ebpf import cli as ebpf_cli
    from svcproxy.kubeproxy.cli import backend_namespace
    from svcproxy.kubeproxy.config import load_config
    from svcproxy.sdk.agent import add_agent_arguments

    config = load_config("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                         "kind: KubeProxyConfiguration\nconntrack:\n"
                         "  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 30m\n"
                         "  udpTimeout: 5s\n  udpStreamTimeout: 1m\n")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    ebpf_cli.add_arguments(parser)  # type: ignore[arg-type]
    ns = backend_namespace(config, "ebpf", parser, ["--node-ip", "192.0.2.1"])
    got = ct_timeouts(ns)
    assert (got.tcp_established, got.tcp_close_wait, got.udp, got.udp_stream) == (
        7200, 1800, 5, 60)


def _judged_one_by_one(entries: dict[bytes, bytes], timeouts: CtTimeouts,
                       now: int) -> tuple[set[bytes], int]:
    """The pass's rule entry by entry, as the sentences of ``expired`` say it."""
    def idle_past(value: bytes, lifetime: int) -> bool:
        return CT_VAL.unpack(value)[-1] < now - lifetime * NS

    alive = {k for k, v in entries.items() if k[38] == CT_FORWARD
             and not idle_past(v, timeouts.lifetime(k[36], v[37]))}
    dead = {k for k in entries if k[38] == CT_FORWARD and k not in alive}
    for key, value in entries.items():
        if key[38] == CT_FORWARD:
            continue
        forward = _forward_key_of(key, value)
        if forward in entries and _reply_key_of(forward, entries[forward]) == key:
            if forward not in alive:
                dead.add(key)
        elif idle_past(value, timeouts.lifetime(key[36], 0)):
            dead.add(key)
    return dead, len(alive)


_AGES = st.sampled_from([0, 5, 11, 31, 61, 121, 1801, 3601, 86401]).map(lambda s: s * NS)
_STATES = st.sampled_from([0, CTS_REPLIED, CTS_REPLIED | CTS_FIN_FWD,
                           CTS_REPLIED | CTS_FIN_FWD | CTS_FIN_REV, CTS_RST])


@contextmanager
def python_only() -> Iterator[None]:
    """The GC without its C helper (as on a node where it was not built)."""
    real = ct_gc_native.LIBRARY
    ct_gc_native.LIBRARY = Path("/nonexistent/libsvcproxy_ct_gc.so")
    ct_gc_native._library.cache_clear()
    try:
        yield
    finally:
        ct_gc_native.LIBRARY = real
        ct_gc_native._library.cache_clear()


_MIXES = st.lists(st.tuples(st.sampled_from([TCP, UDP]), _STATES, _AGES, _AGES,
                            st.sampled_from(["pair", "forward", "reply", "elsewhere"])),
                  max_size=40)


def _check_judgement(flows: list) -> None:
    """Any mix of flows (pairs, forward entries alone, replies alone, a forward entry
    that now leads elsewhere), each direction with its own age: the pass removes exactly
    what the rule says, entry by entry."""
    now = 100_000 * NS
    entries: dict[bytes, bytes] = {}
    for i, (proto, state, fwd_age, rep_age, shape) in enumerate(flows):
        (fwd, fval), (rep, rval) = _flow(i, proto, state, now - fwd_age).items()
        rval = CT_VAL.pack(*CT_VAL.unpack(rval)[:-1], now - rep_age)
        if shape == "elsewhere":
            fval = CT_VAL.pack(*CT_VAL.unpack(fval)[:2], b"\x00\x01", *CT_VAL.unpack(fval)[3:])
        if shape != "reply":
            entries[fwd] = fval
        if shape != "forward":
            entries[rep] = rval
    removed, kept = expired_entries(entries, CtTimeouts(), now)
    assert len(removed) == len(set(removed))
    assert (set(removed), kept) == _judged_one_by_one(entries, CtTimeouts(), now)


@pytest.mark.skipif(not ct_gc_native.available() and shutil.which("cc") is None,
                    reason="no C compiler: the GC's helper cannot be built here")
@settings(max_examples=200, deadline=None)
@given(_MIXES)
def test_the_c_judgement_is_the_rule_entry_by_entry(flows: list) -> None:
    assert ct_gc_native.available(), "run python -m svcproxy.backends.ebpf.build"
    _check_judgement(flows)


@settings(max_examples=200, deadline=None)
@given(_MIXES)
def test_the_python_judgement_is_the_rule_entry_by_entry(flows: list) -> None:
    with python_only():
        assert not ct_gc_native.available()
        _check_judgement(flows)
