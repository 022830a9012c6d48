"""The Maglev table's population loop in C (``native/maglev.c``), loaded with ctypes.

``build.py`` compiles it into ``native/libsvcproxy_maglev.so`` when a C compiler is
there; without it (or on a machine the library was not built for) ``populate`` says so
by returning False, and ``maglev`` runs the same loop in Python: the same table, about
30 times slower.
"""

from __future__ import annotations

import ctypes
import functools
from array import array

from . import native_lib

LIBRARY = native_lib.library_path("maglev")


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The C function, or None (logged once) when the library cannot be loaded."""
    lib = native_lib.load(LIBRARY, "Maglev tables are built in Python, about 30 times slower")
    if lib is None:
        return None
    fn = lib.svcproxy_maglev_populate
    fn.argtypes = [ctypes.c_uint32, ctypes.c_uint32] + [ctypes.c_void_p] * 4
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    """Whether the C helper is loaded."""
    return _function() is not None


def populate(size: int, offsets: array, skips: array, indexes: array, entry: array) -> bool:
    """Fill ``entry`` (``size`` u16 slots) from the turns' ``offsets``, ``skips`` (u32)
    and endpoint ``indexes`` (u16), in turn order; False when the helper is missing."""
    fn = _function()
    if fn is None:
        return False
    if len(entry) != size or entry.typecode != "H":
        raise ValueError("the Maglev entry array must hold `size` u16 slots")
    if fn(size, len(offsets), offsets.buffer_info()[0], skips.buffer_info()[0],
          indexes.buffer_info()[0], entry.buffer_info()[0]) != 0:
        raise MemoryError("the Maglev helper could not allocate its scratch space")
    return True
