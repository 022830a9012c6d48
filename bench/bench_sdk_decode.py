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

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.convert import record_term, service_term  # noqa: E402
from svcproxy.frontend.publication.digests import Digests  # noqa: E402
from svcproxy.frontend.publication.wire import MESSAGE_BYTES, chunk_events  # noqa: E402
from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState  # noqa: E402
from svcproxy.sdk.client import NodeStateClient  # noqa: E402
from svcproxy.v1 import nodestate_pb2 as pb  # noqa: E402
from tests.sdk.test_sdk_decode import reference  # noqa: E402


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


class OldClient(NodeStateClient):
    """The client with the previous replace_service path."""

    def _apply_op(self, op: pb.Op) -> None:
        if op.WhichOneof("op") != "replace_service":
            super()._apply_op(op)
            return
        msg = op.replace_service
        rec = reference(msg)
        self._services[rec.key] = rec
        self._endpoint_changes += len(rec.endpoints)
        self._touch(rec.key, rec)
        self._service_terms[rec.key] = service_term(msg.service)
        self._set_record_term(rec.key, record_term(msg))


def decode(cls: type[NodeStateClient], msgs: list[bytes]) -> tuple[float, NodeStateClient]:
    """CPU seconds to parse (as gRPC does) and apply one snapshot, the cyclic collector
    paused as the agent pauses it for a cold start (svcproxy/collector.py)."""
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
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("services", nargs="?", type=int, default=10000,
                        help="service ports in the snapshot (default %(default)s)")
    parser.add_argument("rounds", nargs="?", type=int, default=5,
                        help="rounds of each path (default %(default)s)")
    args = parser.parse_args()
    services, rounds = args.services, args.rounds
    recs = records(services)
    msgs = snapshot(recs)
    times: dict[str, list[float]] = {"before": [], "after": []}
    expected = decode(OldClient, msgs)[1]._services
    for _ in range(rounds):
        for name, cls in (("before", OldClient), ("after", NodeStateClient)):
            seconds, client = decode(cls, msgs)
            assert client.mismatches == 0 and len(client._services) == services, name
            assert client._services == expected, name
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
