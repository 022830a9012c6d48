"""Line plots as hand-written SVG (no matplotlib here), for the benches' ``--svg``: each
plot a title, an x and a y axis (linear or log, ticks chosen or given), series drawn as
one polyline each (solid or dashed) with a legend on the right; several plots stack
into one picture, one under the other."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

WIDTH, HEIGHT = 760, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 40, 50
DASH = "5,4"


@dataclass(frozen=True, slots=True)
class Series:
    """One line: ``points`` (x, y) in x order, its ``label`` in the legend unless
    ``legend`` is off (a second line of a series already there, as a p90 beside a p50)."""

    label: str
    points: tuple[tuple[float, float], ...]
    color: str = "black"
    dashed: bool = False
    legend: bool = True


@dataclass(frozen=True, slots=True)
class Axis:
    """An axis: its ``label``, log or linear, its ``ticks`` (none: 1-2-5 steps chosen to
    fit the values), ``unit`` written after each tick's number."""

    label: str = ""
    log: bool = False
    ticks: tuple[float, ...] = ()
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Plot:
    """One plot; ``marks``: x values drawn as a dashed vertical line (a warm-up's end)."""

    title: str
    x: Axis
    y: Axis
    series: tuple[Series, ...]
    marks: tuple[float, ...] = ()


def number(value: float) -> str:
    """A tick's number: whole numbers with thousands separated, others as short as
    they go."""
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


def extent(values: Sequence[float], axis: Axis, pad: bool) -> tuple[float, float]:
    """The span an axis shows: from the lowest to the highest value (its ticks too);
    ``pad``ded, a log axis has a fifth more room each way and a linear one starts at 0
    and has 15% more on top."""
    lo, hi = min([*values, *axis.ticks]), max([*values, *axis.ticks])
    if axis.log:
        if lo <= 0:
            raise ValueError(f"a log axis ({axis.label or 'y'}) needs values above 0: {lo}")
        lo, hi = (lo * 0.8, hi * 1.2) if pad else (lo, hi)
    elif pad:
        lo, hi = min(lo, 0.0), hi * 1.15 if hi > 0 else hi
    return (lo, hi) if hi > lo else (lo - 1, hi + 1)


def ticks(lo: float, hi: float, axis: Axis) -> list[float]:
    """The axis' given ticks, else 1-2-5 steps: each of 1, 2, 5 x 10^k within the span on
    a log axis; on a linear one the multiples of the largest such step that the span
    holds four times."""
    if axis.ticks:
        return list(axis.ticks)
    if axis.log:
        first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [t * 10.0**e for e in range(first, last + 1) for t in (1, 2, 5)
                if lo <= t * 10.0**e <= hi]
    span, e = hi - lo, math.floor(math.log10(hi - lo))
    step = next(m * 10.0**k for k in range(e, e - 2, -1) for m in (5, 2, 1)
                if span / (m * 10.0**k) >= 4)
    return [round(k * step, 10) for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def scale(lo: float, hi: float, log: bool, start: float,
          end: float) -> Callable[[float], float]:
    """Value -> pixel, ``lo`` at ``start`` and ``hi`` at ``end``."""
    f = math.log10 if log else float
    a, b = f(lo), f(hi)
    return lambda v: start + (f(v) - a) / (b - a) * (end - start)


def render_plot(plot: Plot, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    """One plot's SVG elements, in a ``width`` x ``height`` box at the origin."""
    xs = [x for s in plot.series for x, _ in s.points] + list(plot.marks)
    ys = [y for s in plot.series for _, y in s.points]
    if not xs or not ys:
        raise ValueError(f"nothing to plot in {plot.title!r}")
    (x0, x1), (y0, y1) = extent(xs, plot.x, pad=False), extent(ys, plot.y, pad=True)
    x = scale(x0, x1, plot.x.log, LEFT, width - RIGHT)
    y = scale(y0, y1, plot.y.log, height - BOTTOM, TOP)
    out = [f'<text x="{LEFT}" y="22" font-size="14">{escape(plot.title)}</text>']
    for v in ticks(y0, y1, plot.y):
        out.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f'{escape(number(v) + plot.y.unit)}</text>')
    for v in ticks(x0, x1, plot.x):
        out.append(f'<text x="{x(v):.1f}" y="{height - BOTTOM + 18}" text-anchor="middle">'
                   f'{escape(number(v) + plot.x.unit)}</text>')
    if plot.x.label:
        out.append(f'<text x="{(LEFT + width - RIGHT) / 2}" y="{height - 12}" '
                   f'text-anchor="middle">{escape(plot.x.label)}</text>')
    if plot.y.label:
        out.append(f'<text transform="translate(16,{(TOP + height - BOTTOM) / 2}) '
                   f'rotate(-90)" text-anchor="middle">{escape(plot.y.label)}</text>')
    for v in plot.marks:
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{TOP}" y2="{height - BOTTOM}" '
                   'stroke="#999" stroke-dasharray="4,4"/>')
    for series in plot.series:
        dash = f' stroke-dasharray="{DASH}"' if series.dashed else ""
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in series.points)
        out.append(f'<polyline points="{pts}" fill="none" stroke={quoteattr(series.color)} '
                   f'stroke-width="2"{dash}><title>{escape(series.label)}</title></polyline>')
    for row, series in enumerate(s for s in plot.series if s.legend):
        ly = TOP + 20 + row * 20
        dash = f' stroke-dasharray="{DASH}"' if series.dashed else ""
        out.append(f'<line x1="{width - RIGHT + 15}" x2="{width - RIGHT + 40}" y1="{ly}" '
                   f'y2="{ly}" stroke={quoteattr(series.color)} stroke-width="2"{dash}/>')
        out.append(f'<text x="{width - RIGHT + 46}" y="{ly + 4}">{escape(series.label)}</text>')
    return out


def render(plots: Sequence[Plot], width: int = WIDTH, height: int = HEIGHT) -> str:
    """``plots`` one under the other, each ``width`` x ``height``, as an SVG document."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height * len(plots)}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height * len(plots)}" fill="white"/>']
    for i, plot in enumerate(plots):
        parts.append(f'<g transform="translate(0,{i * height})">')
        parts.extend(render_plot(plot, width, height))
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write(path: Path, plots: Sequence[Plot]) -> None:
    """``render(plots)`` written to ``path``."""
    path.write_text(render(plots))
