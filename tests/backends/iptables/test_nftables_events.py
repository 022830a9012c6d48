"""svcproxy.sdk.netlink.NftablesEvents, which the iptables-nft drift check trusts to name
what someone else changed: real transactions in a namespace the test creates.

Each transaction's chains come with its generation; a socket that overflows says so;
after the loss, events left of a transaction whose end was dropped are not handed to the
next one (which would then name chains it never touched).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.sdk import netlink
from tests.support.lab.netns import ns_exec
from tests.support.netns.harness import netns_or_skip

pytestmark = pytest.mark.netns


@pytest.fixture
def netns() -> Iterator[str]:
    with netns_or_skip("spevents") as name:
        yield name


def test_each_transaction_names_its_chains_with_its_generation(netns: str) -> None:
    path = f"/run/netns/{netns}"
    events, reader = netlink.NftablesEvents(path), netlink.NftablesReader(path)
    try:
        ns_exec(netns, "iptables-nft", "-t", "nat", "-N", "KUBE-SEP-A")
        ns_exec(netns, "iptables-nft", "-t", "nat", "-A", "KUBE-SEP-A", "-j", "ACCEPT")
        ns_exec(netns, "nft", "add", "table", "ip", "someone-else")
        groups, lost = events.drain(reader.generation)
        assert not lost
        assert groups[-2:] == [(groups[-1][0] - 1, {(2, "nat", "KUBE-SEP-A")}),
                               (reader.generation(), {(2, "someone-else", "")})]
        assert events.drain(reader.generation) == ([], False)
    finally:
        events.close()
        reader.close()


def test_a_loss_is_said_and_the_next_transaction_is_whole(netns: str) -> None:
    path = f"/run/netns/{netns}"
    events = netlink.NftablesEvents(path, rcvbuf=8192)  # overflows at once
    reader = netlink.NftablesReader(path)
    try:
        rules = "".join(f"add rule ip big c{n % 50} counter\n" for n in range(3000))
        chains = "".join(f"add chain ip big c{n}\n" for n in range(50))
        ns_exec(netns, "nft", "-f", "-", stdin=f"add table ip big\n{chains}{rules}")
        _, lost = events.drain(reader.generation)
        assert lost
        ns_exec(netns, "iptables-nft", "-t", "nat", "-N", "KUBE-SVC-B")
        assert events.drain(reader.generation) == (
            [(reader.generation(), {(2, "nat", ""), (2, "nat", "KUBE-SVC-B")})], False)
    finally:
        events.close()
        reader.close()
