"""Exponential backoff for reconnecting to the apiserver (client-go's reflector defaults)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """Delays start at ``initial`` seconds and grow by ``factor`` up to ``cap``.

    ``jitter`` spreads each delay by up to that fraction either way, so that many
    frontends do not hammer a recovering apiserver in lockstep.
    """

    initial: float = 0.8
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1


class Backoff:
    """The delay before the next retry; grows on each failure, resets on success."""

    def __init__(self, policy: BackoffPolicy, rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._rand = rand
        self._failures = 0

    def next_delay(self) -> float:
        """Record a failure and return how long to wait before retrying."""
        p = self.policy
        base = min(p.cap, p.initial * p.factor**self._failures)
        self._failures += 1
        spread = 1.0 + p.jitter * (2.0 * self._rand() - 1.0)
        return min(p.cap, base * spread)

    def reset(self) -> None:
        """Forget past failures (after a success)."""
        self._failures = 0
