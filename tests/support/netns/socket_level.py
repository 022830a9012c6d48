"""What the lab adds for a socket-level backend (ebpf): a cgroup for node1's processes,
a bpffs for its pins, and a prober process inside that cgroup.

The cgroup programs act on sockets made by processes in the cgroup, so probes from
node1 and its pods run in the prober (one process moved into the cgroup, entering each
pod's namespace from a thread); probes from other nodes and outside clients stay in
the test process, off the node, as real remote traffic would be. The backend runs
with nsenter rather than ``ip netns exec``, which remounts /sys and would hide the
cgroup. Everything is removed by ``stop``, also after a failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lab.client import Reply
from tests.support.paths import REPO

CGROUP2 = Path("/sys/fs/cgroup/unified")
ROOT = REPO
PROBER = r'''
import json, sys
from dataclasses import asdict
from tests.support.lab.client import probe
print("ready", flush=True)
for line in sys.stdin:
    c = json.loads(line)
    replies = probe(c["ns"], c["proto"], c["host"], c["port"], c["count"], c["timeout"])
    print(json.dumps([asdict(r) for r in replies]), flush=True)
'''


def missing() -> str:
    """Why socket-level cases cannot run here, or ""."""
    if not (CGROUP2 / "cgroup.procs").exists():
        return f"needs cgroup v2 at {CGROUP2}"
    return ""


class SocketLevel:
    """The cgroup, bpffs and prober of one lab (``tag`` makes the names unique)."""

    def __init__(self, lab_dir: Path, tag: str, node_namespaces: set[str]) -> None:
        self.cgroup = CGROUP2 / f"svcproxy-lab-{tag}"
        self.bpffs = lab_dir / "bpffs"
        self.node_namespaces = node_namespaces
        self.prober: subprocess.Popen[str] | None = None
        self._mounted = False

    def start(self) -> SocketLevel:
        why = missing()
        if why:
            pytest.skip(why)
        self.cgroup.mkdir()
        self.bpffs.mkdir()
        subprocess.run(["mount", "-t", "bpf", "bpf", str(self.bpffs)], check=True)
        self._mounted = True
        self.prober = subprocess.Popen([sys.executable, "-u", "-c", PROBER], cwd=ROOT,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        (self.cgroup / "cgroup.procs").write_text(f"{self.prober.pid}\n")
        assert self.prober.stdout and self.prober.stdout.readline().strip() == "ready"
        return self

    def backend_argv(self, argv: list[str]) -> list[str]:
        """``argv`` (``ip netns exec NS svcproxy backend ...``) run with nsenter and the
        backend's cgroup and pin directory."""
        if argv[:3] == ["ip", "netns", "exec"]:
            argv = ["nsenter", f"--net=/var/run/netns/{argv[3]}", *argv[4:]]
        return [*argv, "--ebpf-cgroup", str(self.cgroup),
                "--ebpf-pin-dir", str(self.bpffs / "pins")]

    def handles(self, ns: str) -> bool:
        return ns in self.node_namespaces

    def probe(self, ns: str, proto: str, host: str, port: int, count: int,
              timeout: float) -> list[Reply]:
        assert self.prober and self.prober.stdin and self.prober.stdout
        self.prober.stdin.write(json.dumps({"ns": ns, "proto": proto, "host": host,
                                            "port": port, "count": count,
                                            "timeout": timeout}) + "\n")
        self.prober.stdin.flush()
        line = self.prober.stdout.readline()
        assert line, "the prober process died"
        return [Reply(**r) for r in json.loads(line)]

    def leftovers(self) -> list[str]:
        """Pins under the backend's pin directory and programs on the lab's cgroup."""
        pins = self.bpffs / "pins"
        found = [f"pin {p.name}" for p in pins.iterdir()] if pins.is_dir() else []
        if shutil.which("bpftool"):
            shown = subprocess.run(["bpftool", "cgroup", "show", str(self.cgroup)],
                                   capture_output=True, text=True, check=True).stdout
            found += [f"cgroup program {line}" for line in shown.splitlines()[1:]]
        return found

    def stop(self) -> None:
        """Stop the prober; unmounting the bpffs drops the pins, so the links detach."""
        if self.prober is not None:
            self.prober.kill()
            self.prober.wait(10)
        if self._mounted:
            subprocess.run(["umount", str(self.bpffs)], capture_output=True)
        if self.cgroup.exists():
            self.cgroup.rmdir()
