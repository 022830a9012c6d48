"""The CT GC's judgement and deletes in C (``native/ct_gc.c``), loaded with ctypes.

``build.py`` compiles it into ``native/libsvcproxy_ct_gc.so`` when a C compiler is
there; without it ``expired_rows`` and ``remove_unchanged`` return None and ``ct_gc``
does the same work in Python.
"""

from __future__ import annotations

import ctypes
import functools
from array import array

from . import native_lib

LIBRARY = native_lib.library_path("ct_gc")
KEY, VALUE = 40, 56  # struct ct_key, struct ct_val


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The helper, or None (logged once) when it cannot be loaded."""
    lib = native_lib.load(LIBRARY, "The CT GC runs in Python")
    if lib is None:
        return None
    lib.svcproxy_ct_expired.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32,
                                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.svcproxy_ct_expired.restype = ctypes.c_long
    lib.svcproxy_ct_remove_unchanged.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                                 ctypes.c_char_p, ctypes.c_void_p,
                                                 ctypes.c_uint32]
    lib.svcproxy_ct_remove_unchanged.restype = ctypes.c_long
    return lib


def available() -> bool:
    """Whether the C helper is loaded."""
    return _library() is not None


def expired_rows(keys: bytes, values: bytes,
                 limits: dict[tuple[int, int], int]) -> tuple[list[int], int] | None:
    """The rows to remove and the live flows, as ``ct_gc.expired_rows`` judges them,
    with ``limits[proto, state]`` the last_ns below which an entry is idle; None when the
    helper is missing."""
    lib = _library()
    if lib is None:
        return None
    n = len(keys) // KEY
    table = array("q", bytes(8 * 65536))
    for (proto, state), limit in limits.items():
        table[proto << 8 | state] = limit
    dead = array("I", bytes(4 * max(n, 1)))
    flows = ctypes.c_uint32(0)
    count = lib.svcproxy_ct_expired(keys, values, n, table.buffer_info()[0],
                                    dead.buffer_info()[0], ctypes.addressof(flows))
    if count < 0:
        raise MemoryError("the CT GC helper could not allocate its hash table")
    return dead[:count].tolist(), flows.value


def remove_unchanged(fd: int, keys: bytes, values: bytes,
                     rows: list[int] | None = None) -> int | None:
    """``ct_gc.remove_unchanged`` of the entries ``keys`` and ``values`` hold end to end
    (only those of ``rows``, when given); None when the helper is missing."""
    lib = _library()
    if lib is None:
        return None
    if rows is None:
        return int(lib.svcproxy_ct_remove_unchanged(fd, keys, values, None, len(keys) // KEY))
    picked = array("I", rows)
    return int(lib.svcproxy_ct_remove_unchanged(fd, keys, values, picked.buffer_info()[0],
                                                len(picked)))
