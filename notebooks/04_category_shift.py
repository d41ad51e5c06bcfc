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
# # Fig. 4 — where the boosted mass goes: positive-only vs GRPO
#
# *Paper, §3 and App. E.1 (Algorithm 2).* From one saved checkpoint θ₀ and one rollout batch B,
# take two single updates: **positive-only** (advantages A·1[r = 1]) and **GRPO** (the original
# A), each from θ₀ (`grpo.trial_delta`: snapshot, step, measure, restore), and measure
# Δlog p = log π_θ'(o_t|s_t) − log π_θ₀(o_t|s_t) on the **whole** batch for both. Per category
# (Math / Template / Reasoning / Other) we sum the *boosted mass* Σ max(Δ, 0) and the *suppressed mass*
# Σ max(−Δ, 0), and take each category's share of all boosted mass.
#
# The paper's claim: compared with positive-only, GRPO "greatly weakens updates on template and
# formatting tokens and shifts emphasis toward reasoning tokens" — tokens shared by positive and
# negative rollouts receive opposing signals that cancel.
#
# The update is the causal-analysis update of App. D.2/D.3: plain SGD (no momentum), one step on
# the whole batch, verl's token-mean clipped loss, all parameters, float64 on the tiny profile
# (Adam's first step is sign descent and would wash out the per-token magnitudes we compare),
# repeated on `n_batches` independent batches; intervals are 95% t-intervals over batches.
#
# **Tagging** (`cancellation.categories`: detokenise to words, apply the table `category_map`, map the
# tags back to tokens). On the tiny task the table tags by **role** (`data/categories/arithmetic_roles.csv`,
# editable): the digits a column computes, the digit written, carry/borrow amounts and words and the boxed
# answer are Reasoning; operands and operators copied from the prompt are Math; scaffold wording and
# punctuation are Template. The **word / POS** table the paper profiles use (`category_map.csv`: NLTK
# part-of-speech tags plus rules; there only carry/no/borrow are Reasoning) is shown beside it (`compare_map`).
#
# **Control** (`control_model_path`): the same batches on a policy pretrained on a *fixed
# scaffold* (one wording per slot, `tiny-m-fixed`), so the reader can see which verdicts come
# from the tiny task's random scaffold wording rather than from the update rule.

# %% tags=["parameters"]
profile = "tiny"                     # parameter profile (set by the runner)
fig_dir = "figures/tiny"             # where figures go (set by the runner)
results_dir = "data/results/tiny"    # where tidy tables go (set by the runner)
replot = ""                          # a results folder to redraw from, computing nothing (set by the runner: --replot)
params = {}                          # values of figures.fig04.Params (set by the runner from the profile and -p)

# %%
import logging

import matplotlib.pyplot as plt

from cancellation import claims, plots
from cancellation.figures import fig04, fig04_claims, fig04_plots

logging.basicConfig(level=logging.WARNING)
P = fig04.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig04.py
plots.use_profile(profile, P)  # every figure saved below is stamped with the profile and policy
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig04.load(replot, P)
else:
    R = fig04.compute(P)         # Algorithm 2 on every batch (cached per batch), tagging, masses, shifts, settings
    R.write(results_dir, P)
print(fig04.summary(R))

# %% [markdown]
# ## Tagging check
# How each token type was tagged (with its word), to audit the table; edit `category_map` to change a choice
# (the cached Δlog p are re-tagged on the next run without recomputing).

# %%
print("\n".join(fig04_claims.audit_lines(R.audit)))

# %% [markdown]
# ## Boosted and suppressed mass per category

# %%
fig04_claims.mass_view(R.summary_table)

# %% [markdown]
# ## Tokens whose Δlog p differs most between the two updates
# Per token type with at least `min_count` occurrences: mean Δlog p under each update over all
# its occurrences in all batches, ranked by |mean Δ_GRPO − mean Δ_positive-only|.

# %%
print("\n".join(fig04_claims.occurrence_lines(R.occurrences)))
R.top.round(5)

# %% [markdown]
# ## Fig. 4

# %%
fig = fig04_plots.category_shift(R)   # lib/cancellation/figures/fig04_plots.py
plots.save(fig_dir, "fig04_category_shift", fig)
plt.show()

# %% [markdown]
# ## What the numbers say
# The claim holds if GRPO's boosted-mass share on Template is lower than positive-only's and on Reasoning
# higher, the 95% intervals (over batches) of the paired difference excluding zero:

# %%
print("\n".join(fig04_claims.shift_report(R)))

# %% [markdown]
# ## Which verdicts come from the tagging and which from the scaffold wording
# The same Δlog p tagged with the word table (`compare_map`), and the same batch seeds on the fixed-scaffold
# control policy; per setting, the paired shifts of the boosted share (GRPO − positive-only), 95% t intervals.

# %%
fig04_claims.compare_view(R.compare)

# %%
fig = fig04_plots.settings_shift(R, P, profile)   # Fig. 13: beyond the paper, stamped with both policies
plots.save(fig_dir, "fig13_category_shift_settings", fig)
plt.show()

# %% [markdown]
# ## The thesis as a test that could come out against the paper (`cancellation.thesis`)
# Same batches, same θ₀, more single steps from θ₀: **negative-only** (A·1[r = 0]); **GRPO with the
# opposite-sign copies masked** (loss weight 0 on each token of an A < 0 rollout whose id occurs in an A > 0
# rollout of its group) and, as its null, **GRPO with random masks disjoint from the copies** (in every group and
# confidence bin, as many of the *other* A < 0 tokens as there are copies, or all of them when they are fewer;
# `n_random_masks` draws averaged). A token of an A > 0 rollout is *shared* when it occurs in an A < 0 rollout of its
# group, else *success-specific*; mirrored for A < 0. "Occurs" has three definitions: the same **id** anywhere in
# the rollout (the paper's literal one); the same id **in context** (after the same k response tokens, k = 1…4;
# the one whose rows decide is the smallest k whose specific share reaches 20% in both pools, fixed from the
# class shares below before any Δ is read); and the same **state** (the whole response up to and including the
# token equals an opposite-sign rollout's). A shared token at a copy's own state gets both signs' gradients at
# one input, which needs no coupling between different states; §2's story is about the others, so the rows
# below also take shared tokens **at another state than any copy's** apart.
#
# **The null.** Each batch's rewards and advantages are shuffled within every group `null_shuffles` = K times,
# and the three single steps are taken from θ₀ under each shuffle (exact to float round-off:
# `thesis.null_batch`, checked against the exact step below); shuffle s pools every batch's s-th shuffle, as
# the real statistic pools them. A statistic no different under shuffled signs says nothing about *success*.
#
# **The rule, fixed before the run.** *Cancellation*: on different-state shared A > 0 tokens, the cancellation's
# 95% interval below 0 and the retained share's below 1. *Success-specific credit*: the contrast and the specific
# amplification, in each pool, beyond the central 95% of their null on the paper's side (one-sided p ≤ 0.025).
# The verdict needs both; under 20% specific tokens reads "not decidable". Intervals: bootstrap over batches, then groups.

# %% [markdown]
# **What each definition can test here.** With a vocabulary of a few dozen ids, by the id definition almost every
# token also occurs in a failed rollout of its group; the in-context definition separates the classes.

# %%
print("\n".join(fig04_claims.class_lines(R)))
fig04_claims.shares_view(R.thesis_shares)

# %% [markdown]
# The thesis statistics with their 95% intervals, per definition, view of the shared class (all of it; at
# another state than any copy's; at a copy's own state) and pool:

# %%
TC = fig04_claims.thesis_rows(R)
print("no group holds both classes: nothing to compare on this profile" if R.thesis.empty else "")
fig04_claims.thesis_view(R.thesis)

# %% [markdown]
# Every statistic against its sign-shuffle null, on every definition (the real value, the null's median and
# central 95%, and the one-sided permutation p toward the paper's side):

# %%
fig04_claims.null_view(R.thesis_null)

# %%
fig = fig04_plots.thesis(R, TC)
plots.save(fig_dir, "fig04_thesis", fig)
plt.show()

# %% [markdown]
# How well the first-order terms (LM-head kernel) track the measured full-parameter step (they do not stand in
# for the steps anywhere; the null takes exact steps):

# %%
R.thesis_fidelity.round(3)

# %%
print("\n".join(fig04_claims.thesis_report(R.thesis, TC)))

# %% [markdown]
# ## Which part of the thesis the rows support
# Read off the rows above: per definition of "shared", the verdict, its two parts and the null control.

# %%
print("\n".join(fig04_claims.thesis_reading(TC)))

# %% [markdown]
# ## Claims and reading
# Verdicts from 95% t intervals over batches (paired): Template's share must fall and Reasoning's
# rise under GRPO; fixed-scaffold rows are controls. "Greatly weakens updates on template tokens"
# is also read in absolute mass (GRPO / positive-only, geometric mean over batches):

# %%
rows = fig04_claims.claims(R, P)
print("\n".join(fig04_claims.mass_lines(R, rows)))   # also vs the total, and without each batch's 1% largest |Δ|
claims.record(results_dir, "04", rows);
