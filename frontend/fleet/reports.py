"""A node's report, checked at the edge: bounded, about this frontend's revisions.

Each bound is NodeReport's comment's; a report beyond one is refused whole with
INVALID_ARGUMENT saying which, a revision of another frontend's epoch with
FAILED_PRECONDITION, and one node's flood with RESOURCE_EXHAUSTED (``ReportRates``):
nothing of a refused report is kept, and no other node's is touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from svcproxy.convert import key_from_pb
from svcproxy.frontend.admission.refusals import Refused
from svcproxy.frontend.admission.validation import check_node_name, invalid
from svcproxy.frontend.fleet.model import Report
from svcproxy.v1 import nodestate_pb2 as pb

METHOD = "Report"
MAX_REFUSED = 64
MAX_REASON = 512
MAX_DETAILS = 16
MAX_DETAIL_KEY = 63
MAX_DETAIL_VALUE = 256
MAX_NAME = 63
# One node's reports: a bucket of BURST refilled at QPS per second (the SDK sends at most
# one per --report-min-interval, 1 s by default).
REPORT_QPS = 5.0
REPORT_BURST = 20
# Nodes the fleet keeps (watching or reported): a report for a new name beyond it is
# RESOURCE_EXHAUSTED.
MAX_NODES = 20000


def _bounded(report: pb.NodeReport) -> None:
    """Refuse a report beyond one of NodeReport's bounds."""
    if len(report.refused) > MAX_REFUSED:
        raise invalid(METHOD, f"refused lists {len(report.refused)} service ports, more "
                      f"than {MAX_REFUSED}: send the first {MAX_REFUSED} (sorted) and "
                      "refused_count for all")
    if any(len(r.reason) > MAX_REASON for r in report.refused):
        raise invalid(METHOD, f"a refused service port's reason is longer than "
                      f"{MAX_REASON} characters: cut it")
    if len(report.details) > MAX_DETAILS:
        raise invalid(METHOD, f"details has {len(report.details)} entries, more than "
                      f"{MAX_DETAILS}")
    for key, value in report.details.items():
        if len(key) > MAX_DETAIL_KEY or len(value) > MAX_DETAIL_VALUE:
            raise invalid(METHOD, f"a details key is longer than {MAX_DETAIL_KEY} "
                          f"characters or its value longer than {MAX_DETAIL_VALUE}")
    if len(report.backend) > MAX_NAME or len(report.backend_version) > MAX_NAME:
        raise invalid(METHOD, f"backend and backend_version are at most {MAX_NAME} "
                      "characters")


def check_report(report: pb.NodeReport, revision: int, epoch: str) -> Report:
    """``report`` as the fleet keeps it, for a frontend at ``revision`` of ``epoch``;
    Refused when it is not one to keep."""
    check_node_name(METHOD, report.node_name)
    _bounded(report)
    if report.epoch and report.epoch != epoch:
        raise Refused("FAILED_PRECONDITION", (
            f"revision {report.revision} is of the frontend of epoch {report.epoch!r}, this "
            f"one is {epoch!r}: report again once this frontend's snapshot is applied"))
    if report.revision > revision:
        raise invalid(METHOD, (
            f"revision {report.revision} is ahead of this frontend's revision {revision}: "
            "report the revision of the last batch applied from this frontend's Watch"))
    if report.refused_count < len(report.refused):
        raise invalid(METHOD, "refused_count is less than the service ports refused lists")
    return Report(
        revision=report.revision, epoch=report.epoch,
        digest=report.digest if report.HasField("digest") else None,
        applied_time=report.applied_time.ToNanoseconds() / 1e9,
        refused=tuple((key_from_pb(r.service), r.reason) for r in report.refused),
        refused_count=report.refused_count, backend=report.backend,
        backend_version=report.backend_version, full_sync=report.full_sync,
        details=dict(report.details))


class ReportRates:
    """Reports per node: a token bucket each; RESOURCE_EXHAUSTED beyond it."""

    def __init__(self, qps: float = REPORT_QPS, burst: int = REPORT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self.clock = qps, burst, clock
        self.buckets: dict[str, tuple[float, float]] = {}

    def admit(self, node: str) -> None:
        now = self.clock()
        tokens, when = self.buckets.get(node, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.qps)
        if tokens < 1.0:
            self.buckets[node] = (tokens, now)
            raise Refused("RESOURCE_EXHAUSTED", (
                f"node {node} reported more than {self.qps:g} times per second (burst "
                f"{self.burst}): report at most once per --report-min-interval; retry in "
                f"{(1.0 - tokens) / self.qps:.2f} s"))
        self.buckets[node] = (tokens - 1.0, now)

    def forget(self, nodes: list[str]) -> None:
        for node in nodes:
            self.buckets.pop(node, None)
