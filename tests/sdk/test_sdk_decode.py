"""The SDK's fast decoding of a record gives exactly what the keyword constructors and the
separate serialisations of each part gave: the same records and the same digest terms."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.convert import (
    _AFFINITY_BACK,
    _POLICY_BACK,
    _PROTO_BACK,
    _TYPE_BACK,
    record_term,
    record_terms,
    service_term,
    state_from_pb,
    state_to_pb,
)
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
from svcproxy.v1 import nodestate_pb2 as pb

TEXT = st.text(max_size=6)
STRINGS = st.lists(TEXT, max_size=3)
I32 = st.integers(-(2**31), 2**31 - 1)
ENUM = st.integers(0, 6)  # past the known values too (proto3 enums are open)
PB_ENDPOINT = st.builds(pb.Endpoint, ip=TEXT, port=I32, ready=st.booleans(),
                        serving=st.booleans(), terminating=st.booleans(),
                        is_local=st.booleans(), node_name=TEXT, zone=TEXT,
                        hint_zones=STRINGS, hint_nodes=STRINGS, internal=st.booleans(),
                        external=st.booleans(), cluster=st.booleans(), local=st.booleans())
PB_KEY = st.builds(pb.ServicePortKey, namespace=TEXT, name=TEXT, port_name=TEXT,
                   protocol=ENUM)
PB_SERVICE = st.builds(
    pb.ServicePort, key=PB_KEY, type=ENUM, cluster_ips=STRINGS, port=I32, node_port=I32,
    external_ips=STRINGS,
    load_balancer_ingress=st.lists(st.builds(pb.LoadBalancerIngress, ip=TEXT,
                                             ip_mode=st.sampled_from(["", "VIP", "Proxy"])),
                                   max_size=2),
    load_balancer_source_ranges=STRINGS, session_affinity=ENUM,
    session_affinity_timeout_seconds=I32, internal_traffic_policy=ENUM,
    external_traffic_policy=ENUM, health_check_node_port=I32, traffic_distribution=TEXT,
    has_endpoints=st.booleans(), options=st.dictionaries(TEXT, TEXT, max_size=3),
    has_local_endpoints=st.booleans())
# Fields a newer frontend may send (numbers this client does not know), one per wire type.
UNKNOWN = st.lists(st.sampled_from([b"\xc8\x3e\x96\x01", b"\xc9\x3e" + bytes(range(8)),
                                    b"\xcd\x3e\x01\x02\x03\x04", b"\xca\x3e\x03abc",
                                    b"\xca\x3e\x81\x01" + bytes(129)]), max_size=3)


@st.composite
def states(draw: st.DrawFn) -> pb.ServicePortState:
    msg = pb.ServicePortState(endpoints=draw(st.lists(PB_ENDPOINT, max_size=4)))
    if draw(st.booleans()):
        msg.service.CopyFrom(draw(PB_SERVICE))
        if draw(st.booleans()):
            msg.service.trigger_time.FromNanoseconds(draw(st.integers(0, 2**62)))
    return pb.ServicePortState.FromString(msg.SerializeToString() + b"".join(draw(UNKNOWN)))


def reference(msg: pb.ServicePortState) -> ServicePortState:
    """The record as the keyword constructors build it (the decoding before the fast one)."""
    svc, key = msg.service, msg.service.key
    service = ServicePort(
        key=ServicePortKey(key.namespace, key.name, key.port_name,
                           _PROTO_BACK.get(key.protocol, Protocol.TCP)),
        type=_TYPE_BACK.get(svc.type, ServiceType.CLUSTER_IP),
        cluster_ips=tuple(svc.cluster_ips), port=svc.port, node_port=svc.node_port,
        external_ips=tuple(svc.external_ips),
        load_balancer_ingress=tuple(LoadBalancerIngress(i.ip, i.ip_mode or "VIP")
                                    for i in svc.load_balancer_ingress),
        load_balancer_source_ranges=tuple(svc.load_balancer_source_ranges),
        session_affinity=_AFFINITY_BACK.get(svc.session_affinity, SessionAffinity.NONE),
        session_affinity_timeout=svc.session_affinity_timeout_seconds,
        internal_traffic_policy=_POLICY_BACK.get(svc.internal_traffic_policy,
                                                 TrafficPolicy.CLUSTER),
        external_traffic_policy=_POLICY_BACK.get(svc.external_traffic_policy,
                                                 TrafficPolicy.CLUSTER),
        health_check_node_port=svc.health_check_node_port,
        traffic_distribution=svc.traffic_distribution, has_endpoints=svc.has_endpoints,
        options=tuple(sorted(svc.options.items())),
        trigger_time=svc.trigger_time.ToNanoseconds() / 1e9 if svc.HasField("trigger_time")
        else 0.0, has_local_endpoints=svc.has_local_endpoints)
    return ServicePortState(service, {e.ip: Endpoint(
        ip=e.ip, port=e.port, ready=e.ready, serving=e.serving, terminating=e.terminating,
        is_local=e.is_local, node_name=e.node_name, zone=e.zone,
        hint_zones=tuple(e.hint_zones), hint_nodes=tuple(e.hint_nodes), internal=e.internal,
        external=e.external, cluster=e.cluster, local=e.local) for e in msg.endpoints})


def _fields(obj: object) -> list[tuple[str, type, object]]:
    return [(f.name, type(getattr(obj, f.name)), getattr(obj, f.name))
            for f in dataclasses.fields(obj)]  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(states())
def test_fast_decoding_gives_the_same_record_and_terms(msg: pb.ServicePortState) -> None:
    got, want = state_from_pb(msg), reference(msg)
    assert got == want and hash(got.service) == hash(want.service)
    assert list(got.endpoints) == list(want.endpoints)
    assert _fields(got.service) == _fields(want.service)
    assert _fields(got.key) == _fields(want.key)
    for ip, ep in got.endpoints.items():
        assert _fields(ep) == _fields(want.endpoints[ip]) and hash(ep) == hash(want.endpoints[ip])
    assert record_terms(msg) == (service_term(msg.service), record_term(msg))


def test_decoded_records_stay_frozen() -> None:
    rec = state_from_pb(state_to_pb(ServicePortState(
        ServicePort(ServicePortKey("a", "web", "", Protocol.TCP)), {"10.0.0.1": Endpoint(
            "10.0.0.1", 80)})))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.service.port = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.endpoints["10.0.0.1"].port = 1  # type: ignore[misc]
