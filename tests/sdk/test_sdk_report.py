"""The SDK's reporter against the real frontend: applies coalesced into at most one report
per min_interval (the newest wins), a backend's refusals and details cut to the
frontend's bounds so the report is taken, and a backend run by the SDK's smallest loop
(``run.run``) reporting with no code of its own (the cluster watch reports nothing)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from svcproxy.frontend.fleet import metrics as fleet_metrics
from svcproxy.frontend.sources.events import Upsert
from svcproxy.model import Protocol, ServicePortKey
from svcproxy.sdk import run
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.sdk.refusals import Refusals
from svcproxy.sdk.report import MAX_DETAILS, MAX_REFUSED, Reporter, build_report
from svcproxy.v1 import nodestate_pb2 as pb
from tests.fleet.test_fleet_reports import report_code
from tests.support.examples import WEB, copy_examples, web_slice
from tests.support.fleet_lab import nodes, wait_state
from tests.support.waiting import wait_for


class Quiet(Backend):
    name = "quiet"

    def sync(self, state: NodeState, changes: Changes) -> None:
        pass


def accepted() -> float:
    return fleet_metrics.REPORTS.labels("accepted")._value.get()


def synced_client(api: str) -> tuple[NodeStateClient, NodeState]:
    client = NodeStateClient(api, "node-a")
    client.start()
    wait_for(client.has_changes)
    taken = client.take()
    assert taken is not None
    return client, taken[0]


def test_applies_are_coalesced_and_the_newest_is_sent(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    client, state = synced_client(fe.opts.listen)
    reporter = Reporter(client, Quiet(), min_interval=0.3)
    reporter.start()
    try:
        before, start = accepted(), time.monotonic()
        for _ in range(100):  # an apply every 10 ms, for a second or more
            reporter.applied(state, Changes(full=True))
            time.sleep(0.01)
        reporter.applied(state, Changes(full=False))  # the newest
        wait_for(lambda: nodes(fe.opts.listen).get("node-a") is not None
                 and not nodes(fe.opts.listen)["node-a"].full_sync)
        elapsed = time.monotonic() - start
        sent = accepted() - before
        assert 1 <= sent <= 2 + elapsed / 0.3, (sent, elapsed)
        got = nodes(fe.opts.listen)["node-a"]
        assert got.applied_revision == state.revision == got.served_revision
        assert got.applied_digest == got.served_digest and got.backend == "quiet"
    finally:
        reporter.stop()
        client.stop()


class Refusing(Backend):
    name = "refusing"

    def __init__(self) -> None:
        self.refusals = Refusals(self.name)
        for i in range(100):
            key = ServicePortKey("ns", f"svc-{i:03}", "", Protocol.TCP)
            self.refusals.refuse(key, None, "e" * 400, retry=False)
        self.report_details = {f"key-{i:02}-" + "k" * 70: "v" * 300 for i in range(20)}

    def sync(self, state: NodeState, changes: Changes) -> None:
        pass


def test_a_report_is_cut_to_the_frontends_bounds(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    state = NodeState("node-a", fe.engine.changelog.revision, None)
    report = build_report("node-a", state, Changes(), Refusing(), fe.frontend.guard.epoch,
                          1, 0.0)
    assert len(report.refused) == MAX_REFUSED and report.refused_count == 100
    assert [r.service.name for r in report.refused][:2] == ["svc-000", "svc-001"]
    assert len(report.details) == MAX_DETAILS
    assert report_code(fe.opts.listen, None, report)[0].name == "OK"
    assert nodes(fe.opts.listen)["node-a"].refused_count == 100
    assert isinstance(report, pb.NodeReport)


class RefusingWeb(Backend):
    """Refuses Service web's http port (its own Refusals), takes everything else."""

    name = "refusing-web"

    def __init__(self) -> None:
        self.refusals = Refusals(self.name)
        self.report_details = {"mode": "test"}

    def sync(self, state: NodeState, changes: Changes) -> None:
        self.refusals.refuse(WEB, None, "no room for web", retry=False)


def test_a_backend_run_by_the_smallest_loop_reports(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    stop = threading.Event()
    loop = threading.Thread(target=run.run, args=(RefusingWeb(), NodeStateClient(api, "node-a"),
                                                  stop), kwargs={"report_min_interval": 0.05})
    loop.start()
    try:
        got = wait_state(api, "node-a", pb.NODE_APPLIED)
        assert got.backend == "refusing-web" and got.applied_digest == got.served_digest
        assert [(r.service.name, r.reason) for r in got.refused] == [("web", "no room for web")]
        assert dict(got.details) == {"mode": "test"}
        fe.submit([Upsert("EndpointSlice", web_slice(2))])
        served = fe._loop.run(lambda: fe.engine.changelog.view("node-a").revision, 10)
        wait_state(api, "node-a", pb.NODE_APPLIED, applied_revision=served)
    finally:
        stop.set()
        loop.join(20)


def test_the_smallest_loop_on_the_cluster_watch_reports_nothing(frontend_factory,
                                                                 tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path))
    client = NodeStateClient(fe.opts.listen, "", cluster=True)
    synced = threading.Event()

    class Cluster(Quiet):
        def sync(self, state: NodeState, changes: Changes) -> None:
            synced.set()

    stop = threading.Event()
    loop = threading.Thread(target=run.run, args=(Cluster(), client, stop),
                            kwargs={"report_min_interval": 0.05})
    before = fleet_metrics.REPORTS.labels("invalid")._value.get()
    loop.start()
    try:
        assert synced.wait(30)
        fe.submit([Upsert("EndpointSlice", web_slice(2))])
        wait_for(lambda: client.revision == fe.engine.changelog.revision)
    finally:
        stop.set()
        loop.join(20)
    assert nodes(fe.opts.listen) == {}
    assert fleet_metrics.REPORTS.labels("invalid")._value.get() == before
