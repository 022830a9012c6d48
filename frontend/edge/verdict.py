"""A validator's verdict on one object: its problems (errors refuse the object,
warnings are values ignored), and values quoted shortened in their messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_PROBLEMS = 5


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason to refuse (or a value to ignore): the field, a metric reason, a message."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(slots=True)
class Verdict:
    """Errors refuse the object; warnings are values ignored (logged) as kube-proxy does."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, where: str, reason: str, message: str) -> None:
        self.errors.append(Problem(where, reason, message))

    def summary(self) -> str:
        listed = "; ".join(str(p) for p in self.errors[:MAX_PROBLEMS])
        more = len(self.errors) - MAX_PROBLEMS
        return listed + (f" (and {more} more)" if more > 0 else "")


def shown(value: Any) -> str:
    """``value`` as a message quotes it: its repr, shortened to 80 characters."""
    return shortened(repr(value))


def shortened(text: str) -> str:
    """``text``, or when longer than 80 characters its first 77 and "...": every value or
    name a message or log line quotes, however long what a client sent."""
    return text if len(text) <= 80 else text[:77] + "..."
