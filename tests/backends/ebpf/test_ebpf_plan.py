"""The ebpf backend's pure parts: the frontend's decision as map entries, the map layouts,
and the write order that keeps every service whole (against an in-memory map)."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.backends.ebpf import loader
from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.backends.ebpf.claims import AddressClaims
from svcproxy.backends.ebpf.layout import F_AFFINITY, F_REFUSE, ServiceAddress, ServiceValue, Target
from svcproxy.backends.ebpf.render import DEFAULT_AFFINITY_TIMEOUT, Entry, service_entries
from svcproxy.backends.ebpf.tables import Tables, read_kernel
from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
)
from svcproxy.sdk import Changes, NodeConfig, NodeState, resolve_context


def record(name: str = "web", cips: tuple[str, ...] = ("10.96.0.1",), eps: tuple = (),
           proto: Protocol = Protocol.TCP, **svc: object) -> ServicePortState:
    svc.setdefault("has_endpoints", bool(eps))
    key = ServicePortKey("ns", name, "http", proto)
    port = ServicePort(key, cluster_ips=cips, port=80, **svc)  # type: ignore[arg-type]
    return ServicePortState(port, {e.ip: e for e in eps})


def ep(ip: str, internal: bool = True, external: bool = True,
       cluster: bool | None = None) -> Endpoint:
    """An endpoint; in the cluster set when it is internal unless ``cluster`` says."""
    return Endpoint(ip, 8080, internal=internal, external=external,
                    cluster=internal if cluster is None else cluster)


def targets(*ips: str) -> tuple[Target, ...]:
    return tuple(Target(ip, 8080) for ip in ips)


def test_cluster_ip_uses_the_internal_endpoints_of_its_family() -> None:
    r = record(cips=("10.96.0.1", "fd00::1"), eps=(ep("10.0.0.2"), ep("10.0.0.1", internal=False),
                                                   ep("fd00:1::1")))
    entries = service_entries(r, ())
    assert entries == {
        ServiceAddress("10.96.0.1", 80, "TCP"): Entry.of(targets("10.0.0.2")),
        ServiceAddress("fd00::1", 80, "TCP"): Entry.of(targets("fd00:1::1")),
    }


def test_refuse_only_without_any_endpoint_else_leave_to_the_packet_path() -> None:
    assert service_entries(record(), ())[ServiceAddress("10.96.0.1", 80, "TCP")].flags == F_REFUSE
    local_only = record(eps=(ep("10.0.0.1", internal=False),), has_endpoints=True,
                        internal_traffic_policy=TrafficPolicy.LOCAL)
    entry = service_entries(local_only, ())[ServiceAddress("10.96.0.1", 80, "TCP")]
    assert entry == Entry() and not entry.refuses


def test_external_addresses_node_ports_and_their_limits() -> None:
    r = record(eps=(ep("10.0.0.1", external=False), ep("10.0.0.2", internal=False)),
               type=ServiceType.LOAD_BALANCER, node_port=30080,
               external_ips=("192.168.0.9",),
               load_balancer_ingress=(LoadBalancerIngress("192.168.1.1"),
                                      LoadBalancerIngress("192.168.1.2", "Proxy")))
    entries = service_entries(r, ("192.168.50.2", "fd00:50::2"))
    outside = Entry.of(targets("10.0.0.2"))
    assert entries[ServiceAddress("192.168.0.9", 80, "TCP")] == outside
    assert entries[ServiceAddress("192.168.1.1", 80, "TCP")] == outside
    assert entries[ServiceAddress("192.168.50.2", 30080, "TCP")] == outside
    assert ServiceAddress("192.168.1.2", 80, "TCP") not in entries, "ipMode Proxy is not ours"
    assert ServiceAddress("fd00:50::2", 30080, "TCP") not in entries, "no IPv6 cluster IP"
    ranged = replace(r.service, load_balancer_source_ranges=("10.0.0.0/8",))
    assert ServiceAddress("192.168.1.1", 80, "TCP") not in service_entries(
        replace(r, service=ranged), ())
    local = replace(r.service, external_traffic_policy=TrafficPolicy.LOCAL)
    short = service_entries(replace(r, service=local), ("192.168.50.2",))
    assert short[ServiceAddress("192.168.50.2", 30080, "TCP")] == Entry.of(targets("10.0.0.1")), \
        "connections made on the node short-circuit to the cluster set"
    both = replace(local, internal_traffic_policy=TrafficPolicy.LOCAL)
    r2 = record(eps=(ep("10.0.0.1", internal=False, external=False, cluster=True),),
                **{f: getattr(both, f) for f in ("type", "node_port", "external_ips",
                                                 "internal_traffic_policy",
                                                 "external_traffic_policy")},
                has_endpoints=True)
    short = service_entries(r2, ("192.168.50.2",))
    assert short[ServiceAddress("192.168.0.9", 80, "TCP")] == Entry.of(targets("10.0.0.1")), \
        "with no local endpoint (both policies Local) still the cluster set, not nothing"


def test_affinity_udp_and_sctp() -> None:
    sticky = record(eps=(ep("10.0.0.1"),), proto=Protocol.UDP,
                    session_affinity=SessionAffinity.CLIENT_IP)
    (entry,) = service_entries(sticky, ()).values()
    assert entry.flags == F_AFFINITY and entry.affinity_timeout == DEFAULT_AFFINITY_TIMEOUT
    assert service_entries(record(eps=(ep("10.0.0.1"),), proto=Protocol.SCTP), ()) == {}


def rendered(r: ServicePortState) -> tuple[tuple[ServiceAddress, Entry], ...]:
    return tuple(service_entries(r, ()).items())


def test_claims_resolve_by_key_and_hand_over_on_delete() -> None:
    a = record("a", cips=("10.96.0.1",), eps=(ep("10.0.0.1"),))
    b = record("b", eps=(ep("10.0.0.2"),), cips=("10.96.0.2",), external_ips=("10.96.0.1",))
    claims = AddressClaims.of({a.key: rendered(a), b.key: rendered(b)})
    fe = ServiceAddress("10.96.0.1", 80, "TCP")
    assert claims.entries[fe] == Entry.of(targets("10.0.0.1"))
    assert fe in claims.update([(a.key, None)])
    assert claims.entries[fe] == Entry.of(targets("10.0.0.2")), "the other claimant takes over"
    claims.update([(b.key, None)])
    assert claims.entries == {}


@given(st.ip_addresses(), st.integers(0, 65535), st.sampled_from(["TCP", "UDP"]))
def test_layout_round_trips(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int,
                            proto: str) -> None:
    fe = ServiceAddress(str(ip), port, proto)
    assert ServiceAddress.unpack(fe.pack()) == fe and len(fe.pack()) == 20
    t = Target(str(ip), port)
    assert Target.unpack(t.pack()) == t
    v = ServiceValue(7, 3, F_AFFINITY, 10)
    assert ServiceValue.unpack(v.pack()) == v


class FakeMap:
    """An in-memory map recording the order of writes."""

    def __init__(self, name: str, log: list[tuple[str, bytes, bytes | None]]) -> None:
        self.name, self.data, self.log = name, {}, log

    def update_many(self, keys: list[bytes], values: list[bytes]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.data[k] = v
            self.log.append((self.name, k, v))

    def delete_many(self, keys: list[bytes]) -> None:
        for k in keys:
            self.data.pop(k, None)
            self.log.append((self.name, k, None))

    def items(self):  # type: ignore[no-untyped-def]
        return list(self.data.items())


def lookups_always_whole(log: list[tuple[str, bytes, bytes | None]]) -> None:
    """Replay the writes: after each one, every service's endpoint set is complete."""
    maps: dict[str, dict[bytes, bytes]] = {"sp_services": {}, "sp_endpoints": {}}
    for name, key, value in log:
        if value is None:
            maps[name].pop(key, None)
        else:
            maps[name][key] = value
        for raw in maps["sp_services"].values():
            v = ServiceValue.unpack(raw)
            for slot in range(v.count):
                k = v.set_id.to_bytes(4, "little") + slot.to_bytes(4, "little")
                assert k in maps["sp_endpoints"], f"set {v.set_id} lacks slot {slot}"


ips = st.sampled_from([f"10.0.0.{i}" for i in range(1, 7)])
frontends = st.sampled_from([ServiceAddress(f"10.96.0.{i}", 80, "TCP") for i in range(1, 5)])
entries = st.builds(lambda t, f: Entry.of(sorted({Target(i, 8080) for i in t}), f),
                    st.lists(ips, max_size=4), st.sampled_from([0, F_AFFINITY]))
states = st.dictionaries(frontends, entries, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(states, st.booleans()), min_size=1, max_size=6))
def test_maps_hold_exactly_the_desired_state_and_no_service_is_ever_half(
        history: list[tuple[dict[ServiceAddress, Entry], bool]]) -> None:
    log: list[tuple[str, bytes, bytes | None]] = []
    services, endpoints = FakeMap("sp_services", log), FakeMap("sp_endpoints", log)
    tables = Tables(services, endpoints)  # type: ignore[arg-type]
    before: dict[ServiceAddress, Entry] = {}
    for desired, full in history:
        packed = {fe.pack(): e for fe, e in desired.items()}
        if full or tables.applied is None:
            tables.full(packed)
        else:
            changed = {fe.pack(): desired.get(fe) for fe in set(before) | set(desired)}
            tables.apply(changed)
        applied, orphans = read_kernel(services, endpoints)  # type: ignore[arg-type]
        assert not orphans
        held = {ServiceAddress.unpack(k): Entry(a.slots or (), a.value.flags)
                for k, a in applied.items()}
        assert held == desired
        before = desired
    lookups_always_whole(log)


def test_kernel_without_a_hook_is_named(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    class Lib:
        def libbpf_probe_bpf_prog_type(self, *_: object) -> int:
            return 1

        def libbpf_probe_bpf_helper(self, _type: int, func: int, _opts: object) -> int:
            return 0 if func == loader.HELPERS["bpf_set_retval"][0] else 1

    monkeypatch.setattr(loader.libbpf, "lib", lambda: Lib())
    missing = loader.missing_kernel_features()
    assert missing == ["helper bpf_set_retval in cgroup sock_addr programs (Linux 6.0)"]
    message = str(loader._kernel_error("cannot load the ebpf programs", missing))
    assert "bpf_set_retval" in message and "nft backend" in message


hostile_ips = st.one_of(st.ip_addresses().map(str), st.sampled_from(
    ["", "10.0.0", "::ffff:1.2.3.4.5", "999.1.1.1", "fe80::1%eth0", "x"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(hostile_ips, st.integers(-5, 70000), st.integers(-5, 70000),
                          hostile_ips), min_size=1, max_size=6))
def test_a_bad_service_port_is_rejected_alone(rows: list[tuple[str, int, int, str]]) -> None:
    good = record("good", eps=(ep("10.0.0.1"),))
    services = {good.key: good}
    for i, (cip, port, ep_port, ep_ip) in enumerate(rows):
        key = ServicePortKey("ns", f"bad{i}", "http", Protocol.TCP)
        svc = ServicePort(key, cluster_ips=(cip,), port=port, has_endpoints=True)
        services[key] = ServicePortState(svc, {ep_ip: Endpoint(ep_ip, ep_port, internal=True)})
    backend = EbpfBackend(NodeConfig("n1"), loader.Layout(pin_dir=Path("/nonexistent"),
                                                         cgroup=Path("/nonexistent")))
    state = NodeState("n1", 1, None, services, resolve_context(NodeConfig("n1"), None, ()))
    delta = backend.diff(state, Changes(frozenset(services), full=True, reason="initial"))
    claims = AddressClaims.of(delta.set)
    assert claims.entries[ServiceAddress("10.96.0.1", 80, "TCP")] == Entry.of(targets("10.0.0.1"))
    for fe, entry in claims.entries.items():  # whatever was kept can be written
        fe.pack()
        assert all(len(slot) == 20 for slot in entry.slots)
    assert good.key not in backend.refusals


def test_the_backend_imports_only_the_sdk() -> None:
    import ast
    from pathlib import Path

    import svcproxy.backends.ebpf as package

    for path in Path(package.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                else [])
            for name in names:
                assert not name.startswith("svcproxy") or name.startswith("svcproxy.sdk"), \
                    f"{path.name} imports {name}"


def test_wrong_places_are_refused_with_what_to_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    layout = loader.Layout(pin_dir=tmp_path / "pins", cgroup=tmp_path,
                           object_path=tmp_path / "missing.o")
    with pytest.raises(loader.LoadError, match="svcproxy.backends.ebpf.build"):
        loader.Programs(layout).load()
    with pytest.raises(loader.LoadError, match="not on a bpf filesystem; mount one"):
        loader.check_paths(layout)


def test_the_default_cgroup_is_where_cgroup2_is_mounted() -> None:
    from pathlib import Path

    from svcproxy.backends.ebpf.cli import unified_cgroup

    hybrid = ("tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n"
              "cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert unified_cgroup(hybrid) == Path("/sys/fs/cgroup/unified")
    assert unified_cgroup("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == Path("/sys/fs/cgroup")
    assert unified_cgroup("") == Path("/sys/fs/cgroup")


def test_node_ports_answer_on_the_node_contexts_listed_addresses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """NodePorts on every address (no CIDR for the family): the node IPs and the other
    addresses the agent found on the node's interfaces, as IPVS names them; never
    loopback; with CIDRs, the addresses inside them."""
    from svcproxy.backends.ebpf.backend import EbpfBackend
    from svcproxy.sdk import NodeState, resolve_context
    from svcproxy.sdk.config import NodeConfig

    config = NodeConfig("n1", node_ips=("192.0.2.10", "fd00::10"))
    backend = EbpfBackend(config, loader.Layout(pin_dir=tmp_path, cgroup=tmp_path))
    every = resolve_context(config, None, ("192.0.2.10", "198.51.100.7", "127.0.0.1", "fd00::10"))
    assert backend._node_ips(NodeState("n1", 1, None, {}, every)) == (
        "192.0.2.10", "198.51.100.7", "fd00::10")
    some = resolve_context(replace(config, node_port_addresses=("198.51.100.0/24",)), None,
                           ("192.0.2.10", "198.51.100.7"))
    assert backend._node_ips(NodeState("n1", 1, None, {}, some)) == ("198.51.100.7", "fd00::10")


def test_a_service_port_the_maps_cannot_hold_is_refused_and_keeps_its_entries() -> None:
    """More endpoints than an entry counts: refused through the SDK's refusals (named in
    /healthz and the metrics), its applied entries kept; a version that fits is taken."""
    from svcproxy.backends.ebpf.render import MAX_ENDPOINTS
    from svcproxy.sdk.stages import StagedBackend

    config = NodeConfig("n1")
    backend = EbpfBackend(config, loader.Layout(pin_dir=Path("/nonexistent"),
                                                cgroup=Path("/nonexistent")))
    applied: list[object] = []
    backend.apply = applied.append  # type: ignore[method-assign,assignment]
    context = resolve_context(config, None, ())

    def sync(r: ServicePortState, reason: str = "changes") -> None:
        StagedBackend.sync(backend, NodeState("n1", 1, None, {r.key: r}, context),
                           Changes(frozenset({r.key}), full=reason != "changes", reason=reason))

    small = record(eps=(ep("10.0.0.1"),))
    sync(small, "initial")
    fe = ServiceAddress("10.96.0.1", 80, "TCP")
    assert dict(backend.applied[small.key])[fe] == Entry.of(targets("10.0.0.1"))
    many = tuple(ep(str(ipaddress.ip_address("10.1.0.0") + i)) for i in range(MAX_ENDPOINTS + 1))
    sync(record(eps=many))
    assert "65536 endpoints, at most 65535 fit" in backend.refusals[small.key].error
    assert dict(backend.applied[small.key])[fe] == Entry.of(targets("10.0.0.1"))
    sync(record(eps=(ep("10.0.0.2"),)))
    assert small.key not in backend.refusals
    assert dict(backend.applied[small.key])[fe] == Entry.of(targets("10.0.0.2"))
