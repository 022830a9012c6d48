"""The iptables backend: kube-proxy's iptables mode driven by the node's state."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.canary import CANARY_TABLES, Probe, make_probe
from svcproxy.backends.iptables.cleanup import cleanup_texts
from svcproxy.backends.iptables.familyconfig import family_config, localhost_nodeports_allowed
from svcproxy.backends.iptables.jumps import JUMPS, KUBELET_JUMPS, insert_lines
from svcproxy.backends.iptables.metrics import IptablesMetrics
from svcproxy.backends.iptables.planner import Plan, Planner
from svcproxy.backends.iptables.render import FamilyConfig
from svcproxy.backends.iptables.restore import (
    ALL_CHAINS_MIN,
    AllChains,
    TableChanges,
    all_chains_options,
    parse_save,
    restore_text,
)
from svcproxy.backends.iptables.tool import MODES, Iptables, IptablesError, Sysctl, detect_mode
from svcproxy.backends.iptables.toplevel import FILTER, NAT, uses_kubelet_firewall
from svcproxy.sdk import NodeConfig, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.refusals import Refusals, TooManyRefused, invalid_values, isolate_versions

log = logging.getLogger(__name__)

ROUTE_LOCALNET = "net/ipv4/conf/all/route_localnet"
TCP_BE_LIBERAL = "net/netfilter/nf_conntrack_tcp_be_liberal"


@dataclass(frozen=True, slots=True)
class IptablesOptions:
    """Backend-specific settings (the iptables-only kube-proxy flags and test hooks)."""

    localhost_nodeports: bool = True
    masquerade_bit: int = 14
    mode: str = "auto"  # auto | nft | legacy
    families: tuple[int, ...] = (4, 6)
    full_sync_interval: float = 3600.0
    prefix: tuple[str, ...] = ()


@dataclass(slots=True)
class SyncReport:
    """What the last sync of one family did (for logs, tests and benchmarks)."""

    family: int
    full: bool
    chains_written: int
    chains_deleted: int
    rendered: int
    restore_bytes: int
    seconds: float


Records = dict[ServicePortKey, ServicePortState]


@dataclass(slots=True)
class _Family:
    tool: Iptables
    probe: Probe
    planner: Planner
    last_full: float = 0.0
    # The record of every service port whose rules are in the kernel (what it accepted).
    accepted: Records = field(default_factory=dict)


class IptablesBackend(Backend):
    """Programs the filter and nat tables as kube-proxy's iptables proxier does."""

    name = "iptables"

    def __init__(self, config: NodeConfig, options: IptablesOptions | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.options = options or IptablesOptions()
        self.clock = clock
        self.mode = ""
        self.reports: list[SyncReport] = []
        self.last_sync_full: bool | None = None
        self.metrics = IptablesMetrics()
        self._families: dict[int, _Family] = {}
        self._localhost = False
        self._drop_invalid = True
        self.refusals = Refusals(self.name)

    def _start(self) -> None:
        """Pick the iptables mode and set the sysctls, once."""
        opts = self.options
        self.mode = opts.mode if opts.mode in MODES else detect_mode(opts.prefix)
        sysctl = Sysctl(opts.prefix)
        families = [f for f in opts.families if f == 4 or _ipv6_available(sysctl)]
        log.info("Using iptables %s mode for IPv%s", self.mode,
                 " and IPv".join(str(f) for f in families))
        self._localhost = 4 in families and localhost_nodeports_allowed(
            self.config, opts.localhost_nodeports)
        if self._localhost and sysctl.get(ROUTE_LOCALNET) != "1":
            log.info("Setting route_localnet=1 to allow NodePorts on localhost; to change this "
                     "pass --iptables-localhost-nodeports=false or set --nodeport-addresses "
                     "without 127.0.0.1")
            sysctl.set(ROUTE_LOCALNET, "1")
        liberal = sysctl.get(TCP_BE_LIBERAL)
        self._drop_invalid = liberal in (None, "0")
        if not self._drop_invalid:
            log.info("nf_conntrack_tcp_be_liberal is set: not dropping INVALID packets")
        for family in families:
            tool = Iptables(family, self.mode, opts.prefix)
            self._families[family] = _Family(tool, make_probe(tool), Planner(FamilyConfig()))

    def family_config(self, family: int, state: NodeState) -> FamilyConfig:
        return family_config(self.config, state.node, family, context=state.context,
                             masquerade_bit=self.options.masquerade_bit,
                             localhost_nodeports=self._localhost,
                             drop_invalid=self._drop_invalid)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The agent's hook: export kube-proxy's iptables metrics in its registry."""
        self.metrics = IptablesMetrics(registry)

    def sync(self, state: NodeState, changes: Changes) -> None:
        if not self._families:
            self._start()
        self.reports = []
        self.last_sync_full = None
        self.refusals.prune(state.services)
        errors: list[str] = []
        for family, fam in self._families.items():
            try:
                self._sync_family(family, fam, state, changes)
            except (IptablesError, OSError) as err:
                fam.planner.forget()
                errors.append(f"IPv{family}: {err}")
        self.last_sync_full = any(r.full for r in self.reports)
        self.metrics.set_rules(f.planner.rules for f in self._families.values())
        if errors:
            raise IptablesError("; ".join(errors))

    def _wants_full(self, family: int, fam: _Family, changes: Changes) -> str:
        """Why this family needs a full sync, or "" for a partial one.

        Canaries are probed on the periodic sync only (kube-proxy probes once per
        sync period too); a partial sync that fails because our chains were
        flushed meanwhile falls back to a full one at once.
        """
        if not fam.planner.synced:
            return "first sync" if changes.reason != "retry" else "retry"
        if changes.full and changes.reason not in ("periodic", "changes"):
            return changes.reason
        if changes.reason != "periodic":
            return ""
        if self.clock() - fam.last_full >= self.options.full_sync_interval:
            return "hourly resync"
        if not fam.probe():
            log.warning("IPv%d %s canary chain is gone: someone flushed iptables (a firewall "
                        "reload?); rewriting all rules", family, names.CANARY)
            return "canary gone"
        return ""

    def _sync_family(self, family: int, fam: _Family, state: NodeState,
                     changes: Changes) -> None:
        start = self.clock()
        fam.planner.reconfigure(self.family_config(family, state))
        why_full = self._wants_full(family, fam, changes)
        services = self._wanted(fam, state)
        plan, text, why_full = self._apply(family, fam, state, services, changes, why_full)
        fam.planner.commit(plan)
        fam.accepted = {k: f[0] for k, f in plan.fragments.items()}
        self._settle(state, fam.accepted)
        if plan.full:
            fam.last_full = start
        report = _report(family, plan, len(text), self.clock() - start)
        self.reports.append(report)
        log.log(logging.INFO if plan.full else logging.DEBUG,
                "IPv%d %s sync (%s): wrote %d chains, deleted %d, rendered %d service ports "
                "in %.3fs", family, "full" if plan.full else "partial",
                why_full or changes.reason, report.chains_written, report.chains_deleted,
                report.rendered, report.seconds)

    def _wanted(self, fam: _Family, state: NodeState) -> Records:
        """The record to program per service port: the state's, unless this very version
        was refused (or has values no rule may hold): then the last accepted one."""
        accepted = fam.accepted
        wanted: Records = {}
        for key, record in state.services.items():
            before = accepted.get(key)
            chosen: ServicePortState | None = record
            if record is not before:
                if self.refusals and self.refusals.holds(key, record):
                    chosen = before
                elif (reason := invalid_values(record)) is not None:
                    self.refusals.refuse(key, record, f"invalid value: {reason}")
                    chosen = before
            if chosen is not None:
                wanted[key] = chosen
        return wanted

    def _settle(self, state: NodeState, applied: Records) -> None:
        """Service ports applied as they are in the state are no longer refused."""
        for key in list(self.refusals):
            record = state.services.get(key)
            if record is not None and applied.get(key) is record:
                self.refusals.clear(key)

    def _apply(self, family: int, fam: _Family, state: NodeState, services: Records,
               changes: Changes, why_full: str) -> tuple[Plan, str, str]:
        """Plan and restore; a failed partial restore is retried at once as a full one,
        a failed full one looks for the service ports refused and applies the others."""
        if not why_full:
            plan = fam.planner.plan(services, changes.services)
            text = restore_text(plan.tables, self._all_chains(plan, dict(fam.planner.chains),
                                                              None))
            try:
                if text:
                    fam.tool.restore(text)
            except IptablesError as err:
                self.metrics.restore_failed(partial=True)
                log.warning("IPv%d partial sync failed (%s); rewriting all rules", family, err)
                return self._apply(family, fam, state, services, changes,
                                   "partial sync failed")
            return plan, text, why_full
        plan, text, error = self._try_full(fam, services)
        if error is not None:  # once more, as it was: a transient failure is nobody's fault
            log.warning("IPv%d full sync failed (%s); trying once more", family, error)
            plan, text, error = self._try_full(fam, services)
        if error is not None:
            plan, text = self._isolate(family, fam, state, services, plan, text, error)
        return plan, text, why_full

    def _try_full(self, fam: _Family, services: Records) -> tuple[Plan, str, str | None]:
        """One full restore of ``services``: its plan, text and error (None: applied)."""
        plan, present = self._full_plan(fam, services)
        existing = {table: len(chains) for table, chains in present.items()}
        text = restore_text(plan.tables, self._all_chains(plan, existing, present))
        try:
            if text:
                fam.tool.restore(text)
        except IptablesError as err:
            self.metrics.restore_failed(partial=False)
            return plan, text, str(err)
        return plan, text, None

    def _isolate(self, family: int, fam: _Family, state: NodeState, services: Records,
                 plan: Plan, text: str, error: str) -> tuple[Plan, str]:
        """After a refused full restore: set aside the service ports iptables-restore names
        in its error, bisect what still fails (full restores each time), try the ones set
        aside again; apply the others. Raises IptablesError when the fault is the node's
        (too many refused)."""
        log.warning("IPv%d full sync failed (%s); looking for the service ports refused",
                    family, error)
        last = [(plan, text)]

        def accepts(items: list[tuple[ServicePortKey, ServicePortState]]) -> str | None:
            tried, tried_text, failed = self._try_full(fam, dict(items))
            last[0] = (tried, tried_text)
            return failed

        def named(failed: str) -> list[ServicePortKey]:
            return _named_in_error(*last[0], failed)

        try:
            accepted, refused = isolate_versions(services, fam.accepted, accepts, error, named)
        except TooManyRefused as err:
            raise IptablesError(str(err)) from None
        # A failed try may have committed one table of two: write the result once more.
        plan, text, failed = self._try_full(fam, accepted)
        if failed is not None:
            raise IptablesError(failed)
        for key, why in refused.items():
            self.refusals.refuse(key, state.services.get(key), why)
        return plan, text

    def _all_chains(self, plan: Plan, existing: dict[str, int],
                    present: dict[str, frozenset[str]] | None) -> dict[str, AllChains] | None:
        """iptables-nft: when a table's transaction names enough chains, relative to the
        chains already there, to be cheaper with one dump of them (see restore)."""
        if self.mode != "nft":
            return None
        return all_chains_options(plan.tables, existing, present, ALL_CHAINS_MIN)

    def _full_plan(self, fam: _Family, services: Records,
                   ) -> tuple[Plan, dict[str, frozenset[str]]]:
        """Everything, plus stale-chain deletion, jump rules and canaries; and the chains
        each table holds now."""
        saved = fam.tool.save_tables()
        nat_saved = saved.get(NAT)
        plan = fam.planner.plan(services, None,
                                nat_saved.chains if nat_saved else frozenset())
        jumps = JUMPS + (KUBELET_JUMPS if uses_kubelet_firewall(fam.planner.cfg) else ())
        for table in (FILTER, NAT):
            plan.tables[table].lines.extend(insert_lines(jumps, table, saved.get(table)))
        for table in CANARY_TABLES:
            plan.tables.setdefault(table, TableChanges()).write[names.CANARY] = ""
        return plan, {table: tables.chains for table, tables in saved.items()}

    def cleanup(self) -> None:
        """Remove our jump rules and chains, in both iptables modes and both families."""
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
        for fam in self._families.values():
            fam.planner.forget()
        if errors:
            raise IptablesError("; ".join(errors))


def _named_in_error(plan: Plan, text: str, error: str) -> list[ServicePortKey]:
    """The service ports owning a chain named on the input lines the error points at."""
    owners = {chain: key for key, (_, rules) in plan.fragments.items() if rules is not None
              for chain in rules.chains}
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


def _report(family: int, plan: Plan, size: int, seconds: float) -> SyncReport:
    written = sum(len(t.write) for t in plan.tables.values())
    deleted = sum(len(t.delete) for t in plan.tables.values())
    return SyncReport(family, plan.full, written, deleted, plan.rendered, size, seconds)


def _ipv6_available(sysctl: Sysctl) -> bool:
    if sysctl.prefix:
        return sysctl.get("net/ipv6/conf/all/disable_ipv6") not in (None, "1")
    return os.path.exists("/proc/net/if_inet6")
