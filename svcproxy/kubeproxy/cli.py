"""``svcproxy backend [NAME] --config FILE ...``: run a backend as a drop-in kube-proxy.

kube-proxy's flags and its KubeProxyConfiguration file choose and configure the backend
(``mode``: iptables, ipvs, nftables, or any installed backend's name). Precedence is
kube-proxy's: without ``--config`` the flags override the defaults; with ``--config``
the file wins and only ``--hostname-override`` and the logging flags (``-v``, ...)
override it (other flags given with it are reported as ignored). svcproxy's own flags
(``--api``, ``--api-ca``, ``--nft-api``...) pass through to the backend; the frontend's
address may also come from ``$SVCPROXY_API``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from svcproxy.kubeproxy.config import (
    GROUP,
    ConfigError,
    apply_defaults,
    config_document,
    empty_config,
    encode_config,
    field_kind,
    format_go_duration,
    load_config,
    validate,
)
from svcproxy.kubeproxy.flags import (
    BY_DEST,
    add_kube_proxy_flags,
    given_flags,
    go_bool,
    normalize_argv,
)
from svcproxy.kubeproxy.leftovers import remove_leftovers
from svcproxy.kubeproxy.sysctls import set_mode_sysctls

log = logging.getLogger("svcproxy.kube-proxy")

# kube-proxy's mode -> svcproxy's backend; any other mode names an installed backend.
MODE_BACKENDS = {"": "iptables", "iptables": "iptables", "ipvs": "ipvs", "nftables": "nft"}
_ROUTING_FLAGS = ("--config", "--write-config-to", "--proxy-mode")
API_ENV = "SVCPROXY_API"
# svcproxy's connection flags may come from the environment too, so that a kube-proxy
# DaemonSet's argument list stays unchanged.
ENV_FLAGS = {"api": API_ENV, "api_ca": "SVCPROXY_API_CA", "api_cert": "SVCPROXY_API_CERT",
             "api_key": "SVCPROXY_API_KEY", "api_token_file": "SVCPROXY_API_TOKEN_FILE"}
# The longest the backend's set-up waits for local mode's listing to start.
LISTING_WAIT = 60.0


class LocalMode(Protocol):
    """The frontend run in the backend's process (local mode; the ``svcproxy`` command
    gives ``main`` one: ``svcproxy.cli.local_frontend.LocalFrontend``, above this layer)."""

    listing_started: threading.Event  # set once the apiserver's listing started

    def begin(self) -> None:
        """Start the frontend without waiting."""

    def start(self) -> str:
        """Wait until it serves; the address to follow (``--api``)."""

    def stop(self) -> None:
        """Undo everything."""


# kubeconfig (None: in-cluster) and --master -> the local frontend
LocalModeFactory = Callable[[str | None, str], LocalMode]
# Flags that apply with --config too (the logging flags as well); kube-proxy's --master
# does, so its warning is run_backend's (svcproxy cannot use it), not "ignored with --config".
_ALWAYS_USED = {"config", "write-config-to", "cleanup", "init-only", "hostname-override",
                "master"}


def routes_here(argv: Sequence[str]) -> bool:
    """Whether ``svcproxy backend ARGV`` is a kube-proxy style invocation: a flag first
    (no backend NAME), or NAME followed by --config, --write-config-to or --proxy-mode."""
    if not argv:
        return False
    if argv[0].startswith("-"):
        return True
    return any(a.split("=", 1)[0] in _ROUTING_FLAGS for a in normalize_argv(argv[1:]))


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"svcproxy {version('svcproxy')}"
    except PackageNotFoundError:
        return "svcproxy (not installed)"


class _VersionAction(argparse.Action):
    """kube-proxy's ``--version[=true|raw|false]``: the installed version (``raw``: with the
    Python that runs it), looked up only when asked for (reading the package's metadata is a
    few ms of every start otherwise); ``false`` runs as if the flag were not given."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:  # noqa: A002 - argparse's keyword
        super().__init__(option_strings, dest, nargs="?", const="true", metavar="true|raw|false",
                         default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values == "raw":
            print(f"{version_text()} (Python {sys.version.split()[0]}, {sys.platform})")
            parser.exit()
        try:
            wanted = go_bool(values)
        except argparse.ArgumentTypeError:
            parser.error(f"argument --version: invalid value {values!r} (true, raw or false)")
        if wanted:
            print(version_text())
            parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svcproxy backend", allow_abbrev=False,
        description="Run a backend as kube-proxy runs: with kube-proxy's flags and its "
        "KubeProxyConfiguration (--config), the backend chosen by the mode. svcproxy's own "
        "flags (--api ADDR or $SVCPROXY_API for the frontend, --api-ca, --nft-api ...) are "
        "passed to the backend: 'svcproxy backend NAME --help' lists them; 'svcproxy "
        "backend' alone lists the installed backends.")
    parser.add_argument("--version", action=_VersionAction,
                        help="print the version and exit")
    add_kube_proxy_flags(parser)
    return parser


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for name in parents:
        config = config[name]
    config[leaf] = value


def get_path(config: dict[str, Any], path: str) -> Any:
    for name in path.split("."):
        config = config[name]
    return config


def effective_config(flags: dict[str, Any], file_text: str | None,
                     notes: list[str] | None = None) -> tuple[dict, list[str]]:
    """(the configuration kube-proxy would run with, the flags it ignores); the file's
    dropped fields are named in ``notes``.

    Raises ConfigError for a refused file or an invalid result."""
    if file_text is not None:
        config = load_config(file_text, notes)
        used = {f.name for f in BY_DEST.values() if f.logging} | _ALWAYS_USED
        ignored = sorted(n for n in flags if n not in used)
    else:
        config = empty_config()
        apply_defaults(config)
        ignored = []
    for name, value in flags.items():
        flag = BY_DEST[name.replace("-", "_")]
        if name in ignored or not flag.paths:
            continue
        for path in flag.paths:
            set_path(config, path, value)
    if file_text is None and not flags.get("write-config-to"):
        _deprecated_ports(config, flags)
    if flags.get("hostname-override"):  # empty: not given, as kube-proxy reads it
        name = str(flags["hostname-override"]).strip().lower()
        if not name:
            raise ConfigError("--hostname-override: an empty name is invalid")
        config["hostnameOverride"] = name
    validate(config)
    return config, ignored


def _deprecated_ports(config: dict[str, Any], flags: dict[str, Any]) -> None:
    """kube-proxy's addressFromDeprecatedFlags, read without --config and --write-config-to:
    --healthz-port / --metrics-port (10256 / 10249 when not given) 0 turns the server off,
    another is the port of an address that has none (a bare IP)."""
    for flag, field, default in (("healthz-port", "healthzBindAddress", 10256),
                                 ("metrics-port", "metricsBindAddress", 10249)):
        port = flags.get(flag, default)
        config[field] = "" if port == 0 else _append_port(config[field], port)


def _append_port(address: str, port: int) -> str:
    """kube-proxy's AppendPortIfNeeded: an IP gets ``port``; anything else is unchanged."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return f"[{address}]:{port}" if ip.version == 6 else f"{address}:{port}"


def backend_for_mode(mode: str) -> str:
    return MODE_BACKENDS.get(mode, mode)


# Fields every backend honours; per backend, the sections it reads.
_HONOURED = {
    "clientConnection.kubeconfig",  # local mode
    "apiVersion", "kind", "hostnameOverride", "bindAddress", "healthzBindAddress",
    "metricsBindAddress", "mode", "detectLocalMode", "detectLocal.bridgeInterface",
    "detectLocal.interfaceNamePrefix", "clusterCIDR", "nodePortAddresses", "oomScoreAdj",
    "logging.verbosity", "logging.format", "featureGates", "bindAddressHardFail",
    "conntrack.maxPerCore", "conntrack.min", "conntrack.tcpEstablishedTimeout",
    "conntrack.tcpCloseWaitTimeout", "conntrack.tcpBeLiberal", "conntrack.udpTimeout",
    "conntrack.udpStreamTimeout",
}
_SECTION_FOR = {"iptables": "iptables", "nft": "nftables", "ipvs": "ipvs"}
_BACKEND_FIELDS = {
    "iptables": {"iptables.masqueradeBit", "iptables.masqueradeAll",
                 "iptables.localhostNodePorts", "iptables.syncPeriod",
                 "iptables.minSyncPeriod"},
    "nft": {"nftables.masqueradeAll", "nftables.syncPeriod", "nftables.minSyncPeriod"},
    "ipvs": {"ipvs.syncPeriod", "ipvs.minSyncPeriod", "ipvs.scheduler", "ipvs.excludeCIDRs",
             "ipvs.strictARP", "ipvs.tcpTimeout", "ipvs.tcpFinTimeout", "ipvs.udpTimeout",
             "iptables.masqueradeAll"},
}
_OTHER_BACKEND_FIELDS = {"iptables.masqueradeAll", "iptables.syncPeriod",
                         "iptables.minSyncPeriod"}


def _leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in config.items():
        if isinstance(value, dict) and name != "featureGates":
            out.update(_leaves(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def unhonoured_fields(config: dict[str, Any], backend: str) -> list[str]:
    """Fields set to other than their default that ``backend`` does not honour, each with
    why, one line per field (sorted); the iptables and nftables fields of one name holding
    one value (one kube-proxy flag sets both) share a line."""
    default = empty_config()
    apply_defaults(default)
    honoured = _HONOURED | _BACKEND_FIELDS.get(backend, _OTHER_BACKEND_FIELDS)
    before = _leaves(default)
    shared: dict[tuple[str, str, str], list[str]] = {}
    for path, value in sorted(_leaves(config).items()):
        if path in honoured or value == before.get(path) or value in (None, [], {}):
            continue
        if _mirrors_own_section(config, backend, path, value):
            continue
        section, _, name = path.partition(".")
        if section in ("iptables", "ipvs", "nftables", "winkernel"):
            why = f"does not apply to backend {backend}"
        elif section in ("clientConnection", "configSyncPeriod"):
            why = "the frontend watches the apiserver, not the backend"
        else:
            why = "svcproxy cannot honour it"
        pair = f"iptables|nftables.{name}" if section in ("iptables", "nftables") else path
        shared.setdefault((pair, _show(value, field_kind(path)), why), []).append(path)
    return [f"{' and '.join(paths)}={shown}: {why}; ignored"
            for (_, shown, why), paths in shared.items()]


def _mirrors_own_section(config: dict[str, Any], backend: str, path: str, value: Any) -> bool:
    """Whether ``path`` holds what the backend's own section holds under the same name, as
    when one kube-proxy flag (``--iptables-min-sync-period``) set both: honoured there."""
    section, _, name = path.partition(".")
    own = config.get(_SECTION_FOR.get(backend, ""), {})
    return section != _SECTION_FOR.get(backend) and isinstance(own, dict) and \
        own.get(name) == value


def _show(value: Any, kind: str) -> str:
    """A value as the file would spell it (durations as Go writes them)."""
    if kind in ("duration", "time_or_duration"):
        return format_go_duration(value)
    return json.dumps(value) if not isinstance(value, str) else value


def backend_namespace(config: dict[str, Any], backend: str, parser: argparse.ArgumentParser,
                      rest: list[str]) -> argparse.Namespace:
    """The backend's parsed flags: svcproxy's own from ``rest``, the rest from ``config``."""
    ns = parser.parse_args(rest)
    for dest, env in ENV_FLAGS.items():
        flag = "--" + dest.replace("_", "-")
        given = any(a == flag or a.startswith(flag + "=") for a in rest)
        if not given and os.environ.get(env) and hasattr(ns, dest):
            setattr(ns, dest, os.environ[env] if dest == "api" else Path(os.environ[env]))
    section = config[_SECTION_FOR.get(backend, "iptables")]
    masq = config["nftables" if backend == "nft" else "iptables"]["masqueradeAll"]
    mapped: dict[str, Any] = {
        # kube-proxy's GetHostname: the file's name too is trimmed and lower-cased
        "node_name": config["hostnameOverride"].strip().lower() or None,
        "cluster_cidr": _cidrs(config["clusterCIDR"], "clusterCIDR"),
        "detect_local_mode": config["detectLocalMode"] or "ClusterCIDR",
        "pod_interface_name_prefix": config["detectLocal"]["interfaceNamePrefix"],
        "pod_bridge_interface": config["detectLocal"]["bridgeInterface"],
        "masquerade_all": masq,
        "node_port_addresses": _node_port_addresses(config["nodePortAddresses"] or []),
        "healthz_bind_address": config["healthzBindAddress"],
        "metrics_bind_address": config["metricsBindAddress"],
        "sync_period": section["syncPeriod"],
        "min_sync_period": section["minSyncPeriod"],
        "iptables_masquerade_bit": config["iptables"]["masqueradeBit"],
        "iptables_localhost_nodeports": config["iptables"]["localhostNodePorts"],
        "ipvs_scheduler": config["ipvs"]["scheduler"] or "rr",
        "ipvs_exclude_cidrs": tuple(_cidrs(",".join(config["ipvs"]["excludeCIDRs"] or []),
                                           "ipvs.excludeCIDRs")),
        "ipvs_strict_arp": config["ipvs"]["strictARP"],
        "ipvs_tcp_timeout": int(config["ipvs"]["tcpTimeout"]),
        "ipvs_tcpfin_timeout": int(config["ipvs"]["tcpFinTimeout"]),
        "ipvs_udp_timeout": int(config["ipvs"]["udpTimeout"]),
        # the ebpf backend's tc connection tracking (the sysctls are set as for any mode)
        "conntrack_tcp_timeout_established": config["conntrack"]["tcpEstablishedTimeout"],
        "conntrack_tcp_timeout_close_wait": config["conntrack"]["tcpCloseWaitTimeout"],
        "conntrack_udp_timeout": config["conntrack"]["udpTimeout"],
        "conntrack_udp_timeout_stream": config["conntrack"]["udpStreamTimeout"],
    }
    for dest, value in mapped.items():
        if hasattr(ns, dest):
            setattr(ns, dest, value)
    # svcproxy's own CLI always exits when a server cannot listen; kube-proxy's default
    ns.bind_address_hard_fail = config["bindAddressHardFail"]
    bind = config["bindAddress"]
    if bind not in ("0.0.0.0", "::") and hasattr(ns, "node_ip") and not ns.node_ip:
        from svcproxy.sdk.addresses import discover_node_ips

        ns.node_ip = (bind, *(ip for ip in discover_node_ips() if ip != bind))
    return ns


def _cidrs(text: str, field: str) -> tuple[str, ...]:
    from svcproxy.sdk.agent import cidr_list

    try:
        return cidr_list(text)
    except argparse.ArgumentTypeError as err:
        raise ConfigError(f"{field}: {err}") from err


_KEYWORDS = {"localhost": "127.0.0.0/8,::1/128", "all": "0.0.0.0/0,::/0"}


def _node_port_addresses(items: list[str]) -> tuple[str, ...]:
    if items == ["primary"]:
        return ("primary",)
    if "primary" in items:
        raise ConfigError("nodePortAddresses: 'primary' cannot be combined with CIDRs here")
    return _cidrs(",".join(_KEYWORDS.get(i, i) for i in items), "nodePortAddresses")


def set_oom_score_adj(value: int, path: Path = Path("/proc/self/oom_score_adj")) -> bool:
    """Apply oomScoreAdj; a refusal is logged as kube-proxy logs it (info, at -v=2): an
    unprivileged container cannot lower its score, the kubelet's stays."""
    try:
        path.write_text(f"{value}\n")
    except OSError as err:
        log.info("oomScoreAdj=%d not applied: %s", value, err)
        return False
    return True


class JsonLogFormatter(logging.Formatter):
    """logging.format json: one JSON object a line (ts in Unix seconds, caller, msg, as
    kube-proxy's JSON logs; the logger and level besides, err with an exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"ts": record.created, "caller": f"{record.module}:"
                                f"{record.lineno}", "logger": record.name,
                                "level": record.levelname, "msg": record.getMessage()}
        if record.exc_info:
            line["err"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(config: dict[str, Any]) -> None:
    level = logging.DEBUG if config["logging"]["verbosity"] >= 4 else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    if config["logging"]["format"] == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _fail(message: str) -> int:
    print(f"svcproxy: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None,
         local_mode: LocalModeFactory | None = None) -> int:
    """Entry point of ``svcproxy backend [NAME] <kube-proxy flags>``; ``local_mode`` makes
    the frontend that local mode runs (without it there is no local mode)."""
    argv = normalize_argv(sys.argv[1:] if argv is None else argv)
    forced = argv[0] if argv and not argv[0].startswith("-") else None
    args, rest = build_parser().parse_known_args(argv[1:] if forced else argv)
    flags = given_flags(args)
    try:
        text = Path(flags["config"]).read_text() if flags.get("config") else None
    except OSError as err:
        return _fail(f"--config: cannot read {flags['config']}: {err}")
    notes: list[str] = []
    try:
        config, ignored = effective_config(flags, text, notes)
    except ConfigError as err:
        where = f"{flags['config']}: " if text is not None else ""
        return _fail(f"invalid configuration: {where}{err}")
    setup_logging(config)
    for line in notes:
        log.warning("%s: %s", flags["config"], line)
    for name in ignored:
        log.warning("--%s is ignored because --config is given (as kube-proxy does); set the "
                    "field in the configuration file instead", name)
    if flags.get("write-config-to"):
        Path(flags["write-config-to"]).write_text(encode_config(config))
        log.info("Wrote configuration to %s", flags["write-config-to"])
        return 0
    return run(config, flags, forced, rest, local_mode)


def run(config: dict[str, Any], flags: dict[str, Any], forced: str | None,
        rest: list[str], local_mode: LocalModeFactory | None = None) -> int:
    """Choose the backend, warn about what it does not honour, and run it. In local mode
    the frontend starts first, and the backend's set-up waits until the apiserver's
    listing has started (the kubernetes client imported, the list requests out): the
    apiserver's answer then overlaps the rest of the start."""
    local = None
    if not flags.get("cleanup") and not flags.get("init-only"):
        local = local_frontend(config, rest, flags.get("master") or "", local_mode)
    if local is None:
        return run_backend(config, flags, forced, rest, None)
    local.begin()
    local.listing_started.wait(LISTING_WAIT)
    try:
        return run_backend(config, flags, forced, rest, local)
    finally:
        local.stop()


def run_backend(config: dict[str, Any], flags: dict[str, Any], forced: str | None,
                rest: list[str], local: LocalMode | None) -> int:
    """Set the backend up and run it, following ``local``'s frontend when given."""
    from svcproxy.sdk.agent import add_agent_arguments, config_from_args, run_agent
    from svcproxy.sdk.metrics_server import set_configz
    from svcproxy.sdk.node_agent import programs_dataplane
    from svcproxy.sdk.plugins import installed_backends

    set_configz(GROUP, config_document(config))

    name = forced or backend_for_mode(config["mode"])
    if forced and config["mode"] and backend_for_mode(config["mode"]) != forced:
        log.warning("mode %r is overridden by the backend named on the command line (%s)",
                    config["mode"], forced)
    installed = installed_backends()
    if name not in installed:
        return _fail(f"mode {name!r}: no such backend is installed (installed: "
                     f"{', '.join(installed)}; kube-proxy's modes: iptables, ipvs, nftables)")
    plugin = installed[name].load()
    for line in unhonoured_fields(config, name):
        log.warning("%s", line)
    if flags.get("master") and local is None:
        log.warning("--master=%s: ignored (the frontend watches the apiserver; the backend "
                    "follows --api or $%s)", flags["master"], API_ENV)
    if config["featureGates"]:
        log.info("featureGates accepted: %s", config["featureGates"])
    parser = argparse.ArgumentParser(prog=f"svcproxy backend {name}")
    add_agent_arguments(parser)
    plugin.add_arguments(parser.add_argument_group(f"{name} backend"))
    try:
        ns = backend_namespace(config, name, parser, rest)
    except ConfigError as err:
        return _fail(f"invalid configuration: {err}")
    ns.cleanup = bool(flags.get("cleanup"))
    node_config = config_from_args(ns)
    backend = plugin.create(ns, node_config)
    if programs_dataplane(backend) and (ns.cleanup or flags.get("init-only")):
        remove_leftovers(name, ns.cleanup, lambda other: _cleanup_of(
            other, config, installed, node_config))
    if not ns.cleanup:
        set_oom_score_adj(config["oomScoreAdj"])
        # a backend that programs nothing (dump) needs no sysctls
        failures = set_mode_sysctls(config, backend.name) if programs_dataplane(backend) else []
        if flags.get("init-only"):
            if failures:
                return _fail("--init-only could not set every sysctl (run it privileged)")
            log.info("Initialization done (--init-only) for %s", backend.name)
            return 0
    if local is not None:
        try:
            ns.api = local.start()
        except Exception as err:  # noqa: BLE001 - reported as the exit status
            return _fail(f"local mode: cannot watch the apiserver: {err}")
    return run_agent(backend, node_config, ns)


def _cleanup_of(name: str, config: dict[str, Any], installed: Mapping[str, Any],
                node_config: Any) -> Callable[[], None] | None:
    """Backend ``name``'s cleanup under ``config`` (None when it is not installed)."""
    from svcproxy.sdk.agent import add_agent_arguments

    if name not in installed:
        return None
    plugin = installed[name].load()
    parser = argparse.ArgumentParser(prog=f"svcproxy backend {name}")
    add_agent_arguments(parser)
    plugin.add_arguments(parser.add_argument_group(f"{name} backend"))
    ns = backend_namespace(config, name, parser, [])
    ns.cleanup = True
    cleanup: Callable[[], None] = plugin.create(ns, node_config).cleanup
    return cleanup


def local_frontend(config: dict[str, Any], rest: list[str], master: str = "",
                   local_mode: LocalModeFactory | None = None) -> LocalMode | None:
    """Local mode when no frontend address is given (--api, $SVCPROXY_API) and there is a
    kubeconfig (clientConnection.kubeconfig, --kubeconfig), a --master or in-cluster
    credentials."""
    if any(a == "--api" or a.startswith("--api=") for a in rest) or os.environ.get(API_ENV):
        return None
    kubeconfig = config["clientConnection"]["kubeconfig"] or None
    if kubeconfig is None and not master and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    return local_mode(kubeconfig, master) if local_mode is not None else None


if __name__ == "__main__":
    sys.exit(main())
