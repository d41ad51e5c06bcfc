"""Notebook 06's figures and printed numbers, read off a `fig06.Result`: Fig. 6 (a, b) against the sampling
budget, Fig. 7(b) against the reward composition, and the gaps and trends in words (the computation and
tables live in `fig06.py`)."""
from __future__ import annotations

import numpy as np

from .. import plots
from .fig06 import Params, Result, resolved

SUB_STYLE = {"all": ("all valued tokens", plots.PALETTE[0]), "top50": ("top-50% |Δ̂|", plots.PALETTE[2]),
             "top25": ("top-25% |Δ̂|", plots.PALETTE[1])}


def _fmt(g, lo, hi) -> str:
    return f"{g:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def sampling_budget(R: Result, P: Params):
    """Fig. 6: the gap per setting of (a) prompts per update and (b) rollouts per prompt, per token subset and
    within sign, with the seed-resampled 95% intervals."""
    pg = R.gaps[R.gaps.scope == "valued"]
    ws = R.gaps[R.gaps.scope == "within_sign"]
    fig, axes = plots.figure(ncols=2, width=plots.WIDTH_2COL, height=2.3)
    for ax, panel, xlabel, fixed in ((axes[0], "prompts", "prompts per update", f"n = {P.n_fixed} rollouts each"),
                                     (axes[1], "rollouts", "rollouts per prompt n", f"{P.prompts_fixed} prompts")):
        for j, name in enumerate(R.subsets):
            d = pg[(pg.panel == panel) & (pg.subset == name)]
            label, c = SUB_STYLE.get(name, (name, plots.PALETTE[3 + j]))
            off = 2 ** ((j - 1) * 0.04)  # small horizontal offsets keep the error bars apart
            ax.errorbar(d.x * off, d.gap, yerr=[d.gap - d.lo, d.hi - d.gap], marker="o", ms=3, lw=1.2, capsize=2,
                        color=c, label=label)
        d = ws[ws.panel == panel]
        ax.errorbar(d.x * 2 ** 0.08, d.gap, yerr=[d.gap - d.lo, d.hi - d.gap], marker="s", ms=2.5, lw=0.9, ls="--",
                    capsize=2, color="0.45", label="within sign (all)")
        ax.set_xscale("log", base=2)
        xs = sorted(pg[pg.panel == panel].x.unique())
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel=xlabel, ylabel="value gap (95% CI)", title=f"({'a' if panel == 'prompts' else 'b'}) {fixed}")
    for ax in axes:
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.3 * (hi - lo))  # room for the legend above the data
    axes[0].legend(frameon=False, fontsize=5.5, ncol=2, loc="upper center")
    if 1 in set(pg[pg.panel == "rollouts"].x):   # a group of one rollout has no group baseline: verl gives it A = r
        d1 = pg[(pg.panel == "rollouts") & (pg.x == 1)]
        axes[1].annotate("n = 1: no group baseline,\nA = r (verl), not a\ngroup-normalised advantage",
                         xy=(1, d1.hi.max()), xytext=(1.25, 0.97), textcoords=("data", "axes fraction"), ha="left",
                         va="top", fontsize=5.5, color="0.25", arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5))
    fig.tight_layout()
    return fig


def reward_composition(R: Result, P: Params):
    """Fig. 7(b): the gap per composition k = 1..G_comp − 1 positives of G_comp, per token subset (shaded 95%
    bands) and within sign, the sparse and saturated ends marked."""
    pg = R.gaps[R.gaps.scope == "valued"]
    ws = R.gaps[R.gaps.scope == "within_sign"]
    cg = pg[pg.panel == "composition"]
    fig, ax = plots.figure(ncols=1, width=plots.WIDTH_1COL, height=2.3)
    if len(cg):  # 31 compositions: lines with shaded 95% bands instead of error bars
        for j, name in enumerate(R.subsets):
            d = cg[cg.subset == name]
            label, c = SUB_STYLE.get(name, (name, plots.PALETTE[3 + j]))
            ax.plot(d.x, d.gap, marker="o", ms=2, lw=1.0, color=c, label=label)
            ax.fill_between(d.x, d.lo, d.hi, color=c, alpha=0.15, lw=0)
        d = ws[ws.panel == "composition"]
        ax.plot(d.x, d.gap, ls="--", lw=0.9, color="0.45", label="within sign (all)")
        for k, txt, ha in ((1, "sparse", "left"), (P.G_comp - 1, "saturated", "right")):   # inside the axes
            ax.axvspan(k - 0.5, k + 0.5, color="0.9", zorder=0)
            ax.text(k - 0.5 if ha == "left" else k + 0.5, 0.98, f"{txt}\n(k = {k})",
                    transform=ax.get_xaxis_transform(), ha=ha, va="top", fontsize=5.5)
        ks = list(range(1, P.G_comp))
        ax.set_xticks(ks if len(ks) <= 10 else ks[::max(1, len(ks) // 8)])
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel=f"positive rollouts of G = {P.G_comp} per query", ylabel="value gap (95% CI)",
           title=f"(b) reward composition (n = {R.n_comp_groups} query groups)")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo - 0.45 * (hi - lo), hi + 0.15 * (hi - lo))  # room for the legend below, the end labels above
    ax.legend(frameon=False, fontsize=5.5, loc="lower center", ncol=2)
    fig.tight_layout()
    return fig


def numbers(R: Result) -> str:
    """Every gap per setting, every trend, the noise budget of each d and the wall time, a line each."""
    out = []
    for panel in ("prompts", "rollouts", "composition"):
        for (scope, name), d in R.gaps[R.gaps.panel == panel].groupby(["scope", "subset"], sort=False):
            label = "within sign" if scope == "within_sign" else name
            out.append(f"{panel:>11} {label:>11}: " + ", ".join(f"{x}: {_fmt(g, lo, hi)}" for x, g, lo, hi in
                                                                zip(d.x, d.gap, d.lo, d.hi)))
        for _, t in R.trends[R.trends.panel == panel].iterrows():
            s = "" if np.isnan(t.slope_per_doubling) else (f"; slope per doubling "
                                                            f"{_fmt(t.slope_per_doubling, t.slope_lo, t.slope_hi)}")
            out.append(f"{'':>11} {t.subset:>11}: d({t.to} − {t.frm}) = {_fmt(t.d, t.d_lo, t.d_hi)}{s}")
    for _, r in R.trends.dropna(subset=["se"]).iterrows():
        out.append(f"noise of d ({r.panel}, {r.subset}): SE {r.se:.4f} = sqrt(seeds {r.var_seed:.2e} + MC "
                   f"{r.var_mc:.2e}) with {r.n_seeds} seeds; |d| = 2 SE needs {r.need_seeds:g} seeds or M "
                   f"{r.need_M:g} (one at a time)")
    out.append(f"\nwall time {R.seconds['total']:.0f} s (values {R.seconds['values']:.0f} s, sweep "
               f"{R.seconds['sweep']:.0f} s)")
    return "\n".join(out)


def findings(R: Result, P: Params) -> str:
    """Each panel's gap at its smallest and largest budget, its trends and what resolving them would take."""
    lines = []
    for panel, what in (("prompts", "prompts per update"), ("rollouts", "rollouts per prompt")):
        if panel not in set(R.trends.panel):
            continue
        xs = sorted(R.gaps[R.gaps.panel == panel].x.unique())
        a, b, t, w = R.at(panel, xs[0]), R.at(panel, xs[-1]), R.trend(panel), R.trend(panel, "within_sign")
        lines.append(f"- {what}: the gap of the valued tokens goes from {_fmt(a.gap, a.lo, a.hi)} at {xs[0]} to "
                     f"{_fmt(b.gap, b.lo, b.hi)} at {xs[-1]} (d = {_fmt(t.d, t.d_lo, t.d_hi)}, {t.n_seeds} seeds; "
                     f"|d| = 2 SE would need {t.need_seeds:g} seeds: {resolved(t)}); slope per doubling "
                     f"{_fmt(t.slope_per_doubling, t.slope_lo, t.slope_hi)}; within rollout sign d = "
                     f"{_fmt(w.d, w.d_lo, w.d_hi)}, slope {_fmt(w.slope_per_doubling, w.slope_lo, w.slope_hi)}.")
    if "rollouts" in set(R.gaps.panel) and 1 in set(R.gaps[R.gaps.panel == "rollouts"].x):
        one = R.at("rollouts", 1)
        lines.append(f"- n = 1 is a positive-only step (A = r): {one.boosted:.0%} of its valued tokens are boosted, "
                     f"{one.suppressed:.0%} suppressed; its all-token gap {one.gap:+.3f} includes the difference "
                     f"between tokens of positive and of negative rollouts (within sign: "
                     f"{R.at('rollouts', 1, 'within_sign').gap:+.3f}).")
    if "composition" in set(R.trends.panel):
        t, w, t25 = R.trend("composition"), R.trend("composition", "within_sign"), R.trend("composition", "top25")
        e1, e2 = R.at("composition", 1), R.at("composition", P.G_comp - 1)
        lines.append(f"- 7(b), G = {P.G_comp}, {R.n_comp_groups} query groups: k = 1 (sparse) "
                     f"{_fmt(e1.gap, e1.lo, e1.hi)}, k = {P.G_comp - 1} (saturated) {_fmt(e2.gap, e2.lo, e2.hi)}; "
                     f"middle − ends {_fmt(t.d, t.d_lo, t.d_hi)} ({t.n_seeds} seeds; |d| = 2 SE would need "
                     f"{t.need_seeds:g} seeds: {resolved(t)}); middle − sparse end "
                     f"{_fmt(t.d_sparse, t.d_sparse_lo, t.d_sparse_hi)}, middle − saturated end "
                     f"{_fmt(t.d_saturated, t.d_saturated_lo, t.d_saturated_hi)}; within sign "
                     f"{_fmt(w.d, w.d_lo, w.d_hi)}.")
        lines.append(f"  top-25% |Δ̂|: middle − ends {_fmt(t25.d, t25.d_lo, t25.d_hi)}; middle − sparse end "
                     f"{_fmt(t25.d_sparse, t25.d_sparse_lo, t25.d_sparse_hi)}, middle − saturated end "
                     f"{_fmt(t25.d_saturated, t25.d_saturated_lo, t25.d_saturated_hi)}.")
    return "\n".join(lines)
