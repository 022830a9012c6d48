"""Reports to the frontend: what this node's backend applied (``NodeReport``).

After each apply the node agent hands the state and its changes to ``Reporter.applied``;
the report is built then (revision, epoch and digest of the state applied, the backend's
refusals, name and version, full or partial) and sent from a thread of its own, at most
every ``min_interval``: a report not sent yet is replaced by a newer one (the frontend
keeps only the newest anyway). A slow or unreachable frontend therefore never delays a
sync. Every backend reports with no code of its own; one may add a few details of its own
with a ``report_details`` attribute (a mapping of strings, bounded as MAX_DETAILS says).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import cache
from importlib import metadata

import grpc

from svcproxy.convert import key_to_pb
from svcproxy.model import ServicePortKey
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.v1 import nodestate_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# The frontend's bounds on one report (NodeReport's comments): what goes beyond is cut here.
MAX_REFUSED = 64
MAX_REASON = 512
MAX_DETAILS = 16
MAX_DETAIL_KEY = 63
MAX_DETAIL_VALUE = 256
MAX_NAME = 63
CALL_TIMEOUT = 10.0
# Statuses after which the same report is never sent again (the next apply's is).
_DROP = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
         grpc.StatusCode.UNIMPLEMENTED)


@cache
def sdk_version() -> str:
    """The installed svcproxy distribution's version ("unknown" when not installed)."""
    try:
        return metadata.version("svcproxy")
    except metadata.PackageNotFoundError:
        return "unknown"


def refused_of(backend: Backend) -> dict[ServicePortKey, str]:
    """The service ports the backend's dataplane refuses, with the error of each
    (``backend.refusals``, see svcproxy.sdk.refusals; none when it keeps none)."""
    errors = getattr(getattr(backend, "refusals", None), "errors", None)
    return dict(errors()) if callable(errors) else {}


def details_of(backend: Backend) -> dict[str, str]:
    """The backend's ``report_details``, cut to the frontend's bounds."""
    details = getattr(backend, "report_details", None)
    if not isinstance(details, Mapping):
        return {}
    out: dict[str, str] = {}
    for key in sorted(map(str, details))[:MAX_DETAILS]:
        out[key[:MAX_DETAIL_KEY]] = str(details[key])[:MAX_DETAIL_VALUE]
    return out


def build_report(node_name: str, state: NodeState, changes: Changes, backend: Backend,
                 epoch: str | None, digest: int | None, applied_at: float) -> pb.NodeReport:
    """The report of one apply (``applied_at``: unix time), within the frontend's bounds."""
    refused = refused_of(backend)
    report = pb.NodeReport(
        node_name=node_name, revision=state.revision, epoch=epoch or "",
        refused_count=len(refused), backend=str(backend.name)[:MAX_NAME],
        backend_version=str(getattr(backend, "version", None) or sdk_version())[:MAX_NAME],
        full_sync=changes.full, details=details_of(backend))
    if digest is not None:
        report.digest = digest
    report.applied_time.FromNanoseconds(int(applied_at * 1e9))
    keys = sorted(refused, key=lambda k: (k.namespace, k.name, k.port_name, k.protocol.value))
    for key in keys[:MAX_REFUSED]:
        report.refused.add(service=key_to_pb(key), reason=refused[key][:MAX_REASON])
    return report


class Reporter:
    """Sends the reports of one node's applies to the frontend its client watches."""

    def __init__(self, client: NodeStateClient, backend: Backend, min_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.backend = backend
        self.min_interval = min_interval
        self.clock = clock
        self.sent = 0
        self.failed = 0
        self._pending: pb.NodeReport | None = None
        self._last_sent: float | None = None
        self._last_code: grpc.StatusCode | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="svcproxy-report", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=CALL_TIMEOUT)

    def applied(self, state: NodeState, changes: Changes) -> None:
        """The backend applied ``state``: its report replaces any not sent yet."""
        taken = self.client.taken
        if self.client.cluster or taken is None or taken.revision != state.revision:
            return  # the cluster's state, or another source's: no node's to report
        report = build_report(self.client.node_name, state, changes, self.backend,
                              taken.epoch, taken.digest, time.time())
        with self._cond:
            self._pending = report
            self._cond.notify_all()

    def _next(self) -> pb.NodeReport | None:
        """The report to send once ``min_interval`` has passed since the last one (None:
        stopping)."""
        with self._cond:
            while not self._stopping:
                if self._pending is not None:
                    wait = 0.0 if self._last_sent is None else (
                        self._last_sent + self.min_interval - self.clock())
                    if wait <= 0:
                        report, self._pending = self._pending, None
                        self._last_sent = self.clock()
                        return report
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            return None

    def _run(self) -> None:
        channel, target = None, None
        try:
            while (report := self._next()) is not None:
                if channel is None or target != self.client.target:
                    if channel is not None:
                        channel.close()
                    channel, target = self.client.channel(), self.client.target
                self._send(pb_grpc.NodeStateServiceStub(channel), report)
        finally:
            if channel is not None:
                channel.close()

    def _send(self, stub: pb_grpc.NodeStateServiceStub, report: pb.NodeReport) -> None:
        try:
            stub.Report(report, timeout=CALL_TIMEOUT, metadata=self.client.call_metadata())
        except grpc.RpcError as err:
            self.failed += 1
            self._failed(report, err)
            return
        self.sent += 1
        if self._last_code is not None:
            log.info("reports of node %s reach the frontend again", report.node_name)
        self._last_code = None

    def _failed(self, report: pb.NodeReport, err: grpc.RpcError) -> None:
        """Log a failure once per status; a report refused for what it says is dropped,
        one that did not get through is sent again unless a newer one is waiting."""
        code = err.code()
        if code != self._last_code:
            log.warning("the frontend did not take the report of node %s at revision %d "
                        "(%s: %s)%s", report.node_name, report.revision, code.name,
                        err.details(), "" if code in _DROP else "; retrying")
        self._last_code = code
        if code in _DROP:
            return
        with self._cond:
            if self._pending is None:
                self._pending = report
