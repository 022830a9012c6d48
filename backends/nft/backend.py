"""The nftables backend: render -> diff -> apply (the SDK's ``StagedBackend``), each apply
one ``nft -f`` transaction.

* render: one service port's rules in each family (pure, ``render_service``);
* diff: the SDK's, against what the last successful apply left (``self.applied``), so a
  periodic resync with nothing changed renders nothing and writes nothing;
* apply: a rebuild replaces the tables (first sync, after a failure, a new node
  context); otherwise the changed service ports' chains, sets and elements only.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from svcproxy.sdk import (
    Changes,
    Delta,
    NodeConfig,
    NodeState,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
)
from svcproxy.sdk.refusals import (
    Refusals,
    TooManyRefused,
    invalid_values,
    isolate,
    isolate_versions,
)

from .affinity import learnt_clients, restore_lines
from .apply import NftError, NftRunner, Runner
from .claims import Delta as TableDelta
from .claims import FamilyTable, build_table, commit, full_text, plan_delta
from .context import NODE_PORT_DEFAULT, FamilyContext, from_node_context, node_context
from .culprits import named_in_error
from .names import TABLE, lb_chain
from .service_rules import ServiceRules, render_service
from .skeleton import MAPS, SETS

log = logging.getLogger(__name__)

FAMILIES = (4, 6)

# What one service port holds in each family's table (in ``families`` order).
PerFamily = tuple[ServiceRules | None, ...]


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What the last transaction did (for logs and benchmarks)."""

    mode: str  # "replace" (a rebuild) or "delta"
    services: int
    text_bytes: int
    render_seconds: float
    apply_seconds: float


class FamilyView(Mapping[ServicePortKey, ServiceRules]):
    """One family's rules of per-family values (read only; what ``plan_delta`` reads as
    what each service port applied)."""

    def __init__(self, values: Mapping[ServicePortKey, PerFamily], index: int) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: ServicePortKey) -> ServiceRules:
        rules = self._values[key][self._index]
        if rules is None:
            raise KeyError(key)
        return rules

    def __iter__(self) -> Iterator[ServicePortKey]:
        i = self._index
        return (k for k, v in self._values.items() if v[i] is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class NftBackend(StagedBackend[PerFamily]):
    """Programs one table per address family (``ip svcproxy``, ``ip6 svcproxy``)."""

    name = "nft"
    node_port_default = NODE_PORT_DEFAULT

    def __init__(
        self,
        config: NodeConfig,
        runner: Runner | None = None,
        families: tuple[int, ...] | list[int] = FAMILIES,
        table: str = TABLE,
    ) -> None:
        super().__init__()
        self.config = config
        self.runner: Runner = runner or NftRunner()
        self.families = tuple(families)
        self.table = table
        # The claims of the applied rules per family; None: the tables are unknown.
        self._tables: dict[int, FamilyTable] | None = None
        self._contexts: dict[int, FamilyContext] = {}
        self._context_cache: tuple[object, dict[int, FamilyContext]] | None = None
        self._state: NodeState | None = None
        # During a rebuild: per family, the clients affinity sets had learnt (kept).
        self._clients: dict[int, dict[str, str]] = {}
        self._retried: set[ServicePortKey] = set()
        self.refusals = Refusals(self.name)
        self.last: SyncReport | None = None

    def _family_contexts(self, state: NodeState) -> dict[int, FamilyContext]:
        """Each family's rendering context; resolved again only for another node context
        (or, without the agent's, another Node)."""
        source = state.context if state.context is not None else state.node
        cached = self._context_cache
        if cached is not None and (cached[0] is source or cached[0] == source):
            return cached[1]
        node = node_context(self.config, state, self.node_port_default)
        contexts = {f: _with_table(from_node_context(node, f), self.table)
                    for f in self.families}
        self._context_cache = (source, contexts)
        return contexts

    def sync(self, state: NodeState, changes: Changes) -> None:
        with _collector_paused():
            self.refusals.prune(state.services)
            self._state, self._retried = state, set()
            super().sync(state, changes)
            # A refused service port whose new version was applied is no longer refused.
            for key in self._retried:
                if not self.refusals.holds(key, state.services.get(key)):
                    self.refusals.clear(key)

    def diff(self, state: NodeState, changes: Changes) -> Delta[ServicePortKey, PerFamily]:
        """The SDK's diff; a new node context (local traffic detection, node IPs, service
        CIDRs) changes the tables' skeleton: everything is rebuilt."""
        contexts = self._family_contexts(state)
        tables = self._tables
        if tables is None or any(tables[f].ctx != c for f, c in contexts.items()):
            if tables is not None:
                log.info("Node configuration changed (local traffic detection, node IPs or "
                         "service CIDRs): rewriting tables %s", self.table)
            self.applied.invalidate()
        self._contexts = contexts
        return super().diff(state, changes)

    def render(self, state: NodeState, record: ServicePortState) -> PerFamily | None:
        """The record's rules in each family; a version refused (or with values no rule
        may hold) keeps what was applied for the service port."""
        key = record.key
        if self.refusals:
            if self.refusals.holds(key, record):
                return self.applied.get(key)
            if key in self.refusals:
                self._retried.add(key)
        reason = invalid_values(record)
        if reason is not None:
            self.refusals.refuse(key, record, f"invalid value: {reason}", retry=False)
            return self.applied.get(key)
        rules = tuple(render_service(record, self._contexts[f]) for f in self.families)
        return rules if any(r is not None for r in rules) else None

    def apply(self, delta: Delta[ServicePortKey, PerFamily]
              ) -> Delta[ServicePortKey, PerFamily] | None:
        """One transaction; when the kernel refuses it, the service ports it refuses are
        found and left out, and the others applied (the part applied is returned)."""
        start = time.perf_counter()
        try:
            if delta.rebuild:
                return self._rebuild(delta, start)
            return self._update(delta, start)
        except BaseException:
            self._tables = None
            raise

    def _rebuild(self, delta: Delta[ServicePortKey, PerFamily], start: float
                 ) -> Delta[ServicePortKey, PerFamily] | None:
        """Replace the tables by ``delta.set`` (the clients affinity sets learnt kept)."""
        values = dict(sorted(delta.set.items(), key=_key))
        self._clients = self._learnt_clients(values)
        try:
            tables, text = self._full(values)
            try:
                self._apply(text, start, "replace", len(values))
            except NftError as err:
                values = self._isolate_full(values, text, err)
                tables, _ = self._full(values)
        finally:
            self._clients = {}
        self._tables = tables
        # The kept rules are long-lived and acyclic: keep the cyclic collector off them.
        gc.freeze()
        return None if len(values) == len(delta.set) else Delta(True, values)

    def _full(self, values: Mapping[ServicePortKey, PerFamily]
              ) -> tuple[dict[int, FamilyTable], str]:
        """The claims and the text of tables holding exactly ``values``."""
        tables: dict[int, FamilyTable] = {}
        text = []
        for i, f in enumerate(self.families):
            rules = {k: r for k, v in values.items() if (r := v[i]) is not None}
            tables[f] = build_table(self._contexts[f], rules)
            text.append(full_text(tables[f], rules))
            if clients := self._clients.get(f):
                ctx = self._contexts[f]
                sets = {n for r in rules.values() for n in r.sets}
                text += [f"{line}\n" for line in
                         restore_lines(f"{ctx.ipx} {ctx.table}", clients, sets)]
        return tables, "".join(text)

    def _learnt_clients(self, values: Mapping[ServicePortKey, PerFamily]
                        ) -> dict[int, dict[str, str]]:
        """Per family, the clients the affinity sets of ``values`` hold in the kernel now
        (read only when some service port has affinity; unreadable: none kept)."""
        found: dict[int, dict[str, str]] = {}
        for i, f in enumerate(self.families):
            if not any((r := v[i]) is not None and r.sets for v in values.values()):
                continue
            ctx = self._contexts[f]
            try:
                clients = learnt_clients(self.runner.list_sets(ctx.ipx), ctx.table)
            except (NftError, OSError, ValueError) as err:
                log.warning("Cannot read the session-affinity sets of %s %s (%s): the "
                            "rebuild starts them empty", ctx.ipx, ctx.table, err)
                continue
            if clients:
                found[f] = clients
        return found

    def _isolate_full(self, values: dict[ServicePortKey, PerFamily], text: str,
                      err: NftError) -> dict[ServicePortKey, PerFamily]:
        """After a refused rebuild: find the refused service ports and apply the others;
        return what was applied. Raises ``err`` when even the fixed objects are refused."""
        last = [text]

        def text_of(items: list[tuple[ServicePortKey, PerFamily]]) -> str:
            last[0] = self._full(dict(items))[1]
            return last[0]

        def named(error: str) -> list[ServicePortKey]:
            views = [FamilyView(values, i) for i in range(len(self.families))]
            return named_in_error(last[0], error, views)

        if self._check(self._full({})[1]) is not None:
            raise err
        try:
            accepted, refused = isolate_versions(
                values, {}, lambda items: self._check(text_of(items)), str(err), named)
        except TooManyRefused:
            raise err from None
        applied = dict(sorted(accepted.items(), key=_key))
        self._apply(text_of(list(applied.items())), time.perf_counter(), "replace",
                    len(applied))
        self._refuse(refused.items())
        return applied

    def _update(self, delta: Delta[ServicePortKey, PerFamily], start: float
                ) -> Delta[ServicePortKey, PerFamily] | None:
        """Rewrite only what the changed service ports own."""
        tables = self._tables
        assert tables is not None, "a delta without tables: diff rebuilds then"
        updates: dict[ServicePortKey, PerFamily | None] = dict.fromkeys(delta.removed)
        updates.update(delta.set)
        old = {f: FamilyView(self.applied, i) for i, f in enumerate(self.families)}
        per = {f: {k: None if v is None else v[i] for k, v in updates.items()}
               for i, f in enumerate(self.families)}
        deltas = {f: plan_delta(t, old[f], per[f]) for f, t in tables.items()}
        done: Delta[ServicePortKey, PerFamily] | None = None
        try:
            self._apply("".join(d.text for d in deltas.values()), start, "delta", len(updates))
        except NftError as err:
            deltas, keys = self._isolate_delta(tables, old, per, err)
            done = Delta(False, _only(delta.set, keys), _only(delta.removed, keys),
                         _only(delta.previous, keys))
        for f, d in deltas.items():
            commit(tables[f], d)
        return done

    def _isolate_delta(
        self,
        tables: dict[int, FamilyTable],
        old: Mapping[int, Mapping[ServicePortKey, ServiceRules]],
        per: Mapping[int, Mapping[ServicePortKey, ServiceRules | None]],
        err: NftError,
    ) -> tuple[dict[int, TableDelta], list[ServicePortKey]]:
        """After a refused delta: find the refused service ports (they keep what the
        kernel holds for them), apply the others; return the deltas and keys applied."""

        def deltas_of(keys: list[ServicePortKey]) -> dict[int, TableDelta]:
            return {f: plan_delta(t, old[f], {k: per[f][k] for k in keys})
                    for f, t in tables.items()}

        def accepts(accepted: list[ServicePortKey], group: list[ServicePortKey]) -> str | None:
            return self._check("".join(d.text for d in deltas_of([*accepted, *group]).values()))

        keys = sorted(per[self.families[0]])
        try:
            accepted, refused = isolate(keys, accepts, str(err), max(10, len(keys) // 10))
        except TooManyRefused:
            raise err from None
        if not accepted and self._check(_probe(tables)) is not None:
            # Everything refused and our own objects are not what we kept (a flushed
            # ruleset?): the node's fault; the retry rewrites the tables.
            raise err
        deltas = deltas_of(accepted)
        self._apply("".join(d.text for d in deltas.values()), time.perf_counter(),
                    "delta", len(accepted))
        self._refuse(refused)
        return deltas, accepted

    def _refuse(self, refused: Iterable[tuple[ServicePortKey, str]]) -> None:
        state = self._state
        for key, error in refused:
            self.refusals.refuse(key, state.services.get(key) if state else None, error)

    def _check(self, text: str) -> str | None:
        try:
            self.runner.check(text)
        except NftError as err:
            return str(err)
        return None

    def _apply(self, text: str, start: float, mode: str, services: int) -> None:
        rendered = time.perf_counter()
        try:
            self.runner.apply(text)
        except NftError:
            log.warning("nft %s transaction of %d bytes was refused; nothing of it was "
                        "applied; looking for the service ports refused", mode, len(text))
            raise
        done = time.perf_counter()
        self.last = SyncReport(mode, services, len(text), rendered - start, done - rendered)
        log.debug(
            "nft %s sync of %d service ports: %d bytes, diff %.1f ms, apply %.1f ms",
            mode, services, len(text), 1e3 * (rendered - start), 1e3 * (done - rendered),
        )

    def applied_text(self) -> str:
        """The text that writes what the last successful sync left, whole (benchmarks)."""
        tables = self._tables or {}
        return "".join(full_text(tables[f], FamilyView(self.applied, i))
                       for i, f in enumerate(self.families) if f in tables)

    def cleanup(self) -> None:
        """Delete our tables (and nothing else); fine if they do not exist."""
        text = "".join(
            f"add table {fam} {self.table}\ndelete table {fam} {self.table}\n"
            for fam in ("ip" if f == 4 else "ip6" for f in self.families)
        )
        self._tables = None
        self.applied.invalidate()
        self.runner.apply(text)


def _only(items: Mapping[ServicePortKey, PerFamily], keys: list[ServicePortKey]
          ) -> dict[ServicePortKey, PerFamily]:
    return {k: items[k] for k in keys if k in items}


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


def _key(item: tuple[ServicePortKey, object]) -> tuple[str, str, str, str]:
    """A service port's order (ServicePortKey's, compared as a tuple of its fields: ~10x
    fewer Python calls than the dataclass's ``__lt__`` when sorting 10,000 of them)."""
    key = item[0]
    return key.namespace, key.name, key.port_name, key.protocol


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
