"""Maglev consistent hashing (Eisenbud et al., NSDI 2016, section 3.4), pure (the turns
run in C when `native/maglev.c` is built: `maglev_native`; else the same loop in Python).

A service port's lookup table has ``size`` slots (a prime); each slot names one
endpoint. Every endpoint has a preference list, a permutation of the slots given by
two hashes of its name: ``offset = h1 % size`` and ``skip = h2 % (size - 1) + 1``,
so its j-th preference is ``(offset + j * skip) % size``. The endpoints take turns,
each claiming its most preferred slot still free, until every slot is claimed
(Pseudocode 1 of the paper). Weights are equal, as kube-proxy's are.

What follows from it, and what ``tests/backends/ebpf/test_maglev.py`` checks:

- every slot names an endpoint, and each endpoint holds ``size // n`` or
  ``size // n + 1`` slots (the turns stop as soon as the table is full);
- removing one of n endpoints moves its own slots and only a few others
  (about 1/n of the table in all);
- the hashes are keyed BLAKE2b, not Python's salted ``hash()``, and the endpoints are
  taken in sorted order: every process on every node builds the same table from the
  same endpoints, so nodes agree on a flow's endpoint without sharing state.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Iterable, MutableSequence, Sequence

from . import maglev_native

SIZES = (251, 1021, 4093, 16381, 65521)  # primes offered by --ebpf-maglev-table-size
DEFAULT_SIZE = 16381
_KEY = b"svcproxy-maglev-v1"


def is_prime(n: int) -> bool:
    """Trial division (table sizes are at most 65,521)."""
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def offset_skip(name: bytes, size: int) -> tuple[int, int]:
    """The endpoint's permutation: where it starts and its stride (never 0)."""
    digest = hashlib.blake2b(name, digest_size=16, key=_KEY).digest()
    h1 = int.from_bytes(digest[:8], "little")
    h2 = int.from_bytes(digest[8:], "little")
    return h1 % size, h2 % (size - 1) + 1


def build(names: Sequence[bytes], size: int = DEFAULT_SIZE) -> list[int]:
    """The lookup table: for each slot, the index into ``names`` of its endpoint.

    ``names`` are the endpoints' identities (for example ``b"10.244.1.5:8080"``), in
    the order the caller indexes them; the turns go by sorted name, so the table
    depends on the set of names only. An empty ``names`` gives an empty table.
    """
    return _entries(names, size).tolist()


def table(names: Sequence[bytes], size: int = DEFAULT_SIZE) -> bytes:
    """``pack(build(names, size))``, built straight into the packed form."""
    entry = _entries(names, size)
    if sys.byteorder == "big":
        entry.byteswap()
    return entry.tobytes()


def reference(names: Sequence[bytes], size: int = DEFAULT_SIZE) -> list[int]:
    """``build`` by the Python loop alone, never the C helper: what the helper must equal."""
    offsets, skips, indexes = _turns(names, size)
    entry = [0] * size if names else []
    _populate(size, offsets, skips, indexes, entry)
    return entry


def _entries(names: Sequence[bytes], size: int) -> array:
    """The table as u16 slots: filled by the C helper (``maglev_native``) when it is
    built, else by the same loop in Python."""
    offsets, skips, indexes = _turns(names, size)
    entry = array("H", bytes(2 * size)) if names else array("H")
    if names and not maglev_native.populate(size, offsets, skips, indexes, entry):
        _populate(size, offsets, skips, indexes, entry)
    return entry


def _turns(names: Sequence[bytes], size: int) -> tuple[array, array, array]:
    """Each endpoint's offset, skip and index into ``names``, in turn order (by sorted
    name); checks that ``size`` is a prime and the names are distinct."""
    if not is_prime(size):
        raise ValueError(f"the Maglev table size must be a prime, not {size}")
    order = sorted(range(len(names)), key=names.__getitem__)
    if len({names[i] for i in order}) != len(order):
        raise ValueError("endpoint names must be distinct")
    perms = [offset_skip(names[i], size) for i in order]
    return (array("I", [offset for offset, _ in perms]), array("I", [skip for _, skip in perms]),
            array("H", order))


def _populate(size: int, offsets: Sequence[int], skips: Sequence[int], indexes: Sequence[int],
              entry: MutableSequence[int]) -> None:
    """Fill ``entry`` (``size`` slots) as Pseudocode 1 does: ``size // n`` full rounds of
    turns, then the first ``size % n`` turns of one more."""
    taken = bytearray(size)
    # Each endpoint's next candidate slot (the slot itself, advanced by its skip).
    cand = list(offsets)
    turns = list(enumerate(zip(skips, indexes, strict=True)))
    rounds, extra = divmod(size, len(turns))
    for last in [False] * rounds + [True]:
        for turn, (skip, index) in turns[:extra] if last else turns:
            c = cand[turn]
            while taken[c]:
                c += skip
                if c >= size:
                    c -= size
            taken[c] = 1
            entry[c] = index
            c += skip
            cand[turn] = c - size if c >= size else c


def tables(name_sets: Iterable[Sequence[bytes]],
           size: int = DEFAULT_SIZE) -> dict[tuple[bytes, ...], bytes]:
    """The packed table of each distinct list of names, keyed by it: one build per
    endpoint set however many service addresses (ClusterIP, NodePorts, externalIPs,
    VIPs) share it."""
    wanted = dict.fromkeys(tuple(names) for names in name_sets)
    return {names: table(names, size) for names in wanted}


def pack(table: Sequence[int]) -> bytes:
    """The table as the BPF map holds it: one little-endian u16 slot index per entry."""
    packed = array("H", table)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def flow_hash(saddr: bytes, daddr: bytes, sport: int, dport: int, proto: int) -> int:
    """A flow's 32-bit hash as the tc program computes it (``flow_hash`` in the C
    source): jhash-style mixing of both addresses (16 bytes each), the ports and the
    protocol with a fixed seed, so every node computes the same value."""
    words = [int.from_bytes(saddr[i:i + 4], "little") for i in range(0, 16, 4)]
    words += [int.from_bytes(daddr[i:i + 4], "little") for i in range(0, 16, 4)]
    words.append((sport << 16 | dport) & 0xFFFFFFFF)
    words.append(proto)
    h = 0x5EED5EED
    for w in words:
        h = _mix(h ^ w)
    return h


def _mix(h: int) -> int:
    """murmur3's 32-bit finaliser (a full avalanche of one word)."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h
