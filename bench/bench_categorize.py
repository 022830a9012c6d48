"""Cost of the frontend's categorisation (kube-proxy's CategorizeEndpoints) per change.

At 10,000 services x 10 endpoints spread over 100 nodes in 3 zones: one service change
costs the node-independent part (``service_base``) and one ``node_records`` per node class
(nodes hosting an endpoint, then one per zone), each a ``categorize_by_family`` call that
marks internal/external/cluster/local on every endpoint. Prints microseconds per change
(median and p99 over every service of the set) and the categorisation alone per call.

Usage: .venv/bin/python bench/bench_categorize.py [--services N] [--endpoints N] [--nodes N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from svcproxy.frontend.computation.compute import NodeClassCache, service_base  # noqa: E402
from svcproxy.frontend.computation.selection import categorize, categorize_by_family  # noqa: E402
from svcproxy.frontend.edge.endpointslice import read_endpoint_slice  # noqa: E402
from svcproxy.frontend.edge.objects import EndpointSlice, Service  # noqa: E402
from svcproxy.frontend.edge.service import read_service  # noqa: E402


def objects(i: int, endpoints: int, nodes: int) -> tuple[Service, list[EndpointSlice]]:
    """Service ``i`` (NodePort, eTP Local every 4th) and its slice, as the apiserver has them."""
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"namespace": "bench", "name": f"svc{i}"},
           "spec": {"type": "NodePort", "clusterIP": f"10.96.{i // 250}.{i % 250 + 1}",
                    "clusterIPs": [f"10.96.{i // 250}.{i % 250 + 1}"],
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080,
                               "nodePort": 30000 + i % 2000, "protocol": "TCP"}],
                    "externalTrafficPolicy": "Local" if i % 4 == 0 else "Cluster"}}
    eps = []
    for j in range(endpoints):
        n = i * endpoints + j
        eps.append({"addresses": [f"10.{n // 65536 % 200}.{n // 256 % 256}.{n % 256}"],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "nodeName": f"node{(i + j) % nodes}", "zone": f"zone{j % 3}"})
    sl = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
          "metadata": {"namespace": "bench", "name": f"svc{i}-1",
                       "labels": {"kubernetes.io/service-name": f"svc{i}"}},
          "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
          "endpoints": eps}
    service, verdict = read_service(svc)
    assert service is not None, verdict.summary()
    slice_, verdict = read_endpoint_slice(sl)
    assert slice_ is not None, verdict.summary()
    return service, [slice_]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    args = parser.parse_args()
    nodes = [(f"node{n}", f"zone{n % 3}") for n in range(args.nodes)]
    built = [objects(i, args.endpoints, args.nodes) for i in range(args.services)]
    per_change: list[float] = []
    per_call: list[float] = []
    one_pass: list[float] = []
    gc.collect()
    gc.freeze()
    for svc, slices in built:
        start = time.perf_counter()
        cache = NodeClassCache(service_base(svc, slices))
        for name, zone in nodes:
            cache.records(name, zone)
        per_change.append(time.perf_counter() - start)
        port = cache.base.ports[0]
        start = time.perf_counter()
        categorize_by_family(port.service, port.endpoints, "node0", "zone0")
        per_call.append(time.perf_counter() - start)
        start = time.perf_counter()
        categorize(port.service, port.endpoints, "node0", "zone0")
        one_pass.append(time.perf_counter() - start)
    q = statistics.quantiles(per_change, n=100)
    print(f"== {args.services} services x {args.endpoints} endpoints, {args.nodes} nodes, "
          "3 zones (one in 4 eTP Local)")
    print(f"   one service change, base + records for every node class: median "
          f"{statistics.median(per_change) * 1e6:.0f} us, p99 {q[98] * 1e6:.0f} us")
    print(f"   categorize_by_family alone, one node: median "
          f"{statistics.median(per_call) * 1e6:.1f} us (one pass over both families: "
          f"{statistics.median(one_pass) * 1e6:.1f} us)")
    print(f"   every service once (a full recompute): {sum(per_change):.2f} s")


if __name__ == "__main__":
    main()
