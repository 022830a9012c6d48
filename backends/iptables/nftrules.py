"""What iptables-nft's tables hold, read over nfnetlink: per chain a rule count and a
digest of its rules' messages, our jumps in the built-in chains, and the ruleset's
generation (no ``iptables-save``: it prints every rule, 32 MB at 10,000 services x 10
endpoints, ~9 s of CPU).

iptables-nft keeps each table (``nat``, ``filter``) as an nftables table of family ip or
ip6. The kernel's bytes for a rule cannot be predicted from the iptables-restore text,
so the backend reads the chains it wrote right after writing them; the generation
(NFT_MSG_GETGEN: +1 per committed transaction, any table's) read before the write and
after that read tells whether anyone else committed in between.
"""

from __future__ import annotations

import errno
import hashlib
import socket
import sys
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from svcproxy.sdk import netlink

GETCHAIN, GETRULE = netlink.NFT_MSG_GETCHAIN, netlink.NFT_MSG_GETRULE
CHAIN_TABLE, CHAIN_NAME = 1, 3
RULE_TABLE, RULE_CHAIN, RULE_HANDLE, RULE_EXPRESSIONS = 1, 2, 3, 4
_GENMSG = netlink.NFGENMSG
FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}
# A write of more chains than this is taken as read back when someone else committed
# meanwhile (its chains are not rewritten at the next check: a full sync's are all).
PER_CHAIN_MAX = 200
# iptables-nft gives every rule a counter expression: its NFTA_EXPR_NAME attribute
# ("counter"), then NFTA_EXPR_DATA (bytes and packets), which no digest includes
# (traffic is not a change).
_COUNTER = b"\x0c\x00\x01\x00counter\x00"


@dataclass(frozen=True, slots=True)
class ChainDigest:
    """One chain as the kernel holds it: its rule count and the digest of its rules."""

    rules: int
    digest: bytes


@dataclass(slots=True)
class TableRules:
    """One table: its chains (those read), and per built-in chain the expressions of
    each of its rules (to find our jumps among everyone's)."""

    chains: dict[str, ChainDigest] = field(default_factory=dict)
    builtin: dict[str, list[bytes]] = field(default_factory=dict)


class NftRules:
    """Reads one namespace's iptables-nft tables; one socket, opened on first use."""

    def __init__(self, prefix: Iterable[str] = ()) -> None:
        self._path = netlink.netns_path(tuple(prefix))
        self._kernel = netlink.NftablesReader(self._path)
        self._lock = threading.Lock()

    def events(self) -> netlink.NftablesEvents:
        """A subscription to the namespace's nftables change events (from now on)."""
        return netlink.NftablesEvents(self._path)

    def generation(self) -> int:
        """The ruleset's generation (every committed transaction adds one)."""
        with self._lock:
            return self._kernel.generation()

    def table(self, family: int, table: str, builtin: Collection[str] = ()) -> TableRules:
        """Every chain of ``table`` (none if it does not exist), and the rule
        expressions of the chains of ``builtin``."""
        with self._lock:
            return self._table(FAMILIES[family], table.encode() + b"\0", builtin)

    def chains(self, family: int, table: str, chains: Collection[str],
               builtin: Collection[str] = ()) -> TableRules:
        """The chains of ``chains`` that exist (and ``builtin``'s expressions), one rule
        dump each. (One dump of a whole table costs the kernel the square of its rules:
        each message it fills starts again from the table's first rule, 0.85 s of
        system time for 48,000 rules; a chain's dump goes to the chain at once.)"""
        with self._lock:
            return self._chains(FAMILIES[family], table.encode() + b"\0", chains, builtin)

    def _table(self, family: int, name: bytes, builtin: Collection[str]) -> TableRules:
        out = TableRules()
        chains = [_text(found[CHAIN_NAME]) for body in self._kernel.bodies(
            GETCHAIN, family, netlink.attr(CHAIN_TABLE, name))
            if (found := netlink.attrs(body, _GENMSG.size)).get(CHAIN_TABLE) == name]
        wanted = {c.encode() for c in builtin}
        digests, expressions = self._rules(family, netlink.attr(RULE_TABLE, name), wanted)
        for chain in chains:
            out.chains[chain] = digests.get(chain.encode(), EMPTY)
        for chain in builtin:
            out.builtin[chain] = expressions.get(chain.encode(), [])
        return out

    def _chains(self, family: int, name: bytes, chains: Collection[str],
                builtin: Collection[str]) -> TableRules:
        out = TableRules()
        table = netlink.attr(RULE_TABLE, name)
        for chain in (*chains, *builtin):
            raw = chain.encode()
            keep = (raw,) if chain in builtin else ()
            try:
                digests, expressions = self._rules(
                    family, table + netlink.attr(RULE_CHAIN, raw + b"\0"), keep)
                digest = digests.get(raw)
                if digest is None:  # no rule: an empty chain, or none
                    list(self._kernel.spans(GETCHAIN, family, netlink.attr(CHAIN_TABLE, name)
                                            + netlink.attr(CHAIN_NAME, raw + b"\0"),
                                            dump=False))
                    digest = EMPTY
            except OSError as err:
                if err.errno == errno.ENOENT:
                    continue  # no such table or chain
                raise
            if chain in builtin:
                out.builtin[chain] = expressions.get(raw, [])
            else:
                out.chains[chain] = digest
        return out

    def _rules(self, family: int, request: bytes, keep: Collection[bytes],
               ) -> tuple[dict[bytes, ChainDigest], dict[bytes, list[bytes]]]:
        """One rule dump: per chain its count and digest, and the expressions of each
        rule of the chains in ``keep``. The kernel dumps a chain's rules one after the
        other, so each run is hashed as it comes: per rule a few slices, no parsing."""
        digests: dict[bytes, ChainDigest] = {}
        expressions: dict[bytes, list[bytes]] = {}
        run = _Run(b"")
        attr = netlink.ATTR_HEADER.unpack_from
        last: bytes | None = None
        view = memoryview(b"")
        for data, start, end in self._kernel.spans(GETRULE, family, request):
            if data is not last:
                last, view = data, memoryview(data)
            body = start + _GENMSG.size
            first, _ = attr(data, body)  # NFTA_RULE_TABLE, then NFTA_RULE_CHAIN
            second = body + ((first + 3) & ~3)
            name_length, _ = attr(data, second)
            chain = data[second + 4:second + name_length - 1]
            if chain != run.chain:
                run.into(digests)
                run = _Run(chain)
            run.add(data, view, body, end)
            if chain in keep:
                expressions.setdefault(chain, []).append(_expressions(data[body:end]))
        run.into(digests)
        return digests, expressions

    def close(self) -> None:
        self._kernel.close()


class _Run:
    """The rules of one chain as they come in a dump: counted and hashed (less their
    counter's values: traffic is not a change)."""

    __slots__ = ("chain", "rules", "hash")

    def __init__(self, chain: bytes) -> None:
        self.chain = chain
        self.rules = 0
        self.hash = hashlib.blake2b(digest_size=16)

    def add(self, data: bytes, view: memoryview, start: int, end: int) -> None:
        self.rules += 1
        cut = data.find(_COUNTER, start, end)
        if cut < 0:
            self.hash.update(view[start:end])
            return
        values = cut + len(_COUNTER)  # the NFTA_EXPR_DATA attribute
        length = int.from_bytes(data[values:values + 2], sys.byteorder)
        self.hash.update(view[start:values + 4])
        self.hash.update(view[values + ((length + 3) & ~3):end])

    def into(self, digests: dict[bytes, ChainDigest]) -> None:
        if self.rules:
            digests[self.chain] = ChainDigest(self.rules, self.hash.digest())


EMPTY = ChainDigest(0, _Run(b"").hash.digest())


def _expressions(rule: bytes) -> bytes:
    """A rule's expression bytes (what it matches and does, not where it is), less its
    counter's values."""
    for kind, a, b in netlink.attr_spans(rule):
        if kind == RULE_EXPRESSIONS:
            cut = rule.find(_COUNTER, a, b)
            if cut < 0:
                return rule[a:b]
            values = cut + len(_COUNTER)
            length = int.from_bytes(rule[values:values + 2], sys.byteorder)
            return rule[a:values + 4] + rule[values + ((length + 3) & ~3):b]
    return b""


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode(errors="replace")
