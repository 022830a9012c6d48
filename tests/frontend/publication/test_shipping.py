"""A stream worker's counts reach the main process's /metrics: every frontend counter is
shipped, and a shipment adds exactly what was counted since the last one."""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter

import svcproxy.frontend.main  # noqa: F401 - every frontend module, so every metric
from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.serving import limits, shipping
from svcproxy.frontend.serving.access import auth_metrics


def test_every_frontend_counter_is_shipped() -> None:
    made = {name for name, collector in REGISTRY._names_to_collectors.items()
            if isinstance(collector, Counter) and name.startswith("svcproxy_frontend_")
            and name.endswith("_total")}
    assert made, "no frontend counter found"
    assert made <= set(metrics.COUNTERS), (
        f"make these with metrics.counter so stream workers ship them: "
        f"{sorted(made - set(metrics.COUNTERS))}")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_shipment_is_what_was_counted_since_the_last() -> None:
    tally = shipping.Tally()
    tally.take()
    limits.STALLED.inc()
    auth_metrics.TOKEN_REVIEWS.labels("cached").inc(2)
    shipment = tally.take()
    assert shipment is not None
    assert shipment.counters == {
        ("svcproxy_frontend_watch_stalled_total", ()): 1.0,
        ("svcproxy_frontend_token_reviews_total", (("result", "cached"),)): 2.0}
    assert tally.take() is None  # nothing new

    before = (value("svcproxy_frontend_watch_stalled_total"),
              value("svcproxy_frontend_token_reviews_total", result="cached"))
    shipping.receive(shipment)
    assert (value("svcproxy_frontend_watch_stalled_total"),
            value("svcproxy_frontend_token_reviews_total", result="cached")) == (
        before[0] + 1, before[1] + 2)


def test_a_shipment_carries_the_client_lag() -> None:
    tally = shipping.Tally()
    tally.take()
    metrics.CLIENT_LAG.observe(3)
    shipment = tally.take()
    assert shipment is not None and shipment.lag is not None
    before = value("svcproxy_frontend_client_lag_batches_count")
    shipping.receive(shipment)
    assert value("svcproxy_frontend_client_lag_batches_count") == before + 1
