"""Conversion between the typed model (svcproxy.model) and the protobuf API."""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from svcproxy.model import (
    Endpoint,
    LoadBalancerIngress,
    NodeInfo,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
    SessionAffinity,
    TrafficPolicy,
)
from svcproxy.v1 import nodestate_pb2 as pb
from svcproxy.wirevalues import timestamp_parts, unix_seconds, wire_text

_PROTO = {Protocol.TCP: pb.TCP, Protocol.UDP: pb.UDP, Protocol.SCTP: pb.SCTP}
_PROTO_BACK = {v: k for k, v in _PROTO.items()}
_TYPE = {ServiceType.CLUSTER_IP: pb.CLUSTER_IP, ServiceType.NODE_PORT: pb.NODE_PORT,
         ServiceType.LOAD_BALANCER: pb.LOAD_BALANCER}
_TYPE_BACK = {v: k for k, v in _TYPE.items()}
_POLICY = {TrafficPolicy.CLUSTER: pb.CLUSTER, TrafficPolicy.LOCAL: pb.LOCAL}
_POLICY_BACK = {v: k for k, v in _POLICY.items()}
_AFFINITY = {SessionAffinity.NONE: pb.NONE, SessionAffinity.CLIENT_IP: pb.CLIENT_IP}
_AFFINITY_BACK = {v: k for k, v in _AFFINITY.items()}


def key_to_pb(key: ServicePortKey) -> pb.ServicePortKey:
    return pb.ServicePortKey(namespace=key.namespace, name=key.name, port_name=key.port_name,
                             protocol=_PROTO[key.protocol])


# Decoding builds the frozen dataclasses through their slots' descriptors: the same
# objects as their __init__ makes (it has no checks), at about half the cost, which is
# most of decoding a node's first state.
_new = object.__new__


def _setters(cls: type, names: str) -> tuple[Callable[[object, object], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names.split())


_KEY = _setters(ServicePortKey, "namespace name port_name protocol")
_SERVICE = _setters(ServicePort, "key type cluster_ips port node_port external_ips "
                    "load_balancer_ingress load_balancer_source_ranges session_affinity "
                    "session_affinity_timeout internal_traffic_policy external_traffic_policy "
                    "health_check_node_port traffic_distribution has_endpoints options "
                    "trigger_time has_local_endpoints")
_ENDPOINT = _setters(Endpoint, "ip port ready serving terminating is_local node_name zone "
                     "hint_zones hint_nodes internal external cluster local")


def key_from_pb(msg: pb.ServicePortKey) -> ServicePortKey:
    key = _new(ServicePortKey)
    namespace, name, port_name, protocol = _KEY
    namespace(key, msg.namespace)
    name(key, msg.name)
    port_name(key, msg.port_name)
    protocol(key, _PROTO_BACK.get(msg.protocol, Protocol.TCP))
    return key


def op_subject(op: pb.Op) -> str:
    """What ``op`` is about, for a message: its kind and the service port, endpoint or node
    it names (key_from_pb and strings are total, so this never raises)."""
    which = op.WhichOneof("op")
    if which is None:
        return "an empty op"
    if which in ("set_node", "delete_node"):
        return f"{which} of node {op.set_node.name if which == 'set_node' else op.delete_node}"
    keys = {"set_service": op.set_service.key, "replace_service": op.replace_service.service.key,
            "delete_service": op.delete_service, "set_endpoint": op.set_endpoint.service,
            "delete_endpoint": op.delete_endpoint.service}
    return f"{which} of {key_from_pb(keys[which])}" if which in keys else which


def _timestamp(unix: float) -> Timestamp | None:
    """The encoder's one conversion of a trigger time (wirevalues.timestamp_parts)."""
    parts = timestamp_parts(unix)
    return None if parts is None else Timestamp(seconds=parts[0], nanos=parts[1])


def service_to_pb(svc: ServicePort) -> pb.ServicePort:
    return pb.ServicePort(
        key=key_to_pb(svc.key), type=_TYPE[svc.type], cluster_ips=svc.cluster_ips,
        port=svc.port, node_port=svc.node_port, external_ips=svc.external_ips,
        load_balancer_ingress=[pb.LoadBalancerIngress(ip=i.ip, ip_mode=i.ip_mode)
                               for i in svc.load_balancer_ingress],
        load_balancer_source_ranges=svc.load_balancer_source_ranges,
        session_affinity=_AFFINITY[svc.session_affinity],
        session_affinity_timeout_seconds=svc.session_affinity_timeout,
        internal_traffic_policy=_POLICY[svc.internal_traffic_policy],
        external_traffic_policy=_POLICY[svc.external_traffic_policy],
        health_check_node_port=svc.health_check_node_port,
        traffic_distribution=svc.traffic_distribution, has_endpoints=svc.has_endpoints,
        options=dict(svc.options), trigger_time=_timestamp(svc.trigger_time),
        has_local_endpoints=svc.has_local_endpoints)


def service_from_pb(msg: pb.ServicePort) -> ServicePort:
    # Set one by one as endpoint_from_pb: every service port of a first state comes here.
    svc = _new(ServicePort)
    key, type_, cluster_ips, port, node_port, external_ips, ingress, source_ranges, \
        affinity, affinity_timeout, internal_policy, external_policy, health_check_node_port, \
        traffic_distribution, has_endpoints, options, trigger_time, has_local_endpoints = _SERVICE
    key(svc, key_from_pb(msg.key))
    type_(svc, _TYPE_BACK.get(msg.type, ServiceType.CLUSTER_IP))
    cluster_ips(svc, tuple(ips) if (ips := msg.cluster_ips) else ())
    port(svc, msg.port)
    node_port(svc, msg.node_port)
    external_ips(svc, tuple(ips) if (ips := msg.external_ips) else ())
    ingress(svc, tuple(LoadBalancerIngress(i.ip, i.ip_mode or "VIP")
                       for i in msg.load_balancer_ingress)
            if msg.load_balancer_ingress else ())
    source_ranges(svc, tuple(ranges) if (ranges := msg.load_balancer_source_ranges) else ())
    affinity(svc, _AFFINITY_BACK.get(msg.session_affinity, SessionAffinity.NONE))
    affinity_timeout(svc, msg.session_affinity_timeout_seconds)
    internal_policy(svc, _POLICY_BACK.get(msg.internal_traffic_policy, TrafficPolicy.CLUSTER))
    external_policy(svc, _POLICY_BACK.get(msg.external_traffic_policy, TrafficPolicy.CLUSTER))
    health_check_node_port(svc, msg.health_check_node_port)
    traffic_distribution(svc, msg.traffic_distribution)
    has_endpoints(svc, msg.has_endpoints)
    options(svc, tuple(sorted(msg.options.items())) if msg.options else ())
    # Any Timestamp the wire carries, valid or not (wirevalues.unix_seconds: 0.0 past it).
    trigger_time(svc, unix_seconds((ts := msg.trigger_time).seconds, ts.nanos)
                 if msg.HasField("trigger_time") else 0.0)
    has_local_endpoints(svc, msg.has_local_endpoints)
    return svc


def endpoint_to_pb(ep: Endpoint) -> pb.Endpoint:
    return pb.Endpoint(ip=ep.ip, port=ep.port, ready=ep.ready, serving=ep.serving,
                       terminating=ep.terminating, is_local=ep.is_local, node_name=ep.node_name,
                       zone=ep.zone, hint_zones=ep.hint_zones, hint_nodes=ep.hint_nodes,
                       internal=ep.internal, external=ep.external, cluster=ep.cluster,
                       local=ep.local)


def endpoint_from_pb(msg: pb.Endpoint) -> Endpoint:
    # The hottest decoding (a node's first state has every endpoint): set one by one.
    ep = _new(Endpoint)
    ip, port, ready, serving, terminating, is_local, node_name, zone, hint_zones, \
        hint_nodes, internal, external, cluster, local = _ENDPOINT
    ip(ep, msg.ip)
    port(ep, msg.port)
    ready(ep, msg.ready)
    serving(ep, msg.serving)
    terminating(ep, msg.terminating)
    is_local(ep, msg.is_local)
    node_name(ep, msg.node_name)
    zone(ep, msg.zone)
    hint_zones(ep, tuple(zones) if (zones := msg.hint_zones) else ())
    hint_nodes(ep, tuple(nodes) if (nodes := msg.hint_nodes) else ())
    internal(ep, msg.internal)
    external(ep, msg.external)
    cluster(ep, msg.cluster)
    local(ep, msg.local)
    return ep


def state_to_pb(state: ServicePortState) -> pb.ServicePortState:
    """A service port's state as the API's message."""
    return pb.ServicePortState(service=service_to_pb(state.service),
                               endpoints=[endpoint_to_pb(e) for _, e in
                                          sorted(state.endpoints.items())])


def state_from_pb(msg: pb.ServicePortState) -> ServicePortState:
    return ServicePortState(service_from_pb(msg.service),
                            {e.ip: e for e in map(endpoint_from_pb, msg.endpoints)})


def node_to_pb(node: NodeInfo) -> pb.NodeInfo:
    """A node as the API's message."""
    text = wire_text  # each string as a protobuf string takes it
    return pb.NodeInfo(name=text(node.name), zone=text(node.zone),
                       pod_cidrs=[text(c) for c in node.pod_cidrs],
                       addresses=[text(a) for a in node.addresses],
                       labels={text(k): text(v) for k, v in node.labels},
                       terminating=node.terminating)


def node_from_pb(msg: pb.NodeInfo) -> NodeInfo:
    return NodeInfo(name=msg.name, zone=msg.zone, pod_cidrs=tuple(msg.pod_cidrs),
                    addresses=tuple(msg.addresses), labels=tuple(sorted(msg.labels.items())),
                    terminating=msg.terminating)


# ---- the state digest (WatchEvent.digest) ---------------------------------------------
# The sum, modulo 2**64, of one term per service port, per endpoint and per node of a
# client's state: order-independent, and updated by adding the new and subtracting the
# old term of whatever an op changes. A term is BLAKE2b-64 (digest size 8, little-endian)
# of a tag and the deterministic serialisation of the message it stands for.
DIGEST_MASK = (1 << 64) - 1


def digest_term(tag: bytes, msg: Message) -> int:
    return term_of(tag, msg.SerializeToString(deterministic=True))


def term_of(tag: bytes, data: bytes) -> int:
    """The term of a message from its deterministic serialisation ``data``."""
    return int.from_bytes(blake2b(tag + data, digest_size=8).digest(), "little")


def service_term(svc: pb.ServicePort) -> int:
    """The term of a service port's service-level fields (its key included)."""
    return digest_term(b"s", svc)


def endpoint_term(key: pb.ServicePortKey, ep: pb.Endpoint) -> int:
    """The term of one endpoint of the service port ``key``."""
    return _endpoint_term(port_key_field(key), ep)


def port_key_field(key: pb.ServicePortKey) -> bytes:
    """A service port's key as field 1 (of an EndpointOp), what its endpoints' terms hash."""
    return field_bytes(1, key.SerializeToString(deterministic=True))


def endpoint_term_of(key_field: bytes, data: bytes) -> int:
    """The term of an endpoint from its port's ``key_field`` and its deterministic
    serialisation ``data``."""
    return term_of(b"e", key_field + field_bytes(2, data))


def field_bytes(number: int, data: bytes) -> bytes:
    """A length-delimited protobuf field (EndpointOp's bytes built without the message)."""
    head = bytearray([number << 3 | 2])
    size = len(data)
    while size > 0x7F:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + data


def _endpoint_term(key_field: bytes, ep: pb.Endpoint) -> int:
    return endpoint_term_of(key_field, ep.SerializeToString(deterministic=True))


def record_term(state: pb.ServicePortState) -> int:
    """The terms of a service port and all of its endpoints."""
    key_field = port_key_field(state.service.key)
    total = service_term(state.service)
    for ep in state.endpoints:
        total += _endpoint_term(key_field, ep)
    return total & DIGEST_MASK


def record_terms(state: pb.ServicePortState) -> tuple[int, int]:
    """``service_term`` of the state's service and ``record_term`` of the state, from one
    serialisation of the state: its field 1 is the service's serialisation and each field
    2 an endpoint's (the bytes ``endpoint_term_of`` hashes after the key)."""
    data = state.SerializeToString(deterministic=True)
    key_field = port_key_field(state.service.key)
    service = b""
    endpoints = 0
    pos, end = 0, len(data)
    while pos < end:
        field = pos
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint_at(data, pos)
        wire = tag & 7
        if wire == 2:
            size = data[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint_at(data, pos)
            if tag == 0x0A:
                service = data[pos:pos + size]
            elif tag == 0x12:
                endpoints += term_of(b"e", key_field + data[field:pos + size])
            pos += size
        elif wire in (0, 1, 5):  # an unknown field, not in the terms
            pos = _varint_at(data, pos)[1] if wire == 0 else pos + (8 if wire == 1 else 4)
        else:
            return service_term(state.service), record_term(state)
    term = term_of(b"s", service)
    return term, (term + endpoints) & DIGEST_MASK


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and where it ends."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def node_term(node: pb.NodeInfo) -> int:
    return digest_term(b"n", node)
