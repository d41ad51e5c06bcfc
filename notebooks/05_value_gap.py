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
# # Fig. 5 and Fig. 11 — Monte Carlo counterfactual token value
#
# *Paper, §3 and App. E.2.* Does cancellation act as hidden credit assignment? For a token o_t at
# state s_t with p_t = π(o_t|s_t), the **counterfactual token value** is how much better taking
# o_t is than sampling an alternative from the policy:
# Δ(o_t|s_t) = Q(s_t, o_t) − E_{a≠o_t} Q(s_t, a) = (Q(s_t, o_t) − V(s_t)) / (1 − p_t).
# It is estimated from M complete continuations of s_t ⊕ o_t (mean reward avg₀) and M of s_t
# (avg₋₁), rewarded by the task's verifier: Δ̂ = (avg₀ − avg₋₁)/(1 − p_t) (Eq. 20; p_t from the
# training forward; tokens with p_t > 1 − 1e-3 are skipped). The paper (M = 256) finds that
# tokens a GRPO step **boosts** have higher Δ̂ than tokens it **suppresses**, in positive *and*
# in negative rollouts (a); that the value gap on the top-k% highest-entropy tokens **peaks near
# k ≈ 40%** (b); and (Fig. 11) that the gap **grows** with repeated GRPO steps on the same batch.
#
# Eq. 20 divides Monte Carlo noise by 1 − p_t (for p_t = 0.995, 200× the standard error of a coin
# flip average). On the same tokens and with the same avg₀ we also compute the **exclude**
# estimator Δ̂ₓ = avg₀ − avg₋ₒ, whose M continuations of s_t draw their first token from π
# renormalised without o_t: the same Δ (E[avg₋ₒ] = Q₋ₒ exactly), without the 1/(1 − p_t) factor.

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
replot = ""                         # a results folder to redraw from, computing nothing (set by the runner: --replot)
params = {}                         # values of figures.fig05.Params (set by the runner from the profile and -p)

# %% [markdown]
# ## GRPO steps on the batch, and the valued pool
# Full scope, verl's token-mean clipped loss, one mini-batch, float64. Fig. 5 splits tokens by one
# plain-SGD step (lr 0.1, App. D.2); Fig. 11 repeats K steps with the same θ_old (K epochs on one
# batch) per optimizer and lr of `sgd_lrs` / `adam_lrs`, a token's status after step k read from
# its cumulative Δlog p. `n_per_cell` tokens of each (rollout sign × boosted/suppressed) cell of
# step 1 are valued once under π_θ0 (Δ is a property of the policy at s_t); every prefix's
# rewards are cached, and the s_t ⊕ o_t branch is shared by both estimators.

# %%
import logging

import matplotlib.pyplot as plt
import numpy as np

from cancellation import claims, plots
from cancellation.figures import fig05, fig05_claims, fig05_plots

logging.basicConfig(level=logging.WARNING)
P = fig05.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig05.py
plots.use_profile(profile, P)  # every figure saved below is stamped with the profile and policy
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig05.load(replot, P)
else:
    R = fig05.compute(P)         # batch, GRPO steps, Monte Carlo values, gaps (cached; the values per prefix)
    R.write(results_dir, P)
print(fig05.summary(R), "\nremaining tokens per cell after step 1 (p_t ≤ p_max):", R.counts.to_string(), "",
      R.mc.to_string(index=False), f"\nper-token standard error of Δ̂ (M = {P.M}):", sep="\n")
R.se.round(3)

# %% [markdown]
# ## Fig. 5 — (a) value of boosted vs suppressed tokens, (b) gap on high-entropy tokens
# (a): mean Δ̂ per cell with 95% percentile-bootstrap intervals over **query groups**: the valued
# tokens come from few prompts (a claim row's n counts its query groups), and tokens of one prompt's
# rollouts share its context, so a replicate draws the groups with replacement and each drawn group
# brings all its tokens (a cluster bootstrap; the intervals include the Monte Carlo noise of each Δ̂).
# Every interval of this notebook (the gaps, the peak, Fig. 11) resamples the groups this way.
# (b): among the valued tokens, the top-k% by entropy (of π at s_t), the value gap mean
# Δ̂(boosted) − mean Δ̂(suppressed) within each rollout sign, and their average (the balanced gap,
# equal weight per sign as in the balanced draw).

# %%
print(R.cells.round(3).to_string(index=False), R.gap1.round(3).to_string(index=False), sep="\n\n")
est0 = P.estimators[0]
fig = fig05_plots.value_gap(R, P)   # lib/cancellation/figures/fig05_plots.py
plots.save(fig_dir, "fig05_value_gap", fig)
plt.show()

# %% [markdown]
# ## Fig. 14 (beyond the paper) — Fig. 5(a) by token class and by confidence
# The same valued tokens (first estimator) by token class (the tagger and table of notebook 04) and
# by confidence (p < 0.9 / p ≥ 0.9): the value gap per rollout sign and balanced over signs. A
# class whose choice never changes the reward (scaffold wording) has Δ ≈ 0 on both sides, so its
# gap is ≈ 0 whatever the update does; Fig. 5(a)'s gap has to come from the decision classes.

# %%
fig = fig05_plots.strata(R, est0)   # lib/cancellation/figures/fig05_plots.py
plots.save(fig_dir, "fig14_value_gap_strata", fig)
plt.show()
R.strata.round(3)

# %% [markdown]
# ## Fig. 11 — repeated GRPO steps on the same batch
# A pool of `n_pool11` tokens per rollout sign is drawn from the mixed groups' tokens (p ≤ p_max)
# **before any step and whatever their status**, valued once under π_θ0 (first estimator), and
# split after each step k by its cumulative Δlog p; the sign-balanced gap is recomputed
# (`value.repeated_gap`, with a paired bootstrap of gap(k) − gap(1) over the pool's query groups).
# Plain SGD at lr 0.1 stays first-order (a flat gap is built in): the claim reads, per optimizer,
# the smallest lr at which at least `nonlinear_share` of the pool's statuses changed between step 1
# and step K.

# %%
fig = fig05_plots.repeated(R, P)
plots.save(fig_dir, "fig11_repeated_updates", fig)
plt.show()
print(f"pool: {len(R.pool11)} tokens ({P.n_pool11} per rollout sign, any status); the claim row reads per optimizer: "
      + ", ".join(f"{o} lr {c:g}" + ("" if ok else f" (the largest: no lr had {P.nonlinear_share:.0%} of statuses "
                                                   f"changed between step 1 and step {P.repeat_steps})")
                  for o, (c, ok) in fig05.fig11_reads(R).items()))
R.last[["gap", "lo", "hi", "change", "change_lo", "change_hi", "changed_status"]].round(3)

# %% [markdown]
# ## Fig. 15 (beyond the paper) — credit by value: the real step against within-group sign shuffles
# If GRPO assigns credit, the tokens its step boosts should out-value those it suppresses by more than
# when the advantages carry no information about the rollouts. On Fig. 11's pool (drawn before any step,
# whatever its status: Fig. 5's own pool is selected by the real step) the same plain-SGD step is taken
# under `null_shuffles` within-group shuffles of the advantages (each group keeps its multiset of
# advantages), and the value gap of each split is set against the real one: (a) over both rollout signs as
# drawn, (b) within each sign, averaged. Rows `fig05_value_gap_vs_null*`: real − mean shuffled gap.

# %%
fig = fig05_plots.null(R, P)
plots.save(fig_dir, "fig15_value_gap_null", fig)
plt.show()
print(fig05_claims.null_sentence(R, P))

# %% [markdown]
# ## What the numbers say

# %%
fmt = lambda d: f"{d.gap:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}]"  # noqa: E731
for est in P.estimators:
    g = R.gap1[R.gap1.estimator == est].set_index("sign")
    print(f"{est:>8}: step-1 value gap, positive rollouts {fmt(g.loc['pos'])}, negative rollouts {fmt(g.loc['neg'])}, "
          f"balanced {fmt(g.loc['all'])}")
    b = R.entropy_gap[(R.entropy_gap.estimator == est) & (R.entropy_gap.sign == "all")]
    print(f"{'':>8}  gap by top-k% entropy: " + ", ".join(f"{k}%: {x:+.3f}" for k, x in zip(b.k, b.gap))
          + f"  (largest at k = {int(b.k.iloc[int(np.nanargmax(b.gap.to_numpy()))])}%)")
for (o, r), f in R.repeated.groupby(["optimizer", "lr"], sort=False):
    print(f"Fig. 11, {o} lr {r:g}: gap after 1..{P.repeat_steps} steps " + ", ".join(f"{x:+.3f}" for x in f.gap)
          + f"; statuses changed by step {P.repeat_steps}: {f.changed_status.iloc[-1]:.1%}")
print(f"M = {P.M}; median per-token SE: " + ", ".join(f"{e} {v:.3f}" for e, v in R.se["50%"].items())
      + f"; computed in {R.seconds:.0f} s", fig05.heldout_text(R, P), sep="\n")

# %% [markdown]
# **Reading.** Both estimators target Δ; Eq. 20's 1/(1 − p_t) gives p_t near 1 a heavy-tailed SE at
# small M: read exclude. §3's Â_M (no 1/(1 − p_t)) weighs value by 1 − p_t. In negative rollouts the
# step raises the higher-value tokens: the association the paper reads as hidden credit assignment;
# Fig. 15 sets it against within-group sign shuffles (no row tests that cancellation causes it). 5(b): a
# peak at the valued pool's last k reads 100% (no fall inside the pool). Fig. 11: small-lr SGD stays
# first-order (a flat gap built in), so the claim reads the smallest lr with `nonlinear_share` of statuses
# changed between step 1 and step K (else the largest lr, which its label says); a step-1 split equal to
# a smaller lr's later step is not recorded twice. Held-out states are reported per sign. From the rows:

# %%
rows = fig05_claims.claims(R, P)
print(fig05_claims.reading(rows, R, P))
claims.record(results_dir, "05", rows);
