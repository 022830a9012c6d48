"""Jump rules from the built-in chains into ours, as kube-proxy installs them (pure).

They cannot be written by rewriting INPUT/FORWARD/... (those chains hold
other people's rules), so a full sync inserts the missing ones at the top
and ``--cleanup`` deletes exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from svcproxy.backends.iptables import names
from svcproxy.backends.iptables.render_restore import BUILTIN_CHAINS, SavedTable

NEW = "-m conntrack --ctstate NEW"


@dataclass(frozen=True, slots=True)
class JumpChain:
    """A jump from built-in chain ``source`` into our ``target`` (kube-proxy's
    iptablesJumpChain)."""

    table: str
    source: str
    target: str
    comment: str
    extra: str = ""

    def spec(self) -> str:
        """The rule after "-A SOURCE", in iptables-restore syntax."""
        parts = [self.extra] if self.extra else []
        if self.comment:
            parts.append(f'-m comment --comment "{self.comment}"')
        parts.append(f"-j {self.target}")
        return " ".join(parts)

    def present_in(self, rules: tuple[str, ...]) -> bool:
        """Whether iptables-save lines hold this jump (matched loosely, as save normalizes)."""
        head = f"-A {self.source} "
        tail = f"-j {self.target}"
        return any(
            r.startswith(head) and (r.endswith(" " + tail) or f" {tail} " in r)
            and (not self.comment or self.comment in r)
            for r in rules
        )


JUMPS: tuple[JumpChain, ...] = (
    JumpChain("filter", "INPUT", names.EXTERNAL_SERVICES,
         "kubernetes externally-visible service portals", NEW),
    JumpChain("filter", "FORWARD", names.EXTERNAL_SERVICES,
         "kubernetes externally-visible service portals", NEW),
    JumpChain("filter", "INPUT", names.NODEPORTS, "kubernetes health check service ports"),
    JumpChain("filter", "FORWARD", names.SERVICES, "kubernetes service portals", NEW),
    JumpChain("filter", "OUTPUT", names.SERVICES, "kubernetes service portals", NEW),
    JumpChain("filter", "FORWARD", names.FORWARD, "kubernetes forwarding rules"),
    JumpChain("filter", "INPUT", names.PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpChain("filter", "OUTPUT", names.PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpChain("filter", "FORWARD", names.PROXY_FIREWALL, "kubernetes load balancer firewall", NEW),
    JumpChain("nat", "OUTPUT", names.SERVICES, "kubernetes service portals"),
    JumpChain("nat", "PREROUTING", names.SERVICES, "kubernetes service portals"),
    JumpChain("nat", "POSTROUTING", names.POSTROUTING, "kubernetes postrouting rules"),
)

KUBELET_JUMPS: tuple[JumpChain, ...] = (
    JumpChain("filter", "INPUT", names.KUBELET_FIREWALL, ""),
    JumpChain("filter", "OUTPUT", names.KUBELET_FIREWALL, ""),
)


def insert_lines(jumps: tuple[JumpChain, ...], table: str, saved: SavedTable | None) -> list[str]:
    """``-I SOURCE 1`` lines for the jumps of ``table`` missing from the saved table."""
    rules = saved.rules if saved else ()
    return [f"-I {j.source} 1 {j.spec()}" for j in jumps
            if j.table == table and not j.present_in(rules)]


def delete_lines(targets: set[str], saved: SavedTable) -> list[str]:
    """``-D`` lines for every built-in-chain rule of the saved table that jumps to ``targets``."""
    out = []
    for rule in saved.rules:
        source = rule.split(" ", 2)[1]
        target = rule.rsplit(" -j ", 1)[-1].split(" ", 1)[0] if " -j " in rule else ""
        if source in BUILTIN_CHAINS and target in targets:
            out.append("-D" + rule[2:])
    return out
