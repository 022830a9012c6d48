"""What one object may cost before it is read: size (YAML aliases expanded) and depth."""

from __future__ import annotations

import resource
import sys
import threading
from dataclasses import dataclass
from typing import Any

from svcproxy.frontend.edge.verdict import Problem

# The deepest nesting the apiserver decodes, and so stores: at most 10,000 nested maps
# and lists, the object itself included (sigs.k8s.io/json: encoding/json's
# maxNestingDepth; YAML through sigs.k8s.io/yaml, go-yaml's max depth), that is 9,999
# levels below the object. Fields svcproxy does not read may go that deep.
KUBERNETES_MAX_DEPTH = 9_999
# Python's json and msgspec count one recursion per level (the limit is 1,000 by
# default); the frames below the decoder need the rest. About 0.5 KiB of C stack a
# level: 11,000 levels fit a thread's 8 MiB.
_RECURSION_LIMIT = KUBERNETES_MAX_DEPTH + 1_000
# The C stack 9,999 levels take in json and msgspec: more than 4 MiB, at most 8. A
# thread gets 2 MiB where `ulimit -s` is unlimited (glibc's default), and segfaults.
_STACK_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ObjectLimits:
    """Bounds on what one object may cost; each has a ``svcproxy frontend`` flag."""

    max_object_bytes: int = 1_572_864  # etcd's default request limit (1.5 MiB)
    max_depth: int = KUBERNETES_MAX_DEPTH  # levels below the object
    max_name_length: int = 253  # the longest name Kubernetes allows


DEFAULT_LIMITS = ObjectLimits()


def allow_kubernetes_depth() -> None:
    """Lets the JSON decoders (json, msgspec) read any object the apiserver stores:
    Python's recursion limit raised above KUBERNETES_MAX_DEPTH levels (never lowered).
    Deeper input stops them with RecursionError, as before, at that limit."""
    if sys.getrecursionlimit() < _RECURSION_LIMIT:
        sys.setrecursionlimit(_RECURSION_LIMIT)
    _allow_deep_stacks()


def _allow_deep_stacks() -> None:
    """Room on the C stack for KUBERNETES_MAX_DEPTH levels: threads started from now on
    get _STACK_BYTES (address space; only what is used is memory), and the main thread
    may grow as far (its soft limit raised within the hard one)."""
    if threading.stack_size() < _STACK_BYTES:
        threading.stack_size(_STACK_BYTES)
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft != resource.RLIM_INFINITY and soft < _STACK_BYTES:
        room = _STACK_BYTES if hard == resource.RLIM_INFINITY else min(hard, _STACK_BYTES)
        resource.setrlimit(resource.RLIMIT_STACK, (max(soft, room), hard))


class _TooBig(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def check_size(obj: Any, limits: ObjectLimits = DEFAULT_LIMITS,
               sized: tuple[str, int] | None = None) -> Problem | None:
    """Why ``obj`` is too large or deep (expanded, as YAML aliases would be), or None.

    Each visit of a container spends its own size from one budget, so a value shared
    many times (YAML aliases) is paid for each time and the walk stops within the budget.
    ``sized``: a key of ``obj`` and a bound on its value's size (at most 3 levels deep)
    the caller found as it checked it; the walk then leaves that value out, and when the
    bound does not fit (or anything else is amiss) the whole walk says why.
    """
    try:
        if sized is not None and type(obj) is dict and limits.max_depth >= 3:
            key, size = sized
            budget = [limits.max_object_bytes - size - len(key) - 3]
            try:
                _walk({k: v for k, v in obj.items() if k != key}, 0, budget, limits)
                return None
            except (_TooBig, RecursionError):
                pass
        if isinstance(obj, dict | list):
            _walk(obj, 0, [limits.max_object_bytes], limits)
    except _TooBig as big:
        return big.problem
    except RecursionError:
        return _DEEP(limits.max_depth)
    return None


def _walk(root: dict[Any, Any] | list[Any], depth: int, budget: list[int],
          limits: ObjectLimits) -> None:
    """``check_size``'s visit of ``root`` and every container in it, each paying its own
    size from ``budget``: a loop over a stack, so any depth the limit allows is walked
    (Python's recursion stops near 1,000 levels)."""
    stack: list[tuple[Any, int]] = [(root, depth)]
    while stack:
        value, level = stack.pop()
        if level > limits.max_depth:
            raise _TooBig(_DEEP(limits.max_depth))
        spent = 2
        if type(value) is dict:
            try:
                spent += sum(map(len, value)) + 3 * len(value)
            except TypeError:  # a key that is not text (YAML allows numbers...)
                spent += sum(len(k) + 3 if type(k) is str else 8 for k in value)
            children: Any = value.values()
        else:
            children = value
        for child in children:
            kind = type(child)
            if kind is str:
                spent += len(child) + 2
            elif kind is dict or kind is list or isinstance(child, dict | list):
                stack.append((child, level + 1))
            else:
                spent += len(child) if isinstance(child, bytes) else 8
        budget[0] -= spent
        if budget[0] < 0:
            raise _TooBig(Problem("", "too_large", f"larger than {limits.max_object_bytes} "
                                  "bytes once expanded (--max-object-bytes; YAML aliases "
                                  "count each time they are used)"))


def _DEEP(max_depth: int) -> Problem:  # noqa: N802 - reads as the constant problem it is
    return Problem("", "too_deep", deep_message(max_depth))


def deep_message(max_depth: int) -> str:
    """Why an object nested deeper than ``max_depth`` levels is refused."""
    past = " (the apiserver refuses it too)" if max_depth >= KUBERNETES_MAX_DEPTH else ""
    return (f"nested deeper than {max_depth} levels below the object{past} "
            "(--max-object-depth)")
