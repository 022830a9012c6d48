"""A record's op and digest term from its parts equal serialising the whole record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.convert import (
    endpoint_to_pb,
    field_bytes,
    key_to_pb,
    port_key_field,
    record_term,
    service_to_pb,
    state_to_pb,
)
from svcproxy.frontend.publication.encoding import (
    RecordEncoder,
    endpoint_field,
    key_field,
    service_message,
)
from svcproxy.frontend.publication.wire import replace_service
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

IPS = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.10", "fd00::1", "fd00::a"])
ENDPOINT = st.builds(Endpoint, ip=IPS, port=st.integers(1, 65535), ready=st.booleans(),
                     terminating=st.booleans(), is_local=st.booleans(),
                     node_name=st.sampled_from(["", "n1"]),
                     hint_zones=st.sampled_from([(), ("z1",), ("z1", "z2")]),
                     internal=st.booleans(), cluster=st.booleans(), local=st.booleans())
SERVICE = st.builds(
    ServicePort,
    key=st.builds(ServicePortKey, namespace=st.sampled_from(["a", "b"]), name=st.just("web"),
                  port_name=st.sampled_from(["", "http"]), protocol=st.sampled_from(Protocol)),
    type=st.sampled_from(ServiceType), cluster_ips=st.just(("10.96.0.1", "fd00:96::1")),
    port=st.integers(1, 65535),
    load_balancer_ingress=st.sampled_from([(), (LoadBalancerIngress("1.2.3.4", "Proxy"),)]),
    external_traffic_policy=st.sampled_from(TrafficPolicy), has_endpoints=st.booleans(),
    options=st.sampled_from([(), (("svcproxy.io/a", "1"), ("svcproxy.io/b", "x"))]),
    trigger_time=st.sampled_from([0.0, 1764000000.25]), has_local_endpoints=st.booleans())


@given(st.lists(st.tuples(SERVICE, st.lists(ENDPOINT, max_size=5)), min_size=1, max_size=4))
def test_parts_give_the_whole_records_op_and_term(
        records: list[tuple[ServicePort, list[Endpoint]]]) -> None:
    encoder = RecordEncoder()
    shared = [ep for _, eps in records for ep in eps]  # one endpoint object in two ports
    for svc, eps in records:
        rec = ServicePortState(svc, {e.ip: e for e in eps + shared[:1]})
        # The deterministic serialisation (maps in key order), the same message.
        assert encoder.op(rec) == pb.Op(replace_service=state_to_pb(rec)).SerializeToString(
            deterministic=True)
        assert pb.Op.FromString(encoder.op(rec)) == pb.Op.FromString(replace_service(rec).data)
        assert encoder.term(rec) == record_term(state_to_pb(rec))
        assert encoder.op(rec) is encoder.op(rec)


TEXT = st.text(max_size=140)  # any code point; past 127 bytes a size takes two bytes


@given(st.builds(Endpoint, ip=st.one_of(IPS, TEXT), port=st.integers(-(1 << 31), (1 << 31) - 1),
                 ready=st.booleans(), serving=st.booleans(), terminating=st.booleans(),
                 is_local=st.booleans(), node_name=TEXT, zone=TEXT,
                 hint_zones=st.lists(TEXT, max_size=3).map(tuple),
                 hint_nodes=st.lists(TEXT, max_size=3).map(tuple), internal=st.booleans(),
                 external=st.booleans(), cluster=st.booleans(), local=st.booleans()))
def test_an_endpoint_written_field_by_field_is_its_deterministic_serialisation(
        ep: Endpoint) -> None:
    assert endpoint_field(ep) == field_bytes(
        2, endpoint_to_pb(ep).SerializeToString(deterministic=True))


INTS = st.integers(-(1 << 31), (1 << 31) - 1)
STRINGS = st.lists(TEXT, max_size=3).map(tuple)


@given(st.builds(
    ServicePort,
    key=st.builds(ServicePortKey, namespace=TEXT, name=TEXT, port_name=TEXT,
                  protocol=st.sampled_from(Protocol)),
    type=st.sampled_from(ServiceType), cluster_ips=STRINGS, port=INTS, node_port=INTS,
    external_ips=STRINGS,
    load_balancer_ingress=st.lists(st.builds(LoadBalancerIngress, ip=TEXT, ip_mode=TEXT),
                                   max_size=2).map(tuple),
    load_balancer_source_ranges=STRINGS, session_affinity=st.sampled_from(SessionAffinity),
    session_affinity_timeout=INTS, internal_traffic_policy=st.sampled_from(TrafficPolicy),
    external_traffic_policy=st.sampled_from(TrafficPolicy), health_check_node_port=INTS,
    traffic_distribution=TEXT, has_endpoints=st.booleans(),
    options=st.dictionaries(TEXT, TEXT, max_size=3).map(lambda d: tuple(sorted(d.items()))),
    trigger_time=st.one_of(st.just(0.0), st.floats(1e-9, 4e9)),
    has_local_endpoints=st.booleans()))
def test_a_service_port_written_field_by_field_is_its_deterministic_serialisation(
        svc: ServicePort) -> None:
    key = key_field(svc.key)
    assert key == port_key_field(key_to_pb(svc.key))
    assert service_message(svc, key) == service_to_pb(svc).SerializeToString(
        deterministic=True)
