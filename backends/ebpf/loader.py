"""Load the programs, pin the maps and links under a bpffs directory, attach to a cgroup.

A restarted backend adopts what the kernel holds: libbpf reuses the pinned maps
(their entries keep serving meanwhile) and each pinned link is switched to the new
program in place (BPF_LINK_UPDATE), so no connect() ever runs without a program.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from . import libbpf
from .layout import EP_KEY, EP_VAL, SVC_KEY, SVC_VAL
from .libbpf import BpfError, Map
from .names import LINK_PREFIX, MAP_AFFINITY, MAP_ENDPOINTS, MAP_REVNAT, MAP_SERVICES, MAPS

log = logging.getLogger(__name__)

BPF_FS_MAGIC = 0xCAFE4A11
CGROUP2_SUPER_MAGIC = 0x63677270
OBJECT = Path(__file__).parent / "bpf" / "svcproxy_sock.bpf.o"

# Program name -> (section, the kernel's attach type, Linux version that added the hook).
PROGRAMS = {
    "sp_connect4": ("cgroup/connect4", "BPF_CGROUP_INET4_CONNECT", "4.17"),
    "sp_connect6": ("cgroup/connect6", "BPF_CGROUP_INET6_CONNECT", "4.17"),
    "sp_sendmsg4": ("cgroup/sendmsg4", "BPF_CGROUP_UDP4_SENDMSG", "4.18"),
    "sp_sendmsg6": ("cgroup/sendmsg6", "BPF_CGROUP_UDP6_SENDMSG", "4.18"),
    "sp_recvmsg4": ("cgroup/recvmsg4", "BPF_CGROUP_UDP4_RECVMSG", "5.2"),
    "sp_recvmsg6": ("cgroup/recvmsg6", "BPF_CGROUP_UDP6_RECVMSG", "5.2"),
    "sp_getpeername4": ("cgroup/getpeername4", "BPF_CGROUP_INET4_GETPEERNAME", "5.8"),
    "sp_getpeername6": ("cgroup/getpeername6", "BPF_CGROUP_INET6_GETPEERNAME", "5.8"),
}
# Helpers the programs call: name -> (BPF_FUNC_ id, Linux version for sock_addr programs).
HELPERS = {
    "bpf_get_socket_cookie": (46, "5.0"),
    "bpf_get_netns_cookie": (122, "5.7"),
    "bpf_loop": (181, "5.17"),
    "bpf_set_retval": (187, "6.0"),
}
SIZES = {
    MAP_SERVICES: (SVC_KEY.size, SVC_VAL.size),
    MAP_ENDPOINTS: (EP_KEY.size, EP_VAL.size),
    MAP_AFFINITY: (32, 32),
    MAP_REVNAT: (32, EP_VAL.size),
}
ENOTSUPP = 524  # the kernel's internal "not supported", seen by BPF syscalls


class LoadError(RuntimeError):
    """The programs cannot be loaded or attached here; the message says what to do."""


def fs_type(path: str) -> int:
    """statfs(2)'s f_type of ``path``."""
    buf = ctypes.create_string_buffer(256)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(path.encode(), buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{path}: {os.strerror(code)}")
    return int.from_bytes(buf.raw[:8], "little")


def missing_kernel_features() -> list[str]:
    """What this kernel lacks among what the programs need ([] when nothing)."""
    lib = libbpf.lib()
    if lib.libbpf_probe_bpf_prog_type(libbpf.PROG_TYPE_CGROUP_SOCK_ADDR, None) != 1:
        return ["BPF_PROG_TYPE_CGROUP_SOCK_ADDR programs (cgroup/connect4 and friends, "
                "Linux 4.17)"]
    return [f"helper {name} in cgroup sock_addr programs (Linux {version})"
            for name, (func, version) in HELPERS.items()
            if lib.libbpf_probe_bpf_helper(libbpf.PROG_TYPE_CGROUP_SOCK_ADDR, func, None) != 1]


def _kernel_error(what: str, missing: list[str]) -> LoadError:
    return LoadError(f"{what}: this kernel lacks {'; '.join(missing)}. The ebpf backend "
                     "needs Linux 6.0 or later with BPF and cgroup v2; use the nft backend "
                     "on this node instead")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the backend keeps its pins and where it attaches."""

    pin_dir: Path
    cgroup: Path
    object_path: Path = OBJECT
    max_services: int = 65536
    max_endpoints: int = 262144

    def map_pin(self, name: str) -> Path:
        return self.pin_dir / name

    def link_pin(self, program: str) -> Path:
        return self.pin_dir / f"{LINK_PREFIX}{program}"


def check_paths(layout: Layout) -> None:
    """The pin directory is on a bpffs and the cgroup is a cgroup v2 directory."""
    parent = layout.pin_dir if layout.pin_dir.exists() else layout.pin_dir.parent
    try:
        pin_fs = fs_type(str(parent))
    except OSError as err:
        raise LoadError(f"--ebpf-pin-dir {layout.pin_dir}: {err.strerror}; it must be on a "
                        "bpf filesystem (mount -t bpf bpf /sys/fs/bpf)") from None
    if pin_fs != BPF_FS_MAGIC:
        raise LoadError(f"--ebpf-pin-dir {layout.pin_dir} is not on a bpf filesystem; mount "
                        "one (mount -t bpf bpf /sys/fs/bpf) or pick a directory on one")
    try:
        cg_fs = fs_type(str(layout.cgroup))
    except OSError as err:
        raise LoadError(f"--ebpf-cgroup {layout.cgroup}: {err.strerror}") from None
    if cg_fs != CGROUP2_SUPER_MAGIC:
        raise LoadError(f"--ebpf-cgroup {layout.cgroup} is not a cgroup v2 directory (find "
                        "the unified hierarchy with: mount -t cgroup2)")


class Programs:
    """The loaded object: its maps by name; the links stay pinned after ``close``."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._obj: int | None = None
        self.maps: dict[str, Map] = {}

    def load(self) -> Programs:
        """Load (reusing pinned maps), then attach or adopt every program's link."""
        layout = self.layout
        if not layout.object_path.exists():
            raise LoadError(f"{layout.object_path} is missing: build it with "
                            "`python -m svcproxy.backends.ebpf.build` (needs clang) or "
                            "bash scripts/setup.sh")
        check_paths(layout)
        missing = missing_kernel_features()
        if missing:
            raise _kernel_error("cannot load the ebpf programs", missing)
        layout.pin_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lib = libbpf.lib()
        obj = libbpf.check_ptr(lib.bpf_object__open_file(str(layout.object_path).encode(), None),
                               f"open {layout.object_path}")
        self._obj = obj
        try:
            self._prepare_maps(obj)
            result = lib.bpf_object__load(obj)
            if result < 0:
                raise LoadError(
                    f"loading {layout.object_path} failed: {os.strerror(-result)} (libbpf's "
                    "message above says more). If pinned maps in --ebpf-pin-dir "
                    f"{layout.pin_dir} were made with other sizes, run --cleanup first")
            self._collect_maps(obj)
            self._attach_all(obj)
        except BaseException:
            self.close()
            raise
        return self

    def _prepare_maps(self, obj: int) -> None:
        lib = libbpf.lib()
        sizes = {MAP_SERVICES: self.layout.max_services,
                 MAP_ENDPOINTS: self.layout.max_endpoints}
        for name in MAPS:
            m = libbpf.check_ptr(lib.bpf_object__find_map_by_name(obj, name.encode()),
                                 f"map {name}")
            if name in sizes:
                libbpf.check(lib.bpf_map__set_max_entries(m, sizes[name]), f"size {name}")
            libbpf.check(lib.bpf_map__set_pin_path(m, str(self.layout.map_pin(name)).encode()),
                         f"pin path {name}")

    def _collect_maps(self, obj: int) -> None:
        lib = libbpf.lib()
        for name in MAPS:
            m = lib.bpf_object__find_map_by_name(obj, name.encode())
            key, value = SIZES[name]
            self.maps[name] = Map(name, lib.bpf_map__fd(m), key, value)

    def capacity(self, name: str) -> int:
        lib = libbpf.lib()
        assert self._obj is not None
        return int(lib.bpf_map__max_entries(lib.bpf_object__find_map_by_name(
            self._obj, name.encode())))

    def _attach_all(self, obj: int) -> None:
        lib = libbpf.lib()
        cg_fd = os.open(self.layout.cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            cg_id = os.fstat(cg_fd).st_ino
            for name, (section, attach_name, version) in PROGRAMS.items():
                prog = libbpf.check_ptr(lib.bpf_object__find_program_by_name(obj, name.encode()),
                                        f"program {name}")
                prog_fd = lib.bpf_program__fd(prog)
                attach_type = lib.bpf_program__expected_attach_type(prog)
                try:
                    self._attach(name, prog_fd, attach_type, cg_fd, cg_id)
                except BpfError as err:
                    if err.errno in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                        raise _kernel_error(f"attaching {section}",
                                            [f"the {section} hook ({attach_name}, Linux "
                                             f"{version})"]) from None
                    raise LoadError(f"attaching {section} to {self.layout.cgroup}: "
                                    f"{err.strerror}") from None
        finally:
            os.close(cg_fd)

    def _attach(self, name: str, prog_fd: int, attach_type: int, cg_fd: int, cg_id: int) -> None:
        """Switch the pinned link to ``prog_fd``, or create and pin a new one."""
        lib = libbpf.lib()
        pin = self.layout.link_pin(name)
        if pin.exists():
            fd = libbpf.obj_get(str(pin))
            try:
                info = libbpf.link_info(fd)
                if (info.type == libbpf.LINK_TYPE_CGROUP and info.cgroup_id == cg_id
                        and info.attach_type == attach_type):
                    libbpf.check(lib.bpf_link_update(fd, prog_fd, None), f"update link {name}")
                    log.debug("Adopted link %s (program replaced in place)", pin)
                    return
                log.info("Link %s is attached elsewhere; detaching it", pin)
                lib.bpf_link_detach(fd)
            finally:
                os.close(fd)
            pin.unlink()
        fd = libbpf.check(lib.bpf_link_create(prog_fd, cg_fd, attach_type, None),
                          f"attach {name}")
        try:
            libbpf.obj_pin(fd, str(pin))
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release this process's handles; pinned maps and links stay in the kernel."""
        if self._obj is not None:
            libbpf.lib().bpf_object__close(self._obj)
            self._obj = None
            self.maps.clear()


def open_pinned_maps(pin_dir: Path) -> dict[str, Map]:
    """The pinned maps (for --dump), without loading anything; raises LoadError if absent."""
    maps: dict[str, Map] = {}
    for name in MAPS:
        path = pin_dir / name
        try:
            fd = libbpf.obj_get(str(path))
        except BpfError as err:
            for m in maps.values():
                os.close(m.fd)
            raise LoadError(f"{path}: {err.strerror}; is the ebpf backend running with "
                            f"--ebpf-pin-dir {pin_dir}?") from None
        key, value = SIZES[name]
        maps[name] = Map(name, fd, key, value)
    return maps


def remove_pins(pin_dir: Path) -> list[str]:
    """Detach every pinned link, remove every pin the backend owns, then the directory.

    Returns what was removed. Files in ``pin_dir`` that are not ours are left alone.
    """
    removed: list[str] = []
    if not pin_dir.is_dir():
        return removed
    lib = libbpf.lib()
    for name in PROGRAMS:
        pin = pin_dir / f"{LINK_PREFIX}{name}"
        if not pin.exists():
            continue
        try:
            fd = libbpf.obj_get(str(pin))
            try:
                lib.bpf_link_detach(fd)
            finally:
                os.close(fd)
        except BpfError as err:
            log.warning("Detaching %s: %s", pin, err.strerror)
        pin.unlink()
        removed.append(pin.name)
    for name in MAPS:
        pin = pin_dir / name
        if pin.exists():
            pin.unlink()
            removed.append(pin.name)
    try:
        pin_dir.rmdir()
    except OSError as err:
        log.warning("Leaving %s: %s", pin_dir, err.strerror)
    return removed
