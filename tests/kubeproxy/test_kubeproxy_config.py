"""kube-proxy's KubeProxyConfiguration and flags: strict decoding, defaults, precedence,
--write-config-to, and a kube-proxy DaemonSet's argument list running unchanged."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from svcproxy.kubeproxy.cli import (
    backend_namespace,
    build_parser,
    effective_config,
    routes_here,
    unhonoured_fields,
)
from svcproxy.kubeproxy.config import (
    ConfigError,
    encode_config,
    format_go_duration,
    load_config,
)
from svcproxy.kubeproxy.flags import FLAGS, given_flags, normalize_argv
from tests.support.examples import copy_examples
from tests.support.lab.processes import stop

DATA = Path(__file__).parent
SVCPROXY = [sys.executable, "-m", "svcproxy.cli"]

# cmd/kube-proxy/app/options.go (v1.32) AddFlags + logsapi.AddFlags, Linux build.
KUBE_PROXY_FLAGS = {
    "config", "write-config-to", "cleanup", "init-only", "feature-gates", "kubeconfig",
    "master", "kube-api-content-type", "kube-api-burst", "kube-api-qps", "hostname-override",
    "bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail",
    "profiling", "show-hidden-metrics-for-version", "proxy-mode", "iptables-masquerade-bit",
    "masquerade-all", "iptables-localhost-nodeports", "iptables-sync-period",
    "iptables-min-sync-period", "ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler",
    "ipvs-exclude-cidrs", "ipvs-strict-arp", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout",
    "ipvs-udp-timeout", "detect-local-mode", "pod-bridge-interface",
    "pod-interface-name-prefix", "cluster-cidr", "nodeport-addresses", "oom-score-adj",
    "conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established",
    "conntrack-tcp-timeout-close-wait", "conntrack-tcp-be-liberal", "conntrack-udp-timeout",
    "conntrack-udp-timeout-stream", "config-sync-period", "healthz-port", "metrics-port",
    "v", "vmodule", "log-flush-frequency", "logging-format", "log-json-info-buffer-size",
    "log-json-split-stream", "log-text-info-buffer-size", "log-text-split-stream",
}


def load(name: str) -> dict:
    return load_config((DATA / name).read_text())


def flags(*argv: str) -> dict:
    args, rest = build_parser().parse_known_args(normalize_argv(argv))
    assert rest == []
    return given_flags(args)


@pytest.mark.parametrize("name", ["kubeadm.yaml", "ipvs-tuned.yaml", "nftables.yaml"])
def test_every_mode_round_trips_through_write_config(name: str) -> None:
    config = load(name)
    again = load_config(encode_config(config))
    assert again == config


def test_kubeadm_default_gets_kube_proxy_defaults() -> None:
    c = load("kubeadm.yaml")
    assert c["mode"] == "" and c["clusterCIDR"] == "10.244.0.0/16"
    assert c["healthzBindAddress"] == "0.0.0.0:10256"
    assert c["metricsBindAddress"] == "127.0.0.1:10249"
    assert c["iptables"] == {"masqueradeBit": 14, "masqueradeAll": False,
                             "localhostNodePorts": True, "syncPeriod": 30.0,
                             "minSyncPeriod": 1.0}
    assert c["ipvs"]["syncPeriod"] == 30.0 and c["ipvs"]["minSyncPeriod"] == 0.0
    assert c["conntrack"]["maxPerCore"] == 32768 and c["conntrack"]["min"] == 131072
    assert c["conntrack"]["tcpEstablishedTimeout"] == 86400.0
    assert c["oomScoreAdj"] == -999 and c["configSyncPeriod"] == 900.0
    assert c["clientConnection"]["kubeconfig"] == "/var/lib/kube-proxy/kubeconfig.conf"
    # kubeadm's file: nothing to warn about (its kubeconfig serves local mode)
    assert unhonoured_fields(c, "iptables") == []


def test_tuned_ipvs_maps_onto_the_ipvs_backend() -> None:
    c = load("ipvs-tuned.yaml")
    parser = argparse.ArgumentParser()
    from svcproxy.backends.ipvs import cli as ipvs_cli
    from svcproxy.sdk.agent import add_agent_arguments

    add_agent_arguments(parser)
    ipvs_cli.add_arguments(parser)
    ns = backend_namespace(c, "ipvs", parser, ["--node-ip", "192.0.2.1"])
    assert (ns.ipvs_scheduler, ns.ipvs_strict_arp) == ("lc", True)
    assert ns.ipvs_exclude_cidrs == ("10.1.0.0/16",)
    assert (ns.ipvs_tcp_timeout, ns.ipvs_tcpfin_timeout, ns.ipvs_udp_timeout) == (900, 120, 300)
    assert (ns.sync_period, ns.min_sync_period) == (60.0, 0.5)
    assert ns.masquerade_all is True and ns.node_name == "worker-7"
    assert ns.node_port_addresses == ("192.168.0.0/16",)
    assert ns.healthz_bind_address == "0.0.0.0:10256"


def test_nftables_sections_and_unhonoured_fields_are_named() -> None:
    c = load("nftables.yaml")
    assert c["mode"] == "nftables" and c["nftables"]["minSyncPeriod"] == 0.25
    lines = unhonoured_fields(c, "nft")
    assert any(line.startswith("ipvs.scheduler=wrr: does not apply to backend nft")
               for line in lines)
    assert any(line.startswith("enableProfiling=true") for line in lines)
    assert not any(line.startswith("nftables.") for line in lines)


def test_a_flag_setting_both_modes_is_not_warned_about_in_nft_mode() -> None:
    c, _ = effective_config(flags("--proxy-mode=nftables", "--iptables-min-sync-period=2s",
                                  "--iptables-sync-period=1m"), None)
    assert c["nftables"]["minSyncPeriod"] == 2.0
    assert unhonoured_fields(c, "nft") == []
    c["iptables"]["minSyncPeriod"] = 5.0  # set in the iptables section alone: not nft's
    assert unhonoured_fields(c, "nft") == [
        "iptables.minSyncPeriod=5s: does not apply to backend nft; ignored"]


@pytest.mark.parametrize(("patch", "message"), [
    ("ipvs:\n  schedular: rr\n", 'unknown field "ipvs.schedular"'),
    ("hostNameOverride: x\n", 'unknown field "hostNameOverride" (did you mean'),
    ("iptables:\n  masqueradeBit: \"14\"\n", "iptables.masqueradeBit: expected int32"),
    ("conntrack:\n  maxPerCore: 1.5\n", "conntrack.maxPerCore: expected int32"),
    ("ipvs:\n  strictARP: \"yes\"\n", "ipvs.strictARP: expected boolean"),
    ("nodePortAddresses: 10.0.0.0/8\n", "nodePortAddresses: expected list of strings"),
    ("iptables:\n  syncPeriod: 30\n", "iptables.syncPeriod: expected duration string"),
    ("conntrack:\n  udpTimeout: 30x\n", "conntrack.udpTimeout: invalid duration '30x'"),
    ("mode: ipvs\nmode: iptables\n", "duplicate field 'mode'"),
    ("iptables:\n  masqueradeBit: 40\n", "iptables.masqueradeBit: 40 must be within [0, 31]"),
    ("kind: KubeletConfiguration\n", "kind KubeProxyConfiguration"),
    ("bindAddress: node-1\n", "bindAddress: 'node-1' is not an IP address"),
    ("healthzBindAddress: 'x:10256'\n", "healthzBindAddress: 'x:10256' is not IP:PORT"),
    ("metricsBindAddress: '127.0.0.1:99999'\n", "metricsBindAddress: '127.0.0.1:99999'"),
    # kube-proxy's validation, before --write-config-to as well as before running
    ("iptables: {syncPeriod: 10s, minSyncPeriod: 20s}\n",
     "iptables.minSyncPeriod: 20s must not exceed iptables.syncPeriod (10s)"),
    ("mode: ipvs\nipvs: {syncPeriod: 10s, minSyncPeriod: 1m}\n", "ipvs.minSyncPeriod: 1m0s"),
    ("conntrack: {maxPerCore: -1}\n", "conntrack.maxPerCore: -1 must be greater than or equal"),
    ("conntrack: {min: -5}\n", "conntrack.min: -5 must be greater than or equal to 0"),
    ("clientConnection: {burst: -1}\n", "clientConnection.burst: -1 must be greater than or"),
    ("clusterCIDR: 10.0.0.0/33\n", "clusterCIDR: '10.0.0.0/33' is not a valid CIDR"),
    ("clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n", "clusterCIDR: '10.0.0.0/8,10.1.0.0/16' must be"),
    ("clusterCIDR: 10.0.0.0/8,fd00::/48,fd01::/48\n", "clusterCIDR: "),
    ("nodePortAddresses: [bogus]\n", "nodePortAddresses[0]: 'bogus' is not a valid CIDR"),
    ("nodePortAddresses: [primary, 10.0.0.0/8]\n", "nodePortAddresses[0]: can't use both"),
    ("mode: ipvs\nipvs: {excludeCIDRs: [10.0.0.0/8, x]}\n",
     "ipvs.excludeCIDRs[1]: 'x' is not a valid CIDR"),
    ("detectLocalMode: BridgeInterface\n", "detectLocal.bridgeInterface: must not be empty"),
    ("detectLocalMode: InterfaceNamePrefix\n",
     "detectLocal.interfaceNamePrefix: must not be empty"),
    ("logging: {format: xml}\n", "logging.format: 'xml' is not supported (json, text)"),
    ("logging: {format: json, vmodule: [{filePattern: a, verbosity: 2}]}\n",
     "logging.vmodule: only supported for the text log format"),
    ("logging: {options: {json: {infoBufferSize: 5Zi}}}\n",
     "logging.options.json.infoBufferSize: '5Zi' is not a quantity"),
    ("showHiddenMetricsForVersion: '1.20'\n", "showHiddenMetricsForVersion: '1.20' must be"),
    ("portRange: 2000-1000\n", "portRange: '2000-1000' must be a valid port range"),
    ("portRange: banana\n", "portRange: 'banana' must be a valid port range"),
])
def test_bad_files_are_refused_naming_the_field(patch: str, message: str) -> None:
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    text = base + patch if "kind:" not in patch else base.splitlines()[0] + "\n" + patch
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert message in str(err.value)


@pytest.mark.parametrize("patch", [
    "iptables: {syncPeriod: 10s, minSyncPeriod: 10s}\n",
    "mode: ipvs\niptables: {syncPeriod: 10s, minSyncPeriod: 20s}\n",  # not ipvs's section
    "clusterCIDR: 10.0.0.0/8,fd00::/48\n",
    "detectLocalMode: NodeCIDR\nclusterCIDR: 10.0.0.0/8,10.1.0.0/16\n",  # not used
    "nodePortAddresses: [primary]\n",
    "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0}\n",
    "logging: {format: json, options: {json: {infoBufferSize: 64Ki}}}\n",
    "logging: {options: {text: {infoBufferSize: 1.5e3}}}\n",
    "showHiddenMetricsForVersion: '1.31'\n",
    "portRange: 30000-30100\n", "portRange: '30000+100'\n", "portRange: '8080'\n",
])
def test_what_kube_proxy_validates_and_accepts_is_accepted(patch: str) -> None:
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    load_config(base + patch)


# Every CIDR field ({} the CIDR, a YAML single-quoted string) and the backend flag it sets.
CIDR_FIELDS = {"nodePortAddresses: ['{}']\n": "node_port_addresses",
               "clusterCIDR: '{}'\n": "cluster_cidr",
               "mode: ipvs\nipvs: {{excludeCIDRs: ['{}']}}\n": "ipvs_exclude_cidrs"}
BASE = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


@pytest.mark.parametrize("field", CIDR_FIELDS)
@pytest.mark.parametrize("cidr", ["10.0.0.0 /8", "10.0.0.0/ 8", "10.0.0.0\t/8", "fd00:: /64",
                                  "10.0. 0.0/8", "10.0.0.0/255.0.0.0", "10.0.0.1"])
def test_a_cidr_with_whitespace_inside_a_netmask_or_no_length_is_refused(
        field: str, cidr: str) -> None:
    """As kube-proxy's netutils.ParseCIDRSloppy refuses them; the node agent's flags
    read CIDRs with the same function (svcproxy.model.normalize_cidr)."""
    from svcproxy.sdk.agent import cidr_list

    with pytest.raises(ConfigError, match="is not a valid CIDR"):
        load_config(BASE + field.format(cidr))
    with pytest.raises(argparse.ArgumentTypeError):
        cidr_list(cidr)


@pytest.mark.parametrize("field", CIDR_FIELDS)
def test_a_cidr_is_read_as_kube_proxy_reads_it(field: str) -> None:
    """IPv4 octets with leading zeros (ParseCIDRSloppy) are accepted and passed on
    canonical; whitespace around a CIDR is dropped, as around a list item."""
    from svcproxy.backends.ipvs import cli as ipvs_cli
    from svcproxy.sdk.agent import add_agent_arguments

    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    ipvs_cli.add_arguments(parser)
    for cidr in ("010.001.0.0/016", " 10.1.0.0/16 "):
        ns = backend_namespace(load_config(BASE + field.format(cidr)), "ipvs", parser,
                               ["--node-ip", "192.0.2.1"])
        assert getattr(ns, CIDR_FIELDS[field]) == ("10.1.0.0/16",)


def test_every_invalid_field_is_named_at_once() -> None:
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    with pytest.raises(ConfigError) as err:
        load_config(base + "conntrack: {min: -1}\nlogging: {format: xml}\n")
    assert "conntrack.min" in str(err.value) and "logging.format" in str(err.value)


@pytest.mark.parametrize("master", ["not a url", "ftp://host", "https://", "https://h:99999",
                                    "h:port", "https://h x"])
def test_a_master_that_is_no_apiserver_address_is_refused(
    master: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused at the start, naming the flag, not retried for ever as a host to list from."""
    with pytest.raises(SystemExit):
        flags(f"--master={master}")
    assert "--master" in capsys.readouterr().err


@pytest.mark.parametrize("master", ["https://10.0.0.1:6443", "http://[fd00::1]:8080/prefix",
                                    "apiserver.example:6443", "10.0.0.1"])
def test_an_apiserver_address_is_a_master(master: str) -> None:
    assert flags(f"--master={master}") == {"master": master}


def test_invalid_flags_are_refused_as_the_file_would_be() -> None:
    with pytest.raises(ConfigError, match="clusterCIDR: '10.0.0.0/33'"):
        effective_config(flags("--cluster-cidr=10.0.0.0/33"), None)
    with pytest.raises(SystemExit):
        flags("--log-json-info-buffer-size=lots")
    assert flags("--log-json-info-buffer-size=64Ki") == {"log-json-info-buffer-size": "64Ki"}


def test_refusal_is_a_clear_exit(tmp_path: Path) -> None:
    bad = tmp_path / "config.conf"
    bad.write_text((DATA / "kubeadm.yaml").read_text().replace("strictARP", "strictArp"))
    proc = subprocess.run([*SVCPROXY, "backend", f"--config={bad}"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert 'unknown field "ipvs.strictArp"' in proc.stderr and str(bad) in proc.stderr


def test_go_durations_are_written_as_go_writes_them() -> None:
    cases = {0: "0s", 0.3: "300ms", 1.5: "1.5s", 90: "1m30s", 3600: "1h0m0s",
             86400: "24h0m0s", 0.00025: "250µs", 61.25: "1m1.25s"}
    assert {s: format_go_duration(s) for s in cases} == cases


def test_flags_without_config_override_defaults() -> None:
    c, ignored = effective_config(flags(
        "--proxy-mode=ipvs", "--ipvs-scheduler", "sh", "--iptables_min_sync_period=0",
        "--masquerade-all", "--nodeport-addresses=10.0.0.0/8", "--nodeport-addresses",
        "192.168.0.0/16", "--feature-gates=A=true,B=false", "-v=4", "--metrics-port=0",
        "--conntrack-tcp-be-liberal=false"), None)
    assert ignored == []
    assert c["mode"] == "ipvs" and c["ipvs"]["scheduler"] == "sh"
    assert c["iptables"]["minSyncPeriod"] == 0.0  # an explicit 0 is not defaulted away
    assert c["iptables"]["masqueradeAll"] and c["nftables"]["masqueradeAll"]
    assert c["nodePortAddresses"] == ["10.0.0.0/8", "192.168.0.0/16"]
    assert c["featureGates"] == {"A": True, "B": False}
    assert c["logging"]["verbosity"] == 4 and c["metricsBindAddress"] == ""
    assert c["conntrack"]["tcpBeLiberal"] is False


@pytest.mark.parametrize(("argv", "healthz", "metrics"), [
    # addressFromDeprecatedFlags: 0 turns the server off, another port is the port of an
    # address that has none (the defaults have one: --healthz-port=12345 changes nothing)
    (["--healthz-port=0", "--metrics-port=0"], "", ""),
    (["--healthz-port=12345"], "0.0.0.0:10256", "127.0.0.1:10249"),
    (["--healthz-bind-address=10.1.2.3", "--healthz-port=12345"], "10.1.2.3:12345",
     "127.0.0.1:10249"),
    (["--metrics-bind-address=::1", "--healthz-bind-address=10.1.2.3"], "10.1.2.3:10256",
     "[::1]:10249"),
    (["--healthz-bind-address=10.1.2.3:99", "--healthz-port=12345"], "10.1.2.3:99",
     "127.0.0.1:10249"),
    # with --write-config-to kube-proxy does not read them
    (["--write-config-to=/x", "--healthz-port=0", "--metrics-port=0"], "0.0.0.0:10256",
     "127.0.0.1:10249"),
])
def test_deprecated_ports_as_kube_proxy_reads_them(argv: list[str], healthz: str,
                                                   metrics: str) -> None:
    c, _ = effective_config(flags(*argv), None)
    assert (c["healthzBindAddress"], c["metricsBindAddress"]) == (healthz, metrics)


def test_with_config_the_file_wins_except_hostname_and_logging() -> None:
    text = (DATA / "ipvs-tuned.yaml").read_text()
    c, ignored = effective_config(flags(
        "--config=x", "--ipvs-scheduler=rr", "--proxy-mode=iptables",
        "--hostname-override=Other-Node", "--v=5"), text)
    assert c["mode"] == "ipvs" and c["ipvs"]["scheduler"] == "lc"
    assert c["hostnameOverride"] == "other-node" and c["logging"]["verbosity"] == 5
    assert ignored == ["ipvs-scheduler", "proxy-mode"]


def test_every_kube_proxy_flag_is_accepted() -> None:
    names = {f.name for f in FLAGS}
    # and two that other builds have: --windows-service, --proxy-port-range (deprecated)
    assert names - KUBE_PROXY_FLAGS == {"windows-service", "proxy-port-range"}
    samples = {"go_bool": "true", "go_duration": "1m30s", "int32": "3", "float32": "5",
               "string_list": "10.0.0.0/8", "ip_address": "10.0.0.1",
               "ip_port": "0.0.0.0:10256", "feature_gates": "X=true", "vmodule": "a=2",
               "str": "x", "quantity": "64Ki", "apiserver_url": "https://10.0.0.1:6443"}
    argv = []
    for f in FLAGS:
        argv.append(f"--{f.name}" if f.parse is None else
                    f"--{f.name}={samples[f.parse.__name__]}")
    assert set(flags(*argv)) == names


@pytest.mark.parametrize(("argv", "routed"), [
    ([], False), (["nft"], False), (["nft", "--api", "x"], False),
    (["--config=/x"], True), (["nft", "--config", "/x"], True),
    (["ipvs", "--proxy-mode=ipvs"], True), (["--help"], True),
])
def test_kube_proxy_style_invocations_are_recognised(argv: list[str], routed: bool) -> None:
    assert routes_here(argv) is routed


def test_write_config_to_includes_flags(tmp_path: Path) -> None:
    out = tmp_path / "effective.yaml"
    proc = subprocess.run(
        [*SVCPROXY, "backend", "--proxy-mode=nftables", "--nftables_unknown_is_refused=1"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--nftables-unknown-is-refused" in proc.stderr
    proc = subprocess.run(
        [*SVCPROXY, "backend", "--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16",
         "--iptables-min-sync-period=250ms", f"--write-config-to={out}"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load(out.read_text())
    assert written["mode"] == "nftables" and written["clusterCIDR"] == "10.244.0.0/16"
    assert written["nftables"]["minSyncPeriod"] == "250ms"
    assert load_config(out.read_text())["nftables"]["minSyncPeriod"] == 0.25


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kube_proxy_daemonset_arguments_run_unchanged(tmp_path: Path) -> None:
    """kubeadm's kube-proxy command line, image swapped, frontend address in $SVCPROXY_API."""
    sock = tmp_path / "api.sock"
    healthz = _free_port()
    conf = tmp_path / "config.conf"
    conf.write_text((DATA / "kubeadm.yaml").read_text()
                    .replace('mode: ""', "mode: dump")
                    .replace('healthzBindAddress: ""', f"healthzBindAddress: 127.0.0.1:{healthz}")
                    .replace('metricsBindAddress: ""', "metricsBindAddress: 127.0.0.1:0"))
    frontend = subprocess.Popen(
        [*SVCPROXY, "frontend", "--manifests", str(copy_examples(tmp_path)), "--listen",
         f"unix://{sock}", "--metrics-bind-address", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "SVCPROXY_API": f"unix://{sock}", "NODE_NAME": "node-a"}
    args = [f"--config={conf}", "--hostname-override=$(NODE_NAME)".replace(
        "$(NODE_NAME)", env["NODE_NAME"])]
    backend = subprocess.Popen([*SVCPROXY, "backend", *args], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = backend.stdout.readline() if backend.stdout else ""
        state = json.loads(line)
        assert "10.244.1.10" in json.dumps(state)  # node-a's state from the frontend
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline and status != 200:
            conn = http.client.HTTPConnection("127.0.0.1", healthz, timeout=2)
            try:
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
            except OSError:
                time.sleep(0.2)
            finally:
                conn.close()
        assert status == 200
    finally:
        stop(backend)
        stop(frontend)
    assert backend.returncode == 0


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                     st.floats(allow_nan=False), st.text(max_size=12))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)
_fields = st.sampled_from(["mode", "iptables", "ipvs", "conntrack", "logging", "featureGates",
                           "nodePortAddresses", "oomScoreAdj", "clientConnection", "detectLocal",
                           "bindAddress", "healthzBindAddress", "nope"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_fields, _values, max_size=5))
def test_hostile_files_are_refused_cleanly(fields: dict) -> None:
    """Whatever the file holds, it loads or is refused with ConfigError (never a crash)."""
    base = {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration"}
    try:
        config = load_config(yaml.safe_dump({**base, **fields}))
    except ConfigError as err:
        assert str(err)
    else:
        assert load_config(encode_config(config)) == config


def test_cleanup_through_kube_proxy_flags() -> None:
    proc = subprocess.run([*SVCPROXY, "backend", "--proxy-mode=dump", "--cleanup"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_master_with_config_is_one_warning_and_not_said_to_follow_kube_proxy(
        tmp_path: Path) -> None:
    """kube-proxy uses --master with --config too; svcproxy cannot, and says so once."""
    conf = tmp_path / "config.conf"
    conf.write_text((DATA / "kubeadm.yaml").read_text().replace('mode: ""', "mode: dump"))
    proc = subprocess.run([*SVCPROXY, "backend", f"--config={conf}",
                           "--master=https://10.0.0.1:6443", "--cleanup"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "--master" in line]
    assert len(warnings) == 1 and "because --config is given" not in warnings[0]


def test_unhonoured_durations_are_shown_as_go_durations() -> None:
    c, _ = effective_config(flags("--config-sync-period=1m30s"), None)
    assert unhonoured_fields(c, "dump") == [
        "configSyncPeriod=1m30s: the frontend watches the apiserver, not the backend; ignored"]


@pytest.mark.parametrize(("argv", "code", "printed"), [
    (["--version"], 0, True), (["--version=true"], 0, True), (["--version=raw"], 0, True),
    (["--version=false", "--proxy-mode=dump", "--write-config-to=/dev/null"], 0, False),
    (["--version=maybe"], 2, False),
])
def test_version_takes_kube_proxys_values(argv: list[str], code: int, printed: bool) -> None:
    """kube-proxy's --version[=true|raw|false]: false runs as if it were not given."""
    proc = subprocess.run([*SVCPROXY, "backend", *argv], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith("svcproxy ") is printed
    if code == 2:
        assert "--version" in proc.stderr


def test_the_files_hostname_override_is_lower_cased_as_kube_proxy_does() -> None:
    """kube-proxy's node name is GetHostname(hostnameOverride): trimmed and lower-cased
    (Node objects' names are), from the file as from the flag."""
    from svcproxy.sdk.agent import add_agent_arguments

    c = load_config("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
                    "kind: KubeProxyConfiguration\nhostnameOverride: ' Worker-7 '\n")
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    assert backend_namespace(c, "dump", parser, []).node_name == "worker-7"


@pytest.mark.parametrize(("argv", "backend", "line"), [
    (["--iptables-masquerade-bit=10"], "dump",
     "iptables.masqueradeBit and nftables.masqueradeBit=10: does not apply to backend dump"),
    (["--proxy-mode=ipvs", "--iptables-sync-period=1m"], "ipvs",
     "iptables.syncPeriod and nftables.syncPeriod=1m0s: does not apply to backend ipvs"),
])
def test_one_flag_that_does_not_apply_is_one_warning(argv: list[str], backend: str,
                                                      line: str) -> None:
    c, _ = effective_config(flags(*argv), None)
    assert unhonoured_fields(c, backend) == [line + "; ignored"]


def test_json_logging_writes_one_json_object_a_line() -> None:
    """logging.format json (--logging-format=json): every line parses, as kube-proxy's do."""
    proc = subprocess.run([*SVCPROXY, "backend", "--proxy-mode=dump", "--logging-format=json",
                           "--cleanup", "--profiling", "--show-hidden-metrics-for-version=1.31"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert any(line["msg"].startswith("enableProfiling=true") for line in lines)
    assert all(isinstance(line["ts"], float) and line["level"] in ("INFO", "WARNING")
               for line in lines)


def test_fields_kube_proxy_dropped_are_accepted_with_a_warning(tmp_path: Path) -> None:
    """A field an older kube-proxy had (udpIdleTimeout, resourceContainer, conntrack.max)
    still runs with kube-proxy 1.32 (its lenient fallback for v1alpha1): accepted with one
    warning each; any other unknown field is still refused."""
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    old = base + ("mode: dump\nudpIdleTimeout: 250ms\nresourceContainer: /kube-proxy\n"
                  "conntrack: {max: null, maxPerCore: 0}\n")
    notes: list[str] = []
    assert load_config(old, notes)["conntrack"]["maxPerCore"] == 0
    assert [n.split(":")[0] for n in notes] == ["udpIdleTimeout", "resourceContainer",
                                                "conntrack.max"]
    assert load_config(encode_config(load_config(old))) == load_config(old)
    conf = tmp_path / "config.conf"
    conf.write_text(old)
    proc = subprocess.run([*SVCPROXY, "backend", f"--config={conf}", "--cleanup"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("udpIdleTimeout") == 1 and "WARNING" in proc.stderr
    with pytest.raises(ConfigError, match='unknown field "udpIdleTimeouts"'):
        load_config(base + "udpIdleTimeouts: 250ms\n")


def test_an_empty_hostname_override_is_unset_and_a_blank_one_refused() -> None:
    """kube-proxy skips --hostname-override= (empty) and refuses one of spaces only."""
    c, _ = effective_config(flags("--hostname-override="), None)
    assert c["hostnameOverride"] == ""
    with pytest.raises(ConfigError, match="--hostname-override"):
        effective_config(flags("--hostname-override=  "), None)


def test_a_file_of_several_documents_is_refused_in_one_line() -> None:
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    assert load_config("---\n" + base)["mode"] == ""
    with pytest.raises(ConfigError) as err:
        load_config(base + "---\n" + base)
    assert "\n" not in str(err.value) and "one YAML document" in str(err.value)


def _get_status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


@pytest.mark.parametrize("hard_fail", [False, True])
def test_a_taken_healthz_port_is_fatal_only_with_bind_address_hard_fail(
        tmp_path: Path, hard_fail: bool) -> None:
    """kube-proxy's bindAddressHardFail (false by default): without it the backend proxies
    on without the server that cannot listen (here /metrics still answers)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    metrics = _free_port()
    argv = [*SVCPROXY, "backend", "--proxy-mode=dump", "--cluster-cidr=10.0.0.0/8",
            f"--healthz-bind-address=127.0.0.1:{holder.getsockname()[1]}",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            *(["--bind-address-hard-fail"] if hard_fail else [])]
    env = {**os.environ, "SVCPROXY_API": f"unix://{tmp_path}/no-frontend.sock"}
    backend = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        if hard_fail:
            assert backend.wait(timeout=60) == 1
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _get_status(metrics, "/metrics") != 200:
            assert backend.poll() is None, backend.stderr.read() if backend.stderr else ""
            time.sleep(0.2)
        assert _get_status(metrics, "/metrics") == 200
    finally:
        stop(backend)
        holder.close()
    assert "Proxying without the healthz server" in (backend.stderr.read()
                                                      if backend.stderr else "")


def test_an_oom_score_adj_refused_by_the_kernel_is_not_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kube-proxy logs a failed oomScoreAdj at -v=2 (info): the recommended DaemonSet's
    unprivileged container cannot lower it, and it says so on every start otherwise."""
    from svcproxy.kubeproxy.cli import set_oom_score_adj

    with caplog.at_level("INFO", logger="svcproxy.kube-proxy"):
        assert set_oom_score_adj(-999, tmp_path) is False  # a directory: the write fails
        assert set_oom_score_adj(-999, tmp_path / "oom_score_adj") is True
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert (tmp_path / "oom_score_adj").read_text() == "-999\n"
