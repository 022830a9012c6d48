"""The frontend's metrics about callers and readiness (a stream worker ships its
refusals to the main process, which serves /metrics)."""

from collections import Counter as Tally

from prometheus_client import Counter, Gauge

REFUSALS = Counter("svcproxy_frontend_api_refusals_total",
                   "Calls refused, by gRPC status (UNAUTHENTICATED, PERMISSION_DENIED) and "
                   "method, stream workers' included.", ["code", "method"])
_unshipped: Tally[tuple[str, str]] = Tally()


def refused(code: str, method: str) -> None:
    """Count a refusal (and remember it for the main process, in a stream worker)."""
    REFUSALS.labels(code, method).inc()
    _unshipped[code, method] += 1


def take_refusals() -> dict[tuple[str, str], int]:
    """The refusals counted since the last take (a stream worker ships them)."""
    out = dict(_unshipped)
    _unshipped.clear()
    return out


def add_refusals(counts: dict[tuple[str, str], int]) -> None:
    """A stream worker's refusals, counted in this (the main) process."""
    for (code, method), n in counts.items():
        REFUSALS.labels(code, method).inc(n)
TOKEN_REVIEWS = Counter("svcproxy_frontend_token_reviews_total",
                        "Bearer tokens checked, by result: authenticated, refused (by the "
                        "apiserver), error (the review failed) or cached (no review).",
                        ["result"])
READY = Gauge("svcproxy_frontend_ready",
              "1 once every source has listed everything (the frontend serves), else 0.")
APISERVER_LOST = Gauge("svcproxy_frontend_apiserver_lost_seconds",
                       "How long the source has been failing to reach the apiserver "
                       "(0 while it is reachable); the last known state is still served.")
