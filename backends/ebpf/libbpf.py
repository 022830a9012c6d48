"""A thin ctypes binding over the system's libbpf (libbpf1): only the calls the backend uses.

Why ctypes over libbpf rather than bpftool: map updates are syscalls made in-process
(batched: a few microseconds per entry) instead of a process per operation, and
libbpf does what is hard to redo (ELF and BTF parsing, relocations, map pinning and
reuse). libbpf 1.x returns -errno; every failure here raises BpfError with the errno.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from collections.abc import Iterator
from functools import cache, lru_cache

PROG_TYPE_CGROUP_SOCK_ADDR = 18
LINK_TYPE_CGROUP = 3
ANY = 0  # BPF_ANY: create or replace


class BpfError(OSError):
    """A libbpf call failed; ``errno`` says why."""


c_void_p, c_int, c_uint, c_char_p = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "bpf_object__open_file": (c_void_p, [c_char_p, c_void_p]),
    "bpf_object__load": (c_int, [c_void_p]),
    "bpf_object__close": (None, [c_void_p]),
    "bpf_object__find_map_by_name": (c_void_p, [c_void_p, c_char_p]),
    "bpf_object__find_program_by_name": (c_void_p, [c_void_p, c_char_p]),
    "bpf_map__set_pin_path": (c_int, [c_void_p, c_char_p]),
    "bpf_map__set_max_entries": (c_int, [c_void_p, c_uint]),
    "bpf_map__max_entries": (c_uint, [c_void_p]),
    "bpf_map__fd": (c_int, [c_void_p]),
    "bpf_program__fd": (c_int, [c_void_p]),
    "bpf_program__expected_attach_type": (c_int, [c_void_p]),
    "bpf_link_create": (c_int, [c_int, c_int, c_int, c_void_p]),
    "bpf_link_update": (c_int, [c_int, c_int, c_void_p]),
    "bpf_link_detach": (c_int, [c_int]),
    "bpf_obj_pin": (c_int, [c_int, c_char_p]),
    "bpf_obj_get": (c_int, [c_char_p]),
    "bpf_obj_get_info_by_fd": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_update_elem": (c_int, [c_int, c_void_p, c_void_p, ctypes.c_uint64]),
    "bpf_map_lookup_elem": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_delete_elem": (c_int, [c_int, c_void_p]),
    "bpf_map_get_next_key": (c_int, [c_int, c_void_p, c_void_p]),
    "bpf_map_update_batch": (c_int, [c_int, c_void_p, c_void_p, c_void_p, c_void_p]),
    "bpf_map_delete_batch": (c_int, [c_int, c_void_p, c_void_p, c_void_p]),
    "bpf_map_lookup_batch": (c_int, [c_int, c_void_p, c_void_p, c_void_p, c_void_p,
                                     c_void_p, c_void_p]),
    "libbpf_probe_bpf_prog_type": (c_int, [c_int, c_void_p]),
    "libbpf_probe_bpf_helper": (c_int, [c_int, c_int, c_void_p]),
}


@cache
def lib() -> ctypes.CDLL:
    """The loaded libbpf.so.1, with argument types set."""
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        handle = ctypes.CDLL(name, use_errno=True)
    except OSError as err:
        raise BpfError(errno.ENOENT, f"libbpf not found ({err}); install libbpf1") from None
    for fn, (restype, argtypes) in _SIGNATURES.items():
        f = getattr(handle, fn)
        f.restype = restype
        f.argtypes = argtypes
    return handle


def check(result: int, what: str) -> int:
    """``result`` when it is not negative; else raise BpfError(-result)."""
    if result < 0:
        code = -result
        raise BpfError(code, f"{what}: {os.strerror(code)}")
    return result


def check_ptr(ptr: int | None, what: str) -> int:
    if not ptr:
        code = ctypes.get_errno() or errno.ENOENT
        raise BpfError(code, f"{what}: {os.strerror(code)}")
    return ptr


def obj_get(path: str) -> int:
    return check(lib().bpf_obj_get(path.encode()), f"open pin {path}")


def obj_pin(fd: int, path: str) -> None:
    check(lib().bpf_obj_pin(fd, path.encode()), f"pin {path}")


class LinkInfo(ctypes.Structure):
    """struct bpf_link_info, as far as cgroup links go."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("cgroup_id", ctypes.c_uint64), ("attach_type", ctypes.c_uint32),
                ("_rest", ctypes.c_uint8 * 36)]


def link_info(fd: int) -> LinkInfo:
    info = LinkInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    check(lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)),
          "link info")
    return info


class Map:
    """A BPF map by fd with fixed key and value sizes."""

    def __init__(self, name: str, fd: int, key_size: int, value_size: int) -> None:
        self.name = name
        self.fd = fd
        self.key_size = key_size
        self.value_size = value_size

    def update(self, key: bytes, value: bytes) -> None:
        check(lib().bpf_map_update_elem(self.fd, key, value, ANY), f"update {self.name}")

    def lookup(self, key: bytes) -> bytes | None:
        buf = ctypes.create_string_buffer(self.value_size)
        result = lib().bpf_map_lookup_elem(self.fd, key, buf)
        if result == -errno.ENOENT:
            return None
        check(result, f"lookup {self.name}")
        return buf.raw

    def delete(self, key: bytes) -> bool:
        result = lib().bpf_map_delete_elem(self.fd, key)
        if result == -errno.ENOENT:
            return False
        check(result, f"delete {self.name}")
        return True

    def update_many(self, keys: list[bytes], values: list[bytes]) -> None:
        """One BPF_MAP_UPDATE_BATCH call per 65,536 entries."""
        for start in range(0, len(keys), 65536):
            ks, vs = keys[start:start + 65536], values[start:start + 65536]
            count = ctypes.c_uint32(len(ks))
            check(lib().bpf_map_update_batch(self.fd, b"".join(ks), b"".join(vs),
                                             ctypes.byref(count), None),
                  f"update {self.name} ({count.value} of {len(ks)} written)")

    def delete_many(self, keys: list[bytes]) -> None:
        """Delete ``keys``; keys already gone are skipped."""
        for start in range(0, len(keys), 65536):
            ks = keys[start:start + 65536]
            count = ctypes.c_uint32(len(ks))
            result = lib().bpf_map_delete_batch(self.fd, b"".join(ks), ctypes.byref(count), None)
            if result == -errno.ENOENT:  # one was missing: the batch stopped there
                for key in ks[count.value:]:
                    self.delete(key)
            else:
                check(result, f"delete {self.name}")

    def items(self, chunk: int = 8192) -> Iterator[tuple[bytes, bytes]]:
        """Every entry, read with BPF_MAP_LOOKUP_BATCH."""
        keys = ctypes.create_string_buffer(self.key_size * chunk)
        values = ctypes.create_string_buffer(self.value_size * chunk)
        token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)
        first = True
        while True:
            count = ctypes.c_uint32(chunk)
            result = lib().bpf_map_lookup_batch(
                self.fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                keys, values, ctypes.byref(count), None)
            if result < 0 and result != -errno.ENOENT:
                check(result, f"read {self.name}")
            kraw, vraw = keys.raw, values.raw
            for i in range(count.value):
                yield (kraw[i * self.key_size:(i + 1) * self.key_size],
                       vraw[i * self.value_size:(i + 1) * self.value_size])
            if result == -errno.ENOENT:
                return
            token_in.value = token_out.value
            first = False

    def read_all(self, chunk: int = 8192) -> dict[bytes, bytes]:
        """Every entry as one dict (BPF_MAP_LOOKUP_BATCH; each batch split into keys and
        values by one ``struct`` call: no Python work per entry)."""
        keys = ctypes.create_string_buffer(self.key_size * chunk)
        values = ctypes.create_string_buffer(self.value_size * chunk)
        token_in, token_out = ctypes.c_uint64(0), ctypes.c_uint64(0)
        found: dict[bytes, bytes] = {}
        first = True
        while True:
            count = ctypes.c_uint32(chunk)
            result = lib().bpf_map_lookup_batch(
                self.fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                keys, values, ctypes.byref(count), None)
            if result < 0 and result != -errno.ENOENT:
                check(result, f"read {self.name}")
            n = count.value
            found.update(zip(_split(self.key_size, n).unpack_from(keys),
                             _split(self.value_size, n).unpack_from(values), strict=True))
            if result == -errno.ENOENT:
                return found
            token_in.value = token_out.value
            first = False

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


def list_keys(m: Map) -> list[bytes]:
    """Every key of ``m``, one at a time: an LPM trie has no batch operations, and a
    batched read of large values (Maglev tables) would buffer thousands of them."""
    keys: list[bytes] = []
    key = ctypes.create_string_buffer(m.key_size)
    prev = None
    while lib().bpf_map_get_next_key(m.fd, prev, key) == 0:
        keys.append(key.raw)
        prev = ctypes.create_string_buffer(key.raw, m.key_size)
    return keys


@lru_cache(maxsize=16)
def _split(size: int, count: int) -> struct.Struct:
    """``count`` strings of ``size`` bytes (a batch read's keys or values)."""
    return struct.Struct(f"{size}s" * count)
