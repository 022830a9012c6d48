"""A connected UDP socket whose endpoint left while the backend was down: the backend
that starts next adopts the pinned maps, and its first sync compares the endpoints they
held with the new state and destroys the sockets of those that left (Cilium's
terminatePodConnections at its resync). Real sockets in the test's namespace and cgroup.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from svcproxy.backends.ebpf.backend import EbpfBackend
from svcproxy.sdk import Changes
from tests.support import ebpf_sockets
from tests.support.ebpf_sockets import CONFIG, DESTROYED, EPS4, Holder, SocketWorld, service
from tests.support.world_fixture import running

pytestmark = ebpf_sockets.marks()


@pytest.fixture
def world() -> Iterator[SocketWorld]:
    yield from running(SocketWorld())


def socket_to_another(holder: Holder, host: str, chosen: str) -> tuple[str, int]:
    """The id of a connected UDP socket to an endpoint other than ``chosen`` (each
    connect() picks at random: one of 40 tries lands there but once in 2**40), and how
    many sockets the tries before it connected to ``chosen`` (they stay open)."""
    for i in range(40):
        if holder.call(op="open", id=f"k{i}", proto="udp", host=host)["name"] != chosen:
            return f"k{i}", i
    raise AssertionError(f"every connect() to {host} picked {chosen}")


def test_udp_socket_of_an_endpoint_that_left_while_the_backend_was_down(world: SocketWorld) -> None:
    dns = "10.96.6.1"
    pair = EPS4[:2]
    world.set(service("dns", (dns,), pair, proto="UDP"))
    holder = Holder(world)
    try:
        chosen = holder.call(op="open", id="u", proto="udp", host=dns)["name"]
        kept, also_to_chosen = socket_to_another(holder, dns, chosen)
        assert world.backend is not None
        world.backend.close()  # down: the pinned programs and maps keep serving
        world.backend = None
        left = service("dns", (dns,), [e for e in pair if e != chosen], proto="UDP")
        world.services[left.key] = left
        world.backend = EbpfBackend(CONFIG, world.layout).start()
        world.sync(Changes(frozenset(world.services), full=True, reason="initial"))
        other = next(e for e in pair if e != chosen)
        got = holder.call(op="ask", id="u")
        assert got.get("errno") in DESTROYED, f"the socket of the endpoint that left: {got}"
        assert world.backend.sockets_destroyed == 1 + also_to_chosen, "each one to it"
        assert holder.call(op="ask", id=kept) == {"name": other}, "the endpoint that stays"
        again = holder.call(op="open", id="u2", proto="udp", host=dns)
        assert again == {"name": other}, again
    finally:
        holder.stop()
