"""How the packet path's programs sit on the devices, with real packets in the two-node
lab (node1's programs on ``eth0`` and its pods' bridge ``br0``):

- on a kernel without tcx links (Linux < 6.6) they run from a clsact qdisc's
  direct-action tc filters. This kernel has tcx, so the tests make the one call that
  creates a tcx link fail as an old kernel fails it (EINVAL: no such attach type);
  NodePorts are served, ``tc filter show`` lists the filters, the mode is logged, in the
  metric and in ``--dump``, a restart replaces the filters' program in place, and
  ``--cleanup`` removes the filters and the qdisc it made (a clsact qdisc that was
  there before stays, with the filter someone else put on it);
- the pins of a device named in ``--ebpf-devices`` go when the device is deleted (the
  link event, not ``--cleanup``), and a device still here that left the named set has
  its programs detached at the restart.

Everything made here (namespaces, veths, qdiscs, the bpffs mount, pins, links) is
removed at the end, also when a test fails.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from svcproxy.backends.ebpf import libbpf, packet_loader
from svcproxy.backends.ebpf.libbpf import BpfError
from svcproxy.backends.ebpf.packet_backend import PacketBackend
from svcproxy.backends.ebpf.packet_dump import packet_dump_lines
from svcproxy.model import ServiceType
from svcproxy.sdk import Changes, NodeConfig
from tests.support import packet_path
from tests.support.lab.client import probe, summarize
from tests.support.lab.netns import ip, ns_exec
from tests.support.lab.topology import veth
from tests.support.packet_path import CLIENT, NODE1, World, node_port
from tests.support.waiting import wait_for
from tests.support.world_fixture import running

pytestmark = packet_path.marks("ip", "tc", "bpftool")


def _no_tcx(prog_fd: int, ifindex: int, attach_type: int, what: str) -> int:
    raise BpfError(errno.EINVAL, f"{what}: {os.strerror(errno.EINVAL)}")


def tc(world: World, *args: str) -> str:
    return ns_exec(world.lab.ns("node1"), "tc", *args)


def filters(world: World, device: str, hook: str) -> list[str]:
    """The lines of ``tc filter show dev DEVICE HOOK`` that are filters."""
    return [line for line in tc(world, "filter", "show", "dev", device, hook).splitlines()
            if line.startswith("filter")]


def restart(world: World, devices: tuple[str, ...] | None = None) -> PacketBackend:
    """node1's backend closed (its pins stay) and a new one started on the same pins
    (on ``devices`` when given), with a full sync."""
    old = world.backends["node1"]
    world.in_node(old.close)
    layout = world.layout()
    if devices is not None:
        layout = packet_loader.PacketLayout(layout.pin_dir, devices, **world.options)
    new = PacketBackend(NodeConfig(node_name="node1", node_ips=(NODE1.ipv4, NODE1.ipv6)),
                        layout)
    world.backends["node1"] = new
    world.sync(Changes(frozenset(world.services), full=True))
    return new


@pytest.fixture
def clsact_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """The lab with tcx links refused; br0 holds a clsact qdisc (and a filter at pref
    9) that someone else made before the backend starts."""
    monkeypatch.setattr(packet_loader, "create_tcx_link", _no_tcx)
    w = World("spclsact-", servers=("pod-a", "pod-c"))
    try:
        w.start()
        tc(w, "qdisc", "add", "dev", "br0", "clsact")
        tc(w, "filter", "add", "dev", "br0", "ingress", "pref", "9", "u32", "match", "u32",
           "0", "0")
        yield w
    finally:
        w.stop()


def test_without_tcx_the_programs_run_from_clsact_filters(
        clsact_world: World, caplog: pytest.LogCaptureFixture) -> None:
    world = clsact_world
    caplog.set_level(logging.INFO, logger="svcproxy.backends.ebpf")
    world.set(node_port("clsact-remote", 30301, ["pod-c"]))
    world.set(node_port("clsact-local", 30302, ["pod-a"], "UDP", subnet=2))
    remote = world.tcp(30301, count=5)
    assert remote.names == Counter({"pod-c": 5}) and remote.sources == {NODE1.ipv4}, remote
    local = world.udp(30302, count=5)
    assert local.names == Counter({"pod-a": 5}), local
    for device in ("eth0", "br0"):
        for hook, program in (("ingress", "spp_ingress"), ("egress", "spp_egress")):
            ours = [f for f in filters(world, device, hook) if program in f]
            assert len(ours) == 1 and "direct-action" in ours[0] and "pref 1 " in ours[0], \
                (device, hook, filters(world, device, hook))
    assert "clsact" in tc(world, "qdisc", "show", "dev", "eth0")
    pins = {p.name for p in world.layout().dir.iterdir()}
    assert not {p for p in pins if p.startswith("link_")}, pins
    assert {"filter_eth0_ingress", "filter_eth0_egress", "qdisc_eth0"} <= pins, pins
    assert "qdisc_br0" not in pins, "br0's clsact qdisc was there before"
    assert any("lacks tcx links" in r.getMessage() for r in caplog.records)
    assert any("clsact qdisc" in r.getMessage() and "eth0" in r.getMessage()
               for r in caplog.records)
    dump = list(world.in_node(lambda: list(packet_dump_lines(world.layout().pin_dir))))
    assert any(line.startswith("tc eth0: clsact qdisc (made by svcproxy)") for line in dump)
    assert any(line.startswith("tc br0: clsact qdisc (already there)") for line in dump)
    assert _metric_text(world, 'svcproxy_ebpf_tc_attached{device="eth0",hook="ingress",'
                        'mode="clsact"} 1.0')

    # A restart adopts them: each filter's program replaced in place, no second filter.
    before = _filter_prog_ids(world, "eth0")
    restart(world)
    after = _filter_prog_ids(world, "eth0")
    assert len(after) == 2 and set(after.values()).isdisjoint(before.values()), (before, after)
    for device in ("eth0", "br0"):
        for hook in ("ingress", "egress"):
            assert len([f for f in filters(world, device, hook) if "spp_" in f]) == 1
    pinned = _pinned_prog_id(world.layout().dir / "filter_eth0_ingress")
    assert after["ingress"] == pinned, "the pin follows the filter's new program"
    again = world.tcp(30301, count=3)
    assert again.names == Counter({"pod-c": 3}), again

    # --cleanup: our filters and the qdisc we made go; br0's own qdisc and filter stay.
    world.in_node(world.backends["node1"].cleanup)
    assert "clsact" not in tc(world, "qdisc", "show", "dev", "eth0")
    assert not filters(world, "eth0", "ingress") and not filters(world, "eth0", "egress")
    assert "clsact" in tc(world, "qdisc", "show", "dev", "br0")
    assert filters(world, "br0", "ingress") and all(
        "u32" in f and "pref 9" in f for f in filters(world, "br0", "ingress")), \
        filters(world, "br0", "ingress")
    assert not filters(world, "br0", "egress")
    assert not world.layout().pin_dir.exists()
    gone = summarize(probe(world.lab.ns(CLIENT.name), "tcp", NODE1.ipv4, 30301, 2))
    assert gone.errors == Counter({"refused": 2}), gone


def _metric_text(world: World, sample: str) -> bool:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    backend = world.backends["node1"]
    backend.register_metrics(registry)
    text = world.in_node(lambda: generate_latest(registry).decode())
    assert sample in text, text
    return True


def _filter_prog_ids(world: World, device: str) -> dict[str, int]:
    """hook -> the id of the program our filter runs (``tc filter show``'s ``id N``)."""
    found = {}
    for hook in ("ingress", "egress"):
        for line in filters(world, device, hook):
            if "spp_" in line:
                found[hook] = int(re.search(r"\bid (\d+)", line).group(1))  # type: ignore[union-attr]
    return found


def _pinned_prog_id(pin: Path) -> int:
    from svcproxy.backends.ebpf.clsact import prog_id

    fd = libbpf.obj_get(str(pin))
    try:
        return prog_id(fd)
    finally:
        os.close(fd)


# --- pins of devices that go ----------------------------------------------------------

DEVICE = "sppd0"


class DeviceWorld(World):
    """The lab, node1's programs on ``eth0`` and ``sppd0`` (a veth to a namespace of its
    own, made by ``add_device``), XDP in generic mode on both."""

    def __init__(self) -> None:
        super().__init__("spdevpins-", devices=("eth0", DEVICE), servers=("pod-a",),
                         xdp="generic")

    def add_device(self) -> str:
        ns = self.lab.add_ns("devpins")
        veth(ns, "eth0", self.lab.ns("node1"), DEVICE)
        return ns

    def pins(self) -> set[str]:
        return {p.name for p in self.layout().dir.glob(f"*{DEVICE}*")}


@pytest.fixture
def device_world() -> Iterator[DeviceWorld]:
    yield from running(DeviceWorld())


def _link_ids(world: DeviceWorld) -> list[int]:
    ids = []
    for pin in world.layout().dir.glob(f"link_{DEVICE}_*"):
        fd = libbpf.obj_get(str(pin))
        try:
            ids.append(libbpf.link_info(fd).id)
        finally:
            os.close(fd)
    return ids


def test_the_pins_of_a_deleted_device_go_with_it(device_world: DeviceWorld) -> None:
    """sppd0 attached (tcx and XDP links pinned); deleted, its pins are gone on the link
    event, no sync in between. With the pins swept for pod patterns only, they stay."""
    world = device_world
    world.add_device()
    world.set(node_port("devpins", 30311, ["pod-a"]))
    wanted = {f"link_{DEVICE}_ingress", f"link_{DEVICE}_egress", f"link_{DEVICE}_xdp_generic"}
    assert world.pins() == wanted, world.pins()
    ip(world.lab.ns("node1"), "link", "del", DEVICE)
    wait_for(lambda: not world.pins(), timeout=30)
    assert world.tcp(30311, count=2).names == Counter({"pod-a": 2})


def test_a_device_that_left_the_named_set_is_detached_at_the_restart(
        device_world: DeviceWorld) -> None:
    """Restarted with --ebpf-devices eth0 alone while sppd0 is still here: sppd0's links
    are detached (bpftool no longer knows them) and their pins removed; eth0's stay."""
    world = device_world
    world.add_device()
    world.set(node_port("devpins-left", 30312, ["pod-a"]))
    links = _link_ids(world)
    assert len(links) == 3 and world.pins(), world.pins()
    restart(world, devices=("eth0",))
    assert not world.pins(), world.pins()
    for link in links:
        shown = subprocess.run(["bpftool", "link", "show", "id", str(link)],
                               capture_output=True, text=True)
        assert shown.returncode != 0, shown.stdout
    assert "link_eth0_ingress" in {p.name for p in world.layout().dir.iterdir()}
    assert world.tcp(30312, count=2).names == Counter({"pod-a": 2})


# --- a device name with a dot (a VLAN's, eth0.100) ----------------------------------

DOTTED, DOTTED_CLIENT, DOTTED_GATEWAY = "sppd.1", "10.244.1.220", "169.254.1.3"


def test_a_device_with_a_dot_in_its_name_is_served() -> None:
    """bpffs refuses '.' in a pin's name, so a device such as eth0.100 is pinned by an
    escaped name: a client routed through the veth sppd.1 (in --ebpf-devices) reaches a
    ClusterIP (DNAT at its ingress, its own address kept); the device deleted, its pins
    go. Before, attaching it failed (pin: Operation not permitted)."""
    world = World("spdotted-", devices=("eth0", DOTTED), servers=("pod-a",))
    try:
        world.start()
        node = world.lab.ns("node1")
        client = world.lab.add_ns("dotted")
        veth(client, "eth0", node, DOTTED)
        ip(client, "addr", "add", f"{DOTTED_CLIENT}/32", "dev", "eth0")
        ip(client, "route", "add", DOTTED_GATEWAY, "dev", "eth0")
        ip(client, "route", "add", "default", "via", DOTTED_GATEWAY, "dev", "eth0", "onlink")
        ip(node, "addr", "add", f"{DOTTED_GATEWAY}/32", "dev", DOTTED)
        ip(node, "route", "add", f"{DOTTED_CLIENT}/32", "dev", DOTTED)
        world.set(node_port("dotted", 0, ["pod-a"], cip="10.96.8.9",
                            type=ServiceType.CLUSTER_IP))
        pins = {p.name for p in world.layout().dir.glob("link_sppd*")}
        assert pins == {"link_sppd=2e1_ingress", "link_sppd=2e1_egress"}, pins
        got = summarize(probe(client, "tcp", "10.96.8.9", 80, 5))
        assert got.names == Counter({"pod-a": 5}) and got.sources == {DOTTED_CLIENT}, got
        dump = world.in_node(lambda: list(packet_dump_lines(world.layout().pin_dir)))
        assert f"tc {DOTTED}: tcx links" in dump, dump
        ip(node, "link", "del", DOTTED)
        wait_for(lambda: not list(world.layout().dir.glob("link_sppd*")), timeout=30)
    finally:
        world.stop()


def test_pin_names_of_devices_are_one_to_one() -> None:
    """Every device name gets its own pin name without '.', read back as itself."""
    from svcproxy.backends.ebpf.names import device_of_pin, pin_device

    names = ["eth0", "eth0.100", "a=2e", "a.=", "=3d2e", "b==..", "x=", "."]
    pinned = [pin_device(n) for n in names]
    assert all("." not in p for p in pinned) and len(set(pinned)) == len(names), pinned
    assert [device_of_pin(p) for p in pinned] == names
    assert pin_device("eth0") == "eth0", "names without '.' or '=' keep their old pins"


def test_cleanup_leaves_a_qdisc_it_made_when_another_filter_is_on_it(
        device_world: DeviceWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tcx, the backend made the clsact qdiscs of eth0 and sppd0; someone then
    put a filter of their own on sppd0's. --cleanup removes our filters from both, eth0's
    qdisc, and leaves sppd0's with that filter (removing the qdisc would take it too)."""
    monkeypatch.setattr(packet_loader, "create_tcx_link", _no_tcx)
    world = device_world
    world.add_device()
    world.set(node_port("clsact-shared", 30331, ["pod-a"]))
    assert {"qdisc_eth0", f"qdisc_{DEVICE}"} <= {p.name for p in world.layout().dir.iterdir()}
    tc(world, "filter", "add", "dev", DEVICE, "ingress", "pref", "9", "u32", "match", "u32",
       "0", "0")
    world.in_node(world.backends["node1"].cleanup)
    assert "clsact" not in tc(world, "qdisc", "show", "dev", "eth0")
    assert "clsact" in tc(world, "qdisc", "show", "dev", DEVICE)
    theirs = filters(world, DEVICE, "ingress")
    assert theirs and all("u32" in f and "pref 9" in f for f in theirs), theirs
    assert not filters(world, DEVICE, "egress")
