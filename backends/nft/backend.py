"""The nftables backend: render the node's state, apply it in one ``nft -f`` transaction."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from svcproxy.sdk import (
    Backend,
    Changes,
    NodeConfig,
    NodeState,
    ServicePortKey,
    ServicePortState,
)
from svcproxy.sdk.refusals import (
    Refusals,
    TooManyRefused,
    invalid_values,
    isolate,
    isolate_versions,
)

from .apply import NftError, NftRunner, Runner
from .context import FamilyContext, from_node_context, node_context
from .culprits import named_in_error
from .names import TABLE, lb_chain
from .service_rules import ServiceRules, render_service
from .skeleton import MAPS, SETS
from .table_state import Delta, FamilyTable, build_table, commit, full_text, plan_delta

log = logging.getLogger(__name__)

FAMILIES = (4, 6)


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What the last sync did (for logs and benchmarks)."""

    mode: str  # "replace", "reassert" or "delta"
    services: int
    text_bytes: int
    render_seconds: float
    apply_seconds: float


Records = dict[ServicePortKey, ServicePortState]
Item = tuple[ServicePortKey, ServicePortState]


def render_all(state: NodeState, ctx: FamilyContext) -> dict[ServicePortKey, ServiceRules]:
    """Every service port's rules in one family, in a stable order."""
    return render_records(state.services, ctx)


def render_records(
    records: Mapping[ServicePortKey, ServicePortState], ctx: FamilyContext
) -> dict[ServicePortKey, ServiceRules]:
    """The rules of ``records`` in one family, in a stable order."""
    result: dict[ServicePortKey, ServiceRules] = {}
    for key in sorted(records):
        rules = render_service(records[key], ctx)
        if rules is not None:
            result[key] = rules
    return result


class NftBackend(Backend):
    """Programs one table per address family (``ip svcproxy``, ``ip6 svcproxy``)."""

    name = "nft"
    # Unset --nodeport-addresses means the primary IPs, as kube-proxy's nftables mode.
    node_port_default = "primary"

    def __init__(
        self,
        config: NodeConfig,
        runner: Runner | None = None,
        families: Iterable[int] = FAMILIES,
        table: str = TABLE,
    ) -> None:
        self.config = config
        self.runner: Runner = runner or NftRunner()
        self.families = tuple(families)
        self.table = table
        self._tables: dict[int, FamilyTable] | None = None
        # The record of every service port in the tables (what the kernel accepted).
        self._accepted: Records = {}
        self.refusals = Refusals(self.name)
        self.last: SyncReport | None = None

    def _contexts(self, state: NodeState) -> dict[int, FamilyContext]:
        return {
            f: _with_table(from_node_context(node, f), self.table)
            for node in (node_context(self.config, state),) for f in self.families
        }

    def sync(self, state: NodeState, changes: Changes) -> None:
        with _collector_paused():
            self._sync(state, changes)

    def _sync(self, state: NodeState, changes: Changes) -> None:
        self.refusals.prune(state.services)
        contexts = self._contexts(state)
        tables = self._tables
        same_context = tables is not None and all(
            tables[f].ctx == ctx for f, ctx in contexts.items()
        )
        if tables is None or not same_context:
            if tables is not None:
                log.info("Node configuration changed (local traffic detection, node IPs or "
                         "service CIDRs): rewriting tables %s", self.table)
            self._full(state, contexts, previous=None)
        elif changes.full:
            self._full(state, contexts, previous=tables)
        else:
            self._delta(state, tables, changes.services)

    def _wanted(self, state: NodeState, key: ServicePortKey) -> ServicePortState | None:
        """The record to program for ``key``: the state's, unless this very version was
        refused (or has values no rule may hold): then the last accepted one, if any."""
        record = state.services.get(key)
        accepted = self._accepted.get(key)
        if record is accepted:
            return record
        if self.refusals and self.refusals.holds(key, record):
            return accepted
        if record is not None:
            reason = invalid_values(record)
            if reason is not None:
                self.refusals.refuse(key, record, f"invalid value: {reason}")
                return accepted
        return record

    def _full(
        self,
        state: NodeState,
        contexts: dict[int, FamilyContext],
        previous: dict[int, FamilyTable] | None,
    ) -> None:
        """Rewrite both tables; replace them unless ``previous`` says what is there."""
        start = time.perf_counter()
        records: Records = {}
        for key in state.services:
            record = self._wanted(state, key)
            if record is not None:
                records[key] = record
        rendered = {f: render_records(records, ctx) for f, ctx in contexts.items()}
        tables = {f: build_table(ctx, rendered[f]) for f, ctx in contexts.items()}
        text = "".join(
            full_text(t, previous[f] if previous else None) for f, t in tables.items()
        )
        mode = "reassert" if previous else "replace"
        try:
            self._apply(text, start, mode, len(state.services))
        except NftError as err:
            records, rendered = self._isolate_full(
                state, records, contexts, rendered, previous, text, err)
            tables = {f: build_table(ctx, rendered[f]) for f, ctx in contexts.items()}
        self._tables = tables
        self._accepted = records
        self._settle(state, records)
        # The kept tables are long-lived and acyclic: keep the cyclic collector off them.
        gc.freeze()

    @staticmethod
    def _full_text(
        contexts: Mapping[int, FamilyContext],
        rendered: Mapping[int, Mapping[ServicePortKey, ServiceRules]],
        previous: dict[int, FamilyTable] | None,
    ) -> str:
        return "".join(
            full_text(build_table(ctx, rendered[f]), previous[f] if previous else None)
            for f, ctx in contexts.items()
        )

    def _isolate_full(
        self,
        state: NodeState,
        records: Records,
        contexts: dict[int, FamilyContext],
        rendered: dict[int, dict[ServicePortKey, ServiceRules]],
        previous: dict[int, FamilyTable] | None,
        text: str,
        err: NftError,
    ) -> tuple[Records, dict[int, dict[ServicePortKey, ServiceRules]]]:
        """After a refused full transaction: find the refused service ports (new
        versions first, then their last accepted versions), apply the rest; return
        the records applied and their rules. Raises ``err`` when even the fixed
        objects are refused."""
        cache: dict[tuple[int, ServicePortKey], tuple[ServicePortState, ServiceRules | None]]
        cache = {}

        def rules_of(f: int, key: ServicePortKey, record: ServicePortState) -> ServiceRules | None:
            if records.get(key) is record:
                return rendered[f].get(key)
            hit = cache.get((f, key))
            if hit is None or hit[0] is not record:
                hit = cache[(f, key)] = (record, render_service(record, contexts[f]))
            return hit[1]

        def chosen(items: list[Item]) -> dict[int, dict[ServicePortKey, ServiceRules]]:
            ordered = sorted(items, key=_key)
            return {
                f: {k: r for k, rec in ordered if (r := rules_of(f, k, rec)) is not None}
                for f in contexts
            }

        last = [text]

        def text_of(items: list[Item]) -> str:
            last[0] = self._full_text(contexts, chosen(items), previous)
            return last[0]

        def named(error: str) -> list[ServicePortKey]:
            return named_in_error(last[0], error, rendered.values())

        if self._check(self._full_text(contexts, chosen([]), previous)) is not None:
            self._tables = None
            raise err
        try:
            accepted, refused = isolate_versions(
                records, self._accepted, lambda items: self._check(text_of(items)), str(err),
                named)
        except TooManyRefused:
            self._tables = None
            raise err from None
        items = sorted(accepted.items())
        start = time.perf_counter()
        self._apply(text_of(items), start, "replace" if previous is None else "reassert",
                    len(items))
        for key, error in refused.items():
            self.refusals.refuse(key, state.services.get(key), error)
        return accepted, chosen(items)

    def _check(self, text: str) -> str | None:
        try:
            self.runner.check(text)
        except NftError as err:
            return str(err)
        return None

    def _settle(self, state: NodeState, records: Mapping[ServicePortKey, ServicePortState]
                ) -> None:
        """Service ports applied as they are in the state are no longer refused."""
        if not self.refusals:
            return
        for key in list(self.refusals):
            record = state.services.get(key)
            if record is None and key not in records or (
                    record is not None and records.get(key) is record):
                self.refusals.clear(key)

    def _delta(
        self,
        state: NodeState,
        tables: dict[int, FamilyTable],
        keys: Iterable[ServicePortKey],
    ) -> None:
        """Rewrite only what the changed service ports own."""
        start = time.perf_counter()
        wanted = {k: self._wanted(state, k) for k in keys}
        rendered: dict[int, dict[ServicePortKey, ServiceRules | None]] = {
            f: {k: render_service(r, t.ctx) if r is not None else None
                for k, r in wanted.items()}
            for f, t in tables.items()
        }
        deltas = {f: plan_delta(t, rendered[f]) for f, t in tables.items()}
        text = "".join(d.text for d in deltas.values())
        applied: Iterable[ServicePortKey] = wanted
        try:
            self._apply(text, start, "delta", len(wanted), forget=False)
        except NftError as err:
            deltas, applied = self._isolate_delta(state, tables, wanted, rendered, err)
        for f, delta in deltas.items():
            commit(tables[f], delta)
        for key in applied:
            record = wanted[key]
            if record is None:
                self._accepted.pop(key, None)
            else:
                self._accepted[key] = record
        self._settle(state, self._accepted)

    def _isolate_delta(
        self,
        state: NodeState,
        tables: dict[int, FamilyTable],
        wanted: dict[ServicePortKey, ServicePortState | None],
        rendered: dict[int, dict[ServicePortKey, ServiceRules | None]],
        err: NftError,
    ) -> tuple[dict[int, Delta], list[ServicePortKey]]:
        """After a refused delta: find the refused service ports (they keep what the
        kernel holds for them), apply the others; return the deltas and keys applied."""

        def deltas_of(keys: list[ServicePortKey]) -> dict[int, Delta]:
            return {f: plan_delta(t, {k: rendered[f][k] for k in keys})
                    for f, t in tables.items()}

        def accepts(accepted: list[ServicePortKey], group: list[ServicePortKey]) -> str | None:
            return self._check("".join(d.text for d in deltas_of([*accepted, *group]).values()))

        try:
            accepted, refused = isolate(sorted(wanted), accepts, str(err),
                                        max(10, len(wanted) // 10))
        except TooManyRefused:
            self._tables = None
            raise err from None
        if not accepted and self._check(_probe(tables)) is not None:
            # Everything refused and our own objects are not what we kept (a flushed
            # ruleset?): the node's fault; the retry rewrites the tables.
            self._tables = None
            raise err
        deltas = deltas_of(accepted)
        try:
            self._apply("".join(d.text for d in deltas.values()), time.perf_counter(),
                        "delta", len(accepted), forget=False)
        except NftError:
            self._tables = None
            raise
        for key, error in refused:
            self.refusals.refuse(key, state.services.get(key), error)
        return deltas, accepted

    def _apply(self, text: str, start: float, mode: str, services: int,
               forget: bool = True) -> None:
        rendered = time.perf_counter()
        try:
            self.runner.apply(text)
        except NftError:
            if forget:
                self._tables = None
            log.warning("nft %s transaction of %d bytes was refused; nothing of it was "
                        "applied; looking for the service ports refused", mode, len(text))
            raise
        except Exception:
            self._tables = None
            raise
        done = time.perf_counter()
        self.last = SyncReport(mode, services, len(text), rendered - start, done - rendered)
        log.debug(
            "nft %s sync of %d service ports: %d bytes, render %.1f ms, apply %.1f ms",
            mode, services, len(text), 1e3 * (rendered - start), 1e3 * (done - rendered),
        )

    def applied_tables(self) -> dict[int, FamilyTable]:
        """What the last successful sync left in each family's table (read only)."""
        return dict(self._tables or {})

    def cleanup(self) -> None:
        """Delete our tables (and nothing else); fine if they do not exist."""
        text = "".join(
            f"add table {fam} {self.table}\ndelete table {fam} {self.table}\n"
            for fam in ("ip" if f == 4 else "ip6" for f in self.families)
        )
        self.runner.apply(text)
        self._tables = None


def _probe(tables: Mapping[int, FamilyTable]) -> str:
    """A transaction (to check, never to apply) that fails unless our tables still hold
    the sets, maps and shared chains the kept state says they do."""
    lines = []
    for table in tables.values():
        ref = f"{table.ctx.ipx} {table.ctx.table}"
        lines += [f"flush set {ref} {name}" for name in SETS]
        lines += [f"flush map {ref} {name}" for name in MAPS]
        lines += [f"flush chain {ref} {lb_chain(n)}" for n in sorted(table.lb_sizes)]
    return "\n".join(lines) + "\n"


def _key(item: Item) -> ServicePortKey:
    return item[0]


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic GC: rendering 100k endpoints otherwise triggers it dozens of
    times over a growing heap, tripling the time of a full sync."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _with_table(ctx: FamilyContext, table: str) -> FamilyContext:
    return ctx if ctx.table == table else replace(ctx, table=table)
