"""The frontend's Prometheus metrics.

Every counter is made with ``counter``: what a stream worker counts of it is shipped to
the main process (serving/shipping.py), whose /metrics therefore covers every process.
"""

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from svcproxy.frontend.runtime.loophistogram import LoopHistogram

# The frontend's counters by name, for the stream workers' counts to find them.
COUNTERS: dict[str, Counter] = {}


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    """A counter of the frontend's, stream workers' counts included."""
    COUNTERS[name] = Counter(name, documentation, labels)
    return COUNTERS[name]


WATCH_EVENTS = counter("svcproxy_frontend_source_events_total",
                       "Events received from the sources, by type (upsert, delete, replace).",
                       ["type"])
REJECTED_OBJECTS = counter(
    "svcproxy_frontend_rejected_objects_total",
    "Objects (and manifest files, kind File) refused at the edge, by source (apiserver, "
    "manifests, upstream), kind and reason (invalid_name, invalid_port, forbidden_ip, "
    "too_large, internal_error, ...); an object's last valid version stays served.",
    ["source", "kind", "reason"])
DEGRADED_FIELDS = counter(
    "svcproxy_frontend_degraded_fields_total",
    "Fields of objects Kubernetes accepts that svcproxy cannot use as they are (an "
    "EndpointSlice port out of 1-65535, ...), each degraded alone as docs/edge-fields.md "
    "says (the object stays served), by kind and field.",
    ["kind", "field"])
REFUSED_PORTS = counter(
    "svcproxy_frontend_refused_service_ports_total",
    "Service ports refused because an earlier Service (by creationTimestamp, then "
    "namespace/name) holds the same ClusterIP:port/protocol or nodePort/protocol, as the "
    "apiserver's allocators would have refused them, by claim (cluster_ip, node_port).",
    ["claim"])
SERVICE_ERRORS = counter("svcproxy_frontend_service_errors_total",
                         "Unexpected errors computing one service's records; the service "
                         "keeps its previous records, every other service goes on.")
REVISION = Gauge("svcproxy_frontend_revision", "The latest revision of the node views.")
CLIENTS = Gauge("svcproxy_frontend_watch_clients",
                "Connected Watch and WatchCluster streams, stream workers' included.")
CLIENT_LAG = LoopHistogram("svcproxy_frontend_client_lag_batches",
                           "How many of its node's batches a client was behind when it was "
                           "sent them (0: it was up to date; more are coalesced into one "
                           "message), stream workers' clients included.",
                           buckets=(0, 1, 2, 5, 10, 50, 100, 1000, 10000))
SNAPSHOT_BYTES = Histogram("svcproxy_frontend_snapshot_bytes", "Size of snapshots sent.",
                           buckets=(1e3, 1e4, 1e5, 1e6, 1e7, 1e8))
BATCH_OPS = Histogram("svcproxy_frontend_batch_ops", "Ops per published node batch.",
                      buckets=(1, 2, 5, 10, 100, 1000, 10000, 100000))
RESETS = counter("svcproxy_frontend_watch_resets_total",
                 "Watch streams that had to start over with a snapshot (history gone).")
VIEWS_REFUSED = counter("svcproxy_frontend_views_refused_total",
                        "Watch streams refused with RESOURCE_EXHAUSTED because a view for "
                        "their name would be past --max-views (every view watched or of "
                        "a Node).")
