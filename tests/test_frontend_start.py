"""What ``svcproxy frontend`` loads before it can sync: nothing of the backends or of the
node agent's command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
        "svcproxy.backends", "svcproxy.agent.cli", "svcproxy.agent.node_agent",
        "svcproxy.agent.kubeproxy_cli", "svcproxy.sdk.plugins"))}
    assert not unused, f"imported by svcproxy frontend: {sorted(unused)}"


def test_whole_parser_has_every_command() -> None:
    from svcproxy.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["frontend"]).command == "frontend"
    assert parser.parse_args(["certs", "dir"]).command == "certs"
    assert parser.parse_args(["backend"]).command == "backend"
    assert build_parser("frontend").parse_args(["-v", "frontend"]).verbose
