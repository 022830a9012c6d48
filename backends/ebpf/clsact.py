"""The tc programs attached the way kernels before tcx (Linux 6.6) take them: a clsact
qdisc on the device and one tc filter per hook, direct-action (as Cilium and Calico did
before tcx), made through libbpf's ``bpf_tc_*`` netlink calls.

A tc filter is no BPF object, so the pins say what is ours: ``filter_<device>_<hook>``
holds the program the filter runs (a restart replaces the filter's program in place,
``BPF_TC_F_REPLACE``, and pins the new one), ``qdisc_<device>`` (the ingress program
again, as a marker) says svcproxy made the device's clsact qdisc, so removing the
filters removes that qdisc too and never one something else made.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from svcproxy.sdk import netlink

from . import libbpf
from .libbpf import BpfError
from .names import device_of_pin, pin_device

log = logging.getLogger(__name__)

TC_INGRESS, TC_EGRESS = 1 << 0, 1 << 1  # enum bpf_tc_attach_point
POINTS = {"ingress": TC_INGRESS, "egress": TC_EGRESS}
F_REPLACE = 1 << 0  # BPF_TC_F_REPLACE
HANDLE, PRIORITY = 1, 1  # the filter's handle and pref, as Cilium's (tc filter show: pref 1)
FILTER_PREFIX, QDISC_PREFIX = "filter_", "qdisc_"
RTM_NEWTFILTER, RTM_GETTFILTER = 44, 46
PARENTS = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}  # TC_H_MAKE(TC_H_CLSACT, MIN_*)
_TCMSG = struct.Struct("=BxxxiIII")  # struct tcmsg: family, ifindex, handle, parent, info


class _Hook(ctypes.Structure):
    """struct bpf_tc_hook."""

    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int),
                ("attach_point", ctypes.c_int), ("parent", ctypes.c_uint32)]


class _Opts(ctypes.Structure):
    """struct bpf_tc_opts."""

    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("handle", ctypes.c_uint32),
                ("priority", ctypes.c_uint32)]


@cache
def _lib() -> ctypes.CDLL:
    lib = libbpf.lib()
    for name in ("bpf_tc_hook_create", "bpf_tc_hook_destroy"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [ctypes.POINTER(_Hook)]
    for name in ("bpf_tc_attach", "bpf_tc_detach", "bpf_tc_query"):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [ctypes.POINTER(_Hook), ctypes.POINTER(_Opts)]
    return lib


def _hook(ifindex: int, points: int) -> _Hook:
    return _Hook(sz=ctypes.sizeof(_Hook), ifindex=ifindex, attach_point=points)


def _opts(prog_fd: int = 0, flags: int = 0) -> _Opts:
    return _Opts(sz=ctypes.sizeof(_Opts), prog_fd=prog_fd, flags=flags, handle=HANDLE,
                 priority=PRIORITY)


def filter_pin(tc_dir: Path, device: str, hook: str) -> Path:
    return tc_dir / f"{FILTER_PREFIX}{pin_device(device)}_{hook}"


def qdisc_pin(tc_dir: Path, device: str) -> Path:
    return tc_dir / f"{QDISC_PREFIX}{pin_device(device)}"


def pinned(tc_dir: Path, device: str) -> bool:
    """Whether ``device`` has filters of ours pinned (it runs in this mode)."""
    return any(filter_pin(tc_dir, device, hook).exists() for hook in POINTS)


def prog_id(fd: int) -> int:
    """The id of the program ``fd`` refers to (struct bpf_prog_info's first two fields)."""
    info = (ctypes.c_uint32 * 2)()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    libbpf.check(libbpf.lib().bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)),
                 "program info")
    return int(info[1])


def query(ifindex: int, hook: str) -> int:
    """The id of the program the filter at our handle and pref runs, 0 without one."""
    opts = _opts()
    result = _lib().bpf_tc_query(ctypes.byref(_hook(ifindex, POINTS[hook])), ctypes.byref(opts))
    if result in (-errno.ENOENT, -errno.EINVAL):  # EINVAL: no filter chain on the hook yet
        return 0
    libbpf.check(result, "tc filter query")
    return int(opts.prog_id)


def attach(tc_dir: Path, device: str, ifindex: int, hook: str, prog_fd: int) -> None:
    """Run ``prog_fd`` on ``device``'s ``hook`` as a direct-action tc filter: the clsact
    qdisc made when missing (and marked ours), our filter's program replaced in place, a
    new filter added; the program pinned as the filter's. BpfError when the kernel
    refuses; a filter at our handle and pref that is not ours is refused too."""
    lib = _lib()
    pin = filter_pin(tc_dir, device, hook)
    existing = query(ifindex, hook)
    if not existing:  # else the qdisc is there (a restart: the filter is adopted)
        made = lib.bpf_tc_hook_create(ctypes.byref(_hook(ifindex, TC_INGRESS | TC_EGRESS)))
        if made == 0:
            _pin_replacing(prog_fd, qdisc_pin(tc_dir, device))
            log.info("Made a clsact qdisc on %s for the tc programs", device)
        elif made != -errno.EEXIST:
            libbpf.check(made, f"clsact qdisc on {device}")
    elif not pin.exists():
        raise BpfError(errno.EEXIST, f"{device} already has a tc {hook} filter at pref "
                       f"{PRIORITY} handle {HANDLE} that svcproxy did not make; remove it "
                       f"(tc filter del dev {device} {hook} pref {PRIORITY})")
    libbpf.check(lib.bpf_tc_attach(ctypes.byref(_hook(ifindex, POINTS[hook])),
                                   ctypes.byref(_opts(prog_fd, F_REPLACE))),
                 f"tc {hook} filter on {device}")
    _pin_replacing(prog_fd, pin)
    if qdisc_pin(tc_dir, device).exists():  # the marker holds the current program too
        _pin_replacing(prog_fd, qdisc_pin(tc_dir, device))


def _pin_replacing(fd: int, path: Path) -> None:
    """Pin ``fd`` at ``path``, replacing what is there in one rename (a crash leaves
    the old pin or the new one, never none)."""
    staged = path.with_name(f"tmp_{path.name}")
    staged.unlink(missing_ok=True)
    libbpf.obj_pin(fd, str(staged))
    os.replace(staged, path)


def devices(tc_dir: Path) -> set[str]:
    """The devices with filter or qdisc pins of ours."""
    found = {p.name.removeprefix(QDISC_PREFIX) for p in tc_dir.glob(f"{QDISC_PREFIX}*")}
    for pin in tc_dir.glob(f"{FILTER_PREFIX}*"):
        found.add(pin.name.removeprefix(FILTER_PREFIX).rpartition("_")[0])
    return {device_of_pin(name) for name in found}


def forget(tc_dir: Path, device: str) -> list[str]:
    """Remove ``device``'s pins (its filters and qdisc went with it); returns them."""
    pins = [*(filter_pin(tc_dir, device, hook) for hook in POINTS), qdisc_pin(tc_dir, device)]
    gone = [p.name for p in pins if p.exists()]
    for pin in pins:
        pin.unlink(missing_ok=True)
    return gone


def detach(tc_dir: Path, device: str) -> list[str]:
    """Remove our filters from ``device`` (when it is still here and each still runs our
    pinned program), then the clsact qdisc when we made it and no filter of someone
    else's is on it, then the pins; returns them."""
    try:
        ifindex = socket.if_nametoindex(device)
    except OSError:
        return forget(tc_dir, device)
    lib = _lib()
    for hook in POINTS:
        pin = filter_pin(tc_dir, device, hook)
        if not pin.exists():
            continue
        fd = libbpf.obj_get(str(pin))
        try:
            ours = prog_id(fd)
        finally:
            os.close(fd)
        if query(ifindex, hook) == ours:
            libbpf.check(lib.bpf_tc_detach(ctypes.byref(_hook(ifindex, POINTS[hook])),
                                           ctypes.byref(_opts())), f"tc {hook} filter")
        else:
            log.warning("The tc %s filter on %s no longer runs svcproxy's program; left "
                        "alone", hook, device)
    if qdisc_pin(tc_dir, device).exists():
        others = sum(filter_count(ifindex, hook) for hook in POINTS)
        if others:
            log.warning("Leaving the clsact qdisc svcproxy made on %s: it holds %d filter "
                        "entries of someone else's", device, others)
        else:
            result = lib.bpf_tc_hook_destroy(ctypes.byref(_hook(ifindex,
                                                                TC_INGRESS | TC_EGRESS)))
            if result not in (0, -errno.ENOENT, -errno.EINVAL):
                libbpf.check(result, f"clsact qdisc on {device}")
    return forget(tc_dir, device)


def filter_count(ifindex: int, hook: str) -> int:
    """How many filter entries the device's clsact ``hook`` holds (an rtnetlink dump)."""
    body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, PARENTS[hook], 0)
    count = 0
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        sock.sendall(netlink.message(RTM_GETTFILTER, netlink.NLM_F_REQUEST | netlink.NLM_F_DUMP,
                                     1, body))
        while True:
            for kind, _flags, _seq, msg in netlink.messages(sock.recv(1 << 16)):
                if kind == netlink.NLMSG_DONE:
                    return count
                if kind == netlink.NLMSG_ERROR:
                    if code := netlink.error_code(msg):
                        raise OSError(code, f"tc filter dump: {os.strerror(code)}")
                    return count
                count += kind == RTM_NEWTFILTER


def dump_lines(tc_dir: Path) -> Iterator[str]:
    """``--dump``: each device served by tc filters, and whether its qdisc is ours."""
    for device in sorted(devices(tc_dir)):
        whose = "made by svcproxy" if qdisc_pin(tc_dir, device).exists() else "already there"
        yield (f"tc {device}: clsact qdisc ({whose}) + tc filters pref {PRIORITY} "
               "direct-action (no tcx links on this kernel)")
