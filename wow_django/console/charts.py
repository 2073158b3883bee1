"""Small server-side SVG charts for the console's dashboard (no script, no CDN)."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

#: One colour per bus status (and a default), readable on light and dark admin themes.
COLOURS = {"PENDING": "#9e9e9e", "SENT": "#4f8fd6", "CONSUMED": "#3c9a5f", "PARTIAL": "#e0a030",
           "FAILED": "#c8443c", "RETRYING": "#8a63c9"}
DEFAULT_COLOUR = "#4f8fd6"
TEXT_STYLE = "<style>text{fill:currentColor}</style>"  # labels follow the admin theme (light or dark)


def stacked_bars(buckets: list[tuple[str, dict[str, int]]], series: list[str], *, title: str,
                 width: int = 720, height: int = 240) -> SafeString:
    """Vertical bars, one per ``(label, {series: count})`` bucket, stacked in ``series`` order, with a legend."""
    top = max([sum(counts.values()) for _, counts in buckets] + [1])
    left, bottom, legend = 40, 40, 110
    plot_w, plot_h = width - left - legend, height - bottom - 20
    step = plot_w / max(len(buckets), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="wow-chart"><title>{escape(title)}</title>{TEXT_STYLE}',
             f'<text x="{left - 6}" y="24" text-anchor="end" font-size="10">{top}</text>',
             f'<line x1="{left}" y1="20" x2="{left}" y2="{20 + plot_h}" stroke="currentColor" stroke-width=".5"/>',
             f'<line x1="{left}" y1="{20 + plot_h}" x2="{left + plot_w}" y2="{20 + plot_h}" stroke="currentColor" '
             'stroke-width=".5"/>']
    for index, (label, counts) in enumerate(buckets):
        x = left + index * step + step * 0.15
        y: float = 20 + plot_h  # each series' bar goes up from the last one's top
        for name in series:
            count = counts.get(name, 0)
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" height="{h:.1f}" '
                         f'fill="{COLOURS.get(name, DEFAULT_COLOUR)}"><title>{escape(label)}: {count} '
                         f'{escape(name)}</title></rect>')
        parts.append(f'<text x="{left + index * step + step / 2:.1f}" y="{height - bottom + 34}" font-size="10" '
                     f'text-anchor="middle">{escape(label)}</text>')
    for index, name in enumerate(series):
        y = 24 + index * 16
        parts.append(f'<rect x="{width - legend + 10}" y="{y - 9}" width="10" height="10" '
                     f'fill="{COLOURS.get(name, DEFAULT_COLOUR)}"/><text x="{width - legend + 26}" y="{y}" '
                     f'font-size="11">{escape(name)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))


def horizontal_bars(rows: list[tuple[str, float]], *, title: str, unit: str = "", width: int = 720,
                    colour: str = DEFAULT_COLOUR) -> SafeString:
    """One horizontal bar per ``(label, value)``; an empty list draws "nothing to show"."""
    row_h, label_w = 22, 220
    height = max(len(rows), 1) * row_h + 10
    top = max([value for _, value in rows] + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="wow-chart"><title>{escape(title)}</title>{TEXT_STYLE}']
    if not rows:
        parts.append('<text x="4" y="18" font-size="12">nothing to show</text>')
    for index, (label, value) in enumerate(rows):
        y = 5 + index * row_h
        w = (width - label_w - 80) * value / top
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" font-size="11">{escape(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" fill="{colour}"/>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y + 14}" font-size="11">{value:g}{escape(unit)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
