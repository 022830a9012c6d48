"""The fixed part of one family's table: base chains, dispatch maps, helper chains."""

from __future__ import annotations

from .context import TableContext, anonymous_set
from .names import lb_chain, lb_map

# Sets and verdict maps that service ports add elements to.
SETS = ("cluster-ips", "hairpin")
MAPS = (
    "service-ips",
    "service-nodeports",
    "no-endpoint-services",
    "no-endpoint-nodeports",
    "firewall-ips",
)
CONTAINERS = SETS + MAPS

# name, type, hook, priority: filter chains run before DNAT so they see the service address.
BASE_CHAINS = (
    ("filter-prerouting", "filter", "prerouting", -110),
    ("filter-input", "filter", "input", -110),
    ("filter-forward", "filter", "forward", -110),
    ("filter-output", "filter", "output", -110),
    ("filter-output-post-dnat", "filter", "output", -90),
    ("nat-prerouting", "nat", "prerouting", -100),
    ("nat-output", "nat", "output", -100),
    ("nat-postrouting", "nat", "postrouting", 100),
)


def _containers(ctx: TableContext) -> dict[str, str]:
    """Declarations of the sets and maps, by name."""
    addr = ctx.addr_type
    svc_key = f"{addr} . inet_proto . inet_service : verdict"
    port_key = "inet_proto . inet_service : verdict"
    # One comment per set: nft refuses a second one ("This statement is duplicated").
    nodeports = f'type {addr}; comment "unused: NodePorts on every local address";'
    if ctx.nodeport_ips is not None:
        elements = f" elements = {anonymous_set(ctx.nodeport_ips)};" if ctx.nodeport_ips else ""
        nodeports = f'type {addr};{elements} comment "IPs that accept NodePort traffic";'
    return {
        "cluster-ips": f"type {addr}; comment \"ClusterIPs (other ports are rejected)\";",
        "hairpin": f'type {addr} . {addr}; comment "endpoint . endpoint: pod reaching itself";',
        "nodeport-ips": nodeports,
        "service-ips": f'type {svc_key}; comment "ClusterIP, ExternalIP and LB IP traffic";',
        "service-nodeports": f'type {port_key}; comment "NodePort traffic";',
        "no-endpoint-services": f'type {svc_key}; comment "drop or reject: no endpoints";',
        "no-endpoint-nodeports": f'type {port_key}; comment "drop or reject: no endpoints";',
        "firewall-ips": f'type {svc_key}; comment "loadBalancerSourceRanges";',
    }


def _helper_chains(ctx: TableContext) -> dict[str, tuple[str, ...]]:
    """Regular chains the base chains jump to, in dependency order."""
    ipx, mark = ctx.ipx, f"0x{ctx.mark:x}"
    dispatch = f"{ipx} daddr . meta l4proto . th dport vmap"
    nodeport = f"{ipx} daddr @nodeport-ips meta l4proto . th dport vmap"
    if ctx.nodeport_ips is None:  # every local address, never loopback (as kube-proxy)
        loopback = "127.0.0.0/8" if ctx.family == 4 else "::1"
        nodeport = (f"fib daddr type local {ipx} daddr != {loopback} "
                    "meta l4proto . th dport vmap")
    cluster_check = [f"{ipx} daddr @cluster-ips reject"]
    if ctx.service_cidrs:
        cluster_check.append(f"{ipx} daddr {anonymous_set(ctx.service_cidrs)} drop")
    return {
        "mark-for-masquerade": (f"meta mark set meta mark | {mark}",),
        "masquerading": (
            f"ct status dnat {ipx} saddr . {ipx} daddr @hairpin masquerade fully-random",
            f"meta mark & {mark} == 0 return",
            f"meta mark set meta mark ^ {mark}",
            "masquerade fully-random",
        ),
        "reject-chain": ("reject",),
        "services": (f"{dispatch} @service-ips", f"{nodeport} @service-nodeports"),
        "service-endpoints-check": (
            f"{dispatch} @no-endpoint-services",
            f"{nodeport} @no-endpoint-nodeports",
        ),
        "firewall-check": (f"{dispatch} @firewall-ips",),
        "cluster-ips-check": tuple(cluster_check),
    }


_JUMPS = {
    "filter-prerouting": ("ct state new jump firewall-check",),
    "filter-input": ("ct state new jump service-endpoints-check",),
    "filter-forward": (
        "ct state new jump service-endpoints-check",
        "ct state new jump cluster-ips-check",
    ),
    "filter-output": (
        "ct state new jump service-endpoints-check",
        "ct state new jump firewall-check",
    ),
    "filter-output-post-dnat": ("ct state new jump cluster-ips-check",),
    "nat-prerouting": ("jump services",),
    "nat-output": ("jump services",),
    "nat-postrouting": ("jump masquerading",),
}


def render_skeleton(ctx: TableContext) -> str:
    """The body (inside ``table ... { }``) of the fixed objects."""
    lines = ['\tcomment "svcproxy nft backend: generated, do not edit";']
    for name, decl in _containers(ctx).items():
        kind = "map" if ":" in decl.split(";")[0] else "set"
        lines.append(f"\t{kind} {name} {{ {decl} }}")
    for name, rules in _helper_chains(ctx).items():
        lines.append(chain_block(name, rules))
    for name, kind, hook, prio in BASE_CHAINS:
        head = f"type {kind} hook {hook} priority {prio}; policy accept;"
        lines.append(chain_block(name, (head, *_JUMPS[name])))
    return "\n".join(lines)


def skeleton_chains(ctx: TableContext) -> dict[str, tuple[str, ...]]:
    """Every fixed chain and its rules (a base chain's: its jumps, not its head)."""
    chains = dict(_helper_chains(ctx))
    chains.update((name, _JUMPS[name]) for name, *_ in BASE_CHAINS)
    return chains


def chain_block(name: str, rules: tuple[str, ...] | list[str]) -> str:
    """``chain name { ... }`` with one statement per line."""
    body = "".join(f"\t\t{r}\n" for r in rules)
    return f"\tchain {name} {{\n{body}\t}}"


def lb_declarations(ctx: TableContext, size: int) -> list[str]:
    """The ``endpoints-N`` map and the ``lb-N`` chain DNATing through it (block lines)."""
    return [
        f"\tmap {lb_map(size)} {{ typeof {_lb_key(ctx, size)} : {ctx.ipx} daddr . th dport; }}",
        chain_block(lb_chain(size), lb_rules(ctx, size)),
    ]


def lb_rules(ctx: TableContext, size: int) -> tuple[str, ...]:
    """The rules of ``lb-N``."""
    masq: tuple[str, ...] = ()
    if ctx.masquerade_all:
        masq = ("jump mark-for-masquerade",)
    elif ctx.nonlocal_match:
        masq = (f"{ctx.nonlocal_match} jump mark-for-masquerade",)
    key = _lb_key(ctx, size)
    return (*masq, f"meta l4proto {{ tcp, udp, sctp }} dnat {ctx.ipx} to {key} map "
            f"@{lb_map(size)}")


def _lb_key(ctx: TableContext, size: int) -> str:
    return f"{ctx.ipx} daddr . meta l4proto . th dport . numgen random mod {size}"
