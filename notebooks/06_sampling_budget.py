# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fig. 6 and Fig. 7(b) — sampling budget and reward composition
#
# *Paper, §3.3 and §4.* Cancellation needs positive and negative rollouts of the same query in
# one update. The paper varies the sampling budget — (a) prompts per update, 16 → 96, and (b)
# rollouts per prompt n, 1 → 8, all else fixed — and finds that the **value gap** (mean
# Monte Carlo value Δ̂ of boosted tokens − that of suppressed tokens) **grows with the
# budget**, most for the top-25% highest-value tokens (Fig. 6). Fig. 7(b): with the reward
# composition of the same query groups varied, the gap **shrinks when reward is sparse or
# saturated** (1 or G−1 positives of G).
#
# **What is measured (the fair test).** The paper splits "the tokens of the update" into boosted
# and suppressed; the update at a small budget holds few rollouts. So the valued tokens here are
# tokens **inside every update they are compared across**. Per seed, one random order of the
# base batch's prompts and of the rollouts inside each prompt; a *setting* takes a prefix of it
# (nested sub-batches): (a) the first P prompts × `n_fixed` rollouts, (b) the first
# `prompts_fixed` prompts × the first n rollouts, 7(b) the first k positive and G_comp − k
# negative rollouts of each of the same `comp_groups` query groups (a second batch of `comp_G`
# rollouts per prompt, so that every composition k = 1..G_comp−1 can be drawn). The valued
# rollouts of a seed are in its smallest update, hence in every update of its sweep: (a) the
# first `valued_per_prompt` rollouts of the first min(P) prompts, (b) the first rollout of each
# of the `prompts_fixed` prompts, 7(b) the first positive and first negative of each group.
# `tokens_per_rollout` of their tokens with p_t ≤ p_max are valued once (exclude estimator of
# notebook 05, M continuations per branch, cached per prefix). Group advantages are recomputed on
# each sub-batch (a group of one rollout gets A = r: n = 1 is positive-only training). One
# plain-SGD GRPO step (full scope, lr 0.1, float64, as Fig. 5) per setting and seed; its Δlog p
# on the seed's valued tokens gives the split. The gap of a setting pools the (seed, token)
# instances of all seeds; the tables' intervals resample seeds (paired across a panel's settings),
# the claim rows' seeds and query groups (two-way: the valued tokens are fixed across seeds).
# Each step is exact: from per-rollout scores (`step_mode: scores`) or a real `grpo_step` (`grpo`).

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
replot = ""                         # a results folder to redraw from, computing nothing (set by the runner: --replot)
params = {}                         # values of figures.fig06.Params (set by the runner from the profile and -p)

# %%
import logging

import matplotlib.pyplot as plt
import numpy as np

from cancellation import claims, plots
from cancellation.figures import fig06

logging.basicConfig(level=logging.WARNING)
P = fig06.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig06.py
plots.use_profile(profile, P)  # every figure saved below is stamped with the profile and policy
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig06.load(P, replot)
else:
    R = fig06.compute(P)         # batches, plans, Monte Carlo values, the sweep of steps, gaps, trends (cached)
    R.write(results_dir, P)
print(fig06.summary(R))

# %% [markdown]
# ## Value gap per setting, its trends, and what it would take to resolve them
# For all valued tokens and the top-50% / top-25% by |Δ̂| (thresholds over all valued tokens): the
# gap pooled over seeds, with a 95% interval from resampling seeds (paired across the settings of
# a panel), and the within-sign (balanced) gap. Trends, with paired 95% intervals: for (a) and (b)
# d = gap(largest budget) − gap(smallest) and the least-squares slope per doubling of the budget;
# for 7(b) the middle compositions (k = 2..G−2) minus the two ends (k = 1 sparse, k = G−1
# saturated). The variance of d splits into the Monte Carlo noise of Δ̂ (closed form: d is linear
# in Δ̂) and the rest (which sub-batches and valued rollouts the seeds drew); `need_seeds` and
# `need_M` (one at a time) would make |d| twice its standard error (budget.needed).

# %%
print(R.trends.round(4).to_string(index=False))
R.gaps.pivot_table(index=["panel", "x"], columns=["scope", "subset"], values="gap").round(3)

# %%
SUB_STYLE = {"all": ("all valued tokens", plots.PALETTE[0]), "top50": ("top-50% |Δ̂|", plots.PALETTE[2]),
             "top25": ("top-25% |Δ̂|", plots.PALETTE[1])}
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
    axes[1].annotate("n = 1: no group baseline,\nA = r (verl), not a\ngroup-normalised advantage", xy=(1, d1.hi.max()),
                     xytext=(1.25, 0.97), textcoords=("data", "axes fraction"), ha="left", va="top", fontsize=5.5,
                     color="0.25", arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5))
fig.tight_layout()
plots.save(fig, "fig06_sampling_budget", fig_dir)
plt.show()

# %%
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
    for k, txt, ha in ((1, "sparse", "left"), (P.G_comp - 1, "saturated", "right")):   # inside the axes, not clipped
        ax.axvspan(k - 0.5, k + 0.5, color="0.9", zorder=0)
        ax.text(k - 0.5 if ha == "left" else k + 0.5, 0.98, f"{txt}\n(k = {k})", transform=ax.get_xaxis_transform(),
                ha=ha, va="top", fontsize=5.5)
    ks = list(range(1, P.G_comp))
    ax.set_xticks(ks if len(ks) <= 10 else ks[::max(1, len(ks) // 8)])
ax.axhline(0, color="k", lw=0.5)
ax.set(xlabel=f"positive rollouts of G = {P.G_comp} per query", ylabel="value gap (95% CI)",
       title=f"(b) reward composition (n = {R.n_comp_groups} query groups)")
lo, hi = ax.get_ylim()
ax.set_ylim(lo - 0.45 * (hi - lo), hi + 0.15 * (hi - lo))  # room for the legend below, the end labels above
ax.legend(frameon=False, fontsize=5.5, loc="lower center", ncol=2)
fig.tight_layout()
plots.save(fig, "fig07b_reward_composition", fig_dir)
plt.show()

# %% [markdown]
# ## What the numbers say

# %%
fmt = lambda g, lo, hi: f"{g:+.3f} [{lo:+.3f}, {hi:+.3f}]"  # noqa: E731
for panel in ("prompts", "rollouts", "composition"):
    for (scope, name), d in R.gaps[R.gaps.panel == panel].groupby(["scope", "subset"], sort=False):
        label = "within sign" if scope == "within_sign" else name
        print(f"{panel:>11} {label:>11}: " + ", ".join(f"{x}: {fmt(g, lo, hi)}" for x, g, lo, hi in
                                                       zip(d.x, d.gap, d.lo, d.hi)))
    for _, t in R.trends[R.trends.panel == panel].iterrows():
        s = "" if np.isnan(t.slope_per_doubling) else (f"; slope per doubling "
                                                        f"{fmt(t.slope_per_doubling, t.slope_lo, t.slope_hi)}")
        print(f"{'':>11} {t.subset:>11}: d({t.to} − {t.frm}) = {fmt(t.d, t.d_lo, t.d_hi)}{s}")
for _, r in R.trends.dropna(subset=["se"]).iterrows():
    print(f"noise of d ({r.panel}, {r.subset}): SE {r.se:.4f} = sqrt(seeds {r.var_seed:.2e} + MC {r.var_mc:.2e}) "
          f"with {r.n_seeds} seeds; |d| = 2 SE needs {r.need_seeds:g} seeds or M {r.need_M:g} (one at a time)")
print(f"\nwall time {R.seconds['total']:.0f} s (values {R.seconds['values']:.0f} s, sweep {R.seconds['sweep']:.0f} s)")

# %%
lines = []
for panel, what in (("prompts", "prompts per update"), ("rollouts", "rollouts per prompt")):
    if panel not in set(R.trends.panel):
        continue
    xs = sorted(R.gaps[R.gaps.panel == panel].x.unique())
    a, b, t, w = R.at(panel, xs[0]), R.at(panel, xs[-1]), R.trend(panel), R.trend(panel, "within_sign")
    lines.append(f"- {what}: the gap of the valued tokens goes from {fmt(a.gap, a.lo, a.hi)} at {xs[0]} to "
                 f"{fmt(b.gap, b.lo, b.hi)} at {xs[-1]} (d = {fmt(t.d, t.d_lo, t.d_hi)}, {t.n_seeds} seeds; "
                 f"|d| = 2 SE would need {t.need_seeds:g} seeds: {fig06.resolved(t)}); slope per doubling "
                 f"{fmt(t.slope_per_doubling, t.slope_lo, t.slope_hi)}; within rollout sign d = {fmt(w.d, w.d_lo, w.d_hi)}, "
                 f"slope {fmt(w.slope_per_doubling, w.slope_lo, w.slope_hi)}.")
if "rollouts" in set(R.gaps.panel) and 1 in set(R.gaps[R.gaps.panel == "rollouts"].x):
    one = R.at("rollouts", 1)
    lines.append(f"- n = 1 is a positive-only step (A = r): {one.boosted:.0%} of its valued tokens are boosted, "
                 f"{one.suppressed:.0%} suppressed; its all-token gap {one.gap:+.3f} includes the difference between "
                 f"tokens of positive and of negative rollouts (within sign: {R.at('rollouts', 1, 'within_sign').gap:+.3f}).")
if "composition" in set(R.trends.panel):
    t, w, t25 = R.trend("composition"), R.trend("composition", "within_sign"), R.trend("composition", "top25")
    e1, e2 = R.at("composition", 1), R.at("composition", P.G_comp - 1)
    lines.append(f"- 7(b), G = {P.G_comp}, {R.n_comp_groups} query groups: k = 1 (sparse) {fmt(e1.gap, e1.lo, e1.hi)}, "
                 f"k = {P.G_comp - 1} (saturated) {fmt(e2.gap, e2.lo, e2.hi)}; middle − ends "
                 f"{fmt(t.d, t.d_lo, t.d_hi)} ({t.n_seeds} seeds; |d| = 2 SE would need {t.need_seeds:g} seeds: "
                 f"{fig06.resolved(t)}); middle − sparse end {fmt(t.d_sparse, t.d_sparse_lo, t.d_sparse_hi)}, middle − "
                 f"saturated end {fmt(t.d_saturated, t.d_saturated_lo, t.d_saturated_hi)}; within sign "
                 f"{fmt(w.d, w.d_lo, w.d_hi)}.")
    lines.append(f"  top-25% |Δ̂|: middle − ends {fmt(t25.d, t25.d_lo, t25.d_hi)}; middle − sparse end "
                 f"{fmt(t25.d_sparse, t25.d_sparse_lo, t25.d_sparse_hi)}, middle − saturated end "
                 f"{fmt(t25.d_saturated, t25.d_saturated_lo, t25.d_saturated_hi)}.")
print("\n".join(lines))

# %% [markdown]
# **Reading.** Every gap is measured on tokens inside its update, the same tokens at every budget of
# a seed, so a difference between budgets comes from the update alone. At n = 1 only positive
# rollouts are pushed, so the all-token gap includes the positive − negative difference; the
# within-sign rows remove it. d = gap(largest) − gap(smallest) was fixed before this run (the slope
# decides nothing); "most pronounced for the top-25%" is d(top25) − d(all). The valued tokens stay
# fixed across seeds, so every row resamples their query groups with the seeds (two-way, n = groups;
# seeds-only interval in the detail), 7(b)'s middle − ends and each end alone included. From the rows:

# %%
rows = fig06.claims(R, P)
print("\n".join(f"{r.claim}: {r.measured:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}] ({r.resampling}, n = {r.n}) -> {r.verdict}"
                for r in rows))
claims.record(results_dir, "06", rows);
