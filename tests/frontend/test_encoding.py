"""A record's op and digest term from its parts equal serialising the whole record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from svcproxy.convert import record_term, state_to_pb
from svcproxy.frontend.publication.encoding import RecordEncoder
from svcproxy.frontend.publication.wire import replace_service
from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
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
