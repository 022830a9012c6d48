"""The intake's refusal log lines, captured for a test."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from svcproxy.frontend.intake import intake


@contextmanager
def refusals_logged() -> Iterator[list[str]]:
    """The messages the intake logs at ERROR (its refusals) while the block runs."""
    lines: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    intake.log.addHandler(handler)
    try:
        yield lines
    finally:
        intake.log.removeHandler(handler)
