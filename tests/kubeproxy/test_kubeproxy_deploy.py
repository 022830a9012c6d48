"""DaemonSets that replace kube-proxy: schema-valid (kubernetes-validate, Kubernetes 1.32,
strict), one manifest for every mode (the mode in its ConfigMap), kubeadm's variant running
kube-proxy's own ConfigMap and argument list, and the privileged --init-only step really
setting a mode's sysctls (in a namespace this test creates)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from svcproxy.kubeproxy.cli import ENV_FLAGS, build_parser, effective_config, routes_here
from svcproxy.kubeproxy.config import load_config
from svcproxy.kubeproxy.flags import given_flags
from tests.support.lab.topology import Namespaces
from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
KUBEADM_CONFIG = Path(__file__).parent / "kubeadm.yaml"
KUBEADM_COMMAND = ["/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf",
                   "--hostname-override=$(NODE_NAME)"]


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def kind(name: str, k: str) -> dict:
    (found,) = [d for d in docs(name) if d["kind"] == k]
    return found


@pytest.mark.parametrize("name", ["kube-proxy-daemonset.yaml", "kubeadm-kube-proxy.yaml",
                                  "backend-daemonset.yaml"])
def test_manifests_are_valid_kubernetes(name: str) -> None:
    for doc in docs(name):
        kubernetes_validate.validate(doc, "1.32", strict=True)


def test_a_misspelt_field_is_caught_by_the_validator() -> None:
    ds = kind("kube-proxy-daemonset.yaml", "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, "1.32", strict=True)


def test_kubeadm_variant_keeps_kube_proxys_configmap_and_arguments() -> None:
    ds = kind("kubeadm-kube-proxy.yaml", "DaemonSet")
    assert (ds["metadata"]["name"], ds["metadata"]["namespace"]) == ("kube-proxy", "kube-system")
    spec = ds["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "kube-proxy"
    (container,) = spec["containers"]
    assert container["command"] == KUBEADM_COMMAND and "args" not in container
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kube-proxy")
    assert volumes[mount["name"]]["configMap"]["name"] == "kube-proxy"
    env = {e["name"] for e in container["env"]}
    assert {"NODE_NAME", ENV_FLAGS["api"]} <= env <= {"NODE_NAME", *ENV_FLAGS.values()}
    argv = [a.replace("$(NODE_NAME)", "node-a") for a in container["command"][1:]]
    assert routes_here(argv)
    args, rest = build_parser().parse_known_args(argv)
    assert rest == []
    config, ignored = effective_config(given_flags(args), KUBEADM_CONFIG.read_text())
    assert ignored == [] and config["hostnameOverride"] == "node-a"


@pytest.mark.parametrize("mode", ["iptables", "ipvs", "nftables"])
def test_one_manifest_serves_every_mode(mode: str) -> None:
    text = kind("kube-proxy-daemonset.yaml", "ConfigMap")["data"]["config.conf"]
    assert "mode: nftables" in text
    assert load_config(text.replace("mode: nftables", f"mode: {mode}"))["mode"] == mode
    spec = kind("kube-proxy-daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (main,) = spec["containers"]
    assert init["securityContext"] == {"privileged": True} and "--init-only" in init["args"]
    assert init["args"][:2] == main["args"] == KUBEADM_COMMAND[1:]
    assert "privileged" not in main["securityContext"]
    caps = main["securityContext"]["capabilities"]
    assert sorted(caps["add"]) == ["NET_ADMIN", "NET_RAW"] and caps["drop"] == ["ALL"]
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 10256}


def _netns_missing() -> str:
    if os.geteuid() != 0:
        return "needs root for a network namespace"
    return "" if Path("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait").exists() \
        else "needs nf_conntrack"


def test_init_only_sets_the_modes_sysctls_in_its_namespace(tmp_path: Path) -> None:
    reason = _netns_missing()
    if reason:
        pytest.skip(reason)
    namespaces = Namespaces()
    ns = namespaces.ns("init")
    conf = tmp_path / "config.conf"
    conf.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\nmode: iptables\n"
                    "conntrack: {maxPerCore: 0, tcpCloseWaitTimeout: 2h, udpTimeout: 45s}\n")

    def in_ns(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True,
                              text=True, timeout=60)

    def sysctl(name: str) -> str:
        return in_ns("cat", f"/proc/sys/{name}").stdout.strip()

    try:
        namespaces.add_ns("init")
        assert sysctl("net/ipv4/conf/all/route_localnet") == "0"
        proc = in_ns(sys.executable, "-m", "svcproxy.cli", "backend", f"--config={conf}",
                     "--hostname-override=node-a", "--init-only")
        assert proc.returncode == 0, proc.stderr
        assert sysctl("net/ipv4/conf/all/route_localnet") == "1"
        assert sysctl("net/netfilter/nf_conntrack_tcp_timeout_close_wait") == "7200"
        assert sysctl("net/netfilter/nf_conntrack_udp_timeout") == "45"
        assert "Set sysctl net.ipv4.conf.all.route_localnet=1" in proc.stderr
    finally:
        namespaces.destroy()


@pytest.mark.parametrize("name", ["kube-proxy-daemonset.yaml", "kubeadm-kube-proxy.yaml"])
def test_a_privileged_init_only_step_runs_first(name: str) -> None:
    """--init-only, privileged, with the main container's command and configuration: the
    sysctls, and the other modes' leftovers (kube-proxy's own included) removed before the
    backend starts."""
    spec = kind(name, "DaemonSet")["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (main,) = spec["containers"]
    argv = init.get("command", []) + init.get("args", [])
    assert argv == main.get("command", []) + main.get("args", []) + ["--init-only"]
    assert init["securityContext"] == {"privileged": True}
    config = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}["/var/lib/kube-proxy"]
    assert config in {m["name"] for m in init["volumeMounts"]}
