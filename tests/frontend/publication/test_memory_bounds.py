"""What the frontend keeps is bounded by what is live, not by history (issue 28).

Each test churns a fixed world (tests/support/soak.py: rollouts, readiness flips, new IPs) and
checks one bound: the encoder's caches, the histories' bytes, the views, the queue from the
sources.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import sys
import threading
import tracemalloc

import pytest

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.pipeline.engine import Engine
from svcproxy.frontend.publication.changelog import DEFAULT_BOUNDS, TooManyViews, ViewBounds
from svcproxy.frontend.publication.views import charge
from svcproxy.frontend.serving.pages import NodeStatePages
from svcproxy.frontend.serving.server import NodeStateServicer
from svcproxy.frontend.serving.worker import ParentLink
from svcproxy.frontend.serving.workers import StreamWorkers
from svcproxy.frontend.sources.events import Replace, Upsert
from svcproxy.v1 import nodestate_pb2 as pb
from tests.support.soak import Rollouts
from tests.support.waiting import wait_for


def _engine(world: Rollouts, bounds: ViewBounds = DEFAULT_BOUNDS) -> Engine:
    engine = Engine(bounds=bounds)
    engine.submit([Replace(kind, objs) for kind, objs in world.objects().items()])  # type: ignore[arg-type]
    assert engine.synced.is_set()
    return engine


def _churn(engine: Engine, world: Rollouts, changes: int) -> None:
    for _ in range(changes):
        engine.submit([Upsert("EndpointSlice", world.step())])


def _live(engine: Engine) -> dict[str, int]:
    """The distinct records the views hold, their service ports and endpoints."""
    records = {id(r): r for v in engine.changelog.views.values() for r in v.records.values()}
    return {"records": len(records),
            "service_objects": len({id(r.service) for r in records.values()}),
            "endpoints": len({id(e) for r in records.values() for e in r.endpoints.values()})}


def _snapshot_all(engine: Engine) -> None:
    """Every view's snapshot encoded, as new streams make them (every record cached)."""
    for view in engine.changelog.views.values():
        for _ in engine.snapshots.snapshot(view):
            pass


def test_encoder_caches_after_generations_of_churn_hold_no_more_than_the_live_set() -> None:
    world = Rollouts(services=30, endpoints=5, nodes=6)
    floor = 200
    engine = _engine(world, ViewBounds(cache_floor=floor))
    for name in ("node-0", "node-1", "node-2", ""):
        engine.changelog.watch(name)
    encoder = engine.changelog.digests.encoder
    for _ in range(20):  # a generation: about every other pod replaced or flipped
        _churn(engine, world, 100)
        _snapshot_all(engine)
        live, sizes = _live(engine), encoder.sizes()
        held = sizes["records"] + sizes["service_objects"] + sizes["endpoints"]
        assert held <= 2 * sum(live.values()) + 2 * floor, (sizes, live)
    assert encoder.sweeps > 3
    encoder.sweep()
    sizes, live = encoder.sizes(), _live(engine)
    assert {k: sizes[k] for k in live} == live
    assert sizes["services"] <= sizes["service_objects"]
    # What stays cached is still right: every view's snapshot equals its records' ops.
    for view in engine.changelog.views.values():
        assert view.digest == engine.changelog.digests.of(view)


# Two views: each one's eighth of the budget bites; ten: the total bites too.
@pytest.mark.parametrize("nodes", [1, 9])
def test_history_never_exceeds_its_byte_budget_oldest_first_and_a_resume_before_is_a_reset(
        nodes: int) -> None:
    world = Rollouts(services=30, endpoints=5, nodes=10)
    budget = 60_000
    engine = _engine(world, ViewBounds(history_bytes=budget))
    log = engine.changelog
    views = [log.watch(name) for name in [f"node-{i}" for i in range(nodes)] + [""]]
    first = log.revision
    for _ in range(600):
        _churn(engine, world, 1)
        charged = {v.name: sum(charge(ops) for _, ops, _ in v.history) for v in views}
        assert all(charged[v.name] == v.history_bytes <= budget // 8 for v in views)
        assert log.history_bytes == sum(charged.values()) <= budget
    # Every view kept its newest batches, oldest gone first (no gap in what is kept).
    for view in views:
        revisions = [rev for rev, _, _ in view.history]
        assert revisions and revisions == sorted(revisions)
        assert view.history_start > first
    cluster = log.views[""]
    kept = cluster.history[0][0]
    cursor, msgs = engine.snapshots.catch_up(cluster, kept)
    assert not pb.WatchEvent.FromString(next(iter(msgs))).reset
    cursor, msgs = engine.snapshots.catch_up(cluster, first)
    assert pb.WatchEvent.FromString(next(iter(msgs))).reset


def test_get_node_state_makes_no_view_and_a_burst_of_unknown_names_leaves_memory_level(
        ) -> None:
    world = Rollouts(services=10, endpoints=5, nodes=200)
    engine = _engine(world)
    pages = NodeStatePages(engine)

    def ask(name: str) -> None:
        pb.NodeState.FromString(pages.answer(pb.GetNodeStateRequest(node_name=name)))

    for i in range(200):  # every Node asked about once: no view is kept for any
        ask(f"node-{i}")
    assert engine.changelog.views == {}
    for i in range(200):
        ask(f"typo-{i}")
    gc.collect()
    before = sys.getallocatedblocks()
    for i in range(10_000):
        ask(f"no-such-node-{i}")
    gc.collect()
    # Nothing kept per name: the pages' last listings (KEPT_LISTINGS) at most.
    assert sys.getallocatedblocks() - before < 2_000
    assert engine.changelog.views == {}
    # The answer for a Node is its view's, made or not.
    view = engine.changelog.watch("node-7")
    got = pb.NodeState.FromString(pages.answer(pb.GetNodeStateRequest(node_name="node-7")))
    assert len(got.services) == len(view.records) and got.node.name == "node-7"


def test_get_node_state_without_a_view_answers_each_change() -> None:
    """No view: the revision still moves with every change, so no listing of an older
    state is answered as the current one."""
    world = Rollouts(services=3, endpoints=2, nodes=2)
    engine = _engine(world)
    pages = NodeStatePages(engine)

    def endpoints() -> dict[str, bool]:
        state = pb.NodeState.FromString(pages.answer(pb.GetNodeStateRequest(
            node_name="node-0", service="svc-0")))
        return {e.ip: e.ready for s in state.services for e in s.endpoints}

    before = endpoints()
    while True:
        obj = world.step()
        engine.submit([Upsert("EndpointSlice", obj)])
        if obj["metadata"]["name"] == "svc-0-abcde":
            break
    assert endpoints() != before
    assert engine.changelog.views == {}


def test_batches_a_busy_loop_has_not_applied_yet_are_applied_as_one() -> None:
    """A source faster than the loop: what queued meanwhile is one batch, not a call per
    batch held until the loop gets to it (the soak's backlog)."""
    world = Rollouts(services=10, endpoints=3, nodes=4)
    engine = _engine(world)
    view = engine.changelog.watch("node-0")
    loop = engine.loop = asyncio.new_event_loop()
    try:
        revision = engine.changelog.revision
        for _ in range(200):  # the loop is busy: not running
            engine.submit_threadsafe([Upsert("EndpointSlice", world.step())])
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert engine.changelog.revision == revision + 1
    fresh = _engine(world)
    assert view.records == fresh.changelog.state("node-0")[1]
    assert view.digest == engine.changelog.digests.of(view)


def test_watches_for_names_that_are_no_node_leave_views_bounded_and_expire() -> None:
    world = Rollouts(services=10, endpoints=3, nodes=4)
    bounds = ViewBounds(idle_views=16, idle_seconds=60)
    engine = _engine(world, bounds)
    log = engine.changelog
    now = [0.0]
    log.clock = lambda: now[0]
    node_views = [log.watch(f"node-{i}") for i in range(4)]
    for i in range(10_000):
        log.unwatch(log.watch(f"no-such-node-{i}"))
        assert len(log.views) <= 4 + bounds.idle_views
    for view in node_views:
        log.unwatch(view)
    assert {f"node-{i}" for i in range(4)} <= log.views.keys()  # a Node's view stays
    now[0] = 61.0
    _churn(engine, world, 1)
    assert log.views.keys() == {f"node-{i}" for i in range(4)}


def test_a_watch_for_a_new_name_past_max_views_is_resource_exhausted_saying_what_to_do(
        ) -> None:
    world = Rollouts(services=5, endpoints=2, nodes=3)
    engine = _engine(world, ViewBounds(max_views=3))
    servicer = NodeStateServicer(engine)
    held = [servicer.start_stream(name, 0, "10.0.0.1")[0]
            for name in ("node-0", "node-1", "ghost")]
    with pytest.raises(Refused) as refused:
        servicer.start_stream("node-2", 0, "10.0.0.1")
    assert refused.value.code_name == "RESOURCE_EXHAUSTED"
    assert "--max-views" in refused.value.message
    assert servicer.slots.total == 3  # the refused stream holds no slot
    # A view nobody needs makes room for a new name; a needed one never goes.
    engine.changelog.unwatch(held[2])
    assert servicer.start_stream("node-2", 0, "10.0.0.1")[0].name == "node-2"
    with pytest.raises(TooManyViews):
        engine.changelog.view("node-y")
    assert engine.changelog.views.keys() == {"node-0", "node-1", "node-2"}


def test_a_views_history_holds_no_more_memory_than_it_is_charged() -> None:
    """The byte budget bounds what a history really holds: batches of one change (a loop
    that keeps up) cost their entry and list besides their ops. Uncharged, a full
    history grew as batches merged while the loop was behind were replaced by single
    ones (the soak's late growth)."""
    world = Rollouts(services=20, endpoints=3, nodes=4)
    engine = _engine(world)
    view = engine.changelog.watch("node-0")
    _churn(engine, world, 50)
    view.clear_history(view.revision)
    gc.collect()
    tracemalloc.start()
    try:
        _churn(engine, world, 600)
        gc.collect()
        charged, batches = view.history_bytes, len(view.history)
        held = tracemalloc.get_traced_memory()[0]
        view.clear_history(view.revision)
        gc.collect()
        held -= tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert batches > 300  # mostly one change a batch
    assert 0 < held <= charged, (held, charged)


def test_a_source_faster_than_the_loop_waits_for_it_and_no_event_is_dropped() -> None:
    """The source -> engine queue is bounded: past ``queue_events`` a source thread waits
    until the loop drains (backpressure), and every event it handed over is applied."""
    world = Rollouts(services=10, endpoints=3, nodes=4)
    engine = _engine(world)
    engine.queue_events = 16
    view = engine.changelog.watch("node-0")
    loop = engine.loop = asyncio.new_event_loop()
    steps = [world.step() for _ in range(100)]
    drained: list[int] = []
    submit = engine.submit

    def counted(events: list[Upsert]) -> None:
        drained.append(len(events))
        submit(events)

    engine.submit = counted  # type: ignore[method-assign,assignment]

    def source() -> None:
        for obj in steps:
            engine.submit_threadsafe([Upsert("EndpointSlice", obj)])

    thread = threading.Thread(target=source, daemon=True)
    thread.start()

    async def until_the_source_is_done() -> None:
        while thread.is_alive():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)

    try:
        wait_for(lambda: engine.sources_waiting or not thread.is_alive())
        assert thread.is_alive(), "the source handed 100 batches to a loop that is busy"
        loop.run_until_complete(asyncio.wait_for(until_the_source_is_done(), 60))
    finally:
        thread.join(60)
        loop.close()
    assert sum(drained) == 100 and max(drained) <= 16
    fresh = _engine(world)
    assert view.records == fresh.changelog.state("node-0")[1]
    assert view.digest == engine.changelog.digests.of(view)


def test_a_stream_workers_copy_of_a_view_keeps_no_more_than_the_main_view() -> None:
    """A stream worker's copy of a view is bounded by the same eighth of
    --history-max-bytes as the main process's view, not by a size of its own."""
    world = Rollouts(services=30, endpoints=5, nodes=4)
    budget = 80_000
    engine = _engine(world, ViewBounds(history_bytes=budget))
    config = StreamWorkers(engine, 2, "unix:///nowhere", None).config
    main = engine.changelog.watch("node-0")
    here, there = multiprocessing.Pipe()
    link = ParentLink(here, config.history, config.view_history_bytes)
    loop = asyncio.new_event_loop()
    try:
        link._pending[1] = (loop.create_future(), "watch", ("node-0", "peer"))
        link._on_message(("reply", 1, (main.revision, [], 0)))
        copy = link.views["node-0"]
        engine.changelog.listeners.append(lambda revision, changed: link._on_message(
            ("publish", revision, {n: (ops, None) for n, ops in changed.items()})))
        first = copy.history_start
        for _ in range(400):
            _churn(engine, world, 1)
            assert copy.history_bytes <= budget // 8
    finally:
        loop.close()
        here.close()
        there.close()
    assert copy.history_start > first and copy.revision == main.revision
