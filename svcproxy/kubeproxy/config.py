"""kube-proxy's configuration file: ``kubeproxy.config.k8s.io/v1alpha1`` ``KubeProxyConfiguration``.

Decoded strictly (an unknown field, a wrong type or a bad duration is refused with the
field's path), defaulted as kube-proxy 1.32 defaults it, and encoded back to YAML
(``--write-config-to``). The configuration is a plain nested dict keyed by the file's
(camelCase) names; durations are seconds (float), so a decoded and a re-encoded file
compare equal.
"""

from __future__ import annotations

import copy
import ipaddress
import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

from svcproxy.durations import parse_duration
from svcproxy.model import ip_family, normalize_cidr

GROUP = "kubeproxy.config.k8s.io"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "KubeProxyConfiguration"

# Field types. A dict is a nested struct. "?x" is a Go pointer (null stays None); other
# scalars take their Go zero value when null or absent, as encoding/json does.
_INFO_BUFFER = {"infoBufferSize": "quantity", "splitStream": "bool"}
SCHEMA: dict[str, Any] = {
    "apiVersion": "str",
    "kind": "str",
    "featureGates": "map_bool",
    "clientConnection": {
        "kubeconfig": "str",
        "acceptContentTypes": "str",
        "contentType": "str",
        "qps": "float",
        "burst": "int32",
    },
    "logging": {
        "format": "str",
        "flushFrequency": "time_or_duration",
        "verbosity": "uint32",
        "vmodule": "vmodule",
        "options": {"text": dict(_INFO_BUFFER), "json": dict(_INFO_BUFFER)},
    },
    "hostnameOverride": "str",
    "bindAddress": "str",
    "healthzBindAddress": "str",
    "metricsBindAddress": "str",
    "bindAddressHardFail": "bool",
    "enableProfiling": "bool",
    "showHiddenMetricsForVersion": "str",
    "mode": "str",
    "iptables": {
        "masqueradeBit": "?int32",
        "masqueradeAll": "bool",
        "localhostNodePorts": "?bool",
        "syncPeriod": "duration",
        "minSyncPeriod": "duration",
    },
    "ipvs": {
        "syncPeriod": "duration",
        "minSyncPeriod": "duration",
        "scheduler": "str",
        "excludeCIDRs": "list_str",
        "strictARP": "bool",
        "tcpTimeout": "duration",
        "tcpFinTimeout": "duration",
        "udpTimeout": "duration",
    },
    "nftables": {
        "masqueradeBit": "?int32",
        "masqueradeAll": "bool",
        "syncPeriod": "duration",
        "minSyncPeriod": "duration",
    },
    "winkernel": {
        "networkName": "str",
        "sourceVip": "str",
        "enableDSR": "bool",
        "rootHnsEndpointName": "str",
        "forwardHealthCheckVip": "bool",
    },
    "detectLocalMode": "str",
    "detectLocal": {"bridgeInterface": "str", "interfaceNamePrefix": "str"},
    "clusterCIDR": "str",
    "nodePortAddresses": "list_str",
    "oomScoreAdj": "?int32",
    "conntrack": {
        "maxPerCore": "?int32",
        "min": "?int32",
        "tcpEstablishedTimeout": "?duration",
        "tcpCloseWaitTimeout": "?duration",
        "tcpBeLiberal": "bool",
        "udpTimeout": "duration",
        "udpStreamTimeout": "duration",
    },
    "configSyncPeriod": "duration",
    "portRange": "str",
    "windowsRunAsService": "bool",
}

# Fields older kube-proxy releases had in v1alpha1 and dropped, with the release. kube-proxy
# 1.32 still runs a file holding them (it decodes v1alpha1 leniently when strict decoding
# fails): accepted here with a warning naming each, where any other unknown field is refused.
DROPPED = {"udpIdleTimeout": "1.26", "resourceContainer": "1.16", "conntrack.max": "1.12"}
PROXY_MODES = ("iptables", "ipvs", "nftables")
DETECT_LOCAL_MODES = ("", "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
_ZERO = {"str": "", "bool": False, "int32": 0, "uint32": 0, "float": 0.0, "duration": 0.0,
         "quantity": "0", "time_or_duration": 0.0, "list_str": None, "map_bool": None,
         "vmodule": None}
_INT32 = (-(2**31), 2**31 - 1)
# resource.Quantity: a decimal number, then a binary (Ki..Ei) or decimal (n..E) suffix or an
# exponent (e3, E-2).
_QUANTITY = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
LOG_FORMATS = ("json", "text")
# kube-proxy 1.32 shows the metrics hidden in the release before it, and refuses other values.
HIDDEN_METRICS_VERSION = "1.31"


class ConfigError(ValueError):
    """A configuration file kube-proxy would refuse; the message names the field."""


class _StrictLoader(yaml.SafeLoader):
    """YAML loader refusing duplicate keys (as Kubernetes' strict decoding does)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"duplicate field {key!r} (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def empty_config() -> dict[str, Any]:
    """Every field at its Go zero value (pointers None), before defaulting."""
    return _zero(SCHEMA)


def _zero(schema: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in schema.items():
        if isinstance(kind, dict):
            out[name] = _zero(kind)
        else:
            out[name] = None if kind.startswith("?") else _ZERO[kind]
    out.update({"apiVersion": API_VERSION, "kind": KIND} if "kind" in schema else {})
    return out


def load_config(text: str, notes: list[str] | None = None) -> dict[str, Any]:
    """Decode a file's text strictly, check apiVersion/kind, apply defaults and validate;
    a field in DROPPED is left out with a line in ``notes``."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=_StrictLoader)  # noqa: S506 - safe
                if d is not None]
    except yaml.YAMLError as err:
        raise ConfigError(f"not valid YAML/JSON: {' '.join(str(err).split())}") from err
    if len(docs) > 1:
        raise ConfigError(f"the file holds {len(docs)} YAML documents (---): kube-proxy reads "
                          "the first only; keep one YAML document, the "
                          "KubeProxyConfiguration")
    raw = docs[0] if docs else None
    if not isinstance(raw, dict):
        raise ConfigError("expected a KubeProxyConfiguration object (a YAML mapping)")
    if raw.get("apiVersion") != API_VERSION or raw.get("kind") != KIND:
        raise ConfigError(f"apiVersion must be {API_VERSION} and kind {KIND} (found "
                          f"{raw.get('apiVersion')!r}, {raw.get('kind')!r})")
    config = empty_config()
    _decode_into(config, raw, SCHEMA, "", [] if notes is None else notes)
    apply_defaults(config)
    validate(config)
    return config


def _decode_into(out: dict[str, Any], raw: Mapping[Any, Any], schema: Mapping[str, Any],
                 prefix: str, notes: list[str]) -> None:
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if path in DROPPED:
            notes.append(f"{path}: kube-proxy dropped this field in {DROPPED[path]}; ignored")
            continue
        if not isinstance(key, str) or key not in schema:
            raise ConfigError(f'unknown field "{path}"' + _did_you_mean(key, schema))
        kind = schema[key]
        if value is None:
            continue  # null leaves the zero value, as Go's encoding/json does
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected an object, got {_describe(value)}")
            _decode_into(out[key], value, kind, path + ".", notes)
        else:
            out[key] = decode_value(kind.lstrip("?"), value, path)


def _did_you_mean(key: object, schema: Mapping[str, Any]) -> str:
    lowered = {name.lower(): name for name in schema}
    if isinstance(key, str) and key.lower() in lowered:
        return f" (did you mean {lowered[key.lower()]!r}? field names are case-sensitive)"
    return ""


def _describe(value: object) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "list",
             dict: "object"}
    return f"{names.get(type(value), type(value).__name__)} {value!r}"


def decode_value(kind: str, value: Any, path: str) -> Any:
    """One scalar (or list/map) field, checked against its Go type."""
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected string, got {_describe(value)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected boolean, got {_describe(value)}")
        return value
    if kind in ("int32", "uint32"):
        return _integer(kind, value, path)
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected number, got {_describe(value)}")
        return float(value)
    if kind == "duration":
        return _duration(value, path)
    if kind == "time_or_duration":  # logging.flushFrequency: nanoseconds or "5s"
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1e9
        return _duration(value, path)
    if kind == "quantity":
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(f"{path}: expected quantity (e.g. \"0\", \"64Ki\"), got "
                              f"{_describe(value)}")
        if not _QUANTITY.fullmatch(str(value).strip()):
            raise ConfigError(f"{path}: {str(value)!r} is not a quantity (e.g. \"0\", "
                              "\"64Ki\", \"1M\")")
        return str(value)
    if kind == "list_str":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected list of strings, got {_describe(value)}")
        return list(value)
    if kind == "map_bool":
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, bool) for k, v in value.items()):
            raise ConfigError(f"{path}: expected map of name: boolean, got {_describe(value)}")
        return dict(value)
    if kind == "vmodule":
        return _vmodule(value, path)
    raise AssertionError(kind)


def _integer(kind: str, value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: expected {kind}, got {_describe(value)}")
    low, high = (0, 2**32 - 1) if kind == "uint32" else _INT32
    if not low <= value <= high:
        raise ConfigError(f"{path}: {value} does not fit in {kind}")
    return value


def _duration(value: Any, path: str) -> float:
    if not isinstance(value, str):
        raise ConfigError(f"{path}: expected duration string (e.g. \"30s\", \"1m30s\"), got "
                          f"{_describe(value)}")
    try:
        return parse_duration(value)
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from err


def _vmodule(value: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected list of {{filePattern, verbosity}}, got "
                          f"{_describe(value)}")
    items = []
    for i, item in enumerate(value):
        entry = {"filePattern": "", "verbosity": 0}
        if not isinstance(item, dict):
            raise ConfigError(f"{path}[{i}]: expected object, got {_describe(item)}")
        _decode_into(entry, item, {"filePattern": "str", "verbosity": "uint32"},
                     f"{path}[{i}].", [])
        items.append(entry)
    return items


def apply_defaults(config: dict[str, Any]) -> None:
    """kube-proxy 1.32's SetDefaults_KubeProxyConfiguration, in place."""
    if not config["bindAddress"]:
        config["bindAddress"] = "0.0.0.0"
    ipv6 = ":" in config["bindAddress"]
    config["healthzBindAddress"] = _with_port(config["healthzBindAddress"],
                                              "[::]" if ipv6 else "0.0.0.0", 10256)
    config["metricsBindAddress"] = _with_port(config["metricsBindAddress"],
                                              "[::1]" if ipv6 else "127.0.0.1", 10249)
    if config["oomScoreAdj"] is None:
        config["oomScoreAdj"] = -999
    for section in ("iptables", "nftables"):
        _default_sync(config[section], 30.0, 1.0)
        if config[section]["masqueradeBit"] is None:
            config[section]["masqueradeBit"] = 14
    if config["iptables"]["localhostNodePorts"] is None:
        config["iptables"]["localhostNodePorts"] = True
    _default_sync(config["ipvs"], 30.0, 0.0)
    conntrack = config["conntrack"]
    for name, value in (("maxPerCore", 32 * 1024), ("min", 128 * 1024),
                        ("tcpEstablishedTimeout", 86400.0), ("tcpCloseWaitTimeout", 3600.0)):
        if conntrack[name] is None:
            conntrack[name] = value
    if not config["configSyncPeriod"]:
        config["configSyncPeriod"] = 900.0
    client = config["clientConnection"]
    client["contentType"] = client["contentType"] or "application/vnd.kubernetes.protobuf"
    client["qps"] = client["qps"] or 5.0
    client["burst"] = client["burst"] or 10
    if config["featureGates"] is None:
        config["featureGates"] = {}
    logging = config["logging"]
    logging["format"] = logging["format"] or "text"
    logging["flushFrequency"] = logging["flushFrequency"] or 5.0


def _default_sync(section: dict[str, Any], sync: float, min_sync: float) -> None:
    section["syncPeriod"] = section["syncPeriod"] or sync
    section["minSyncPeriod"] = section["minSyncPeriod"] or min_sync


def _with_port(address: str, default_host: str, port: int) -> str:
    if not address:
        return f"{default_host}:{port}"
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{port}"
    return address if address.count(":") == 1 else (
        f"[{address}]:{port}" if ":" in address else f"{address}:{port}")


def validate(config: Mapping[str, Any]) -> None:
    """kube-proxy 1.32's validation (pkg/proxy/apis/config/validation), every failure named
    by its field path at once; modes are checked later, against the installed backends."""
    errors = _errors(config)
    if errors:
        raise ConfigError("; ".join(errors))


def sync_section(mode: str) -> str:
    """The section whose sync periods a mode uses (another backend's: iptables')."""
    return {"ipvs": "ipvs", "nftables": "nftables", "nft": "nftables"}.get(mode, "iptables")


def _errors(config: Mapping[str, Any]) -> list[str]:
    errors: list[str] = []
    mode = config["mode"]
    if mode == "kernelspace":
        errors.append("mode: 'kernelspace' is the Windows proxy; on Linux use iptables, "
                      "ipvs, nftables or the name of an installed svcproxy backend")
    for section in ("iptables", "nftables"):
        bit = config[section]["masqueradeBit"]
        if not 0 <= bit <= 31:
            errors.append(f"{section}.masqueradeBit: {bit} must be within [0, 31]")
    for section in ("iptables", "ipvs", "nftables"):
        if config[section]["syncPeriod"] <= 0:
            errors.append(f"{section}.syncPeriod: must be greater than 0")
    errors += _sync_errors(config[sync_section(mode)], sync_section(mode))
    if mode == "ipvs":
        errors += _cidr_errors(config["ipvs"]["excludeCIDRs"] or [], "ipvs.excludeCIDRs")
    for name in ("maxPerCore", "min"):
        errors += _nonnegative(config["conntrack"][name], f"conntrack.{name}")
    errors += _nonnegative(config["clientConnection"]["burst"], "clientConnection.burst")
    oom = config["oomScoreAdj"]
    if not -1000 <= oom <= 1000:
        errors.append(f"oomScoreAdj: {oom} must be within [-1000, 1000]")
    try:
        ipaddress.ip_address(config["bindAddress"])
    except ValueError:
        errors.append(f"bindAddress: {config['bindAddress']!r} is not an IP address")
    for field in ("healthzBindAddress", "metricsBindAddress"):
        if config[field] and not _ip_port(config[field]):
            errors.append(f"{field}: {config[field]!r} is not IP:PORT")
    errors += _node_port_errors(config["nodePortAddresses"] or [])
    errors += _detect_local_errors(config)
    errors += _logging_errors(config["logging"])
    hidden = config["showHiddenMetricsForVersion"]
    if hidden and hidden != HIDDEN_METRICS_VERSION:
        errors.append(f"showHiddenMetricsForVersion: {hidden!r} must be omitted or "
                      f"{HIDDEN_METRICS_VERSION!r} (only the previous minor version)")
    if not _port_range(config["portRange"]):
        errors.append(f"portRange: {config['portRange']!r} must be a valid port range "
                      "(e.g. 30000-32767, 30000+2767 or 8080)")
    return errors


def _sync_errors(section: Mapping[str, Any], name: str) -> list[str]:
    low, high = section["minSyncPeriod"], section["syncPeriod"]
    if low > high:
        return [f"{name}.minSyncPeriod: {format_go_duration(low)} must not exceed "
                f"{name}.syncPeriod ({format_go_duration(high)})"]
    return []


def _nonnegative(value: int, path: str) -> list[str]:
    return [f"{path}: {value} must be greater than or equal to 0"] if value < 0 else []


def _cidr_errors(items: list[str], path: str) -> list[str]:
    return [f"{path}[{i}]: {item!r} is not a valid CIDR" for i, item in enumerate(items)
            if normalize_cidr(item) is None]


def _node_port_errors(items: list[str]) -> list[str]:
    if "primary" in items:
        index = items.index("primary")
        if len(items) != 1:
            return [f"nodePortAddresses[{index}]: can't use both 'primary' and CIDRs"]
        return []
    # svcproxy's own shorthands, beside CIDRs
    return _cidr_errors([i for i in items if i not in ("localhost", "all")],
                        "nodePortAddresses")


def _detect_local_errors(config: Mapping[str, Any]) -> list[str]:
    mode = config["detectLocalMode"]
    if mode not in DETECT_LOCAL_MODES:
        return [f"detectLocalMode: {mode!r} is not one of "
                + ", ".join(m for m in DETECT_LOCAL_MODES if m)]
    if mode == "BridgeInterface" and not config["detectLocal"]["bridgeInterface"]:
        return ["detectLocal.bridgeInterface: must not be empty with detectLocalMode "
                "BridgeInterface"]
    if mode == "InterfaceNamePrefix" and not config["detectLocal"]["interfaceNamePrefix"]:
        return ["detectLocal.interfaceNamePrefix: must not be empty with detectLocalMode "
                "InterfaceNamePrefix"]
    text = config["clusterCIDR"]
    if mode not in ("", "ClusterCIDR") or not text:
        return []
    parts = [c.strip() for c in text.split(",")]
    bad = [c for c in parts if normalize_cidr(c) is None]
    if bad:
        return [f"clusterCIDR: {bad[0]!r} is not a valid CIDR (e.g. 10.244.0.0/16)"]
    families = {ip_family(c) for c in parts}
    if len(parts) > 2 or (len(parts) == 2 and len(families) != 2):
        return [f"clusterCIDR: {text!r} must be one CIDR or a dual-stack pair "
                "(e.g. 10.244.0.0/16,fd00:10:244::/56)"]
    return []


def _logging_errors(logging: Mapping[str, Any]) -> list[str]:
    fmt = logging["format"]
    if fmt not in LOG_FORMATS:
        return [f"logging.format: {fmt!r} is not supported ({', '.join(LOG_FORMATS)})"]
    if logging["vmodule"] and fmt != "text":
        return ["logging.vmodule: only supported for the text log format"]
    return []


def _port_range(text: str) -> bool:
    """utilnet.ParsePortRange: empty, N, N-M or N+S within [0, 65535]."""
    text = text.strip()
    if not text:
        return True
    match = re.fullmatch(r"(\d+)(?:([-+])(\d+))?", text)
    if not match:
        return False
    low = int(match.group(1))
    if match.group(2) is None:
        return low <= 65535
    other = int(match.group(3))
    high = other if match.group(2) == "-" else low + other
    return low <= high <= 65535


def _ip_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return port.isdigit() and int(port) <= 65535


def format_go_duration(seconds: float) -> str:
    """Go's time.Duration.String(): 0s, 300ms, 1.5s, 1m30s, 24h0m0s."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return f"{sign}{_decimal(ns, size)}{unit}"
    hours, rest = divmod(ns, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = f"{_decimal(rest, 10**9)}s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return sign + text


def _decimal(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(int(math.log10(unit)), "0").rstrip("0")
    return f"{whole}.{digits}"


def field_kind(path: str) -> str:
    """The type of a dotted field (``ipvs.tcpTimeout``: "duration"), "?" left off."""
    kind: Any = SCHEMA
    for name in path.split("."):
        kind = kind[name]
    return kind.lstrip("?") if isinstance(kind, str) else "struct"


def config_document(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration as kube-proxy serialises it (durations in Go's form): what
    --write-config-to writes and /configz serves."""
    return _encode(config, SCHEMA)


def encode_config(config: Mapping[str, Any]) -> str:
    """The configuration as YAML, keys sorted (as kube-proxy's --write-config-to writes it)."""
    return yaml.safe_dump(config_document(config), sort_keys=True, default_flow_style=False,
                          allow_unicode=True)


def _encode(values: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in schema.items():
        value = values.get(name)
        if isinstance(kind, dict):
            out[name] = _encode(value or {}, kind)
        elif value is None:
            out[name] = None
        elif kind.lstrip("?") in ("duration", "time_or_duration"):
            out[name] = format_go_duration(value)
        elif kind == "float" and float(value).is_integer():
            out[name] = int(value)  # Go writes a whole float32 as 5, not 5.0
        elif kind == "vmodule":
            out[name] = [dict(item) for item in value]
        else:
            out[name] = copy.deepcopy(value)
    return out
