"""Notebook 04's figures, drawn from its Result (`fig04.compute`) and its thesis claim rows.

Kept apart from `fig04` (its Params, compute and tables: what the runner and the planner import) and
its claims (`fig04_claims`) so that neither imports matplotlib. Each function returns the figure; the
notebook saves it (`plots.save`) and shows it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
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


# the thesis rows in words (panel b: Δlog p rows; panel c: ratios and shares, each with its reference)
THESIS_WORDS = {
    "pos_shared_cancellation": "A>0 shared: Δ_GRPO − Δ_pos-only",
    "pos_contrast": "A>0: shared − specific (matched)",
    "neg_shared_cancellation": "A<0 shared: Δ_GRPO − Δ_neg-only",
    "neg_contrast": "A<0: shared − specific (matched)",
    "pos_frequency": "A>0 shared: high − low frequency ids",
    "copies_vs_random": "copies mask − random mask (A>0 shared)",
    "permuted_contrast": "A>0 contrast, advantages shuffled",
    "minus_permuted": "A>0 contrast, real − shuffled",
    "mech_fo_cancellation": "first-order opposite-sign terms (A>0 shared)",
}
THESIS_RATIOS = {
    "pos_shared_retained": ("A>0 shared: share of gain kept", 1.0),
    "pos_specific_amplification": ("A>0 specific: amplification", 1.0),
    "neg_shared_retained": ("A<0 shared: share of suppression kept", 1.0),
    "neg_specific_amplification": ("A<0 specific: amplification", 1.0),
    "mech_same_id_share": ("same-id share of opposite-sign coupling", 0.5),
}


def _verdict_legend(fig) -> None:
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], marker="o", ls="", color=VERDICT_COLORS.get(v, plots.PALETTE[5]), label=v)
               for v in ("reproduced", "not reproduced", "inconclusive")]
    handles += [Line2D([], [], marker="o", ls="", color="0.4", label="'shared' = same id"),
                Line2D([], [], marker="s", ls="", mfc="white", color="0.4", label="'shared' = same id in context")]
    fig.legend(handles=handles, frameon=False, fontsize=6.5, loc="lower center", ncol=5, bbox_to_anchor=(0.5, 0.0))


def _rows(ax, TC, names: dict, scale: float = 1.0, refs=None) -> None:
    """One line per row id of `names` (ids definition: filled circle; in context: open square below it),
    the value and its 95% interval in the table's own sign, coloured by verdict."""
    by = {c.claim.replace(C.THESIS_PREFIX, ""): c for c in TC}
    ids = [k for k in names if k in by]
    for y, k in enumerate(ids[::-1]):
        for dy, sfx, mk in ((0.12, "", "o"), (-0.18, "_ctx", "s")):
            c = by.get(k + sfx)
            if c is None:
                continue
            col = VERDICT_COLORS.get(c.verdict, plots.PALETTE[5])
            x = c.measured / scale
            if np.isfinite(c.lo):
                ax.plot([c.lo / scale, c.hi / scale], [y + dy] * 2, color=col, lw=1.1)
            ax.plot([x], [y + dy], marker=mk, ms=3.5, color=col, mfc=col if mk == "o" else "white")
        if refs:
            ax.plot([refs[k]] * 2, [y - 0.4, y + 0.4], color="k", lw=0.6, ls=":")
    if not refs:
        ax.axvline(0, color="k", lw=0.6)
    labels = [names[k][0] if refs else names[k] for k in ids[::-1]]
    ax.set_yticks(range(len(ids)), labels, fontsize=6.5)
    ax.set_ylim(-0.6, len(ids) - 0.4)


def thesis(T: pd.DataFrame, TC: list[C.Claim]):
    """The thesis figure: (a) each class's mean Δlog p under the single-sign step and under GRPO, per
    pool (ids definition); (b) the rows measured in Δlog p, in the table's sign, with 95% intervals
    (batches × groups), coloured by verdict; (c) the ratio rows against their reference (dotted)."""
    plots.setup()
    fig = plt.figure(figsize=(plots.WIDTH_2COL, 5.6))
    gs = fig.add_gridspec(2, 2, width_ratios=[1, 1], height_ratios=[1, 1.35], wspace=0.35, hspace=0.6,
                          left=0.27, right=0.78, bottom=0.13, top=0.93)
    axes = [fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[1, :]), fig.add_subplot(gs[0, 1])]
    ax, k = axes[0], 0
    for pool in ("pos", "neg"):
        d = T[(T.defn == "ids") & (T.pool == pool) & (T.category == "all")].set_index("statistic")
        for j, cls in enumerate(("shared", "specific")):
            if len(d):
                single = d.loc[f"{cls}_single", "value"]
                ax.bar([k, k + 0.4], [single, single + d.loc[f"{cls}_cancellation", "value"]], 0.38,
                       color=plots.PALETTE[j], hatch=["", "//"], label=cls if pool == "pos" else None)
            k += 1
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks([0.2, 1.2, 2.2, 3.2], ["A>0\nshared", "A>0\nspecific", "A<0\nshared", "A<0\nspecific"], fontsize=6)
    ax.set(ylabel="mean Δlog p per token")
    ax.set_title("(a) single-sign step (plain)\nvs GRPO (hatched)", fontsize=8)
    if len(T):
        ax.legend(frameon=False, fontsize=6.5)
    vals = [abs(c.measured) for c in TC if c.claim.replace(C.THESIS_PREFIX, "").replace("_ctx", "") in THESIS_WORDS]
    sc = 10.0 ** np.floor(np.log10(np.nanmax(vals + [1e-300])))
    _rows(axes[1], TC, THESIS_WORDS, sc)
    axes[1].set_xlabel(f"Δlog p (×{sc:.0e}), 95% CI (batches × groups)", fontsize=7)
    axes[1].set_title("(b) thesis rows in Δlog p (the table's sign)")
    _verdict_legend(fig)
    _rows(axes[2], TC, THESIS_RATIOS, refs={k: v[1] for k, v in THESIS_RATIOS.items()})
    axes[2].set_xlabel("ratio (dotted: 1, or 0.5 for the share)", fontsize=7)
    axes[2].set_title("(c) ratio rows, 95% CI")
    axes[2].yaxis.tick_right()
    return fig
