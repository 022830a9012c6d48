"""Connection tracking timeouts and garbage collection of the tc packet path.

The program (``bpf/ct.h``) treats a flow idle past its state's lifetime as gone: its
next packet is a new flow with a fresh endpoint choice. This module gives the program
its lifetimes (``spp_ct_timeouts``, from the ``--conntrack-*`` flags as kube-proxy's
``conntrack.*`` settings; where kube-proxy has none, Cilium's defaults) and removes
expired entries in a userspace pass, so the LRU map holds live flows only.

The pass never removes a live flow: it reads the clock before the map (an entry a
packet touches meanwhile looks younger, not older), judges a reply entry by its flow's
forward entry (every reply refreshes it), and deletes an entry only if a fresh lookup
still returns the value it judged (a packet since has changed its time).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import logging
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress
from typing import TYPE_CHECKING

from svcproxy.sdk import parse_duration

from . import ct_gc_native, libbpf
from .libbpf import BpfError, Map
from .packet_layout import CT_FORWARD, CT_KEY, CT_TIMEOUTS, CT_TIMEOUTS_SECTION, CT_VAL

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

TCP, UDP = 6, 17
NOEXIST = 1  # BPF_NOEXIST
CTS_REPLIED, CTS_FIN_FWD, CTS_FIN_REV, CTS_RST = 1, 2, 4, 8
_BOTH_FINS = CTS_FIN_FWD | CTS_FIN_REV

# What 0 ("leave as-is") of a --conntrack-* flag means here: nf_conntrack's own default.
KERNEL_DEFAULTS = {"tcp_established": 432000, "tcp_close_wait": 60, "udp": 30,
                   "udp_stream": 120}
CILIUM_TCP_SYN = 60  # bpf-ct-timeout-regular-tcp-syn
CILIUM_TCP_FIN = 10  # bpf-ct-timeout-regular-tcp-fin


MIN_INTERVAL, MAX_INTERVAL = 1.0, 7 * 86400.0  # --ebpf-ct-gc-interval: 1s to 168h, or 0
_INTERVALS = "a duration from 1s to 168h0m0s (e.g. 30s, 1m, 10m), or 0 for no pass"


def gc_interval(text: str) -> float:
    """``--ebpf-ct-gc-interval``'s argparse type: seconds between passes (0: never, the
    LRU alone makes room). Shorter than 1s would spin a core (a pass over 100,000 flows
    takes a second of CPU); longer than a week outlasts every lifetime."""
    try:
        value = parse_duration(text)
    except ValueError:
        value = -1.0
    if value != 0 and not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"{text!r} is not {_INTERVALS}")
    return value


@dataclass(frozen=True, slots=True)
class CtTimeouts:
    """Idle lifetimes in seconds per protocol and state."""

    tcp_syn: int = CILIUM_TCP_SYN
    tcp_established: int = 86400
    tcp_close_wait: int = 3600
    tcp_fin: int = CILIUM_TCP_FIN
    udp: int = KERNEL_DEFAULTS["udp"]
    udp_stream: int = KERNEL_DEFAULTS["udp_stream"]

    @classmethod
    def of(cls, established: float, close_wait: float, udp: float,
           udp_stream: float) -> CtTimeouts:
        """From the --conntrack-* values (seconds; 0: nf_conntrack's default)."""
        given = {"tcp_established": established, "tcp_close_wait": close_wait, "udp": udp,
                 "udp_stream": udp_stream}
        return cls(**{name: max(1, int(round(value))) if value else KERNEL_DEFAULTS[name]
                      for name, value in given.items()})

    def pack(self) -> bytes:
        return CT_TIMEOUTS.pack(self.tcp_syn, self.tcp_established, self.tcp_close_wait,
                                self.tcp_fin, self.udp, self.udp_stream)

    def lifetime(self, proto: int, state: int) -> int:
        """Seconds a flow in ``state`` may stay idle (ct_lifetime in ct.h)."""
        if proto == TCP:
            if state & CTS_RST or state & _BOTH_FINS == _BOTH_FINS:
                return self.tcp_fin
            if state & _BOTH_FINS:
                return self.tcp_close_wait
            return self.tcp_established if state & CTS_REPLIED else self.tcp_syn
        return self.udp_stream if state & CTS_REPLIED else self.udp


def set_timeouts(obj: int, timeouts: CtTimeouts) -> None:
    """Write ``timeouts`` into the opened object's ``ct_timeouts`` (before it is loaded:
    the verifier sees constants, and no packet ever sees other values)."""
    lib = libbpf.lib()
    lib.bpf_map__initial_value.restype = ctypes.c_void_p
    lib.bpf_map__initial_value.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    section = libbpf.check_ptr(
        lib.bpf_object__find_map_by_name(obj, CT_TIMEOUTS_SECTION.encode()), CT_TIMEOUTS_SECTION)
    size = ctypes.c_size_t(0)
    data = libbpf.check_ptr(lib.bpf_map__initial_value(section, ctypes.byref(size)),
                            f"{CT_TIMEOUTS_SECTION} value")
    if size.value < CT_TIMEOUTS.size:
        raise ValueError(f"{CT_TIMEOUTS_SECTION} holds {size.value} bytes, not a ct_timeouts")
    ctypes.memmove(data, timeouts.pack(), CT_TIMEOUTS.size)


@dataclass(frozen=True, slots=True)
class GcResult:
    """One pass: flows (forward entries) kept, entries removed, its duration."""

    flows: int
    expired: int
    seconds: float


def _reply_key_of(key: bytes, value: bytes) -> bytes:
    """The reply entry a forward entry's rewrite leads to (byte slices of CT_KEY/CT_VAL:
    this runs for every entry of the map)."""
    return value[16:32] + value[:16] + value[34:36] + value[32:34] + key[36:38] + b"\x01\x00"


def _forward_key_of(key: bytes, value: bytes) -> bytes:
    """The forward entry of the flow a reply entry belongs to (its rewrite, reversed)."""
    return value[16:32] + value[:16] + value[34:36] + value[32:34] + key[36:38] + b"\x00\x00"


def expired_entries(entries: dict[bytes, bytes], timeouts: CtTimeouts,
                    now_ns: int) -> tuple[list[bytes], int]:
    """``expired`` of the entries of a dict (pure)."""
    return expired(b"".join(entries), b"".join(entries.values()), timeouts, now_ns)


def expired(keys: bytes, values: bytes, timeouts: CtTimeouts,
            now_ns: int) -> tuple[list[bytes], int]:
    """The keys to remove among the entries ``keys`` and ``values`` hold end to end (as
    read at ``now_ns``) and how many flows stay (pure). A forward entry expires when idle
    past its state's lifetime; a reply entry with its flow's forward entry (which every
    reply refreshes), or, when that entry is gone or now leads elsewhere, when idle past
    its protocol's first lifetime."""
    key_list = _split(CT_KEY.size, len(keys) // CT_KEY.size).unpack(keys)
    rows, flows = expired_rows(keys, values, timeouts, now_ns)
    return [key_list[row] for row in rows], flows


def expired_rows(keys: bytes, values: bytes, timeouts: CtTimeouts,
                 now_ns: int) -> tuple[list[int], int]:
    """``expired`` as the entries' row numbers: judged by the C helper
    (``ct_gc_native``) when it is built, else by ``_expired_rows``, the same rule."""
    ks, vs = CT_KEY.size, CT_VAL.size
    if len(keys) < ks:
        return [], 0
    protos, states = keys[36::ks], values[37::vs]
    limits = {(proto, state): now_ns - timeouts.lifetime(proto, state) * 1_000_000_000
              for proto in set(protos) for state in {0, *states}}
    found = ct_gc_native.expired_rows(keys, values, limits)
    return found if found is not None else _expired_rows(keys, values, limits)


def _expired_rows(keys: bytes, values: bytes,
                  limits: dict[tuple[int, int], int]) -> tuple[list[int], int]:
    """``expired_rows`` in Python, ``limits[proto, state]`` the last_ns below which an
    entry is idle past its lifetime.

    Each field is taken for all entries at once by strided slices, the entries of one
    direction by ``compress`` (C loops); what is left per entry is a comparison and, for
    a reply, two lookups."""
    ks, vs = CT_KEY.size, CT_VAL.size
    n = len(keys) // ks
    key_list = _split(ks, n).unpack(keys)
    other = _split(ks, n).unpack(_other_keys(keys, values, n))
    row_of = dict(zip(key_list, range(n), strict=True))
    lasts = memoryview(values).cast("Q")[_LAST_WORD::vs // 8]
    protos, states = keys[36::ks], values[37::vs]
    forward = keys[38::ks].translate(_IS_FORWARD)
    reply = forward.translate(_FLIP)
    alive: set[int] = set()
    dead: list[int] = []
    for row, proto, state, last in zip(compress(range(n), forward), compress(protos, forward),
                                       compress(states, forward), compress(lasts, forward),
                                       strict=True):
        (dead.append if last < limits[proto, state] else alive.add)(row)
    for row, proto, last, flow in zip(compress(range(n), reply), compress(protos, reply),
                                      compress(lasts, reply), compress(other, reply),
                                      strict=True):
        owner = row_of.get(flow)
        if owner is not None and other[owner] == key_list[row]:  # its flow leads back here
            if owner not in alive:
                dead.append(row)
        elif last < limits[proto, 0]:
            dead.append(row)
    return dead, len(alive)


_LAST_WORD = CT_VAL.size // 8 - 1  # last_ns, the value's last u64
_FLIP = bytes.maketrans(b"\x00\x01", b"\x01\x00")
_IS_FORWARD = bytes([1 if i == CT_FORWARD else 0 for i in range(256)])


def _other_keys(keys: bytes, values: bytes, n: int) -> bytes:
    """For each entry, the key of its flow's other direction, end to end: where its
    rewrite leads (addresses and ports of the value swapped, protocol and family of the
    key, the direction flipped), built a column of words at a time."""
    ks, vs = CT_KEY.size, CT_VAL.size
    out = bytearray(ks * n)
    words, value_words = memoryview(out).cast("I"), memoryview(values).cast("I")
    for to, frm in ((0, 4), (4, 0)):  # saddr <- the value's daddr, daddr <- its saddr
        for w in range(4):
            words[to + w::ks // 4] = value_words[frm + w::vs // 4]
    halves, value_halves = memoryview(out).cast("H"), memoryview(values).cast("H")
    halves[16::ks // 2], halves[17::ks // 2] = value_halves[17::vs // 2], value_halves[16::vs // 2]
    out[36::ks], out[37::ks] = keys[36::ks], keys[37::ks]
    out[38::ks] = keys[38::ks].translate(_FLIP)
    return bytes(out)


@lru_cache(maxsize=8)
def _split(size: int, count: int) -> struct.Struct:
    """``count`` strings of ``size`` bytes."""
    return struct.Struct(f"{size}s" * count)


def read_raw(ct: Map, chunk: int = 8192) -> tuple[bytes, bytes]:
    """Every entry of ``ct``: its keys and its values end to end, one
    BPF_MAP_LOOKUP_BATCH call per ``chunk`` entries."""
    lib = libbpf.lib()
    kbuf = ctypes.create_string_buffer(ct.key_size * chunk)
    vbuf = ctypes.create_string_buffer(ct.value_size * chunk)
    token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)
    keys: list[bytes] = []
    values: list[bytes] = []
    first = True
    while True:
        count = ctypes.c_uint32(chunk)
        result = lib.bpf_map_lookup_batch(
            ct.fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
            kbuf, vbuf, ctypes.byref(count), None)
        if result < 0 and result != -errno.ENOENT:
            libbpf.check(result, f"read {ct.name}")
        keys.append(kbuf.raw[:count.value * ct.key_size])
        values.append(vbuf.raw[:count.value * ct.value_size])
        if result == -errno.ENOENT:
            return b"".join(keys), b"".join(values)
        token_in.value = token_out.value
        first = False


@lru_cache(maxsize=1)
def _lookup_and_delete() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """libbpf's bpf_map_lookup_and_delete_elem (hash maps: Linux 5.14)."""
    take = libbpf.lib().bpf_map_lookup_and_delete_elem
    take.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    take.restype = ctypes.c_int
    return take


def remove_unchanged(ct: Map, judged: dict[bytes, bytes]) -> int:
    """Delete each entry of ``judged`` whose value is still the one judged; returns how
    many. One atomic BPF_MAP_LOOKUP_AND_DELETE_ELEM each: an entry deleted held exactly
    the value judged; one a packet changed since is put back at once (unless the program
    wrote it again first), so a flow a packet revived stays."""
    done = ct_gc_native.remove_unchanged(ct.fd, b"".join(judged), b"".join(judged.values()))
    if done is not None:
        return done
    lib, fd, take = libbpf.lib(), ct.fd, _lookup_and_delete()
    buf = ctypes.create_string_buffer(ct.value_size)
    removed = 0
    for key, value in judged.items():
        if take(fd, key, buf) != 0:
            continue  # gone already (the LRU, or the program)
        if buf.raw == value:
            removed += 1
        else:
            lib.bpf_map_update_elem(fd, key, buf, NOEXIST)
    return removed


def gc_pass(ct: Map, timeouts: CtTimeouts) -> GcResult:
    """Remove the expired entries of ``ct``; an entry a packet touched since it was read
    is kept (its value differs)."""
    started = time.monotonic()
    now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # bpf_ktime_get_ns's clock
    keys, values = read_raw(ct)
    dead, flows = expired_rows(keys, values, timeouts, now_ns)
    removed = ct_gc_native.remove_unchanged(ct.fd, keys, values, dead)
    if removed is None:
        n = len(keys) // ct.key_size
        key_list = _split(ct.key_size, n).unpack(keys) if n else ()
        value_list = _split(ct.value_size, n).unpack(values) if n else ()
        removed = remove_unchanged(ct, {key_list[row]: value_list[row] for row in dead})
    return GcResult(flows, removed, time.monotonic() - started)


class CtGc:
    """Runs ``gc_pass`` every ``interval`` seconds in a thread; counts the passes."""

    def __init__(self, ct: Map, timeouts: CtTimeouts, interval: float) -> None:
        self.ct = ct
        self.timeouts = timeouts
        self.interval = interval
        self.runs = 0
        self.expired = 0
        self.last: GcResult | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> GcResult:
        with self._lock:
            result = gc_pass(self.ct, self.timeouts)
            self.runs += 1
            self.expired += result.expired
            self.last = result
        if result.expired:
            log.debug("CT GC: %d expired entries removed, %d flows kept (%.3f s)",
                      result.expired, result.flows, result.seconds)
        return result

    def start(self) -> CtGc:
        if self.interval > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ct-gc", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except BpfError as err:
                log.warning("CT GC pass failed: %s", err)

    def stop(self) -> None:
        """Stop the thread (before the map's fd is closed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def metrics(self) -> Iterator[Metric]:
        """svcproxy_ebpf_tc_ct_gc_runs_total, _ct_gc_expired_entries_total and
        svcproxy_ebpf_tc_ct_flows (at the last pass)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        runs = CounterMetricFamily("svcproxy_ebpf_tc_ct_gc_runs",
                                   "Garbage collection passes over the tc connection tracking "
                                   "map")
        runs.add_metric([], self.runs)
        expired = CounterMetricFamily("svcproxy_ebpf_tc_ct_gc_expired_entries",
                                      "Connection tracking entries removed as expired")
        expired.add_metric([], self.expired)
        flows = GaugeMetricFamily("svcproxy_ebpf_tc_ct_flows",
                                  "Flows tracked by the tc packet path at the last GC pass")
        flows.add_metric([], self.last.flows if self.last else 0)
        yield runs
        yield expired
        yield flows
