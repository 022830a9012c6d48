"""The nftables backend: render -> diff -> apply (the SDK's ``StagedBackend``), each apply
one ``nft -f`` transaction.

* render: one service port's rules in each family (pure, ``render_service``);
* diff: the SDK's, against what the last successful apply left (``self.applied``), so a
  periodic resync with nothing changed renders nothing and writes nothing;
* apply: a rebuild replaces the tables (first sync, after a failure, a new node
  context); otherwise the changed service ports' chains, sets and elements only;
* drift: the chains each transaction wrote are read back at once over netlink
  (``kernel_view``: their digests are the reference); every periodic resync reads the
  tables and compares them with what was applied and read back (``drift``); what differs
  is written again from the applied values (``Delta.repair``), a drifted skeleton
  rebuilds the tables;
* a chain the kernel will not delete because a foreign rule jumps to it (EBUSY) is left
  in place, the rest of the service port's change applied, the culprit logged, and the
  deletion retried with the refusals' backoff until it succeeds.
"""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from svcproxy.sdk import (
    Changes,
    Delta,
    Drift,
    NodeConfig,
    NodeState,
    Refusals,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
    TooManyRefused,
    describe_service_port,
    isolate,
    isolate_versions,
)

from .affinity import learnt_clients, restore_lines
from .apply import NftError, NftRunner, Runner
from .context import NODE_PORT_DEFAULT, TableContext, from_node_context, node_context
from .culprits import foreign_jumps, named_in_error
from .drift import Learnt, compare
from .elements import encode, layouts
from .kernel_view import KernelReadError, TableReader, TableView, netns_path
from .names import TABLE, lb_chain
from .render import ServiceObjects, render_service
from .render_skeleton import MAPS, SETS, chain_block, skeleton_chains
from .render_table import (
    FamilyTable,
    TableDelta,
    build_table,
    commit,
    element_lines,
    full_text,
    plan_delta,
)

log = logging.getLogger(__name__)

FAMILIES = (4, 6)
# A write of more chains than this is taken as read back when someone else committed
# between the write and the read (a small one's chains are written again instead).
READ_BACK_MAX = 200

# What one service port holds in each family's table (in ``families`` order).
PerFamily = tuple[ServiceObjects | None, ...]
_REFERENCES = re.compile(r"(?:goto|jump) (\S+)|@(\S+)")


@dataclass(frozen=True, slots=True)
class TransactionReport:
    """What the last transaction did (for logs and benchmarks)."""

    mode: str  # "replace" (a rebuild) or "delta"
    services: int
    text_bytes: int
    render_seconds: float
    apply_seconds: float


class FamilyView(Mapping[ServicePortKey, ServiceObjects]):
    """One family's rules of per-family values (read only; what ``plan_delta`` reads as
    what each service port applied)."""

    def __init__(self, values: Mapping[ServicePortKey, PerFamily], index: int) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: ServicePortKey) -> ServiceObjects:
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
        reader: TableReader | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.runner: Runner = runner or NftRunner()
        # Reads the tables for the drift check, in the namespace the runner writes to.
        self.reader = reader or TableReader(netns_path(getattr(self.runner, "prefix", ())))
        self.families = tuple(families)
        self.table = table
        # The claims of the applied rules per family; None: the tables are unknown.
        self._tables: dict[int, FamilyTable] | None = None
        self._contexts: dict[int, TableContext] = {}
        self._context_cache: tuple[object, dict[int, TableContext]] | None = None
        self._state: NodeState | None = None
        # During a rebuild: per family, the clients affinity sets had learnt (kept).
        self._clients: dict[int, dict[str, str]] = {}
        self._retried: set[ServicePortKey] = set()
        self.refusals = Refusals(self.name)
        self.last: TransactionReport | None = None
        # The drift check's: per family what it learnt and read; the service ports found.
        self._learnt: dict[int, Learnt] = {}
        self._views: dict[int, TableView] = {}
        self._drifted: frozenset[ServicePortKey] = frozenset()
        # The ruleset's generation read right before the last transaction (None: unknown),
        # and the one at which the kernel was last seen holding all that was applied.
        self._generation: int | None = None
        self._verified: int | None = None
        # Per family: chains and sets the kernel would not delete (a foreign rule uses
        # them) -> (kind, the service port that left them, the culprit).
        self._leftovers: dict[int, dict[str, tuple[str, ServicePortKey, str]]] = {}

    def _family_contexts(self, state: NodeState) -> dict[int, TableContext]:
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
            try:
                super().sync(state, changes)
            finally:
                self._views, self._drifted = {}, frozenset()
            # A refused service port whose new version was applied is no longer refused
            # (unless it left a chain behind: then once that is deleted).
            owners = self._leftover_owners()
            for key in self._retried:
                if key not in owners and not self.refusals.holds(key, state.services.get(key)):
                    self.refusals.clear(key)
            if self._leftovers:
                self._delete_leftovers(state)

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

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        """Read each family's table (netlink: chains, rule counts and digests, sets, our
        sets' and maps' elements) and compare it with what was applied; only the
        ruleset's generation when no transaction was committed since the kernel was
        last seen holding all of it."""
        tables = self._tables
        if tables is None:
            return Drift()
        try:
            before: int | None = self.reader.generation()
        except KernelReadError:
            before = None
        if before is not None and before == self._verified:
            return Drift()  # nothing committed since all of it was seen as applied
        drifted: set[ServicePortKey] = set()
        for i, f in enumerate(self.families):
            table = tables[f]
            ctx = table.ctx
            try:
                view = self.reader.read(ctx.ipx, ctx.table, layouts(ctx, table.lb_sizes))
            except KernelReadError as err:
                log.warning("Cannot read %s %s to check it (%s): not checked this period",
                            ctx.ipx, ctx.table, err)
                return Drift()
            learnt = self._learnt.setdefault(f, Learnt())
            keys, why = compare(table, FamilyView(self.applied, i), view, learnt)
            if why:
                return Drift(skeleton=f"{ctx.ipx} {ctx.table}: {why}")
            drifted |= keys
            if view is not None:
                self._views[f] = view
        self._drifted = frozenset(drifted)
        if not drifted:
            try:
                after: int | None = self.reader.generation()
            except KernelReadError:
                after = None
            self._verified = after if after is not None and after == before else None
        return Drift(self._drifted)

    def render(self, state: NodeState, record: ServicePortState) -> PerFamily | None:
        """The record's rules in each family (the SDK's stages screen out a version
        refused, or with values no rule may hold: it keeps what was applied)."""
        if record.key in self.refusals:
            self._retried.add(record.key)  # refused before, its retry due
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
        self._learnt = self._read_tables(tables)
        for key in self._leftover_owners():  # the tables were replaced: nothing is left
            self.refusals.clear(key)
        self._leftovers = {}
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
        repair = dict(delta.repair)
        for key in self._drifted:  # changed now and drifted: put back what was applied first
            if key in self.applied and (key in delta.set or key in delta.removed):
                repair[key] = self.applied[key]
        if repair:
            self._repair(repair)
        updates: dict[ServicePortKey, PerFamily | None] = dict.fromkeys(delta.removed)
        updates.update(delta.set)
        if not updates:
            return None
        old = {f: FamilyView(self.applied, i) for i, f in enumerate(self.families)}
        per = {f: {k: None if v is None else v[i] for k, v in updates.items()}
               for i, f in enumerate(self.families)}
        deltas = {f: plan_delta(t, old[f], per[f], existing=self._leftovers.get(f, {}))
                  for f, t in tables.items()}
        done: Delta[ServicePortKey, PerFamily] | None = None
        try:
            self._apply("".join(d.text for d in deltas.values()), start, "delta", len(updates))
        except NftError as err:
            deltas, keys = self._isolate_delta(tables, old, per, err)
            done = Delta(False, _only(delta.set, keys), _only(delta.removed, keys),
                         _only(delta.previous, keys))
        for f, d in deltas.items():
            commit(tables[f], d)
            self._ours_again(f, [r for r in d.services.values() if r is not None])
            self._read_back(f, d.written, d.deleted)
        return done

    def _ours_again(self, family: int, rules: Iterable[ServiceObjects]) -> None:
        """Chains and sets left in place before (a foreign rule used them) that these
        rules own again."""
        left = self._leftovers.get(family)
        if left:
            for name in (n for r in rules for n in (*r.chains, *r.sets)):
                left.pop(name, None)

    def _read_back(self, family: int, written: Iterable[str], deleted: Iterable[str] = ()
                   ) -> None:
        """The chains the last transaction wrote, read back at once: what the drift check
        compares with (not what the first check finds, which may already be someone
        else's). If the ruleset's generation says someone else committed between the
        write and the read (more than our one transaction), a small write's chains are
        not known as written (written again at the next check); a larger one's (more
        than ``READ_BACK_MAX`` chains) are taken as read."""
        assert self._tables is not None
        ctx = self._tables[family].ctx
        learnt = self._learnt.setdefault(family, Learnt())
        names = list(dict.fromkeys(written))
        learnt.forget([*names, *deleted])
        if not names:
            return
        try:
            got = self.reader.chains(ctx.ipx, ctx.table, names)
            after = self.reader.generation()
        except KernelReadError as err:
            log.warning("Cannot read back the chains just written to %s %s (%s): they are "
                        "written again at the next check", ctx.ipx, ctx.table, err)
            return
        before = self._generation
        if before is None or after - before > 1:
            log.debug("%s %s: the ruleset's generation went %s -> %s over one transaction: "
                      "someone else committed meanwhile", ctx.ipx, ctx.table, before, after)
            if len(names) <= READ_BACK_MAX:
                return
        learnt.learn({name: view.digest for name, view in got.items()})

    def _read_tables(self, tables: Mapping[int, FamilyTable]) -> dict[int, Learnt]:
        """After a rebuild: every chain of each table, read back at once (one dump per
        family; taken as read even if someone else committed meanwhile, as a large
        write's chains are)."""
        learnt: dict[int, Learnt] = {}
        for f, table in tables.items():
            ctx = table.ctx
            try:
                view = self.reader.read(ctx.ipx, ctx.table)
            except KernelReadError as err:
                log.warning("Cannot read back %s %s just written (%s): it is written again "
                            "at the next check", ctx.ipx, ctx.table, err)
                view = None
            learnt[f] = Learnt({name: c.digest for name, c in view.chains.items()}
                               if view is not None else {})
        return learnt

    def _repair(self, items: Mapping[ServicePortKey, PerFamily]) -> None:
        """Write the applied objects of ``items`` again (changed behind our back): their
        chains whole, their sets, the elements the kernel lacks or holds otherwise. One
        that the kernel refuses is left for the next check (raises when all are)."""
        keys = sorted(items, key=lambda k: (k.namespace, k.name, k.port_name, k.protocol))

        def text_of(chosen: list[ServicePortKey]) -> str:
            return "".join(self._repair_text(f, i, [items[k] for k in chosen])
                           for i, f in enumerate(self.families))

        accepted = keys
        try:
            self._apply(text_of(keys), time.perf_counter(), "repair", len(keys))
        except NftError as err:
            try:
                accepted, refused = isolate(keys, lambda a, g: self._check(text_of([*a, *g])),
                                            str(err))
            except TooManyRefused:
                raise err from None
            self._apply(text_of(accepted), time.perf_counter(), "repair", len(accepted))
            for key, error in refused:
                log.warning("Cannot write service port %s again (%s): tried at the next "
                            "check", describe_service_port(key), error)
        for i, f in enumerate(self.families):
            rules = [r for k in accepted if (r := items[k][i]) is not None]
            self._ours_again(f, rules)
            self._read_back(f, [n for r in rules for n in r.chains])

    def _repair_text(self, family: int, index: int, values: Iterable[PerFamily]) -> str:
        """The text writing ``values``' objects in one family again, idempotently."""
        assert self._tables is not None
        table = self._tables[family]
        ctx, view = table.ctx, self._views.get(family)
        ref = f"{ctx.ipx} {ctx.table}"
        sets: dict[str, str] = {}
        chains: dict[str, tuple[str, ...]] = {}
        adds: dict[tuple[str, str], str] = {}
        deletes: dict[tuple[str, str], str] = {}
        for value in values:
            rules = value[index]
            if rules is None:
                continue
            sets.update(rules.sets)
            chains.update(rules.chains)
            for container, key, own in rules.elements:
                eid = (container, key)
                applied = table.applied.get(eid)
                want = applied[0] if applied is not None else own
                held = _held(view, ctx.ipx, container, key, want)
                if held == "same":
                    continue
                if held == "other":
                    deletes[eid] = ""
                adds[eid] = want
        lines = [f"add set {ref} {n} {{ {d} }}" for n, d in sets.items()]
        lines += [f"add chain {ref} {n}" for n in chains]
        lines += [f"flush chain {ref} {n}" for n in chains]
        if chains:
            body = "\n".join(chain_block(n, r) for n, r in chains.items())
            lines.append(f"table {ref} {{\n{body}\n}}")
        lines += element_lines(ctx, "delete", deletes.items())
        lines += element_lines(ctx, "add", adds.items())
        return "\n".join(lines) + "\n" if lines else ""

    def _isolate_delta(
        self,
        tables: dict[int, FamilyTable],
        old: Mapping[int, Mapping[ServicePortKey, ServiceObjects]],
        per: Mapping[int, Mapping[ServicePortKey, ServiceObjects | None]],
        err: NftError,
    ) -> tuple[dict[int, TableDelta], list[ServicePortKey]]:
        """After a refused delta: find the refused service ports (they keep what the
        kernel holds for them), apply the others; return the deltas and keys applied."""

        keep: dict[int, dict[str, tuple[str, ServicePortKey, str]]] = {}

        def deltas_of(keys: list[ServicePortKey]) -> dict[int, TableDelta]:
            return {f: plan_delta(t, old[f], {k: per[f][k] for k in keys}, keep.get(f, {}),
                                  self._leftovers.get(f, {}))
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
        busy = [k for k, error in refused if "busy" in error.lower()]
        if busy:
            keep.update(self._kept(busy, old, per))
            lenient = sorted({k for left in keep.values() for _, k, _ in left.values()})
            if lenient and accepts(accepted, lenient) is None:
                accepted += lenient
                refused = [(k, e) for k, e in refused if k not in lenient]
            else:
                keep.clear()
        deltas = deltas_of(accepted)
        self._apply("".join(d.text for d in deltas.values()), time.perf_counter(),
                    "delta", len(accepted))
        self._refuse(refused)
        for f, left in keep.items():
            self._leave(f, left)
        return deltas, accepted

    def _kept(self, keys: list[ServicePortKey],
              old: Mapping[int, Mapping[ServicePortKey, ServiceObjects]],
              per: Mapping[int, Mapping[ServicePortKey, ServiceObjects | None]],
              ) -> dict[int, dict[str, tuple[str, ServicePortKey, str]]]:
        """Per family, the chains (and what they use) that ``keys`` stop using and that a
        foreign rule jumps to: the kernel will not delete them (kind, owner, culprit)."""
        assert self._tables is not None
        found: dict[int, dict[str, tuple[str, ServicePortKey, str]]] = {}
        for f, table in self._tables.items():
            ctx = table.ctx
            try:
                view = self.reader.read(ctx.ipx, ctx.table, expressions=True)
            except KernelReadError:
                continue
            if view is None:
                continue
            ours = set(skeleton_chains(ctx)) | {lb_chain(n) for n in table.lb_sizes}
            ours.update(n for r in old[f].values() for n in r.chains)
            left: dict[str, tuple[str, ServicePortKey, str]] = {}
            for key in keys:
                before, after = old[f].get(key), per[f].get(key)
                if before is None:
                    continue
                gone = [n for n in before.chains if after is None or n not in after.chains]
                for name in gone:
                    culprits = foreign_jumps(view, ours, name)
                    if culprits:
                        _keep_with_uses(left, before, name, key, "; ".join(culprits))
            if left:
                found[f] = left
        return found

    def _leave(self, family: int, left: Mapping[str, tuple[str, ServicePortKey, str]]
               ) -> None:
        """Chains and sets left in the kernel: logged with the culprit, their service port
        refused (retried with backoff) until they are deleted."""
        assert self._tables is not None
        ctx = self._tables[family].ctx
        self._leftovers.setdefault(family, {}).update(left)
        state = self._state
        errors: dict[ServicePortKey, str] = {}
        for name, (kind, key, culprit) in left.items():
            if kind != "chain" or key in errors:
                continue
            errors[key] = (f"chain {name} of {ctx.ipx} {ctx.table} cannot be deleted: "
                           f"{culprit}, not svcproxy's, jumps to it; the chain is left in "
                           "place (the rest of the change is applied) and deleted once that "
                           "rule is gone")
        for key, error in errors.items():
            log.warning("Backend %s: service port %s: %s", self.name,
                        describe_service_port(key), error)
            self.refusals.refuse(key, state.services.get(key) if state else None, error)

    def _leftover_owners(self) -> set[ServicePortKey]:
        return {key for left in self._leftovers.values() for _, key, _ in left.values()}

    def _delete_leftovers(self, state: NodeState) -> None:
        """Try again to delete what was left (for service ports whose retry is due):
        chains first, then sets, each alone; what still cannot go waits another backoff."""
        assert self._tables is not None
        due = {k for k in self._leftover_owners()
               if not self.refusals.holds(k, state.services.get(k))}
        if not due:
            return
        for f, left in self._leftovers.items():
            ctx = self._tables[f].ctx
            order = sorted(left.items(), key=lambda item: item[1][0] != "chain")
            for _ in range(len(order)):  # a chain may be used by another one left
                progress = False
                for name, (kind, key, _culprit) in order:
                    if key not in due or name not in left:
                        continue
                    try:
                        self.runner.apply(f"delete {kind} {ctx.ipx} {ctx.table} {name}\n")
                    except NftError:
                        continue
                    del left[name]
                    progress = True
                if not progress:
                    break
        still = self._leftover_owners()
        for key in due:
            record = state.services.get(key)
            if key in still:
                error = self.refusals[key].error if key in self.refusals else "chain left"
                self.refusals.refuse(key, record, error)
            else:
                log.info("Backend %s: service port %s: what the foreign rule kept is now "
                         "deleted", self.name, describe_service_port(key))
                self.refusals.clear(key)
        self._leftovers = {f: left for f, left in self._leftovers.items() if left}

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
            self._generation = self.reader.generation()
        except KernelReadError:
            self._generation = None
        try:
            self.runner.apply(text)
        except NftError:
            log.warning("nft %s transaction of %d bytes was refused; nothing of it was "
                        "applied; looking for the service ports refused", mode, len(text))
            raise
        done = time.perf_counter()
        self._verified_after(self._generation)
        self.last = TransactionReport(mode, services, len(text), rendered - start, done - rendered)
        log.debug(
            "nft %s sync of %d service ports: %d bytes, diff %.1f ms, apply %.1f ms",
            mode, services, len(text), 1e3 * (rendered - start), 1e3 * (done - rendered),
        )

    def _verified_after(self, before: int | None) -> None:
        """After our transaction: if the kernel was seen holding all of it before, and
        ours is the only one committed since, it still does (the next check reads only
        the generation); otherwise the next check reads the tables."""
        try:
            after = self.reader.generation()
        except KernelReadError:
            after = None
        clean = before is not None and after is not None and after - before <= 1
        self._verified = after if clean and self._verified == before else None

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


def _held(view: TableView | None, ipx: str, container: str, key: str, want: str) -> str:
    """Whether the kernel (as last read) holds an element as wanted: "same", "other" (a
    value of its own) or "missing" (also when unknown)."""
    if view is None or container not in view.elements:
        return "missing"
    pair = encode(ipx, container, key, want)
    held = view.elements[container].get(pair[0], None)
    if held is None:
        return "missing"
    return "same" if held == pair[1] else "other"


def _keep_with_uses(left: dict[str, tuple[str, ServicePortKey, str]], rules: ServiceObjects,
                    name: str, key: ServicePortKey, culprit: str) -> None:
    """Keep ``name`` and, transitively, the chains and sets of ``rules`` it uses."""
    pending = [name]
    while pending:
        chain = pending.pop()
        if chain in left:
            continue
        left[chain] = ("chain", key, culprit)
        for rule in rules.chains.get(chain, ()):
            for target, used in _REFERENCES.findall(rule):
                if target in rules.chains:
                    pending.append(target)
                elif used in rules.sets:
                    left[used] = ("set", key, culprit)


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


def _with_table(ctx: TableContext, table: str) -> TableContext:
    return ctx if ctx.table == table else replace(ctx, table=table)
