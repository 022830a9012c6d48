"""What a proxy can leave in a node's network namespace, listed so that a namespace before
the backend started and after its ``--cleanup`` can be compared: nftables objects (what
iptables-nft writes included), iptables-legacy chains and rules, nfacct objects, ipsets,
links and IPVS virtual servers. Sysctls are left out: kube-proxy leaves them set too.

An iptables-nft table (ip/ip6 filter, nat, mangle, raw, security) holding nothing but
empty base chains with policy accept is not counted: iptables-nft makes it on first use
and leaves it once the rules and chains in it are gone (after kube-proxy's cleanup too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from svcproxy.backends.iptables.nfacct import Nfacct

Item = tuple[str, ...]
BUILTIN = {"INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"}
XTABLES = {(family, name) for family in ("ip", "ip6")
           for name in ("filter", "nat", "mangle", "raw", "security")}


def _run(ns: str, *argv: str) -> str:
    done = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                          timeout=60)
    return done.stdout if done.returncode == 0 else ""


def _without_counts(expr: Any) -> Any:
    if isinstance(expr, dict):
        return {k: ("" if k == "counter" else _without_counts(v)) for k, v in expr.items()}
    if isinstance(expr, list):
        return [_without_counts(e) for e in expr]
    return expr


def _nft(ns: str) -> set[Item]:
    if shutil.which("nft") is None:
        return set()
    tables: dict[Item, set[Item]] = {}
    kept: set[Item] = set()  # iptables-nft tables holding more than empty base chains
    for entry in json.loads(_run(ns, "nft", "-j", "list", "ruleset") or "{}").get("nftables", []):
        kind, obj = next(iter(entry.items()))
        if kind == "metainfo":
            continue
        table = (obj["family"], obj["name"] if kind == "table" else obj["table"])
        items = tables.setdefault(table, {("nft table", *table)})
        if kind == "rule":
            items.add(("nft rule", *table, obj["chain"],
                       json.dumps(_without_counts(obj["expr"]), sort_keys=True)))
        elif kind != "table":
            items.add((f"nft {kind}", *table, obj.get("name", ""), obj.get("hook", "")))
        if kind != "table" and not (kind == "chain" and obj.get("hook")
                                    and obj.get("policy") == "accept"):
            kept.add(table)
    kept |= tables.keys() - XTABLES
    return {item for table in kept for item in tables[table]}


def _legacy(ns: str) -> set[Item]:
    found: set[Item] = set()
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        if shutil.which(tool) is None:
            continue
        table = ""
        for line in _run(ns, tool).splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].split()[0] not in BUILTIN:
                found.add((tool, table, line.split()[0]))
            elif line.startswith("-A"):
                found.add((tool, table, line))
    return found


def _nfacct(ns: str) -> set[Item]:
    accounting = Nfacct(("ip", "netns", "exec", ns))
    try:
        return {("nfacct", name) for name in accounting.names()}
    except OSError:
        return set()
    finally:
        accounting.close()


def _ipsets(ns: str) -> set[Item]:
    if shutil.which("ipset") is None:
        return set()
    return {("ipset", name) for name in _run(ns, "ipset", "list", "-n").split()}


def _links(ns: str) -> set[Item]:
    out = _run(ns, "ip", "-o", "link", "show")
    return {("link", line.split(":")[1].strip().split("@")[0]) for line in out.splitlines()}


def _ipvs(ns: str) -> set[Item]:
    """Virtual servers (/proc/net/ip_vs exists where the ip_vs module is loaded)."""
    lines = _run(ns, "cat", "/proc/net/ip_vs").splitlines()
    return {("ipvs", line.strip()) for line in lines[3:] if not line.startswith(" ")}


def snapshot(ns: str) -> set[Item]:
    """Everything of the above in namespace ``ns``."""
    return _nft(ns) | _legacy(ns) | _nfacct(ns) | _ipsets(ns) | _links(ns) | _ipvs(ns)
