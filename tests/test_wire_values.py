"""Every value that reaches the wire survives it: the frontend's encoder (RecordEncoder,
the same bytes every stream and page sends) and the SDK's decoder (convert.state_from_pb,
what NodeStateClient applies) are total over their whole domains, and carry every value
Kubernetes allows exactly; a value past what a field holds degrades that field alone.

Each property has examples at the ends of its domain and just past them, so a converter
narrowed by one value (a bound off by one, one surrogate forgotten) fails here.
"""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from svcproxy.convert import node_to_pb, state_from_pb
from svcproxy.frontend.publication.encoding import RecordEncoder
from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
)
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.wirevalues import (
    NANOS,
    TIMESTAMP_MAX,
    TIMESTAMP_MIN,
    timestamp_parts,
    unix_seconds,
    utf8,
)

KEY = ServicePortKey("ns", "web", "http", Protocol.TCP)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
# Any code point Python holds, lone surrogates (a JSON or YAML escape of half a pair)
# included, which st.text leaves out.
ANY_CHAR = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))
ANY_TEXT = st.text(ANY_CHAR, max_size=40)


def through_the_wire(rec: ServicePortState) -> ServicePortState:
    """``rec`` encoded by the frontend and decoded by the SDK."""
    op = pb.Op.FromString(RecordEncoder().op(rec))
    return state_from_pb(op.replace_service)


def with_trigger(unix: float) -> ServicePortState:
    return ServicePortState(ServicePort(KEY, port=80, trigger_time=unix), {})


def on_the_wire(text: str) -> str:
    """What a protobuf string can hold of ``text``: each lone surrogate as U+FFFD."""
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


# ---- times: a trigger time (Unix seconds) <-> google.protobuf.Timestamp ---------------

@given(st.floats(TIMESTAMP_MIN - 2.0, TIMESTAMP_MAX + 2.0) | st.floats())
@example(float(TIMESTAMP_MAX))  # 9999-12-31T23:59:59Z
@example(TIMESTAMP_MAX + 0.999999)
@example(float(TIMESTAMP_MIN))  # 0001-01-01T00:00:00Z
@example(TIMESTAMP_MAX + 1.0)  # just past, as 9999-12-31T23:59:59-00:00:01 normalises
@example(TIMESTAMP_MAX + 86_340.0)  # 9999-12-31T23:59:59-23:59
@example(TIMESTAMP_MIN - 1.0)
@example(TIMESTAMP_MIN - 86_340.0)  # 0001-01-01T00:00:00+23:59
@example(TIMESTAMP_MAX + 0.9999999999)  # rounds up to the next second: past
@example(math.inf)
@example(-math.inf)
@example(math.nan)
@example(5e-324)
@example(1e300)
@settings(max_examples=200, deadline=None)
def test_any_trigger_time_goes_through_or_is_none(unix: float) -> None:
    decoded = through_the_wire(with_trigger(unix)).service.trigger_time
    parts = timestamp_parts(unix)
    if parts is None:
        assert decoded == 0.0  # no trigger time: nothing else of the record changes
        assert not unix or not TIMESTAMP_MIN <= unix <= TIMESTAMP_MAX, \
            "a time a Timestamp holds was dropped"
    else:
        assert TIMESTAMP_MIN <= parts[0] <= TIMESTAMP_MAX and 0 <= parts[1] < NANOS
        assert math.isclose(decoded, unix, rel_tol=1e-15, abs_tol=1e-6)


@given(st.integers(-(1 << 63), (1 << 63) - 1), INT32)
@example(TIMESTAMP_MAX, NANOS - 1)  # the last instant a Timestamp holds
@example(TIMESTAMP_MIN, 0)
@example(TIMESTAMP_MAX + 1, 0)
@example(TIMESTAMP_MIN - 1, NANOS - 1)
@example(0, NANOS)
@example(0, -1)
@example((1 << 63) - 1, (1 << 31) - 1)
@settings(max_examples=200, deadline=None)
def test_the_sdk_decodes_any_timestamp_the_wire_carries(seconds: int, nanos: int) -> None:
    msg = pb.ServicePortState(service=pb.ServicePort(
        key=pb.ServicePortKey(namespace="ns", name="web"), port=80))
    msg.service.trigger_time.seconds = seconds
    msg.service.trigger_time.nanos = nanos
    wire = pb.ServicePortState.FromString(msg.SerializeToString())
    decoded = state_from_pb(wire).service.trigger_time
    valid = TIMESTAMP_MIN <= seconds <= TIMESTAMP_MAX and 0 <= nanos < NANOS
    assert decoded == (unix_seconds(seconds, nanos) if valid else 0.0)
    if valid:
        assert math.isclose(decoded, seconds + nanos / NANOS, rel_tol=1e-15)


# ---- strings: any str <-> a protobuf string (UTF-8) ----------------------------------

@st.composite
def stringy_records(draw: st.DrawFn) -> ServicePortState:
    """A record whose every string field is any text (lone surrogates too)."""
    text = ANY_TEXT
    key = ServicePortKey(draw(text), draw(text), draw(text), Protocol.UDP)
    options = tuple(sorted(draw(st.dictionaries(text, text, max_size=3)).items()))
    svc = ServicePort(
        key, cluster_ips=tuple(draw(st.lists(text, max_size=2))), port=53,
        external_ips=tuple(draw(st.lists(text, max_size=2))),
        load_balancer_ingress=(LoadBalancerIngress(draw(text), draw(text) or "VIP"),),
        load_balancer_source_ranges=tuple(draw(st.lists(text, max_size=2))),
        traffic_distribution=draw(text), options=options)
    endpoints = {}
    for ip in draw(st.lists(text, max_size=3, unique_by=on_the_wire)):
        endpoints[ip] = Endpoint(ip, 53, node_name=draw(text), zone=draw(text),
                                 hint_zones=tuple(draw(st.lists(text, max_size=2))),
                                 hint_nodes=tuple(draw(st.lists(text, max_size=2))))
    return ServicePortState(svc, endpoints)


def _texts(rec: ServicePortState) -> list[object]:
    svc = rec.service
    key = svc.key
    out: list[object] = [key.namespace, key.name, key.port_name, svc.cluster_ips,
                         svc.external_ips, svc.load_balancer_source_ranges,
                         svc.traffic_distribution,
                         [(i.ip, i.ip_mode) for i in svc.load_balancer_ingress],
                         sorted(_as_map(svc.options).items())]
    for ip in sorted(rec.endpoints, key=on_the_wire):
        ep = rec.endpoints[ip]
        out.append((ep.ip, ep.node_name, ep.zone, ep.hint_zones, ep.hint_nodes))
    return out


def _as_map(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``pairs`` as the wire's map holds them: keys that differ only in lone surrogates
    are one key, held by the last of the (sorted) pairs, as a map built in that order keeps."""
    return {on_the_wire(k): on_the_wire(v) for k, v in pairs}


def _normal(value: object) -> object:
    if isinstance(value, str):
        return on_the_wire(value)
    if isinstance(value, tuple | list):
        return [_normal(v) for v in value]
    return value


@given(stringy_records())
@example(ServicePortState(ServicePort(  # two option keys, one on the wire
    KEY, port=53, options=(("\ud800", "first"), ("\ud801", "last"))), {}))
@settings(max_examples=40, deadline=None)
def test_any_string_goes_through_as_the_apiserver_would_store_it(
        rec: ServicePortState) -> None:
    decoded = through_the_wire(rec)
    assert _normal(_texts(decoded)) == _normal(_texts(rec))


@given(ANY_TEXT)
@example("\ud800")  # each end of the surrogates, and just past them
@example("\udfff")
@example("\ud7ff\ue000")
@example("\U0010ffff\x00")
@example("\ud83d\ude00")  # a pair left as two halves: two U+FFFD, as Go's decoder does
@settings(max_examples=100, deadline=None)
def test_utf8_is_valid_and_keeps_every_code_point_but_lone_surrogates(text: str) -> None:
    assert utf8(text).decode() == on_the_wire(text)


def test_a_string_as_long_as_annotations_may_be_goes_through() -> None:
    """256 KiB, the apiserver's limit on all of an object's annotations together."""
    value = "\u00e9\U0001f600\ud800x" * (256 * 1024 // 4)
    rec = ServicePortState(ServicePort(KEY, port=80, options=(("svcproxy.io/x", value),)),
                           {})
    assert through_the_wire(rec).service.options == (("svcproxy.io/x", on_the_wire(value)),)


@given(ANY_TEXT, ANY_TEXT, st.lists(ANY_TEXT, max_size=2),
       st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3))
@example("\udfff", "\ud800", ["\udc00"], {"\ud800": "\udbff"})
@example("", "", [], dict([("\ud801", "0"), ("\ud800", "")]))  # two keys, one on the wire
@settings(max_examples=40, deadline=None)
def test_any_node_goes_through(name: str, zone: str, addresses: list[str],
                               labels: dict[str, str]) -> None:
    node = NodeInfo(name=name, zone=zone, addresses=tuple(addresses),
                    labels=tuple(sorted(labels.items())))
    wire = pb.NodeInfo.FromString(node_to_pb(node).SerializeToString())
    assert (wire.name, wire.zone, list(wire.addresses)) == (
        on_the_wire(name), on_the_wire(zone), [on_the_wire(a) for a in addresses])
    # Keys that differ only in lone surrogates are one key on the wire: the last of the
    # node's (sorted) labels holds it, as a map built in that order keeps.
    assert dict(wire.labels) == {on_the_wire(k): on_the_wire(v) for k, v in node.labels}


# ---- integers: every integer field, over all of int32 ---------------------------------

@given(INT32, INT32, INT32, INT32, INT32)
@example(65535, 65535, 86400, 65535, 65535)  # Kubernetes' largest port, nodePort, timeout
@example(1, 1, 1, 1, 1)
@example(0, 0, 0, 0, 0)
@example((1 << 31) - 1, -(1 << 31), (1 << 31) - 1, -(1 << 31), -1)
def test_every_integer_field_goes_through_exactly(port: int, node_port: int, timeout: int,
                                                   health: int, target: int) -> None:
    svc = ServicePort(KEY, port=port, node_port=node_port, session_affinity_timeout=timeout,
                      health_check_node_port=health)
    rec = ServicePortState(svc, {"10.0.0.1": Endpoint("10.0.0.1", target)})
    decoded = through_the_wire(rec)
    out = decoded.service
    assert (out.port, out.node_port, out.session_affinity_timeout,
            out.health_check_node_port) == (port, node_port, timeout, health)
    assert decoded.endpoints["10.0.0.1"].port == target


# ---- what the wire carries, the nodes take: refused for that service port alone --------

WIRE_TEXT = st.text(st.characters(), max_size=20)  # what a protobuf string holds


@given(INT32, INT32, INT32, INT32, INT32, WIRE_TEXT, WIRE_TEXT)
@example(-(1 << 31), (1 << 31) - 1, -(1 << 31), (1 << 31) - 1, -(1 << 31), "", "")
@example(65536, 65536, 86401, 65536, 65536, "\x00", "\U0010ffff")
@example(0, 0, 0, 0, 0, "1.2.3.4\n", "::ffff:1.2.3.4")
@settings(max_examples=150, deadline=None)
def test_the_sdk_and_the_ebpf_plan_take_any_value_the_wire_carries(
        port: int, node_port: int, timeout: int, health: int, target: int, ip: str,
        cluster_ip: str) -> None:
    """The SDK's screen (what every StagedBackend refuses before rendering) and the eBPF
    render never raise for a decoded record; a bad one is refused alone, the rest rendered."""
    from pathlib import Path

    from svcproxy.backends.ebpf.backend import EbpfBackend
    from svcproxy.backends.ebpf.claims import AddressClaims
    from svcproxy.backends.ebpf.layout import ServiceAddress
    from svcproxy.backends.ebpf.loader import Layout
    from svcproxy.model import ServiceType, SessionAffinity
    from svcproxy.sdk import Changes, NodeConfig, NodeState, resolve_context
    from svcproxy.sdk.refusals import invalid_values

    key = ServicePortKey("ns", "odd", "p", Protocol.TCP)
    svc = ServicePort(key, type=ServiceType.NODE_PORT, cluster_ips=(cluster_ip,), port=port,
                      node_port=node_port, session_affinity=SessionAffinity.CLIENT_IP,
                      session_affinity_timeout=timeout, health_check_node_port=health,
                      has_endpoints=True)
    odd = through_the_wire(ServicePortState(svc, {ip: Endpoint(ip, target, internal=True,
                                                               external=True)}))
    good_svc = ServicePort(ServicePortKey("ns", "good", "p", Protocol.TCP),
                           cluster_ips=("10.96.0.1",), port=80, has_endpoints=True)
    good = ServicePortState(good_svc, {"10.0.0.1": Endpoint("10.0.0.1", 8080, internal=True)})
    why = invalid_values(odd)
    assert why is None or isinstance(why, str)
    assert invalid_values(good) is None
    config = NodeConfig("n1", node_ips=("192.168.50.2",))
    backend = EbpfBackend(config, Layout(pin_dir=Path("/nonexistent"), cgroup=Path("/nonexistent")))
    services = {odd.service.key: odd, good.service.key: good}
    state = NodeState("n1", 1, None, services, resolve_context(config, None, ("192.168.50.2",)))
    delta = backend.diff(state, Changes(frozenset(services), full=True, reason="initial"))
    assert ServiceAddress("10.96.0.1", 80, "TCP") in AddressClaims.of(delta.set).entries
    assert good.service.key not in backend.refusals
