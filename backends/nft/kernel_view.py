"""What the kernel holds in one of our tables, read over nfnetlink (no ``nft`` process).

``nft list table`` parses and prints every rule and element: 37 s for a table of
10,000 services x 10 endpoints on this project's 2-core machine. The drift check only
needs each chain's rule count and expression bytes, the set names, and the elements of
the sets and maps we fill, so it dumps them with NFT_MSG_GETCHAIN / GETRULE / GETSET /
GETSETELEM and decodes elements into the text the renderer writes (``10.96.0.1 . tcp .
80`` -> ``goto lb-1``) with the layouts of our own containers.

The socket is opened in the namespace a command prefix runs in (``ip netns exec NAME``,
tests and benchmarks): a short-lived thread enters it (setns changes only the calling
thread's namespace) and the socket stays bound to it.
"""

from __future__ import annotations

import errno
import hashlib
import socket
import struct
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from svcproxy.sdk import netlink

GETCHAIN, GETRULE = netlink.NFT_MSG_GETCHAIN, netlink.NFT_MSG_GETRULE
GETSET, GETSETELEM = netlink.NFT_MSG_GETSET, netlink.NFT_MSG_GETSETELEM
_GENMSG = netlink.NFGENMSG
_FAMILY = {"ip": socket.AF_INET, "ip6": socket.AF_INET6}
# Attribute numbers (linux/netfilter/nf_tables.h).
CHAIN_TABLE, CHAIN_NAME, CHAIN_HOOK, CHAIN_POLICY = 1, 3, 4, 5
RULE_TABLE, RULE_CHAIN, RULE_HANDLE, RULE_EXPRESSIONS = 1, 2, 3, 4
SET_TABLE, SET_NAME = 1, 2
ELEM_LIST_TABLE, ELEM_LIST_SET, ELEM_LIST_ELEMENTS = 1, 2, 3
LIST_ELEM = 1
ELEM_KEY, ELEM_DATA = 1, 2
DATA_VALUE, DATA_VERDICT = 1, 2
VERDICT_CODE, VERDICT_CHAIN = 1, 2
_VERDICTS = {0: "drop", 1: "accept", -1: "continue", -3: "jump", -4: "goto", -5: "return"}
_PROTOCOLS = {6: "tcp", 17: "udp", 132: "sctp"}

# A field of a concatenated key or value: address, protocol, port, or a 32-bit integer.
ADDR, PROTO, PORT, U32 = "addr", "proto", "port", "u32"
Layout = tuple[str, ...]


class KernelReadError(OSError):
    """The table could not be read (not ours to fix: the check is skipped)."""


@dataclass(slots=True)
class ChainView:
    """One chain as the kernel holds it."""

    rules: int = 0
    digest: bytes = b""  # of its rules' expressions, in order
    policy: int | None = None  # base chains: NF_ACCEPT (1) or NF_DROP (0)
    # Rules' expression bytes, kept only when asked (to find who jumps where).
    expressions: list[tuple[int, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class TableView:
    """Our table in one family: chains, set names, and the elements of the sets read."""

    chains: dict[str, ChainView] = field(default_factory=dict)
    sets: set[str] = field(default_factory=set)
    # set -> key bytes -> value bytes, verdict text or b""
    elements: dict[str, dict[bytes, bytes | str]] = field(default_factory=dict)


def netns_path(prefix: Sequence[str]) -> str | None:
    """The namespace a command prefix runs in (``ip netns exec NAME``), None: ours."""
    return netlink.netns_path(prefix)


class TableReader:
    """Reads one namespace's tables (``netns``: its path, None: ours); one socket."""

    def __init__(self, netns: str | None = None) -> None:
        self._kernel = netlink.NftablesReader(netns)
        self._lock = threading.Lock()

    def read(self, family: str, table: str, sets: Collection[str] = (),
             expressions: bool = False) -> TableView | None:
        """The table (None: it does not exist), with the elements of ``sets`` (those that
        exist); ``expressions``: keep every rule's expression bytes."""
        with self._lock:
            try:
                return self._read(_FAMILY[family], table, sets, expressions)
            except OSError as err:
                if err.errno == errno.ENOENT:
                    return None
                raise KernelReadError(err.errno or errno.EIO,
                                      f"cannot read {family} {table}: {err}") from err

    def chains(self, family: str, table: str, names: Iterable[str]) -> dict[str, ChainView]:
        """The chains of ``names`` that exist (their rule counts and digests), one rule
        dump each: what a write just wrote, read back at once (a dump of the whole
        table costs the kernel the square of its rules)."""
        with self._lock:
            try:
                return self._chains(_FAMILY[family], table.encode() + b"\0", names)
            except OSError as err:
                raise KernelReadError(err.errno or errno.EIO,
                                      f"cannot read {family} {table}: {err}") from err

    def generation(self) -> int:
        """The ruleset's generation (every committed transaction adds one)."""
        with self._lock:
            try:
                return self._kernel.generation()
            except OSError as err:
                raise KernelReadError(err.errno or errno.EIO,
                                      f"cannot read the ruleset's generation: {err}") from err

    def _read(self, family: int, table: str, sets: Collection[str],
              expressions: bool) -> TableView:
        view = TableView()
        name = table.encode() + b"\0"
        for body in self._dump(GETCHAIN, family, netlink.attr(CHAIN_TABLE, name)):
            found = netlink.attrs(body, _GENMSG.size)
            if found.get(CHAIN_TABLE) != name:
                continue
            chain = ChainView()
            policy = found.get(CHAIN_POLICY)
            if CHAIN_HOOK in found and policy is not None:
                chain.policy = struct.unpack(">I", policy)[0]
            view.chains[_text(found[CHAIN_NAME])] = chain
        _digests_into(view.chains, self._dump(GETRULE, family, netlink.attr(RULE_TABLE, name)),
                      expressions)
        for body in self._dump(GETSET, family, netlink.attr(SET_TABLE, name)):
            found = netlink.attrs(body, _GENMSG.size)
            if found.get(SET_TABLE) == name:
                view.sets.add(_text(found[SET_NAME]))
        for set_name in sets:
            if set_name in view.sets:
                view.elements[set_name] = self._elements(family, name, set_name)
        return view

    def _chains(self, family: int, table: bytes, names: Iterable[str]) -> dict[str, ChainView]:
        out: dict[str, ChainView] = {}
        for chain in names:
            raw = chain.encode() + b"\0"
            found: dict[str, ChainView] = {}
            try:
                _digests_into(found, self._dump(GETRULE, family, netlink.attr(
                    RULE_TABLE, table) + netlink.attr(RULE_CHAIN, raw)), False)
                if not found:  # no rule: an empty chain, or none
                    list(self._kernel.spans(GETCHAIN, family, netlink.attr(
                        CHAIN_TABLE, table) + netlink.attr(CHAIN_NAME, raw), dump=False))
            except OSError as err:
                if err.errno == errno.ENOENT:
                    continue
                raise
            out[chain] = found.get(chain) or ChainView()  # as read() shows an empty one
        return out

    def _elements(self, family: int, table: bytes, set_name: str) -> dict[bytes, bytes | str]:
        """The elements of one set: key bytes -> value bytes (a map's data), the verdict's
        text (a verdict map's: ``goto lb-1``), or b"" (a set)."""
        request = netlink.attr(ELEM_LIST_TABLE, table) + netlink.attr(
            ELEM_LIST_SET, set_name.encode() + b"\0")
        out: dict[bytes, bytes | str] = {}
        unpack = netlink.ATTR_HEADER.unpack_from
        for body in self._dump(GETSETELEM, family, request):
            for kind, a, b in netlink.attr_spans(body, _GENMSG.size):
                if kind == ELEM_LIST_ELEMENTS:
                    _elements_into(out, body, a, b, unpack)
        return out

    def _dump(self, msg: int, family: int, payload: bytes) -> Iterator[bytes]:
        """The bodies of every message answering one dump request."""
        return self._kernel.bodies(msg, family, payload)

    def close(self) -> None:
        self._kernel.close()


def _digests_into(chains: dict[str, ChainView], bodies: Iterable[bytes], keep: bool) -> None:
    """Each chain's rule count and digest (and, with ``keep``, expressions) from a rule
    dump. The digest is over the rule messages less their nfgenmsg (its generation
    changes with every transaction): expressions, handle and position."""
    parts: dict[bytes, list[bytes]] = {}
    unpack = netlink.ATTR_HEADER.unpack_from
    start = _GENMSG.size
    for body in bodies:
        # The kernel writes NFTA_RULE_TABLE, then NFTA_RULE_CHAIN, first.
        length, _ = unpack(body, start)
        at = start + ((length + 3) & ~3)
        length, kind = unpack(body, at)
        if kind & netlink.NLA_TYPE_MASK != RULE_CHAIN:
            continue
        chain = body[at + 4:at + length]
        found = parts.get(chain)
        if found is None:
            found = parts[chain] = []
        found.append(body[start:])
    for raw, rules in parts.items():
        name = _text(raw)
        chain_view = chains.get(name)
        if chain_view is None:
            chain_view = chains[name] = ChainView()
        chain_view.rules = len(rules)
        chain_view.digest = _digest(rules)
        if keep:
            chain_view.expressions = [_expressions(rule) for rule in rules]


def _digest(rules: list[bytes]) -> bytes:
    lengths = struct.pack(f"={len(rules)}I", *map(len, rules))
    return hashlib.blake2b(lengths + b"".join(rules), digest_size=16).digest()


def _elements_into(out: dict[bytes, bytes | str], body: bytes, start: int, end: int,
                   unpack: Callable[[bytes, int], tuple[int, int]]) -> None:
    """Decode NFTA_SET_ELEM_LIST_ELEMENTS: key bytes -> data bytes, verdict text or b"".
    A loop over offsets (attr_spans' generators cost 3x as much at 200,000 elements)."""
    mask = netlink.NLA_TYPE_MASK
    at = start
    while at + 4 <= end:
        length, _ = unpack(body, at)  # NFTA_LIST_ELEM
        if length < 4:
            return
        stop = at + length
        inner = at + 4
        key: bytes | None = None
        value: bytes | str = b""
        while inner + 4 <= stop:
            size, kind = unpack(body, inner)
            if size < 4:
                break
            kind &= mask
            if kind == ELEM_KEY:  # NFTA_DATA_VALUE inside
                value_size, _ = unpack(body, inner + 4)
                key = body[inner + 8:inner + 4 + value_size]
            elif kind == ELEM_DATA:
                data_size, data_kind = unpack(body, inner + 4)
                if data_kind & mask == DATA_VALUE:
                    value = body[inner + 8:inner + 4 + data_size]
                else:
                    value = _verdict(body, inner + 8, inner + 4 + data_size)
            inner += (size + 3) & ~3
        if key is not None:
            out[key] = value
        at += (length + 3) & ~3


def _expressions(rule: bytes) -> tuple[int, bytes]:
    """(handle, expression bytes) of one rule's attributes."""
    handle, exprs = 0, b""
    for kind, a, b in netlink.attr_spans(rule):
        if kind == RULE_HANDLE:
            handle = int.from_bytes(rule[a:b], "big")
        elif kind == RULE_EXPRESSIONS:
            exprs = rule[a:b]
    return handle, exprs


def _verdict(body: bytes, start: int, end: int) -> str:
    code, chain = 0, ""
    for kind, a, b in netlink.attr_spans(body, start, end):
        if kind == VERDICT_CODE:
            code = struct.unpack(">i", body[a:b])[0]
        elif kind == VERDICT_CHAIN:
            chain = _text(body[a:b])
    word = _VERDICTS.get(code, str(code))
    return f"{word} {chain}" if chain else word


Encoder = Callable[[str], bytes]
_NUMBERS = {name: number for number, name in _PROTOCOLS.items()}


def encoder(layout: Layout, family: str) -> Encoder:
    """The renderer's text of a concatenation (``10.96.0.1 . tcp . 80``) -> the bytes the
    kernel holds (each field padded to 4 bytes)."""
    af = _FAMILY[family]
    if layout == (ADDR,):
        return lambda text: socket.inet_pton(af, text)
    if not layout:
        return _nothing

    def encode(text: str) -> bytes:
        out = []
        for kind, part in zip(layout, text.split(" . "), strict=True):
            if kind == ADDR:
                out.append(socket.inet_pton(af, part))
            elif kind == PROTO:
                out.append(bytes((_NUMBERS.get(part) or int(part), 0, 0, 0)))
            elif kind == PORT:
                out.append(int(part).to_bytes(2, "big") + b"\0\0")
            else:
                out.append(int(part).to_bytes(4, sys.byteorder))
        return b"".join(out)

    return encode


def _nothing(text: str) -> bytes:
    return b""


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")
