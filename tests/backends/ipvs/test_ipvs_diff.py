"""Only the difference is sent; removed real servers drain before they go (pure)."""

from __future__ import annotations

from dataclasses import replace

from svcproxy.backends.ipvs import genl
from svcproxy.backends.ipvs.desired import Desired, TouchedObjects
from svcproxy.backends.ipvs.diff import Kernel, diff_servers, reap
from svcproxy.backends.ipvs.genl import DestId, DestStats, ServiceId
from svcproxy.backends.ipvs.render import RenderContext, render_port
from svcproxy.model import Protocol, ServicePortState
from tests.support.ipvs.states import endpoint, port_state

CTX = RenderContext("rr")
SID = ServiceId("TCP", "10.96.0.10", 80)


def _desired(*states) -> Desired:
    desired = Desired()
    for state in states:
        desired.replace(state.key, None, render_port(state, CTX), TouchedObjects())
    return desired


def _web(*ips: str, protocol: Protocol = Protocol.TCP):
    return port_state("web", "10.96.0.10", [endpoint(ip) for ip in ips], protocol=protocol)


def _applied(desired: Desired) -> Kernel:
    applied = Kernel()
    diff_servers(desired.claims, desired, applied, 0, 60).commit(applied)
    return applied


def test_first_sync_adds_the_service_then_each_real_server() -> None:
    desired = _desired(_web("10.244.1.2", "10.244.2.2"))
    delta = diff_servers(desired.claims, desired, Kernel(), 0, 60)
    assert [r.body[0] for r in delta.requests] == [
        genl.CMD_NEW_SERVICE, genl.CMD_NEW_DEST, genl.CMD_NEW_DEST]


def test_new_servers_come_after_the_changes_of_existing_ones() -> None:
    """Creations are sent after the sync's ipset changes, everything else before."""
    applied = _applied(_desired(_web("10.244.1.2")))
    other = port_state("other", "10.96.0.11", [endpoint("10.244.1.3")])
    desired = Desired()
    for port in (_web("10.244.2.2"), other):
        desired.replace(port.key, None, render_port(port, RenderContext("rr")), TouchedObjects())
    delta = diff_servers(set(desired.claims) | set(applied.servers), desired, applied, 0, 60)
    assert [r.body[0] for r in delta.changes] == [genl.CMD_NEW_DEST, genl.CMD_SET_DEST]
    assert [r.body[0] for r in delta.creations] == [genl.CMD_NEW_SERVICE, genl.CMD_NEW_DEST]
    assert delta.requests == delta.changes + delta.creations


def test_nothing_changed_sends_nothing() -> None:
    desired = _desired(_web("10.244.1.2"))
    applied = _applied(desired)
    assert diff_servers(desired.claims, desired, applied, 1, 60).requests == []


def test_a_removed_endpoint_drains_with_weight_zero_and_comes_back() -> None:
    applied = _applied(_desired(_web("10.244.1.2", "10.244.2.2")))
    fewer = _desired(_web("10.244.2.2"))
    delta = diff_servers({SID}, fewer, applied, 100, 60)
    assert [(r.body[0], r.what) for r in delta.requests] == [
        (genl.CMD_SET_DEST, "drain real server 10.244.1.2:8080 of TCP/10.96.0.10:80")]
    delta.commit(applied)
    assert applied.draining == {(SID, DestId("10.244.1.2", 8080)): 160}
    back = diff_servers({SID}, _desired(_web("10.244.1.2", "10.244.2.2")), applied, 101, 60)
    assert [r.body[0] for r in back.requests] == [genl.CMD_SET_DEST]
    back.commit(applied)
    assert applied.draining == {}


def test_udp_real_servers_are_deleted_at_once() -> None:
    applied = _applied(_desired(_web("10.244.1.2", "10.244.2.2", protocol=Protocol.UDP)))
    delta = diff_servers(applied.servers, _desired(_web("10.244.2.2", protocol=Protocol.UDP)),
                         applied, 0, 60)
    assert [r.body[0] for r in delta.requests] == [genl.CMD_DEL_DEST]


def test_scheduler_change_updates_in_place_and_deleted_service_goes() -> None:
    applied = _applied(_desired(_web("10.244.1.2")))
    wrr = Desired()
    wrr.replace(_web().key, None, render_port(_web("10.244.1.2"), RenderContext("wrr")),
                TouchedObjects())
    assert [r.body[0] for r in diff_servers({SID}, wrr, applied, 0, 60).requests] == [
        genl.CMD_SET_SERVICE]
    assert [r.body[0] for r in diff_servers({SID}, Desired(), applied, 0, 60).requests] == [
        genl.CMD_DEL_SERVICE]


def test_drained_real_servers_go_when_idle_or_late() -> None:
    idle, busy, late = (DestId(f"10.244.{i}.2", 8080) for i in (1, 2, 3))
    draining = {(SID, idle): 100.0, (SID, busy): 100.0, (SID, late): 50.0}
    stats = {(SID, d): DestStats(d, 0, 0, active, 0)
             for d, active in ((idle, 0), (busy, 3), (late, 3))}
    assert reap(draining, stats, 60.0) == [(SID, idle), (SID, late)]


def test_shared_addresses_stay_until_the_last_port_goes() -> None:
    a = port_state("multi", "10.96.0.20", [endpoint("10.244.1.2")], port=80)
    b = port_state("multi", "10.96.0.20", [endpoint("10.244.1.2")], port=443)
    https = replace(b.key, port_name="https")
    b = ServicePortState(replace(b.service, key=https), b.endpoints)
    desired = _desired(a, b)
    touched = TouchedObjects()
    desired.replace(a.key, render_port(a, CTX), None, touched)
    assert "10.96.0.20" in touched.addresses
    assert "10.96.0.20" in desired.addresses
    desired.replace(b.key, render_port(b, CTX), None, TouchedObjects())
    assert "10.96.0.20" not in desired.addresses
