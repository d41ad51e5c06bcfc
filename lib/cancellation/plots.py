"""One figure style for every notebook; figures saved as PDF + PNG, byte-stable across reruns.

A notebook calls `use_profile(profile, P)` once after building its Params: from then on every figure
`save` writes carries a small grey stamp in its top-right corner naming the profile, the policy's
size and the device ("tiny profile: 1.06M-parameter policy (tiny-m), CPU"), so a PNG seen on its own
says what it was made on. Categorical panels and heatmaps go through seaborn with our own intervals
(`bars`: seaborn draws the bars, never its own bootstrap; `heatmap`).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np  # inline in notebooks; headless scripts fall back to Agg by themselves
from .cache import atomic_write  # a temporary name, then rename: never a half-written figure
from .plan import ConfigError, shape_of

# Okabe–Ito colour-blind-safe palette.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
STATUS_COLORS = {"boosted": "#009E73", "suppressed": "#D55E00", "stable": "#999999"}
SIGN_COLORS = {"pos": "#0072B2", "neg": "#D55E00", "all": "#000000"}
SIGN_LABELS = {"pos": "positive rollouts (A > 0)", "neg": "negative rollouts (A < 0)", "all": "all rollouts"}
WIDTH_1COL, WIDTH_2COL = 3.25, 6.75  # inches
STAMP_GID = "profile-stamp"
_state: dict = {"stamp": None}   # set by use_profile: the text `save` stamps on every figure


def size_text(n: int) -> str:
    """1064832 -> '1.06M', 1.7e9 -> '1.70B'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.{2 if n < 100 * div else 0}f}{unit}"
    return str(n)


def stamp_text(profile: str, P=None) -> str:
    """'<profile> profile: <size>-parameter policy (<name>), <device>' from the notebook's Params
    (`model_path`, `device`); the parts it cannot tell are left out."""
    parts = []
    model = getattr(P, "model_path", None)
    if model:
        try:   # the planner's closed form of its config.json (a local dir, the HF cache, a paper model by name)
            shape = shape_of(str(model))
        except ConfigError:
            shape = None
        n = shape.params if shape is not None else None
        name = Path(str(model)).name or str(model)
        parts.append(f"{size_text(n)}-parameter policy ({name})" if n else f"policy {model}")
    device = getattr(P, "device", None)
    if device:
        parts.append("CPU" if str(device) == "cpu" else "GPU" if str(device).startswith("cuda") else str(device))
    return f"{profile} profile" + (": " + ", ".join(parts) if parts else "")


def models_stamp_text(profile: str, models, device=None) -> str:
    """The stamp of a figure that plots several policies (Fig. 9): '<profile> profile: policies tiny-m (1.06M
    parameters), tiny-s (0.2M), <device>', each named with its size where the planner can tell it."""
    names = []
    for i, model in enumerate(models):
        try:
            n = shape_of(str(model)).params
        except ConfigError:
            n = None
        name = Path(str(model)).name or str(model)
        names.append(f"{name} ({size_text(n)}{' parameters' if i == 0 else ''})" if n else name)
    parts = [("policies " if len(names) > 1 else "policy ") + ", ".join(names)] if names else []
    if device:
        parts.append("CPU" if str(device) == "cpu" else "GPU" if str(device).startswith("cuda") else str(device))
    return f"{profile} profile" + (": " + ", ".join(parts) if parts else "")


def use_profile(profile: str, P=None) -> str:
    """Stamp every figure `save` writes from now on with `stamp_text(profile, P)`; returns the text."""
    _state["stamp"] = stamp_text(profile, P)
    return _state["stamp"]


def stamp(fig, text: str | None = None):
    """Put `text` (default: the profile's, from use_profile) in small grey type above the figure's top-right
    corner, outside every panel; once per figure."""
    text = text or _state["stamp"]
    if not text or any(t.get_gid() == STAMP_GID for t in fig.texts):
        return
    fig.text(0.995, 1.0, text, ha="right", va="bottom", fontsize=5, color="0.5", family="sans-serif", gid=STAMP_GID)


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


def save(fig_dir: str | Path, name: str, fig) -> list[Path]:
    """Write `name`.pdf and `name`.png under fig_dir (where, then the name, then what: the order of
    `claims.record(results_dir, notebook, rows)`, `R.write(results_dir, P)` and `figNN.load(results_dir, P)`) with fixed metadata (byte-stable reruns), stamped with
    the profile (use_profile)."""
    stamp(fig)
    out = Path(fig_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.pdf", out / f"{name}.png"]
    atomic_write(paths[0], lambda t: fig.savefig(t, format="pdf", metadata={"CreationDate": None, "ModDate": None,
                                                                             "Producer": None, "Creator": None}))
    atomic_write(paths[1], lambda t: fig.savefig(t, format="png", metadata={"Software": None}))
    return paths


def interval_err(mean, lo, hi):
    """matplotlib's yerr (two rows, distances below and above) from a mean and its interval's ends."""
    mean, lo, hi = (np.asarray(x, dtype=float) for x in (mean, lo, hi))
    return np.vstack([mean - lo, hi - mean])


def bars(ax, data, x: str, y: str, hue: str | None = None, lo: str | None = None, hi: str | None = None,
         palette=None, order=None, hue_order=None, **kw):
    """A seaborn bar plot of the values in `data` as they are (errorbar=None: no seaborn bootstrap), with our
    own intervals [lo, hi] drawn on each bar when given."""
    import seaborn as sns
    sns.barplot(data=data, x=x, y=y, hue=hue, ax=ax, errorbar=None, palette=palette, order=order,
                hue_order=hue_order, **{"saturation": 1, **kw})   # our palette's colours as they are
    if lo is None:
        return ax
    order = order or list(dict.fromkeys(data[x]))
    hues = (hue_order or list(dict.fromkeys(data[hue]))) if hue else [None]
    for container, h in zip(ax.containers, hues):   # one container per hue level, in hue_order
        rows = data[data[hue] == h] if hue else data
        rows = rows.set_index(x).reindex(order)
        # seaborn draws no bar where a level has no row or a NaN value: a bar's category is the nearest
        # whole x to its centre (the dodge offsets stay within ±0.4)
        xs = [b.get_x() + b.get_width() / 2 for b in container]
        rows = rows.iloc[[int(round(c)) for c in xs]]
        ax.errorbar(xs, rows[y], yerr=interval_err(rows[y], rows[lo], rows[hi]), fmt="none", ecolor="k", lw=0.6,
                    capsize=1.5)
    return ax


def heatmap(ax, values, norm=None, cmap="viridis", cbar_label: str | None = None, **kw):
    """A seaborn heatmap of a 2-D array, row 0 at the bottom (origin lower), no grid."""
    import seaborn as sns
    values = np.asarray(values)
    sns.heatmap(values, ax=ax, norm=norm, cmap=cmap, cbar_kws={"label": cbar_label} if cbar_label else None, **kw)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelrotation=0)
    ax.grid(False)
    return ax
