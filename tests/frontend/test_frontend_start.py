"""What ``svcproxy frontend`` loads before it can sync: nothing of the backends or of the
node agent's command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

ROOT = REPO
# ``svcproxy frontend`` run in a fresh interpreter, its modules written out as it exits.
FRONTEND_PROCESS = """
import atexit, json, sys
from pathlib import Path
from svcproxy.cli import main
atexit.register(lambda: Path(sys.argv[1]).write_text(json.dumps(sorted(sys.modules))))
sys.exit(main(sys.argv[2:]))
"""


def test_frontend_process_loads_no_backend(tmp_path: Path) -> None:
    """The command line of ``svcproxy frontend`` is parsed without the backends' parsers
    (each installed backend's plugin and the node agent's modules were ~0.3 s of the
    frontend's start); the whole parser still has every command."""
    modules = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", FRONTEND_PROCESS, str(modules), "-v", "frontend",
         f"--kubeconfig={tmp_path / 'missing'}", f"--listen=unix://{tmp_path / 'api.sock'}",
         "--metrics-bind-address="], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 1 and "cannot start the frontend" in done.stderr, done.stderr
    loaded = set(json.loads(modules.read_text()))
    assert "svcproxy.frontend.main" in loaded
    unused = {m for m in loaded if m.startswith((
        "svcproxy.backends", "svcproxy.sdk.agent", "svcproxy.sdk.node_agent",
        "svcproxy.kubeproxy.cli", "svcproxy.sdk.plugins"))}
    assert not unused, f"imported by svcproxy frontend: {sorted(unused)}"


def test_whole_parser_has_every_command() -> None:
    from svcproxy.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["frontend"]).command == "frontend"
    assert parser.parse_args(["certs", "dir"]).command == "certs"
    assert parser.parse_args(["backend"]).command == "backend"
    assert build_parser("frontend").parse_args(["-v", "frontend"]).verbose


# ``svcproxy frontend`` noting what it had imported when it first connected to the apiserver.
FIRST_CONNECT = """
import json, sys
from svcproxy.cli import main
port = int(sys.argv[2])
seen = []
def hook(event, args):
    if event == "socket.connect" and not seen and isinstance(args[1], tuple) and (
            args[1][1] == port):
        seen.append(sorted(sys.modules))
        with open(sys.argv[1], "w") as out:
            json.dump(seen[0], out)
sys.addaudithook(hook)
sys.exit(main(sys.argv[3:]))
"""


def test_the_apiserver_is_asked_before_the_rest_is_imported(tmp_path: Path) -> None:
    """The list requests go out before gRPC, the engine and the metrics are imported (the
    apiserver answers meanwhile); the pages then reach the engine, which syncs."""
    from urllib.parse import urlparse

    from tests.support.fakeapiserver import FakeApiserver, write_kubeconfig

    fake = FakeApiserver(token="t")
    seen = tmp_path / "seen.json"
    try:
        fake.create("Service", {"metadata": {"name": "web", "namespace": "default"},
                                "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, "t")
        proc = subprocess.Popen(
            [sys.executable, "-c", FIRST_CONNECT, str(seen), str(urlparse(fake.url).port),
             "frontend", f"--kubeconfig={kubeconfig}",
             f"--listen=unix://{tmp_path / 'api.sock'}", "--metrics-bind-address="],
            stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "frontend synced: 1 services" in line:
                    break
            else:
                raise AssertionError("the frontend ended before syncing")
        finally:
            proc.kill()
            proc.wait(30)
    finally:
        fake.close()
    modules = set(json.loads(seen.read_text()))
    assert "kubernetes.client" in modules
    early = modules & {"grpc", "prometheus_client", "svcproxy.frontend.pipeline.engine",
                       "svcproxy.frontend.main"}
    assert not early, f"imported before the apiserver was asked: {sorted(early)}"


def test_a_held_sink_hands_on_what_it_held_in_order() -> None:
    from svcproxy.frontend.sources.apiserver_early import HeldSink
    from svcproxy.frontend.sources.events import Delete

    got: list[object] = []
    sink = HeldSink()
    sink([Delete("Node", "", "a")])
    sink([Delete("Node", "", "b"), Delete("Node", "", "c")])
    assert got == []
    sink.connect(got.extend)
    sink([Delete("Node", "", "d")])
    assert [e.name for e in got] == ["a", "b", "c", "d"]  # type: ignore[attr-defined]


IN_A_POD = """
import json, os, sys
from svcproxy.frontend.sources.apiserver import load_api_client
from kubernetes.config import incluster_config
incluster_config.SERVICE_TOKEN_FILENAME, incluster_config.SERVICE_CERT_FILENAME = sys.argv[1:3]
os.environ.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
client = load_api_client(None)
print(json.dumps([client.configuration.host, sorted(sys.modules)]))
"""


def test_in_a_pod_the_kubeconfig_loader_is_not_imported(tmp_path: Path) -> None:
    """With the pod's ServiceAccount (the Deployment's and the DaemonSet's case) the client
    is configured without the kubeconfig loader and what it brings (requests-oauthlib,
    oauthlib, requests: ~0.2 s of a start)."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("pod-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    done = subprocess.run([sys.executable, "-c", IN_A_POD, str(token), str(ca)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    host, modules = json.loads(done.stdout)
    assert host == "https://10.96.0.1:443"
    loaded = {m for m in modules if m.split(".")[0] in ("requests_oauthlib", "oauthlib",
                                                        "requests")}
    assert not loaded and "kubernetes.config.kube_config" not in modules, sorted(loaded)
