"""The fleet's metrics (served by the frontend's /metrics)."""

from prometheus_client import Gauge, Histogram

from svcproxy.agent.metrics import NETWORK_PROGRAMMING_BUCKETS
from svcproxy.frontend.metrics import counter

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
