"""The sync runner: coalescing, min/max periods, retries with full syncs, health."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.support.waiting import wait_for


def key(i: int) -> ServicePortKey:
    return ServicePortKey("default", f"svc{i}", "", Protocol.TCP)


def state(revision: int, n: int = 3, endpoints: int = 1) -> NodeState:
    services = {}
    for i in range(n):
        eps = {f"10.1.{i}.{e + 1}": Endpoint(f"10.1.{i}.{e + 1}", 8080) for e in range(endpoints)}
        services[key(i)] = ServicePortState(
            ServicePort(key(i), cluster_ips=(f"10.96.0.{i + 1}",), port=80), eps
        )
    return NodeState("node-a", revision, None, services)


@dataclass
class Call:
    at: float
    state: NodeState
    changes: Changes


@dataclass
class RecordingBackend(Backend):
    """Records every sync; fails while ``failures`` > 0; blocks while ``gate`` is clear."""

    failures: int = 0
    gate: threading.Event = field(default_factory=threading.Event)
    calls: list[Call] = field(default_factory=list)
    attempts: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # When a sync started: by default when it reached the backend; a test of the runner's
    # spacing reads the runner's own clock instead (see RunnerClock).
    stamp: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.gate.set()

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.gate.wait()
        call = Call(self.stamp(), state, changes)
        with self.lock:
            self.attempts.append(call)
            if self.failures > 0:
                self.failures -= 1
                raise RuntimeError("simulated dataplane failure")
            self.calls.append(call)

    def synced(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def tried(self) -> list[Call]:
        with self.lock:
            return list(self.attempts)


class RunnerClock:
    """The runner's clock, remembering its last reading: the one the runner takes as a
    sync's start just before calling the backend (what its periods are measured from,
    whatever the thread scheduler does between that reading and the backend's call)."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self) -> float:
        self.last = time.monotonic()
        return self.last


@dataclass
class Running:
    source: FakeSource
    backend: RecordingBackend
    health: ProxyHealth
    runner: SyncRunner


@pytest.fixture
def start() -> Iterator[Callable[..., Running]]:
    started: list[tuple[SyncRunner, threading.Thread, RecordingBackend]] = []

    def run(sync_period: float = 30.0, min_sync_period: float = 0.0, **kw: object) -> Running:
        source, backend = FakeSource(), RecordingBackend()
        if isinstance(kw.get("clock"), RunnerClock):
            backend.stamp = lambda: kw["clock"].last  # type: ignore[union-attr]
        health = ProxyHealth(timeout=2 * sync_period)
        runner = SyncRunner(source, backend, health=health, sync_period=sync_period,
                            min_sync_period=min_sync_period, poll=0.02, **kw)  # type: ignore[arg-type]
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        started.append((runner, thread, backend))
        return Running(source, backend, health, runner)

    yield run
    for runner, thread, backend in started:
        backend.gate.set()
        runner.stop()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_first_snapshot_is_applied_as_a_full_initial_sync(start: Callable[..., Running]) -> None:
    r = start()
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    first = r.backend.synced()[0].changes
    assert first.full and first.reason == "initial"
    assert first.services == {key(0), key(1), key(2)}


def test_a_burst_of_changes_is_coalesced_into_one_sync(start: Callable[..., Running]) -> None:
    r = start(min_sync_period=0.4)
    burst = [state(2 + i, n=20, endpoints=2) for i in range(20)]  # built before it starts
    r.source.push(state(1, n=20))
    wait_for(lambda: len(r.backend.synced()) == 1)
    for i, changed in enumerate(burst):
        r.source.push(changed, [key(i)])
    wait_for(lambda: len(r.backend.synced()) == 2)
    time.sleep(0.5)
    calls = r.backend.synced()
    assert len(calls) == 2, [c.changes for c in calls]
    burst = calls[1]
    assert not burst.changes.full and burst.changes.reason == "changes"
    assert burst.changes.services == {key(i) for i in range(20)}
    assert burst.state.revision == 21


def test_min_sync_period_spaces_syncs_and_the_last_change_wins(
    start: Callable[..., Running],
) -> None:
    r = start(min_sync_period=0.25, clock=RunnerClock())
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    revision = 1
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        revision += 1
        r.source.push(state(revision), [key(revision % 3)])
        time.sleep(0.02)
    wait_for(lambda: r.backend.synced()[-1].state.revision == revision)
    starts = [c.at for c in r.backend.synced()]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.24, gaps
    assert len(starts) <= 1 + 1.2 / 0.25 + 2, gaps


def test_zero_min_sync_period_applies_each_change_at_once(start: Callable[..., Running]) -> None:
    r = start(min_sync_period=0.0)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    for revision in (2, 3, 4):
        pushed = time.monotonic()
        r.source.push(state(revision), [key(0)])
        wait_for(lambda rev=revision: r.backend.synced()[-1].state.revision == rev)
        # held back, a change would wait out a period (1 s by default); the margin is for
        # a loaded CI machine
        assert r.backend.synced()[-1].at - pushed < 0.8


def test_sync_period_forces_full_resyncs_without_changes(start: Callable[..., Running]) -> None:
    r = start(sync_period=0.3, min_sync_period=0.0)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) >= 4)
    calls = r.backend.synced()
    periodic = calls[1:4]
    assert all(c.changes.full and c.changes.reason == "periodic" for c in periodic)
    assert all(c.changes.services == {key(0), key(1), key(2)} for c in periodic)
    gaps = [b.at - a.at for a, b in zip(calls, calls[1:4], strict=False)]
    assert all(0.28 <= g <= 0.6 for g in gaps), gaps


def test_a_change_due_with_a_resync_goes_first_as_its_own_partial_sync(
    start: Callable[..., Running],
) -> None:
    """A change that meets the periodic resync does not wait for it (nor ride in it)."""
    r = start(sync_period=0.4, min_sync_period=0.0)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    r.backend.gate.clear()
    r.source.push(state(2), [key(0)])
    wait_for(lambda: r.source.takes >= 2)  # the sync of key 0 is under way, blocked
    time.sleep(0.5)  # the resync falls due meanwhile
    r.source.push(state(3), [key(1)])
    r.backend.gate.set()
    wait_for(lambda: any(c.changes.reason == "periodic" for c in r.backend.synced()[2:]))
    after = [c.changes for c in r.backend.synced()[2:]]
    assert after[0].reason == "changes" and not after[0].full
    assert after[0].services == {key(1)}
    assert after[1].reason == "periodic" and after[1].full


def test_a_resync_does_not_hold_back_the_next_change(start: Callable[..., Running]) -> None:
    """--min-sync-period spaces the syncs that apply changes; a resync is not one."""
    r = start(sync_period=0.25, min_sync_period=1.0)
    r.source.push(state(1))

    def resyncs() -> int:
        return sum(c.changes.reason == "periodic" for c in r.backend.synced())

    wait_for(lambda: resyncs() >= 5)  # the initial sync's min period is over
    done = resyncs()
    wait_for(lambda: resyncs() > done)  # just after a resync: held back, ~1 s to wait
    pushed = time.monotonic()
    r.source.push(state(2), [key(0)])
    wait_for(lambda: r.backend.synced()[-1].state.revision == 2)
    first = next(c for c in r.backend.synced() if c.state.revision == 2)
    assert first.changes.reason == "changes" and not first.changes.full
    assert first.at - pushed < 0.6


def test_failed_sync_is_retried_as_full_sync_with_backoff(start: Callable[..., Running]) -> None:
    r = start(min_sync_period=0.0, retry_initial=0.15)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    r.backend.failures = 3
    r.source.push(state(2), [key(1)], trigger_times=[time.time() - 1])
    wait_for(lambda: len(r.backend.synced()) == 2)
    attempts = r.backend.tried()[1:]
    assert [a.changes.reason for a in attempts] == ["changes", "retry", "retry", "retry"]
    assert not attempts[0].changes.full
    assert all(a.changes.full for a in attempts[1:])
    assert all(key(1) in a.changes.services for a in attempts)
    assert all(len(a.changes.trigger_times) == 1 for a in attempts)
    gaps = [b.at - a.at for a, b in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= 0.14 and gaps[1] >= 0.29 and gaps[2] >= 0.59, gaps
    wait_for(lambda: r.runner.applied is not None and r.runner.applied.revision == 2)


def test_changes_during_a_failing_streak_are_folded_into_the_retry(
    start: Callable[..., Running],
) -> None:
    r = start(min_sync_period=0.0, retry_initial=0.3)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    r.backend.failures = 1
    r.source.push(state(2), [key(0)])
    wait_for(lambda: len(r.backend.tried()) == 2)
    r.source.push(state(3), [key(2)])
    wait_for(lambda: len(r.backend.synced()) == 2)
    retry = r.backend.synced()[1]
    assert retry.changes.reason == "retry" and retry.changes.full
    assert retry.state.revision == 3
    assert len(r.backend.tried()) == 3


def test_health_turns_unhealthy_when_applies_stall_and_recovers(
    start: Callable[..., Running],
) -> None:
    r = start(sync_period=0.5, min_sync_period=0.0)  # the health timeout: 1 s
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    assert r.health.is_healthy()
    r.backend.gate.clear()
    r.source.push(state(2), [key(0)])
    time.sleep(0.2)
    assert r.health.is_healthy(), "an update younger than the timeout is not late"
    wait_for(lambda: not r.health.is_healthy())
    r.backend.gate.set()
    wait_for(r.health.is_healthy)


def test_health_stays_unhealthy_while_syncs_keep_failing(start: Callable[..., Running]) -> None:
    r = start(sync_period=0.25, min_sync_period=0.0, retry_initial=0.05)
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) == 1)
    r.backend.failures = 10**6
    r.source.push(state(2), [key(0)])
    wait_for(lambda: not r.health.is_healthy())
    time.sleep(0.3)
    assert not r.health.is_healthy()
    with r.backend.lock:
        r.backend.failures = 0
    wait_for(r.health.is_healthy)
    assert r.backend.synced()[-1].changes.reason == "retry"


def test_terminating_node_makes_the_node_ineligible(start: Callable[..., Running]) -> None:
    from svcproxy.model import NodeInfo

    r = start()
    base = state(1)
    r.source.push(NodeState("node-a", 1, NodeInfo("node-a"), base.services))
    wait_for(lambda: len(r.backend.synced()) == 1)
    assert r.health.status().node_eligible
    r.source.push(NodeState("node-a", 2, NodeInfo("node-a", terminating=True), base.services),
                  node_changed=True)
    wait_for(lambda: not r.health.status().node_eligible)
    assert r.health.status().healthy


def test_after_sync_steps_learn_which_service_ports_may_differ(
    start: Callable[..., Running],
) -> None:
    """A partial sync names its changed ports; after a reset that dropped a port (the
    snapshot no longer has it, nor does any change name it) the dropped port is named too,
    so a conntrack step deletes its flows."""
    seen: list[tuple[int | None, int, frozenset[ServicePortKey]]] = []

    def step(old: NodeState | None, new: NodeState, changed: frozenset[ServicePortKey]) -> None:
        seen.append((old.revision if old else None, new.revision, changed))

    r = start(after_sync=[step])
    r.source.push(state(1))
    wait_for(lambda: len(seen) == 1)
    r.source.push(state(2, endpoints=2), [key(1)])
    wait_for(lambda: len(seen) == 2)
    r.source.push(state(3, n=2), reset=True)
    wait_for(lambda: len(seen) == 3)
    assert seen == [(None, 1, {key(0), key(1), key(2)}), (1, 2, {key(1)}),
                    (2, 3, {key(0), key(1), key(2)})]


def test_a_refused_service_port_due_for_retry_gets_a_sync_without_any_change(
        start: Callable[..., Running]) -> None:
    """The backend's ``retry_in`` (its refusals' backoff) wakes the runner: a partial sync
    of reason "refused" long before the periodic one, and none once nothing waits."""
    r = start(sync_period=3600.0)
    due = [time.monotonic() + 0.05]
    waiting = [True]

    def retry_in() -> float | None:
        return max(0.0, due[0] - time.monotonic()) if waiting[0] else None

    r.backend.retry_in = retry_in  # type: ignore[attr-defined]
    r.source.push(state(1))
    wait_for(lambda: len(r.backend.synced()) >= 2)
    retry = r.backend.synced()[1].changes
    assert retry.reason == "refused" and not retry.full and not retry.services
    waiting[0] = False
    count = len(r.backend.synced())
    r.source.push(state(2), {key(0)})  # a later change syncs, and nothing retries after it
    wait_for(lambda: any(c.state.revision == 2 for c in r.backend.synced()))
    assert all(c.changes.reason != "refused" for c in r.backend.synced()[count + 1:])
