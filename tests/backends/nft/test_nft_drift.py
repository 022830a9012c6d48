"""Drift repaired (issue 27): the nft backend under the node agent's sync runner puts back
what someone else changed in its tables within one sync period, and a chain a foreign
rule keeps from being deleted does not hold back the rest of a change.

Real kernel, a namespace per test, the runner in a thread with a test-sized
``sync_period``; every wait is for the runner's syncs (bounded), never a fixed sleep; a
test holds ``paused`` (no sync runs) while it breaks something and sees it broken.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from svcproxy.backends.nft import names
from svcproxy.backends.nft.apply import NftRunner
from svcproxy.backends.nft.backend import NftBackend
from svcproxy.model import ServiceType, SessionAffinity
from svcproxy.sdk import Changes, NodeState
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.backends.nft.test_nft_kernel import kernel_content
from tests.support.lab.netns import ns_exec
from tests.support.netns.harness import netns_or_skip
from tests.support.nft_fixtures import CONFIG, endpoint, key, node_state, service, state_of

pytestmark = pytest.mark.netns
PERIOD = 0.3  # seconds: the test's sync period
WAIT = 30.0  # at most this for the syncs waited for (a loaded machine)


@pytest.fixture
def netns() -> Iterator[str]:
    with netns_or_skip("spdrift") as name:
        yield name


def nft(ns: str, *args: str) -> str:
    return ns_exec(ns, "nft", *args)


class Watched(NftBackend):
    """The nft backend, counting the syncs it finished by reason."""

    def __init__(self, ns: str) -> None:
        super().__init__(CONFIG, NftRunner(("ip", "netns", "exec", ns)), families=(4,))
        self.done: dict[str, int] = {}
        self.changed = threading.Condition()
        self.paused = threading.Lock()  # held by a test: no sync runs meanwhile
        # Run once right after the next sync's write, before anything can check it.
        self.after_sync: Callable[[], None] | None = None

    def sync(self, state: NodeState, changes: Changes) -> None:
        try:
            with self.paused:
                super().sync(state, changes)
                hook, self.after_sync = self.after_sync, None
                if hook is not None:
                    hook()
        finally:
            with self.changed:
                for reason in (changes.reason, "any"):
                    self.done[reason] = self.done.get(reason, 0) + 1
                self.changed.notify_all()

    def count(self, reason: str) -> int:
        with self.changed:
            return self.done.get(reason, 0)

    def wait(self, reason: str, more: int, until: Callable[[], bool] = lambda: True,
             since: int | None = None) -> None:
        """Until ``more`` syncs of ``reason`` finished since there were ``since`` (default:
        now) and ``until()`` holds after one of them (checked after each; at most
        ``WAIT`` seconds)."""
        deadline = time.monotonic() + WAIT
        target = (self.count(reason) if since is None else since) + more
        while True:
            with self.changed:
                ok = self.changed.wait_for(lambda n=target: self.done.get(reason, 0) >= n,
                                           max(0.0, deadline - time.monotonic()))
            assert ok, f"no {reason} sync made it true within {WAIT}s"
            if until():
                return
            target += 1


@dataclass
class Agent:
    source: FakeSource
    backend: Watched
    runner: SyncRunner

    def push(self, state: NodeState, *changed: str) -> None:
        self.source.push(state, {key(name) for name in changed})


@pytest.fixture
def agent(netns: str) -> Iterator[Callable[[NodeState], Agent]]:
    started: list[tuple[SyncRunner, threading.Thread, Watched]] = []

    def start(state: NodeState, after_sync: Callable[[], None] | None = None) -> Agent:
        source, backend = FakeSource(), Watched(netns)
        backend.after_sync = after_sync
        backend.refusals.retry_first, backend.refusals.retry_max = 0.05, 0.2
        runner = SyncRunner(source, backend, health=ProxyHealth(timeout=10), poll=0.02,
                            sync_period=PERIOD, min_sync_period=0.0)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        started.append((runner, thread, backend))
        source.push(state)
        backend.wait("initial", 1, since=0)
        return Agent(source, backend, runner)

    yield start
    for runner, thread, backend in started:
        runner.stop()
        thread.join(timeout=10)
        backend.reader.close()


def services() -> NodeState:
    """A ClusterIP service, a NodePort one, and one with session affinity."""
    web = state_of(service("web", "10.96.0.1"), endpoint("10.244.1.10"), endpoint("10.244.1.11"))
    nodeport = state_of(service("np", "10.96.0.2", type=ServiceType.NODE_PORT, node_port=30080),
                        endpoint("10.244.1.20"), endpoint("10.244.1.21"))
    sticky = state_of(service("sticky", "10.96.0.3", session_affinity=SessionAffinity.CLIENT_IP),
                      endpoint("10.244.1.30"), endpoint("10.244.1.31"))
    return node_state(web, nodeport, sticky)


def chain_of(ns: str, prefix: str, name: str) -> str:
    """The name of our chain ``prefix-<hash>-ns/<name>/...`` in the kernel."""
    listing = nft(ns, "list", "chains", "ip")
    pattern = re.compile(rf"{prefix}-[A-Z2-7]{{8}}-ns/{name}/\S+")
    found = [w for w in listing.split() if pattern.fullmatch(w)]
    assert len(found) == 1, listing
    return found[0]


def first_handle(ns: str, chain: str) -> str:
    listing = nft(ns, "-a", "list", "chain", "ip", names.TABLE, chain)
    return next(line.rsplit("# handle ", 1)[1] for line in listing.splitlines()
                if "# handle " in line and "chain " not in line)


def restored(ns: str, expected: dict[object, object]) -> Callable[[], bool]:
    return lambda: kernel_content(ns) == expected


def test_a_deleted_dispatch_element_is_back_within_one_period(
        netns: str, agent: Callable[[NodeState], Agent]) -> None:
    a = agent(services())
    full = kernel_content(netns)
    with a.backend.paused:
        nft(netns, "delete", "element", "ip", names.TABLE, "service-ips",
            "{ 10.96.0.1 . tcp . 80 }")
        assert kernel_content(netns) != full
    a.backend.wait("periodic", 1)  # the first resync that began after the change
    assert restored(netns, full)()
    assert a.backend.last and a.backend.last.mode == "repair" and a.backend.last.services == 1


def test_a_deleted_rule_and_a_deleted_chain_are_back_within_one_period(
        netns: str, agent: Callable[[NodeState], Agent]) -> None:
    a = agent(services())
    full = kernel_content(netns)
    external = chain_of(netns, "external", "np")
    sticky = chain_of(netns, "service", "sticky")
    endpoint_chain = next(w for w in nft(netns, "list", "chains", "ip").split()
                          if w.startswith("endpoint-") and "10.244.1.30" in w)
    with a.backend.paused:
        nft(netns, "delete", "rule", "ip", names.TABLE, external, "handle",
            first_handle(netns, external))
        # A chain: the sticky service's chain is emptied, so its endpoint chain can go.
        nft(netns, "flush", "chain", "ip", names.TABLE, sticky)
        nft(netns, "delete", "chain", "ip", names.TABLE, endpoint_chain)
        assert kernel_content(netns) != full
    a.backend.wait("periodic", 1)  # the first resync that began after the change
    assert restored(netns, full)()


def test_a_rule_changed_right_after_a_write_is_back_within_one_period(
        netns: str, agent: Callable[..., Agent]) -> None:
    """What the kernel held right after the write is the reference (read back then), not
    what the first check finds: a rule replaced (same count) before any check, after the
    initial sync's rebuild and after a delta writing the chain again, is still drift."""
    expected: list[object] = []

    def replace_last_rule() -> None:  # the NodePort's external chain: its last rule
        expected.append(kernel_content(netns))
        external = chain_of(netns, "external", "np")
        listing = nft(netns, "-a", "list", "chain", "ip", names.TABLE, external)
        handle = [line.rsplit("# handle ", 1)[1] for line in listing.splitlines()
                  if "# handle " in line and "chain " not in line][-1]
        nft(netns, "replace", "rule", "ip", names.TABLE, external, "handle", handle, "counter")
        assert kernel_content(netns) != expected[-1]

    state = services()
    a = agent(state, after_sync=replace_last_rule)
    assert expected
    a.backend.wait("periodic", 1, since=0)  # the first check after the initial sync
    assert restored(netns, expected[0])()
    np = state.services[key("np")]
    more = replace(state, revision=2, services={**state.services, np.key: state_of(
        np.service, endpoint("10.244.1.20"), endpoint("10.244.1.21"), endpoint("10.244.1.22"))})
    with a.backend.paused:
        a.backend.after_sync = replace_last_rule
        synced = a.backend.count("any")
        a.push(more, "np")
    a.backend.wait("any", 1, lambda: len(expected) == 2, since=synced)
    checks = a.backend.count("periodic")
    a.backend.wait("periodic", 1, since=checks)  # the first check after that delta
    assert restored(netns, expected[1])()


def test_a_deleted_table_and_a_foreign_element_are_repaired(
        netns: str, agent: Callable[[NodeState], Agent]) -> None:
    """What every service port relies on (the table; a map holding an element nobody
    applied) is the skeleton's drift: the tables are rewritten from the applied values."""
    a = agent(services())
    full = kernel_content(netns)
    with a.backend.paused:
        nft(netns, "add", "element", "ip", names.TABLE, "service-ips",
            "{ 10.96.0.99 . tcp . 80 : drop }")
        assert kernel_content(netns) != full
    a.backend.wait("periodic", 1)  # the first resync that began after the change
    assert restored(netns, full)()
    with a.backend.paused:
        nft(netns, "delete", "table", "ip", names.TABLE)
        assert kernel_content(netns) != full
    a.backend.wait("periodic", 1)  # the first resync that began after the change
    assert restored(netns, full)()
    assert a.backend.last and a.backend.last.mode == "replace"


def test_an_endpoint_removal_lands_although_a_foreign_rule_jumps_to_its_chain(
        netns: str, agent: Callable[[NodeState], Agent], caplog: pytest.LogCaptureFixture,
) -> None:
    """A foreign chain in our table jumping to the endpoint chain of a removed endpoint:
    the kernel will not delete that chain (EBUSY). The removal still takes effect (the
    service's chain no longer picks the endpoint), the chain is left with the culprit
    logged, and once the foreign chain is gone it is deleted without any edit."""
    state = services()
    a = agent(state)
    doomed = next(w for w in nft(netns, "list", "chains", "ip").split()
                  if w.startswith("endpoint-") and "10.244.1.31" in w)
    with a.backend.paused:  # a resync would see the foreign chain before its rule
        nft(netns, "add", "chain", "ip", names.TABLE, "foreign")
        nft(netns, "add", "rule", "ip", names.TABLE, "foreign", "jump", doomed)
    sticky = state.services[key("sticky")]
    fewer = replace(state, revision=2, services={
        **state.services, sticky.key: state_of(sticky.service, endpoint("10.244.1.30"))})
    sticky_chain = chain_of(netns, "service", "sticky")

    def service_chain() -> str:
        return nft(netns, "list", "chain", "ip", names.TABLE, sticky_chain)

    with caplog.at_level(logging.WARNING):
        synced = a.backend.count("any")  # a resync may take the change as well
        a.push(fewer, "sticky")
        a.backend.wait("any", 1, lambda: "10.244.1.31" not in service_chain(), since=synced)
    assert "10.244.1.30" in service_chain()
    assert doomed in nft(netns, "list", "chains", "ip")  # left in place
    assert any("chain foreign (rule handle" in r.getMessage() and doomed in r.getMessage()
               for r in caplog.records)
    assert key("sticky") in a.backend.refusals
    nft(netns, "delete", "chain", "ip", names.TABLE, "foreign")
    a.backend.wait("any", 1, lambda: doomed not in nft(netns, "list", "chains", "ip"))
    assert key("sticky") not in a.backend.refusals
    with netns_or_skip("spdriftb") as other:
        fresh = NftBackend(CONFIG, NftRunner(("ip", "netns", "exec", other)), families=(4,))
        fresh.sync(fewer, Changes(frozenset(fewer.services), full=True, reason="initial"))
        assert kernel_content(netns) == kernel_content(other)


def test_a_check_with_nothing_committed_reads_only_the_generation(
        netns: str, agent: Callable[[NodeState], Agent]) -> None:
    """Nothing committed to nftables since the kernel was last seen holding what was
    applied: the check reads the ruleset's generation, not the table; anyone's commit
    (here another table) makes the next check read it again."""
    a = agent(services())
    reads: list[str] = []
    read = a.backend.reader.read

    def counted(family: str, table: str, *args: object, **kwargs: object) -> object:
        reads.append(f"{family} {table}")
        return read(family, table, *args, **kwargs)  # type: ignore[arg-type]

    a.backend.reader.read = counted  # type: ignore[method-assign]
    a.backend.wait("periodic", 1)  # seen holding all of it
    with a.backend.paused:
        reads.clear()
    a.backend.wait("periodic", 2)
    assert reads == []
    with a.backend.paused:
        nft(netns, "add", "table", "ip", "someone-else")
    a.backend.wait("periodic", 1, lambda: reads == [f"ip {names.TABLE}"])
