"""Render -> diff -> apply with the applied state tracked by the SDK (svcproxy.sdk.stages)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.sdk import (
    Applied,
    Changes,
    Delta,
    Drift,
    Endpoint,
    NodeInfo,
    NodeState,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
)
from svcproxy.sdk.refusals import Refusals

KEYS = [ServicePortKey("ns", f"svc{i}", "p", Protocol.TCP) for i in range(6)]


def record(key: ServicePortKey, ips: tuple[str, ...]) -> ServicePortState:
    return ServicePortState(ServicePort(key, port=80),
                            {ip: Endpoint(ip, 8080) for ip in ips})


def state_of(wanted: dict[ServicePortKey, tuple[str, ...]], revision: int = 1,
             kept: dict[tuple[ServicePortKey, tuple[str, ...]], ServicePortState] | None = None,
             node: NodeInfo | None = None) -> NodeState:
    """The state; with ``kept``, an unchanged record is the same object (as the client
    hands them)."""
    kept = {} if kept is None else kept
    records = {k: kept.setdefault((k, ips), record(k, ips)) for k, ips in wanted.items()}
    return NodeState("n", revision, node, records)


class Dataplane(StagedBackend[tuple[str, ...]]):
    """Programs a dict; can be told to fail half-way through an apply."""

    name = "dict"

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[ServicePortKey, tuple[str, ...]] = {}
        self.deltas: list[Delta[ServicePortKey, tuple[str, ...]]] = []
        self.fail_next = False
        self.renders = 0

    def render(self, state: NodeState, rec: ServicePortState) -> tuple[str, ...] | None:
        self.renders += 1
        zone = (state.node.zone,) if state.node and state.node.zone else ()
        return (*sorted(rec.endpoints), *zone) or None

    def apply(self, delta: Delta[ServicePortKey, tuple[str, ...]]) -> None:
        self.deltas.append(delta)
        if delta.rebuild:
            self.table.clear()
        for key in delta.removed:
            del self.table[key]
        for i, (key, value) in enumerate(delta.set.items()):
            if self.fail_next and i == len(delta.set) // 2:
                self.fail_next = False
                raise RuntimeError("half applied")
            self.table[key] = value
        self.table.update(delta.repair)


def test_diff_reports_new_changed_and_removed_items() -> None:
    applied: Applied[str, int] = Applied()
    first = applied.diff({"a": 1, "b": 2}, full=True)
    assert first.rebuild and dict(first.set) == {"a": 1, "b": 2}
    applied.commit(first)
    delta = applied.diff({"a": 1, "b": 3, "c": 4}, full=True)
    assert not delta.rebuild
    assert dict(delta.set) == {"b": 3, "c": 4} and dict(delta.previous) == {"b": 2}
    assert not delta.removed
    applied.commit(delta)
    partial = applied.diff({"a": None, "b": 3}, full=False)
    assert dict(partial.removed) == {"a": 1} and not partial.set
    applied.commit(partial)
    assert dict(applied) == {"b": 3, "c": 4}
    assert not applied.diff({"b": 3, "c": 4}, full=True)  # a resync with nothing to do
    assert dict(applied.diff({"b": 3}, full=True).removed) == {"c": 4}


def test_a_resync_without_changes_applies_nothing() -> None:
    backend = Dataplane()
    state = state_of({KEYS[0]: ("10.0.0.1",), KEYS[1]: ("10.0.0.2",)})
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    assert len(backend.deltas) == 1 and backend.deltas[0].rebuild


def test_a_resync_renders_only_records_that_are_not_the_ones_rendered_before() -> None:
    backend, kept = Dataplane(), {}
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    assert backend.renders == len(KEYS)
    again = state_of({**wanted, KEYS[0]: ("10.0.0.9",)}, 2, kept=kept)
    backend.sync(again, Changes(frozenset(again.services), True, True, "periodic"))
    assert backend.renders == len(KEYS) + 1
    assert backend.table[KEYS[0]] == ("10.0.0.9",)
    node = NodeInfo("n", zone="z1")  # the node changed: everything is rendered again
    backend.sync(state_of(wanted, 3, kept=kept, node=node),
                 Changes(frozenset(), node_changed=True))
    assert backend.renders == 2 * len(KEYS) + 1
    assert backend.table == {k: ("10.0.0.1", "z1") for k in KEYS}


def test_a_resync_after_full_sync_interval_rebuilds_from_the_applied_values() -> None:
    backend, kept, now = Dataplane(), {}, [100.0]
    backend.clock = lambda: now[0]
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.table[KEYS[0]] = ("tampered",)
    now[0] += backend.full_sync_interval - 1
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    assert len(backend.deltas) == 1 and backend.table[KEYS[0]] == ("tampered",)
    now[0] += 1
    again = state_of({**wanted, KEYS[1]: ("10.0.0.2",)}, 2, kept=kept)
    backend.sync(again, Changes(frozenset(again.services), True, True, "periodic"))
    assert backend.deltas[-1].rebuild and backend.renders == len(KEYS) + 1
    assert backend.table == {**wanted, KEYS[1]: ("10.0.0.2",)}
    backend.sync(again, Changes(frozenset(again.services), True, True, "periodic"))
    assert len(backend.deltas) == 2  # the interval counts from that rebuild


@pytest.mark.parametrize("reason", ["changes", "initial", "retry"])
def test_a_full_sync_that_is_not_periodic_repairs_from_the_applied_values(reason: str) -> None:
    """After a reconnect (the runner's full sync is "changes", the client's "initial")
    what the dataplane holds may have changed: a rebuild to the applied values, not
    rendered again; a periodic resync within the interval is a diff."""
    backend, kept = Dataplane(), {}
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.table[KEYS[0]] = ("tampered",)
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    assert backend.table[KEYS[0]] == ("tampered",)
    assert backend.repair_reason(Changes(frozenset(), full=True, reason=reason))
    backend.sync(state, Changes(frozenset(state.services), True, True, reason))
    assert backend.deltas[-1].rebuild and backend.renders == len(KEYS)
    assert backend.table == wanted
    assert not backend.repair_reason(Changes(frozenset({KEYS[0]}), reason=reason))


def test_a_failed_apply_makes_the_next_sync_a_rebuild() -> None:
    backend = Dataplane()
    one = state_of({k: ("10.0.0.1",) for k in KEYS})
    backend.sync(one, Changes(frozenset(one.services), True, True, "initial"))
    two = state_of({k: ("10.0.0.2",) for k in KEYS}, 2)
    backend.fail_next = True
    with pytest.raises(RuntimeError):
        backend.sync(two, Changes(frozenset(KEYS)))
    assert not backend.applied.known
    backend.sync(two, Changes(frozenset()))  # nothing new, yet everything is rewritten
    assert backend.deltas[-1].rebuild and backend.table == {k: ("10.0.0.2",) for k in KEYS}


ENDPOINTS = st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1"]), max_size=2, unique=True)
STATES = st.dictionaries(st.sampled_from(KEYS), ENDPOINTS.map(lambda ips: tuple(sorted(ips))))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(STATES, st.booleans(), st.booleans(), st.sampled_from(["", "z"])),
                min_size=1, max_size=8))
def test_the_dataplane_always_ends_as_rendered(
        steps: list[tuple[dict[ServicePortKey, tuple[str, ...]], bool, bool, str]]) -> None:
    """Whatever the sequence of states, node changes, full/partial syncs and half-applied
    failures, every successful sync leaves exactly what render says."""
    backend, kept = Dataplane(), {}
    previous: tuple[dict[ServicePortKey, tuple[str, ...]], str] = ({}, "")
    for revision, (wanted, full, fail, zone) in enumerate(steps, 1):
        state = state_of(wanted, revision, kept=kept, node=NodeInfo("n", zone=zone))
        changed = {k for k in KEYS if previous[0].get(k) != wanted.get(k)}
        node_changed = full or zone != previous[1]
        previous = (wanted, zone)
        backend.fail_next = fail
        try:
            backend.sync(state, Changes(frozenset(changed), node_changed, full,
                                        "periodic" if full else "changes"))
        except RuntimeError:
            continue
        suffix = (zone,) if zone else ()
        assert backend.table == {k: (*ips, *suffix) for k, ips in wanted.items()
                                 if ips or suffix}
        assert dict(backend.applied) == backend.table


class Refusing(Dataplane):
    """Takes every item but those holding a refused address, and says which it took."""

    refused = "10.0.0.66"

    def apply(self, delta: Delta[ServicePortKey, tuple[str, ...]]
              ) -> Delta[ServicePortKey, tuple[str, ...]] | None:
        self.deltas.append(delta)
        taken = {k: v for k, v in delta.set.items() if self.refused not in v}
        if delta.rebuild:
            self.table.clear()
        for key in delta.removed:
            del self.table[key]
        self.table.update(taken)
        if len(taken) == len(delta.set):
            return None
        return Delta(delta.rebuild, taken, delta.removed,
                     {k: v for k, v in delta.previous.items() if k in taken})


def test_an_item_the_dataplane_refused_keeps_its_value_until_its_record_changes() -> None:
    backend, kept = Refusing(), {}
    first = state_of({KEYS[0]: ("10.0.0.1",), KEYS[1]: ("10.0.0.2",)}, 1, kept)
    backend.sync(first, Changes(frozenset(first.services), True, True, "initial"))
    bad = state_of({KEYS[0]: ("10.0.0.66",), KEYS[1]: ("10.0.0.3",)}, 2, kept)
    backend.sync(bad, Changes(frozenset({KEYS[0], KEYS[1]})))
    assert backend.table == {KEYS[0]: ("10.0.0.1",), KEYS[1]: ("10.0.0.3",)}
    assert dict(backend.applied) == backend.table
    # A resync neither renders nor retries the refused version.
    renders, applies = backend.renders, len(backend.deltas)
    backend.sync(bad, Changes(frozenset(bad.services), True, True, "periodic"))
    assert backend.renders == renders and len(backend.deltas) == applies
    fixed = state_of({KEYS[0]: ("10.0.0.4",), KEYS[1]: ("10.0.0.3",)}, 3, kept)
    backend.sync(fixed, Changes(frozenset({KEYS[0]})))
    assert backend.table == dict(backend.applied) == {KEYS[0]: ("10.0.0.4",),
                                                      KEYS[1]: ("10.0.0.3",)}


class Drifting(Dataplane):
    """Reports as drifted the items its table does not hold as applied; ``skeleton``
    says the shared part is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.skeleton = ""
        self.checks = 0

    def find_drift(self, state: NodeState) -> Drift[ServicePortKey]:
        self.checks += 1
        items = frozenset(k for k, v in self.applied.items() if self.table.get(k) != v)
        return Drift(items, self.skeleton)


def test_a_periodic_resync_writes_again_only_what_find_drift_reports() -> None:
    backend, kept = Drifting(), {}
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.table[KEYS[0]] = ("tampered",)
    del backend.table[KEYS[1]]
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    repair = backend.deltas[-1]
    assert not repair.rebuild and not repair.set and not repair.removed
    assert dict(repair.repair) == {KEYS[0]: ("10.0.0.1",), KEYS[1]: ("10.0.0.1",)}
    assert backend.table == wanted and backend.renders == len(KEYS)
    deltas = len(backend.deltas)
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    assert len(backend.deltas) == deltas  # nothing drifted: nothing written


def test_drift_is_checked_on_periodic_resyncs_only_and_a_changed_item_is_not_repaired(
) -> None:
    backend, kept = Drifting(), {}
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.table[KEYS[0]] = ("tampered",)
    again = state_of({**wanted, KEYS[0]: ("10.0.0.2",)}, 2, kept=kept)
    backend.sync(again, Changes(frozenset({KEYS[0]})))
    assert backend.checks == 0 and backend.table[KEYS[0]] == ("10.0.0.2",)
    backend.table[KEYS[0]] = ("tampered",)
    three = state_of({**wanted, KEYS[0]: ("10.0.0.3",)}, 3, kept=kept)
    backend.sync(three, Changes(frozenset(three.services), True, True, "periodic"))
    delta = backend.deltas[-1]
    assert backend.checks == 1 and KEYS[0] in delta.set and KEYS[0] not in delta.repair


def test_a_drifted_skeleton_makes_the_periodic_resync_a_rebuild_of_the_applied_values(
) -> None:
    backend, kept = Drifting(), {}
    wanted = {k: ("10.0.0.1",) for k in KEYS}
    state = state_of(wanted, kept=kept)
    backend.sync(state, Changes(frozenset(state.services), True, True, "initial"))
    backend.table.clear()
    backend.skeleton = "the table is gone"
    backend.sync(state, Changes(frozenset(state.services), True, True, "periodic"))
    assert backend.deltas[-1].rebuild and backend.renders == len(KEYS)
    assert backend.table == wanted


class RefusingWithBackoff(Refusing):
    """``Refusing`` that records its refusals (with their retry backoff) as backends do."""

    def __init__(self, now: list[float]) -> None:
        super().__init__()
        self.refusals = Refusals(self.name, clock=lambda: now[0])

    def render(self, state: NodeState, rec: ServicePortState) -> tuple[str, ...] | None:
        if self.refusals.holds(rec.key, rec):
            return self.applied.get(rec.key)
        return super().render(state, rec)

    def apply(self, delta: Delta[ServicePortKey, tuple[str, ...]]
              ) -> Delta[ServicePortKey, tuple[str, ...]] | None:
        done = super().apply(delta)
        for key in delta.set:
            if done is not None and key not in done.set:
                self.refusals.refuse(key, self.records[key], "refused")
            else:
                self.refusals.clear(key)
        return done

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.records = state.services
        super().sync(state, changes)


def test_a_refused_item_is_tried_again_after_its_backoff_without_changing() -> None:
    now = [0.0]
    backend, kept = RefusingWithBackoff(now), {}
    bad = state_of({KEYS[0]: ("10.0.0.66",), KEYS[1]: ("10.0.0.3",)}, 1, kept)
    backend.sync(bad, Changes(frozenset(bad.services), True, True, "initial"))
    assert KEYS[0] in backend.refusals and backend.retry_in() == 1.0
    backend.sync(bad, Changes(frozenset(), reason="refused"))  # not due: not rendered
    assert backend.renders == 2
    now[0] = 1.0
    assert backend.retry_in() == 0.0
    backend.sync(bad, Changes(frozenset(), reason="refused"))  # due, refused again
    assert backend.renders == 3 and backend.retry_in() == 2.0  # the backoff doubled
    backend.refused = "none"  # what the dataplane refused is fixed
    now[0] = 3.0
    backend.sync(bad, Changes(frozenset(), reason="refused"))
    assert backend.table == {KEYS[0]: ("10.0.0.66",), KEYS[1]: ("10.0.0.3",)}
    assert KEYS[0] not in backend.refusals and backend.retry_in() is None
