"""NodePort forwarding to an endpoint on another node, side by side: ``--ebpf-packet-path
bpf`` (tc), the same with ``--ebpf-xdp generic`` in front, nft and iptables.

Run as root. Builds the test lab (tests/support/lab: a LAN bridge, nodes with pod
bridges, a client on the LAN) with one ingress node per dataplane and one endpoint
node, ``ep``, holding pod-c; every ingress node loads the same ``--services`` fillers
(a ClusterIP, an externalIP and one endpoint each) plus the NodePort measured (TCP and
UDP, port 30080), whose one endpoint is pod-c: every flow is DNATed and SNATed on the
ingress node and its replies reversed there. A node of its own, ``routed``, loads
nothing: the client reaches pod-c's address through it (routing alone, the floor every
dataplane's figures stand on). All dataplanes are loaded at once, each in
its own node, so rounds switch dataplane by the address the client dials: each round
measures every dataplane once (A B C D, then B C D A, ...), so a change of the
machine's load hits all of them alike. Per dataplane and round, the best of ``--tries``
runs (the least disturbed by the neighbours, as timeit keeps the fastest):

- ``--connects`` new TCP connections, one after another (connect, read the greeting,
  the server closes): connections per second, the client thread's CPU per connection
  (veths hand packets on in the sender's softirq, so it carries the handshake through
  every hop and does not count time waiting for a CPU), and connect()'s latency over
  all runs (SYN out to SYN/ACK in: the first packet's path) p50 and p99;
- a burst of ``--packets`` UDP datagrams on one flow (sendmmsg, 64 per call), counted
  where pod-c's UDP layer takes them: delivered packets per second, the sender's CPU
  per delivered packet, the share delivered (over all bursts).

Printed per size: each figure's median over the rounds [lowest, highest], its ratio to
nft's figure of the same round (median [lowest, highest]), each dataplane's CPU per
connection and per packet above the floor's of the same round, the load average, the
time each dataplane took to load; at the end, each dataplane's figures at the largest
size over the smallest, both relative to the floor of their rounds (flat in services:
1.00). The Python client sets a floor common to all four, so ratios say more than
absolute figures. The client's and pod-c's veths send
whole checksums (XDP needs them: tests/support/lab/checksums.py). Everything is removed
on the way out (namespaces, programs, pins, the bpffs mount), also on failure.

``--json`` saves each size's per-round figures, ``--svg`` draws CPU per packet and
connect()'s p50 per dataplane over the sizes (bench/packet_path_plot.py), and
``--plot-only`` draws ``--svg`` again from a saved ``--json`` (no root, no lab).

Usage: .venv/bin/python bench/bench_packet_path.py [--sizes 100,10000,30000]
       [--rounds 7] [--tries 3] [--connects 100] [--packets 10000]
       [--dataplanes tc,xdp,nft,iptables,routed] [--json FILE] [--svg FILE]
       .venv/bin/python bench/bench_packet_path.py --plot-only FILE --svg FILE
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import packet_path_plot, svgplot  # noqa: E402
from bench.packet_path_figures import (  # noqa: E402
    paired_differences,
    paired_ratios,
    percentile,
    rotated,
    spread,
)
from bench.packet_path_traffic import (  # noqa: E402
    SERVER,
    Burst,
    connect_loop,
    udp_burst,
    udp_received,
)
from svcproxy.backends.ebpf.packet_backend import PacketBackend  # noqa: E402
from svcproxy.backends.ebpf.packet_loader import OBJECT, PacketLayout  # noqa: E402
from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions  # noqa: E402
from svcproxy.backends.nft.apply import NftRunner  # noqa: E402
from svcproxy.backends.nft.backend import NftBackend  # noqa: E402
from svcproxy.model import (  # noqa: E402
    Endpoint,
    Protocol,
    ServicePort,
    ServicePortKey,
    ServicePortState,
    ServiceType,
)
from svcproxy.sdk import Backend, Changes, NodeConfig, NodeState  # noqa: E402
from tests.support.lab.checksums import tx_checksums_off  # noqa: E402
from tests.support.lab.netns import call_in, ip  # noqa: E402
from tests.support.lab.plan import ClientSpec, LabSpec, NodeSpec, PodSpec  # noqa: E402
from tests.support.lab.topology import Lab  # noqa: E402

NODE_PORT, POD_PORT = 30080, 8080
LABELS = {"tc": "bpf (tc)", "xdp": "bpf (XDP generic)", "nft": "nft", "iptables": "iptables",
          "routed": "routed, no service (floor)"}
REFERENCE, FLOOR = "nft", "routed"
# (heading, key, decimals); higher is better for rates, lower for CPU and latency.
FIGURES = (("new conn/s", "conn_rate", 0), ("CPU us/conn", "conn_cpu", 0),
           ("connect p50 us", "p50", 0), ("connect p99 us", "p99", 0),
           ("packets/s", "pps", 0), ("CPU us/packet", "pkt_cpu", 2),
           ("delivered", "delivered", 3))


def lab_spec(names: list[str]) -> LabSpec:
    """An ingress node per dataplane (named after it), the endpoint node ``ep`` with
    pod-c, one client on the LAN."""
    nodes = tuple(NodeSpec(name, i + 1) for i, name in enumerate(names))
    ep = NodeSpec("ep", len(names) + 1)
    return LabSpec((*nodes, ep), (PodSpec("pod-c", ep, 10),), (ClientSpec("client", 100),),
                   entry=names[0])


def services(count: int, pod_ip: str) -> dict[ServicePortKey, ServicePortState]:
    """``count`` fillers and the measured NodePort (TCP and UDP), all to pod-c on ``ep``."""
    out = {}
    ep = {pod_ip: Endpoint(pod_ip, POD_PORT, node_name="ep", internal=True,
                           external=True, cluster=True)}
    for i in range(count):
        key = ServicePortKey("bench", f"s{i}", "p", Protocol.TCP)
        out[key] = ServicePortState(ServicePort(
            key, cluster_ips=(f"10.96.{i >> 8 & 255}.{i & 255}",), port=80,
            external_ips=(f"172.{16 + (i >> 16)}.{i >> 8 & 255}.{i & 255}",),
            has_endpoints=True), ep)
    for proto in (Protocol.TCP, Protocol.UDP):
        key = ServicePortKey("bench", "np", "p", proto)
        out[key] = ServicePortState(ServicePort(key, type=ServiceType.NODE_PORT,
                                                cluster_ips=("10.97.0.1",), port=80,
                                                node_port=NODE_PORT, has_endpoints=True), ep)
    return out


def target(lab: Lab, name: str) -> tuple[str, int]:
    """Where the client sends to go through ``name``: its NodePort, or (``routed``) pod-c
    itself, routed through that node with no service and no NAT (the lab's floor)."""
    if name == "routed":
        return lab.spec.pod("pod-c").ipv4, POD_PORT
    return lab.spec.node(name).ipv4, NODE_PORT


def route_floor(lab: Lab) -> None:
    """The client reaches pod-c through the ``routed`` node (pod-c answers straight over
    the LAN: the floor's replies skip a node)."""
    via = lab.spec.node("routed").ipv4
    ip(lab.ns("client"), "route", "add", f"{lab.spec.pod('pod-c').ipv4}/32", "via", via)


def make(name: str, lab: Lab, fs: Path, obj: Path) -> Backend | None:
    """Dataplane ``name``'s backend for its ingress node (none for ``routed``)."""
    if name == "routed":
        return None
    node = lab.spec.node(name)
    config = NodeConfig(node_name=name, node_ips=(node.ipv4,))
    prefix = ("ip", "netns", "exec", lab.ns(name))
    if name in ("tc", "xdp"):
        return PacketBackend(config, PacketLayout(fs / name, ("eth0",), object_path=obj,
                                                  xdp="generic" if name == "xdp" else "off"))
    if name == "nft":
        return NftBackend(config, NftRunner(prefix), families=(4,))
    return IptablesBackend(config, IptablesOptions(families=(4,), prefix=prefix))


def load(lab: Lab, name: str, backend: Backend | None, state: NodeState) -> float:
    """Wall seconds of the backend's first (full) sync, in its node's namespace."""
    t0 = time.perf_counter()
    if backend is not None:
        call_in(lab.ns(name), backend.sync, state, Changes(frozenset(state.services), full=True))
    return time.perf_counter() - t0


def check_xdp(lab: Lab) -> None:
    """The ``xdp`` node's eth0 runs an XDP program in generic mode (a device where XDP
    cannot attach is served by tc alone: its figures would be tc's under XDP's name)."""
    link = ip(lab.ns("xdp"), "link", "show", "dev", "eth0")
    if "xdpgeneric" not in link:
        raise RuntimeError(f"no generic XDP program on the xdp node's eth0: {link.strip()}")


def connects(lab: Lab, name: str, count: int, tries: int) -> dict[str, float]:
    """One round's connection figures through ``name``: ``tries`` runs of ``count``
    connections; the rate and CPU of the best run (the least disturbed by the
    neighbours, as timeit takes the fastest), the latencies of all."""
    host, port = target(lab, name)
    try:
        call_in(lab.ns("client"), connect_loop, host, port, 5)  # warm: neighbours
        runs = [call_in(lab.ns("client"), connect_loop, host, port, count)
                for _ in range(tries)]
    except OSError as err:
        raise RuntimeError(f"{LABELS[name]} does not forward {host}:{port} to pod-c "
                           f"({err}): check that its backend loaded (its log above)") from err
    latencies = [us for run in runs for us in run.latencies]
    return {"conn_rate": max(run.count / (run.end - run.start) for run in runs),
            "conn_cpu": min(run.cpu / run.count for run in runs) * 1e6,
            "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}


def one_burst(lab: Lab, name: str, packets: int) -> tuple[int, Burst, float]:
    """(datagrams delivered, the burst as sent, when the last arrived): counted at pod-c
    once its counter stops growing (polled at most 500 times)."""
    pod, (host, port) = lab.ns("pod-c"), target(lab, name)
    before = call_in(pod, udp_received)
    sent = call_in(lab.ns("client"), udp_burst, host, port, packets)
    got, last = call_in(pod, udp_received), sent.end
    for _ in range(500):
        time.sleep(0.002)
        now = call_in(pod, udp_received)
        if now == got:
            break
        got, last = now, time.perf_counter()
    if got <= before:
        raise RuntimeError(f"{LABELS[name]}: none of {sent.sent} datagrams reached pod-c")
    return got - before, sent, last


def bursts(lab: Lab, name: str, packets: int, tries: int) -> dict[str, float]:
    """One round's UDP figures through ``name``: the best of ``tries`` bursts."""
    runs = [one_burst(lab, name, packets) for _ in range(tries)]
    return {"pps": max(got / (last - sent.start) for got, sent, last in runs),
            "pkt_cpu": min(sent.cpu / got for got, sent, _ in runs) * 1e6,
            "delivered": sum(r[0] for r in runs) / max(sum(r[1].sent for r in runs), 1)}


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def measure_size(lab: Lab, names: list[str], backends: dict[str, Backend | None], size: int,
                 args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Load ``size`` services into every dataplane, run the rounds, print the figures;
    return each dataplane's per-round figures."""
    state = NodeState("bench", 1, None, services(size, lab.spec.pod("pod-c").ipv4))
    loads = {name: load(lab, name, backends[name], state) for name in names}
    if "xdp" in names:
        check_xdp(lab)
    if isinstance(ipt := backends.get("iptables"), IptablesBackend):
        print(f"iptables: iptables-{ipt.mode} (the node context's pick)", flush=True)
    rows: dict[str, dict[str, list[float]]] = {n: {f[1]: [] for f in FIGURES} for n in names}
    averages = [loadavg()]
    for round_ in range(args.rounds):
        for name in rotated(names, round_):
            figures = {**connects(lab, name, args.connects, args.tries),
                       **bursts(lab, name, args.packets, args.tries)}
            for key, value in figures.items():
                rows[name][key].append(value)
        averages.append(loadavg())
    show(size, names, rows, loads, averages)
    return rows


def show(size: int, names: list[str], rows: dict[str, dict[str, list[float]]],
         loads: dict[str, float], averages: list[float]) -> None:
    """The size's table: medians [lowest, highest], then the ratios to nft's."""
    print(f"\n{size:,} services, {len(rows[names[0]]['pps'])} rounds, load average "
          f"{min(averages):.1f}-{max(averages):.1f}, loaded in "
          + ", ".join(f"{LABELS[n]} {loads[n]:.1f} s" for n in names))
    print("| dataplane | " + " | ".join(f[0] for f in FIGURES) + " |")
    print("|---" * (len(FIGURES) + 1) + "|")
    for name in names:
        cells = (spread(rows[name][key]).show(digits) for _, key, digits in FIGURES)
        print(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    if REFERENCE not in names:
        return
    for name in names:
        if name == REFERENCE:
            continue
        ratios = (paired_ratios({n: rows[n][key] for n in names}, REFERENCE)[name].show(2)
                  for _, key, _ in FIGURES[:-1])
        print(f"| {LABELS[name]} / nft | " + " | ".join(ratios) + " | |")
    show_own_costs(names, rows)
    sys.stdout.flush()


def show_own_costs(names: list[str], rows: dict[str, dict[str, list[float]]]) -> None:
    """Each dataplane's CPU per connection and per packet above the floor's, round by
    round (what the dataplane itself costs)."""
    if FLOOR not in names:
        return
    costs = {key: paired_differences({n: rows[n][key] for n in names}, FLOOR)
             for key in ("conn_cpu", "pkt_cpu")}
    for name in names:
        if name != FLOOR:
            print(f"{LABELS[name]:>18} above the floor: CPU us/conn "
                  f"{costs['conn_cpu'][name].show(1)}, CPU us/packet "
                  f"{costs['pkt_cpu'][name].show(2)}")


def flatness(names: list[str], sizes: list[int],
             results: dict[int, dict[str, dict[str, list[float]]]]) -> None:
    """Each dataplane's figures at the largest size over those at the smallest, each
    taken relative to the floor of its own round (so the load of the two sizes' runs
    divides out): 1.00 is flat in services."""
    if FLOOR not in names:
        return
    small, large = sizes[0], sizes[-1]
    print(f"\n{large:,} / {small:,} services, each relative to the floor's round "
          "(flat: 1.00)")
    for name in names:
        if name == FLOOR:
            continue
        cells = []
        for heading, key, _ in FIGURES[:-1]:
            a, b = (paired_ratios({n: results[size][n][key] for n in names}, FLOOR)[name]
                    for size in (small, large))
            cells.append(f"{heading} {b.median / a.median:.2f}")
        print(f"{LABELS[name]:>18}: " + ", ".join(cells))


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,10000",
                        help="service counts, comma-separated (default: 100,10000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per size (default: 7)")
    parser.add_argument("--connects", type=int, default=100,
                        help="new connections per try (default: 100)")
    parser.add_argument("--packets", type=int, default=10000,
                        help="UDP datagrams per burst (default: 10000)")
    parser.add_argument("--tries", type=int, default=3,
                        help="runs of connections and bursts per dataplane and round, the "
                        "best of them kept (default: 3)")
    parser.add_argument("--dataplanes", default="tc,xdp,nft,iptables,routed",
                        help="of tc, xdp, nft, iptables and routed (pod-c's address routed "
                        "through a node of its own: the floor; default: all five)")
    parser.add_argument("--object", type=Path, default=OBJECT,
                        help="the tc/XDP object to load (default: the built one)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write each size's per-round figures here (what --plot-only "
                        "reads)")
    parser.add_argument("--svg", type=Path, default=None, metavar="FILE",
                        help="draw CPU per packet and connect() p50 per dataplane over the "
                        "sizes here")
    parser.add_argument("--plot-only", type=Path, default=None, metavar="JSON",
                        help="measure nothing: draw --svg from the figures a run wrote "
                        "with --json")
    args = parser.parse_args(argv)
    if args.plot_only and not args.svg:
        parser.error("--plot-only draws a picture: name its file with --svg FILE")
    unknown = set(args.dataplanes.split(",")) - set(LABELS)
    if unknown:
        parser.error(f"unknown dataplane(s) {', '.join(sorted(unknown))}: "
                     f"choose from {', '.join(LABELS)}")
    return args


def cleaned(steps: list[Callable[[], object]]) -> None:
    """Run every cleanup step, the last registered first, each even if another failed."""
    for step in reversed(steps):
        try:
            step()
        except Exception as err:  # noqa: BLE001 - the next steps still run
            print(f"cleanup: {err}", file=sys.stderr)


def draw(path: Path, results: packet_path_plot.Results) -> None:
    """The run's picture (bench/packet_path_plot.py) written to ``path``."""
    svgplot.write(path, packet_path_plot.plots(results))
    print(f"plot: {path}")


def main() -> None:
    args = parse()
    if args.plot_only:
        draw(args.svg, packet_path_plot.load(args.plot_only))
        return
    if os.geteuid() != 0:
        sys.exit("bench_packet_path.py needs root (network namespaces, BPF, nft, iptables)")
    signal.signal(signal.SIGTERM, _terminate)
    names = args.dataplanes.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    lab = Lab(spec=lab_spec(names))
    fs = Path(tempfile.mkdtemp(prefix="spbench-pp-"))
    undo: list[Callable[[], object]] = [lambda: fs.rmdir()]
    try:
        subprocess.run(["mount", "-t", "bpf", "bpf", str(fs)], check=True)
        undo.append(lambda: subprocess.run(["umount", str(fs)], check=True))
        undo.append(lab.destroy)
        lab.build()
        for ns in ("client", "pod-c"):
            tx_checksums_off(lab.ns(ns))
        lab.start(lab.ns("pod-c"), SERVER, str(POD_PORT))
        if "routed" in names:
            route_floor(lab)
        machine = f"{os.cpu_count()} CPUs, Linux {os.uname().release}"
        print(f"{machine}; NodePort to pod-c on "
              f"another node; {args.rounds} rounds, each the best of {args.tries} runs of "
              f"{args.connects} connections and of {args.tries} bursts of "
              f"{args.packets:,} datagrams per dataplane", flush=True)
        results = {}
        for size in sizes:
            backends = {name: make(name, lab, fs, args.object) for name in names}
            try:
                results[size] = measure_size(lab, names, backends, size, args)
            finally:
                for name, backend in backends.items():
                    if backend is not None:
                        call_in(lab.ns(name), backend.cleanup)
        if len(sizes) > 1:
            flatness(names, sizes, results)
        if args.json:
            packet_path_plot.save(args.json, results, {
                "machine": machine, "command": " ".join(sys.argv), "rounds": args.rounds,
                "tries": args.tries})
        if args.svg:
            draw(args.svg, results)
    finally:
        cleaned(undo)


if __name__ == "__main__":
    main()
