"""One figure style for every notebook; figures saved as PDF + PNG, byte-stable across reruns."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt  # inline in notebooks; headless scripts fall back to Agg by themselves
from .cache import atomic_write  # a temporary name, then rename: never a half-written figure

# Okabe–Ito colour-blind-safe palette.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
STATUS_COLORS = {"boosted": "#009E73", "suppressed": "#D55E00", "stable": "#999999"}
SIGN_COLORS = {"pos": "#0072B2", "neg": "#D55E00", "all": "#000000"}
SIGN_LABELS = {"pos": "positive rollouts (A > 0)", "neg": "negative rollouts (A < 0)", "all": "all rollouts"}
WIDTH_1COL, WIDTH_2COL = 3.25, 6.75  # inches


def setup():
    """Apply the house style (serif, small fonts, light grid)."""
    plt.rcParams.update({
        "font.family": "serif", "font.size": 8, "axes.titlesize": 8.5, "axes.labelsize": 8,
        "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "axes.grid": True,
        "grid.alpha": 0.3, "grid.linewidth": 0.5, "axes.spines.top": False, "axes.spines.right": False,
        "axes.prop_cycle": matplotlib.cycler(color=PALETTE), "figure.dpi": 150, "savefig.dpi": 200,
        "savefig.bbox": "tight", "pdf.fonttype": 42, "svg.hashsalt": "cancellation",
    })


def figure(ncols: int = 1, nrows: int = 1, width: float = WIDTH_2COL, height: float | None = None, **kw):
    setup()
    height = height or 2.2 * nrows
    return plt.subplots(nrows, ncols, figsize=(width, height), **kw)


def save(fig, name: str, fig_dir: str | Path) -> list[Path]:
    """Write `name`.pdf and `name`.png under fig_dir with fixed metadata (byte-stable reruns)."""
    out = Path(fig_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.pdf", out / f"{name}.png"]
    atomic_write(paths[0], lambda t: fig.savefig(t, format="pdf", metadata={"CreationDate": None, "ModDate": None,
                                                                             "Producer": None, "Creator": None}))
    atomic_write(paths[1], lambda t: fig.savefig(t, format="png", metadata={"Software": None}))
    return paths
