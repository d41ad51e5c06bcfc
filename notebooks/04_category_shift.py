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
# Δlog p = log π_θ'(o_t|s_t) − log π_θ₀(o_t|s_t) on the **whole** batch for both. Every response
# token is tagged Math / Template / Reasoning / Other (`cancellation.categories`: detokenise to
# words, NLTK POS tags plus the rules of the category table `category_map`, tags mapped back to
# tokens). Per category we sum the *boosted mass* Σ max(Δ, 0) and the *suppressed mass*
# Σ max(−Δ, 0), and take each category's share of all boosted mass.
#
# The paper's claim: compared with positive-only, GRPO "greatly weakens updates on template and
# formatting tokens and shifts emphasis toward reasoning tokens" — tokens shared by positive and
# negative rollouts receive opposing signals that cancel.
#
# The update is the causal-analysis update of App. D.2/D.3: plain SGD (no momentum), one step on
# the whole batch, verl's token-mean clipped loss, all parameters, float64 on the tiny profile
# (Adam's first step is sign descent and would wash out the per-token magnitudes we compare).
# The experiment is repeated on `n_batches` independent batches (different prompts and sampling
# seeds); intervals are 95% t-intervals over batches.
#
# **Tagging on the tiny task is by role** (`data/categories/arithmetic_roles.csv`, editable): the
# digits a column computes, the digit written, carry/borrow amounts and words and the boxed answer
# are the decisions (Reasoning); operands and operators copied from the prompt are Math; scaffold
# wording and punctuation are Template. The word table the paper's POS reading uses
# (`compare_map`) is shown beside it: there, only carry/no/borrow are Reasoning.
#
# **Control** (`control_model_path`): the same batches on a policy pretrained on a *fixed
# scaffold* (one wording per slot, `tiny-m-fixed`), so the reader can see which verdicts come
# from the tiny task's random scaffold wording rather than from the update rule.

# %% tags=["parameters"]
profile = "tiny"                     # parameter profile (set by the runner)
fig_dir = "figures/tiny"             # where figures go (set by the runner)
results_dir = "data/results/tiny"    # where tidy tables go (set by the runner)
params = {}                          # values of figures.fig04.Params (set by the runner from the profile and -p)

# %%
import logging

import matplotlib.pyplot as plt

from cancellation import claims, plots
from cancellation.figures import fig04, fig04_claims, fig04_plots

logging.basicConfig(level=logging.WARNING)
P = fig04.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig04.py
plots.use_profile(profile, P)  # every figure saved below is stamped with the profile and policy
R = fig04.compute(P)         # Algorithm 2 on every batch (cached per batch), tagging, masses, shifts, settings
R.write(results_dir)
print(fig04.summary(R))

# %% [markdown]
# ## Tagging check
# How each token type of the batch was tagged (with the word it belongs to), so a reader can
# audit the category table. Edit the table (`category_map`; the role table includes the word
# table `data/categories/category_map.csv`) to change a choice; the cached Δlog p are re-tagged on
# the next run without recomputing.

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
plots.save(fig, "fig04_category_shift", fig_dir)
plt.show()

# %% [markdown]
# ## What the numbers say
# The claim holds at this scale if GRPO's share of boosted mass on Template tokens is lower than
# positive-only's and its share on Reasoning tokens higher, with 95% intervals (over batches) of
# the paired difference excluding zero. The cell below prints that test.

# %%
print("\n".join(fig04_claims.shift_report(R)))

# %% [markdown]
# ## Which verdicts come from the tagging and which from the scaffold wording
# The same Δlog p tagged with the word table (`compare_map`), and the same batch seeds on the
# fixed-scaffold control policy (`control_model_path`, tagged with `category_map`). One row per
# setting; the columns are the paired shifts of the boosted share (GRPO − positive-only) with
# 95% t intervals over batches.

# %%
fig04_claims.compare_view(R.compare)

# %%
fig = fig04_plots.settings_shift(R)
plots.save(fig, "fig04b_category_shift_settings", fig_dir)
plt.show()

# %% [markdown]
# ## The thesis as a test that could come out against the paper (`cancellation.thesis`)
# Same batches, same θ₀, more single steps from θ₀: **negative-only** (A·1[r = 0]); **GRPO with the
# opposite-sign copies masked** (loss weight 0 on each token of an A < 0 rollout whose id occurs in an A > 0
# rollout of its group) and, as its null, **GRPO with random masks of the same size** (as many A < 0 tokens per
# group and confidence bin, drawn at random; `n_random_masks` draws averaged); and positive-only, negative-only
# and GRPO with the **advantages shuffled within groups** (the permuted control). A token of an A > 0 rollout
# is *shared* when it occurs in an A < 0 rollout of its group, else *success-specific*; mirrored for A < 0.
# "Occurs" has two definitions: the same **id** anywhere in the rollout, and the same id **in context** (after
# the same k response tokens, k the smallest whose specific share reaches 20% in both pools — fixed from the
# class shares below, before any Δ is read).
#
# What the paper says, as rows: shared A > 0 tokens **lose reinforcement** under GRPO (their cancellation
# Δ_GRPO − Δ_positive-only < 0, and they keep less than all of their positive-only gain), and they lose more than
# success-specific ones (the contrast, matched within token id × confidence bin). The thesis verdict is the
# conjunction of the first and the last. The **alternative reading** is that GRPO amplifies success-specific
# tokens while shared ones keep their gain; it has its own row. Then the refutation (copies mask vs random
# masks: the copies must restore more), the permuted control, the frequency split the related work predicts,
# and the **mechanism**: each token's first-order Δ under an LM-head GRPO step (Eq. 9) split into the same id
# in opposite-sign rollouts, other ids in opposite-sign rollouts, and the rest. Intervals: 95% bootstrap over
# batches, then groups within a batch. Each row's rule names the refuting outcome.

# %% [markdown]
# **What each definition can test on this task.** The tiny task writes every rollout from a vocabulary of a few
# dozen ids, so by the id definition almost every token also occurs in some failed rollout of its group and the
# "specific" class is a handful of rare ids. The in-context definition separates the classes (a shared token is
# the same id in the same local context); the cell below prints both shares and what each can test.

# %%
print(f"context definition: k = {R.batches['context_k']} preceding tokens (rule: the smallest k whose specific "
      "share is ≥ 20% in both pools)")
print("\n".join(fig04_claims.class_share_lines(R.thesis_shares, R.batches["context_k"])))
R.thesis_shares.pivot(index=["defn", "k"], columns="pool", values="specific_share").round(3)

# %%
T, TC = R.thesis, fig04_claims.thesis_claims(R.thesis, R.thesis_fidelity, R.batches["context_k"])
print("no group holds both classes: nothing to compare on this profile" if T.empty else "")
fig04_claims.thesis_view(T)

# %% [markdown]
# How well the first-order terms (LM-head kernel) track the measured full-parameter step:

# %%
R.thesis_fidelity.round(3)

# %%
fig = fig04_plots.thesis(T, TC)
plots.save(fig, "fig04_thesis", fig_dir)
plt.show()

# %%
print("\n".join(fig04_claims.thesis_report(R.thesis, TC)))

# %% [markdown]
# ## Which reading the thesis rows support
# Read off the rows above (never typed by hand): per definition of "shared", whether the data support the
# paper's reading (shared tokens lose reinforcement, and more than specific ones), the alternative (specific
# tokens amplified, shared ones keeping their gain within 1 ± 0.25), or neither; then the refutation, the
# permuted control and the mechanism.

# %%
print("\n".join(fig04_claims.thesis_reading(TC)))

# %% [markdown]
# ## Claims and reading
# Verdicts from 95% t intervals over batches (paired): Template's share must fall and Reasoning's
# rise under GRPO; fixed-scaffold rows are controls. "Greatly weakens updates on template tokens"
# is also read in absolute mass (GRPO / positive-only, geometric mean over batches):

# %%
rows = fig04_claims.claims(R, P)
print(fig04_claims.mass_reading(rows))
claims.record(results_dir, "04", rows);
