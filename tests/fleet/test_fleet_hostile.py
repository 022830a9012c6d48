"""Hostile input to the fleet: every bound of a report refused with what to fix (and the
bound itself taken), more node names than the fleet keeps, and a flood of fleet streams
from one address: bounded, refused with a clear status, nothing else affected."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.fleet import service as fleet_service
from svcproxy.frontend.fleet.reports import check_report
from svcproxy.frontend.serving.limits import StreamLimits
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc
from tests.fleet.test_fleet_reports import report_code
from tests.support.examples import copy_examples
from tests.support.fleet_lab import nodes
from tests.support.waiting import wait_for

KEY = pb.ServicePortKey(namespace="shop", name="web", protocol=pb.TCP)


def refused(n: int, reason: str = "x") -> list[pb.RefusedServicePort]:
    return [pb.RefusedServicePort(service=KEY, reason=reason)] * n


AT_THE_BOUNDS = pb.NodeReport(
    node_name="node-a", revision=10, epoch="e", refused=refused(64, "r" * 512),
    refused_count=64, backend="b" * 63, backend_version="v" * 63,
    details={f"{i:02}" + "k" * 61: "v" * 256 for i in range(16)})


def past(**fields: object) -> pb.NodeReport:
    report = pb.NodeReport()
    report.CopyFrom(AT_THE_BOUNDS)
    for name, value in fields.items():
        report.ClearField(name)
        if isinstance(value, dict):
            getattr(report, name).update(value)
        elif isinstance(value, list):
            getattr(report, name).extend(value)
        else:
            setattr(report, name, value)
    return report


def test_a_report_at_every_bound_is_taken() -> None:
    kept = check_report(AT_THE_BOUNDS, revision=10, epoch="e")
    assert len(kept.refused) == 64 and len(kept.details) == 16


@pytest.mark.parametrize("report, said", [
    (past(refused=refused(65), refused_count=65), "refused lists 65 service ports"),
    (past(refused=refused(1, "r" * 513), refused_count=1), "longer than 512"),
    (past(details={str(i): "" for i in range(17)}), "details has 17 entries"),
    (past(details={"k" * 64: ""}), "details key is longer than 63"),
    (past(details={"k": "v" * 257}), "value longer than 256"),
    (past(backend="b" * 64), "at most 63 characters"),
    (past(backend_version="v" * 64), "at most 63 characters"),
    (past(refused_count=63), "refused_count is less than"),
    (past(revision=11), "ahead of this frontend's revision 10"),
], ids=["refused", "reason", "details", "key", "value", "backend", "version", "count",
        "ahead"])
def test_past_each_bound_a_report_is_refused_saying_what_to_fix(report: pb.NodeReport,
                                                                  said: str) -> None:
    with pytest.raises(Refused) as err:
        check_report(report, revision=10, epoch="e")
    assert err.value.code_name == "INVALID_ARGUMENT" and said in err.value.message


def test_a_report_of_another_epoch_is_a_failed_precondition() -> None:
    with pytest.raises(Refused) as err:
        check_report(past(epoch="other"), revision=10, epoch="e")
    assert err.value.code_name == "FAILED_PRECONDITION"
    assert "report again once this frontend's snapshot is applied" in err.value.message


def test_more_node_names_than_the_fleet_keeps_are_refused(frontend_factory, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_service, "MAX_NODES", 3)
    fe = frontend_factory(copy_examples(tmp_path))
    api = fe.opts.listen
    for i in range(3):
        assert report_code(api, None, pb.NodeReport(node_name=f"node-{i}"))[0] == \
            grpc.StatusCode.OK
    code, said = report_code(api, None, pb.NodeReport(node_name="node-new"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "keeps the reports of 3 nodes" in said
    again = pb.NodeReport(node_name="node-0", backend="again")
    assert report_code(api, None, again)[0] == grpc.StatusCode.OK
    assert set(nodes(api)) == {"node-0", "node-1", "node-2"}
    assert nodes(api)["node-0"].backend == "again"


def test_fleet_streams_hold_their_peers_stream_slots(frontend_factory, tmp_path: Path) -> None:
    fe = frontend_factory(copy_examples(tmp_path),
                          stream_limits=StreamLimits(max_streams_per_peer=3))
    with grpc.insecure_channel(fe.opts.listen) as channel:
        stub = pb_grpc.NodeStateServiceStub(channel)
        held = [stub.WatchFleet(pb.WatchFleetRequest(), timeout=60) for _ in range(3)]
        assert all(next(w).full for w in held)
        with pytest.raises(grpc.RpcError) as err:
            next(stub.WaitFleet(pb.WaitFleetRequest(endpoint_gone="10.244.1.10"), timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-streams-per-peer" in (err.value.details() or "")
        held.pop().cancel()

        def one_more() -> bool:
            try:
                return bool(list(stub.WaitFleet(
                    pb.WaitFleetRequest(endpoint_gone="10.244.1.10"), timeout=30))[-1].done)
            except grpc.RpcError as refused:
                assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                return False
        wait_for(one_more, timeout=20)
        for watch in held:
            watch.cancel()
