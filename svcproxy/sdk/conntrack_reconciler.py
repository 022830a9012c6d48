"""The conntrack reconciler: after syncs, delete the UDP/SCTP flows the state made stale.

Unlike a cleanup of the changes seen since start, it compares the whole table with the
whole state, so flows left behind while the backend was down are found too (as kube-proxy's
reconciler does). A flow towards a service IP:port or node port is stale when

* it was DNATed (reply source differs from the original destination) to an address that
  is not a serving endpoint of that service port any more, or
* it was not DNATed (the service had no endpoint: rejected or blackholed) and the service
  port now has serving endpoints.

Flows the per-change rules name (svcproxy.sdk.conntrack: a deleted service port, an
endpoint that stopped serving) are deleted too. The decision is pure (``stale_flows``);
the table is read and written over ctnetlink (svcproxy.sdk.conntrack_netlink).

A run dumps the whole table (0.3-0.8 s at 10,000 entries), so it is rate-limited as
kube-proxy's is by its sync rate: the first sync reconciles at once, in the sync (flows
stale from before the start go then); later syncs start a run on a thread of its own, at
most once per ``min_interval`` - max(--min-sync-period, 1 s), kube-proxy's default bound -
against the newest state then, so the next sync never waits for a whole dump.

The flows a sync's own changes name go in that sync, as kube-proxy deletes them at the end
of its sync: the kernel dumps only the entries towards the ports those changes touch, so
once a sync is over no packet of an existing flow still reaches an endpoint it removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol as TypingProtocol

from svcproxy.model import Protocol, ServicePortKey, ip_family
from svcproxy.sdk.backend import NodeState
from svcproxy.sdk.conntrack import (
    CLEANED_PROTOCOLS,
    ConntrackEntry,
    ConntrackFilter,
    matches,
    stale_conntrack_filters,
)
from svcproxy.sdk.conntrack_netlink import Ctnetlink, Flow

log = logging.getLogger(__name__)

# The least time between two runs, whatever --min-sync-period (kube-proxy's default of it).
MIN_INTERVAL = 1.0
# A dump towards one address and port still walks the kernel's whole hash table (12-16 ms
# here at 1,000 or 10,000 entries; reading every entry costs ~0.2 s at 10,000): past this
# many such dumps, one read of the whole table.
TARGETED_DUMPS = 8
PROTOCOL_NUMBERS = {Protocol.UDP: 17, Protocol.SCTP: 132}
_BY_NUMBER = {n: p for p, n in PROTOCOL_NUMBERS.items()}

Frontends = dict[tuple[int, str, int], frozenset[str]]
NodePorts = dict[tuple[int, int, int], frozenset[str]]


def frontends(state: NodeState) -> tuple[Frontends, NodePorts]:
    """(protocol, service IP, port) and (protocol, family, node port) -> serving endpoint
    IPs, for the UDP/SCTP service ports of ``state``."""
    by_ip: Frontends = {}
    by_node_port: NodePorts = {}
    for sps in state.services.values():
        svc = sps.service
        if svc.key.protocol not in CLEANED_PROTOCOLS:
            continue
        proto = PROTOCOL_NUMBERS[svc.key.protocol]
        serving = frozenset(ip for ip, ep in sps.endpoints.items() if ep.ready or ep.serving)
        for ip in (*svc.cluster_ips, *svc.external_ips, *svc.vip_ingress_ips()):
            key = (proto, ip, svc.port)
            by_ip[key] = by_ip.get(key, frozenset()) | serving
        if svc.node_port:
            for family in (4, 6):
                key2 = (proto, family, svc.node_port)
                by_node_port[key2] = by_node_port.get(key2, frozenset()) | serving
    return by_ip, by_node_port


def stale_flows(flows: Iterable[Flow], new: NodeState, old: NodeState | None = None
                ) -> list[Flow]:
    """The flows to delete (see the module docstring)."""
    by_ip, by_node_port = frontends(new)
    changed = _by_port(stale_conntrack_filters(old, new) if old is not None else [])
    stale = []
    for flow in flows:
        serving = by_ip.get((flow.protocol, flow.orig_dst, flow.orig_dport))
        if serving is None:
            serving = by_node_port.get((flow.protocol, flow.family, flow.orig_dport))
        dnat = flow.reply_src != flow.orig_dst
        if serving is not None and ((dnat and flow.reply_src not in serving)
                                    or (not dnat and serving)):
            stale.append(flow)
        elif _named(flow, changed):
            stale.append(flow)
    return stale


ByPort = dict[int, list[ConntrackFilter]]


def _by_port(filters: Iterable[ConntrackFilter]) -> ByPort:
    """``filters`` by the port they name (0: any port, as ``matches`` reads an empty one)."""
    out: ByPort = defaultdict(list)
    for f in filters:
        out[f.orig_dport].append(f)
    return dict(out)


def _named(flow: Flow, filters: ByPort) -> bool:
    """Whether a filter of the flow's port (or of any port) selects it."""
    named = filters.get(flow.orig_dport, [])
    if 0 in filters:
        named = [*named, *filters[0]]
    if not named:
        return False
    entry = ConntrackEntry(_BY_NUMBER[flow.protocol], flow.family, flow.orig_dst,
                           flow.orig_dport, flow.reply_src)
    return any(matches(f, entry) for f in named)


class Table(TypingProtocol):
    def dump(self, family: int, protocol: int, dport: int = 0, dst: str = ""
             ) -> list[Flow]: ...

    def delete(self, flows: Iterable[Flow]) -> int: ...


class ConntrackReconciler:
    """The after-sync hook; ``metrics`` (AgentMetrics) gets kube-proxy's reconciler metrics.
    ``runs`` counts the runs (each over every family)."""

    def __init__(self, table: Callable[[], Table] = Ctnetlink,
                 families: tuple[int, ...] = (4, 6), min_interval: float = MIN_INTERVAL) -> None:
        self._open = table
        self._table: Table | None = None
        self._families = families
        self.min_interval = min_interval
        self.metrics: object = None
        self.runs = 0
        self._lock = threading.Lock()  # guards the fields below
        self._running = False
        self._last_start: float | None = None
        # Per family, the state its last successful run reconciled: the next run also
        # deletes the flows the changes since then name (a deleted service port...).
        self._reconciled: dict[int, NodeState | None] = {}
        self._latest: NodeState | None = None  # the newest synced state, not yet reconciled
        self._timer: threading.Timer | None = None
        self._closed = False
        self._now_lock = threading.Lock()  # guards the sync's own table
        self._now_table: Table | None = None

    def after_sync(self, old: NodeState | None, new: NodeState,
                   changed: frozenset[ServicePortKey] | None = None) -> int:
        """On the first sync reconcile now; afterwards delete now the flows this sync's
        changes name (``changed``: the service ports that may differ, all when None) and
        start a whole run on its own thread as soon as the interval allows. Returns the
        number of entries deleted now."""
        with self._lock:
            if self._closed:
                return 0
            self._latest = new
            first = self._last_start is None
            if first:
                self._reconciled = dict.fromkeys(self._families, old)
                state = self._take()
            elif not self._running:
                self._schedule(max(0.0, self._remaining()))
        if first:
            return self._run(state)
        if old is None:
            return 0
        return self._delete_named(stale_conntrack_filters(old, new, changed))

    def _delete_named(self, filters: list[ConntrackFilter]) -> int:
        """Delete the flows ``filters`` name, dumping only the entries towards the
        addresses and ports they name (the whole table when they name many); a failure is
        logged and left to the next whole run."""
        mine = [f for f in filters if f.family in self._families]
        few = len({(f.family, f.protocol, f.orig_dport, f.orig_dst) for f in mine}) <= \
            TARGETED_DUMPS
        towards: dict[tuple[int, int, int, str], list[ConntrackFilter]] = defaultdict(list)
        for f in mine:
            where = (f.orig_dport, f.orig_dst) if few else (0, "")
            towards[(f.family, PROTOCOL_NUMBERS[f.protocol], *where)].append(f)
        deleted = 0
        with self._now_lock:
            for (family, protocol, port, dst), named in sorted(towards.items()):
                try:
                    if self._now_table is None:
                        self._now_table = self._open()
                    index = _by_port(named)
                    stale = [flow for flow in self._now_table.dump(family, protocol, port, dst)
                             if _named(flow, index)]
                    n = self._now_table.delete(stale) if stale else 0
                except OSError as err:
                    log.error("Deleting the conntrack entries a sync made stale (IPv%d) "
                              "failed: %s; the next reconciliation retries", family, err)
                    self._now_table = None
                    continue
                deleted += n
                record = getattr(self.metrics, "conntrack_deleted", None)
                if n and callable(record):
                    record(family, n)
        return deleted

    def close(self) -> None:
        """No more runs (the agent is stopping)."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()

    def _remaining(self) -> float:
        """Seconds until a run may start (caller holds the lock)."""
        if self._last_start is None:
            return 0.0
        return self._last_start + self.min_interval - time.monotonic()

    def _schedule(self, wait: float) -> None:
        """A run after ``wait`` seconds, unless one is scheduled (caller holds the lock)."""
        if self._timer is None:
            log.debug("Conntrack reconciliation in %.3fs (at most one run per %gs)",
                      wait, self.min_interval)
            self._timer = threading.Timer(wait, self._deferred)
            self._timer.daemon = True
            self._timer.start()

    def _take(self) -> NodeState:
        """Start a run over the newest state (caller holds the lock)."""
        state, self._latest = self._latest, None
        assert state is not None
        self._running = True
        self._last_start = time.monotonic()
        self.runs += 1
        return state

    def _deferred(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed or self._latest is None or self._running:
                return  # a running one schedules the next when it ends
            if self._remaining() > 0:
                self._schedule(self._remaining())
                return
            state = self._take()
        self._run(state)

    def _run(self, new: NodeState) -> int:
        """Reconcile every family; a failure is logged and retried at the next run."""
        deleted = 0
        try:
            for family in self._families:
                start = time.monotonic()
                try:
                    n = self._reconcile(family, self._reconciled.get(family), new)
                except OSError as err:
                    log.error("Conntrack reconciliation (IPv%d) failed: %s", family, err)
                    self._table = None
                    continue
                self._reconciled[family] = new
                deleted += n
                record = getattr(self.metrics, "conntrack_reconciled", None)
                if callable(record):
                    record(family, time.monotonic() - start, n)
        finally:
            with self._lock:
                self._running = False
                if self._latest is not None and not self._closed:
                    self._schedule(max(0.0, self._remaining()))  # a sync came meanwhile
        return deleted

    def _reconcile(self, family: int, old: NodeState | None, new: NodeState) -> int:
        if self._table is None:
            self._table = self._open()
        flows = [f for proto in (17, 132) for f in self._table.dump(family, proto)
                 if ip_family(f.orig_dst) == family]
        stale = stale_flows(flows, new, old)
        if not stale:
            return 0
        n = self._table.delete(stale)
        log.info("Deleted %d stale conntrack entries (IPv%d, of %d UDP/SCTP)", n, family,
                 len(flows))
        return n
