"""What bench_packet_path.py prints (pure): each figure's median and spread over the rounds,
and its ratio to a reference dataplane's figure of the same round."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of some values, and their lowest and highest."""

    median: float
    low: float
    high: float

    def show(self, digits: int = 0) -> str:
        """``median [low, high]``, thousands separated."""
        return f"{self.median:,.{digits}f} [{self.low:,.{digits}f}, {self.high:,.{digits}f}]"


def spread(values: Sequence[float]) -> Spread:
    """Median, lowest and highest of ``values`` (at least one)."""
    if not values:
        raise ValueError("no values: at least one round is needed")
    return Spread(statistics.median(values), min(values), max(values))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` in [0, 1]) of ``values``."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def paired_ratios(rounds: Mapping[str, Sequence[float]], reference: str) -> dict[str, Spread]:
    """Per dataplane, the spread of its figure divided by ``reference``'s figure of the same
    round (rounds are interleaved, so a load change divides out)."""
    base = rounds[reference]
    out = {}
    for name, values in rounds.items():
        if len(values) != len(base):
            raise ValueError(f"{name} has {len(values)} rounds, {reference} {len(base)}")
        out[name] = spread([v / b for v, b in zip(values, base, strict=True) if b])
    return out


def paired_differences(rounds: Mapping[str, Sequence[float]],
                       floor: str) -> dict[str, Spread]:
    """Per dataplane, the spread of its figure minus ``floor``'s figure of the same round:
    its own cost, the common part of the path taken out."""
    base = rounds[floor]
    out = {}
    for name, values in rounds.items():
        if len(values) != len(base):
            raise ValueError(f"{name} has {len(values)} rounds, {floor} {len(base)}")
        out[name] = spread([v - b for v, b in zip(values, base, strict=True)])
    return out


def rotated(names: Sequence[str], round_: int) -> list[str]:
    """``names`` starting at round ``round_``'s turn (A B C D, B C D A, ...), so none is
    always first after a pause."""
    if not names:
        return []
    k = round_ % len(names)
    return [*names[k:], *names[:k]]
