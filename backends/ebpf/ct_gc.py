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

import ctypes
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import libbpf
from .libbpf import BpfError, Map
from .packet_layout import CT_FORWARD, CT_TIMEOUTS, CT_TIMEOUTS_SECTION

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

TCP, UDP = 6, 17
CTS_REPLIED, CTS_FIN_FWD, CTS_FIN_REV, CTS_RST = 1, 2, 4, 8
_BOTH_FINS = CTS_FIN_FWD | CTS_FIN_REV

# What 0 ("leave as-is") of a --conntrack-* flag means here: nf_conntrack's own default.
KERNEL_DEFAULTS = {"tcp_established": 432000, "tcp_close_wait": 60, "udp": 30,
                   "udp_stream": 120}
CILIUM_TCP_SYN = 60  # bpf-ct-timeout-regular-tcp-syn
CILIUM_TCP_FIN = 10  # bpf-ct-timeout-regular-tcp-fin


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
    """The keys to remove from ``entries`` (as read at ``now_ns``) and how many flows
    stay (pure). A forward entry expires when idle past its state's lifetime; a reply
    entry with its flow's forward entry (which every reply refreshes), or, when that
    entry is gone or now leads elsewhere, when idle past its protocol's first lifetime."""
    limits: dict[tuple[int, int], int] = {}
    dead: list[bytes] = []
    alive_forward: set[bytes] = set()
    replies: list[tuple[bytes, bytes]] = []
    for key, value in entries.items():
        if key[38] != CT_FORWARD:
            replies.append((key, value))
            continue
        kind = (key[36], value[37])
        limit = limits.get(kind)
        if limit is None:
            limit = limits[kind] = now_ns - timeouts.lifetime(*kind) * 1_000_000_000
        if int.from_bytes(value[48:56], "little") < limit:
            dead.append(key)
        else:
            alive_forward.add(key)
    for key, value in replies:
        forward = _forward_key_of(key, value)
        fvalue = entries.get(forward)
        if fvalue is not None and _reply_key_of(forward, fvalue) == key:
            if forward not in alive_forward:
                dead.append(key)
            continue
        last = int.from_bytes(value[48:56], "little")
        if now_ns - last > timeouts.lifetime(key[36], 0) * 1_000_000_000:
            dead.append(key)
    return dead, len(alive_forward)


def gc_pass(ct: Map, timeouts: CtTimeouts) -> GcResult:
    """Remove the expired entries of ``ct``; an entry a packet touched since it was read
    is kept (its value differs)."""
    started = time.monotonic()
    now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # bpf_ktime_get_ns's clock
    entries = ct.read_all()
    dead, flows = expired_entries(entries, timeouts, now_ns)
    lib, fd = libbpf.lib(), ct.fd
    lookup, delete = lib.bpf_map_lookup_elem, lib.bpf_map_delete_elem
    buf = ctypes.create_string_buffer(ct.value_size)
    removed = 0
    for key in dead:  # each judged again just before its delete: microseconds apart
        if lookup(fd, key, buf) == 0 and buf.raw == entries[key] and delete(fd, key) == 0:
            removed += 1
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
