"""The README's demo: the frontend on examples/cluster, a dump backend, a live change.

Then, when run as root with nftables available, the real-packet demo
(scripts/demo_packets.py): network namespaces, the nft backend, a client's
requests spread across pods.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def summary(record: dict) -> str:
    key = record["service"]["key"]
    eps = [f"{e['ip']}:{e['port']}{' (local)' if e.get('isLocal') else ''}"
           for e in record.get("endpoints", []) if e.get("internal")]
    return f"{key['namespace']}/{key['name']}:{key.get('portName', '')} -> {', '.join(eps)}"


def read_line(proc: subprocess.Popen[str], timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip():
            return json.loads(line)
    raise SystemExit("demo: the dump backend printed nothing; see the log above")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="svcproxy-demo-"))
    manifests = work / "manifests"
    shutil.copytree(ROOT / "examples" / "cluster", manifests)
    sock = work / "api.sock"
    procs: list[subprocess.Popen[str]] = []
    try:
        say(f"frontend: svcproxy frontend --manifests {manifests} --listen unix://{sock}")
        procs.append(subprocess.Popen(
            [*SVCPROXY, "frontend", "--manifests", str(manifests), "--listen",
             f"unix://{sock}", "--metrics-bind-address", ""], text=True))
        say("backend: svcproxy backend dump --node-name node-a (one JSON line per sync)")
        dump = subprocess.Popen(
            [*SVCPROXY, "backend", "dump", "--api", f"unix://{sock}", "--node-name", "node-a",
             "--min-sync-period", "0", "--healthz-bind-address", "", "--metrics-bind-address",
             ""], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(dump)
        snap = read_line(dump)
        print(f"snapshot at revision {snap['revision']}, node {snap['node']['name']} "
              f"(zone {snap['node'].get('zone')}):")
        for rec in snap["services"]:
            print("  " + summary(rec))
        say("edit examples: scale shop/web down (remove the pod 10.244.2.10 on node-b)")
        web = manifests / "web.yaml"
        text = web.read_text()
        web.write_text(text[:text.index("- addresses: [10.244.2.10]")])
        t0 = time.monotonic()
        change = read_line(dump)
        print(f"change arrived after {1000 * (time.monotonic() - t0):.0f} ms "
              f"(revision {change['revision']}):")
        for rec in change["set"]:
            print("  " + summary(rec))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    packets = ROOT / "scripts" / "demo_packets.py"
    if os.geteuid() == 0 and shutil.which("nft") and packets.exists():
        say("real packets: network namespaces, the frontend and the nft backend")
        return subprocess.call([sys.executable, str(packets)])
    print("\n(skipping the real-packet demo: it needs root, nft and scripts/demo_packets.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
