"""Matplotlib set up once for every report (headless, text kept as text) and figures as inline SVG."""

from __future__ import annotations

import io
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# An incomplete run's empty plots warn about empty legends: noise after the one line that matters.
warnings.filterwarnings("ignore", message="No artists with labels found to put in legend")
plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})


def svg(fig) -> str:
    """The figure as an <svg> element (no XML prologue), closed; without a date, so rebuilds are
    byte-identical."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]
