"""Line charts drawn as inline SVG: the report page needs no script and no network.

One function, `line_chart`: series of (x, y) points on shared linear axes with ticks, a
legend and a title. Enough for percentiles per step and resources over time.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 560, 300
LEFT, RIGHT, TOP, BOTTOM = 60, 140, 30, 40
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * step:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 2)]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.2e}"


def line_chart(
    title: str, x_label: str, y_label: str, series: dict[str, list[tuple[float, float]]]
) -> str:
    points = [p for values in series.values() for p in values]
    if not points:
        return f"<p>{escape(title)}: no data</p>"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks, y_ticks = _ticks(min(xs), max(xs)), _ticks(min(0.0, min(ys)), max(ys))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return TOP + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#999"/>',
    ]
    for x in x_ticks:
        out.append(
            f'<text x="{sx(x):.1f}" y="{TOP + plot_h + 14}" text-anchor="middle">{_label(x)}</text>'
        )
    for y in y_ticks:
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            'stroke="#eee"/>'
        )
        out.append(f'<text x="{LEFT - 4}" y="{sy(y) + 4:.1f}" text-anchor="end">{_label(y)}</text>')
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text transform="translate(12,{TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values))
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for x, y in values:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>')
        ly = TOP + 12 + 16 * i
        out.append(
            f'<rect x="{LEFT + plot_w + 10}" y="{ly - 8}" width="10" height="10" fill="{colour}"/>'
        )
        out.append(f'<text x="{LEFT + plot_w + 24}" y="{ly + 1}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)
