"""The node agent's command line: kube-proxy's flags, the configuration, and the main loop."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from svcproxy.collector import pause_collector_for_start
from svcproxy.durations import parse_duration
from svcproxy.httpserve import BIND_RETRY_INTERVAL, parse_bind_address
from svcproxy.model import normalize_cidr, normalize_ip
from svcproxy.sdk.addresses import discover_node_ips
from svcproxy.sdk.backend import Backend
from svcproxy.sdk.config import NodeConfig
from svcproxy.sdk.node_agent import NodeAgent, default_conntrack_cleaner, programs_dataplane

if TYPE_CHECKING:
    from svcproxy.sdk.credentials import ClientTLS, TokenFile

log = logging.getLogger(__name__)

DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "InterfaceNamePrefix", "BridgeInterface")
HEALTHZ_PORT = 10256
METRICS_PORT = 10249


def duration(text: str) -> float:
    """argparse type: a Go duration such as 1s, 500ms, 1m30s or 0."""
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def cidr_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated CIDRs, normalised."""
    result = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        cidr = normalize_cidr(part)
        if cidr is None:
            raise argparse.ArgumentTypeError(f"invalid CIDR {part!r}")
        result.append(cidr)
    return tuple(result)


def ip_list(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated IPs, normalised."""
    result = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        ip = normalize_ip(part)
        if ip is None:
            raise argparse.ArgumentTypeError(f"invalid IP address {part!r}")
        result.append(ip)
    return tuple(result)


def node_port_addresses(text: str) -> tuple[str, ...]:
    """argparse type: "primary" or comma-separated CIDRs."""
    if text.strip() == "primary":
        return ("primary",)
    return cidr_list(text)


def bind_address(default_port: int) -> Callable[[str], str]:
    """argparse type: HOST:PORT (or empty to disable), checked but kept as text."""

    def check(text: str) -> str:
        if text.strip():
            try:
                parse_bind_address(text, default_port)
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from err
        return text.strip()

    return check


def default_node_name() -> str:
    """$NODE_NAME, else the hostname (lower-cased, as kube-proxy does)."""
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every backend shares (kube-proxy's names where the concept is the same)."""
    api = parser.add_argument_group("frontend connection")
    api.add_argument(
        "--api", default="127.0.0.1:12090", metavar="ADDR",
        help="the frontend's gRPC API: HOST:PORT or unix:///path; several replicas "
        "comma-separated (a broken stream moves to the next at once), or dns:///NAME:PORT "
        "for every address of a name (default %(default)s)",
    )
    api.add_argument(
        "--node-name", "--hostname-override", dest="node_name", default=None, metavar="NAME",
        help="this node's name in the cluster, whose state is watched "
        "(default: $NODE_NAME, else the hostname)",
    )
    api.add_argument("--api-ca", type=Path, metavar="FILE",
                     help="connect with TLS, trusting this CA bundle for the frontend's cert")
    api.add_argument("--api-cert", type=Path, metavar="FILE",
                     help="client certificate for mutual TLS (with --api-key)")
    api.add_argument("--api-key", type=Path, metavar="FILE",
                     help="private key of --api-cert (TLS files are re-read on reconnect "
                     "when they change)")
    api.add_argument("--api-token-file", type=Path, metavar="FILE",
                     help="send this ServiceAccount token (a projected, audience-bound token) "
                     "to the frontend; re-read when the kubelet rotates it")

    sync = parser.add_argument_group("syncing")
    sync.add_argument(
        "--sync-period", type=duration, default=30.0, metavar="DURATION",
        help="how often a full resync compares what the kernel holds with what was applied "
        "and writes again only what differs, so that a rule, chain, set or element changed "
        "by someone else is back within this period; also sets the health timeout "
        "(2 x this) (default 30s)",
    )
    sync.add_argument(
        "--min-sync-period", type=duration, default=1.0, metavar="DURATION",
        help="minimum time between two syncs; changes arriving meanwhile are applied "
        "together. 0 applies every change at once (default 1s). The conntrack reconciler "
        "(a dump of the whole UDP/SCTP table) runs after syncs at most once per this "
        "period, and at most once a second",
    )
    sync.add_argument(
        "--report-min-interval", type=duration, default=1.0, metavar="DURATION",
        help="after an apply, tell the frontend what this node holds (revision, digest, "
        "refused service ports) at most this often; applies meanwhile are coalesced into "
        "the newest report, so a slow frontend never delays a sync (default 1s)",
    )
    sync.add_argument(
        "--cleanup", action="store_true",
        help="remove everything this backend ever programmed, then exit 0",
    )

    serve = parser.add_argument_group("health and metrics")
    serve.add_argument(
        "--healthz-bind-address", type=bind_address(HEALTHZ_PORT),
        default=f"0.0.0.0:{HEALTHZ_PORT}", metavar="HOST:PORT",
        help="serve /healthz (503 when an update waited longer than 2 x --sync-period, or the "
        "node is being deleted) and /livez (the same, ignoring the node); empty disables "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--metrics-bind-address", type=bind_address(METRICS_PORT),
        default=f"127.0.0.1:{METRICS_PORT}", metavar="HOST:PORT",
        help="serve Prometheus /metrics (kube-proxy's kubeproxy_* names); empty disables "
        "(default %(default)s)",
    )

    node = parser.add_argument_group("node networking")
    node.add_argument(
        "--cluster-cidr", type=cidr_list, default=(), metavar="CIDRS",
        help="comma-separated pod CIDRs of the cluster: traffic from them is local (not "
        "masqueraded) with --detect-local-mode=ClusterCIDR",
    )
    node.add_argument(
        "--detect-local-mode", choices=DETECT_LOCAL_MODES, default="ClusterCIDR",
        help="how to tell pod traffic from other traffic: ClusterCIDR (--cluster-cidr), "
        "NodeCIDR (the node's podCIDRs), InterfaceNamePrefix (--pod-interface-name-prefix), "
        "BridgeInterface (--pod-bridge-interface) (default %(default)s)",
    )
    node.add_argument(
        "--pod-interface-name-prefix", default="", metavar="PREFIX",
        help="with InterfaceNamePrefix: traffic arriving on interfaces named PREFIX* is local",
    )
    node.add_argument(
        "--pod-bridge-interface", default="", metavar="NAME",
        help="with BridgeInterface: traffic arriving on this bridge is local",
    )
    node.add_argument(
        "--masquerade-all", action="store_true",
        help="SNAT all traffic sent to service IPs, not only traffic from outside the cluster",
    )
    node.add_argument(
        "--node-port-addresses", type=node_port_addresses, default=(), metavar="CIDRS",
        help="comma-separated CIDRs of the node addresses that accept NodePort traffic (and "
        "serve health-check node ports), or 'primary' for the node's primary IPs "
        "(default: all addresses)",
    )
    node.add_argument(
        "--service-cidr", type=cidr_list, default=(), metavar="CIDRS",
        help="comma-separated ranges of ClusterIPs; traffic to unallocated ones is rejected",
    )
    node.add_argument(
        "--node-ip", type=ip_list, default=(), metavar="IPS",
        help="comma-separated IPs of this node, primary first per family "
        "(default: discovered from the interfaces and default routes)",
    )


def _fail(message: str) -> None:
    print(f"svcproxy: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    """The NodeConfig the flags describe; exits with status 2 on inconsistent flags."""
    if args.sync_period <= 0:
        _fail("--sync-period must be greater than 0")
    if args.detect_local_mode == "InterfaceNamePrefix" and not args.pod_interface_name_prefix:
        _fail("--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix")
    if args.detect_local_mode == "BridgeInterface" and not args.pod_bridge_interface:
        _fail("--detect-local-mode=BridgeInterface needs --pod-bridge-interface")
    if bool(args.api_cert) != bool(args.api_key):
        _fail("--api-cert and --api-key go together")
    if args.detect_local_mode == "ClusterCIDR" and not args.cluster_cidr:
        log.warning("--cluster-cidr is empty: pod traffic cannot be told apart from other "
                    "traffic (set --cluster-cidr or another --detect-local-mode)")
    return NodeConfig(
        node_name=args.node_name or default_node_name(),
        cluster_cidrs=tuple(args.cluster_cidr),
        detect_local_mode=args.detect_local_mode,
        pod_interface_name_prefix=args.pod_interface_name_prefix,
        pod_bridge_interface=args.pod_bridge_interface,
        masquerade_all=bool(args.masquerade_all),
        node_port_addresses=tuple(args.node_port_addresses),
        node_ips=tuple(args.node_ip) or discover_node_ips(),
        service_cidrs=tuple(args.service_cidr),
        sync_period=float(args.sync_period),
        min_sync_period=float(args.min_sync_period),
    )


def api_credentials(args: argparse.Namespace) -> ClientTLS | None:
    """TLS credentials for the frontend connection (re-read when the files change), or
    None for plaintext."""
    from svcproxy.sdk.credentials import ClientTLS

    if not (args.api_ca or args.api_cert):
        return None
    return ClientTLS(args.api_ca, args.api_cert, args.api_key)


def api_token(args: argparse.Namespace) -> TokenFile | None:
    """The ServiceAccount token sent to the frontend, if any."""
    from svcproxy.sdk.credentials import TokenFile

    path = getattr(args, "api_token_file", None)
    return TokenFile(path) if path else None


def run_cleanup(backend: Backend) -> int:
    """--cleanup: remove what the backend programmed; 0 on success, 1 on failure."""
    try:
        backend.cleanup()
    except Exception as err:  # noqa: BLE001 - reported to the operator as an exit status
        log.error("Cleanup by backend %s failed: %s", backend.name, err)
        return 1
    log.info("Backend %s removed everything it programmed", backend.name)
    return 0


def _address(text: str, default_port: int) -> tuple[str, int] | None:
    return parse_bind_address(text, default_port) if text else None


def _bind_retry_interval() -> float:
    """kube-proxy's 5 s between binds of a healthz or metrics address that could not listen;
    $SVCPROXY_BIND_RETRY_INTERVAL (seconds, up to an hour) shortens it for tests."""
    text = os.environ.get("SVCPROXY_BIND_RETRY_INTERVAL", "")
    try:
        interval = float(text)
    except ValueError:
        return BIND_RETRY_INTERVAL
    return interval if 0 < interval <= 3600 else BIND_RETRY_INTERVAL


def _install_signal_handlers(stop: Callable[[], None]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("Received %s, stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def run_agent(backend: Backend, config: NodeConfig, args: argparse.Namespace) -> int:
    """Run ``backend`` on this node until SIGTERM/SIGINT; returns the exit status."""
    if getattr(args, "cleanup", False):
        return run_cleanup(backend)
    pause_collector_for_start()
    from svcproxy.sdk.client import NodeStateClient

    try:
        client = NodeStateClient(args.api, config.node_name, credentials=api_credentials(args),
                                 token=api_token(args))
    except (OSError, ValueError) as err:
        log.error("Cannot set up the frontend connection: %s", err)
        return 1
    dataplane = programs_dataplane(backend)

    try:
        # kube-proxy's bindAddressHardFail (false by default there): proxy on without a
        # server that cannot listen and retry it; true: exit
        agent = NodeAgent(
            client,
            backend,
            config,
            healthz_address=_address(args.healthz_bind_address, HEALTHZ_PORT),
            metrics_address=_address(args.metrics_bind_address, METRICS_PORT),
            conntrack=default_conntrack_cleaner(config.min_sync_period) if dataplane else None,
            health_check_node_ports=dataplane,
            retry_unbound=not getattr(args, "bind_address_hard_fail", True),
            bind_retry_interval=_bind_retry_interval(),
        )
    except OSError as err:
        log.error("Cannot listen on the healthz address %s or the metrics address %s (%s): "
                  "another process may hold it; pick another --healthz-bind-address / "
                  "--metrics-bind-address (healthzBindAddress / metricsBindAddress in the "
                  "--config file), or turn one off with the flag set to ''",
                  args.healthz_bind_address or "(off)", args.metrics_bind_address or "(off)",
                  err)
        return 1
    _install_signal_handlers(agent.stop)
    log.info("Backend %s on node %s following %s (node IPs %s)", backend.name,
             config.node_name, args.api, ", ".join(config.node_ips) or "none")
    # A request the frontend refuses as invalid (the node name) stops the agent.
    client.on_error = lambda _err: agent.stop()
    from svcproxy.sdk.report import Reporter

    reporter = Reporter(client, backend, getattr(args, "report_min_interval", 1.0))
    agent.runner.applied_listeners.append(reporter.applied)
    reporter.start()
    client.start()
    try:
        agent.run()
    finally:
        client.stop()
        reporter.stop()
        agent.close()
    if client.error is not None:
        log.error("Exiting: %s (the node name is --node-name or --hostname-override, else "
                  "$NODE_NAME, else the hostname)", client.error)
        return 1
    return 0
