"""The SDK client decoding a node's first state: a snapshot of SERVICES service ports with
10 endpoints each, encoded by the frontend's real encoder (``RecordEncoder``, chunked into
WatchEvents as a stream sends them), parsed as gRPC does and applied by
``NodeStateClient._apply`` (records, and the digest checked against the frontend's).

    .venv/bin/python bench/bench_sdk_decode.py [SERVICES] [ROUNDS]   (default 10000 5)

"before" is the client with the previous replace_service path (a copy kept here only for
the comparison: each field converted through keywords, the service serialised twice and
every endpoint once more for the digest terms). Rounds alternate before/after in one run;
the figures are CPU time (process_time) per snapshot, best and median.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

from svcproxy.convert import (
    _AFFINITY_BACK,
    _POLICY_BACK,
    _TYPE_BACK,
    key_from_pb,
    record_term,
    service_term,
)
from svcproxy.frontend.publication.digests import Digests
from svcproxy.frontend.publication.wire import MESSAGE_BYTES, chunk_events
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
from svcproxy.sdk.client import NodeStateClient
from svcproxy.v1 import nodestate_pb2 as pb


def records(services: int) -> list[ServicePortState]:
    out = []
    for i in range(services):
        key = ServicePortKey("bench", f"s{i}", "p", Protocol.TCP)
        vip = f"10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
        svc = ServicePort(key, cluster_ips=(vip,), port=80, has_endpoints=True,
                          trigger_time=1764000000.25)
        eps = {}
        for j in range(10):
            ip = f"10.{(i * 10 + j) // 62500 % 250}.{(i * 10 + j) // 250 % 250}.{j + 1}"
            eps[ip] = Endpoint(ip, 8080, node_name=f"node-{j}", zone="z1", hint_zones=("z1",),
                               internal=True, external=True, cluster=True, local=j == 0,
                               is_local=j == 0)
        out.append(ServicePortState(svc, eps))
    return out


def snapshot(recs: list[ServicePortState]) -> list[bytes]:
    digests = Digests()
    ops = [digests.encoder.op(r) for r in recs]
    digest = sum(map(digests.record_term, recs)) & ((1 << 64) - 1)
    return list(chunk_events(7, ops, limit=MESSAGE_BYTES, digest=digest))


def _old_service_from_pb(msg: pb.ServicePort) -> ServicePort:
    return ServicePort(
        key=key_from_pb(msg.key), type=_TYPE_BACK.get(msg.type, ServiceType.CLUSTER_IP),
        cluster_ips=tuple(msg.cluster_ips), port=msg.port, node_port=msg.node_port,
        external_ips=tuple(msg.external_ips),
        load_balancer_ingress=tuple(LoadBalancerIngress(i.ip, i.ip_mode or "VIP")
                                    for i in msg.load_balancer_ingress),
        load_balancer_source_ranges=tuple(msg.load_balancer_source_ranges),
        session_affinity=_AFFINITY_BACK.get(msg.session_affinity, SessionAffinity.NONE),
        session_affinity_timeout=msg.session_affinity_timeout_seconds,
        internal_traffic_policy=_POLICY_BACK.get(msg.internal_traffic_policy,
                                                 TrafficPolicy.CLUSTER),
        external_traffic_policy=_POLICY_BACK.get(msg.external_traffic_policy,
                                                 TrafficPolicy.CLUSTER),
        health_check_node_port=msg.health_check_node_port,
        traffic_distribution=msg.traffic_distribution, has_endpoints=msg.has_endpoints,
        options=tuple(sorted(msg.options.items())),
        trigger_time=msg.trigger_time.ToNanoseconds() / 1e9 if msg.HasField("trigger_time")
        else 0.0, has_local_endpoints=msg.has_local_endpoints)


def _old_endpoint_from_pb(msg: pb.Endpoint) -> Endpoint:
    return Endpoint(ip=msg.ip, port=msg.port, ready=msg.ready, serving=msg.serving,
                    terminating=msg.terminating, is_local=msg.is_local, node_name=msg.node_name,
                    zone=msg.zone, hint_zones=tuple(msg.hint_zones),
                    hint_nodes=tuple(msg.hint_nodes), internal=msg.internal,
                    external=msg.external, cluster=msg.cluster, local=msg.local)


class OldClient(NodeStateClient):
    """The client with the previous replace_service path."""

    def _apply_op(self, op: pb.Op) -> None:
        if op.WhichOneof("op") != "replace_service":
            super()._apply_op(op)
            return
        msg = op.replace_service
        rec = ServicePortState(_old_service_from_pb(msg.service),
                               {e.ip: _old_endpoint_from_pb(e) for e in msg.endpoints})
        self._services[rec.key] = rec
        self._endpoint_changes += len(rec.endpoints)
        self._touch(rec.key, rec)
        self._service_terms[rec.key] = service_term(msg.service)
        self._set_record_term(rec.key, record_term(msg))


def decode(cls: type[NodeStateClient], msgs: list[bytes]) -> tuple[float, NodeStateClient]:
    """CPU seconds to parse (as gRPC does) and apply one snapshot, the cyclic collector
    paused as the agent pauses it for a cold start (svcproxy/agent/collector.py)."""
    client = cls("127.0.0.1:1", "node-0")
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        client._apply([pb.WatchEvent.FromString(m) for m in msgs])
        return time.process_time() - start, client
    finally:
        gc.enable()


def main() -> None:
    services = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    recs = records(services)
    msgs = snapshot(recs)
    times: dict[str, list[float]] = {"before": [], "after": []}
    reference = decode(OldClient, msgs)[1]._services
    for _ in range(rounds):
        for name, cls in (("before", OldClient), ("after", NodeStateClient)):
            seconds, client = decode(cls, msgs)
            assert client.mismatches == 0 and len(client._services) == services, name
            assert client._services == reference, name
            times[name].append(seconds)
    print(f"SDK decode of a snapshot: {services} service ports x 10 endpoints, "
          f"{sum(map(len, msgs)) / 1e6:.1f} MB in {len(msgs)} messages; CPU ms, {rounds} "
          "alternating rounds")
    for name, values in times.items():
        print(f"  {name:6s} best {min(values) * 1e3:7.1f}  median "
              f"{statistics.median(values) * 1e3:7.1f}")
    print("  rounds (ms): " + "; ".join(f"{n} " + " ".join(f"{v * 1e3:.0f}" for v in vs)
                                    for n, vs in times.items()))
    print(f"  ratio before/after (medians): "
          f"{statistics.median(times['before']) / statistics.median(times['after']):.2f}x")


if __name__ == "__main__":
    main()
