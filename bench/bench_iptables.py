"""iptables backend benchmark: kube-proxy-scale rulesets in throwaway network namespaces.

    sudo .venv/bin/python bench/bench_iptables.py [--services 10000] [--endpoints 10]
        [--changes 20] [--modes nft,legacy] [--edits 50] [--edit-services 1000] [--no-nft]

Every measurement runs in a fresh network namespace of its own (this script
re-executes itself inside with ``ip netns exec``), so nothing touches the host's
rules. Prints, per iptables mode:

- full sync of N services x M endpoints by the backend, against the raw
  ``iptables-restore --noflush`` time of the very same input (both families);
- one endpoint change at that scale (partial sync: p50 / p99 / max);
- the floor of the iptables tool itself at that scale: a raw ``iptables-restore
  --noflush`` adding one empty chain, and one chain with one rule, to the loaded table
  (legacy replaces the whole table; nf_tables validates the whole table on a new rule);
- a periodic sync with nothing to do (equality check + canary probe), and the hourly full
  resync over the rules already there;
- backend RSS (peak, and above the state it was handed);
- the nftables backend on the same state in the same run (full sync, one change);
- python-iptables (libiptc, legacy only) against iptables-restore for 10,000 rules,
  and the canary probe through python-iptables against ``iptables -S``;
- manifest edit -> rule in the kernel, p50 / p99, with the real frontend and the real
  ``svcproxy backend iptables --min-sync-period 0`` process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from svcproxy.model import Endpoint, Protocol, ServicePort, ServicePortKey, ServicePortState
from svcproxy.sdk.backend import Changes, NodeState
from svcproxy.sdk.config import NodeConfig

HERE = Path(__file__).resolve()
PYTHON = sys.executable


def _ip(n: int, first: int) -> str:
    return f"{first}.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def endpoint(n: int) -> Endpoint:
    return Endpoint(_ip(n, 10), 8080, internal=True, external=True, cluster=True)


def make_service(i: int, endpoints: int, offset: int = 0) -> ServicePortState:
    key = ServicePortKey("bench", f"s{i}", "http", Protocol.TCP)
    port = ServicePort(key, cluster_ips=(_ip(i, 172),), port=80, has_endpoints=True)
    eps = [endpoint(i * endpoints + e + offset) for e in range(endpoints)]
    return ServicePortState(port, {e.ip: e for e in eps})


def make_state(services: int, endpoints: int) -> NodeState:
    states = [make_service(i, endpoints) for i in range(services)]
    return NodeState("bench", 1, None, {s.key: s for s in states})


def with_one_change(state: NodeState, services: int, endpoints: int, n: int) -> tuple[
        NodeState, Changes]:
    """The state with one endpoint of service ``n % services`` moved to a fresh IP."""
    i = (n * 7919) % services
    old = state.services[ServicePortKey("bench", f"s{i}", "http", Protocol.TCP)]
    eps = dict(old.endpoints)
    eps.pop(next(iter(eps)))
    fresh = endpoint(services * endpoints + 1_000_000 + n)
    eps[fresh.ip] = fresh
    new = ServicePortState(old.service, eps)
    services_map = dict(state.services)
    services_map[new.key] = new
    return (NodeState("bench", state.revision + 1, None, services_map),
            Changes(services=frozenset({new.key})))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ---- inner measurements (run inside a namespace) ----------------------------------------

def inner_iptables(args: argparse.Namespace) -> dict[str, Any]:
    """Our full sync, the input it wrote (to a file), endpoint changes, a no-op resync."""
    from svcproxy.backends.iptables import apply as tool
    from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions

    written: list[str] = []
    original = tool.Iptables.restore

    def recording(self: tool.Iptables, text: str) -> None:
        written.append(f"{self.family}\n{text}")
        original(self, text)

    tool.Iptables.restore = recording  # type: ignore[method-assign]
    state = make_state(args.services, args.endpoints)
    base_rss = rss_mb()
    backend = IptablesBackend(NodeConfig("bench", cluster_cidrs=("10.0.0.0/8",)),
                              IptablesOptions(mode=args.mode, localhost_nodeports=False))
    full = timed(lambda: backend.sync(state, Changes(full=True, reason="initial")))
    tool.Iptables.restore = original  # type: ignore[method-assign]
    Path(args.out).write_text(json.dumps(written))
    changes = []
    for n in range(args.changes):
        state, change = with_one_change(state, args.services, args.endpoints, n)
        changes.append(timed(lambda s=state, c=change: backend.sync(s, c)))
    periodic = Changes(services=frozenset(state.services), full=True, reason="periodic")
    backend.sync(state, periodic)  # the first probe imports python-iptables (legacy mode)
    noop = timed(lambda: backend.sync(state, periodic))
    resync = timed(lambda: backend.sync(state, Changes(full=True, reason="hourly")))
    rules = sum(text.count("\n-A ") for text in written[:1])
    return {"full": full, "changes": changes, "noop": noop, "resync": resync, "rss": rss_mb(),
            "state_rss": base_rss, "rules": rules, "bytes": len(written[0])}


def inner_raw(args: argparse.Namespace) -> dict[str, Any]:
    """The raw iptables-restore time of the exact input our full sync wrote, then the
    tool's floor on that table: one empty chain added, one chain with one rule added."""
    make_nfacct_counters()
    total = 0.0
    for item in json.loads(Path(args.out).read_text()):
        family, text = item.split("\n", 1)
        total += timed(lambda t=text, f=family: raw_restore(args.mode, f, t))
    empty = [timed(lambda n=n: raw_restore(args.mode, "4", f"*nat\n:BENCH-E{n} - [0:0]\nCOMMIT\n"))
             for n in range(5)]
    rule = [timed(lambda n=n: raw_restore(
        args.mode, "4", f"*nat\n:BENCH-R{n} - [0:0]\n-A BENCH-R{n} -j RETURN\nCOMMIT\n"))
        for n in range(5)]
    return {"raw": total, "floor_empty": empty, "floor_rule": rule}


def make_nfacct_counters() -> None:
    """The nfacct objects the backend creates before its rules reference them (the input
    replayed raw names them; a backend without nfacct support has no such module)."""
    try:
        from svcproxy.backends.iptables.nfacct import COUNTERS, Nfacct
    except ImportError:
        return
    counters = Nfacct()
    for name in COUNTERS:
        counters.create(name)
    counters.close()


def raw_restore(mode: str, family: str, text: str) -> None:
    program = f"{'iptables' if family == '4' else 'ip6tables'}-{mode}-restore"
    subprocess.run([program, "--noflush", "--wait", "5"], input=text, text=True, check=True)


def inner_nft(args: argparse.Namespace) -> dict[str, Any]:
    from svcproxy.backends.nft.backend import NftBackend

    state = make_state(args.services, args.endpoints)
    backend = NftBackend(NodeConfig("bench", cluster_cidrs=("10.0.0.0/8",)))
    full = timed(lambda: backend.sync(state, Changes(full=True, reason="initial")))
    changes = []
    for n in range(args.changes):
        state, change = with_one_change(state, args.services, args.endpoints, n)
        changes.append(timed(lambda s=state, c=change: backend.sync(s, c)))
    return {"full": full, "changes": changes, "rss": rss_mb()}


def inner_iptc(args: argparse.Namespace) -> dict[str, Any]:
    """python-iptables (libiptc, legacy) vs iptables-restore for the same plain rules."""
    import iptc

    count, per_rule = 10_000, args.iptc_per_rule
    lines = [f"-A BENCH -d {_ip(n, 172)}/32 -p tcp -m tcp --dport 80 -j ACCEPT"
             for n in range(count)]
    restore: dict[str, float] = {}
    for mode in ("legacy", "nft"):
        text = f"*filter\n:BENCH - [0:0]\n{chr(10).join(lines)}\nCOMMIT\n"
        restore[mode] = timed(lambda m=mode, t=text: subprocess.run(
            [f"iptables-{m}-restore", "--noflush"], input=t, text=True, check=True))

    def rule(n: int) -> iptc.Rule:
        r = iptc.Rule()
        r.dst = f"{_ip(n, 172)}/32"
        r.protocol = "tcp"
        r.create_match("tcp").dport = "80"
        r.target = iptc.Target(r, "ACCEPT")
        return r

    table = iptc.Table(iptc.Table.FILTER)
    table.autocommit = True
    single_chain = table.create_chain("BENCH3")
    single = timed(lambda: [single_chain.append_rule(rule(n)) for n in range(per_rule)])
    table.autocommit = False
    table.refresh()
    chain = table.create_chain("BENCH2")

    def batch() -> None:
        for n in range(count):
            chain.append_rule(rule(n))
        table.commit()

    batch_seconds = timed(batch)
    table.autocommit = True
    table.create_chain("KUBE-PROXY-CANARY")
    probe_iptc = timed(lambda: [iptc.Table(iptc.Table.MANGLE).refresh() for _ in range(100)])
    probe_cli = timed(lambda: [subprocess.run(
        ["iptables-legacy", "-t", "filter", "-S", "KUBE-PROXY-CANARY"], capture_output=True)
        for _ in range(100)])
    return {"restore": restore, "iptc_batch": batch_seconds, "iptc_single": single,
            "per_rule": per_rule, "probe_iptc": probe_iptc / 100, "probe_cli": probe_cli / 100}


INNER = {"iptables": inner_iptables, "raw": inner_raw, "nft": inner_nft, "iptc": inner_iptc}


# ---- outer orchestration ---------------------------------------------------------------

class Namespace:
    def __init__(self, label: str) -> None:
        self.name = f"bipt{label}{os.getpid()}"

    def __enter__(self) -> Namespace:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up"],
                       check=True)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], check=False)

    def run(self, kind: str, args: argparse.Namespace, **extra: object) -> dict[str, Any]:
        argv = ["ip", "netns", "exec", self.name, PYTHON, str(HERE), "--inner", kind,
                "--services", str(args.services), "--endpoints", str(args.endpoints),
                "--changes", str(args.changes), "--iptc-per-rule", str(args.iptc_per_rule)]
        for key, value in extra.items():
            argv += [f"--{key}", str(value)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{kind} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def report_mode(spec: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One iptables mode ("legacy", or "nft:1000" for another scale than --services)."""
    mode, _, scale = spec.partition(":")
    args = argparse.Namespace(**{**vars(args), "services": int(scale or args.services)})
    out = tmp / f"{mode}.json"
    with Namespace("o") as ns:
        ours = ns.run("iptables", args, mode=mode, out=out)
    with Namespace("r") as ns:
        raw = ns.run("raw", args, mode=mode, out=out)
    changes = ours["changes"]
    print(f"\n## iptables ({mode}), {args.services} services x {args.endpoints} endpoints "
          f"({ours['rules']} nat+filter rules, {ours['bytes'] / 1e6:.1f} MB of restore input)")
    print(f"full sync (ours)               {ours['full']:.2f} s")
    print(f"raw iptables-restore, same input {raw['raw']:.2f} s   "
          f"(ours / raw = {ours['full'] / raw['raw']:.2f})")
    print(f"one endpoint change            p50 {ms(statistics.median(changes))}, "
          f"p99 {ms(pct(changes, 0.99))}, max {ms(max(changes))} over {len(changes)}")
    empty, rule = statistics.median(raw["floor_empty"]), statistics.median(raw["floor_rule"])
    print(f"raw floor on that table: one empty chain p50 {ms(empty)}, "
          f"one chain + one rule p50 {ms(rule)} (5 each)")
    print(f"periodic sync, nothing to do   {ms(ours['noop'])}")
    print(f"full resync over our rules (hourly) {ours['resync']:.2f} s")
    print(f"RSS                            {ours['rss']:.0f} MB peak "
          f"({ours['rss'] - ours['state_rss']:.0f} MB above the state itself)")
    return {"ours": ours, "raw": raw}


def report_nft(args: argparse.Namespace) -> None:
    with Namespace("n") as ns:
        nft = ns.run("nft", args)
    changes = nft["changes"]
    print(f"\n## nftables backend, same state\nfull sync {nft['full']:.2f} s; one endpoint change "
          f"p50 {ms(statistics.median(changes))}, p99 {ms(pct(changes, 0.99))}; "
          f"RSS {nft['rss']:.0f} MB")


def report_iptc(args: argparse.Namespace) -> None:
    with Namespace("p") as ns:
        r = ns.run("iptc", args)
    n = r["per_rule"]
    print("\n## python-iptables (libiptc; legacy only) vs iptables-restore, 10,000 rules")
    print(f"iptables-legacy-restore        {r['restore']['legacy']:.3f} s")
    print(f"iptables-nft-restore           {r['restore']['nft']:.3f} s")
    print(f"python-iptables, one commit    {r['iptc_batch']:.2f} s")
    print(f"python-iptables, commit per rule: {n} rules in {r['iptc_single']:.2f} s "
          f"(quadratic: ~{r['iptc_single'] * (10_000 / n) ** 2:.0f} s for 10,000)")
    print(f"canary probe: python-iptables {r['probe_iptc'] * 1000:.2f} ms, "
          f"iptables -S {r['probe_cli'] * 1000:.2f} ms")


POLLER = r"""
import subprocess, sys, time
program = sys.argv[1]
for line in sys.stdin:
    chain, want, deadline = line.split()
    deadline = float(deadline)
    while time.time() < deadline:
        out = subprocess.run([program, "-t", "nat", "-S", chain], capture_output=True,
                             text=True).stdout
        if want in out:
            break
    print(time.time(), flush=True)
"""


def _cluster_docs(services: int, endpoints: int) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": "bench"}}]
    for i in range(1, services):
        docs += _service_docs(i, [_ip(i * endpoints + e, 10) for e in range(endpoints)])
    return docs


def _service_docs(i: int, ips: list[str]) -> list[dict[str, Any]]:
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": f"s{i}", "namespace": "bench"},
           "spec": {"clusterIP": _ip(i, 172),
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
           "metadata": {"name": f"s{i}-a", "namespace": "bench",
                        "labels": {"kubernetes.io/service-name": f"s{i}"}},
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips]}
    return [svc, eps]


def _write(path: Path, docs: list[dict[str, Any]]) -> None:
    import yaml

    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    tmp.rename(path)


def edit_latencies(args: argparse.Namespace, tmp: Path) -> list[float]:
    """Seconds from writing a changed EndpointSlice to its KUBE-SEP jump being in the kernel."""
    from svcproxy.backends.iptables import names

    mdir = tmp / "manifests"
    mdir.mkdir()
    _write(mdir / "cluster.yaml", _cluster_docs(args.edit_services, args.endpoints))
    _write(mdir / "edit.yaml", _service_docs(0, ["10.250.0.1"]))
    svcproxy = [PYTHON, "-m", "svcproxy.cli"]
    sock = tmp / "api.sock"
    key = ServicePortKey("bench", "s0", "http", Protocol.TCP)
    chain = names.SVC_PREFIX + names.service_hash(key)
    latencies: list[float] = []
    with Namespace("e") as ns:
        front = subprocess.Popen([*svcproxy, "frontend", "--manifests", str(mdir), "--listen",
                                  f"unix://{sock}", "--metrics-bind-address", ""],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        back = None
        try:
            while not sock.exists():
                time.sleep(0.05)
            back = subprocess.Popen(
                ["ip", "netns", "exec", ns.name, *svcproxy, "-v", "backend", "iptables", "--api",
                 f"unix://{sock}", "--node-name", "bench", "--min-sync-period", "0",
                 "--cluster-cidr", "10.0.0.0/8", "--healthz-bind-address", "",
                 "--metrics-bind-address", "", "--iptables-mode", args.edit_mode],
                stdout=subprocess.DEVNULL, stderr=(tmp / "backend.log").open("w"))
            poller = subprocess.Popen(
                ["ip", "netns", "exec", ns.name, PYTHON, "-c", POLLER,
                 f"iptables-{args.edit_mode}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
            assert poller.stdin and poller.stdout
            first = names.endpoint_chain(key, Endpoint("10.250.0.1", 8080))
            poller.stdin.write(f"{chain} {first} {time.time() + 600}\n")
            poller.stdin.flush()
            poller.stdout.readline()
            for n in range(args.edits):
                ip = _ip(0xFA0000 + n + 2, 10)
                want = names.endpoint_chain(key, Endpoint(ip, 8080))
                time.sleep(random.uniform(0, 0.2))  # not in step with the source's polling
                start = time.time()
                _write(mdir / "edit.yaml", _service_docs(0, [ip]))
                poller.stdin.write(f"{chain} {want} {start + 10}\n")
                poller.stdin.flush()
                latencies.append(float(poller.stdout.readline()) - start)
            poller.stdin.close()
            poller.wait()
        finally:
            for proc in (back, front):
                if proc is not None:
                    proc.terminate()
                    proc.wait()
    return latencies


def report_e2e(args: argparse.Namespace, tmp: Path) -> None:
    lat = edit_latencies(args, tmp)
    if os.environ.get("BENCH_LOG"):
        print((tmp / "backend.log").read_text()[-int(os.environ["BENCH_LOG"]):])
    print(f"\n## manifest edit -> rule in the kernel ({args.edit_services} services x "
          f"{args.endpoints} endpoints, iptables {args.edit_mode}, --min-sync-period 0, "
          f"{len(lat)} edits; the manifest source polls files every 0.2 s)")
    print(f"p50 {ms(statistics.median(lat))}, p99 {ms(pct(lat, 0.99))}, max {ms(max(lat))} "
          f"(edit #{lat.index(max(lat)) + 1})")
    syncs = [float(line.rsplit(" in ", 1)[1].rstrip("s")) for line in
             (tmp / "backend.log").read_text().splitlines() if "Synced partially" in line]
    if syncs:
        print(f"of which the backend's partial syncs: p50 {ms(statistics.median(syncs))}, "
              f"max {ms(max(syncs))}; the rest is the frontend's manifest source and the stream")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--modes", default="legacy,nft",
                        help="iptables modes to measure, MODE[:SERVICES] for another scale "
                        "than --services (default %(default)s)")
    parser.add_argument("--no-nft", action="store_true", help="skip the nftables backend")
    parser.add_argument("--iptc-per-rule", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--edit-services", type=int, default=1000)
    parser.add_argument("--edit-mode", default="nft", choices=("nft", "legacy"))
    parser.add_argument("--inner", choices=sorted(INNER), help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="nft", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(INNER[args.inner](args)))
        return 0
    if os.geteuid() != 0:
        print("bench_iptables: needs root (network namespaces)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-ipt-") as tmpdir:
        tmp = Path(tmpdir)
        for mode in args.modes.split(","):
            report_mode(mode, args, tmp)
        if not args.no_nft:
            report_nft(args)
        report_iptc(args)
        if args.edits:
            report_e2e(args, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
