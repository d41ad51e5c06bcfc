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
# # Fig. 1 and Fig. 9 — token flipping
#
# *Paper, §1 and App. C.* During a GRPO training run, measure after every step how the step's
# update moved the log-probability of every token of **its own batch**:
# Δlog p = log π_θ'(o_t|s_t) − log π_θ(o_t|s_t), both from forward passes of the training model
# (never from sampler log-probs). A token is *boosted* if Δ > ε, *suppressed* if Δ < −ε, *stable*
# otherwise (ε = 1e-6). The sequence-level intuition says tokens of positive rollouts (A > 0)
# should be boosted and tokens of negative rollouts (A < 0) suppressed. The paper finds instead
# that both signs show **similar boosted/suppressed shares** (a, b) and **similar magnitudes**
# (c), and that the pattern largely disappears when training on positive rollouts only (d).
# Fig. 9 repeats (a, b) for every model of the profile. The update is verl's token-mean clipped
# loss (ε_low 0.2, ε_high 0.28, dual clip 3, no KL), Adam, `n_minibatches` optimizer steps per
# batch; groups with all-equal rewards get A = 0 and are left out of the sign split.
#
# **Scale: not the paper's.** The first line printed below gives this run's policy size, learning
# rate and batch beside the paper's (Qwen 1.7B–7B, lr 1e-6, 128 prompts × 8 rollouts).

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
replot = ""                         # a results folder to redraw from, computing nothing (set by the runner: --replot)
params = {}                         # values of figures.fig01.Params (set by the runner from the profile and -p)

# %% [markdown]
# ## Noise floor and the runs
# ε must sit above the numerical noise of the measurement. We measure Δlog p (i) between two
# forward passes with no update and (ii) across an Adam step whose token weights are all zero,
# on a batch sampled from the policy; and (iii) the round-off of the log-probs themselves: the
# median |log p| difference between a lower and a higher precision copy of the same weights —
# float32 against the float64 analysis on the tiny profile (why it runs in float64), the
# analysis dtype against float64 on the paper profile (what ε must clear there). `compute` stops
# when the floor is not below ε.
#
# Then one GRPO run (`grpo` weights) and one positive-only run (`positive_only`: A·1[r = 1], the
# negative rollouts' loss weights set to 0) from the same saved policy, with the same prompts
# and seeds; the fixed-scaffold control's two runs and Fig. 9's runs. Runs are cached under
# `data/cache/`, so a rerun that changes only plotting is instant.

# %%
import logging

import matplotlib.pyplot as plt
import numpy as np
from cancellation import claims, plots, profiles
from cancellation.figures import fig01, fig01_claims, fig01_plots

logging.basicConfig(level=logging.WARNING)
P = fig01.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig01.py
print(plots.use_profile(profile, P), f"{P.steps} Adam steps at lr {P.lr:g}, {P.n_prompts} prompts × {P.G} rollouts, "
      f"{P.n_minibatches} mini-batches per step (the paper: lr 1e-6, 128 × 8, 4 mini-batches)", sep="; ")
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig01.load(replot, P)
else:
    R = fig01.compute(P)         # noise floor, the runs (cached), flip fractions, categories, Fig. 9
    R.write(results_dir, P)
print(fig01.probe_summary(R))
print(R.noise.to_string(index=False))
print(R.accuracy.unstack("run").round(3).T.to_string())
frac, signed = R.frac, R.signed
frac.groupby(["run", "sign", "status"]).fraction.agg(["mean", "std"]).unstack("status").round(3)

# %% [markdown]
# ## Fig. 1

# %%
fig = fig01_plots.token_flipping(frac, R.token_deltas, P.eps)   # lib/cancellation/figures/fig01_plots.py
plots.save(fig_dir, "fig01_token_flipping", fig)
plt.show()

# %% [markdown]
# ## What the numbers say
# The mean share (± s.d. over steps) of boosted and suppressed tokens per rollout sign for both
# runs, and the mean |Δlog p| per sign. The paper's claims: (a) ≈ (b), magnitudes similar, and
# under positive-only training the flipping largely disappears. Then the ε sensitivity: the
# boosted share of positive minus negative rollouts (GRPO run, mean over steps, points) at ε from
# 1e-7 to 1e-4, for all tokens and by confidence.

# %%
mag = R.magnitude()
for r in R.frac.run.unique():  # grpo, positive_only and (sgd_lr > 0) the SGD run grpo_sgd
    print(f"{r:>14}: positive rollouts boosted {R.share(r, 'pos', 'boosted')}, suppressed "
          f"{R.share(r, 'pos', 'suppressed')} | negative rollouts boosted {R.share(r, 'neg', 'boosted')}, "
          f"suppressed {R.share(r, 'neg', 'suppressed')}")
print(f"|Δlog p| (grpo run), median / mean: positive rollouts {mag['median'].get('pos', np.nan):.2e} / "
      f"{mag['mean'].get('pos', np.nan):.2e}, negative rollouts {mag['median'].get('neg', np.nan):.2e} / "
      f"{mag['mean'].get('neg', np.nan):.2e}")
gap = {r: R.boosted_gap(r) for r in ("grpo", "positive_only")}
print(f"boosted share, positive minus negative rollouts: grpo {100 * (gap['grpo'].pos - gap['grpo'].neg).mean():+.1f} "
      f"pts, positive-only {100 * (gap['positive_only'].pos - gap['positive_only'].neg).mean():+.1f} pts")
# Tokens the policy is sure of (p > 0.9) barely move under any update; among the uncertain ones:
print(f"share of tokens with p < 0.9: {R.uncertain_share:.1%}; their status shares:")
print(R.uncertain.pivot_table(index=["run", "sign"], columns="status", values="fraction").round(3).to_string())
print(R.sens.pivot(index="eps", columns="stratum").round(2).to_string())
print(f"noise floor: repeat {R.floor['repeat']:.1e}, zero update {R.floor['zero_update']:.1e} (ε = {P.eps:g})")
print(f"stable tokens (|Δ| ≤ ε), GRPO run: {100 * (signed[signed.run == 'grpo'].status == 'stable').mean():.1f}%")

# %% [markdown]
# Reading. Tokens the policy is sure of (p ≥ 0.9) move by amounts near ε, so their
# boosted/suppressed split depends on ε; the uncertain tokens carry most of |Δ|. Our reading of
# (d): the shared scaffold and digit tokens of negative rollouts are pulled up by the same tokens
# in positive rollouts (the coupling of Fig. 2); the plain-SGD run (`_sgd` rows below) shows the
# same, so Adam's sign-like first steps do not explain it.

# %% [markdown]
# ## Fig. 1(d): which tokens are suppressed in positive rollouts, and a fixed-scaffold control
# Under GRPO a token of a rewarded rollout can be suppressed because the same token is pushed
# down in negative rollouts (the paper's reading) — or, on the tiny task, because it is one of
# several interchangeable scaffold wordings (First/Begin/Start, ...) whose rivals were rewarded
# elsewhere in the batch. The table gives the category (`data/categories/category_map.csv`) of
# the suppressed tokens in A > 0 rollouts per run. The control repeats both runs on
# `control_model_path`, a policy pretrained on traces with **one** wording per scaffold slot, so
# scaffold tokens there are shared by every rollout, as a real model's template is.

# %%
if R.control is not None:
    print(f"control accuracy per step (mean over steps): grpo {R.control_accuracy.grpo.mean():.3f}, "
          f"positive-only {R.control_accuracy.positive_only.mean():.3f}")
    print("control: share of tokens per status (mean over steps), as Fig. 1(a,b,d):\n" +
          R.control.groupby(["run", "sign", "status"]).fraction.mean().unstack("status").round(3).to_string())
print("categories of the suppressed tokens in A > 0 rollouts (share of those tokens):")
print(R.categories.to_string(float_format=lambda v: f"{100 * v:.1f}%"))
print(fig01_claims.control_drop(R).detail if R.control is not None else "no control policy (control_model_path is empty)")

# %% [markdown]
# ## Fig. 9 — across models
# Fig. 1's GRPO run (fewer steps) per model of the profile; rows are models, columns the share of boosted /
# suppressed / stable tokens among A > 0, A < 0 and all rollouts. The line below says what it can test here.

# %%
fig = fig01_plots.across_models(R.fig9)
plots.stamp(fig, plots.models_stamp_text(profile, P.models, P.device))   # every policy it plots, not P.model_path's
plots.save(fig_dir, "fig09_flipping_across_models", fig)
plt.show()
print(fig01_claims.fig9_scope(P, profiles.load_profile("paper")))
R.fig9.groupby(["model", "sign", "status"]).fraction.mean().unstack("status").round(3)

# %% [markdown]
# ## Claims
# Each claim is built from the values above and recorded in `claims.parquet` with the rule that
# decides its verdict (`cancellation.claims`). Intervals are Student-t over training steps (steps
# share the policy's trajectory: a rough guide, not independent draws). §1's "nearly half of the
# tokens move opposite" is read as 40–50% of the A ≠ 0 tokens (fixed before the run); the line below
# gives this run's share, per sign, and among the tokens that move at all (|Δ| > ε, so ε matters).
# The `_sgd` rows repeat (a,b) on a plain-SGD run (`sgd_lr`): Adam's early steps are sign-like, SGD's
# are not. `fig01_signed_mean` checks that similar shares still favour positive rollouts on average.

# %%
rows = fig01_claims.claims(R, P)
print("\n".join(f"{c.claim}: {c.measured:.1f} [{c.lo:.1f}, {c.hi:.1f}] ({c.verdict}); {c.detail}" for c in rows
                if c.claim.startswith("fig01_nearly_half_opposite")))
claims.record(results_dir, "01", rows);
