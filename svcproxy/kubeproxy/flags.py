"""kube-proxy 1.32's command-line flags, each mapped onto its KubeProxyConfiguration field.

Parsed as Go's pflag does: ``--flag=value`` or ``--flag value``, booleans as ``--flag`` or
``--flag=false``, durations in Go's syntax, lists comma-separated (repeatable), and ``_``
in a flag name read as ``-``. Only the flags given appear in the result, so the
precedence rules can tell a flag given from a default.
"""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from svcproxy.durations import parse_duration
from svcproxy.kubeproxy.config import ConfigError, decode_value


def go_bool(text: str) -> bool:
    """A boolean as strconv.ParseBool reads it."""
    value = text.strip()
    if value in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if value in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (true or false)")


def go_duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def int32(text: str) -> int:
    try:
        value = int(text.lstrip("="))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if not -(2**31) <= value < 2**31:
        raise argparse.ArgumentTypeError(f"{value} does not fit in int32")
    return value


def float32(text: str) -> float:
    try:
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from err


def quantity(text: str) -> str:
    """A resource quantity ("0", "64Ki", "1M"), as the config file's field takes it."""
    try:
        return decode_value("quantity", text, "quantity")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).partition(": ")[2]) from err


def string_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def ip_address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r}") from err


def ip_port(text: str) -> str:
    """IP:PORT (or a bare IP); kept as text, as kube-proxy keeps it."""
    text = text.strip()
    if not text:
        return text
    host = text
    if text.startswith("["):
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        if not port.isdigit() or int(port) > 65535:
            raise argparse.ArgumentTypeError(f"invalid port in {text!r}")
    if host:
        ip_address(host)
    return text


def apiserver_url(text: str) -> str:
    """--master: http(s)://HOST[:PORT][/PATH] or HOST[:PORT], kept as given."""
    text = text.strip()
    if not text:
        return text
    url = urlsplit(text if "://" in text else f"//{text}")
    try:
        url.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        url = url._replace(netloc="")
    if url.scheme not in ("", "http", "https") or not url.hostname or any(
            c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an apiserver address: give https://HOST[:PORT] (or http://)")
    return text


def feature_gates(text: str) -> dict[str, bool]:
    """name=bool,name=bool."""
    gates = {}
    for part in string_list(text):
        name, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"feature gate {part!r} is not name=true|false")
        gates[name.strip()] = go_bool(value)
    return gates


def vmodule(text: str) -> list[dict[str, Any]]:
    """pattern=N,pattern=N."""
    items = []
    for part in string_list(text):
        pattern, sep, level = part.partition("=")
        if not sep or not level.isdigit():
            raise argparse.ArgumentTypeError(f"vmodule item {part!r} is not pattern=N")
        items.append({"filePattern": pattern, "verbosity": int(level)})
    return items


@dataclass(frozen=True, slots=True)
class Flag:
    """One kube-proxy flag: its name, value type, the config fields it sets, its help."""

    name: str
    parse: Callable[[str], Any] | None  # None: a boolean switch
    paths: tuple[str, ...]  # config fields (dotted); () = handled specially
    help: str
    logging: bool = False  # logging flags win over --config, as in kube-proxy
    repeat: bool = False  # lists and maps: values of repeated flags are merged


def _f(name: str, parse: Callable[[str], Any] | None, paths: str, help: str,
       **kw: bool) -> Flag:
    return Flag(name, parse, tuple(p for p in paths.split() if p), help, **kw)


FLAGS: tuple[Flag, ...] = (
    _f("config", str, "", "path to a KubeProxyConfiguration file (kubeadm's ConfigMap)"),
    _f("write-config-to", str, "", "write the effective configuration (defaults, file and "
       "flags) to this file and exit"),
    _f("cleanup", None, "", "remove everything the backend of the chosen mode programmed, "
       "then exit"),
    _f("init-only", None, "", "do the privileged initialization (oom-score-adj) and exit"),
    _f("feature-gates", feature_gates, "featureGates", "key=value pairs of feature gates "
       "(accepted; svcproxy has none of kube-proxy's gates to switch)", repeat=True),
    _f("kubeconfig", str, "clientConnection.kubeconfig", "kubeconfig of the apiserver "
       "(svcproxy's backend reads its node's state from the frontend instead)"),
    _f("master", apiserver_url, "", "apiserver address, overriding the kubeconfig's (local mode; "
       "with a frontend address the frontend watches the apiserver and it is not used)"),
    _f("kube-api-content-type", str, "clientConnection.contentType", "apiserver content "
       "type (not used by the backend)"),
    _f("kube-api-burst", int32, "clientConnection.burst", "apiserver burst (not used)"),
    _f("kube-api-qps", float32, "clientConnection.qps", "apiserver QPS (not used)"),
    _f("hostname-override", str, "", "this node's name (wins over the config file)"),
    _f("bind-address", ip_address, "bindAddress", "the node's primary IP (0.0.0.0: "
       "discovered)"),
    _f("healthz-bind-address", ip_port, "healthzBindAddress", "IP:PORT of /healthz "
       "(default 0.0.0.0:10256); empty disables"),
    _f("metrics-bind-address", ip_port, "metricsBindAddress", "IP:PORT of /metrics "
       "(default 127.0.0.1:10249); empty disables"),
    _f("bind-address-hard-fail", None, "bindAddressHardFail", "exit when the healthz or "
       "metrics address cannot be bound (otherwise proxy on without that server)"),
    _f("profiling", None, "enableProfiling", "profiling handlers (not available)"),
    _f("show-hidden-metrics-for-version", str, "showHiddenMetricsForVersion",
       "show metrics hidden since that version (svcproxy hides none)"),
    _f("proxy-mode", str, "mode", "iptables (default), ipvs, nftables, or the name of any "
       "installed svcproxy backend (nft, ebpf, ...)"),
    _f("iptables-masquerade-bit", int32, "iptables.masqueradeBit nftables.masqueradeBit",
       "fwmark bit flagging packets for SNAT, 0-31 (default 14)"),
    _f("masquerade-all", None, "iptables.masqueradeAll nftables.masqueradeAll",
       "SNAT all traffic sent to service cluster IPs"),
    _f("iptables-localhost-nodeports", go_bool, "iptables.localhostNodePorts",
       "accept NodePort connections on localhost (iptables mode, IPv4) (default true)"),
    _f("iptables-sync-period", go_duration, "iptables.syncPeriod nftables.syncPeriod",
       "full resync period of the iptables and nftables modes (default 30s)"),
    _f("iptables-min-sync-period", go_duration, "iptables.minSyncPeriod "
       "nftables.minSyncPeriod", "minimum time between two syncs (default 1s)"),
    _f("ipvs-sync-period", go_duration, "ipvs.syncPeriod", "full resync period of the ipvs "
       "mode (default 30s)"),
    _f("ipvs-min-sync-period", go_duration, "ipvs.minSyncPeriod", "minimum time between two "
       "ipvs syncs (default 0s)"),
    _f("ipvs-scheduler", str, "ipvs.scheduler", "IPVS scheduler (default rr)"),
    _f("ipvs-exclude-cidrs", string_list, "ipvs.excludeCIDRs", "comma-separated CIDRs whose "
       "IPVS virtual servers are never touched", repeat=True),
    _f("ipvs-strict-arp", None, "ipvs.strictARP", "set arp_ignore=1 and arp_announce=2"),
    _f("ipvs-tcp-timeout", go_duration, "ipvs.tcpTimeout", "IPVS TCP idle timeout (0: as-is)"),
    _f("ipvs-tcpfin-timeout", go_duration, "ipvs.tcpFinTimeout", "IPVS TCP timeout after FIN "
       "(0: as-is)"),
    _f("ipvs-udp-timeout", go_duration, "ipvs.udpTimeout", "IPVS UDP timeout (0: as-is)"),
    _f("detect-local-mode", str, "detectLocalMode", "ClusterCIDR, NodeCIDR, "
       "BridgeInterface or InterfaceNamePrefix"),
    _f("pod-bridge-interface", str, "detectLocal.bridgeInterface", "bridge of local pod "
       "traffic (BridgeInterface mode)"),
    _f("pod-interface-name-prefix", str, "detectLocal.interfaceNamePrefix", "interface "
       "name prefix of local pod traffic (InterfaceNamePrefix mode)"),
    _f("cluster-cidr", str, "clusterCIDR", "pod CIDRs of the cluster, comma-separated "
       "(ClusterCIDR mode)"),
    _f("nodeport-addresses", string_list, "nodePortAddresses", "CIDRs of the node IPs that "
       "accept NodePorts, or 'primary' (default: all)", repeat=True),
    _f("oom-score-adj", int32, "oomScoreAdj", "oom_score_adj of the process, [-1000, 1000] "
       "(default -999)"),
    _f("conntrack-max-per-core", int32, "conntrack.maxPerCore", "nf_conntrack_max per CPU "
       "(0: as-is) (default 32768)"),
    _f("conntrack-min", int32, "conntrack.min", "minimum nf_conntrack_max (default 131072)"),
    _f("conntrack-tcp-timeout-established", go_duration, "conntrack.tcpEstablishedTimeout",
       "idle timeout of established TCP flows (0: as-is) (default 24h0m0s)"),
    _f("conntrack-tcp-timeout-close-wait", go_duration, "conntrack.tcpCloseWaitTimeout",
       "timeout of TCP flows in CLOSE_WAIT (default 1h0m0s)"),
    _f("conntrack-tcp-be-liberal", None, "conntrack.tcpBeLiberal", "set "
       "nf_conntrack_tcp_be_liberal=1"),
    _f("conntrack-udp-timeout", go_duration, "conntrack.udpTimeout", "timeout of UNREPLIED "
       "UDP flows (0: as-is)"),
    _f("conntrack-udp-timeout-stream", go_duration, "conntrack.udpStreamTimeout", "timeout "
       "of ASSURED UDP flows (0: as-is)"),
    _f("config-sync-period", go_duration, "configSyncPeriod", "apiserver resync period "
       "(not used: the frontend watches the apiserver)"),
    _f("healthz-port", int32, "", "deprecated: 0 disables the healthz server; another "
       "is the port of a --healthz-bind-address given as a bare IP (default 10256)"),
    _f("metrics-port", int32, "", "deprecated: 0 disables the metrics server; another "
       "is the port of a --metrics-bind-address given as a bare IP (default 10249)"),
    _f("proxy-port-range", str, "portRange", "deprecated, unused (userspace proxy)"),
    _f("windows-service", None, "windowsRunAsService", "Windows only; ignored"),
    _f("v", int32, "logging.verbosity", "log verbosity: 0-3 info, 4 and more debug",
       logging=True),
    _f("vmodule", vmodule, "logging.vmodule", "pattern=N,... (accepted; svcproxy logs by "
       "-v only)", logging=True, repeat=True),
    _f("log-flush-frequency", go_duration, "logging.flushFrequency", "log flush period "
       "(svcproxy writes every line at once)", logging=True),
    _f("logging-format", str, "logging.format", "text or json", logging=True),
    _f("log-json-info-buffer-size", quantity, "logging.options.json.infoBufferSize",
       "accepted, unused", logging=True),
    _f("log-json-split-stream", None, "logging.options.json.splitStream", "accepted, unused",
       logging=True),
    _f("log-text-info-buffer-size", quantity, "logging.options.text.infoBufferSize",
       "accepted, unused", logging=True),
    _f("log-text-split-stream", None, "logging.options.text.splitStream", "accepted, unused",
       logging=True),
)
BY_DEST = {f.name.replace("-", "_"): f for f in FLAGS}


class _Merge(argparse.Action):
    """Repeated list/map flags accumulate, as pflag's slice and map values do."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        old = getattr(namespace, self.dest, None)
        if isinstance(old, dict):
            values = {**old, **values}
        elif isinstance(old, list):
            values = old + values
        setattr(namespace, self.dest, values)


_METAVARS: dict[Callable[[str], Any], str] = {
    go_duration: "DURATION", int32: "INT", float32: "FLOAT", string_list: "LIST",
    ip_address: "IP", ip_port: "IP:PORT", feature_gates: "NAME=BOOL,...",
    vmodule: "PATTERN=N,...", go_bool: "BOOL", quantity: "QUANTITY",
}


def add_kube_proxy_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of FLAGS; none has a default, so only given flags are set."""
    group = parser.add_argument_group("kube-proxy's flags (same names, meanings and syntax)")
    for flag in FLAGS:
        names = ["-v", "--v"] if flag.name == "v" else [f"--{flag.name}"]
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "help": flag.help}
        if flag.parse is None:
            kw.update(nargs="?", const=True, type=go_bool, metavar="BOOL")
        else:
            kw.update(type=flag.parse, metavar=_METAVARS.get(flag.parse, "STRING"))
            if flag.repeat:
                kw["action"] = _Merge
        group.add_argument(*names, **kw)


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """kube-proxy's word-separator rule: ``--iptables_sync_period`` is
    ``--iptables-sync-period``; ``-v=2`` is ``-v 2``."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, sep, value = arg[2:].partition("=")
            arg = "--" + name.replace("_", "-") + sep + value
        elif arg.startswith("-v="):
            arg = "-v" + arg[3:]
        out.append(arg)
    return out


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """{flag name: value} of the kube-proxy flags present in ``args``."""
    return {f.name: getattr(args, dest) for dest, f in BY_DEST.items() if hasattr(args, dest)}
