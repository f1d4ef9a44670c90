"""Return and length histograms of a dataset or view, written as an image with matplotlib's Agg canvas.

The figure is drawn on its own ``FigureCanvasAgg``: no pyplot, no global
backend switch, so calling this from a notebook or a GUI program changes
nothing there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..read.collection import EpisodeCollection


def episode_histograms(
    collection: EpisodeCollection, out: str | os.PathLike, bins: int = 30
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Write return and length histograms of ``collection`` to ``out`` (format from the suffix, e.g. png).

    Returns ``{"return": (counts, edges), "length": (counts, edges)}`` as drawn.
    Episodes without a scalar return (no single scalar reward field) are left
    out of the return histogram.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    snap = collection.snapshot()
    pos = collection.positions
    returns = np.asarray(snap.index["return"][pos], dtype=np.float64)
    returns = returns[np.isfinite(returns)]
    lengths = snap.lengths[pos]
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_ret, ax_len = fig.subplots(1, 2)
    drawn: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for ax, name, values in ((ax_ret, "return", returns), (ax_len, "length", lengths)):
        counts, edges = np.histogram(values, bins=bins) if len(values) else (np.zeros(0), np.zeros(0))
        drawn[name] = (counts, edges)
        if len(values):
            ax.stairs(counts, edges, fill=True)
            ax.set_title(
                f"episode {name}: n={len(values)}, mean={values.mean():.3g}, min={values.min():.3g}, "
                f"max={values.max():.3g}",
                fontsize=9,
            )
        else:
            ax.set_title(f"episode {name}: no values", fontsize=9)
        ax.set_xlabel(name)
        ax.set_ylabel("episodes")
    fig.savefig(os.fspath(out), dpi=100)
    return drawn
