"""The agent's flags, configuration, node address discovery, and the process lifecycle."""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from svcproxy.durations import parse_duration
from svcproxy.sdk.addresses import (
    DefaultRoute,
    InterfaceAddress,
    node_port_ips,
    order_node_ips,
    primary_node_ips,
)
from svcproxy.sdk.agent import add_agent_arguments, config_from_args, run_agent
from svcproxy.sdk.backend import Backend, Changes, NodeState
from svcproxy.sdk.config import NodeConfig
from tests.support.lab.netns import ip, ns_exec
from tests.support.lab.topology import Namespaces, addresses, veth
from tests.support.paths import REPO

REPO = REPO


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="svcproxy backend test")
    add_agent_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0),
    ("1.5s", 1.5), ("250us", 0.00025), ("2m0.5s", 120.5),
    ("-0", 0.0), ("+5s", 5.0), ("1.s", 1.0), (".5s", 0.5), ("1\u00b5s", 1e-6),
    ("1\u03bcs", 1e-6), ("1h1h", 7200.0), ("2562047h47m16.854775807s", 9223372036.854775807),
])
def test_durations_as_kube_proxy_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [
    "", "1", "s", "-1s", "1x", "1s2", "ms", ".s", "+", "-", " 1s", "1s ", "1 s", "1sm",
    "2562047h47m16.854775808s", "1000000000h",
])
def test_invalid_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_defaults_match_kube_proxy() -> None:
    args = parse()
    assert args.api == "127.0.0.1:12090"
    assert args.sync_period == 30.0 and args.min_sync_period == 1.0
    assert args.healthz_bind_address == "0.0.0.0:10256"
    assert args.metrics_bind_address == "127.0.0.1:10249"
    assert args.detect_local_mode == "ClusterCIDR"
    assert not args.cleanup and not args.masquerade_all


def test_flags_become_the_node_config() -> None:
    args = parse(
        "--node-name", "worker-1", "--sync-period", "1m", "--min-sync-period", "0",
        "--cluster-cidr", "10.244.0.0/16, fd00:244::/56", "--service-cidr", "10.96.0.0/12",
        "--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth",
        "--masquerade-all", "--node-port-addresses", "192.168.0.0/16,10.0.0.1/8",
        "--node-ip", "192.168.1.10,fd00::0010", "--healthz-bind-address", "",
    )
    config = config_from_args(args)
    assert config == NodeConfig(
        node_name="worker-1", cluster_cidrs=("10.244.0.0/16", "fd00:244::/56"),
        detect_local_mode="InterfaceNamePrefix", pod_interface_name_prefix="veth",
        masquerade_all=True, node_port_addresses=("192.168.0.0/16", "10.0.0.0/8"),
        node_ips=("192.168.1.10", "fd00::10"), service_cidrs=("10.96.0.0/12",),
        sync_period=60.0, min_sync_period=0.0,
    )
    assert args.healthz_bind_address == ""


def test_node_name_defaults_to_env_then_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert config_from_args(parse("--node-ip", "10.0.0.1")).node_name == "from-env"
    monkeypatch.delenv("NODE_NAME")
    expected = socket.gethostname().lower()
    assert config_from_args(parse("--node-ip", "10.0.0.1")).node_name == expected
    assert config_from_args(parse("--hostname-override", "h", "--node-ip", "10.0.0.1")
                            ).node_name == "h"


@pytest.mark.parametrize("argv", [
    ["--sync-period", "soon"],
    ["--cluster-cidr", "10.0.0.0/33"],
    ["--node-port-addresses", "nonsense"],
    ["--healthz-bind-address", "0.0.0.0:http"],
    ["--detect-local-mode", "Magic"],
])
def test_bad_flags_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--detect-local-mode", "InterfaceNamePrefix"], "--pod-interface-name-prefix"),
    (["--detect-local-mode", "BridgeInterface"], "--pod-bridge-interface"),
    (["--api-cert", "/c.pem"], "--api-key"),
    (["--sync-period", "0"], "--sync-period"),
])
def test_inconsistent_flags_are_explained(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        config_from_args(parse(*argv, "--node-ip", "10.0.0.1"))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_explains_every_flag() -> None:
    parser = argparse.ArgumentParser(prog="svcproxy backend test")
    add_agent_arguments(parser)
    text = parser.format_help()
    for flag in ("--api", "--node-name", "--sync-period", "--min-sync-period",
                 "--healthz-bind-address", "--metrics-bind-address", "--cluster-cidr",
                 "--detect-local-mode", "--pod-interface-name-prefix", "--pod-bridge-interface",
                 "--masquerade-all", "--node-port-addresses", "--service-cidr", "--cleanup",
                 "--api-ca", "--api-cert", "--api-key", "--node-ip"):
        assert flag in text
    assert "0.0.0.0:10256" in text and "127.0.0.1:10249" in text


def test_node_ips_put_the_default_route_source_first() -> None:
    addresses = [
        InterfaceAddress(4, 1, "127.0.0.1", scope=254),
        InterfaceAddress(4, 2, "172.16.0.5"),
        InterfaceAddress(4, 3, "192.168.1.10"),
        InterfaceAddress(6, 3, "fe80::1", scope=253),
        InterfaceAddress(6, 2, "fd00::5"),
        InterfaceAddress(6, 3, "fd01::10"),
        InterfaceAddress(6, 3, "fd01::99", flags=0x40),
    ]
    routes = [DefaultRoute(4, 3, metric=100), DefaultRoute(4, 2, metric=200),
              DefaultRoute(6, 3, prefsrc="fd01::10")]
    ips = order_node_ips(addresses, routes)
    assert ips == ("192.168.1.10", "172.16.0.5", "fd01::10", "fd00::5")
    assert primary_node_ips(ips) == ("192.168.1.10", "fd01::10")


def test_node_port_addresses_select_node_ips() -> None:
    ips = ("192.168.1.10", "10.0.0.5", "fd00::5")
    assert node_port_ips((), ips) == ()
    assert node_port_ips(("primary",), ips) == ("192.168.1.10", "fd00::5")
    assert node_port_ips(("10.0.0.0/8", "fd00::/64"), ips) == ("10.0.0.5", "fd00::5")
    assert node_port_ips(("0.0.0.0/0",), ips) == (), "a catch-all listens everywhere"


def _netns_missing() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    return "" if shutil.which("ip") else "needs iproute2"


@pytest.mark.netns
def test_node_ips_are_discovered_in_the_current_netns() -> None:
    reason = _netns_missing()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    namespaces = Namespaces()
    try:
        ns, peer = namespaces.add_ns("ip"), namespaces.add_ns("ipp")
        veth(ns, "eth0", peer, "eth0")
        addresses(ns, "eth0", "10.50.0.5/24", "10.50.0.9/24", "fd50::5/64")
        ip(ns, "route", "add", "default", "via", "10.50.0.1", "src", "10.50.0.9")
        out = ns_exec(ns, sys.executable, "-c",
                      "from svcproxy.sdk.addresses import discover_node_ips; "
                      "print(','.join(discover_node_ips()))", timeout=30).strip()
        assert out == "10.50.0.9,10.50.0.5,fd50::5"
    finally:
        namespaces.destroy()


class CleanupBackend(Backend):
    name = "test"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.cleaned = False

    def sync(self, state: NodeState, changes: Changes) -> None:
        raise AssertionError("--cleanup must not sync")

    def cleanup(self) -> None:
        if self.fail:
            raise RuntimeError("table busy")
        self.cleaned = True


def test_cleanup_flag_cleans_and_exits() -> None:
    args = parse("--cleanup", "--node-ip", "10.0.0.1")
    backend = CleanupBackend()
    assert run_agent(backend, config_from_args(args), args) == 0 and backend.cleaned
    assert run_agent(CleanupBackend(fail=True), config_from_args(args), args) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


AGENT = textwrap.dedent("""
    import argparse, logging, sys
    from svcproxy.sdk.agent import add_agent_arguments, config_from_args, run_agent
    from svcproxy.sdk.backend import Backend

    class Quiet(Backend):
        name = "quiet"
        def sync(self, state, changes):
            pass

    logging.basicConfig(level=logging.INFO)
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    args = parser.parse_args(sys.argv[1:])
    sys.exit(run_agent(Quiet(), config_from_args(args), args))
""")


def get(port: int, path: str) -> tuple[int, bytes] | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except OSError:
        return None
    finally:
        conn.close()


def test_agent_process_serves_and_stops_on_sigterm() -> None:
    healthz, metrics, api = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT, "--api", f"127.0.0.1:{api}", "--node-name", "n1",
         "--node-ip", "10.0.0.1", "--healthz-bind-address", f"127.0.0.1:{healthz}",
         "--metrics-bind-address", f"127.0.0.1:{metrics}"],
        cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while get(healthz, "/livez") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert get(healthz, "/livez") is not None
        assert get(healthz, "/healthz") is not None
        answer = get(metrics, "/metrics")
        assert answer is not None and b"kubeproxy_sync_proxy_rules_duration_seconds" in answer[1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    assert "stopping" in (proc.stderr.read() if proc.stderr else "")


def test_agent_reports_a_busy_healthz_port(caplog: pytest.LogCaptureFixture) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    try:
        args = parse("--node-ip", "10.0.0.1", "--healthz-bind-address", f"127.0.0.1:{port}",
                     "--metrics-bind-address", "", "--api", "127.0.0.1:1")
        assert run_agent(CleanupBackend(), config_from_args(args), args) == 1
        assert f"healthz address 127.0.0.1:{port}" in caplog.text  # which one is busy
    finally:
        squatter.close()
