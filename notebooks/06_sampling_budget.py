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

from cancellation import claims, plots
from cancellation.figures import fig06, fig06_plots

logging.basicConfig(level=logging.WARNING)
P = fig06.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig06.py
plots.use_profile(profile, P)  # every figure saved below is stamped with the profile and policy
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig06.load(replot, P)
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
fig = fig06_plots.sampling_budget(R, P)   # lib/cancellation/figures/fig06_plots.py
plots.save(fig_dir, "fig06_sampling_budget", fig)
plt.show()

# %%
fig = fig06_plots.reward_composition(R, P)
plots.save(fig_dir, "fig07b_reward_composition", fig)
plt.show()

# %% [markdown]
# ## What the numbers say

# %%
print(fig06_plots.numbers(R))

# %%
print(fig06_plots.findings(R, P))

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
