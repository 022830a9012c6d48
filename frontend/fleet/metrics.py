"""The fleet's metrics (served by the frontend's /metrics)."""

from prometheus_client import Gauge, Histogram

from svcproxy.frontend.runtime.metrics import counter

# kubeproxy_network_programming_duration_seconds' buckets (svcproxy/sdk/metrics.py), so
# the cluster-wide and the per-node latency compare bucket by bucket; not imported from
# there: the agent's modules bring the SDK's package, which the frontend never loads.
NETWORK_PROGRAMMING_BUCKETS = (
    (0.0, 0.25, 0.5)
    + tuple(float(s) for s in range(1, 60))
    + tuple(float(s) for s in range(60, 120, 5))
    + tuple(float(s) for s in range(120, 301, 30))
)

NODES = Gauge("svcproxy_frontend_fleet_nodes",
              "Nodes by fleet state (UNKNOWN, APPLIED, SYNCING, LAGGING, DISAGREEING, "
              "DISCONNECTED; see FleetNodeState in the proto).", ["state"])
LAGGING = Gauge("svcproxy_frontend_fleet_lagging_nodes",
                "Connected nodes behind the revision they are served for more than "
                "--lag-warning.")
REFUSING = Gauge("svcproxy_frontend_fleet_refusing_nodes",
                 "Nodes whose backend reports a service port of this Service refused, by "
                 "namespace and service.", ["namespace", "service"])
REPORTS = counter("svcproxy_frontend_fleet_reports_total",
                  "Reports from nodes, by result: accepted, invalid, other_epoch, "
                  "rate_limited, too_many_nodes.", ["result"])
CLUSTER_LATENCY = Histogram(
    "svcproxy_frontend_cluster_programming_latency_seconds",
    "From an EndpointSlice change's trigger time until every connected node reporting to "
    "this frontend that is served the change has applied it (the cluster-wide "
    "kubeproxy_network_programming_duration_seconds).",
    buckets=NETWORK_PROGRAMMING_BUCKETS)
