"""Cold start of a backend, local mode against split mode: process start -> every service
in the kernel (the first full sync done), nft backend, in a network namespace this script
creates (the stand-in apiserver runs in it too).

    .venv/bin/python bench/bench_local_cold_start.py [SERVICES ...]   (default 1000 5000 10000)

local: `svcproxy backend --config` with clientConnection.kubeconfig and no frontend address
(the frontend's computation in process). split: a frontend already running and synced on
a unix socket, the backend started alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NS = f"svcp-bench-cold-{os.getpid()}"
APISERVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from tests.fakeapiserver import FakeApiserver, write_kubeconfig
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


def until_synced(proc: subprocess.Popen[str]) -> float:
    """Seconds until the backend logs its first full sync (its services are programmed)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if "Synced fully (initial" in line:
            return time.monotonic()
    raise RuntimeError("the backend ended before syncing")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def backend(conf: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = in_ns(sys.executable, "-m", "svcproxy.cli", "backend", f"--config={conf}",
                 "--hostname-override=node-a", "-v=4", env=env, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE)
    try:
        return until_synced(proc) - start
    finally:
        stop(proc)
        in_ns("nft", "delete", "table", "ip", "svcproxy").wait()


def measure(services: int, work: Path) -> tuple[float, float]:
    kubeconfig = work / "kubeconfig"
    api = in_ns(sys.executable, "-c", APISERVER, str(ROOT), str(services), str(kubeconfig),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert api.stdout is not None and api.stdout.readline().strip() == "ready"
        conf = work / "config.conf"
        conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                        "kind: KubeProxyConfiguration\nmode: nftables\n"
                        f"clientConnection: {{kubeconfig: {kubeconfig}}}\n"
                        "healthzBindAddress: ''\nmetricsBindAddress: ''\n")
        env = {k: v for k, v in os.environ.items() if k != "SVCPROXY_API"}
        local = backend(conf, env)
        sock = work / "api.sock"
        frontend = in_ns(sys.executable, "-m", "svcproxy.cli", "frontend", "--kubeconfig",
                         str(kubeconfig), "--listen", f"unix://{sock}",
                         "--metrics-bind-address", "", stderr=subprocess.PIPE)
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
        if api.stdin:
            api.stdin.close()
        stop(api)


def main(sizes: list[int]) -> None:
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        print(f"{'services':>8} {'local mode':>11} {'split mode':>11}")
        for n in sizes:
            with tempfile.TemporaryDirectory() as work:
                local, split = measure(n, Path(work))
            print(f"{n:>8} {local:>10.2f}s {split:>10.2f}s", flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 5000, 10000])
