"""A Prometheus histogram for values observed on the event loop, once per message.

prometheus_client's Histogram takes a lock per bucket and per sum on every observe,
a few percent of the fan-out's CPU when it runs once per client and batch. Here an
observation is two plain increments (one event loop per process observes), the
scrape thread reads a copy, and stream workers' counts are added in (``add``) so the
main process's /metrics covers every process.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from prometheus_client.utils import floatToGoString

Counts = tuple[list[int], float]


class LoopHistogram(Collector):
    """Per-bucket counts and a sum, exported as a histogram named ``name``."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        REGISTRY.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def take(self) -> Counts | None:
        """What was observed since the last take (None: nothing), and start over."""
        if not any(self.counts):
            return None
        out = (self.counts, self.sum)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        return out

    def add(self, counts: Counts) -> None:
        """Add another process's ``take``."""
        per_bucket, total = counts
        self.counts = [a + b for a, b in zip(self.counts, per_bucket, strict=True)]
        self.sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total = list(self.counts), self.sum
        buckets, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            running += count
            buckets.append((floatToGoString(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets,
                                    sum_value=total)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)
