"""bench/svgplot.py, the benches' one SVG plotter, and the pictures drawn with it: the
document parses as XML, holds a polyline per series, its labels and ticks, and puts
larger values higher; the packet-path figure in the docs is what its JSON draws."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench import packet_path_plot
from bench.svgplot import Axis, Plot, Series, extent, render, ticks

ROOT = Path(__file__).resolve().parents[2]
NS = {"svg": "http://www.w3.org/2000/svg"}
DOC_JSON, DOC_SVG = ROOT / "docs/ebpf-packet-path.json", ROOT / "docs/ebpf-packet-path.svg"


def parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{{{NS['svg']}}}text")]


def polylines(root: ET.Element) -> list[ET.Element]:
    return root.findall(".//svg:polyline", NS)


def points(line: ET.Element) -> list[tuple[float, float]]:
    return [(float(a), float(b)) for a, b in
            (p.split(",") for p in line.attrib["points"].split())]


def two_plots() -> list[Plot]:
    log = Plot("latency <p50 & p90>", Axis("services", log=True, ticks=(100, 1000, 10000)),
               Axis(log=True),
               (Series("ebpf", ((100, 50.0), (1000, 52.0), (10000, 55.0)), "#1b7837"),
                Series("ebpf p90", ((100, 70.0), (1000, 71.0), (10000, 75.0)), "#1b7837",
                       dashed=True, legend=False),
                Series("iptables", ((100, 60.0), (1000, 300.0), (10000, 3000.0)), "#b2182b")))
    linear = Plot("memory", Axis("minutes"), Axis(unit=" MB"),
                  (Series("RSS", ((0, 80.0), (30, 95.0), (60, 101.0))),), marks=(10,))
    return [log, linear]


def test_one_polyline_per_series_with_its_labels_and_ticks() -> None:
    root = parsed(render(two_plots()))
    assert root.tag == f"{{{NS['svg']}}}svg" and root.attrib["height"] == "840"
    lines = polylines(root)
    assert [line.find("svg:title", NS).text for line in lines] == [  # type: ignore[union-attr]
        "ebpf", "ebpf p90", "iptables", "RSS"]
    assert [len(points(line)) for line in lines] == [3, 3, 3, 3]
    assert [line.get("stroke-dasharray") is not None for line in lines] == [
        False, True, False, False]
    shown = texts(root)
    for label in ("latency <p50 & p90>", "memory", "services", "minutes", "ebpf", "iptables",
                  "RSS", "1,000", "10,000", "20 MB", "60"):
        assert label in shown, (label, shown)
    assert "ebpf p90" not in shown, "a series out of the legend is not named there"
    assert len(root.findall("svg:g", NS)) == 2, "one group per plot, stacked"


def test_larger_values_are_higher_and_a_log_axis_keeps_ratios() -> None:
    log = polylines(parsed(render(two_plots()[:1])))
    ebpf, iptables = points(log[0]), points(log[2])
    assert [x for x, _ in ebpf] == sorted(x for x, _ in ebpf)
    assert iptables[2][1] < iptables[1][1] < iptables[0][1], "growing: going up"
    (x0, _), (x1, _), (x2, _) = ebpf
    assert x1 - x0 == pytest.approx(x2 - x1, abs=0.2), "100 -> 1,000 as wide as -> 10,000"
    step1, step2 = iptables[0][1] - iptables[1][1], iptables[1][1] - iptables[2][1]
    assert step1 < step2, "x5 then x10: the second step is the taller on a log axis"


def test_ticks_are_given_or_one_two_five_steps() -> None:
    assert ticks(0, 18.7, Axis()) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert ticks(0, 115, Axis()) == [0, 20, 40, 60, 80, 100]
    assert ticks(80, 30000, Axis(log=True)) == [100, 200, 500, 1000, 2000, 5000, 10000,
                                                20000]
    assert ticks(100, 30000, Axis(log=True, ticks=(100, 10000, 30000))) == [100, 10000, 30000]
    assert extent([10.0, 16.0], Axis(), pad=True) == (0.0, pytest.approx(18.4))


def test_a_log_axis_refuses_values_it_cannot_place() -> None:
    with pytest.raises(ValueError, match="above 0"):
        render([Plot("t", Axis(), Axis(log=True), (Series("s", ((1, 0.0), (2, 1.0))),))])
    with pytest.raises(ValueError, match="nothing to plot"):
        render([Plot("empty", Axis(), Axis(), ())])


def test_a_saved_run_loads_back_and_draws_a_line_per_dataplane(tmp_path: Path) -> None:
    results = {100: {"tc": {"pkt_cpu": [10.0, 11.0, 12.0], "p50": [130.0, 140.0, 150.0]},
                     "nft": {"pkt_cpu": [12.0], "p50": [160.0]}},
               30000: {"tc": {"pkt_cpu": [14.0], "p50": [200.0]},
                       "nft": {"pkt_cpu": [16.0], "p50": [210.0]}}}
    saved = tmp_path / "run.json"
    packet_path_plot.save(saved, results, {"machine": "test"})
    assert packet_path_plot.load(saved) == results
    cpu, p50 = packet_path_plot.plots(results)
    assert [s.label for s in cpu.series] == ["bpf (tc)", "nft"]
    assert cpu.series[0].points == ((100, 11.0), (30000, 14.0)), "the median of the rounds"
    assert p50.y.log and not cpu.y.log


def test_the_docs_figure_is_what_its_json_draws(tmp_path: Path) -> None:
    """docs/ebpf-packet-path.svg redrawn by the bench's --plot-only from the JSON beside
    it: the same picture, two panels of five dataplanes each."""
    out = tmp_path / "pp.svg"
    done = subprocess.run([sys.executable, str(ROOT / "bench/bench_packet_path.py"),
                           "--plot-only", str(DOC_JSON), "--svg", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == DOC_SVG.read_text()
    lines = polylines(parsed(out.read_text()))
    assert len(lines) == 10
    refused = subprocess.run([sys.executable, str(ROOT / "bench/bench_packet_path.py"),
                              "--plot-only", str(DOC_JSON)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--svg FILE" in refused.stderr


def test_the_benches_draw_with_it() -> None:
    from bench.bench_ebpf import latency_plot
    from bench.bench_soak import memory_plot

    latency = latency_plot({"ebpf": {100: [50.0, 60.0], 1000: [52.0, 61.0]},
                            "iptables": {100: [60.0], 1000: [300.0]}})
    assert [(s.label, s.dashed, s.legend) for s in latency.series] == [
        ("ebpf", False, True), ("ebpf", True, False),
        ("iptables", False, True), ("iptables", True, False)]
    memory = memory_plot([{"t": 0.0, "rss": 2**20, "traced": 2**19},
                          {"t": 120.0, "rss": 2**21, "traced": 2**19}], 1.0, "soak")
    assert memory.marks == (1.0,)
    assert memory.series[0].points == ((0.0, 1.0), (2.0, 2.0))
    assert len(polylines(parsed(render([latency, memory])))) == 6
