"""A record's op and digest term from its parts equal serialising the whole record."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.convert import (
    DIGEST_MASK,
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
from svcproxy.frontend.publication.wire import diff_with_digest, replace_service
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


def _pb_ops(old: ServicePortState | None, new: ServicePortState | None) -> list[bytes]:
    """The ops turning ``old`` into ``new`` built as protobuf messages, serialised
    deterministically, in the diff's order."""
    def op(**kwargs: object) -> bytes:
        return pb.Op(**kwargs).SerializeToString(deterministic=True)  # type: ignore[arg-type]

    if new is None:
        return [op(delete_service=key_to_pb(old.key))] if old else []
    if old is None:
        return [op(replace_service=state_to_pb(new))]
    pkey = key_to_pb(new.key)
    out = [op(set_service=service_to_pb(new.service))] if old.service != new.service else []
    out += [op(set_endpoint=pb.EndpointOp(service=pkey, endpoint=endpoint_to_pb(ep)))
            for ip, ep in new.endpoints.items() if old.endpoints.get(ip) != ep]
    out += [op(delete_endpoint=pb.EndpointRef(service=pkey, ip=ip))
            for ip in old.endpoints.keys() - new.endpoints.keys()]
    return out


CHANGED_ENDPOINT = st.builds(Endpoint, ip=st.one_of(IPS, st.just("")),
                             port=st.sampled_from([0, 80]), ready=st.booleans(),
                             node_name=st.sampled_from(["", "n1"]))


@given(old=st.one_of(st.none(), st.tuples(SERVICE, st.lists(CHANGED_ENDPOINT, max_size=4))),
       new=st.one_of(st.none(), st.tuples(SERVICE, st.lists(CHANGED_ENDPOINT, max_size=4))),
       same_service=st.booleans())
def test_a_changes_ops_and_digest_delta_come_from_the_snapshots_encoder(
        old: tuple[ServicePort, list[Endpoint]] | None,
        new: tuple[ServicePort, list[Endpoint]] | None, same_service: bool) -> None:
    """The change path writes the bytes protobuf's deterministic serialisation would, the
    replace_service and set_service ops being the very bytes snapshots send."""
    encoder = RecordEncoder()
    old_rec = ServicePortState(old[0], {e.ip: e for e in old[1]}) if old else None
    new_rec = None
    if new:
        svc = new[0]
        if old:  # one service port changing; its endpoints shared where the IP is kept
            svc = old[0] if same_service else dataclasses.replace(svc, key=old[0].key)
            kept = {e.ip: e for e in old[1][:2]}
            new_rec = ServicePortState(svc, kept | {e.ip: e for e in new[1]})
        else:
            new_rec = ServicePortState(svc, {e.ip: e for e in new[1]})
    ops, delta = diff_with_digest(old_rec, new_rec, encoder)
    assert [op.data for op in ops] == _pb_ops(old_rec, new_rec)
    before = record_term(state_to_pb(old_rec)) if old_rec else 0
    after = record_term(state_to_pb(new_rec)) if new_rec else 0
    assert delta & DIGEST_MASK == (after - before) & DIGEST_MASK
    for op in ops:
        if op.kind == "replace_service":
            assert op.data is encoder.op(new_rec)  # type: ignore[arg-type]
        if op.kind == "set_service":
            assert op.data is encoder.service(new_rec.service)[0]  # type: ignore[union-attr]
