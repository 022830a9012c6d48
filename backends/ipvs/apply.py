"""The kernel, besides IPVS and rtnetlink (``netlink``): thin adapters for the dummy
link (pyroute2 IPRoute), ``ipset restore``/``save`` and ``iptables-restore``/``save``.
What they are given is rendered elsewhere (``render``, ``rules``, ``ipsets``: pure)."""

from __future__ import annotations

import ipaddress
import logging
import subprocess

log = logging.getLogger(__name__)


class CommandError(RuntimeError):
    """A program failed; the message carries its stderr."""


def run(argv: list[str], text: str = "") -> str:
    """Run a program with ``text`` on stdin; its stdout, or CommandError with its stderr."""
    proc = subprocess.run(argv, input=text, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CommandError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def ensure_dummy(name: str) -> int:
    """The index of the dummy link ``name``, created (down, as kube-proxy's) if missing."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            ipr.link("add", ifname=name, kind="dummy")
            found = ipr.link_lookup(ifname=name)
        return int(found[0])


def link_index(name: str) -> int | None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
    return int(found[0]) if found else None


def delete_link(name: str) -> bool:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if found:
            ipr.link("del", index=found[0])
    return bool(found)


def link_addresses(ifindex: int) -> set[str]:
    """Addresses bound to one link."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return {str(ipaddress.ip_address(m.get("IFA_ADDRESS")))
                for m in ipr.get_addr(index=ifindex)}


def ipset_restore(text: str) -> None:
    if text:
        run(["ipset", "restore"], text)


def ipset_save() -> str:
    """Every set and entry, as ``ipset save`` prints them."""
    return run(["ipset", "save"])


def ipset_names() -> set[str]:
    return set(run(["ipset", "list", "-n"]).split())


def iptables(family: int, tool: str, mode: str = "") -> str:
    """The program: ``mode`` nft or legacy (the node context's), "" the node's default."""
    return ("iptables" if family == 4 else "ip6tables") + (f"-{mode}" if mode else "") + tool


def iptables_restore(family: int, text: str, mode: str = "") -> None:
    run([iptables(family, "-restore", mode), "--noflush", "-w", "5"], text)


def iptables_save(family: int, table: str, mode: str = "") -> str:
    return run([iptables(family, "-save", mode), "-t", table])
