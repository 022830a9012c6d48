"""The iptables backend's kernel-facing pieces in memory, for the tests and benches that
check or time the backend without a namespace: restores recorded (an empty kernel), no
sysctls, nfacct objects in a dict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from svcproxy.backends.iptables import backend as backend_module
from svcproxy.backends.iptables.apply import IptablesError


class RecordingIptables:
    """Records restores instead of running iptables; ``fail`` makes the next ones fail."""

    fail = 0
    restored: list[str] = []

    def __init__(self, family: int, mode: str, prefix: tuple[str, ...] = ()) -> None:
        self.family, self.mode, self.prefix = family, mode, prefix

    def restore(self, text: str) -> None:
        if RecordingIptables.fail:
            RecordingIptables.fail -= 1
            raise IptablesError("iptables-nft-restore failed: line 2 failed")
        RecordingIptables.restored.append(text)

    def save_tables(self) -> dict[str, Any]:
        return {}

    def save_stream(self, consume: Any, *tables: str) -> Any:
        """Nothing to read back: the drift check is skipped (with a warning)."""
        raise IptablesError("RecordingIptables holds no rules to save")

    def rules(self) -> None:
        """No netlink reader: the drift check reads these tables through save_stream."""
        return None

    def chain_exists(self, table: str, chain: str) -> bool:
        return True


class NoSysctl:
    def __init__(self, prefix: tuple[str, ...] = ()) -> None:
        self.prefix = prefix

    def get(self, name: str) -> str | None:
        return None

    def set(self, name: str, value: str) -> None:
        pass


class FakeNfacct:
    """nfacct objects in memory."""

    def __init__(self, prefix: tuple[str, ...] = ()) -> None:
        self.counts: dict[str, int] = {}

    def create(self, name: str) -> None:
        self.counts.setdefault(name, 0)

    def packets(self, name: str) -> int:
        if name not in self.counts:
            raise FileNotFoundError(2, "No such file or directory")
        return self.counts[name]


def stand_in(setattr_: Callable[[Any, str, Any], None] = setattr,
             nfacct: type = FakeNfacct) -> None:
    """Put the stand-ins into the backend's module (``monkeypatch.setattr`` in tests) and
    start with no restore recorded and none failing."""
    setattr_(backend_module, "Iptables", RecordingIptables)
    setattr_(backend_module, "Sysctl", NoSysctl)
    setattr_(backend_module, "Nfacct", nfacct)
    RecordingIptables.fail, RecordingIptables.restored = 0, []
