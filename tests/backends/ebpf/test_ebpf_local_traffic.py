"""The local-traffic detector as the packet path's maps hold it (``local_traffic.py``),
without root: what each --detect-local-mode puts in the maps (as nft reads the node
context for its ``ip saddr`` / ``iifname`` matches), and that every write sequence keeps
what the program sees whole: after each single map operation it reads the old set or the
new one, never a mix. The maps are dicts here; the real ones are exercised by
test_ebpf_packet_path_local_traffic.py."""

from __future__ import annotations

import pytest

from svcproxy.backends.ebpf import local_traffic
from svcproxy.backends.ebpf.local_traffic import CFG_KEY, LocalSet, LocalTrafficMaps, local_set
from svcproxy.backends.ebpf.packet_layout import (
    LOCAL_BY_DEVICE,
    LOCAL_BY_SOURCE,
    LOCAL_CFG,
    LOCAL_DEV_KEY,
    LOCAL_NONE,
    pack_local_cidr,
    unpack_local_cidr,
)
from svcproxy.sdk import LocalTraffic

DEVICES = ((1, "lo"), (2, "eth0"), (7, "cali1a"), (8, "cali2b"), (9, "cbr0"), (10, "cbr0x"))


def both(local: LocalTraffic) -> dict[int, LocalTraffic]:
    return {4: local, 6: local}


def test_each_mode_as_the_maps_hold_it() -> None:
    cluster = {4: LocalTraffic("ClusterCIDR", ("10.244.0.0/16",)), 6: LocalTraffic("ClusterCIDR")}
    assert local_set(cluster, DEVICES) == LocalSet((LOCAL_BY_SOURCE, LOCAL_NONE),
                                                   frozenset({"10.244.0.0/16"}))
    node = {4: LocalTraffic("NodeCIDR", ("10.244.1.0/24",)),
            6: LocalTraffic("NodeCIDR", ("fd00:244:0:1::/64",))}
    assert local_set(node, DEVICES).cidrs == {"10.244.1.0/24", "fd00:244:0:1::/64"}
    prefix = both(LocalTraffic("InterfaceNamePrefix", interface="cali"))
    assert local_set(prefix, DEVICES) == LocalSet((LOCAL_BY_DEVICE, LOCAL_BY_DEVICE),
                                                  devices=frozenset({7, 8}))
    bridge = both(LocalTraffic("BridgeInterface", interface="cbr0"))
    assert local_set(bridge, DEVICES).devices == {9}, "the bridge's name, not a prefix"


@pytest.mark.parametrize("local", [
    LocalTraffic("ClusterCIDR"),  # no --cluster-cidr: kube-proxy leaves the rule out
    LocalTraffic("NodeCIDR", ("10.244.1.0/33", "nonsense")),  # only well-formed CIDRs
    LocalTraffic("InterfaceNamePrefix"),  # no --pod-interface-name-prefix
    LocalTraffic("BridgeInterface"),
], ids=["no-cidr", "bad-cidrs", "no-prefix", "no-bridge"])
def test_no_detector_is_none(local: LocalTraffic) -> None:
    assert local_set(both(local), DEVICES) == LocalSet()


class DictMap:
    """A map as a dict, each operation reported to ``seen`` after it is done."""

    def __init__(self, name: str, log: list[str], seen: object) -> None:
        self.name, self.data, self.log, self.seen = name, {}, log, seen

    def update(self, key: bytes, value: bytes) -> None:
        self.data[key] = value
        self.log.append(f"update {self.name}")
        self.seen()  # type: ignore[operator]

    def delete(self, key: bytes) -> bool:
        self.log.append(f"delete {self.name}")
        found = self.data.pop(key, None) is not None
        self.seen()  # type: ignore[operator]
        return found

    def lookup(self, key: bytes) -> bytes | None:
        return self.data.get(key)


class Kernel:
    """The three maps and what the program sees in them after each operation."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.views: list[LocalSet] = []
        self.cfg, self.cidrs, self.devices = (DictMap(n, self.log, self.look)
                                              for n in ("cfg", "cidrs", "devices"))

    def visible(self) -> LocalSet:
        """The set a packet would be judged by now (the generation spp_local names)."""
        raw = self.cfg.data.get(CFG_KEY)
        if raw is None:
            return LocalSet()
        gen, mode4, mode6 = LOCAL_CFG.unpack(raw)
        cidrs = {c for g, c in map(unpack_local_cidr, self.cidrs.data) if g == gen}
        devices = {i for g, i in map(LOCAL_DEV_KEY.unpack, self.devices.data) if g == gen}
        return LocalSet((mode4, mode6), frozenset(cidrs), frozenset(devices))

    def look(self) -> None:
        self.views.append(self.visible())

    def maps(self) -> LocalTrafficMaps:
        return LocalTrafficMaps(self.cfg, self.cidrs, self.devices)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def dict_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_traffic, "list_keys", lambda m: list(m.data))


SETTINGS = [
    {4: LocalTraffic("ClusterCIDR", ("10.244.0.0/16", "10.250.0.0/16")),
     6: LocalTraffic("ClusterCIDR", ("fd00:244::/48",))},
    {4: LocalTraffic("NodeCIDR", ("10.244.1.0/24",)), 6: LocalTraffic("NodeCIDR")},
    both(LocalTraffic("InterfaceNamePrefix", interface="cali")),
    both(LocalTraffic("BridgeInterface", interface="cbr0")),
    both(LocalTraffic("ClusterCIDR")),
    {4: LocalTraffic("ClusterCIDR", ("10.244.0.0/16", "10.250.0.0/16")),
     6: LocalTraffic("ClusterCIDR", ("fd00:244::/48",))},
]


def test_every_switch_shows_the_old_set_or_the_new_one_whole() -> None:
    """Through every change of settings, each single operation leaves the program the
    whole old set or the whole new one; old generations leave no key behind."""
    kernel = Kernel()
    maps = kernel.maps()
    before = LocalSet()
    for settings in SETTINGS:
        kernel.views.clear()
        maps.set_context(settings)
        maps.write(DEVICES)
        want = local_set(settings, DEVICES)
        assert kernel.visible() == want
        assert set(kernel.views) <= {before, want}, (settings, kernel.views)
        assert len(kernel.cidrs.data) == len(want.cidrs)
        assert len(kernel.devices.data) == len(want.devices)
        before = want


def test_a_device_that_comes_or_goes_is_one_element_of_the_generation() -> None:
    kernel = Kernel()
    maps = kernel.maps()
    maps.set_context(both(LocalTraffic("InterfaceNamePrefix", interface="cali")))
    maps.write(DEVICES)
    gen = maps.gen
    kernel.log.clear()
    maps.write((*DEVICES, (12, "cali3c")))
    assert kernel.log == ["update devices"] and maps.gen == gen
    maps.write(DEVICES[:3])
    assert kernel.log == ["update devices", "delete devices", "delete devices"]
    assert kernel.visible().devices == {7} and maps.gen == gen


def test_a_restart_adopts_what_is_wanted_and_drops_an_interrupted_switch() -> None:
    kernel = Kernel()
    first = kernel.maps()
    first.set_context(SETTINGS[0])
    first.write(DEVICES)
    kernel.cidrs.data[pack_local_cidr(first.gen + 1, "10.99.0.0/16")] = b"\x01"  # a crash
    kernel.log.clear()
    second = kernel.maps()
    second.set_context(SETTINGS[0])
    second.write(DEVICES)
    assert kernel.log == ["delete cidrs"], "only the interrupted switch's key goes"
    assert second.gen == first.gen and kernel.visible() == local_set(SETTINGS[0], DEVICES)
