"""The iptables backend: kube-proxy's iptables mode driven by the node's state.

Built as any backend on the SDK is: a ``StagedBackend`` whose ``render`` stage turns a
service port into its rules in every family (``render_plan.Rendered``), the SDK's ``diff``
stage compares them with what is applied, and the ``apply`` stage writes the delta
with one ``iptables-restore --noflush`` per family. What the kernel holds is the SDK's
``self.applied``; the backend keeps only what derives from it (each family's top-level
chains and rule counts, in its ``Planner``). The chains each restore wrote are read back
at once (over netlink with iptables-nft, ``nftrules``; ``iptables-save -t TABLE`` with
iptables-legacy) and every periodic resync compares what the kernel holds with that
(``drift``; iptables-nft reads only the chains the kernel's change events say someone
else touched): a service port's chains that someone changed are written again from the
applied values, a changed top-level chain or a missing jump rewrites everything.

Modules: ``render`` (one service port's rules), ``render_toplevel`` (the shared chains),
``render_plan`` (one family's transaction from the SDK's delta), ``render_restore``
(iptables-restore input, iptables-save output), all pure; ``apply`` (the iptables
programs), ``nftrules`` (the netlink reader), ``drift``, ``names``, ``cli``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.apply import MODES, Iptables, IptablesError, Sysctl
from svcproxy.backends.iptables.canary import CANARY_TABLES, Probe, make_probe
from svcproxy.backends.iptables.cleanup import cleanup_texts
from svcproxy.backends.iptables.drift import (
    ReadBack,
    Saved,
    adopt_blobs,
    assumed,
    compare_kernel,
    compare_saved,
    our_jumps,
    read_saved,
)
from svcproxy.backends.iptables.familyconfig import family_config
from svcproxy.backends.iptables.jumps import JUMPS, KUBELET_JUMPS, insert_lines
from svcproxy.backends.iptables.legacyblob import TableBlobs
from svcproxy.backends.iptables.metrics import IptablesMetrics, ip_family
from svcproxy.backends.iptables.nfacct import COUNTERS, Nfacct, remove_counters
from svcproxy.backends.iptables.nftrules import FAMILIES, PER_CHAIN_MAX, NftRules, TableRules
from svcproxy.backends.iptables.render import FamilyConfig, ServiceRules
from svcproxy.backends.iptables.render_plan import (
    Plan,
    Planner,
    Rendered,
    Values,
    after,
    large_cluster,
    render,
)
from svcproxy.backends.iptables.render_restore import (
    ALL_CHAINS_MIN,
    AllChains,
    TableChanges,
    all_chains_options,
    parse_save,
    restore_text,
)
from svcproxy.backends.iptables.render_toplevel import FILTER, NAT, uses_kubelet_firewall
from svcproxy.sdk import (
    Changes,
    Delta,
    Drift,
    NodeConfig,
    NodeContext,
    NodeState,
    ProxyMode,
    Refusals,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
    TooManyRefused,
    isolate_versions,
    netlink,
    resolve_context,
)

log = logging.getLogger(__name__)

TCP_BE_LIBERAL = "net/netfilter/nf_conntrack_tcp_be_liberal"


@dataclass(frozen=True, slots=True)
class IptablesOptions:
    """Backend-specific settings (the iptables-only kube-proxy flags and test hooks)."""

    localhost_nodeports: bool = True
    masquerade_bit: int = 14
    mode: str = "auto"  # auto | nft | legacy: the node context's ``iptables`` decides from it
    families: tuple[int, ...] = (4, 6)  # test hook: of the node's families, at most these
    prefix: tuple[str, ...] = ()


@dataclass(slots=True)
class RestoreReport:
    """What the last sync of one family did (for logs, tests and benchmarks)."""

    family: int
    full: bool
    chains_written: int
    chains_deleted: int
    rendered: int
    restore_bytes: int
    seconds: float
    written: dict[str, int] | None = None  # rules written per table


@dataclass(slots=True)
class _Family:
    family: int
    tool: Iptables
    probe: Probe
    planner: Planner
    blobs: TableBlobs | None = None  # iptables-legacy: the tables' digests, read directly


class IptablesBackend(StagedBackend[Rendered]):
    """Programs the filter and nat tables as kube-proxy's iptables proxier does."""

    name = "iptables"

    def __init__(self, config: NodeConfig, options: IptablesOptions | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.config = config
        self.options = options or IptablesOptions()
        self.clock = clock
        self.mode = ""
        self.reports: list[RestoreReport] = []
        self.last_sync_full: bool | None = None
        self.metrics = IptablesMetrics()
        self.refusals = Refusals(self.name)
        self._families: dict[int, _Family] = {}
        self._localhost = False
        self._drop_invalid = True
        self._nfacct = Nfacct(self.options.prefix)
        self._counters = False  # kube-proxy's nfacct counters exist: rules reference them
        self._large = False
        self._configs: tuple[FamilyConfig, ...] = ()
        self._why = ""
        self._rendered = 0
        self._reports: dict[int, RestoreReport] = {}
        # The last full restore tried (values, family index, text): what the line numbers
        # of its error refer to.
        self._last_try: tuple[Values, int, str] | None = None
        # The drift check's: per family what the kernel held right after each write
        # (read over netlink with iptables-nft: ``_kernel``; with iptables-save with
        # iptables-legacy); the service ports it found.
        self._kernel: NftRules | None = None
        self._written: dict[int, ReadBack] = {}
        # iptables-nft: the kernel's change events (what someone else touched), and the
        # newest generation they announced.
        self._events: netlink.NftablesEvents | None = None
        self._announced = 0
        self._drifted: frozenset[ServicePortKey] = frozenset()

    @property
    def proxy_mode(self) -> ProxyMode:
        """kube-proxy's iptables mode with this backend's flags (the node agent resolves
        the iptables to invoke and sets route_localnet from it)."""
        return ProxyMode("iptables", localhost_nodeports=self.options.localhost_nodeports,
                         iptables=self.options.mode)

    def node_context(self, state: NodeState) -> NodeContext:
        """The agent's node context, or (a state not from an agent) the SDK's resolution
        of it from the flags and the Node."""
        if state.context is not None:
            return state.context
        return resolve_context(self.config, state.node, mode=self.proxy_mode)

    def _start(self, state: NodeState) -> None:
        """Take the node context's iptables, families and localhost NodePorts, once."""
        opts = self.options
        node = self.node_context(state)
        self.mode = node.iptables
        families = [f for f in node.ip_families if f in opts.families]
        log.info("Using iptables %s mode for IPv%s", self.mode,
                 " and IPv".join(str(f) for f in families))
        self._localhost = node.localhost_nodeports
        if self._localhost:
            log.info("NodePorts answer on 127.0.0.1 (route_localnet=1); to change this pass "
                     "--iptables-localhost-nodeports=false or set --nodeport-addresses "
                     "without 127.0.0.1")
        liberal = Sysctl(opts.prefix).get(TCP_BE_LIBERAL)
        self._drop_invalid = liberal in (None, "0")
        if not self._drop_invalid:
            log.info("nf_conntrack_tcp_be_liberal is set: not dropping INVALID packets")
        self._counters = self._make_counters()
        for index, family in enumerate(families):
            tool = Iptables(family, self.mode, opts.prefix)
            blobs = TableBlobs(family, opts.prefix) if self.mode == "legacy" else None
            self._families[family] = _Family(family, tool, make_probe(tool),
                                             Planner(FamilyConfig(family=family), index),
                                             blobs)
            self._kernel = self._kernel or tool.rules()  # one reader for the namespace
        if self._kernel is not None:
            try:
                self._events = self._kernel.events()
                # What was committed before we listened is no one's to trace: the first
                # (full) sync writes everything and reads it back.
                self._announced = self._kernel.generation()
            except OSError as err:
                log.warning("Cannot subscribe to nftables' change events (%s): every check "
                            "reads all of our chains", err)

    def _make_counters(self) -> bool:
        """Create kube-proxy's nfacct objects; False (rules without them) if the kernel
        has no nfacct."""
        try:
            for name in COUNTERS:
                self._nfacct.create(name)
        except OSError as err:
            log.warning("Cannot create the nfacct counters %s (%s): the rules count nothing "
                        "and kubeproxy_iptables_*_packets_total are not exported",
                        ", ".join(COUNTERS), err)
            return False
        return True

    def family_config(self, family: int, state: NodeState) -> FamilyConfig:
        return family_config(self.config, state.node, family, context=state.context,
                             masquerade_bit=self.options.masquerade_bit,
                             localhost_nodeports=self._localhost,
                             drop_invalid=self._drop_invalid, nfacct=self._counters)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The agent's hook: export kube-proxy's iptables metrics in its registry."""
        self.metrics = IptablesMetrics(registry, [ip_family(f) for f in self.options.families],
                                       self._nfacct.packets)

    # -- the stages: prepare, render (SDK: diff), apply -------------------------------

    def sync(self, state: NodeState, changes: Changes) -> None:
        if not self._families:
            self._start(state)
        self.reports, self._reports = [], {}
        self.last_sync_full = None
        self._rendered = 0
        self.refusals.prune(state.services)
        self._prepare(state, changes)
        try:
            super().sync(state, changes)
        finally:
            self._drifted = frozenset()
            self._finish()
        self._settle(state)

    def _prepare(self, state: NodeState, changes: Changes) -> None:
        """What render reads: each family's config and the large-cluster mode; when either
        changes the applied state is dropped (everything is rendered and rewritten)."""
        why = ""
        for fam in self._families.values():
            if fam.planner.reconfigure(self.family_config(fam.family, state)):
                why = why or "configuration changed"
        self._configs = tuple(f.planner.cfg for f in self._families.values())
        large = large_cluster(state.services.values())
        if large != self._large:
            self._large = large
            why = why or "large-cluster threshold crossed"
        if not self.applied.known:
            self._why = "first sync" if changes.reason != "retry" else "retry"
            return
        if why:
            self.applied.invalidate()
        self._why = why

    def repair_reason(self, changes: Changes) -> str:
        """Why the applied rules are written again whole (not rendered again): the SDK's
        (a full sync after a reconnect, the hourly resync), or a canary chain gone.

        Canaries are probed on the periodic sync only (kube-proxy probes once per sync
        period too); a partial sync that fails because our chains were flushed
        meanwhile falls back to a full one at once.
        """
        why = super().repair_reason(changes)
        if not why and changes.reason == "periodic":
            why = self._canary_gone()
        self._why = self._why or why
        return why

    def _canary_gone(self) -> str:
        for family, fam in self._families.items():
            if not fam.probe():
                log.warning("IPv%d %s canary chain is gone: someone flushed iptables (a "
                            "firewall reload?); rewriting all rules", family, names.CANARY)
                return "canary gone"
        return ""

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        """Read each family's rules and compare them with what was applied: iptables-nft
        over netlink, with what the kernel held right after each write (nothing read
        but the generation when no transaction was committed since the last check);
        iptables-legacy with one iptables-save, our chains by rule count and saved
        digest, our jumps by presence (nothing saved when the tables' blobs are as
        last seen holding all of it)."""
        drifted: set[ServicePortKey] = set()
        for family, fam in self._families.items():
            planner = fam.planner
            if not planner.synced:
                return Drift()
            index = planner.index
            services = {k: r for k, v in self.applied.items()
                        if (r := v.rules[index]) is not None}
            if self._kernel is not None:
                keys, why = self._kernel_drift(fam, services)
                if why:
                    self._why = self._why or "changed behind our back"
                    return Drift(skeleton=f"IPv{family}: {why}")
                drifted |= keys
                continue
            written = self._written.setdefault(family, ReadBack())
            blobs = self._blobs(fam, set(planner.top) | {NAT})
            if blobs is not None and all(written.blobs.get(t) == d for t, d in blobs.items()):
                continue  # no table of ours changed since all of it was seen as applied
            wanted = {table: list(chains) for table, chains in planner.top.items()}
            wanted.setdefault(NAT, []).extend(c for r in services.values() for c in r.chains)
            try:
                saved = self._saved(fam, wanted)
            except (IptablesError, OSError) as err:
                log.warning("Cannot read the IPv%d rules to check them (%s): not checked "
                            "this period", family, err)
                return Drift()
            jumps = JUMPS + (KUBELET_JUMPS if uses_kubelet_firewall(planner.cfg) else ())
            keys, why = compare_saved(planner.top, services, jumps, saved, written)
            if why:
                self._why = self._why or "changed behind our back"
                return Drift(skeleton=f"IPv{family}: {why}")
            if not keys and blobs is not None:
                written.blobs = blobs  # read before the save: a later change differs
            drifted |= keys
        self._drifted = frozenset(drifted)
        return Drift(self._drifted)

    @staticmethod
    def _saved(fam: _Family, wanted: dict[str, list[str]]) -> Saved:
        """iptables-legacy: the chains of ``wanted`` (table -> chains) and the built-in
        chains' rules, one ``iptables-save -t TABLE`` each (only the tables named)."""
        saved = Saved()
        for table, chains in wanted.items():
            one = fam.tool.save_stream(lambda lines, w={table: chains}: read_saved(lines, w),
                                       table)
            saved.chains.update(one.chains)
            saved.builtin.update(one.builtin)
        return saved

    @staticmethod
    def _blobs(fam: _Family, tables: Iterable[str]) -> dict[str, bytes] | None:
        """iptables-legacy: each of ``tables``' digest as the kernel holds it (None: not
        read; the check falls back to iptables-save)."""
        if fam.blobs is None:
            return None
        try:
            return {table: fam.blobs.digest(table) for table in tables}
        except OSError as err:
            log.debug("Cannot read the IPv%d tables' blobs (%s): comparing iptables-save",
                      fam.family, err)
            return None

    def _kernel_drift(self, fam: _Family, services: dict[ServicePortKey, ServiceRules],
                      ) -> tuple[set[ServicePortKey], str]:
        """iptables-nft: one family's drift, read over netlink (``drift.compare_kernel``):
        nothing when no transaction was committed since the last check; else only the
        chains someone else's transactions touched (the events say which), or, when that
        is not known, every chain of ours."""
        kernel = self._kernel
        assert kernel is not None
        written = self._written.setdefault(fam.family, ReadBack())
        tables = set(fam.planner.top) | {NAT}
        try:
            before = kernel.generation()
            if before == written.generation:
                return set(), ""  # nothing committed since all of it was seen as written
            self._take_events(range(0))
            wanted = {t: list(fam.planner.top.get(t, ())) for t in tables}
            wanted[NAT].extend(c for r in services.values() for c in r.chains)
            builtin = {t: [c for (t2, c) in written.jumps if t2 == t] for t in tables}
            touched = written.touched
            if touched is not None:
                wanted = {t: [c for c in chains if (t, c) in touched]
                          for t, chains in wanted.items()}
                builtin = {t: [c for c in chains if (t, c) in touched]
                           for t, chains in builtin.items()}
            read = {t: kernel.chains(fam.family, t, wanted[t], builtin[t]) for t in tables}
            after = kernel.generation()
        except OSError as err:
            log.warning("Cannot read the IPv%d rules to check them (%s): not checked "
                        "this period", fam.family, err)
            return set(), ""
        held = read if touched is None else assumed(written, read)
        keys, why = compare_kernel(fam.planner.top, services, held, written)
        written.touched = set()  # compared: what differs is repaired now
        if not keys and not why and before == after and self._announced >= after:
            written.generation = after
        return keys, why

    def _take_events(self, ours: range, settled: bool = False) -> bool:
        """What the transactions committed since the last look touched, into each
        family's ``touched``; those of ``ours`` (generations: our own write) left out.
        Events lost (a large write overflowed the socket), or a table of ours created or
        deleted: not known (every chain is read at the next check), unless ``settled``
        (every transaction before ours was announced before it) and nobody committed
        since ours: then only our own events were lost. Returns whether the events of
        others are all known."""
        events = self._events
        try:
            groups, lost = (events.drain(self._kernel.generation if self._kernel else None)
                            if events is not None else ([], True))
            if lost and settled and ours and self._kernel is not None:
                lost = self._kernel.generation() != ours[-1]
        except OSError:
            groups, lost = [], True
        for gen, _ in groups:
            self._announced = max(self._announced, gen)
        if settled and ours and not lost:
            self._announced = max(self._announced, ours[-1])
        for family, written in self._written.items():
            if lost:
                written.touched = None
                continue
            af = FAMILIES[family]
            for gen, touched in groups:
                if gen in ours or written.touched is None:
                    continue
                for kind, table, chain in touched:
                    if kind != af or table not in (NAT, FILTER):
                        continue
                    if not chain:
                        written.touched = None
                        break
                    written.touched.add((table, chain))
        return not lost

    def _restore(self, fam: _Family, text: str, tables: dict[str, TableChanges],
                 full: bool) -> None:
        """One iptables-restore of ``tables``; with iptables-nft the chains it wrote (and,
        ``full``, our jumps) are read back at once: what the drift check compares with.
        The generation before the write and after the read says whether anyone else
        committed in between: then the few chains written count as not known (written
        again at the next check); a large write's are taken as read."""
        kernel = self._kernel
        if kernel is None:
            self._restore_legacy(fam, text, tables, full)
            return
        written = self._written.setdefault(fam.family, ReadBack())
        self._take_events(range(0))  # what others committed before this write
        try:
            before: int | None = kernel.generation()
        except OSError:
            before = None
        settled = before is not None and self._announced >= before
        try:
            fam.tool.restore(text)
        except IptablesError:
            written.generation = None
            for table, changes in tables.items():
                for chain in changes.write:
                    written.chains[(table, chain)] = None
            raise
        writes = {t: list(c.write) for t, c in tables.items() if c.write}
        jumps = JUMPS + (KUBELET_JUMPS if uses_kubelet_firewall(fam.planner.cfg) else ())
        sources = {(j.table, j.source): {x.target for x in jumps if (x.table, x.source)
                                         == (j.table, j.source)} for j in jumps} if full else {}
        try:
            read = {t: kernel.chains(fam.family, t, writes.get(t, ()),
                                     {s for (t2, s) in sources if t2 == t})
                    for t in set(writes) | {t for t, _ in sources}}
            after: int | None = kernel.generation()
        except OSError as err:
            log.warning("Cannot read back the IPv%d rules just written (%s): they are "
                        "written again at the next check", fam.family, err)
            read, after = {}, None
        sections = text.count("\n*") + text.startswith("*")
        # Each table section commits one transaction, or none if it changed nothing.
        clean = before is not None and after is not None and after - before <= sections
        known = self._take_events(range(before + 1, after + 1) if clean and before is not None
                                  and after is not None else range(0), settled and clean)
        if full and clean and settled and known:
            written.touched = set()  # everything read back, nobody else committed since
        many = sum(map(len, writes.values())) > PER_CHAIN_MAX
        if not clean:
            log.debug("IPv%d: the ruleset's generation went %s -> %s over a write of %d "
                      "tables: someone else committed meanwhile", fam.family, before, after,
                      sections)
        if full:
            written.chains = {}
            written.jumps = {key: our_jumps(read.get(key[0], TableRules()).builtin.get(
                key[1], []), targets) for key, targets in sources.items()}
        for table, chains in writes.items():
            got = read.get(table, TableRules()).chains
            for chain in chains:
                written.chains[(table, chain)] = got.get(chain) if clean or many else None
        for table, changes in tables.items():
            for chain in changes.delete:
                written.chains.pop((table, chain), None)
        written.generation = after if clean and written.generation == before else None

    def _restore_legacy(self, fam: _Family, text: str, tables: dict[str, TableChanges],
                        full: bool) -> None:
        """iptables-legacy: one iptables-restore of ``tables``, then the chains it wrote
        read back with one ``iptables-save -t TABLE`` per table written (no generation
        tells whether someone else wrote in between: taken as read). After a full one,
        the tables' blobs are digested (``drift.adopt_blobs``)."""
        written = self._written.setdefault(fam.family, ReadBack())
        if full:
            written.chains = {}
        writes = {t: list(c.write) for t, c in tables.items() if c.write}
        for table, chains in writes.items():
            for chain in chains:
                written.chains[(table, chain)] = None
        for table, changes in tables.items():
            for chain in changes.delete:
                written.chains.pop((table, chain), None)
        fam.tool.restore(text)
        blobs = self._blobs(fam, tables) if full else None  # before the read-back
        try:
            saved = self._saved(fam, writes)
        except (IptablesError, OSError) as err:
            log.warning("Cannot read back the IPv%d rules just written (%s): they are "
                        "written again at the next check", fam.family, err)
            adopt_blobs(written, tables, None)
            return
        for table, chains in writes.items():
            got = saved.chains.get(table, {})
            for chain in chains:
                written.chains[(table, chain)] = got.get(chain)
        adopt_blobs(written, tables, blobs)

    def render(self, state: NodeState, record: ServicePortState) -> Rendered | None:
        """One service port's rules in every family (the SDK's stages screen out a version
        refused before, or with values no rule may hold: it keeps what is applied)."""
        self._rendered += 1
        return render(record, self._configs, self._large)

    def apply(self, delta: Delta[ServicePortKey, Rendered]) -> Delta[ServicePortKey,
                                                                        Rendered] | None:
        """Restore the delta, family by family: a partial restore that fails is retried
        at once as a full one; a full one that fails twice looks for the service ports
        refused and applies the others (returning what it applied)."""
        families = list(self._families.values())
        if delta.rebuild:
            return self._apply_full(delta.set, families)
        repair = dict(delta.repair)
        for key in self._drifted:  # changed now and drifted: put back what was applied first
            if key in self.applied and (key in delta.set or key in delta.removed):
                repair[key] = self.applied[key]
        if repair:
            self._repair(repair, families)
        if not delta.set and not delta.removed:
            return None
        failed = [fam for fam in families if not self._apply_partial(fam, delta)]
        if not failed:
            return None
        return self._apply_full(after(self.applied, delta), failed)

    def _repair(self, values: Values, families: list[_Family]) -> None:
        """Write the chains of ``values`` again whole (changed behind our back)."""
        for fam in families:
            index = fam.planner.index
            chains = {c: t for v in values.values() if (r := v.rules[index]) is not None
                      for c, t in r.chains.items()}
            tables = {NAT: TableChanges(write=chains)}
            text = restore_text(tables)
            start = self.clock()
            if text:
                self._restore(fam, text, tables, full=False)
            written = {NAT: sum(t.count("\n") for t in chains.values())}
            self._reports[fam.family] = RestoreReport(
                fam.family, False, len(chains), 0, self._rendered, len(text),
                self.clock() - start, written)
        self._why = self._why or "changed behind our back"

    def _apply_partial(self, fam: _Family, delta: Delta[ServicePortKey, Rendered]) -> bool:
        """One family's partial restore; False when a full one must follow."""
        if not fam.planner.synced:
            return False
        start = self.clock()
        plan = fam.planner.partial(self.applied, delta)
        text = restore_text(plan.tables, self._all_chains(plan, dict(fam.planner.chains), None))
        try:
            if text:
                self._restore(fam, text, plan.tables, full=False)
        except IptablesError as err:
            self.metrics.restore_failed(fam.family, partial=True)
            log.warning("IPv%d partial sync failed (%s); rewriting all rules", fam.family, err)
            self._why = "partial sync failed"
            return False
        self._adopt(fam, plan, text, start)
        return True

    def _apply_full(self, values: Values, families: list[_Family],
                    ) -> Delta[ServicePortKey, Rendered] | None:
        """Full restores of ``values`` (None: all of it applied), once more after a
        failure (a transient one is nobody's fault), then the isolation of the refused."""
        try:
            error = self._try_full(values, families)
            if error is not None:
                log.warning("Full sync failed (%s); trying once more", error)
                error = self._try_full(values, families)
            if error is None:
                return None
            return self._isolate(values, error)
        finally:
            self._last_try = None  # the whole restore text: not kept past the sync

    def _try_full(self, values: Values, families: Iterable[_Family]) -> str | None:
        """One full restore of ``values`` per family: the first error, or None."""
        for fam in families:
            start = self.clock()
            plan, present = self._full_plan(fam, values)
            existing = {table: len(chains) for table, chains in present.items()}
            text = restore_text(plan.tables, self._all_chains(plan, existing, present))
            self._last_try = (values, fam.planner.index, text)
            try:
                if text:
                    self._restore(fam, text, plan.tables, full=True)
            except IptablesError as err:
                self.metrics.restore_failed(fam.family, partial=False)
                fam.planner.forget()
                return str(err)
            self._adopt(fam, plan, text, start)
        return None

    def _isolate(self, values: Values, error: str) -> Delta[ServicePortKey, Rendered]:
        """After a refused full restore: set aside the service ports iptables-restore names
        in its error, bisect what still fails (full restores of every family each time),
        try the ones set aside again; apply the others. Raises IptablesError when the
        fault is the node's (too many refused)."""
        log.warning("Full sync failed (%s); looking for the service ports refused", error)
        families = list(self._families.values())

        def accepts(items: list[tuple[ServicePortKey, Rendered]]) -> str | None:
            return self._try_full(dict(items), families)

        def named(failed: str) -> list[ServicePortKey]:
            return _named_in_error(*self._last_try, failed) if self._last_try else []

        try:
            accepted, refused = isolate_versions(values, self.applied, accepts, error, named)
        except TooManyRefused as err:
            raise IptablesError(str(err)) from None
        # A failed try may have committed one table of two: write the result once more.
        failed = self._try_full(accepted, families)
        if failed is not None:
            raise IptablesError(failed)
        for key, why in refused.items():
            self.refusals.refuse(key, values[key].record, why)
        return Delta(True, accepted)

    def _adopt(self, fam: _Family, plan: Plan, text: str, start: float) -> None:
        """The kernel took ``plan``: the planner adopts it and the sync is reported."""
        fam.planner.commit(plan)
        written = sum(len(t.write) for t in plan.tables.values())
        deleted = sum(len(t.delete) for t in plan.tables.values())
        self._reports[fam.family] = RestoreReport(
            fam.family, plan.full, written, deleted, self._rendered, len(text),
            self.clock() - start, plan.written())

    def _finish(self) -> None:
        """Reports (an untouched family: nothing written), logs and rule metrics."""
        for family, fam in self._families.items():
            report = self._reports.get(family)
            if report is None:
                report = RestoreReport(family, False, 0, 0, self._rendered, 0, 0.0, {})
            self.reports.append(report)
            log.log(logging.INFO if report.full else logging.DEBUG,
                    "IPv%d %s sync (%s): wrote %d chains, deleted %d, rendered %d service "
                    "ports in %.3fs", family, "full" if report.full else "partial",
                    self._why or "changes", report.chains_written, report.chains_deleted,
                    report.rendered, report.seconds)
            if fam.planner.synced:
                self.metrics.set_rules(family, fam.planner.rules)
            self.metrics.set_last(family, report.written or {})
        self.last_sync_full = any(r.full for r in self.reports)

    def _settle(self, state: NodeState) -> None:
        """Service ports applied as they are in the state are no longer refused."""
        for key in list(self.refusals):
            record = state.services.get(key)
            value = self.applied.get(key)
            if record is not None and value is not None and value.record is record:
                self.refusals.clear(key)

    def _all_chains(self, plan: Plan, existing: dict[str, int],
                    present: dict[str, frozenset[str]] | None) -> dict[str, AllChains] | None:
        """iptables-nft: when a table's transaction names enough chains, relative to the
        chains already there, to be cheaper with one dump of them (see restore)."""
        if self.mode != "nft":
            return None
        return all_chains_options(plan.tables, existing, present, ALL_CHAINS_MIN)

    def _full_plan(self, fam: _Family, values: Values,
                   ) -> tuple[Plan, dict[str, frozenset[str]]]:
        """Everything, plus stale-chain deletion, jump rules and canaries; and the chains
        each table holds now."""
        saved = fam.tool.save_tables()
        nat_saved = saved.get(NAT)
        plan = fam.planner.full(values, nat_saved.chains if nat_saved else frozenset())
        jumps = JUMPS + (KUBELET_JUMPS if uses_kubelet_firewall(fam.planner.cfg) else ())
        for table in (FILTER, NAT):
            plan.tables[table].lines.extend(insert_lines(jumps, table, saved.get(table)))
        for table in CANARY_TABLES:
            plan.tables.setdefault(table, TableChanges()).write[names.CANARY] = ""
        return plan, {table: tables.chains for table, tables in saved.items()}

    def cleanup(self) -> None:
        """Remove our jump rules and chains, in both iptables modes and both families,
        then kube-proxy's nfacct counters."""
        errors = []
        for mode in MODES:
            for family in self.options.families:
                tool = Iptables(family, mode, self.options.prefix)
                try:
                    saved = tool.save()
                except (IptablesError, OSError) as err:
                    log.debug("Nothing to clean in IPv%d %s iptables: %s", family, mode, err)
                    continue
                try:
                    texts = cleanup_texts(parse_save(saved),
                                          ALL_CHAINS_MIN if mode == "nft" else None)
                    for text in texts:
                        tool.restore(text)
                    if texts:
                        log.info("Removed svcproxy's iptables rules (IPv%d, %s)", family, mode)
                except (IptablesError, OSError) as err:
                    errors.append(f"IPv{family} {mode}: {err}")
        errors += remove_counters(self._nfacct)
        for fam in self._families.values():
            fam.planner.forget()
        self.applied.invalidate()
        if errors:
            raise IptablesError("; ".join(errors))


def _named_in_error(values: Values, index: int, text: str,
                    error: str) -> list[ServicePortKey]:
    """The service ports owning a chain named on the input lines the error points at (of
    ``text``, the restore of ``values`` in the family at ``index``)."""
    owners = {chain: key for key, value in values.items()
              if (rules := value.rules[index]) is not None for chain in rules.chains}
    lines = text.splitlines()
    found: list[ServicePortKey] = []
    for number in re.findall(r"line:? (\d+)", error):
        index = int(number) - 1
        if 0 <= index < len(lines):
            for word in lines[index].replace(":", " ").split():
                key = owners.get(word)
                if key is not None and key not in found:
                    found.append(key)
    return found
