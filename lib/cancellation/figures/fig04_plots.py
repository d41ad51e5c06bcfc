"""Notebook 04's figures, drawn from its Result (`fig04.compute`) and its thesis claim rows.

Kept apart from `fig04` (its Params, compute and tables: what the runner and the planner import) and
its claims (`fig04_claims`) so that neither imports matplotlib. Each function returns the figure; the
notebook saves it (`plots.save`) and shows it.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import ScalarFormatter
import numpy as np

from .. import categories, plots
from .. import claims as C
from .fig04 import LABELS, UPDATES, Params, Result

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


SETTING_WORDS = {"arithmetic_roles": "role table", "category_map": "word / POS table"}


def _setting_label(name: str) -> str:
    """'tiny-m, arithmetic_roles' -> 'tiny-m, role table' (the table's role, not its file name)."""
    for stem, words in SETTING_WORDS.items():
        name = name.replace(stem, words)
    return name


def settings_shift(R: Result, P: Params, profile: str):
    """Fig. 13, Fig. 4's extra panel (not in the paper: the next free number, docs/figures.md): per setting (tagging
    table, fixed-scaffold control), the paired shift of each category's boosted share with its 95% t interval over
    batches; stamped with every policy it plots (P's policy and control, on `profile`)."""
    fig, ax = plots.figure(width=plots.WIDTH_1COL * 1.5, height=2.9)
    shown_cats = [c for c in categories.CATEGORIES if c in set(R.compare.category)]
    for k, name in enumerate(R.settings):
        d = R.compare[R.compare.setting == name].set_index("category").reindex(shown_cats)
        xs = np.arange(len(shown_cats)) + (k - (len(R.settings) - 1) / 2) * 0.22
        ax.errorbar(xs, d["shift"], yerr=[d["shift"] - d.lo, d.hi - d["shift"]], fmt="os^"[k % 3], ms=4, capsize=2,
                    color=plots.PALETTE[k], label=_setting_label(name))
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(shown_cats)), shown_cats)
    ax.set(ylabel="boosted share: GRPO − positive-only",
           title="Fig. 13 (beyond the paper): the shift by tagging table\nand on the fixed-scaffold control (95% CI)")
    ax.legend(frameon=False, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    plots.stamp(fig, plots.models_stamp_text(profile, [P.model_path] + ([P.control_model_path] if P.control_model_path
                                                                        else []), P.device))
    return fig


REAL, NULL = plots.PALETTE[0], "0.6"   # one colour meaning in the thesis figure: the real signs, the shuffled null
DEFN_LABELS = {("ids", 0): "same\nid"} | {("context", k): f"ctx\nk={k}" for k in range(1, 5)} | {("state", 0): "same\nstate"}


def _null_panel(ax, B, T, stat: str, states: str, pools, chosen_k: int, degenerate: dict, log: bool = False,
                ref: float = 0.0) -> None:
    """Per definition (x) and pool (offset, marker): the real statistic (REAL; its 95% bootstrap interval where the
    thesis table has one: ids, the chosen context k, state) against its sign-shuffle null (NULL: the central 95% band
    and the median). Degenerate definitions (specific class under 20%) are marked when the statistic needs it."""
    defs = [d for d in DEFN_LABELS if len(B[(B.defn == d[0]) & (B.k == d[1])])]
    off = {"pos": -0.14, "neg": 0.14} if len(pools) == 2 else {pools[0]: 0.0}
    for x, (defn, k) in enumerate(defs):
        view = "all" if defn == "state" else states
        for pool in pools:
            b = B[(B.defn == defn) & (B.k == k) & (B.pool == pool) & (B.statistic == stat) & (B.states == view)]
            if b.empty:
                continue
            b = b.iloc[0]
            xx = x + off[pool]
            ax.plot([xx, xx], [b.null_lo, b.null_hi], color=NULL, lw=5, solid_capstyle="butt", alpha=0.8)
            ax.plot([xx - 0.07, xx + 0.07], [b.null_median] * 2, color="0.3", lw=1)
            tdef = {"ids": "ids", "state": "state"}.get(defn, "context" if k == chosen_k else None)
            r = None if tdef is None else _get_t(T, tdef, pool, stat, view)
            if r is not None and np.isfinite(r.lo):
                ax.plot([xx, xx], [r.lo, r.hi], color=REAL, lw=1)
            mk = "o" if pool == "pos" else "^"
            ax.plot([xx], [b.real], marker=mk, ms=4, color=REAL, mfc=REAL if not degenerate.get((defn, k)) else "white")
    ax.axhline(ref, color="k", lw=0.6, ls=":")
    labels = [DEFN_LABELS[d] + ("\n(chosen)" if d == ("context", chosen_k) else "") for d in defs]
    ax.set_xticks(range(len(defs)), labels, fontsize=6.5)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=6)


def _get_t(T, defn, pool, stat, states):
    d = T[(T.defn == defn) & (T.pool == pool) & (T.statistic == stat) & (T.category == "all") & (T.states == states)]
    return d.iloc[0] if len(d) else None


def thesis(R: Result, TC: list[C.Claim]):
    """The thesis figure: every real statistic (blue: its value, and its 95% bootstrap interval over batches × groups
    where the table has one) against its sign-shuffle null (grey: the central 95% of K within-group shuffles of every
    batch, and the median), per definition of 'shared' (x; the chosen context k marked). (a) cancellation of shared A>0
    tokens at another state than any copy's (the state definition: at a copy's own state); (b) their retained share;
    (c) the matched contrast shared − specific, A>0 (circle) and A<0 (triangle); (d) the specific class's
    amplification, log axis. Open markers: a definition whose specific class is under 20% of a pool (degenerate)."""
    plots.setup()
    B, T, k = R.thesis_null, R.thesis, R.batches.get("context_k")
    fig, axes = plt.subplots(2, 2, figsize=(plots.WIDTH_2COL, 5.2))
    if B is None or B.empty:
        for ax in axes.flat:
            ax.text(0.5, 0.5, "no null on this profile (null_shuffles = 0)", ha="center", va="center", fontsize=7,
                    transform=ax.transAxes)
        return fig
    sh = R.thesis_shares
    degenerate = {(r.defn, r.k): True for r in sh.groupby(["defn", "k"]).specific_share.min().reset_index().itertuples()
                  if r.specific_share < C.MIN_SPECIFIC}
    _null_panel(axes[0, 0], B, T, "shared_cancellation", "other", ["pos"], k, {})
    axes[0, 0].set(ylabel="mean Δ_GRPO − Δ_positive-only")
    axes[0, 0].set_title("(a) cancellation, shared A>0 tokens at another state\nthan any copy's (same state: at a copy's own)",
                         fontsize=8)
    _null_panel(axes[0, 1], B, T, "shared_retained", "other", ["pos"], k, {}, ref=1.0)
    axes[0, 1].set(ylabel="Σ Δ_GRPO / Σ Δ_positive-only")
    axes[0, 1].set_title("(b) share of the positive-only gain kept\n(the same tokens; dotted: 1)", fontsize=8)
    _null_panel(axes[1, 0], B, T, "contrast", "all", ["pos", "neg"], k, degenerate)
    axes[1, 0].set(ylabel="shared − specific (matched)")
    axes[1, 0].set_title("(c) contrast: A>0 (○, paper: below the null)\nA<0 (△, paper: above)", fontsize=8)
    _null_panel(axes[1, 1], B, T, "specific_amplification", "all", ["pos", "neg"], k, degenerate, log=True, ref=1.0)
    axes[1, 1].set(ylabel="Σ Δ_GRPO / Σ Δ_single (log)")
    axes[1, 1].set_title("(d) amplification of specific tokens\n(paper: above the null)", fontsize=8)
    K = int(B.K.max())
    handles = [Line2D([], [], marker="o", ls="-", color=REAL, lw=1, ms=4, label="real signs (95% CI)"),
               Line2D([], [], color=NULL, lw=5, label=f"null: central 95% of {K} sign shuffles"),
               Line2D([], [], color="0.3", lw=1, label="null median"),
               Line2D([], [], marker="o", ls="", color=REAL, mfc="white", label="degenerate classes (< 20% specific)")]
    fig.legend(handles=handles, frameon=False, fontsize=6.5, loc="lower center", ncol=4, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig
