"""The frontend's metrics about callers and readiness (a stream worker's counts are
shipped to the main process, which serves /metrics)."""

from prometheus_client import Gauge

from svcproxy.frontend.runtime.metrics import counter

REFUSALS = counter("svcproxy_frontend_api_refusals_total",
                   "Calls refused, by gRPC status (UNAUTHENTICATED, PERMISSION_DENIED) and "
                   "method, stream workers' included.", ["code", "method"])
TOKEN_REVIEWS = counter("svcproxy_frontend_token_reviews_total",
                        "Bearer tokens checked, by result: authenticated, refused (by the "
                        "apiserver), error (the review failed) or cached (no review), "
                        "stream workers' included.", ["result"])
READY = Gauge("svcproxy_frontend_ready",
              "1 once every source has listed everything (the frontend serves), else 0.")
APISERVER_LOST = Gauge("svcproxy_frontend_apiserver_lost_seconds",
                       "How long the source has been failing to reach the apiserver "
                       "(0 while it is reachable); the last known state is still served.")
