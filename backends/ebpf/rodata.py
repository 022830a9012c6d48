"""Set a BPF object's ``volatile const`` variables before it is loaded, by name.

The variables live in the object's ``.rodata`` map; their offsets come from its BTF
(the DATASEC's variables), so adding a constant to a program never shifts another's.
"""

from __future__ import annotations

import ctypes

from . import libbpf

BTF_KIND_DATASEC = 15


class _BtfType(ctypes.Structure):
    _fields_ = [("name_off", ctypes.c_uint32), ("info", ctypes.c_uint32),
                ("size", ctypes.c_uint32)]


class _VarSecinfo(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("offset", ctypes.c_uint32),
                ("size", ctypes.c_uint32)]


def _lib() -> ctypes.CDLL:
    lib = libbpf.lib()
    lib.bpf_object__btf.restype = ctypes.c_void_p
    lib.bpf_object__btf.argtypes = [ctypes.c_void_p]
    lib.btf__find_by_name_kind.restype = ctypes.c_int
    lib.btf__find_by_name_kind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
    lib.btf__type_by_id.restype = ctypes.c_void_p
    lib.btf__type_by_id.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.btf__name_by_offset.restype = ctypes.c_char_p
    lib.btf__name_by_offset.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.bpf_map__initial_value.restype = ctypes.c_void_p
    lib.bpf_map__initial_value.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    return lib


def offsets(obj: int) -> dict[str, tuple[int, int]]:
    """Each ``.rodata`` variable of the opened object: name -> (offset, size)."""
    lib = _lib()
    btf = libbpf.check_ptr(lib.bpf_object__btf(obj), "object BTF")
    sec = libbpf.check(lib.btf__find_by_name_kind(btf, b".rodata", BTF_KIND_DATASEC),
                       ".rodata BTF")
    head = _BtfType.from_address(libbpf.check_ptr(lib.btf__type_by_id(btf, sec), "DATASEC"))
    found = {}
    base = ctypes.addressof(head) + ctypes.sizeof(_BtfType)
    for i in range(head.info & 0xFFFF):
        var = _VarSecinfo.from_address(base + i * ctypes.sizeof(_VarSecinfo))
        vt = _BtfType.from_address(libbpf.check_ptr(lib.btf__type_by_id(btf, var.type), "VAR"))
        name = lib.btf__name_by_offset(btf, vt.name_off) or b""
        found[name.decode()] = (var.offset, var.size)
    return found


def set_constants(obj: int, values: dict[str, int]) -> None:
    """Write each named ``volatile const`` (little-endian, as this host) before load;
    KeyError names a variable the object lacks."""
    lib = _lib()
    where = offsets(obj)
    rodata = libbpf.check_ptr(lib.bpf_object__find_map_by_name(obj, b".rodata"), ".rodata")
    size = ctypes.c_size_t(0)
    data = libbpf.check_ptr(lib.bpf_map__initial_value(rodata, ctypes.byref(size)),
                            ".rodata value")
    for name, value in values.items():
        offset, width = where[name]
        if offset + width > size.value:
            raise KeyError(f"{name} lies outside .rodata")
        ctypes.memmove(data + offset, value.to_bytes(width, "little"), width)
