"""The fleet's records as the API's messages (FleetNode, Fleet, FleetUpdate)."""

from __future__ import annotations

from collections.abc import Mapping

from svcproxy.convert import key_to_pb
from svcproxy.frontend.fleet.model import NodeRecord, Served, State
from svcproxy.v1 import nodestate_pb2 as pb

STATES = {state: getattr(pb, f"NODE_{state.value}") for state in State}
FROM_PB = {number: state for state, number in STATES.items()}


def _timestamp(field: object, unix: float) -> None:
    field.FromNanoseconds(int(unix * 1e9))  # type: ignore[attr-defined]


def node_pb(record: NodeRecord, served: Served | None, now: float) -> pb.FleetNode:
    """One node's FleetNode."""
    msg = pb.FleetNode(node_name=record.name, state=STATES[record.state],  # type: ignore[arg-type]
                       connected=record.connected)
    if served is not None:
        msg.served_revision = served.revision
        if served.digest is not None:
            msg.served_digest = served.digest
    report = record.report
    if report is None:
        return msg
    msg.applied_revision = report.revision
    if served is not None and report.revision < served.revision:
        msg.lag_revisions = max(1, served.lag_revisions)
        msg.lag_seconds = round(record.lag_seconds(now), 3)
    if report.digest is not None:
        msg.applied_digest = report.digest
    for key, reason in report.refused:
        msg.refused.add(service=key_to_pb(key), reason=reason)
    msg.refused_count = report.refused_count
    msg.backend, msg.backend_version = report.backend, report.backend_version
    msg.full_sync = report.full_sync
    _timestamp(msg.applied_time, report.applied_time)
    _timestamp(msg.last_report_time, record.received)
    msg.details.update(report.details)
    return msg


def counts_pb(target: Mapping[str, int], counts: Mapping[str, int]) -> None:
    """Fill a nodes_by_state map (by FleetNodeState name)."""
    for state, count in counts.items():
        target[f"NODE_{state}"] = count  # type: ignore[index]
