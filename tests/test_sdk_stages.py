"""Render -> diff -> apply with the applied state tracked by the SDK (svcproxy.sdk.stages)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.sdk import (
    Applied,
    Changes,
    Delta,
    Endpoint,
    NodeState,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    StagedBackend,
)

KEYS = [ServicePortKey("ns", f"svc{i}", "p", "TCP") for i in range(6)]


def record(key: ServicePortKey, ips: tuple[str, ...]) -> ServicePortState:
    return ServicePortState(ServicePort(key, port=80),
                            {ip: Endpoint(ip, 8080) for ip in ips})


def state_of(wanted: dict[ServicePortKey, tuple[str, ...]], revision: int = 1) -> NodeState:
    return NodeState("n", revision, None, {k: record(k, ips) for k, ips in wanted.items()})


class Dataplane(StagedBackend[tuple[str, ...]]):
    """Programs a dict; can be told to fail half-way through an apply."""

    name = "dict"

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[ServicePortKey, tuple[str, ...]] = {}
        self.deltas: list[Delta[ServicePortKey, tuple[str, ...]]] = []
        self.fail_next = False

    def render(self, state: NodeState, rec: ServicePortState) -> tuple[str, ...] | None:
        return tuple(sorted(rec.endpoints)) or None

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
@given(st.lists(st.tuples(STATES, st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_the_dataplane_always_ends_as_rendered(
        steps: list[tuple[dict[ServicePortKey, tuple[str, ...]], bool, bool]]) -> None:
    """Whatever the sequence of states, full/partial syncs and half-applied failures,
    every successful sync leaves exactly what render says."""
    backend = Dataplane()
    previous: dict[ServicePortKey, tuple[str, ...]] = {}
    for revision, (wanted, full, fail) in enumerate(steps, 1):
        state = state_of(wanted, revision)
        changed = {k for k in KEYS if previous.get(k) != wanted.get(k)}
        previous = wanted
        backend.fail_next = fail
        try:
            backend.sync(state, Changes(frozenset(changed), full, full,
                                        "periodic" if full else "changes"))
        except RuntimeError:
            continue
        assert backend.table == {k: ips for k, ips in wanted.items() if ips}
        assert dict(backend.applied) == backend.table
