"""Attach the packet path's XDP program (``--ebpf-xdp``) to a device as a pinned link.

The mode is native (the driver runs it) where the driver has XDP and the flag allows
it, else generic (the kernel runs it on the socket buffer); each mode has its program
(``PROGRAMS``: the native one sends only back out of its device, XDP_TX, and leaves a
packet for another device to tc, since a redirect into a device without ndo_xdp_xmit,
a bridge, is dropped). The pin's name says which
(``link_<device>_xdp_native`` / ``_xdp_generic``), so a restarted backend, ``--dump`` and
the metrics know it without asking the kernel. A restarted backend switches the pinned
link to its new program in place, as for the tc links.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from . import libbpf
from .libbpf import BpfError
from .names import device_of_pin, pin_device

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

log = logging.getLogger(__name__)

PROGRAMS = {"native": "spp_xdp_native", "generic": "spp_xdp"}  # native: XDP_TX only
STATS_MAP = "spp_xdp_stats"
STATS = ("reply", "forward", "new", "pass", "picked")  # XDP_STAT_* in bpf/xdp.h
MODES = ("off", "auto", "native", "generic")
ATTACH_XDP = 37  # enum bpf_attach_type BPF_XDP
LINK_TYPE_XDP = 6
FLAGS = {"generic": 1 << 1, "native": 1 << 2}  # XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE


class _LinkCreateOpts(ctypes.Structure):
    """struct bpf_link_create_opts up to its flags."""

    _fields_ = [("sz", ctypes.c_size_t), ("flags", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _XdpInfo(ctypes.Structure):
    """struct bpf_link_info, as far as XDP links go."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("_pad", ctypes.c_uint32),
                ("ifindex", ctypes.c_uint32), ("_rest", ctypes.c_uint8 * 44)]


def pin(pin_dir: Path, device: str, mode: str) -> Path:
    return pin_dir / f"link_{pin_device(device)}_xdp_{mode}"


def pinned_mode(pin_dir: Path, device: str) -> str:
    """The mode of the device's pinned XDP link, '' without one."""
    return next((m for m in ("native", "generic") if pin(pin_dir, device, m).exists()), "")


def _info(fd: int) -> _XdpInfo:
    info = _XdpInfo()
    size = ctypes.c_uint32(ctypes.sizeof(info))
    libbpf.check(libbpf.lib().bpf_obj_get_info_by_fd(fd, ctypes.byref(info), ctypes.byref(size)),
                 "link info")
    return info


def _adopt(path: Path, prog_fd: int, ifindex: int) -> bool:
    """Switch the pinned link to ``prog_fd`` when it is an XDP link on ``ifindex``; else
    detach and unpin it. True when adopted."""
    fd = libbpf.obj_get(str(path))
    try:
        info = _info(fd)
        if info.type == LINK_TYPE_XDP and info.ifindex == ifindex:
            libbpf.check(libbpf.lib().bpf_link_update(fd, prog_fd, None),
                         f"update link {path.name}")
            return True
    finally:
        os.close(fd)
    drop(path)
    return False


def drop(path: Path) -> None:
    """Detach the pinned link and remove its pin."""
    fd = libbpf.obj_get(str(path))
    try:
        libbpf.lib().bpf_link_detach(fd)
    finally:
        os.close(fd)
    path.unlink()


def _create(prog_fd: int, ifindex: int, mode: str) -> int:
    opts = _LinkCreateOpts(sz=ctypes.sizeof(_LinkCreateOpts), flags=FLAGS[mode])
    return libbpf.check(libbpf.lib().bpf_link_create(prog_fd, ifindex, ATTACH_XDP,
                                                      ctypes.byref(opts)), f"XDP {mode}")


def attach(pin_dir: Path, device: str, ifindex: int, prog_fds: dict[str, int],
           wanted: str) -> str:
    """Attach (or adopt) the XDP program of the ``wanted`` mode (``prog_fds``: mode ->
    program) on ``device`` ('auto': native where the driver has it, else generic);
    returns the mode. BpfError when it cannot attach (the caller leaves the device to
    tc)."""
    modes = ("native", "generic") if wanted == "auto" else (wanted,)
    for mode in ("native", "generic"):
        path = pin(pin_dir, device, mode)
        if path.exists():
            if mode in modes and _adopt(path, prog_fds[mode], ifindex):
                return mode
            if path.exists():  # pinned in a mode no longer wanted
                drop(path)
    failure: BpfError | None = None
    for mode in modes:
        try:
            fd = _create(prog_fds[mode], ifindex, mode)
        except BpfError as err:
            failure = err
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, 524):  # 524: ENOTSUPP
                break
            continue
        try:
            libbpf.obj_pin(fd, str(pin(pin_dir, device, mode)))
        finally:
            os.close(fd)
        return mode
    assert failure is not None
    raise failure


def serve(obj: int, pin_dir: Path, device: str, ifindex: int, wanted: str) -> str:
    """Attach the object's XDP program to ``device`` as ``--ebpf-xdp`` wants (with 'off',
    detach a pinned one); returns the mode, '' when none. A device where it cannot
    attach is logged (once: this runs when the device is attached) and left to tc."""
    if wanted == "off":
        for mode in ("native", "generic"):
            if pin(pin_dir, device, mode).exists():
                drop(pin(pin_dir, device, mode))
        return ""
    lib = libbpf.lib()
    fds = {mode: lib.bpf_program__fd(libbpf.check_ptr(
        lib.bpf_object__find_program_by_name(obj, name.encode()), f"program {name}"))
        for mode, name in PROGRAMS.items()}
    try:
        mode = attach(pin_dir, device, ifindex, fds, wanted)
    except BpfError as err:
        log.warning("--ebpf-xdp: the XDP program cannot attach to %s (%s); the tc programs "
                    "serve it alone", device, err.strerror)
        return ""
    log.info("XDP program attached to %s in %s mode", device, mode)
    return mode


def read_stats(fd: int) -> dict[str, int]:
    """The XDP program's per-CPU counters, summed: action -> packets."""
    lib = libbpf.lib()
    lib.libbpf_num_possible_cpus.restype = ctypes.c_int
    ncpu = libbpf.check(lib.libbpf_num_possible_cpus(), "possible CPUs")
    found = {}
    for index, name in enumerate(STATS):
        key = ctypes.c_uint32(index)
        values = (ctypes.c_uint64 * max(ncpu, 1))()
        if lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values) == 0:
            found[name] = sum(values)
    return found


def metrics(modes: dict[str, str], stats_fd: int) -> Iterator[Metric]:
    """svcproxy_ebpf_xdp_attached{device,mode} (1 for the mode the device runs the XDP
    program in; 0 with mode "none" where it could not attach) and
    svcproxy_ebpf_xdp_packets_total{action}."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    attached = GaugeMetricFamily("svcproxy_ebpf_xdp_attached",
                                 "1 when the XDP program runs on the device, in this mode "
                                 "(native or generic; none: the tc programs serve it alone)",
                                 labels=["device", "mode"])
    for device, mode in sorted(modes.items()):
        attached.add_metric([device, mode or "none"], 1 if mode else 0)
    packets = CounterMetricFamily("svcproxy_ebpf_xdp_packets",
                                  "Packets the XDP program handled, by what it did (reply, "
                                  "forward, new: sent on by XDP; picked: a new flow picked and "
                                  "tracked, then passed to tc; pass: left to tc)",
                                  labels=["action"])
    for action, count in read_stats(stats_fd).items():
        packets.add_metric([action], count)
    yield attached
    yield packets


def dump_lines(tc_dir: Path) -> Iterator[str]:
    """``--dump``: each device's XDP mode (from the pins) and the program's counters."""
    pins = sorted(tc_dir.glob("link_*_xdp_*"))
    for path in pins:
        device, _, mode = path.name.removeprefix("link_").rpartition("_xdp_")
        yield f"xdp {device_of_pin(device)}: {mode} mode"
    stats = tc_dir / STATS_MAP
    if pins and stats.exists():
        fd = libbpf.obj_get(str(stats))
        try:
            counts = read_stats(fd)
        finally:
            os.close(fd)
        yield "# xdp packets: " + ", ".join(f"{n} {a}" for a, n in counts.items())
