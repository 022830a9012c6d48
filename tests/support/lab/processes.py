"""Start the real frontend and backend processes for the lab (logs go to files)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .plan import CLUSTER_CIDRS, LAN4, LAN6, SERVICE_CIDRS

SVCPROXY = (sys.executable, "-m", "svcproxy.cli")


@dataclass
class Process:
    """A child process with its log file."""

    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    # Changes to this process's environment (None: unset).
    env: dict[str, str | None] = field(default_factory=dict)

    def start(self) -> Process:
        env = {k: v for k, v in {**os.environ, **self.env}.items() if v is not None}
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                          env=env)
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.popen is not None:
            stop(self.popen, timeout)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop(popen: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def frontend(manifests: Path, socket: Path, log: Path) -> Process:
    """``svcproxy frontend`` on a manifest directory, serving a unix socket."""
    argv = [
        *SVCPROXY, "frontend", "--manifests", str(manifests),
        "--listen", f"unix://{socket}", "--metrics-bind-address", "",
    ]
    return Process(argv, log)


def backend_argv(
    ns: str, name: str, api: str, node: str, extra: Sequence[str] = ()
) -> list[str]:
    """``svcproxy backend NAME`` inside namespace ``ns`` with the lab's cluster flags."""
    return [
        "ip", "netns", "exec", ns, *SVCPROXY, "backend", name,
        "--api", api, "--node-name", node,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS),
        "--service-cidr", ",".join(SERVICE_CIDRS),
        "--node-port-addresses", f"{LAN4}.0/24,{LAN6}:/64",
        "--min-sync-period", "0",
        *extra,
    ]


# kube-proxy's --proxy-mode of each backend (any other backend is its own mode name).
PROXY_MODES = {"nft": "nftables", "iptables": "iptables", "ipvs": "ipvs"}
# The lab's backend flags -> kube-proxy's names of them.
KUBE_PROXY_NAMES = {"--node-port-addresses": "--nodeport-addresses"}


def local_backend_argv(
    ns: str, name: str, kubeconfig: Path, node: str, extra: Sequence[str] = ()
) -> list[str]:
    """``svcproxy backend`` in local mode inside ``ns``, as a kube-proxy DaemonSet runs it:
    kube-proxy's flags, no frontend address, a kubeconfig; the lab's cluster flags as in
    ``backend_argv`` (``extra`` may name them as ``backend_argv`` does)."""
    flags = {
        "--nodeport-addresses": f"{LAN4}.0/24,{LAN6}:/64",
        "--iptables-min-sync-period": "0s",
        "--ipvs-min-sync-period": "0s",
    }
    rest: list[str] = []
    given = list(extra)
    while given:
        flag = KUBE_PROXY_NAMES.get(given[0], given[0])
        if flag in flags:
            flags[flag] = given[1]
            given = given[2:]
        else:
            rest.append(given.pop(0))
    return [
        "ip", "netns", "exec", ns, *SVCPROXY, "backend",
        f"--proxy-mode={PROXY_MODES.get(name, name)}", f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}", f"--cluster-cidr={','.join(CLUSTER_CIDRS)}",
        *(f"{flag}={value}" for flag, value in flags.items()),
        "--service-cidr", ",".join(SERVICE_CIDRS),
        *rest,
    ]


def wait_for_path(path: Path, timeout: float = 15.0, process: Process | None = None) -> None:
    """Wait until ``path`` exists (e.g. the frontend's socket)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process is not None and not process.alive():
            raise RuntimeError(f"{process.argv[3:5]} exited:\n{process.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout}s")
        time.sleep(0.05)
