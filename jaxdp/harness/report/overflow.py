"""A figure's readability, checked: `overflow(fig)` lists text cut off the canvas and legends drawn over
the data or the title (tests/jaxdp/harness/report/test_recommend.py holds every compare figure to an empty list)."""
from __future__ import annotations

import matplotlib.legend
import matplotlib.text


def overflow(fig) -> list[str]:
    """What a reader would miss: texts and legends not wholly on the canvas, and legends drawn over an axes'
    data area. Empty for every figure of the report."""
    fig.draw_without_rendering()  # the constrained layout is made at draw time
    renderer = fig.canvas.get_renderer()
    canvas, out = fig.bbox, []
    ticks = {id(t) for a in fig.axes for axis in (a.xaxis, a.yaxis) for which in ("major", "minor")
             for t in axis.get_ticklabels(which=which)}  # laid out by matplotlib, some outside the view
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_visible() and t.get_text().strip() and id(t) not in ticks:
            b = t.get_window_extent(renderer)
            if b.x0 < canvas.x0 - 1 or b.y0 < canvas.y0 - 1 or b.x1 > canvas.x1 + 1 or b.y1 > canvas.y1 + 1:
                out.append(f"cut off: {t.get_text()!r}")
    titles = [t for t in (fig._suptitle, fig._supxlabel) if t is not None]
    for leg in fig.findobj(matplotlib.legend.Legend):
        b = leg.get_window_extent(renderer)
        if any(b.overlaps(a.get_window_extent(renderer)) for a in fig.axes if a.axison):
            out.append("legend over the data: " + ", ".join(t.get_text() for t in leg.get_texts()))
        if any(b.overlaps(t.get_window_extent(renderer)) for t in titles):
            out.append("legend over the title: " + ", ".join(t.get_text() for t in leg.get_texts()))
    return out
