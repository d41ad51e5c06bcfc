"""Notebook 04's figures, drawn from its Result (`fig04.compute`) and its thesis claim rows.

Kept apart from `fig04` (its Params, compute and tables: what the runner and the planner import) and
its claims (`fig04_claims`) so that neither imports matplotlib. Each function returns the figure; the
notebook saves it (`plots.save`) and shows it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import categories, plots
from .. import claims as C
from .fig04 import LABELS, UPDATES, Result

COLORS = {"positive_only": plots.PALETTE[0], "grpo": plots.PALETTE[1]}
VERDICT_COLORS = {"reproduced": "k", "not reproduced": plots.PALETTE[1]}   # any other verdict: PALETTE[5]


def _bars(ax, R: Result, meas: str, sign: int = 1, alpha: float = 1.0) -> None:
    """Per plotted category, one bar per update: the mean of `meas` over batches with its t interval
    (drawn downwards with sign = −1)."""
    x = np.arange(len(R.cats))
    for k, u in enumerate(UPDATES):
        s = R.summary_table[(R.summary_table["update"] == u) & (R.summary_table.measure == meas)]
        s = s.set_index("category").loc[R.cats]
        ax.bar(x + (k - 0.5) * 0.38, sign * s["mean"], 0.38, yerr=[s["mean"] - s.lo, s.hi - s["mean"]], capsize=2,
               color=COLORS[u], alpha=alpha, label=LABELS[u] if sign > 0 else None, error_kw={"lw": 0.8})
    ax.set_xticks(x, R.cats)


def category_shift(R: Result):
    """Fig. 4: (a) each category's share of boosted mass per update, (b) the paired shift of that share,
    (c) boosted and suppressed mass per batch, (d) the token types whose mean Δlog p differs most."""
    cats, top, x = R.cats, R.top, np.arange(len(R.cats))
    fig, axes = plots.figure(ncols=2, nrows=2, width=plots.WIDTH_2COL, height=4.3)
    ax = axes[0, 0]
    _bars(ax, R, "boosted_share")
    ax.set(ylabel="share of all boosted mass", title="(a) share of boosted mass Σmax(Δ,0)", ylim=(0, 1))
    ax.legend(frameon=False)
    ax = axes[0, 1]
    s = R.shift.set_index("category").loc[cats]
    ax.errorbar(x, s["mean"], yerr=[s["mean"] - s.lo, s.hi - s["mean"]], fmt="o", color="k", capsize=3, ms=4)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(x, cats)
    ax.set(ylabel="share: GRPO − positive-only", title="(b) paired shift of the boosted share (95% CI)")
    ax = axes[1, 0]
    _bars(ax, R, "boosted_mass")
    _bars(ax, R, "suppressed_mass", sign=-1, alpha=0.45)
    ax.axhline(0, color="k", lw=0.6)
    ax.set(ylabel="mass per batch", title="(c) boosted (up) and suppressed (down) mass")
    ax = axes[1, 1]
    scale = 10.0 ** np.floor(np.log10(max(top[["mean_delta_positive_only", "mean_delta_grpo"]].abs().max().max(),
                                          1e-300)))
    y = np.arange(len(top))[::-1]
    ax.barh(y + 0.2, top.mean_delta_positive_only / scale, 0.4, color=COLORS["positive_only"])
    ax.barh(y - 0.2, top.mean_delta_grpo / scale, 0.4, color=COLORS["grpo"])
    ax.set_yticks(y, [f"[{c[0]}] {t}".replace("$", r"\$") for t, c in zip(R.top_labels, top.category)], fontsize=6.5)
    ax.axvline(0, color="k", lw=0.6)
    ax.set(xlabel=f"mean Δlog p per occurrence (×{scale:.0e})",
           title="(d) tokens that differ most ([M]ath [T]emplate [R]easoning)")
    fig.tight_layout()
    return fig


def settings_shift(R: Result):
    """Fig. 4(b) per setting (tagging table, fixed-scaffold control): the paired shift of each
    category's boosted share with its 95% t interval over batches."""
    fig, ax = plots.figure(width=plots.WIDTH_1COL * 1.5, height=2.9)
    shown_cats = [c for c in categories.CATEGORIES if c in set(R.compare.category)]
    for k, name in enumerate(R.settings):
        d = R.compare[R.compare.setting == name].set_index("category").reindex(shown_cats)
        xs = np.arange(len(shown_cats)) + (k - (len(R.settings) - 1) / 2) * 0.22
        ax.errorbar(xs, d["shift"], yerr=[d["shift"] - d.lo, d.hi - d["shift"]], fmt="os^"[k % 3], ms=4, capsize=2,
                    color=plots.PALETTE[k], label=name)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(shown_cats)), shown_cats)
    ax.set(ylabel="boosted share: GRPO − positive-only", title="Fig. 4(b) by tagging and by scaffold (95% CI)")
    ax.legend(frameon=False, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
    fig.tight_layout()
    return fig


def thesis(T: pd.DataFrame, TC: list[C.Claim]):
    """The thesis figure: (a) each class's mean Δlog p under the single-sign step and under GRPO, per
    pool (`thesis.summary`'s raw class means); (b) every thesis claim row's matched contrast with its
    interval, signed so that > 0 is the paper's direction, coloured by verdict."""
    fig, axes = plots.figure(ncols=2, width=plots.WIDTH_2COL, height=2.6, gridspec_kw={"width_ratios": [1, 1.5]})
    ax, k = axes[0], 0
    for pool in ("pos", "neg"):
        d = T[(T.pool == pool) & (T.category == "all") & (T.estimator == "raw")].set_index("statistic")
        for j, cls in enumerate(("shared", "specific")):
            if len(d):
                single = d.loc["net", f"mean_{cls}"] - d.loc["cancellation", f"mean_{cls}"]
                ax.bar([k, k + 0.4], [single, d.loc["net", f"mean_{cls}"]], 0.38, color=plots.PALETTE[j],
                       hatch=["", "//"], label=cls if pool == "pos" else None)
            k += 1
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks([0.2, 1.2, 2.2, 3.2], ["A>0\nshared", "A>0\nspecific", "A<0\nshared", "A<0\nspecific"])
    ax.set(ylabel="mean Δlog p per token", title="(a) single-sign step (plain) vs GRPO (hatched)")
    if len(T):
        ax.legend(frameon=False, fontsize=6.5)
    ax, sc = axes[1], 10.0 ** np.floor(np.log10(np.nanmax([abs(c.measured) for c in TC] + [1e-300])))
    for y, c in enumerate(TC[::-1]):
        x = c.params["sign"] * c.measured / sc
        lo, hi = sorted((c.params["sign"] * c.lo / sc, c.params["sign"] * c.hi / sc))
        ax.errorbar(x, y, xerr=[[x - lo], [hi - x]], fmt="o", ms=3.5, capsize=2,
                    color=VERDICT_COLORS.get(c.verdict, plots.PALETTE[5]))
    ax.axvline(0, color="k", lw=0.6)
    ax.set_yticks(range(len(TC)), [c.claim.replace("fig04_thesis_", "") for c in TC[::-1]], fontsize=6.5)
    ax.set(xlabel=f"matched contrast (×{sc:.0e}), signed: > 0 is the paper's direction",
           title="(b) thesis rows, 95% CI (batches × groups)")
    fig.tight_layout()
    return fig
