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
# # Fig. 7(a), Fig. 8 and Table 2 — batching interventions in training
#
# *Paper, §4 and App. B.* GRPO frameworks split each sampled rollout batch into mini-batches and
# take one optimizer step per mini-batch. The paper argues the split matters for cancellation:
#
# - **random** (baseline): shuffle rollouts, then split — a query's positive and negative
#   rollouts land in different optimizer steps, so their shared directions no longer cancel;
# - **QB**, query-preserved mini-batching: a query's rollouts always share one step;
# - **RB**, reward-balanced batching: keep sampling into a buffer and update only on a batch
#   with min(N+, N−) ≥ τ|B|; composes with QB (**QB+RB**, whole groups are selected);
# - **sign_partitioned**: positive and negative rollouts in separate mini-batches — breaks
#   cancellation on purpose (Fig. 7(a));
# - two controls, not in the paper: **DS**, DAPO's dynamic sampling (RB's buffer, released once it holds
#   |B| rollouts of mixed groups: no sign quota), and **random+filter** (the baseline's batch with its
#   A = 0 groups dropped, a smaller batch). Part of RB's win could be a batch of mixed groups alone.
#
# The paper trains Qwen models for hundreds of steps and finds (Table 2, Fig. 8): the baseline
# collapses on Qwen2.5-Math-7B, QB and RB each help, **QB+RB is best** on every model, and sign
# partitioning **hurts**. Here every strategy trains the tiny policy from the same checkpoint
# with the same prompts, sampling seeds and evaluation draws, over several seeds; the held-out
# difficulty levels `easy` (2-digit ±), `medium` (3-digit ±) and `hard` (2-digit × 1-digit)
# stand in for the paper's benchmark columns.
#
# Each iteration: sample `n_prompts × G` rollouts at T = 1 (RB: into the buffer, until it releases a
# balanced batch of the same size), group-normalised advantages, the θ_old log-probs by one forward,
# then `n_minibatches` Adam steps with verl's token-mean clipped loss (ε 0.2 / 0.28, dual clip 3, no
# KL, no entropy bonus); ρ = 1 only on the first mini-batch. Training runs in **float32**: these Adam
# steps move log-probs by 1e-3…1e-1, far above float32 round-off. Runs are cached and checkpointed.

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
replot = ""                         # a results folder to redraw from, computing nothing (set by the runner: --replot)
params = {}                         # values of figures.fig07.Params (set by the runner from the profile and -p)

# %%
import logging

import matplotlib.pyplot as plt
from cancellation import claims, plots
from cancellation.figures import fig07, fig07_claims, fig07_plots
from IPython.display import HTML

logging.basicConfig(level=logging.WARNING)
P = fig07.Params(**params)   # every parameter, its default, doc and allowed range: lib/cancellation/figures/fig07.py
if replot:   # make plots: the Result read back from the tables the last run wrote, nothing computed
    R = fig07.load(replot, P)
else:
    R = fig07.compute(P)         # every training run (each cached and checkpointed on its own), then the tables
    R.write(results_dir, P)
print(plots.use_profile(profile, P), fig07_claims.summary(R), sep="\n")   # the profile stamp every figure below carries
R.timing.round(2)  # where the time goes, seconds as measured when each run was computed (RB's extra rounds included)

# %% [markdown]
# ## Table 2 — final held-out accuracy
# Mean over seeds ± 95% t half-width at the last iteration; `average`: the mean of the levels within a run.
# The last columns count rollouts: sampled, and (RB only) discarded for age and used later (delayed).

# %%
print(fig07_claims.table2_summary(R, P))
if profile == "tiny":
    print(fig07_claims.LIGHT_RUN_NOTE)
HTML(fig07_claims.table2_html(R))

# %% [markdown]
# ## The same rollout budget
# Table 2 gives every strategy the same optimizer steps, so RB samples several times the baseline's
# rollouts. `budget_strategies` are rerun at random's budget (`run_rounds = iterations`), so they take
# fewer steps: final average held-out accuracy per seed, beside random's on the same seed.

# %%
print(fig07_claims.equal_rollouts(R))

# %% [markdown]
# ## Stability sweep
# The paper's baseline collapses (Qwen2.5-Math-7B) while QB+RB keeps training. The same strategies at
# `probe_lrs` (seeds `probe_seeds`) beside `lr`: final average, runs collapsed (below half the start), steps.
# The figure (`table2_lr_sweep`, named after the table it plots) shows every run of the sweep.

# %%
if (sweep := fig07_claims.sweep_shown(R)) is not None:
    print(f"start: average {R.start:.1f}%; seeds {P.probe_seeds}; final average ± 95% t half-width over seeds")
    display(sweep)
# the light run says so on its figures (tiny is a smoke test; tiny-table2, `make table2`, is the test)
light = (f"light run ({len(P.seeds)} seeds x {P.iterations} iterations): a smoke test; the full test is make table2 "
         "(figures/tiny-table2/)") if profile == "tiny" else None
if (fig := fig07_plots.lr_sweep(R, note=light)) is not None:   # where collapse happens: every run of the sweep
    plots.save(fig_dir, "table2_lr_sweep", fig)
    plt.show()

# %% [markdown]
# ## Fig. 8 — training curves
# Small multiples: one column per strategy, drawn beside the baseline (random, black); rows are the held-out
# accuracy per difficulty and on average (evaluated every `eval_every` iterations: the dots), the batch reward and
# the token entropy; mean over seeds, band = 95% t interval over seeds. The x-axis counts iterations: a column's
# title gives the rollouts it sampled vs the baseline's.

# %%
fig = fig07_plots.training_curves(R, P.strategies, note=light)   # lib/cancellation/figures/fig07_plots.py
plots.save(fig_dir, "fig08_training_curves", fig)
plt.show()

# %% [markdown]
# ## Fig. 7(a) — what sign partitioning does
# (i) final held-out accuracy, baseline vs sign-partitioned (and QB+RB for reference), per difficulty
# (mean ± 95% interval over seeds). (ii) the gradient norm ‖g_B‖ of each mini-batch step — a sign-pure mini-batch has
# nothing to cancel against, so the cancellation reading expects a larger gradient than a mixed one's (the line
# below says whether it is); this is the norm itself, not Eq. 14's scatter Σ_B (T_B/T)‖g_B − g‖² (that is the
# local-imbalance table below). (iii) the drift within an iteration, mean |ρ − 1| (95% t) at the k-th step.

# %%
fig = fig07_plots.sign_partition(R, P.strategies)
plots.save(fig_dir, "fig07a_sign_partition", fig)
plt.show()
print(fig07_claims.sign_pure_reading(R), "median mini-batch gradient norm by composition:", R.grad_norm.round(3).to_string(),
      "mean |rho - 1| at the last mini-batch step:", R.drift.round(4).to_string(), sep="\n")

# %% [markdown]
# ## Eq. 14 — local imbalance, on each seed's first batch
# Grouped, a query's cross terms Σ_{i≠j} A_i A_j = −Σ A_i² are negative; a mini-batch with part of it has
# S_B² − Σ_{i∈B} A_i². Per plan: the cross mass kept (random's closed form beside it), the share of cells with
# S_B ≠ 0, the scatter of the mini-batch gradients around the whole batch's (all at the starting θ), also vs QB,
# and its part along the direction a split query's rollouts share (`shared_sq`: S_B times their mean score).

# %%
print(fig07.imbalance_table(R).round(3).to_string() if R.imbalance is not None else "skipped (imbalance_plans: 0)")

# %% [markdown]
# ## The same strategies on an RL engine (TRL)
# `engine.train_trl` runs a strategy inside TRL's `GRPOTrainer` (`BatchingGRPOTrainer`: the same plans and RB
# buffer, the update of docs/methods.md), with the cancellation monitor attached. On the tiny profile this
# cross-checks the small trainer (same policy, batch shape, lr and evaluation; TRL draws its own prompts, so the
# curves agree in kind, not draw for draw). On the paper profile (`engine = "trl"`) every run above already is
# this call (vLLM colocated; `accelerate launch --config_file configs/accelerate_multi.yaml` across GPUs).

# %%
print(fig07_claims.cross_check(R, P))

# %% [markdown]
# ## What the numbers say
# Every strategy sees the same prompts and evaluation draws for a given seed, so each one is compared
# with the baseline seed by seed (paired differences, t intervals over seeds), with its collapsed runs
# (final average below half the start). RB stops updating once there are no correct rollouts (it freezes a
# collapsed policy). With few seeds a few points are noise: tiny is a smoke test, `make table2` the test.
# A claim whose rule cannot pass at this profile's runs is not recorded; the lines below say which.

# %%
print(fig07_claims.versus_random(R, P), f"best average: {R.table2.set_index('strategy')['average_mean'].idxmax()}",
      fig07_claims.undecidable(R, P), sep="\n")
claims.record(results_dir, "07", fig07_claims.claims(R, P));
