"""bench/packet_path_figures.py: medians, spreads and paired ratios as the packet-path
bench prints them (pure; no figure is asserted)."""

from __future__ import annotations

import pytest

from bench.packet_path_figures import (
    Spread,
    paired_differences,
    paired_ratios,
    percentile,
    rotated,
    spread,
)


def test_spread_is_median_lowest_highest() -> None:
    assert spread([5.0, 1.0, 9.0, 3.0]) == Spread(4.0, 1.0, 9.0)
    assert spread([2.0]).show() == "2 [2, 2]"
    assert Spread(12345.6, -1000.0, 20000.0).show(1) == "12,345.6 [-1,000.0, 20,000.0]"


def test_no_round_is_an_error_not_a_figure() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        spread([])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 100.0
    assert percentile([7.0], 0.99) == 7.0


def test_ratios_pair_each_round_with_the_reference_of_that_round() -> None:
    # nft's rate halves in round 2 (the machine got busy) and so does tc's: paired, tc is
    # 1.8-2.2 times nft, 2.0 in the middle; the ratio of the medians would say 2.2.
    rounds = {"tc": [220.0, 90.0, 300.0], "nft": [100.0, 50.0, 150.0]}
    ratios = paired_ratios(rounds, "nft")
    tc = ratios["tc"]
    assert (tc.median, tc.low, tc.high) == pytest.approx((2.0, 1.8, 2.2))
    assert ratios["nft"] == Spread(1.0, 1.0, 1.0)


def test_ratios_refuse_unpaired_rounds() -> None:
    with pytest.raises(ValueError, match="2 rounds, nft 3"):
        paired_ratios({"tc": [1.0, 2.0], "nft": [1.0, 2.0, 3.0]}, "nft")


def test_differences_take_the_floor_of_the_same_round_out() -> None:
    # Per packet: the floor (routing alone) costs 9-12 us as the machine's load changes;
    # tc adds 1-1.5 us to it, nft 2.5-3.
    rounds = {"routed": [9.0, 12.0, 10.0], "tc": [10.0, 13.5, 11.2],
              "nft": [11.5, 15.0, 13.0]}
    costs = paired_differences(rounds, "routed")
    assert (costs["tc"].median, costs["tc"].low, costs["tc"].high) == pytest.approx(
        (1.2, 1.0, 1.5))
    assert (costs["nft"].median, costs["nft"].low, costs["nft"].high) == pytest.approx(
        (3.0, 2.5, 3.0))
    assert costs["routed"] == Spread(0.0, 0.0, 0.0)


def test_rounds_rotate_who_goes_first() -> None:
    names = ["tc", "xdp", "nft", "iptables"]
    orders = [rotated(names, r) for r in range(4)]
    assert orders[1] == ["xdp", "nft", "iptables", "tc"]
    assert {order[0] for order in orders} == set(names)
    assert all(sorted(order) == sorted(names) for order in orders)
    assert rotated(names, 4) == names
