"""Cold start of a backend, local mode against split mode: process start -> every service
in the kernel (the first full sync done), nft backend, in a network namespace this script
creates (the stand-in apiserver runs in it too).

    .venv/bin/python bench/bench_local_cold_start.py [--breakdown] [--before=DIR [--rounds=N]]
        [--python=PYTHON [--rounds=N]] [SERVICES ...]    (default 1000 5000 10000)

local: `svcproxy backend --config` with clientConnection.kubeconfig and no frontend address
(the frontend's computation in process). split: a frontend already running and synced on
a unix socket, the backend started alone. kube-proxy: the issue's figures for its
iptables-legacy first sync on this machine (not run here).

--breakdown splits each cold start into phases, from the time each of the backend's log
lines reaches this script (-v=4), with the backend's CPU time in each (its /proc stat read
then; the sync's is render, text and apply together): startup (interpreter, imports,
configuration, backend set up, sysctls), the in-process frontend's start (its imports -
the kubernetes client - and its API server), the apiserver list and the frontend's sync,
the first state through the SDK's channel (the node's view made, sent, decoded), the
backend's render, the text of the nft transaction, and the kernel applying it.

--before=DIR compares local mode with another commit's, side by side: DIR is a checkout of
it (``git worktree add --detach DIR COMMIT``); the bench links its frontend/ and backends/
into its svcproxy/ and copies the generated svcproxy/v1 there, as the editable install
maps them for this tree. Both run --rounds times (default 3) alternating (ABBA...) against
the same apiserver; the medians, the best CPU times and the ratios of before to after are printed.

--python PYTHON runs local mode under this interpreter and under PYTHON alternately
(ABBA..., --rounds times; PYTHON's virtualenv made once in .cache with this venv's
packages): the interpreter's build matters (the image's python:3.11-slim is built with PGO
and LTO, /usr/bin/python3.11 on Debian is an optimised build too; pyenv's default is not).

Every table also prints the imports floor: a process of the same interpreter that only
imports what a local-mode start cannot do without - grpc (the SDK's channel and the API
server), protobuf, the kubernetes client's ApiClient and kubeconfig loader, yaml - and
exits, from its start to its end. No start can be faster than that.

"CPU" is the backend process's own; "with children" adds its children's, waited for (nft
for a large transaction) or still running: the CPU the whole start cost.

Every process runs with its modules' bytecode cached, as a pip-installed svcproxy (the
image) has it: $PYTHONDONTWRITEBYTECODE is dropped and the bytecode goes to a cache of
this bench's (.cache/bench-pycache, $PYTHONPYCACHEPREFIX), filled by one start of each
tree that is not counted. Compiling the sources at every start instead costs ~0.3 s of CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYCACHE = ROOT / ".cache" / "bench-pycache"
NS = f"svcp-bench-cold-{os.getpid()}"
KUBE_PROXY = {1000: 0.57, 5000: 1.81, 10000: 4.43}
# (phase, the log line that ends it); a phase whose line is missing is left out.
PHASES = [
    ("startup", "Local mode: starting"),
    ("frontend start", "watching the apiserver"),
    ("list + sync", "frontend synced"),
    ("first state", "applied the first state"),
    ("sync", "Synced fully (initial"),
]
SPLIT_PHASES = [("agent startup", "Backend nft on node"), *PHASES[3:]]
NFT_TIMES = re.compile(r"nft replace sync .* diff ([0-9.]+) ms, apply ([0-9.]+) ms")
APISERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig
    n = int(sys.argv[2])
    fake = FakeApiserver(token="t")
    fake.create("Node", {"metadata": {"name": "node-a"}})
    for i in range(n):
        ip = f"10.{96 + i // 62500}.{i // 250 % 250}.{i % 250 + 1}"
        fake.create("Service", {"metadata": {"name": f"s{i}", "namespace": "bench"},
                    "spec": {"clusterIP": ip, "ports": [{"name": "p", "port": 80}]}})
        fake.create("EndpointSlice", {
            "metadata": {"name": f"s{i}-a", "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": f"s{i}"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [f"10.244.{i // 250 % 250}.{i % 250 + 1}"],
                           "conditions": {"ready": True}}],
            "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]})
    write_kubeconfig(Path(sys.argv[3]), fake.url, "t")
    print("ready", flush=True)
    sys.stdin.read()
""")


def in_ns(*cmd: str, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(["ip", "netns", "exec", NS, *cmd], text=True, **kw)


def until_synced(proc: subprocess.Popen[str], start: float) -> dict[str, float]:
    """When (seconds after ``start``) the backend logged each phase's line, until its
    first full sync (its services are programmed); "text" and "apply" are nft's own
    figures for its transaction."""
    assert proc.stderr is not None
    marks: dict[str, float] = {}
    last: list[str] = []
    for line in proc.stderr:
        last = [*last[-9:], line]
        now = time.monotonic() - start
        for phase, text in (*PHASES, SPLIT_PHASES[0]):
            if text in line and phase not in marks:
                marks[phase] = now
                marks[f"{phase} cpu"] = cpu_seconds(proc.pid)
        if m := NFT_TIMES.search(line):
            marks["text"], marks["apply"] = float(m[1]) / 1e3, float(m[2]) / 1e3
        if "sync" in marks:
            marks["cpu"] = cpu_seconds(proc.pid)
            marks["cpu all"] = cpu_with_children(proc.pid)
            return marks
    raise RuntimeError("the backend ended before syncing; its last lines:\n" + "".join(last))


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used (`ip netns exec` execs the
    backend, so this is the backend's own): on a loaded machine, steadier than wall time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_with_children(pid: int) -> float:
    """``cpu_seconds`` of the process, of the children it waited for (nft) and of those
    still running: the CPU the whole start used."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def phases(marks: dict[str, float], names: list[tuple[str, str]]) -> list[tuple[str, float]]:
    """Each phase's duration; the sync split into render (and the rest of the SDK's
    diff), the transaction's text and the kernel's apply."""
    out, last = [], 0.0
    for phase, _ in names:
        if phase in marks:
            out.append((phase, marks[phase] - last))
            last = marks[phase]
    if out and out[-1][0] == "sync" and "apply" in marks:
        sync = out.pop()[1]
        out += [("render", sync - marks["text"] - marks["apply"]), ("text", marks["text"]),
                ("kernel apply", marks["apply"])]
    return out


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def backend(conf: Path, env: dict[str, str], tree: Path = ROOT,
            python: str = sys.executable) -> dict[str, float]:
    """One cold start of the backend of the source ``tree`` (``-m`` puts it first on the
    path), run by ``python``."""
    start = time.monotonic()
    proc = in_ns(python, "-m", "svcproxy.cli", "backend", f"--config={conf}",
                 "--hostname-override=node-a", "-v=4", env=env, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, cwd=tree)
    try:
        return until_synced(proc, start)
    finally:
        stop(proc)
        in_ns("nft", "delete", "table", "ip", "svcproxy").wait()


def prepare_tree(tree: Path) -> None:
    """Map another checkout's folders into its svcproxy package as the editable install
    maps this tree's (frontend/, backends/; the generated svcproxy/v1 copied)."""
    for name in ("frontend", "backends"):
        if not (tree / "svcproxy" / name).exists():
            (tree / "svcproxy" / name).symlink_to(f"../{name}")
    if not (tree / "svcproxy" / "v1").exists():
        shutil.copytree(ROOT / "svcproxy" / "v1", tree / "svcproxy" / "v1")


class Apiserver:
    """The stand-in apiserver with ``services`` services in the namespace, and the
    KubeProxyConfiguration pointing at it."""

    def __init__(self, services: int, work: Path) -> None:
        kubeconfig = work / "kubeconfig"
        self.proc = in_ns(sys.executable, "-c", APISERVER, str(ROOT), str(services),
                          str(kubeconfig), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.kubeconfig = kubeconfig
        self.conf = work / "config.conf"
        self.conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                             "kind: KubeProxyConfiguration\nmode: nftables\n"
                             f"clientConnection: {{kubeconfig: {kubeconfig}}}\n"
                             "healthzBindAddress: ''\nmetricsBindAddress: ''\n")
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        stop(self.proc)


def local_env() -> dict[str, str]:
    """The environment of every process this bench starts: no frontend address (local
    mode), and the bytecode cached as an installed package has it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SVCPROXY_API", "PYTHONDONTWRITEBYTECODE")}
    return {**env, "PYTHONPYCACHEPREFIX": str(PYCACHE)}


WARM: set[tuple[Path, str]] = set()
FLOOR = ("from svcproxy.frontend.sources.kubernetes_package import bare_kubernetes_package\n"
         "bare_kubernetes_package()\n"
         "import asyncio, grpc, grpc.aio, google.protobuf.message, yaml\n"
         "from kubernetes.client import ApiClient\n"
         "import kubernetes.config.kube_config\n")


def warm_up(conf: Path, tree: Path = ROOT, python: str = sys.executable) -> None:
    """One uncounted start of ``tree``'s backend in local mode, which fills the bytecode
    cache with every module a start imports (once per tree and interpreter)."""
    if (tree, python) not in WARM:
        backend(conf, local_env(), tree, python)
        WARM.add((tree, python))


def imports_floor(tree: Path = ROOT, python: str = sys.executable, runs: int = 3) -> float:
    """The median wall time of a process (``python``, ``tree`` first on its path) that
    only imports the packages a local-mode start needs, then exits (see FLOOR)."""
    times = []
    for _ in range(runs + 1):  # the first fills the bytecode cache
        start = time.monotonic()
        subprocess.run([python, "-c", FLOOR], env=local_env(), cwd=tree, check=True)
        times.append(time.monotonic() - start)
    return statistics.median(times[1:])


def interpreter_venv(python: str) -> tuple[str, Path]:
    """A virtualenv of ``python`` with this venv's packages (made once, in .cache), and a
    tree that maps this checkout's svcproxy for it as the editable install does here."""
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"],
                             capture_output=True, text=True, check=True).stdout
    name = hashlib.sha256(f"{python}\n{version}".encode()).hexdigest()[:12]
    venv = ROOT / ".cache" / "bench-venvs" / name
    if not (venv / "installed").exists():
        print(f"making a virtualenv of {python} in {venv} (once, ~1 min) ...", flush=True)
        subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
        frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                                capture_output=True, text=True, check=True).stdout
        (venv / "requirements.txt").write_text(frozen)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r",
                        str(venv / "requirements.txt")], check=True)
        (venv / "installed").write_text(version)
    tree = venv / "tree"
    package = tree / "svcproxy"
    package.mkdir(parents=True, exist_ok=True)
    for entry in [*(ROOT / "svcproxy").iterdir(), ROOT / "frontend", ROOT / "backends"]:
        link = package / entry.name
        if not link.is_symlink():
            link.symlink_to(entry)
    # The distribution's metadata too: the backends are found by their entry points.
    site = Path(subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    for info in site.glob("svcproxy-*.dist-info"):
        shutil.copytree(info, tree / info.name, dirs_exist_ok=True)
    return str(venv / "bin" / "python"), tree


def measure(services: int, work: Path) -> tuple[dict[str, float], dict[str, float]]:
    api = Apiserver(services, work)
    kubeconfig, conf = api.kubeconfig, api.conf
    try:
        env = local_env()
        warm_up(conf)
        local = backend(conf, env)
        sock = work / "api.sock"
        frontend = in_ns(sys.executable, "-m", "svcproxy.cli", "frontend", "--kubeconfig",
                         str(kubeconfig), "--listen", f"unix://{sock}",
                         "--metrics-bind-address", "", env=env, stderr=subprocess.PIPE)
        try:
            assert frontend.stderr is not None
            for line in frontend.stderr:
                if "frontend synced" in line:
                    break
            split = backend(conf, {**env, "SVCPROXY_API": f"unix://{sock}"})
        finally:
            stop(frontend)
        return local, split
    finally:
        api.close()


Runner = tuple[Path, str]  # (source tree, interpreter)


def compare(services: int, work: Path, runners: dict[str, Runner], rounds: int) -> None:
    """Local mode of two runners (label -> tree and interpreter), alternating (ABBA...),
    with each one's imports floor; ratios are of the first to the second."""
    api = Apiserver(services, work)
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in runners}
    a, b = runners
    try:
        for tree, python in runners.values():
            warm_up(api.conf, tree, python)
        for i in range(rounds):
            for which in (a, b) if i % 2 == 0 else (b, a):
                marks = backend(api.conf, local_env(), *runners[which])
                runs[which].append(marks)
                print(f"{services:>8} round {i + 1} {which:<6} wall {marks['sync']:.2f}s "
                      f"CPU {marks['cpu']:.2f}s (with children {marks['cpu all']:.2f}s)",
                      flush=True)
    finally:
        api.close()
    med = {w: {k: statistics.median(m[k] for m in r) for k in ("sync", "cpu", "cpu all")}
           for w, r in runs.items()}
    best = {w: min(m["cpu"] for m in r) for w, r in runs.items()}
    floor = {w: imports_floor(*runners[w]) for w in runners}
    kp = KUBE_PROXY.get(services)
    print(f"{services:>8} best CPU {a} {best[a]:.2f}s {b} {best[b]:.2f}s "
          f"({best[a] / best[b]:.2f}x) | imports floor {a} {floor[a]:.2f}s {b} {floor[b]:.2f}s"
          + (f" (kube-proxy's whole start {kp:.2f}s)" if kp else ""))
    print(f"{services:>8} median  {a} wall {med[a]['sync']:.2f}s CPU {med[a]['cpu']:.2f}s | "
          f"{b} wall {med[b]['sync']:.2f}s CPU {med[b]['cpu']:.2f}s | {a}/{b} wall "
          f"{med[a]['sync'] / med[b]['sync']:.2f}x CPU {med[a]['cpu'] / med[b]['cpu']:.2f}x"
          + (f" | /kube-proxy {a} {med[a]['sync'] / kp:.2f}x {b} {med[b]['sync'] / kp:.2f}x"
             if kp else "")
          + f" | CPU with children {a} {med[a]['cpu all']:.2f}s {b} {med[b]['cpu all']:.2f}s",
          flush=True)


def cpu_phases(marks: dict[str, float], names: list[tuple[str, str]]) -> dict[str, float]:
    """The backend's CPU time in each phase (read when its line arrived)."""
    out, last = {}, 0.0
    for phase, _ in names:
        if f"{phase} cpu" in marks:
            out[phase] = marks[f"{phase} cpu"] - last
            last = marks[f"{phase} cpu"]
    return out


def show(label: str, marks: dict[str, float], names: list[tuple[str, str]]) -> None:
    cpu = cpu_phases(marks, names)
    print(f"{'':>8} {label:<6} " + ", ".join(
        f"{p} {t:.2f}s" + (f" (CPU {cpu[p]:.2f})" if p in cpu else "")
        for p, t in phases(marks, names))
        + (f"; sync CPU {cpu['sync']:.2f}" if "sync" in cpu else ""))


def comparison(before: Path | None, python: str | None) -> dict[str, Runner] | None:
    """The two runners --before or --python compares, or None."""
    if before is not None:
        prepare_tree(before)
        return {"before": (before, sys.executable), "after": (ROOT, sys.executable)}
    if python is not None:
        exe, tree = interpreter_venv(python)
        return {"this": (ROOT, sys.executable), "other": (tree, exe)}
    return None


def main(sizes: list[int], breakdown: bool, before: Path | None = None,
         rounds: int = 3, python: str | None = None) -> None:
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the start")
        runners = comparison(before, python)
        if runners is not None:
            for label, (tree, exe) in runners.items():
                print(f"{label}: {tree}, {exe}")
            for n in sizes:
                with tempfile.TemporaryDirectory() as work:
                    compare(n, Path(work), runners, rounds)
            print(f"load average {os.getloadavg()[0]:.1f} at the end")
            return
        floor = imports_floor()
        print(f"imports floor (a process importing only grpc, protobuf, the kubernetes "
              f"client, yaml): {floor:.2f}s")
        print(f"{'services':>8} {'local mode':>11} {'split mode':>11} {'kube-proxy':>11} "
              f"{'local/kube-proxy':>17} {'local CPU':>10} {'split CPU':>10} "
              f"{'local CPU+children':>19}")
        for n in sizes:
            with tempfile.TemporaryDirectory() as work:
                local, split = measure(n, Path(work))
            kp = KUBE_PROXY.get(n)
            ref = (f"{kp:>10.2f}s {local['sync'] / kp:>16.2f}x" if kp else f"{'-':>11}")
            print(f"{n:>8} {local['sync']:>10.2f}s {split['sync']:>10.2f}s {ref} "
                  f"{local['cpu']:>9.2f}s {split['cpu']:>9.2f}s {local['cpu all']:>18.2f}s",
                  flush=True)
            if breakdown:
                show("local", local, PHASES)
                show("split", split, SPLIT_PHASES)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, metavar="SERVICES",
                        help="numbers of services (default 1000 5000 10000)")
    parser.add_argument("--breakdown", action="store_true",
                        help="split each cold start into phases")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="another commit's checkout to compare local mode with")
    parser.add_argument("--python", metavar="PYTHON",
                        help="compare local mode under this interpreter and under PYTHON "
                        "(e.g. /usr/bin/python3.11, an optimised build as the image's)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of each with --before or --python (default %(default)s)")
    args = parser.parse_args()
    if args.before is not None and args.python is not None:
        parser.error("--before and --python compare different things: give one")
    main(args.sizes or [1000, 5000, 10000], args.breakdown,
         args.before.resolve() if args.before else None, args.rounds, args.python)
