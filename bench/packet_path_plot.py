"""bench_packet_path.py's saved run and its picture (pure but for reading and writing the
file): each size's per-round figures per dataplane as JSON (``--json``), and from them
CPU per packet and connect()'s p50 per dataplane over the service counts (``--svg``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.svgplot import Axis, Plot, Series

# size -> dataplane -> figure key (FIGURES' in bench_packet_path.py) -> one value a round
Results = Mapping[int, Mapping[str, Mapping[str, Sequence[float]]]]

LABELS = {"tc": "bpf (tc)", "xdp": "bpf (XDP generic)", "nft": "nft", "iptables": "iptables",
          "routed": "routed (floor)"}
COLORS = {"tc": "#1b7837", "xdp": "#7fbf7b", "nft": "#2166ac", "iptables": "#b2182b",
          "routed": "#777777"}
FLOOR = "routed"
# (figure key, title, log y)
PANELS = (("pkt_cpu", "CPU us per packet (the client's thread), median of the rounds", False),
          ("p50", "connect() p50 us (SYN out to SYN/ACK in), median of the rounds, log scale",
           True))


def save(path: Path, results: Results, about: Mapping[str, Any]) -> None:
    """``results`` and what the run was (``about``: machine, command) written to ``path``,
    a line per size and dataplane."""
    sizes = ",\n".join(
        f' "{size}": {{\n' + ",\n".join(f"  {json.dumps(name)}: {json.dumps(row)}"
                                         for name, row in rows.items()) + "\n }"
        for size, rows in sorted(results.items()))
    path.write_text(f'{{"about": {json.dumps(dict(about))},\n"results": {{\n{sizes}\n}}}}\n')


def load(path: Path) -> dict[int, dict[str, dict[str, list[float]]]]:
    """The results a run saved with ``save``."""
    raw = json.loads(path.read_text())
    return {int(size): rows for size, rows in raw["results"].items()}


def plots(results: Results) -> list[Plot]:
    """One plot per panel: a line per dataplane (named as in ``LABELS``; the floor dashed)
    through the median of its rounds at each size, x the services on a log axis."""
    sizes = tuple(sorted(results))
    names = list(dict.fromkeys(n for size in sizes for n in results[size]))
    out = []
    for key, title, log in PANELS:
        series = tuple(
            Series(LABELS.get(name, name),
                   tuple((size, statistics.median(results[size][name][key]))
                         for size in sizes if name in results[size]),
                   COLORS.get(name, "black"), dashed=name == FLOOR)
            for name in names)
        out.append(Plot(title, Axis("services", log=True, ticks=sizes), Axis(log=log), series))
    return out
