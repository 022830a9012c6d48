"""The frontend's metrics about callers and readiness (counted in the process that saw
them: a stream worker's refusals are logged there, not shipped to the main /metrics)."""

from prometheus_client import Counter, Gauge

REFUSALS = Counter("svcproxy_frontend_api_refusals_total",
                   "Calls refused, by gRPC status (UNAUTHENTICATED, PERMISSION_DENIED) and "
                   "method.", ["code", "method"])
TOKEN_REVIEWS = Counter("svcproxy_frontend_token_reviews_total",
                        "Bearer tokens checked, by result: authenticated, refused (by the "
                        "apiserver), error (the review failed) or cached (no review).",
                        ["result"])
READY = Gauge("svcproxy_frontend_ready",
              "1 once every source has listed everything (the frontend serves), else 0.")
APISERVER_LOST = Gauge("svcproxy_frontend_apiserver_lost_seconds",
                       "How long the source has been failing to reach the apiserver "
                       "(0 while it is reachable); the last known state is still served.")
