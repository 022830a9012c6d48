"""The nft backend when the kernel refuses one service port: the rest is applied.

Real kernel, a namespace per test. The refusals are genuine: the kernel answers
"File exists" to an element of ``service-ips`` that a conflicting element (one this
test adds to the backend's table, or appends at the apply boundary) already holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from svcproxy.backends.nft import names
from svcproxy.backends.nft.apply import NftError, NftRunner
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.sdk import Changes, NodeState
from tests.support.lab.netns import ns_exec
from tests.support.netns.harness import netns_or_skip
from tests.support.nft_fixtures import CONFIG, endpoint, key, node_state, service, state_of

pytestmark = pytest.mark.netns
CONFLICT = "10.96.0.3 . tcp . 80 : drop"  # the ClusterIP of service "c", another verdict


@pytest.fixture
def netns() -> Iterator[str]:
    with netns_or_skip("sprefused") as name:
        yield name


def nft(ns: str, *args: str) -> str:
    return ns_exec(ns, "nft", *args)


def listing(ns: str) -> str:
    return nft(ns, "list", "table", "ip", names.TABLE)


def everything(state: NodeState, reason: str = "initial") -> Changes:
    return Changes(frozenset(state.services), full=True, reason=reason)


def three(c_endpoint: str = "10.244.1.30", b_endpoint: str = "10.244.1.21") -> NodeState:
    return node_state(
        state_of(service("a", "10.96.0.1"), endpoint("10.244.1.10")),
        state_of(service("b", "10.96.0.2"), endpoint(b_endpoint)),
        state_of(service("c", "10.96.0.3"), endpoint(c_endpoint)),
    )


class Conflicting:
    """Appends the conflicting element to every transaction that writes service c's:
    the kernel refuses such a transaction whole ("File exists")."""

    def __init__(self, ns: str) -> None:
        self.runner = NftRunner(("ip", "netns", "exec", ns))
        self.prefix = self.runner.prefix  # where the backend's drift check reads
        self.seen: list[str] = []
        self.checks = 0

    def apply(self, text: str) -> None:
        self.seen.append(text)
        self.runner.apply(self._with_conflict(text))

    def check(self, text: str) -> None:
        self.checks += 1
        self.runner.check(self._with_conflict(text))

    @staticmethod
    def _with_conflict(text: str) -> str:
        """The conflicting element goes just before the backend's elements (as if it
        had been in the table already), at the end of the line before them so that
        nft's error locations still match the backend's text."""
        if "10.96.0.3 . tcp . 80 :" not in text:
            return text
        lines = text.split("\n")
        at = next(i for i, line in enumerate(lines)
                  if line.startswith(f"add element ip {names.TABLE} service-ips "))
        lines[at - 1] += f"; add element ip {names.TABLE} service-ips {{ {CONFLICT} }}"
        return "\n".join(lines)


def test_delta_refused_for_one_service_applies_the_others(
        netns: str, caplog: pytest.LogCaptureFixture) -> None:
    b = NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", netns)), families=(4,))
    first = node_state(state_of(service("a", "10.96.0.1"), endpoint("10.244.1.10")),
                       state_of(service("b", "10.96.0.2"), endpoint("10.244.1.20")))
    b.sync(first, everything(first))
    nft(netns, "add", "element", "ip", names.TABLE, "service-ips", f"{{ {CONFLICT} }}")
    # c appears (refused by the kernel) while b moves to another endpoint (applied).
    second = three()
    with caplog.at_level(logging.ERROR, "svcproxy.backend.refused"):
        b.sync(second, Changes(frozenset({key("b"), key("c")})))
    assert list(b.refusals) == [key("c")]
    assert "File exists" in b.refusals[key("c")].error
    assert [r.getMessage().count("ns/c:http/TCP") for r in caplog.records] == [1]
    table = listing(netns)
    assert "10.244.1.21" in table and "10.244.1.20" not in table  # b's change is there
    assert "10.96.0.1 . tcp . 80" in table and "10.244.1.30" not in table  # a as before
    assert "10.96.0.3 . tcp . 80 : drop" in table  # the conflict, untouched

    # Before its retry is due, a sync of c's refused version does not try it again.
    now = [b.refusals.clock()]
    b.refusals.clock = lambda: now[0]
    b.sync(second, Changes(frozenset(), reason="refused"))
    assert list(b.refusals) == [key("c")] and listing(netns) == table
    # Once the conflict is gone, the same version of c is retried after its backoff,
    # without any change, and now accepted.
    nft(netns, "delete", "element", "ip", names.TABLE, "service-ips", "{ 10.96.0.3 . tcp . 80 }")
    now[0] += 1.0
    b.sync(second, Changes(frozenset(), reason="refused"))
    assert not b.refusals and "10.244.1.30" in listing(netns)
    # A new version of c is applied as any change.
    third = three(c_endpoint="10.244.1.31")
    b.sync(third, Changes(frozenset({key("c")})))
    assert not b.refusals
    assert "10.96.0.3 . tcp . 80" in listing(netns) and "10.244.1.31" in listing(netns)


def test_full_sync_refused_for_one_service_applies_the_others(netns: str) -> None:
    runner = Conflicting(netns)
    b = NftBackend(CONFIG, runner, families=(4,))
    state = three()
    b.sync(state, everything(state))
    assert list(b.refusals) == [key("c")]
    assert "File exists" in b.refusals[key("c")].error
    # nft named the element it refused: c was tried without at once, no bisection
    # (checks: the fixed objects alone, the others without c, c again on top of them).
    assert runner.checks == 3
    table = listing(netns)
    assert "10.96.0.1 . tcp . 80" in table and "10.96.0.2 . tcp . 80" in table
    assert "10.96.0.3" not in table and "10.244.1.30" not in table
    # The next resync does not try c again (nor write anything); a change of b is a delta
    # without c.
    applied = len(runner.seen)
    b.sync(state, everything(state, "periodic"))
    assert "10.96.0.3" not in runner.seen[-1] and len(runner.seen) == applied
    changed = three(b_endpoint="10.244.1.22")
    b.sync(changed, Changes(frozenset({key("b")})))
    assert b.last and b.last.mode == "delta" and "10.244.1.22" in listing(netns)


def test_refused_update_keeps_the_version_the_kernel_took(netns: str) -> None:
    runner = Conflicting(netns)
    b = NftBackend(CONFIG, runner, families=(4,))
    old = node_state(state_of(service("c", "10.96.0.9"), endpoint("10.244.1.30")))
    b.sync(old, everything(old))
    # c moves to the ClusterIP the conflict holds: refused, its old rules stay whole,
    # also across a full rewrite of the table.
    new = node_state(state_of(service("c", "10.96.0.3"), endpoint("10.244.1.31")))
    b.sync(new, Changes(frozenset({key("c")})))
    assert list(b.refusals) == [key("c")]
    table = listing(netns)
    assert "10.96.0.9 . tcp . 80" in table and "10.244.1.30" in table
    b.sync(new, everything(new, "periodic"))
    assert listing(netns) == table and list(b.refusals) == [key("c")]
    # A fresh backend (a restart) keeps c out: it has no earlier version to fall back to.
    fresh = NftBackend(CONFIG, runner, families=(4,))
    fresh.sync(new, everything(new))
    assert "10.96.0.9" not in listing(netns) and "10.96.0.3" not in listing(netns)
    assert list(fresh.refusals) == [key("c")]


def test_a_flushed_ruleset_is_the_nodes_fault_not_the_services(netns: str) -> None:
    b = NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", netns)), families=(4,))
    first = three()
    b.sync(first, everything(first))
    nft(netns, "flush", "ruleset")  # someone else's doing: our table is gone
    changed = three(b_endpoint="10.244.1.22")
    with pytest.raises(NftError):
        b.sync(changed, Changes(frozenset({key("b")})))
    assert not b.refusals
    b.sync(changed, everything(changed, "retry"))  # what the agent does next
    assert "10.244.1.22" in listing(netns) and not b.refusals
