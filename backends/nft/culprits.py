"""Which service ports an nft error points at, so they are tried without first; and
which foreign rule keeps the kernel from deleting one of our chains.

nft names the input line and columns of what the kernel refused
(``/dev/stdin:6:38-44: Error: Could not process rule: File exists``): an element of
an ``add element`` line, or a line inside a chain or set. The owners of that element,
chain or set are the suspects; bisection remains the fallback when nothing is named.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterable, Mapping

from svcproxy.sdk import ServicePortKey

from .kernel_view import TableView
from .render import ServiceObjects

_LOCATION = re.compile(r":(\d+):(\d+)-\d+: Error")
_ELEMENTS = re.compile(r"(?:add|delete) element \S+ \S+ (\S+) \{ (.*) \}")
_BLOCK = re.compile(r"\s*(?:chain|set|map) (\S+) \{")
_COMMAND = re.compile(r"(?:add|flush|delete) (?:chain|set|map) \S+ \S+ (\S+)")

Rules = Iterable[Mapping[ServicePortKey, ServiceObjects]]


def named_in_error(text: str, error: str, rules: Rules) -> list[ServicePortKey]:
    """The service ports owning what the error's locations point at, in order."""
    lines = text.splitlines()
    found: dict[ServicePortKey, None] = {}
    for match in _LOCATION.finditer(error):
        index, column = int(match[1]) - 1, int(match[2]) - 1
        if 0 <= index < len(lines):
            found.update(dict.fromkeys(_owners(lines, index, column, rules)))
    return list(found)


def _owners(lines: list[str], index: int, column: int, rules: Rules) -> list[ServicePortKey]:
    line = lines[index]
    elements = _ELEMENTS.fullmatch(line)
    if elements is not None:
        key = _element_at(elements, column)
        container = elements[1]
        return [k for per_family in rules for k, r in per_family.items()
                if any(c == container and e == key for c, e, _ in r.elements)]
    name = _object_named(lines, index)
    return [k for per_family in rules for k, r in per_family.items()
            if name in r.chains or name in r.sets] if name else []


def _element_at(match: re.Match[str], column: int) -> str:
    """The key of the element of an ``add element`` line that ``column`` falls in."""
    position = match.start(2)
    for item in match[2].split(", "):
        if column < position + len(item) + 2:
            return item.split(" : ")[0]
        position += len(item) + 2
    return ""


def _object_named(lines: list[str], index: int) -> str:
    """The chain or set a line declares or sits in ("" if none)."""
    command = _COMMAND.match(lines[index])
    if command is not None:
        return command[1]
    for i in range(index, -1, -1):
        block = _BLOCK.match(lines[i])
        if block is not None:
            return block[1]
        if lines[i].startswith("table ") or (i < index and lines[i].strip() == "}"):
            break
    return ""


def foreign_jumps(view: TableView, ours: Collection[str], target: str) -> list[str]:
    """The rules of chains not ``ours`` that jump or go to ``target`` (the kernel refuses
    to delete a chain in use: EBUSY), as ``chain NAME (rule handle H)``. Read from the
    rules' expression bytes: a verdict naming ``target`` holds it NUL-terminated."""
    needle = _verdict_chain(target)
    return [f"chain {name} (rule handle {handle})"
            for name, chain in view.chains.items() if name not in ours
            for handle, exprs in chain.expressions if needle in exprs]


def _verdict_chain(name: str) -> bytes:
    """NFTA_VERDICT_CHAIN as the kernel dumps it (header, name, NUL)."""
    raw = name.encode() + b"\0"
    return struct.pack("=HH", 4 + len(raw), 2) + raw
