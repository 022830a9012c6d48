"""What a stream worker counted, shipped to the main process, which serves /metrics.

Every counter of the frontend's (``metrics.COUNTERS``) and the client lag histogram:
a worker takes what was counted since its last shipment (``Tally.take``), the main
process adds it to its own (``receive``), so one scrape covers every process.
"""

from __future__ import annotations

from dataclasses import dataclass

from svcproxy.frontend.runtime import metrics
from svcproxy.frontend.runtime.loophistogram import Counts

# (counter name, its sample's labels) -> a count.
Counted = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True, slots=True)
class Shipment:
    counters: Counted
    lag: Counts | None


def counted() -> Counted:
    """Every frontend counter's value in this process, by name and labels."""
    out: Counted = {}
    for name, counter in metrics.COUNTERS.items():
        for family in counter.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


class Tally:
    """A worker's side: what was counted since the last take."""

    def __init__(self) -> None:
        self._shipped: Counted = {}

    def take(self) -> Shipment | None:
        """The counts since the last take (None: nothing new)."""
        now = counted()
        counters = {key: value - self._shipped.get(key, 0.0) for key, value in now.items()
                    if value > self._shipped.get(key, 0.0)}
        self._shipped = now
        lag = metrics.CLIENT_LAG.take()
        return Shipment(counters, lag) if counters or lag is not None else None


def receive(shipment: Shipment) -> None:
    """Add a worker's shipment to this (the main) process's metrics."""
    for (name, labels), value in shipment.counters.items():
        counter = metrics.COUNTERS[name]
        (counter.labels(**dict(labels)) if labels else counter).inc(value)
    if shipment.lag is not None:
        metrics.CLIENT_LAG.add(shipment.lag)
