"""Backends found by entry point: the built-ins and one from another package, listed and run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from svcproxy.sdk.plugins import ENTRY_POINT_GROUP, installed_backends
from svcproxy.testing import FakeCluster
from tests.sdk.test_sdk_testing import WEB
from tests.support.lab.processes import stop

BUILT_INS = {"dump", "nft", "iptables", "ipvs", "ebpf"}

PLUGIN = '''
"""Writes the node's service ports and their endpoints to a JSON file."""
import json

from svcproxy.sdk import Backend


class JsonFile(Backend):
    name = "jsonfile"
    dataplane = False

    def __init__(self, path):
        self.path = path

    def sync(self, state, changes):
        data = {str(k): sorted(r.endpoints) for k, r in state.services.items()}
        with open(self.path, "w") as out:
            json.dump(data, out)


def add_arguments(parser):
    parser.add_argument("--jsonfile-path", required=True)


def create(args, config):
    return JsonFile(args.jsonfile_path)
'''


def written(path: Path) -> object:
    """The JSON the plugin wrote; None while the file is missing or half-written (it is
    opened, emptied, then written)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def fake_distribution(root: Path, name: str, entry_points: dict[str, str]) -> None:
    """An installed distribution as pip leaves it: a dist-info with entry_points.txt."""
    info = root / f"{name}-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")


def svcproxy(*args: str, path: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(path))
    return subprocess.run([sys.executable, "-m", "svcproxy.cli", *args], env=env, text=True,
                          capture_output=True, timeout=60, **kw)  # type: ignore[call-overload]


def test_built_in_backends_register_by_entry_point() -> None:
    found = installed_backends()
    assert BUILT_INS <= found.keys()
    assert {found[n].entry_point.value for n in BUILT_INS} == {
        f"svcproxy.backends.{n}.cli" for n in BUILT_INS}
    assert all(found[n].distribution.startswith("svcproxy ") for n in BUILT_INS)


def test_svcproxy_backend_lists_and_runs_another_packages_backend(tmp_path: Path) -> None:
    (tmp_path / "jsonfile_backend.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "broken_backend.py").write_text("raise ImportError('needs libfoo')\n")
    fake_distribution(tmp_path, "svcproxy_jsonfile", {"jsonfile": "jsonfile_backend",
                                                      "broken": "broken_backend"})
    listing = svcproxy("backend", path=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()}
    assert BUILT_INS | {"jsonfile", "broken"} <= rows.keys()
    assert "svcproxy_jsonfile 1.2" in rows["jsonfile"]
    assert "Writes the node's service ports" in rows["jsonfile"]
    assert "unavailable: ImportError: needs libfoo" in rows["broken"]

    refused = svcproxy("backend", "broken", "--node-name", "n", path=tmp_path)
    assert refused.returncode != 0 and "needs libfoo" in refused.stderr

    out = tmp_path / "state.json"
    with FakeCluster(WEB) as cluster:
        proc = subprocess.Popen(
            [sys.executable, "-m", "svcproxy.cli", "backend", "jsonfile", "--api",
             cluster.target, "--node-name", "node-a", "--healthz-bind-address", "",
             "--metrics-bind-address", "", "--min-sync-period", "0",
             "--jsonfile-path", str(out)],
            env=dict(os.environ, PYTHONPATH=str(tmp_path)), stderr=subprocess.PIPE, text=True)
        try:
            want = {"shop/web:http/tcp": ["10.244.1.5", "10.244.2.5"]}
            deadline = time.monotonic() + 30
            while written(out) != want and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert written(out) == want, (proc.stderr.read() if proc.poll() is not None
                                          else f"wrote {written(out)}")
        finally:
            stop(proc)
