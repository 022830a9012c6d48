"""The nftables backend: render the node's state, apply it in one ``nft -f`` transaction."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from svcproxy.sdk import Backend, Changes, NodeConfig, NodeState, ServicePortKey

from .apply import NftRunner, Runner
from .context import FamilyContext, family_context
from .names import TABLE
from .service_rules import ServiceRules, render_service
from .table_state import FamilyTable, build_table, commit, full_text, plan_delta

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


def render_all(state: NodeState, ctx: FamilyContext) -> dict[ServicePortKey, ServiceRules]:
    """Every service port's rules in one family, in a stable order."""
    result: dict[ServicePortKey, ServiceRules] = {}
    for key in sorted(state.services):
        rules = render_service(state.services[key], ctx)
        if rules is not None:
            result[key] = rules
    return result


class NftBackend(Backend):
    """Programs one table per address family (``ip svcproxy``, ``ip6 svcproxy``)."""

    name = "nft"

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
        self.last: SyncReport | None = None

    def _contexts(self, state: NodeState) -> dict[int, FamilyContext]:
        return {
            f: _with_table(family_context(self.config, state.node, f), self.table)
            for f in self.families
        }

    def sync(self, state: NodeState, changes: Changes) -> None:
        with _collector_paused():
            self._sync(state, changes)

    def _sync(self, state: NodeState, changes: Changes) -> None:
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

    def _full(
        self,
        state: NodeState,
        contexts: dict[int, FamilyContext],
        previous: dict[int, FamilyTable] | None,
    ) -> None:
        """Rewrite both tables; replace them unless ``previous`` says what is there."""
        start = time.perf_counter()
        tables = {f: build_table(ctx, render_all(state, ctx)) for f, ctx in contexts.items()}
        text = "".join(
            full_text(t, previous[f] if previous else None) for f, t in tables.items()
        )
        mode = "reassert" if previous else "replace"
        self._apply(text, start, mode, len(state.services))
        self._tables = tables
        # The kept tables are long-lived and acyclic: keep the cyclic collector off them.
        gc.freeze()

    def _delta(
        self,
        state: NodeState,
        tables: dict[int, FamilyTable],
        keys: Iterable[ServicePortKey],
    ) -> None:
        """Rewrite only what the changed service ports own."""
        start = time.perf_counter()
        keys = list(keys)
        deltas = {}
        for f, table in tables.items():
            updates = {
                k: render_service(state.services[k], table.ctx) if k in state.services else None
                for k in keys
            }
            deltas[f] = plan_delta(table, updates)
        text = "".join(d.text for d in deltas.values())
        self._apply(text, start, "delta", len(keys))
        for f, delta in deltas.items():
            commit(tables[f], delta)

    def _apply(self, text: str, start: float, mode: str, services: int) -> None:
        rendered = time.perf_counter()
        try:
            self.runner.apply(text)
        except Exception:
            self._tables = None
            log.warning("nft %s transaction of %d bytes was refused; nothing of it was "
                        "applied and the next sync replaces the tables", mode, len(text))
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
