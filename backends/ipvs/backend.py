"""The IPVS backend: node state -> virtual servers, kube-ipvs0 addresses, ipsets, rules.

Built as any backend on the SDK is (``StagedBackend``): ``render`` turns one service
port into its ``PortPlan`` (pure), ``diff`` (the SDK's) compares the plans with the
applied ones, which the SDK tracks, and ``apply`` programs the difference. A rebuild
(first sync, a full sync after a reconnect or a failure, a new node or node context,
and a periodic resync once an hour) reads the IPVS services and the addresses on
kube-ipvs0 back from the kernel and rewrites every ipset and the fixed iptables rules;
otherwise, periodic resyncs included, only the service ports whose record changed are
rendered and only their difference is sent (a resync with nothing changed sends
nothing, so a change never waits behind a rewrite). Every periodic resync also reads the
kernel back (``find_drift``: virtual and real servers, kube-ipvs0's addresses, local
routes, our ipsets and rules) and writes again only what someone else changed. Draining
real servers are deleted by a small background check once their connections are gone
(or after the bound).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from svcproxy.backends.ipvs import apply, genl, ipsets, rtnl
from svcproxy.backends.ipvs import names as N
from svcproxy.backends.ipvs import rules as R
from svcproxy.backends.ipvs.desired import Desired, TouchedObjects
from svcproxy.backends.ipvs.diff import (
    IpvsDelta,
    Kernel,
    diff_members,
    diff_servers,
    reap,
    reap_requests,
)
from svcproxy.backends.ipvs.drift import compare, in_our_spelling, owners, parse_ipset_save
from svcproxy.backends.ipvs.genl import ServiceId
from svcproxy.backends.ipvs.names import is_our_fwmark
from svcproxy.backends.ipvs.netlink import (
    NETLINK_ROUTE,
    Failure,
    IpvsNetlink,
    NetlinkBatch,
    Request,
)
from svcproxy.backends.ipvs.options import IpvsOptions
from svcproxy.backends.ipvs.render import PortPlan, RenderContext, render_port
from svcproxy.sdk import (
    IPTABLES_MODES,
    Changes,
    Delta,
    Drift,
    NodeConfig,
    NodeContext,
    NodeInfo,
    NodeState,
    ProxyMode,
    Refusals,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
    normalize_cidr,
    resolve_context,
)

log = logging.getLogger(__name__)

IGNORE_ADDR_GONE = frozenset({99, 2, 3, 19})  # EADDRNOTAVAIL, ENOENT, ESRCH, ENODEV


MAX_ROUNDS = 3  # syncs again without the refused service ports at most this many times


class SyncError(RuntimeError):
    """Some kernel requests failed; the message lists them (``failures`` has them all)."""

    def __init__(self, message: str, failures: Iterable[Failure] = ()) -> None:
        super().__init__(message)
        self.failures = tuple(failures)


def _raise_failures(failures: list[Failure]) -> None:
    if failures:
        shown = "; ".join(str(f) for f in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        raise SyncError(f"{len(failures)} IPVS/netlink request(s) failed: {shown}{more}",
                        failures)


_NOTHING = object()


class IpvsBackend(StagedBackend[PortPlan]):
    """render (one service port's plan) -> diff (the SDK's, against ``applied``) ->
    apply (the plans' difference as IPVS, address, ipset and rule changes)."""

    name = "ipvs"

    def __init__(self, config: NodeConfig, options: IpvsOptions,
                 families: Iterable[int] = (4, 6),
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock  # StagedBackend's: when a periodic resync is due to rebuild
        self.config = config
        self.options = options
        self._only = tuple(families)  # test hook: of the node's families, at most these
        # The families programmed and the iptables invoked: the node context's.
        self.families: tuple[int, ...] = ()
        self.iptables = ""
        self.lock = threading.Lock()
        self.desired = Desired()
        self.kernel = Kernel()
        self.ctx: RenderContext | None = None
        self.node_context: NodeContext | None = None
        # What the render context was computed from: (state.node, state.context).
        self._basis: tuple[NodeInfo | None, NodeContext | None] | object = _NOTHING
        self._reason = "initial"
        self._unsure = True  # the real servers' weights must be read back from the kernel
        self.ifindex = 0
        self._held: Kernel | None = None  # what find_drift read, for the repair to start from
        self._relink = False  # kube-ipvs0 was found gone: the rebuild creates it again
        self._rules_seen: dict[tuple[int, str], tuple[str, ...]] = {}
        self.ipvs: IpvsNetlink | None = None
        self.route: NetlinkBatch | None = None
        self.warned: set[str] = set()
        self.refusals = Refusals(self.name)  # screened by the SDK before render
        self._rendered: set[ServicePortKey] = set()  # this round's, cleared once applied
        self.stop = threading.Event()
        self.reaper: threading.Thread | None = None

    # -- setup -------------------------------------------------------------------------

    @property
    def proxy_mode(self) -> ProxyMode:
        """kube-proxy's IPVS mode with this backend's flags: the node agent sets its
        sysctls (IPVS conntrack, forwarding, strict ARP...) and finds the iptables."""
        return ProxyMode("ipvs", strict_arp=self.options.strict_arp)

    def _setup(self) -> None:
        """Open sockets, set timeouts, create kube-ipvs0 (first sync only)."""
        if self.ipvs is not None:
            return
        self.ipvs = IpvsNetlink()
        self.route = NetlinkBatch(NETLINK_ROUTE)
        o = self.options
        if o.tcp_timeout or o.tcpfin_timeout or o.udp_timeout:
            built = genl.set_timeouts(o.tcp_timeout, o.tcpfin_timeout, o.udp_timeout)
            _raise_failures(self.ipvs.apply([Request("set IPVS timeouts",
                                                     genl.genl_body(*built))]))
        self.ifindex = apply.ensure_dummy(o.interface)
        self.reaper = threading.Thread(target=self._reap_loop, name="ipvs-drain", daemon=True)
        self.reaper.start()

    def close(self) -> None:
        """Stop the drain check and close sockets (tests and shutdown)."""
        self.stop.set()
        if self.reaper is not None:
            self.reaper.join(timeout=5)
        for sock in (self.ipvs, self.route):
            if sock is not None:
                sock.close()
        self.ipvs = self.route = None

    # -- sync --------------------------------------------------------------------------

    def sync(self, state: NodeState, changes: Changes) -> None:
        """render -> diff -> apply (``StagedBackend.sync``), everything rendered again on
        a new basis (``_new_basis``); the kernel's refusal of some virtual servers
        refuses their service ports and syncs again without them (the SDK's screening
        then withdraws them: a failed apply leaves nothing applied to keep)."""
        with self.lock:
            self._setup()
            self.refusals.prune(state.services)
            self._reason = changes.reason
            if self._new_basis(state):
                self.node_context = self._node_context(state)
                self.families = tuple(f for f in self.node_context.ip_families
                                      if f in self._only)
                self.iptables = self.node_context.iptables
                self.ctx = self._context(self.node_context)
                self._basis = (state.node, state.context)
                self.applied.invalidate()  # rebuild: everything rendered, the kernel read
            for round_ in range(MAX_ROUNDS + 1):
                self._rendered.clear()
                try:
                    super().sync(state, changes)
                    self._clear_applied_refusals()
                    break
                except SyncError as err:
                    owners = self._owners(err.failures, len(state.services))
                    if owners is None or round_ == MAX_ROUNDS:
                        raise
                    log.warning("ipvs: %s; syncing again without the service ports refused",
                                err)
                    for key, error in owners.items():
                        self.refusals.refuse(key, state.services.get(key), error)
                    # The failed apply left ``applied`` unknown: the next one rebuilds and
                    # removes what it half-created for a refused service port.
                    self._reason = "retry"
            self._reap_now()

    def _new_basis(self, state: NodeState) -> bool:
        """Whether the render context must be computed again (everything rendered and
        the kernel read back): nothing applied yet (first sync, after a failure), a new
        node or node context. Repairs (a full sync after a reconnect, the hourly resync)
        are ``StagedBackend``'s rebuilds to the applied plans."""
        return not self.applied.known or (state.node, state.context) != self._basis

    def _clear_applied_refusals(self) -> None:
        """Refused service ports rendered this round are in the kernel now: no longer
        refused (the SDK's screening renders only versions that may be tried)."""
        for key in self._rendered:
            if key in self.refusals:
                self.refusals.clear(key)

    def _owners(self, failures: Iterable[Failure], services: int,
                ) -> dict[ServicePortKey, str] | None:
        """The service ports whose virtual servers the failed requests were about, with
        the kernel's error; None when a failure is nobody's (an address, a route) or
        when too many fail (the node's fault)."""
        owners: dict[ServicePortKey, str] = {}
        for failure in failures:
            claims = self.desired.claims.get(failure.request.sid) if failure.request.sid else None
            if not claims:
                return None
            for key in claims:
                owners.setdefault(key, str(failure))
        return owners if len(owners) <= max(10, services // 10) else None

    def _addresses(self) -> list[tuple[int, str]]:
        """(ifindex, address) of every address in the namespace (one raw dump: pyroute2
        takes seconds for thousands of ClusterIPs in the guest)."""
        assert self.route is not None
        payloads = self.route.dump(rtnl.RTM_GETADDR, rtnl.dump_addresses_body())
        return [a for a in map(rtnl.parse_address, payloads) if a is not None]

    def _local_routes(self) -> set[str]:
        assert self.route is not None
        found: set[str] = set()
        for family in (2, 10):
            for payload in self.route.dump(rtnl.RTM_GETROUTE, rtnl.dump_routes_body(family)):
                route = rtnl.parse_local_route(payload)
                if route is not None and route[0] == self.ifindex:
                    found.add(route[1])
        return found

    def _node_context(self, state: NodeState) -> NodeContext:
        """The agent's node context, or the same resolution here (a state not from an
        agent), the addresses of kube-ipvs0 left out."""
        if state.context is not None:
            return state.context
        locals_ = [a for index, a in self._addresses() if index != self.ifindex]
        return resolve_context(self.config, state.node, locals_, mode=self.proxy_mode)

    def _context(self, node: NodeContext) -> RenderContext:
        """NodePorts on the node context's addresses, named (every address of the node's
        interfaces, kube-ipvs0's aside, for a family the CIDRs leave open), never loopback."""
        node_ips = tuple(ip for fam in node.families for ip in fam.node_ips)
        ports = tuple(ip for fam in node.families for ip in fam.node_port_ips_listed)
        return RenderContext(self.options.scheduler, tuple(dict.fromkeys(ports)), node_ips)

    # -- render ------------------------------------------------------------------------

    def render(self, state: NodeState, record: ServicePortState) -> PortPlan | None:
        """One service port's virtual servers, addresses, routes and ipset entries (the
        SDK screened the record: refused versions and invalid values never get here)."""
        assert self.ctx is not None
        self._rendered.add(record.key)
        plan = render_port(record, self.ctx)
        for warning in plan.warnings:
            if warning not in self.warned:
                self.warned.add(warning)
                log.warning("%s", warning)
        return plan

    # -- apply -------------------------------------------------------------------------

    def apply(self, delta: Delta[ServicePortKey, PortPlan]) -> None:
        """Program the plans' difference (a rebuild: make the kernel hold exactly
        ``delta.set``); raises SyncError when the kernel refused something."""
        try:
            if delta.rebuild:
                self._rebuild(delta.set)
            else:
                self._update(delta)
        except BaseException:
            self._unsure = True  # requests may have been sent and not recorded
            raise

    def _rebuild(self, plans: Mapping[ServicePortKey, PortPlan]) -> None:
        started = time.monotonic()
        self._held = None
        if self._relink:
            self.ifindex = apply.ensure_dummy(self.options.interface)
            self._relink = False
        self.desired = Desired(marks=self.desired.marks)
        for key, plan in plans.items():
            self.desired.replace(key, None, plan, TouchedObjects())
        self.desired.release_marks_except(plans)
        for line in self.desired.conflicts():
            log.warning("address conflict: %s", line)
        self._read_kernel(refresh_dests=self._unsure)
        servers = self._server_delta(set(self.desired.claims) | set(self.kernel.servers))
        links = self._link_delta(set(self.desired.addresses) | self.kernel.addresses,
                                 set(self.desired.routes) | self.kernel.routes)
        self._take_away(servers, links)
        entries = self.desired.entries_by_set()
        apply.ipset_restore(ipsets.full_restore(entries, self.families))
        self.kernel.entries = set(self.desired.entries)
        assert self.node_context is not None
        self._apply_rules(self.node_context)
        self._bring_up(servers, links)
        self._unsure = False
        log.info("ipvs: full sync (%s) of %d service ports, %d virtual servers in %.3fs",
                 self._reason, len(plans), len(self.desired.claims),
                 time.monotonic() - started)

    def _update(self, delta: Delta[ServicePortKey, PortPlan]) -> None:
        touched = TouchedObjects()
        if delta.repair:
            self._adopt_held()
            for key, plan in delta.repair.items():
                self.desired.replace(key, plan, plan, touched)  # touches all its objects
        for key, old in delta.removed.items():
            self.desired.replace(key, old, None, touched)
        for key, plan in delta.set.items():
            self.desired.replace(key, delta.previous.get(key), plan, touched)
        servers = self._server_delta(touched.servers)
        links = self._link_delta(touched.addresses, touched.routes)
        self._take_away(servers, links)
        want = {e for e in touched.entries if e in self.desired.entries}
        have = {e for e in touched.entries if e in self.kernel.entries}
        add, remove = want - have, have - want
        apply.ipset_restore(ipsets.delta_restore(_by_set(add), _by_set(remove)))
        self.kernel.entries = (self.kernel.entries - remove) | add
        self._bring_up(servers, links)

    # -- kernel state ------------------------------------------------------------------

    def _read_kernel(self, refresh_dests: bool) -> None:
        """Reload what the kernel holds (services we own, kube-ipvs0 addresses, routes)."""
        assert self.ipvs is not None
        kernel = {s.id: s for s in self.ipvs.services() if self._owned(s.id)}
        known = {} if refresh_dests else self.kernel.dests
        dests = {}
        for sid in kernel:
            if sid in known:
                dests[sid] = known[sid]
            else:
                dests[sid] = {d.id: d.weight for d in self.ipvs.dests(sid)}
        self.kernel.servers = kernel
        self.kernel.dests = dests
        self.kernel.draining = {k: v for k, v in self.kernel.draining.items() if k[0] in kernel}
        self.kernel.addresses = {a for index, a in self._addresses() if index == self.ifindex}
        self.kernel.routes = self._local_routes() - self.kernel.addresses

    # Order of a sync: what goes away first (addresses unbound, virtual servers deleted,
    # real servers of the remaining ones changed), then the ipsets and rules, then what
    # becomes reachable (new virtual servers, addresses bound). A client that reaches a
    # new service therefore always meets its ipset entries (Local, masquerade,
    # firewall), and a removed one is unreachable before its entries go.

    def _server_delta(self, ids: Iterable[ServiceId]) -> IpvsDelta:
        return diff_servers(ids, self.desired, self.kernel, time.monotonic(),
                            self.options.graceful_termination_timeout)

    def _link_delta(self, addresses: set[str], routes: set[str]) -> LinkDelta:
        add_a, del_a = _touched_diff(addresses, self.desired.addresses, self.kernel.addresses)
        add_r, del_r = _touched_diff(routes, self.desired.routes, self.kernel.routes)
        return LinkDelta(add_a, del_a, add_r, del_r)

    def _take_away(self, servers: IpvsDelta, links: LinkDelta) -> None:
        """Unbind addresses, remove local routes, send the changes of existing servers."""
        self._send_links(links.unbind_requests(self.ifindex, self.options.interface))
        self.kernel.addresses -= links.del_addresses
        self.kernel.routes -= links.del_routes
        self._send_servers(servers.changes)

    def _bring_up(self, servers: IpvsDelta, links: LinkDelta) -> None:
        """Create the new virtual servers, bind addresses, add local routes."""
        self._send_servers(servers.creations)
        servers.commit(self.kernel)
        self._send_links(links.bind_requests(self.ifindex, self.options.interface))
        self.kernel.addresses |= links.add_addresses
        self.kernel.routes |= links.add_routes

    def _send_servers(self, requests: list[Request]) -> None:
        assert self.ipvs is not None
        failures = self.ipvs.apply(requests)
        if failures:
            self.kernel.dests.clear()
        _raise_failures(failures)

    def _send_links(self, requests: list[Request]) -> None:
        assert self.route is not None
        _raise_failures(self.route.apply(requests))

    @staticmethod
    def _local_detect(family: int, node: NodeContext) -> R.LocalDetect:
        """The node context's local-traffic detection as iptables matches."""
        local = node.family(family).local_traffic
        if local.interface and local.mode in ("InterfaceNamePrefix", "BridgeInterface"):
            return R.LocalDetect(interfaces=(
                local.interface + "+" if local.by_interface_prefix else local.interface,))
        # The node's pod CIDRs come from the frontend: only well-formed ones reach a rule.
        return R.LocalDetect(cidrs=tuple(
            n for c in local.cidrs if (n := normalize_cidr(c)) is not None))

    def _apply_rules(self, node: NodeContext) -> None:
        for family in self.families:
            local = self._local_detect(family, node)
            tables = {
                "nat": R.nat_rules(family, node.masquerade_all, local),
                "filter": R.filter_rules(family),
                "mangle": R.mangle_rules(family, local),
            }
            saved = {t: apply.iptables_save(family, t, self.iptables) for t in N.TABLES}
            missing = [j for j in R.JUMPS if j.rule() not in saved[j.table]]
            apply.iptables_restore(family, R.restore_text(tables, missing), self.iptables)
            for table in N.TABLES:  # as iptables-save prints them, for the drift check
                self._rules_seen[(family, table)] = R.our_rules(
                    apply.iptables_save(family, table, self.iptables), table)

    # -- drift -----------------------------------------------------------------------------

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        """Read the kernel and compare it with what was applied (every periodic resync).

        kube-ipvs0, one of our ipsets or our iptables rules not as applied is the
        skeleton's drift, and so are objects nobody applied in what we own (a virtual
        server outside --ipvs-exclude-cidrs, an address on kube-ipvs0, an entry in our
        sets): the SDK rebuilds, which reads everything back and removes them. Virtual
        servers, real servers, addresses, routes and ipset entries lost or altered name
        the service ports to write again (``_update`` starts from what was read)."""
        self._held = None
        skeleton = self._skeleton_drift()
        if skeleton:
            self._unsure = True  # the rebuild reads every real server back
            return Drift(skeleton=skeleton)
        wanted = self._set_names()
        held, present = self._read_held(wanted)
        if wanted - present:
            return Drift(skeleton=f"ipsets gone: {', '.join(sorted(wanted - present))}")
        # Only the node's families have sets: entries of the others were never written.
        mirror = replace(self.kernel, entries={e for e in self.kernel.entries if e[0] in wanted})
        drift = compare(mirror, held)
        if drift.foreign:
            self._unsure = True
            shown = ", ".join(drift.foreign[:5])
            more = f" and {len(drift.foreign) - 5} more" if len(drift.foreign) > 5 else ""
            return Drift(skeleton=f"objects nobody applied in what ipvs owns: {shown}{more}")
        if not drift:
            return Drift()
        keys = owners(drift, self.applied, self.desired)
        if not keys:
            self._unsure = True
            return Drift(skeleton="kernel objects not as applied and of no service port")
        self._held = held
        return Drift(frozenset(keys))

    def _skeleton_drift(self) -> str:
        """Why kube-ipvs0 or our iptables rules are not as applied, or ""."""
        if apply.link_index(self.options.interface) != self.ifindex:
            self._relink = True
            return f"{self.options.interface} is gone"
        for (family, table), seen in self._rules_seen.items():
            now = R.our_rules(apply.iptables_save(family, table, self.iptables), table)
            if now != seen:
                return f"the IPv{family} {table} rules of kube-proxy's chains changed"
        return ""

    def _read_held(self, names: set[str]) -> tuple[Kernel, set[str]]:
        """What the kernel holds of ours (every real server read, the entries of the sets
        ``names``), and which of those sets are present."""
        assert self.ipvs is not None
        servers = {s.id: s for s in self.ipvs.services() if self._owned(s.id)}
        dests = {sid: {d.id: d.weight for d in self.ipvs.dests(sid)} for sid in servers}
        addresses = {a for index, a in self._addresses() if index == self.ifindex}
        routes = self._local_routes() - addresses
        present, entries = parse_ipset_save(apply.ipset_save(), names)
        held = Kernel(servers, dests, addresses, routes,
                      in_our_spelling(entries, self.kernel.entries))
        return held, present

    def _set_names(self) -> set[str]:
        """Our ipsets: those of the node's families."""
        return {N.set_name(k.base, f) for f in self.families for k in ipsets.KINDS}

    def _adopt_held(self) -> None:
        """Take what ``find_drift`` read as what the kernel holds (the repair's start)."""
        held, self._held = self._held, None
        if held is None:
            return
        kernel = self.kernel
        kernel.servers, kernel.dests = held.servers, held.dests
        kernel.addresses, kernel.routes = held.addresses, held.routes
        names = self._set_names()  # the entries of other families were never written
        kernel.entries = held.entries | {e for e in kernel.entries if e[0] not in names}
        kernel.draining = {k: v for k, v in kernel.draining.items()
                           if k[1] in held.dests.get(k[0], {})}

    # -- graceful termination ------------------------------------------------------------

    def _reap_now(self) -> None:
        """Delete draining real servers that have no connections left or ran out of time."""
        if not self.kernel.draining or self.ipvs is None:
            return
        stats: dict[tuple[ServiceId, genl.DestId], genl.DestStats | None] = {}
        for sid in {k[0] for k in self.kernel.draining}:
            found = {d.id: d for d in self.ipvs.dests(sid)}
            for key in self.kernel.draining:
                if key[0] == sid:
                    stats[key] = found.get(key[1])
        done = reap(self.kernel.draining, stats, time.monotonic())
        present = [k for k in done if stats.get(k) is not None]
        failures = self.ipvs.apply(reap_requests(present))
        for key in done:
            self.kernel.draining.pop(key, None)
            self.kernel.dests.get(key[0], {}).pop(key[1], None)
        for failure in failures:
            log.warning("ipvs: %s", failure)
        for sid, dest in done:
            log.info("ipvs: real server %s of %s drained, deleted", dest, sid)

    def _reap_loop(self) -> None:
        while not self.stop.wait(self.options.graceful_check_interval):
            try:
                with self.lock:
                    self._reap_now()
            except Exception:  # noqa: BLE001 - keep checking; the next sync repairs
                log.exception("ipvs: checking draining real servers failed")

    # -- cleanup -----------------------------------------------------------------------

    def cleanup(self) -> None:
        """Remove IPVS services (outside --ipvs-exclude-cidrs), kube-ipvs0, rules (in both
        iptables modes: a sync writes in the node's), ipsets."""
        self._cleanup_ipvs()
        if apply.delete_link(self.options.interface):
            log.info("ipvs: deleted %s", self.options.interface)
        for mode in IPTABLES_MODES:
            for family in (4, 6):
                saved = {t: self._saved_or_empty(family, t, mode) for t in N.TABLES}
                present = {t: _chains(text) for t, text in saved.items()}
                jumps = [j for j in R.JUMPS if j.rule() in saved[j.table]]
                text = R.cleanup_text(present, jumps)
                if text:
                    apply.iptables_restore(family, text, mode)
        existing = sorted(set(ipsets.all_set_names()) & apply.ipset_names())
        apply.ipset_restore(ipsets.destroy_restore(existing))

    def _cleanup_ipvs(self) -> None:
        try:
            sock = self.ipvs or IpvsNetlink()
        except Exception as err:  # noqa: BLE001 - no IPVS: nothing to remove
            log.info("ipvs: no IPVS in this kernel (%s); nothing to remove there", err)
            return
        gone = [s.id for s in sock.services() if self._owned(s.id)]
        requests = [Request(f"delete virtual server {sid}", genl.genl_body(*genl.del_service(sid)))
                    for sid in gone]
        _raise_failures(sock.apply(requests))
        log.info("ipvs: deleted %d virtual servers", len(gone))

    def _owned(self, sid: ServiceId) -> bool:
        """Virtual servers this backend manages: outside --ipvs-exclude-cidrs, and for
        firewall-mark ones only the marks it allocates."""
        if sid.is_fwmark:
            return is_our_fwmark(sid.port)
        return not self.options.excluded(sid.address)

    def _saved_or_empty(self, family: int, table: str, mode: str) -> str:
        try:
            return apply.iptables_save(family, table, mode)
        except (apply.CommandError, FileNotFoundError):
            return ""


@dataclass(frozen=True, slots=True)
class LinkDelta:
    """Addresses of kube-ipvs0 and local routes to add and to delete."""

    add_addresses: set[str]
    del_addresses: set[str]
    add_routes: set[str]
    del_routes: set[str]

    def unbind_requests(self, ifindex: int, name: str) -> list[Request]:
        return [
            *(Request(f"unbind {a} from {name}", rtnl.address_body(a, ifindex),
                      rtnl.RTM_DELADDR, ignore=IGNORE_ADDR_GONE)
              for a in sorted(self.del_addresses)),
            *(Request(f"remove local route {a}", rtnl.local_route_body(a, ifindex),
                      rtnl.RTM_DELROUTE, ignore=IGNORE_ADDR_GONE)
              for a in sorted(self.del_routes)),
        ]

    def bind_requests(self, ifindex: int, name: str) -> list[Request]:
        return [
            *(Request(f"bind {a} to {name}", rtnl.address_body(a, ifindex),
                      rtnl.RTM_NEWADDR, rtnl.ADD_FLAGS) for a in sorted(self.add_addresses)),
            *(Request(f"add local route {a}", rtnl.local_route_body(a, ifindex),
                      rtnl.RTM_NEWROUTE, rtnl.ADD_FLAGS) for a in sorted(self.add_routes)),
        ]


def _by_set(entries: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for name, value in entries:
        result.setdefault(name, []).append(value)
    return result


def _touched_diff(touched: set[str], desired: Iterable[str],
                  applied: set[str]) -> tuple[set[str], set[str]]:
    want = {a for a in touched if a in desired}
    have = {a for a in touched if a in applied}
    return diff_members(want, have)


def _chains(save_output: str) -> set[str]:
    return {line[1:].split()[0] for line in save_output.splitlines() if line.startswith(":")}
