"""Drift repaired (issue 27): the iptables backend under the node agent's sync runner puts
back, within one sync period, a rule or a chain someone else changed, and real
connections to the service work again.

The lab of test_iptables_netns (a node, a client, two pods; real packets); the runner in
a thread with a test-sized ``sync_period``; every wait is for the runner's syncs
(bounded), never a fixed sleep; a test holds ``paused`` (no sync runs) while it breaks
something and sees it broken. (The iptables backend uses no ipset, as kube-proxy's
iptables mode: there is no ipset member to delete.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator

import pytest

from svcproxy.backends.iptables.backend import IptablesBackend, IptablesOptions
from svcproxy.backends.iptables.nftrules import NftRules, TableRules
from svcproxy.sdk import Changes, Drift, NodeState, ServicePortKey, netlink
from svcproxy.sdk.health import ProxyHealth
from svcproxy.sdk.runner import SyncRunner
from svcproxy.sdk.testing import FakeSource
from tests.backends.iptables.test_iptables_netns import (
    Lab,
    _needs_root,
    config,
    node_state,
    service,
)
from tests.support.lab.netns import ns_exec

pytestmark = pytest.mark.netns
PERIOD = 0.5  # seconds: the test's sync period
WAIT = 60.0  # at most this for the syncs waited for (iptables-nft on a loaded machine)
VIP = "172.30.0.10"


class Watched(IptablesBackend):
    """The iptables backend (IPv4), counting the syncs it finished by reason."""

    def __init__(self, lab: ModeLab, mode: str) -> None:
        super().__init__(config(), IptablesOptions(prefix=lab.prefix(), families=(4,),
                                                   mode=mode))
        self.done: dict[str, int] = {}
        self.changed = threading.Condition()
        self.paused = threading.Lock()  # held by a test: no sync runs meanwhile
        self.full_syncs = 0  # syncs that rewrote everything
        # Run once right after the next sync's write, before anything can check it.
        self.after_sync: Callable[[Watched], None] | None = None

    def sync(self, state: NodeState, changes: Changes) -> None:
        try:
            with self.paused:
                super().sync(state, changes)
                self.full_syncs += bool(self.last_sync_full)
                hook, self.after_sync = self.after_sync, None
                if hook is not None:
                    hook(self)
        finally:
            with self.changed:
                self.done[changes.reason] = self.done.get(changes.reason, 0) + 1
                self.changed.notify_all()

    def wait(self, reason: str, more: int, until: Callable[[], bool] = lambda: True,
             since: int | None = None) -> None:
        """Until ``more`` syncs of ``reason`` finished since there were ``since`` (default:
        now) and ``until()`` holds after one of them (checked after each; at most
        ``WAIT`` seconds)."""
        deadline = time.monotonic() + WAIT
        with self.changed:
            target = (self.done.get(reason, 0) if since is None else since) + more
        while True:
            with self.changed:
                ok = self.changed.wait_for(lambda n=target: self.done.get(reason, 0) >= n,
                                           max(0.0, deadline - time.monotonic()))
            assert ok, f"no {reason} sync made it true within {WAIT}s"
            if until():
                return
            target += 1


@pytest.fixture(params=["nft", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    """iptables-nft (read back over netlink) and iptables-legacy (with iptables-save)."""
    return str(request.param)


class ModeLab(Lab):
    """The lab, with the iptables mode its node's rules are read and changed in."""

    mode = "nft"


@pytest.fixture
def lab(mode: str) -> Iterator[ModeLab]:
    _needs_root()
    built = ModeLab().build()
    built.mode = mode
    try:
        yield built
    finally:
        built.destroy()


@pytest.fixture
def agent(lab: ModeLab, mode: str) -> Iterator[Callable[[NodeState], Watched]]:
    started: list[tuple[SyncRunner, threading.Thread]] = []

    def start(state: NodeState, after_sync: Callable[[Watched], None] | None = None
              ) -> Watched:
        source, backend = FakeSource(), Watched(lab, mode)
        backend.after_sync = after_sync
        runner = SyncRunner(source, backend, health=ProxyHealth(timeout=10), poll=0.02,
                            sync_period=PERIOD, min_sync_period=0.0)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        started.append((runner, thread))
        source.push(state)
        backend.wait("initial", 1, since=0)
        return backend

    yield start
    for runner, thread in started:
        runner.stop()
        thread.join(timeout=30)


def iptables(lab: ModeLab, *args: str) -> str:
    return ns_exec(lab.node, f"iptables-{lab.mode}", *args)


def saved(lab: ModeLab) -> str:
    return lab.iptables_save(4, lab.mode)


def nat_chain(lab: ModeLab, prefix: str) -> str:
    """The one chain of ours named ``prefix``-*."""
    found = [line.split()[0][1:] for line in saved(lab).splitlines()
             if line.startswith(f":{prefix}-")]
    assert len(found) == 1, found
    return found[0]


def ours(lab: ModeLab) -> list[str]:
    """Our rules (KUBE-*), as saved."""
    return sorted(line for line in saved(lab).splitlines()
                  if "KUBE-" in line and not line.startswith("#"))


def answers(lab: ModeLab) -> list[str]:
    return lab.connect(lab.client, VIP, 80)


def test_a_deleted_rule_and_a_flushed_chain_are_back_within_one_period(
        lab: ModeLab, agent: Callable[[NodeState], Watched]) -> None:
    state = node_state(service("web", VIP, ("pod-a",), node_port=30080))
    backend = agent(state)
    before = ours(lab)
    assert answers(lab) == ["pod-a 10.244.1.1"]
    sep = nat_chain(lab, "KUBE-SEP")
    rules = [line for line in saved(lab).splitlines() if line.startswith(f"-A {sep} ")]
    dnat = next(i for i, line in enumerate(rules, 1) if "DNAT" in line)
    with backend.paused:
        iptables(lab, "-t", "nat", "-D", sep, str(dnat))
        iptables(lab, "-t", "nat", "-F", nat_chain(lab, "KUBE-SVC"))
        assert ours(lab) != before and answers(lab) == ["timeout"]
        full_syncs = backend.full_syncs
    backend.wait("periodic", 1)  # the first resync that began after the change
    assert ours(lab) == before and answers(lab) == ["pod-a 10.244.1.1"]
    assert backend.full_syncs == full_syncs  # only that service port's chains were written


def test_a_rule_changed_right_after_the_write_is_back_within_one_period(
        lab: ModeLab, agent: Callable[..., Watched]) -> None:
    """What the kernel held right after the write is the reference (read back then),
    not what the first check finds: a rule replaced (same count) before any check is
    still drift."""
    changed: list[str] = []

    def replace_dnat(_: Watched) -> None:  # the endpoint's DNAT rule, to another port
        sep = nat_chain(lab, "KUBE-SEP")
        rules = [line for line in saved(lab).splitlines()
                 if line.startswith(f"-A {sep} ")]
        index, rule = next((i, r) for i, r in enumerate(rules, 1) if "DNAT" in r)
        spec = rule.split(" ", 2)[2].rsplit(":", 1)[0] + ":9"
        iptables(lab, "-t", "nat", "-R", sep, str(index), *spec.split())
        changed.append(rule)
        assert rule not in ours(lab) and answers(lab) != ["pod-a 10.244.1.1"]

    state = node_state(service("web", VIP, ("pod-a",)))
    backend = agent(state, after_sync=replace_dnat)
    assert changed
    backend.wait("periodic", 1, since=0)  # the first check after the initial sync
    assert changed[0] in ours(lab) and answers(lab) == ["pod-a 10.244.1.1"]


def test_a_flushed_top_level_chain_and_a_deleted_jump_are_back_within_one_period(
        lab: ModeLab, agent: Callable[[NodeState], Watched]) -> None:
    """The canary chains stay, so only the drift check notices."""
    state = node_state(service("web", VIP, ("pod-a",)))
    backend = agent(state)
    before = ours(lab)
    with backend.paused:
        iptables(lab, "-t", "nat", "-F", "KUBE-SERVICES")
        assert answers(lab) == ["timeout"]
    backend.wait("periodic", 1)  # the first resync that began after the change
    assert ours(lab) == before and answers(lab) == ["pod-a 10.244.1.1"]
    rules = [line for line in saved(lab).splitlines()
             if line.startswith("-A PREROUTING ")]
    jump = next(i for i, line in enumerate(rules, 1) if "KUBE-SERVICES" in line)
    with backend.paused:
        iptables(lab, "-t", "nat", "-D", "PREROUTING", str(jump))
        assert answers(lab) != ["pod-a 10.244.1.1"]
    backend.wait("periodic", 1)  # the first resync that began after the change
    assert ours(lab) == before and answers(lab) == ["pod-a 10.244.1.1"]


@pytest.mark.parametrize("buffer", [None, 8192], ids=["events", "overflowed"])
def test_a_check_reads_only_the_chains_someone_else_changed(
        lab: ModeLab, agent: Callable[..., Watched], buffer: int | None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """iptables-nft: after someone else commits, the check reads only the chains the
    kernel's change events name (none for a table not ours), and still repairs them;
    the first check after the initial sync reads none, also when that sync's own events
    overflowed the socket (``overflowed``: an 8 KiB buffer), as nobody else committed."""
    if lab.mode != "nft":
        pytest.skip("the change events are nftables' (iptables-nft)")
    if buffer is not None:
        monkeypatch.setattr(NftRules, "events", lambda self: netlink.NftablesEvents(
            self._path, rcvbuf=buffer))
    reads: list[str] = []  # the chains the checks read (not the repairs' read-backs)
    checking = threading.local()

    def watch(backend: Watched) -> None:  # right after the initial sync, before any check
        kernel = backend._kernel
        assert kernel is not None
        chains, find_drift = kernel.chains, backend.find_drift

        def counted(family: int, table: str, wanted: Collection[str],
                    builtin: Collection[str] = ()) -> TableRules:
            if getattr(checking, "on", False):
                reads.extend(f"{table} {c}" for c in (*wanted, *builtin))
            return chains(family, table, wanted, builtin)

        def check(state: NodeState) -> Drift[ServicePortKey]:
            checking.on = True
            try:
                return find_drift(state)
            finally:
                checking.on = False

        kernel.chains = counted  # type: ignore[method-assign]
        backend.find_drift = check  # type: ignore[method-assign]

    backend = agent(node_state(service("web", VIP, ("pod-a",), node_port=30080)),
                    after_sync=watch)
    backend.wait("periodic", 1, since=0)
    assert reads == []  # the first check after the initial sync
    sep = nat_chain(lab, "KUBE-SEP")
    with backend.paused:
        ns_exec(lab.node, "nft", "add", "table", "ip", "someone-else")
        reads.clear()
    backend.wait("periodic", 1)
    assert reads == []
    rules = [line for line in saved(lab).splitlines() if line.startswith(f"-A {sep} ")]
    dnat = next(i for i, line in enumerate(rules, 1) if "DNAT" in line)
    with backend.paused:
        iptables(lab, "-t", "nat", "-D", sep, str(dnat))
        assert answers(lab) == ["timeout"]
        reads.clear()
    backend.wait("periodic", 1, lambda: f"nat {sep}" in reads)
    assert set(reads) == {f"nat {sep}"}
    assert answers(lab) == ["pod-a 10.244.1.1"]


def test_a_legacy_check_runs_iptables_save_only_when_a_table_changed(
        lab: ModeLab, agent: Callable[..., Watched]) -> None:
    """iptables-legacy: a check compares the tables' blobs (counters aside) with those
    read after our writes; only a changed table is read with iptables-save: checks
    with nothing changed, or only traffic, run none; a foreign rule runs it once (no
    drift, then none again); a deleted DNAT rule is found and repaired."""
    if lab.mode != "legacy":
        pytest.skip("the blobs are iptables-legacy's tables")
    saves: list[tuple[str, ...]] = []  # the tables the checks saved (not the read-backs)

    def watch(backend: Watched) -> None:  # right after the initial sync, before any check
        find_drift = backend.find_drift
        for fam in backend._families.values():
            save_stream = fam.tool.save_stream

            def counted(consume: Callable[..., object], *tables: str,
                        save: Callable[..., object] = save_stream) -> object:
                if getattr(checking, "on", False):
                    saves.append(tables)
                return save(consume, *tables)

            fam.tool.save_stream = counted  # type: ignore[method-assign,assignment]

        def check(state: NodeState) -> Drift[ServicePortKey]:
            checking.on = True
            try:
                return find_drift(state)
            finally:
                checking.on = False

        backend.find_drift = check  # type: ignore[method-assign]

    checking = threading.local()
    backend = agent(node_state(service("web", VIP, ("pod-a",), node_port=30080)),
                    after_sync=watch)
    backend.wait("periodic", 2, since=0)
    assert answers(lab) == ["pod-a 10.244.1.1"]  # traffic: the counters change
    backend.wait("periodic", 1)
    assert saves == []
    with backend.paused:
        iptables(lab, "-t", "filter", "-A", "INPUT", "-p", "udp", "--dport", "9", "-j", "ACCEPT")
    backend.wait("periodic", 1)
    assert saves and all(t in (("nat",), ("filter",)) for t in saves)
    saves.clear()
    backend.wait("periodic", 1)
    assert saves == []
    sep = nat_chain(lab, "KUBE-SEP")
    rules = [line for line in saved(lab).splitlines() if line.startswith(f"-A {sep} ")]
    dnat = next(i for i, line in enumerate(rules, 1) if "DNAT" in line)
    with backend.paused:
        iptables(lab, "-t", "nat", "-D", sep, str(dnat))
        assert answers(lab) == ["timeout"]
    backend.wait("periodic", 1)
    assert answers(lab) == ["pod-a 10.244.1.1"]
