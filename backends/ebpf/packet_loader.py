"""Load the tc programs, pin their maps and links, attach them to the node's devices.

Each device gets two tcx links (BPF_TCX_INGRESS, BPF_TCX_EGRESS; Linux 6.6), pinned as
``link_<device>_ingress`` / ``_egress`` under the packet path's pin directory; on a
kernel without tcx, a clsact qdisc and two direct-action tc filters (``clsact.py``). As
with the socket programs, a restarted backend reuses the pinned maps (connection
tracking included) and switches each pinned link (or filter) to the new program in
place (BPF_LINK_UPDATE, BPF_TC_F_REPLACE), so no packet ever passes a device without a
program. The pins of a device that went or is no longer served go then
(``device_pins.py``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from . import clsact, device_pins, libbpf, nat_ports, pod_devices, rodata, xdp
from .ct_gc import CtTimeouts, set_timeouts
from .libbpf import BpfError, Map
from .loader import BPF_FS_MAGIC, ENOTSUPP, LoadError, fs_type
from .names import (
    LINK_PREFIX,
    TC_CONSTANTS,
    TC_MAP_CT,
    TC_MAP_ENDPOINTS,
    TC_MAP_MAGLEV,
    TC_MAP_SERVICES,
    TC_MAPS,
    TC_SUBDIR,
    pin_device,
)
from .packet_layout import SIZES

log = logging.getLogger(__name__)

OBJECT = Path(__file__).parent / "bpf" / "svcproxy_tc.bpf.o"
TCX_INGRESS, TCX_EGRESS = 46, 47  # enum bpf_attach_type (Linux 6.6)
LINK_TYPE_TCX = 11
HOOKS = {"ingress": ("spp_ingress", TCX_INGRESS), "egress": ("spp_egress", TCX_EGRESS)}
NO_TCX = (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP)  # how a kernel before 6.6 refuses tcx


@dataclass(frozen=True, slots=True)
class PacketLayout:
    """Where the packet path pins (``pin_dir``/tc), what it attaches to, its sizes."""

    pin_dir: Path
    devices: tuple[str, ...]
    object_path: Path = OBJECT
    maglev_size: int = 16381
    max_services: int = 65536
    max_endpoints: int = 262144
    max_flows: int = 262144
    ct_timeouts: CtTimeouts = CtTimeouts()  # --conntrack-*: lifetimes per protocol and state
    dsr: bool = False  # --ebpf-dsr: remote endpoints' flows sent in Geneve (bpf/dsr.h)
    xdp: str = "off"  # --ebpf-xdp: off, auto, native or generic (xdp.py)
    pod_devices: tuple[str, ...] = ()  # --ebpf-pod-devices: name patterns (pod_devices.py)
    nat_ports: tuple[int, int] | None = None  # (first, count); None: nat_ports.for_this_node

    @property
    def dir(self) -> Path:
        return self.pin_dir / TC_SUBDIR

    def link_pin(self, device: str, hook: str) -> Path:
        return self.dir / f"{LINK_PREFIX}{pin_device(device)}_{hook}"


class TcxInfo(ctypes.Structure):
    """struct bpf_link_info, as far as tcx links go."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("ifindex", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("_rest", ctypes.c_uint8 * 40)]


def _tcx_info(fd: int) -> TcxInfo:
    info = TcxInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    libbpf.check(libbpf.lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)),
                 "link info")
    return info


def _lib() -> ctypes.CDLL:
    """libbpf, with the two calls the packet path needs beyond the socket path's."""
    lib = libbpf.lib()
    lib.bpf_map__initial_value.restype = ctypes.c_void_p
    lib.bpf_map__initial_value.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.bpf_map__set_value_size.restype = ctypes.c_int
    lib.bpf_map__set_value_size.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    return lib


class PacketPrograms:
    """The loaded tc object: its maps by name; the links stay pinned after ``close``."""

    def __init__(self, layout: PacketLayout) -> None:
        self.layout = layout
        self._obj: int | None = None
        self.maps: dict[str, Map] = {}
        self.attached: dict[str, int] = {}  # device -> the ifindex its links are on
        self.tc_modes: dict[str, str] = {}  # device -> 'tcx' or 'clsact' (the fallback)
        self.tcx = True  # False once the kernel refused a tcx link: clsact from then on
        self.xdp_modes: dict[str, str] = {}  # device -> its XDP mode, '' for none

    def load(self) -> PacketPrograms:
        layout = self.layout
        if not layout.object_path.exists():
            raise LoadError(f"{layout.object_path} is missing: build it with "
                            "`python -m svcproxy.backends.ebpf.build` (needs clang)")
        parent = layout.pin_dir if layout.pin_dir.exists() else layout.pin_dir.parent
        try:
            on_bpffs = fs_type(str(parent)) == BPF_FS_MAGIC
        except OSError:
            on_bpffs = False
        if not on_bpffs:
            raise LoadError(f"--ebpf-pin-dir {layout.pin_dir} is not on a bpf filesystem; "
                            "mount one (mount -t bpf bpf /sys/fs/bpf)")
        layout.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lib = _lib()
        obj = libbpf.check_ptr(lib.bpf_object__open_file(str(layout.object_path).encode(), None),
                               f"open {layout.object_path}")
        self._obj = obj
        try:
            self._prepare(obj)
            result = lib.bpf_object__load(obj)
            if result < 0:
                raise LoadError(
                    f"loading {layout.object_path} failed: {os.strerror(-result)} (libbpf's "
                    "message above says more). If the maps pinned in "
                    f"{layout.dir} were made with other sizes (--ebpf-maglev-table-size, "
                    "--ebpf-max-flows), run --cleanup first")
            for name in TC_MAPS:
                m = lib.bpf_object__find_map_by_name(obj, name.encode())
                key, value = SIZES.get(name, (4, 2 * layout.maglev_size))
                self.maps[name] = Map(name, lib.bpf_map__fd(m), key, value)
            self._pin_constants(obj)
            self.refresh()
            for device in layout.devices:
                if device not in self.attached:
                    log.warning("--ebpf-devices: no device %s here yet; its tc programs are "
                                "attached when it appears", device)
        except BaseException:
            self.close()
            raise
        return self

    def _prepare(self, obj: int) -> None:
        lib = _lib()
        first, count = self.layout.nat_ports or nat_ports.for_this_node()
        rodata.set_constants(obj, {"maglev_size": self.layout.maglev_size,
                                   "dsr_enabled": int(self.layout.dsr),
                                   "nat_port_min": first, "nat_port_span": count})
        set_timeouts(obj, self.layout.ct_timeouts)
        sizes = {TC_MAP_SERVICES: self.layout.max_services, TC_MAP_MAGLEV: self.layout.max_services,
                 TC_MAP_ENDPOINTS: self.layout.max_endpoints, TC_MAP_CT: self.layout.max_flows}
        for name in TC_MAPS:
            m = libbpf.check_ptr(lib.bpf_object__find_map_by_name(obj, name.encode()),
                                 f"map {name}")
            if name in sizes:
                libbpf.check(lib.bpf_map__set_max_entries(m, sizes[name]), f"size {name}")
            if name == TC_MAP_MAGLEV:
                libbpf.check(lib.bpf_map__set_value_size(m, 2 * self.layout.maglev_size),
                             f"value size {name}")
            libbpf.check(lib.bpf_map__set_pin_path(m, str(self.layout.dir / name).encode()),
                         f"pin path {name}")

    def _pin_constants(self, obj: int) -> None:
        """Pin the loaded program's constants (its ``.rodata``: the NAT port range among
        them) as ``spp_constants``, replacing the last load's, for ``--dump``."""
        rodata_map = libbpf.check_ptr(libbpf.lib().bpf_object__find_map_by_name(obj, b".rodata"),
                                      ".rodata")
        pin = self.layout.dir / TC_CONSTANTS
        staged = pin.with_name(f"tmp_{pin.name}")
        staged.unlink(missing_ok=True)
        libbpf.obj_pin(libbpf.lib().bpf_map__fd(rodata_map), str(staged))
        os.replace(staged, pin)

    def refresh(self) -> list[str]:
        """Attach the programs to every named device, and every device matching
        ``--ebpf-pod-devices``, that is here and not attached yet (one that appeared, or
        was made again: its old links went with it); returns those."""
        assert self._obj is not None
        done = []
        named = self.layout.devices
        pods = pod_devices.matching(self.layout.pod_devices, named)
        for device in [d for d in self.attached if d not in named and d not in pods]:
            self.attached.pop(device)
            self.tc_modes.pop(device, None)
        device_pins.sweep(self.layout.dir, (*named, *pods))
        for device in (*named, *pods):
            try:
                ifindex = socket.if_nametoindex(device)
            except OSError:
                self.attached.pop(device, None)
                self.xdp_modes.pop(device, None)
                self.tc_modes.pop(device, None)
                continue
            if self.attached.get(device) != ifindex:
                self._attach_device(self._obj, device, ifindex)
                self.attached[device] = ifindex
                done.append(device)
        return done

    def _attach_device(self, obj: int, device: str, ifindex: int) -> None:
        """Both programs on ``device``: by tcx links, or by the clsact fallback when the
        device is pinned that way or the kernel has no tcx."""
        lib = libbpf.lib()
        programs = {}
        for hook, (program, _) in HOOKS.items():
            prog = libbpf.check_ptr(lib.bpf_object__find_program_by_name(obj, program.encode()),
                                    f"program {program}")
            programs[hook] = lib.bpf_program__fd(prog)
        mode = "clsact" if clsact.pinned(self.layout.dir, device) or not self.tcx else "tcx"
        if mode == "tcx":
            mode = self._attach_tcx(device, ifindex, programs)
        if mode == "clsact":
            for hook, prog_fd in programs.items():
                try:
                    clsact.attach(self.layout.dir, device, ifindex, hook, prog_fd)
                except BpfError as err:
                    raise LoadError(f"attaching tc {hook} to {device} (clsact qdisc and tc "
                                    f"filter): {err.strerror}") from None
            log.info("tc programs attached to %s by a clsact qdisc and direct-action tc "
                     "filters (pref %d)", device, clsact.PRIORITY)
        self.tc_modes[device] = mode
        if device in self.layout.devices:  # not on pods' devices (--ebpf-pod-devices)
            self.xdp_modes[device] = xdp.serve(obj, self.layout.dir, device, ifindex,
                                               self.layout.xdp)

    def _attach_tcx(self, device: str, ifindex: int, programs: dict[str, int]) -> str:
        """Both programs by tcx links; 'clsact' when the kernel has no tcx (said once)."""
        for hook, (_, attach_type) in HOOKS.items():
            try:
                self._attach(device, hook, programs[hook], ifindex, attach_type)
            except BpfError as err:
                if err.errno not in NO_TCX:
                    raise LoadError(f"attaching tc {hook} to {device}: {err.strerror}") from None
                log.warning("This kernel lacks tcx links (Linux 6.6): the tc programs are "
                            "attached by a clsact qdisc and direct-action tc filters instead "
                            "(%s)", err.strerror)
                self.tcx = False
                for pin in device_pins.link_pins(self.layout.dir, device):
                    if "_xdp_" not in pin.name:
                        pin.unlink()
                return "clsact"
        return "tcx"

    def _attach(self, device: str, hook: str, prog_fd: int, ifindex: int,
                attach_type: int) -> None:
        """Switch the pinned link to ``prog_fd``, or create and pin a new one."""
        lib = libbpf.lib()
        pin = self.layout.link_pin(device, hook)
        if pin.exists():
            fd = libbpf.obj_get(str(pin))
            try:
                info = _tcx_info(fd)
                if (info.type == LINK_TYPE_TCX and info.ifindex == ifindex
                        and info.attach_type == attach_type):
                    libbpf.check(lib.bpf_link_update(fd, prog_fd, None),
                                 f"update link {pin.name}")
                    log.debug("Adopted link %s (program replaced in place)", pin)
                    return
                log.info("Link %s is attached elsewhere (device gone?); replacing it", pin)
                lib.bpf_link_detach(fd)
            finally:
                os.close(fd)
            pin.unlink()
        fd = create_tcx_link(prog_fd, ifindex, attach_type, f"attach {device} {hook}")
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


def create_tcx_link(prog_fd: int, ifindex: int, attach_type: int, what: str) -> int:
    """A new tcx link of ``prog_fd`` on ``ifindex`` (its fd); BpfError with EINVAL on a
    kernel before 6.6, which knows no such attach type."""
    return libbpf.check(libbpf.lib().bpf_link_create(prog_fd, ifindex, attach_type, None), what)


def remove_packet_pins(pin_dir: Path) -> list[str]:
    """Detach every pinned tc link and remove the packet path's pins and directory (then
    ``pin_dir`` itself if nothing else is left in it). Returns what was removed."""
    removed: list[str] = []
    tc_dir = pin_dir / TC_SUBDIR
    if not tc_dir.is_dir():
        return removed
    for device in sorted(device_pins.pinned_devices(tc_dir)):
        removed += device_pins.release(tc_dir, device)
    lib = libbpf.lib()
    for pin in sorted(tc_dir.glob(f"{LINK_PREFIX}*")):
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
    for name in (*TC_MAPS, TC_CONSTANTS):
        pin = tc_dir / name
        if pin.exists():
            pin.unlink()
            removed.append(pin.name)
    for path in (tc_dir, pin_dir):
        try:
            path.rmdir()
        except OSError:
            break
    return removed
