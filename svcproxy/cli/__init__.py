"""The ``svcproxy`` command: ``svcproxy frontend ...`` and ``svcproxy backend NAME ...``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from svcproxy.collector import pause_collector_for_start

if TYPE_CHECKING:
    from svcproxy.frontend.edge.limits import ObjectLimits
    from svcproxy.frontend.main import FrontendOptions
    from svcproxy.frontend.publication.changelog import ViewBounds
    from svcproxy.frontend.serving.access.auth import AuthConfig
    from svcproxy.frontend.sources.apiserver_early import EarlySource
    from svcproxy.sdk.plugins import BackendPlugin, InstalledBackend



def _frontend_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "frontend", help="watch the cluster and serve each node's state over gRPC",
        description="Watch Services, EndpointSlices and Nodes (from the apiserver, a "
        "directory of manifests or another frontend), compute what every node must "
        "program, and serve it over the svcproxy.v1 gRPC API (reflection and health "
        "enabled).")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="PATH",
                     help="kubeconfig of the cluster to watch (default: in-cluster config)")
    src.add_argument("--manifests", metavar="DIR", type=Path,
                     help="watch a directory of Kubernetes YAML instead of an apiserver")
    src.add_argument("--upstream", metavar="ADDR",
                     help="follow another svcproxy frontend's cluster watch (HOST:PORT or "
                     "unix:///path) instead of an apiserver: chained frontends serve the "
                     "same state to more nodes while one of them watches the apiserver")
    p.add_argument("--listen", default="127.0.0.1:12090", metavar="ADDR",
                   help="HOST:PORT or unix:///path to serve the API on (default %(default)s)")
    p.add_argument("--service-proxy-name", default="", metavar="NAME",
                   help="serve services labelled service.kubernetes.io/service-proxy-name=NAME "
                   "(services with another value of that label are always skipped)")
    p.add_argument("--metrics-bind-address", default="127.0.0.1:12091", metavar="ADDR",
                   help="HOST:PORT for /metrics; empty disables (default %(default)s)")
    p.add_argument("--history", type=int, default=20000, metavar="OPS",
                   help="changes kept per node for clients resuming a stream "
                   "(default %(default)s)")
    p.add_argument("--history-max-bytes", type=int, default=256 << 20, metavar="BYTES",
                   help="bytes the changes kept for resuming streams take at most, every "
                   "node's together (one node's at most an eighth), oldest first; a "
                   "client resuming from before them gets a full snapshot "
                   "(default %(default)s: 256 MiB)")
    p.add_argument("--max-views", type=int, default=10000, metavar="N",
                   help="node names served at once (each Node, each name watched, the "
                   "cluster): a Watch for one more name is refused with "
                   "RESOURCE_EXHAUSTED; a name that is no Node and nobody watches is "
                   "forgotten after 2 minutes (default %(default)s)")
    p.add_argument("--stream-workers", type=int, default=1, metavar="N",
                   help="serve Watch streams from N processes sharing the --listen port "
                   "(SO_REUSEPORT; TCP only): this one, which also runs the sources and the "
                   "computation, and N-1 workers it feeds. gRPC Python costs 60-90 "
                   "microseconds per streamed message, so one process fans a change out to "
                   "1,000 nodes in ~80 ms of one core; give it up to one per core "
                   "(default %(default)s)")
    p.add_argument("--upstream-ca", type=Path, metavar="FILE",
                   help="verify --upstream's TLS certificate with this CA (enables TLS)")
    p.add_argument("--upstream-cert", type=Path, metavar="FILE",
                   help="client certificate for an --upstream that requires mutual TLS")
    p.add_argument("--upstream-key", type=Path, metavar="FILE",
                   help="private key of --upstream-cert")
    p.add_argument("--upstream-token-file", type=Path, metavar="FILE",
                   help="ServiceAccount token sent to --upstream (re-read when rotated); the "
                   "account must be in the upstream's --cluster-readers")
    p.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve TLS with this cert")
    p.add_argument("--tls-key", type=Path, metavar="FILE", help="private key of --tls-cert")
    p.add_argument("--tls-client-ca", type=Path, metavar="FILE",
                   help="require client certificates signed by this CA (mutual TLS): "
                   "CN=system:node:NAME with O=system:nodes is node NAME, which may read "
                   "only its own state; any other certificate is the identity CN (groups: "
                   "O). Certificate, key and CA files are re-read when they change")
    p.add_argument("--lag-warning", type=float, default=10.0, metavar="SECONDS",
                   help="a node behind the revision it is served for longer than this is "
                   "LAGGING in GetFleet and svcproxy_frontend_fleet_lagging_nodes, with a "
                   "log line (and another when it recovers) (default %(default)s)")
    _frontend_auth_arguments(p)
    _frontend_object_limit_arguments(p)
    _frontend_limit_arguments(p)
    p.set_defaults(func=_run_frontend)


def _frontend_limit_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what one client may cost")
    g.add_argument("--max-streams", type=int, default=10000, metavar="N",
                   help="concurrent Watch/WatchCluster streams served in all; more are "
                   "refused with RESOURCE_EXHAUSTED (default %(default)s: two per node of "
                   "Kubernetes' 5,000-node limit)")
    g.add_argument("--max-streams-per-peer", type=int, default=100, metavar="N",
                   help="concurrent streams from one client address (every unix socket "
                   "client is one address); more are refused with RESOURCE_EXHAUSTED "
                   "(default %(default)s: a node needs one, a few while reconnecting)")
    g.add_argument("--stream-write-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="end a stream whose client read nothing for this long with "
                   "UNAVAILABLE, so it resumes from its revision; 0 never (default "
                   "%(default)s: twice the gRPC keepalive, far beyond any apply a reading "
                   "client does, since the SDK reads while it applies)")
    g.add_argument("--unary-qps-per-peer", type=float, default=5.0, metavar="QPS",
                   help="unary calls (GetNodeState, ListNodes, GetFleet, Report) per second "
                   "one client address may "
                   "make on average, every process's counted together (a call whose answer "
                   "took more than 25 ms of CPU counts once more per 25 ms: a new listing of "
                   "a 10,000-service node counts 4-8); more are refused with "
                   "RESOURCE_EXHAUSTED saying when to retry, sent when the call could have "
                   "been answered (at most 1 s later); 0 no limit (default %(default)s: an "
                   "address takes at most ~1/8 of the frontend's loop)")
    g.add_argument("--unary-burst-per-peer", type=int, default=20, metavar="N",
                   help="calls one client address may make at once beyond "
                   "--unary-qps-per-peer (default %(default)s)")


def _frontend_auth_arguments(p: argparse.ArgumentParser) -> None:
    from svcproxy.frontend.serving.access.auth import DEFAULT_NODE_SERVICE_ACCOUNTS

    g = p.add_argument_group("authentication, authorization and readiness")
    g.add_argument("--token-audience", metavar="AUD",
                   help="accept ServiceAccount tokens (authorization: Bearer) issued for this "
                   "audience, checked with the apiserver's TokenReview; a pod's token is "
                   "bound to the node of its pod (needs --tls-cert off loopback)")
    g.add_argument("--authentication-kubeconfig", metavar="PATH",
                   help="kubeconfig for TokenReview and reading pods (default: --kubeconfig, "
                   "else the in-cluster ServiceAccount)")
    g.add_argument("--token-cache-ttl", type=float, default=10.0, metavar="SECONDS",
                   help="how long a token's review is trusted (refusals: at most 1 s) "
                   "(default %(default)s)")
    g.add_argument("--cluster-readers", default="", metavar="NAMES",
                   help="comma-separated users or groups that may read every node, ListNodes "
                   "and WatchCluster (tools, and frontends chained with --upstream); a node "
                   "identity reads only its own node, anything else nothing")
    g.add_argument("--node-service-accounts", default=DEFAULT_NODE_SERVICE_ACCOUNTS,
                   metavar="NAMESPACE:NAME,...",
                   help="the node agents' ServiceAccounts: a pod-bound token of one of them "
                   "is the identity of its pod's node (Watch, GetNodeState and Report for "
                   "that node); any other pod's token may only WaitFleet for its own pod's "
                   "addresses; empty: no token is a node identity (node certificates still "
                   "are) (default %(default)s, the accounts deploy/ runs agents as)")
    g.add_argument("--insecure-allow-anonymous", action="store_true",
                   help="serve everything to unauthenticated callers on a non-loopback "
                   "--listen (without it the frontend refuses to start there unless "
                   "--tls-client-ca or --token-audience authenticates callers)")
    g.add_argument("--healthz-bind-address", default="", metavar="HOST:PORT",
                   help="serve /readyz (503 until every source has listed everything) and "
                   "/livez over HTTP for probes; empty disables (default)")
    g.add_argument("--apiserver-lost-after", type=float, default=60.0, metavar="SECONDS",
                   help="report the apiserver lost (health name 'apiserver', /readyz body, "
                   "metrics) after failing to reach it this long; the last known state is "
                   "still served (default %(default)s)")


def _frontend_object_limit_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "limits on input", "Objects are checked with Kubernetes' validation rules whatever the "
        "source; one that breaks a rule or a limit is refused alone (logged, counted in "
        "svcproxy_frontend_rejected_objects_total) and its last valid version stays served.")
    g.add_argument("--max-object-bytes", type=int, default=1_572_864, metavar="BYTES",
                   help="largest object accepted, counted as its JSON would be with YAML "
                   "aliases expanded (default %(default)s: etcd's 1.5 MiB)")
    g.add_argument("--max-object-depth", type=int, default=9_999, metavar="LEVELS",
                   help="deepest nesting of maps and lists below an object or manifest "
                   "document, 1-9999 (default %(default)s: the apiserver decodes, and so "
                   "stores, 10,000 nested levels, the object itself included; fields "
                   "svcproxy does not read may nest that deep, and a lower value refuses "
                   "objects the apiserver stores)")
    g.add_argument("--max-name-length", type=int, default=253, metavar="CHARS",
                   help="longest name of any object, port or node accepted; Kubernetes' own "
                   "limits (63 for Service and namespace names) always apply "
                   "(default %(default)s)")
    g.add_argument("--manifest-max-file-bytes", type=int, default=16 * 1024 * 1024,
                   metavar="BYTES", help="larger --manifests files are refused whole (their "
                   "last good content stays in use) (default %(default)s)")
    g.add_argument("--manifest-max-alias-expansion", type=int, default=100_000,
                   metavar="NODES", help="refuse a manifest document whose YAML aliases "
                   "(*name) add more nodes than this once expanded: a few hundred bytes of "
                   "aliases can otherwise become gigabytes (default %(default)s)")


def _object_limits(args: argparse.Namespace) -> ObjectLimits:
    """--max-object-* and --max-name-length (every limit flag checked)."""
    from svcproxy.frontend.edge.limits import (
        KUBERNETES_MAX_DEPTH,
        ObjectLimits,
        allow_kubernetes_depth,
    )

    sizes = (args.max_object_bytes, args.max_name_length, args.manifest_max_file_bytes)
    if min(sizes) < 1 or args.manifest_max_alias_expansion < 0 or \
            not 1 <= args.max_object_depth <= KUBERNETES_MAX_DEPTH:
        raise SystemExit("svcproxy: --max-object-bytes, --max-name-length and "
                         "--manifest-max-file-bytes must be 1 or more, "
                         "--manifest-max-alias-expansion 0 or more, --max-object-depth "
                         f"1-{KUBERNETES_MAX_DEPTH} (the apiserver's own limit)")
    allow_kubernetes_depth()  # before the early listing's first page is decoded
    return ObjectLimits(args.max_object_bytes, args.max_object_depth, args.max_name_length)


def _with_object_limits(opts: FrontendOptions, args: argparse.Namespace) -> FrontendOptions:
    import dataclasses

    from svcproxy.frontend.sources.manifests import ManifestLimits

    return dataclasses.replace(
        opts, object_limits=_object_limits(args),
        manifest_limits=ManifestLimits(args.manifest_max_file_bytes,
                                       args.manifest_max_alias_expansion, args.max_object_depth))


def _early_listing(args: argparse.Namespace) -> EarlySource | None:
    """The apiserver's listing, started before the rest of the frontend is imported (its
    requests are out meanwhile); None for another source, or when the configuration is
    unusable (the frontend's start then says why)."""
    if args.manifests is not None or args.upstream is not None:
        return None
    _object_limits(args)  # a bad limit flag is refused before any request goes out
    from svcproxy.frontend.sources.apiserver_early import start_listing

    try:
        return start_listing(args.kubeconfig)
    except Exception:  # noqa: BLE001 - said by the frontend's start, which tries again
        return None


def _certs_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("certs", help="write a small PKI for trying mutual TLS out",
                       description="Write ca.crt, frontend.crt/.key (the frontend's serving "
                       "certificate), one certificate per --node (CN=system:node:NAME, "
                       "O=system:nodes: it reads only that node) and per --identity (for "
                       "--cluster-readers) into DIR. For trials and docker compose; a "
                       "cluster uses its own CA.")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.add_argument("--server-name", action="append", default=[], metavar="NAME",
                   help="DNS name or IP the frontend is reached at (repeat; default "
                   "localhost and 127.0.0.1)")
    p.add_argument("--node", action="append", default=[], metavar="NAME")
    p.add_argument("--identity", action="append", default=[], metavar="NAME")
    p.set_defaults(func=_run_certs)


def _run_certs(args: argparse.Namespace) -> int:
    from svcproxy.cli.devcerts import write_dev_pki

    names = tuple(args.server_name) or ("localhost", "127.0.0.1")
    for path in write_dev_pki(args.dir, names, tuple(args.node), tuple(args.identity)):
        print(path)
    return 0


def _load_backend(installed: InstalledBackend) -> BackendPlugin | str:
    """The plugin, or why it cannot be loaded (said when it is asked to run)."""
    try:
        return installed.load()
    except Exception as err:  # noqa: BLE001 - a broken plugin must not break the others
        return f"{type(err).__name__}: {err}"


def _backend_parsers(sub: argparse._SubParsersAction) -> None:
    from svcproxy.sdk.agent import add_agent_arguments
    from svcproxy.sdk.plugins import installed_backends, plugin_help

    p = sub.add_parser("backend", help="run a backend on this node (no NAME: list them)",
                       description="Run a backend: watch this node's state from the frontend "
                       "and program the dataplane. Backends are the entry points of group "
                       "svcproxy.backends of the installed packages; without NAME, list them.")
    p.set_defaults(func=_list_backends)
    names = p.add_subparsers(dest="backend", metavar="NAME")
    for name, installed in installed_backends().items():
        plugin = _load_backend(installed)
        text = plugin_help(plugin) if not isinstance(plugin, str) else f"unavailable: {plugin}"
        b = names.add_parser(name, help=text, description=text)
        add_agent_arguments(b)
        if not isinstance(plugin, str):
            plugin.add_arguments(b.add_argument_group(f"{name} backend"))
        b.set_defaults(func=_run_backend, backend_module=plugin)


def _list_backends(_args: argparse.Namespace) -> int:
    """``svcproxy backend``: every installed backend, its package and what it does."""
    from svcproxy.sdk.plugins import installed_backends, plugin_help

    found = installed_backends()
    if not found:
        print("svcproxy: no backend is installed (none registers an entry point of group "
              "svcproxy.backends; reinstall svcproxy with pip)", file=sys.stderr)
        return 1
    for name, installed in found.items():
        plugin = _load_backend(installed)
        text = plugin_help(plugin) if not isinstance(plugin, str) else f"unavailable: {plugin}"
        print(f"{name:<12} {installed.distribution:<24} {text}")
    return 0


def _run_frontend(args: argparse.Namespace) -> int:
    listing = _early_listing(args)
    from svcproxy.frontend.main import FrontendOptions, run_frontend
    from svcproxy.frontend.serving.limits import StreamLimits
    from svcproxy.frontend.serving.server import TLSFiles

    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise SystemExit("svcproxy: --tls-cert and --tls-key go together")
        tls = TLSFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
    if bool(args.upstream_cert) != bool(args.upstream_key):
        raise SystemExit("svcproxy: --upstream-cert and --upstream-key go together")
    upstream_credentials = upstream_token = None
    if args.upstream_ca or args.upstream_cert or args.upstream_token_file:
        from svcproxy.sdk.credentials import ClientTLS, TokenFile  # the SDK's whole package

        if args.upstream_ca or args.upstream_cert:
            upstream_credentials = ClientTLS(args.upstream_ca, args.upstream_cert,
                                             args.upstream_key)
        if args.upstream_token_file:
            upstream_token = TokenFile(args.upstream_token_file)
    if args.stream_workers < 1:
        raise SystemExit("svcproxy: --stream-workers must be 1 or more")
    auth = _frontend_auth(args, tls)
    if args.max_streams < 1 or args.max_streams_per_peer < 1 or \
            not 0 <= args.stream_write_timeout < math.inf:
        raise SystemExit("svcproxy: --max-streams and --max-streams-per-peer must be 1 or "
                         "more, --stream-write-timeout a finite number of seconds, 0 or more")
    # inf would mean "no limit" only through NaN arithmetic in the token bucket: 0 says it.
    if not 0 <= args.unary_qps_per_peer < math.inf:
        raise SystemExit("svcproxy: --unary-qps-per-peer must be a finite number, 0 or more "
                         "(0: no limit)")
    if args.unary_burst_per_peer < 1:
        raise SystemExit("svcproxy: --unary-burst-per-peer must be 1 or more")
    if not 0 < args.lag_warning < math.inf:
        raise SystemExit("svcproxy: --lag-warning must be a finite number of seconds, more "
                         "than 0")
    if args.history_max_bytes < 1 or args.max_views < 1:
        raise SystemExit("svcproxy: --history-max-bytes and --max-views must be 1 or more")
    limits = StreamLimits(args.max_streams, args.max_streams_per_peer,
                          args.stream_write_timeout,
                          unary_qps_per_peer=args.unary_qps_per_peer,
                          unary_burst_per_peer=args.unary_burst_per_peer)
    opts = FrontendOptions(listen=args.listen, manifests=args.manifests,
                           kubeconfig=args.kubeconfig, service_proxy_name=args.service_proxy_name,
                           metrics_bind_address=args.metrics_bind_address, tls=tls,
                           history=args.history, stream_workers=args.stream_workers,
                           view_bounds=_view_bounds(args),
                           upstream=args.upstream, upstream_credentials=upstream_credentials,
                           upstream_token=upstream_token,
                           auth=auth, healthz_bind_address=args.healthz_bind_address,
                           apiserver_lost_after=args.apiserver_lost_after,
                           stream_limits=limits, lag_warning=args.lag_warning)
    opts = _with_object_limits(opts, args)
    return asyncio.run(run_frontend(opts, listing))


def _view_bounds(args: argparse.Namespace) -> ViewBounds:
    from svcproxy.frontend.publication.changelog import ViewBounds

    return ViewBounds(history_bytes=args.history_max_bytes, max_views=args.max_views)


def _frontend_auth(args: argparse.Namespace, tls: object) -> AuthConfig:
    from svcproxy.frontend.serving.access.auth import (
        AuthConfig,
        check_listen,
        parse_node_service_accounts,
    )

    client_certs = bool(args.tls_client_ca)
    if client_certs and not tls:
        raise SystemExit("svcproxy: --tls-client-ca needs --tls-cert and --tls-key")
    try:
        anonymous = check_listen(args.listen, tls is not None, client_certs,
                                 bool(args.token_audience), args.insecure_allow_anonymous)
    except ValueError as err:
        raise SystemExit(f"svcproxy: refusing to start: {err}") from err
    readers = frozenset(filter(None, (n.strip() for n in args.cluster_readers.split(","))))
    try:
        node_accounts = parse_node_service_accounts(args.node_service_accounts)
    except ValueError as err:
        raise SystemExit(f"svcproxy: {err}") from err
    return AuthConfig(client_certs=client_certs, token_audience=args.token_audience or None,
                      token_kubeconfig=args.authentication_kubeconfig or args.kubeconfig,
                      token_cache_ttl=args.token_cache_ttl, cluster_readers=readers,
                      node_service_accounts=node_accounts, allow_anonymous=anonymous)


def _run_backend(args: argparse.Namespace) -> int:
    from svcproxy.sdk.agent import config_from_args, run_agent

    module = args.backend_module
    if isinstance(module, str):
        raise SystemExit(f"svcproxy: backend {args.backend} is not available here: {module}")
    config = config_from_args(args)
    return run_agent(module.create(args, config), config, args)


def _version() -> str:
    from svcproxy.kubeproxy.cli import version_text

    return version_text()


def _status_parser(sub: argparse._SubParsersAction) -> None:
    from svcproxy.cli.fleet import status_parser

    status_parser(sub)


def _wait_parser(sub: argparse._SubParsersAction) -> None:
    from svcproxy.cli.fleet import wait_parser

    wait_parser(sub)


_COMMANDS = {"frontend": _frontend_parser, "backend": _backend_parsers, "certs": _certs_parser,
             "status": _status_parser, "wait": _wait_parser}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or only ``command``'s (and no ``--version``) for a process that
    runs it: ``svcproxy frontend`` then loads no backend plugin (~0.3 s of its start)."""
    parser = argparse.ArgumentParser(
        prog="svcproxy",
        description="A Kubernetes Service proxy split in two: one frontend per cluster "
        "computes each node's services and endpoints and streams them over gRPC; a backend "
        "on every node programs the kernel (nftables, iptables or IPVS).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    if command is None:
        parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, add in _COMMANDS.items():
        if command in (None, name):
            add(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` runs when only -v comes before it, else None."""
    rest = list(argv)
    while rest[:1] in (["-v"], ["--verbose"]):
        rest.pop(0)
    return rest[0] if rest and rest[0] in _COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["frontend"], ["backend"]):
        pause_collector_for_start()  # before their imports: all they load at start lives on
    if argv[:1] == ["backend"]:
        from svcproxy.cli.local_frontend import LocalFrontend
        from svcproxy.kubeproxy import cli as kubeproxy_cli

        if kubeproxy_cli.routes_here(argv[1:]):
            return kubeproxy_cli.main(argv[1:], LocalFrontend)  # kube-proxy's flags, --config
    args = build_parser(_command(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)

