"""The tc packet path's connection tracking GC pass at N flows (root; a bpffs it mounts).

    sudo .venv/bin/python bench/bench_ebpf_ct_gc.py [--flows 100000] [--rounds 3]

Loads the tc object (attached to no device) into a temporary bpffs, fills spp_ct with
``--flows`` flows (a forward and a reply entry each; half of them expired for their
state: SYN-only, unanswered UDP, closed TCP), runs one GC pass and reports its time,
what it removed and kept; then the same with the pass as it was before (the map read
into a dict, each entry judged by slicing it, a lookup and a delete per expired key; no
C helper), alternating which goes first each round. The pins and the mount are removed
at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from svcproxy.backends.ebpf import ct_gc_native, libbpf
from svcproxy.backends.ebpf.ct_gc import (
    CTS_FIN_FWD,
    CTS_FIN_REV,
    CTS_REPLIED,
    CtTimeouts,
    GcResult,
    _forward_key_of,
    _reply_key_of,
    gc_pass,
)
from svcproxy.backends.ebpf.libbpf import Map
from svcproxy.backends.ebpf.names import TC_MAP_CT
from svcproxy.backends.ebpf.packet_layout import CT_FORWARD, CT_KEY, CT_REPLY, CT_SNAT, CT_VAL
from svcproxy.backends.ebpf.packet_loader import PacketLayout, PacketPrograms, remove_packet_pins

NS = 1_000_000_000
KINDS = (  # (proto, state, idle seconds): live, expired, live, expired, expired, live
    (socket.IPPROTO_TCP, CTS_REPLIED, 7200), (socket.IPPROTO_TCP, 0, 120),
    (socket.IPPROTO_UDP, CTS_REPLIED, 60), (socket.IPPROTO_UDP, 0, 40),
    (socket.IPPROTO_TCP, CTS_REPLIED | CTS_FIN_FWD | CTS_FIN_REV, 20),
    (socket.IPPROTO_TCP, CTS_REPLIED | CTS_FIN_FWD, 1800),
)


def flows(count: int, now: int) -> tuple[list[bytes], list[bytes]]:
    keys, values = [], []
    svc, snat = socket.inet_aton("192.168.99.1") + bytes(12), socket.inet_aton("192.168.99.2")
    snat += bytes(12)
    for i in range(count):
        proto, state, idle = KINDS[i % len(KINDS)]
        client = bytes((10, 200 + (i >> 16), (i >> 8) & 255, i & 255)) + bytes(12)
        endpoint = bytes((10, 240 + (i >> 16), (i >> 8) & 255, i & 255)) + bytes(12)
        cport, nport = (40000).to_bytes(2, "big"), (32768 + i % 32768).to_bytes(2, "big")
        sport, eport = (80).to_bytes(2, "big"), (8080).to_bytes(2, "big")
        last = now - idle * NS
        keys += [CT_KEY.pack(client, svc, cport, sport, proto, 4, CT_FORWARD, 0),
                 CT_KEY.pack(endpoint, snat, eport, nport, proto, 4, CT_REPLY, 0)]
        values += [CT_VAL.pack(snat, endpoint, nport, eport, CT_SNAT, state, 1, last),
                   CT_VAL.pack(svc, client, sport, cport, CT_SNAT, 0, 0, last)]
    return keys, values


def before_pass(ct: Map, timeouts: CtTimeouts) -> GcResult:
    """The pass before the columnwise judgement and atomic deletes, for comparison."""
    started = time.monotonic()
    now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    entries = ct.read_all()
    alive, dead = set(), []
    for key, value in entries.items():
        if key[38] == CT_FORWARD:
            idle = int.from_bytes(value[48:56], "little") < now_ns - timeouts.lifetime(
                key[36], value[37]) * NS
            (dead.append if idle else alive.add)(key)
    for key, value in entries.items():
        if key[38] == CT_FORWARD:
            continue
        forward = _forward_key_of(key, value)
        fvalue = entries.get(forward)
        if fvalue is not None and _reply_key_of(forward, fvalue) == key:
            if forward not in alive:
                dead.append(key)
        elif now_ns - int.from_bytes(value[48:56], "little") > timeouts.lifetime(
                key[36], 0) * NS:
            dead.append(key)
    lib = libbpf.lib()
    buf = ctypes.create_string_buffer(ct.value_size)
    removed = 0
    for key in dead:
        if (lib.bpf_map_lookup_elem(ct.fd, key, buf) == 0 and buf.raw == entries[key]
                and lib.bpf_map_delete_elem(ct.fd, key) == 0):
            removed += 1
    return GcResult(len(alive), removed, time.monotonic() - started)


def timed(name: str, ct: Map, count: int, run: Callable[[Map, CtTimeouts], GcResult]) -> None:
    """Fill ``ct``, run one pass, print it, empty the map."""
    keys, values = flows(count, time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    ct.update_many(keys, values)
    cpu = time.process_time()
    result = run(ct, CtTimeouts())
    cpu = time.process_time() - cpu
    print(f"{name}: {len(keys)} entries: GC pass {result.seconds:.2f} s ({cpu:.2f} s CPU), "
          f"{result.expired} removed, {result.flows} flows kept")
    ct.delete_many([k for k, _ in ct.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bpffs = Path(tempfile.mkdtemp(prefix="ctgc-"))
    subprocess.run(["mount", "-t", "bpf", "bpf", str(bpffs)], check=True)
    try:
        layout = PacketLayout(bpffs / "pins", (), max_flows=max(262144, 3 * args.flows))
        programs = PacketPrograms(layout).load()
        ct = programs.maps[TC_MAP_CT]
        try:
            for i in range(args.rounds):
                now = "now (C helper)" if ct_gc_native.available() else "now (Python)"
                passes = [(now, gc_pass), ("before", before_pass)]
                for name, run in passes[::1 if i % 2 == 0 else -1]:
                    timed(name, ct, args.flows, run)
        finally:
            programs.close()
            remove_packet_pins(layout.pin_dir)
    finally:
        subprocess.run(["umount", str(bpffs)], capture_output=True)
        shutil.rmtree(bpffs, ignore_errors=True)


if __name__ == "__main__":
    main()
