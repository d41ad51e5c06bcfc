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
#   cancellation on purpose (Fig. 7(a)).
#
# The paper trains Qwen models for hundreds of steps and finds (Table 2, Fig. 8): the baseline
# collapses on Qwen2.5-Math-7B, QB and RB each help, **QB+RB is best** on every model, and sign
# partitioning **hurts**. Here every strategy trains the tiny policy from the same checkpoint
# with the same prompts, sampling seeds and evaluation draws, over several seeds; the held-out
# difficulty levels `easy` (2-digit ±), `medium` (3-digit ±) and `hard` (2-digit × 1-digit)
# stand in for the paper's benchmark columns.
#
# Each iteration: sample `n_prompts × G` rollouts at T = 1 (RB: into the buffer, until it
# releases a balanced batch of the same size), group-normalised advantages, the θ_old
# log-probs of the batch by one forward, then `n_minibatches` Adam steps with verl's
# token-mean clipped loss (ε 0.2 / 0.28, dual clip 3, no KL, no entropy bonus); ρ is taken
# against θ_old, so ρ = 1 only on the first mini-batch. Training runs in **float32**: these
# Adam steps move log-probs by 1e-3…1e-1, far above float32 round-off (the float64 of the
# analysis notebooks is for single SGD steps of 1e-8). Every run is cached and checkpointed
# after each iteration; an interrupted notebook resumes where it stopped.

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
model_path = "data/policies/tiny-m"  # the policy every run starts from
dtype = "float32"                   # training precision (Adam steps are large; float32 suffices)
device = "cpu"                      # cpu or cuda
engine = "small"                    # small: the exact trainer of this artifact (tiny reference); trl: TRL GRPOTrainer (paper scale)
threads = 1                         # torch CPU threads per run (fixed: float32 sums depend on it; 1 is robust on a shared CPU)
workers = 1                         # small engine: training runs computed in parallel processes (each with threads), same numbers
strategies = ["random", "QB", "RB", "QB+RB", "sign_partitioned"]  # Table 2 rows (train.STRATEGIES)
seeds = [0, 1, 2]                   # training seeds per strategy (prompts, sampling, plans)
iterations = 16                     # update phases per run
n_prompts = 8                       # prompts per sampling round
G = 8                               # rollouts per prompt
n_minibatches = 4                   # optimizer steps per update phase
lr = 3e-4                           # Adam learning rate
probe_lrs = [1e-3]                  # larger learning rates of the stability sweep, each a separate set of runs
probe_strategies = ["random", "QB+RB"]  # strategies rerun at each of probe_lrs ([] skips the sweep)
probe_seeds = [0]                   # seeds of the stability sweep
tau = 0.4                           # RB: min(N+, N-) at least tau times the batch size
max_rounds = 4                      # RB: sampling rounds per iteration before it skips the update
max_age = 2                         # RB: rounds a buffered rollout may wait before it is discarded
run_rounds = 0                      # RB: sampling rounds for a whole run; above 0 an iteration samples until a batch is released (equal optimizer steps)
temperature = 1.0                   # training sampling temperature
max_new_tokens = 96                 # response length cap
eval_every = 4                      # iterations between held-out evaluations
eval_sets = ["easy", "medium", "hard"]  # held-out sets: difficulty levels (tasks.eval_set) or problem files
eval_n = 64                         # problems per evaluation set
eval_samples = 1                    # samples per problem (avg@k)
eval_temperature = 1.0              # evaluation temperature (1: the temperature the policy trains at)
sample_dtype = ""                   # dtype of the sampler copy; empty: the training model itself (paper: bfloat16)
backend = "hf"                      # sampler: 'hf' or 'vllm' (weights pushed after every update)
gpu_memory_utilization = 0.3        # vLLM's share of GPU memory, beside the training model
problems_path = ""                  # training problems (DAPO-Math-17k / MATH-500 / prompt+answer file); empty: generated arithmetic
prompt_format = "auto"              # 'auto' (chat template when the tokenizer has one), 'chat' or 'raw'
chunk_rows = 64                     # rows per forward chunk
token_chunk = 4096                  # positions per LM-head chunk (bounds the batch x vocabulary tensors)
gradient_checkpointing = False      # recompute activations in the backward (large models)
trl_strategies = ["random", "QB+RB"]  # strategies also trained on TRL (engine.train_trl) as a cross-check ([] skips)
trl_seeds = [0]                     # seeds of the TRL runs

# %%
import logging
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

from cancellation import cache, grpo, plots, policy, tasks, train
from cancellation import claims as C
from cancellation import stats as ST
from cancellation import engine as rl_engine

logging.basicConfig(level=logging.WARNING)
torch.set_num_threads(threads)
Path(results_dir).mkdir(parents=True, exist_ok=True)
CKPT_DIR = cache.DEFAULT_DIR / "ckpt"
CKPT_DIR.mkdir(parents=True, exist_ok=True)
source = tasks.ProblemSource(path=problems_path, prompt_format=prompt_format)
source.load()  # a malformed problem file stops here, before any model loads
set_names = [train.set_name(d) for d in eval_sets]


def config(name, seed, lr=lr):
    return train.strategy_config(
        name, iterations=iterations, n_prompts=n_prompts, G=G, temperature=temperature,
        max_new_tokens=max_new_tokens, tau=tau, max_rounds=max_rounds, max_age=max_age, run_rounds=run_rounds,
        eval_every=eval_every,
        eval_sets=list(eval_sets), eval_n=eval_n, eval_samples=eval_samples, eval_temperature=eval_temperature,
        seed=seed, source=source, backend=backend, sample_dtype=sample_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        update=grpo.UpdateConfig(optimizer="adam", lr=lr, n_minibatches=n_minibatches, chunk_rows=chunk_rows,
                                 token_chunk=token_chunk, gradient_checkpointing=gradient_checkpointing))


def small_runs(jobs):
    """Cached runs of the small trainer (train.cached_train_many: checkpointed every iteration, so
    an interruption resumes; `workers` processes compute the missing ones), one per (name, seed, lr)."""
    outs = train.cached_train_many(model_path, [config(n, s, r) for n, s, r in jobs], workers=workers,
                                   dtype=dtype, device=device, threads=threads)
    return [{k: df.assign(strategy=n, seed=s) for k, df in out.items()} for (n, s, r), out in zip(jobs, outs)]


def trl_out(name, seed, lr=lr):
    """One cached TRL run (engine.train_trl): the raw frames plus the per-step record."""
    params = dict(model=policy.fingerprint(model_path), dtype=dtype, device=device, engine="trl", strategy=name,
                  **{k: v for k, v in train.run_params(config(name, seed, lr)).items() if k != "plan"})

    def compute():
        m, tk = policy.load_policy(model_path, dtype=dtype, device=device)
        out = rl_engine.train_trl(
            model_path, source, name, output_dir=str(CKPT_DIR / "trl"), model=m, tokenizer=tk,
            iterations=iterations, n_prompts=n_prompts, G=G, n_minibatches=n_minibatches, lr=lr,
            max_new_tokens=max_new_tokens, temperature=temperature, tau=tau, max_rounds=max_rounds,
            max_age=max_age, seed=seed, dtype=dtype, use_vllm=backend == "vllm",
            gradient_checkpointing=gradient_checkpointing, eval_every=eval_every,
            eval_fn=lambda mm, tt: train.evaluate(mm, tt, eval_sets, eval_n, eval_samples, eval_temperature,
                                                  max_new_tokens, like=source))
        return {k: out[k] for k in ("evals", "iterations", "minibatches", "monitor", "steps", "eval_times")}

    return cache.cached("train_trl", dict(params, record="steps"), compute)


def trl_run(name, seed, lr=lr):
    """A TRL run as the small trainer's three frames (engine.small_trainer_frames)."""
    out = trl_out(name, seed, lr)
    frames = rl_engine.small_trainer_frames(out, n_minibatches)
    frames["monitor"] = out["monitor"]
    return {k: df.assign(strategy=name, seed=seed) for k, df in frames.items()}


t0 = time.time()
jobs = [(name, s, lr) for name in strategies for s in seeds]
probe_jobs = [(name, s, r) for r in probe_lrs for name in probe_strategies for s in probe_seeds]
if engine == "trl":
    runs, probe = [trl_run(*j) for j in jobs], [trl_run(*j) for j in probe_jobs]
else:  # one pool for both, so the workers stay busy
    both = small_runs(jobs + probe_jobs)
    runs, probe = both[:len(jobs)], both[len(jobs):]
probe = [{k: df.assign(lr=r) for k, df in out.items()} for out, (_, _, r) in zip(probe, probe_jobs)]
wall = time.time() - t0
evals = pd.concat([r["evals"] for r in runs], ignore_index=True)
iters = pd.concat([r["iterations"] for r in runs], ignore_index=True)
mbs = pd.concat([r["minibatches"] for r in runs], ignore_index=True)
avg = evals.groupby(["strategy", "seed", "iteration"], as_index=False).accuracy.mean().assign(set="average")
curves = pd.concat([evals[["strategy", "seed", "iteration", "set", "accuracy"]], avg], ignore_index=True)
cache.write_table(curves, Path(results_dir) / "fig08_training_curves.parquet")
cache.write_table(iters, Path(results_dir) / "fig08_iterations.parquet")
cache.write_table(mbs, Path(results_dir) / "fig07a_minibatches.parquet")
print(f"{len(runs)} runs ({len(strategies)} strategies x seeds {seeds}), {wall:.0f} s in this session "
      f"(0 s means every run came from the cache), torch threads {torch.get_num_threads()}")
if engine == "trl":
    tmon = pd.concat([r["monitor"] for r in runs], ignore_index=True)
    cache.write_table(tmon, Path(results_dir) / "fig08_trl_monitor.parquet")
    print("engine = 'trl': every run below (Fig. 8, Table 2, Fig. 7(a), the lr sweep) is TRL's GRPOTrainer "
          "(engine.train_trl), read back through engine.small_trainer_frames into the small trainer's frames. "
          "Differences from the small trainer's columns:\n- " + "\n- ".join(rl_engine.TRL_FRAME_NOTES))

# %% [markdown]
# ## Where the time goes
# Per iteration: sampling (all rounds, including RB's extra ones), update (θ_old forward plus
# the mini-batch steps) and evaluation, measured when the runs were computed (the machine may
# have been shared, so absolute seconds are upper bounds).

# %%
ev_time = evals.groupby(["strategy", "seed", "iteration"]).seconds.first().groupby("strategy").sum()
timing = iters.groupby("strategy").agg(iterations=("iteration", "size"), rounds=("rounds", "sum"),
                                       sample_s=("t_sample", "sum"), update_s=("t_update", "sum"))
timing["eval_s"] = ev_time
timing["sample_per_iter_s"] = timing.sample_s / timing.iterations
timing["update_per_iter_s"] = timing.update_s / timing.iterations
timing["sample_share"] = timing.sample_s / (timing.sample_s + timing.update_s)
timing = timing.reindex(strategies)
cache.write_table(timing.reset_index(), Path(results_dir) / "table2_timing.csv")
timing.round(2)

# %% [markdown]
# ## Table 2 — final held-out accuracy
# Mean over seeds ± the half-width of a 95% t-interval, at the last iteration; `average` is
# the mean of the difficulty levels within a run. The last columns count rollouts: sampled,
# and (RB only) discarded for age and used later than sampled (delayed).

# %%
final = curves[curves.iteration == iterations]


def ci(x):
    x = np.asarray(x, float)
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


cols = set_names + ["average"]
agg = final.groupby(["strategy", "set"]).accuracy.agg(["mean", ci]).reset_index()
last = iters.sort_values("iteration").groupby(["strategy", "seed"]).last()
counts = iters.groupby(["strategy", "seed"]).rounds.sum().mul(n_prompts * G).groupby("strategy").mean()
table2 = pd.DataFrame(index=pd.Index(strategies, name="strategy"))
table2["QB"] = [train.STRATEGIES[s][0] == "query_preserved" for s in strategies]
table2["RB"] = [train.STRATEGIES[s][1] for s in strategies]
for c in cols:
    a = agg[agg.set == c].set_index("strategy")
    table2[f"{c}_mean"], table2[f"{c}_ci95"] = 100 * a["mean"], 100 * a["ci"]
table2["rollouts_sampled"] = counts
table2["optimizer_steps"] = iters.groupby(["strategy", "seed"]).updated.sum().mul(n_minibatches).groupby("strategy").mean()
for k in ("discarded", "delayed"):
    col = f"buffer_{k}"
    table2[f"rollouts_{k}"] = last[col].groupby("strategy").mean() if col in last else np.nan
table2["n_seeds"] = len(seeds)
start = 100 * curves[(curves.iteration == 0) & (curves.set == "average")].accuracy.mean()
table2 = table2.reset_index()
cache.write_table(table2.round(3), Path(results_dir) / "table2_batching.csv")
shown = table2[["strategy", "QB", "RB"]].copy()
for c in cols:
    shown[c] = [f"{m:.1f} ± {h:.1f}" for m, h in zip(table2[f"{c}_mean"], table2[f"{c}_ci95"])]
shown["rollouts (sampled / discarded / delayed)"] = [
    f"{s:.0f} / {d:.0f} / {y:.0f}" if r else f"{s:.0f}" for s, d, y, r in
    zip(table2.rollouts_sampled, table2.rollouts_discarded.fillna(0), table2.rollouts_delayed.fillna(0), table2.RB)]
shown["optimizer steps"] = table2.optimizer_steps.round(1)
evals_per_set = eval_n * eval_samples
print(f"start (every run's iteration 0): average accuracy {start:.1f}%; {len(seeds)} seeds {seeds}, "
      f"{iterations} iterations x {n_minibatches} Adam steps, lr {lr:g}; evaluation avg@{eval_samples} on "
      f"{eval_n} problems per set (binomial SE of one run's score on one set up to "
      f"{100 * 0.5 / np.sqrt(evals_per_set):.1f} pts)")
steps_equal = table2.optimizer_steps.nunique() == 1
why = ("RB's whole-run sampling budget (run_rounds) ran out before every iteration had released a batch, so the "
       "RB strategies took fewer steps than the others; a larger run_rounds equalises them" if run_rounds else
       "RB skipped updates when its buffer released no batch within max_rounds; run_rounds > 0 keeps it sampling")
print("optimizer steps per run " + ("equal across strategies" if steps_equal else f"differ across strategies ({why})")
      + ": " + ", ".join(f"{s} {v:g}" for s, v in zip(table2.strategy, table2.optimizer_steps)))
if profile == "tiny":
    print("This is the light run of `make figures`. The full test of Table 2 / Fig. 8 (10 seeds, 64 iterations, "
          "equal optimizer steps, avg@4 on 256 problems per set, an lr sweep) is `make table2`: "
          "notebooks/executed/tiny-table2/07_batching.ipynb, figures/tiny-table2/, data/results/tiny-table2/, "
          "and its claims are in the README's table marked (`make table2`).")
shown.style.hide(axis="index")

# %% [markdown]
# ## Stability sweep
# The paper's baseline collapses at its learning rate (Qwen2.5-Math-7B) while QB+RB keeps
# training. The same strategies at each of `probe_lrs` (seeds `probe_seeds`), beside their runs
# at `lr`: final average held-out accuracy, runs collapsed (final average below half the starting
# accuracy) and optimizer steps taken. RB cannot recover from a collapse by construction: with no
# correct rollouts left it never releases a batch, so the policy stops changing.

# %%
sweep = pd.DataFrame()
if probe:
    pe = pd.concat([r["evals"] for r in probe], ignore_index=True)
    pit = pd.concat([r["iterations"] for r in probe], ignore_index=True)
    at_lr = lambda df: df[df.strategy.isin(probe_strategies) & df.seed.isin(probe_seeds)].assign(lr=lr)  # noqa: E731
    se = pd.concat([at_lr(evals), pe], ignore_index=True)
    cache.write_table(pe, Path(results_dir) / "fig08_probe_evals.parquet")
    fin = (se[se.iteration == iterations].groupby(["strategy", "lr", "seed"]).accuracy.mean().rename("final")
           .reset_index())
    steps_ = (pd.concat([at_lr(iters), pit]).groupby(["strategy", "lr", "seed"]).updated.sum()
              .mul(n_minibatches).rename("optimizer_steps").reset_index())
    sweep = fin.merge(steps_, on=["strategy", "lr", "seed"])
    sweep["collapsed"] = sweep.final < 0.5 * start / 100
    cache.write_table(sweep, Path(results_dir) / "table2_lr_sweep.csv")
    show_sweep = sweep.groupby(["strategy", "lr"]).agg(
        final_avg=("final", lambda x: f"{100 * x.mean():.1f} ± {100 * ST.t_interval(x)[2] - 100 * x.mean():.1f}"
                   if len(x) > 1 else f"{100 * x.mean():.1f}"),
        collapsed=("collapsed", lambda x: f"{int(x.sum())}/{len(x)}"),
        optimizer_steps=("optimizer_steps", "mean")).unstack("strategy")
    print(f"start: average {start:.1f}%; seeds {probe_seeds}; final average ± 95% t half-width over seeds")
    display(show_sweep)

# %% [markdown]
# ## Fig. 8 — training curves
# Held-out accuracy per difficulty and on average vs iteration (mean over seeds, band = ±1
# standard error), plus the training batch's reward and the policy's mean token entropy on it.

# %%
import matplotlib.pyplot as plt

COLORS = dict(zip(train.STRATEGIES, [plots.PALETTE[i] for i in (7, 0, 4, 2, 1)]))


def band(ax, df, x, y, name, **kw):
    g = df.groupby(x)[y]
    m, se = g.mean(), g.std(ddof=1).fillna(0) / np.sqrt(g.size())
    ax.plot(m.index, m.values, color=COLORS[name], label=name, lw=1.3, **kw)
    ax.fill_between(m.index, m - se, m + se, color=COLORS[name], alpha=0.15, lw=0)


acc_panels = cols if len(set_names) > 1 else set_names  # one held-out set: its average is itself
n_panels = len(acc_panels) + 2
fig, axes = plots.figure(ncols=3, nrows=-(-n_panels // 3), width=plots.WIDTH_2COL, height=1.95 * -(-n_panels // 3),
                         squeeze=False)
flat = list(axes.flat)
for ax, c in zip(flat, acc_panels):
    for name in strategies:
        band(ax, curves[(curves.strategy == name) & (curves.set == c)], "iteration", "accuracy", name, marker="o", ms=2)
    ax.set(title=f"held-out: {c}", xlabel="iteration", ylabel="accuracy")
upd = iters[iters.updated]
for ax, y, title in ((flat[len(acc_panels)], "batch_acc", "training batch reward"),
                     (flat[len(acc_panels) + 1], "entropy", "token entropy (batch)")):
    for name in strategies:
        band(ax, upd[upd.strategy == name], "iteration", y, name)
    ax.set(title=title, xlabel="iteration")
for ax in flat[n_panels:]:
    ax.set_visible(False)
axes[0, 0].legend(frameon=False, fontsize=6)
fig.tight_layout()
plots.save(fig, "fig08_training_curves", fig_dir)
plt.show()

# %% [markdown]
# ## Fig. 7(a) — what sign partitioning does
# Left: final held-out accuracy, baseline vs sign-partitioned (and QB+RB for reference), per
# difficulty (mean ± 95% interval over seeds). Middle: the gradient norm of each mini-batch
# step — a sign-pure mini-batch has nothing to cancel against, so its gradient is larger than
# a mixed one. Right: how far the policy drifts within an iteration, mean |ρ − 1| at the
# k-th mini-batch step (0 at the first).

# %%
fig, axes = plots.figure(ncols=3, width=plots.WIDTH_2COL, height=2.1)
show = [s for s in ("random", "sign_partitioned", "QB+RB") if s in strategies]
w = 0.8 / len(show)
for i, name in enumerate(show):
    a = agg[agg.strategy == name].set_index("set").reindex(cols)
    axes[0].bar(np.arange(len(cols)) + (i - (len(show) - 1) / 2) * w, 100 * a["mean"], w, yerr=100 * a["ci"],
                color=COLORS[name], label=name, capsize=1.5, error_kw=dict(lw=0.6))
axes[0].axhline(start, color="k", lw=0.6, ls=":", label="start (avg)")
axes[0].set(xticks=np.arange(len(cols)), xticklabels=cols, ylabel="final accuracy (%)", title="held-out accuracy")
axes[0].legend(frameon=False, fontsize=5.5)
mbs["composition"] = np.where((mbs.n_pos > 0) & (mbs.n_neg > 0), "mixed", "one sign")
for name in [s for s in ("random", "sign_partitioned") if s in strategies]:
    d = mbs[mbs.strategy == name]
    gn_ = d.grad_norm[d.grad_norm > 0]  # a mini-batch of only A = 0 rollouts has no gradient
    axes[1].hist(np.log10(gn_), bins=25, histtype="step", lw=1.2, color=COLORS[name], density=True,
                 label=f"{name} ({(d.composition == 'one sign').mean():.0%} one-sign)")
    k = d.groupby("minibatch").ratio_dev.agg(["mean", "sem"])
    axes[2].errorbar(k.index, k["mean"], yerr=k["sem"].fillna(0), color=COLORS[name], marker="o", ms=3, lw=1.2,
                     capsize=2, label=name)
axes[1].set(xlabel="log10 mini-batch gradient norm", ylabel="density", title="update size")
axes[1].legend(frameon=False, fontsize=5.5)
axes[2].set(xlabel="mini-batch step within iteration", ylabel="mean |ρ − 1|", title="drift from θ_old")
axes[2].legend(frameon=False, fontsize=6)
fig.tight_layout()
plots.save(fig, "fig07a_sign_partition", fig_dir)
plt.show()

gn = mbs.groupby(["strategy", "composition"]).grad_norm.median().unstack()
drift = mbs[mbs.minibatch == mbs.minibatch.max()].groupby("strategy").ratio_dev.mean()
print("median mini-batch gradient norm by composition:\n" + gn.round(3).to_string())
print("mean |rho - 1| at the last mini-batch step:\n" + drift.round(4).to_string())

# %% [markdown]
# ## What the numbers say
# The cell below compares each intervention with the baseline on the average column, seed by
# seed (every strategy sees the same prompts and evaluation draws for a given seed, so paired
# differences are the fair comparison), and counts runs that collapsed (final average below
# half the starting accuracy).

# %%
fa = final[final.set == "average"].pivot(index="seed", columns="strategy", values="accuracy")
for name in strategies:
    d = 100 * (fa[name] - fa["random"]) if "random" in fa else pd.Series(dtype=float)
    collapsed = int((fa[name] < 0.5 * start / 100).sum())
    print(f"{name:>16}: final average {100 * fa[name].mean():5.1f}% (per seed "
          + ", ".join(f"{100 * v:.1f}" for v in fa[name]) + f"), vs random {d.mean():+5.1f} pts "
          f"(per seed " + ", ".join(f"{v:+.1f}" for v in d) + f"), collapsed runs {collapsed}/{len(seeds)}")
best = table2.set_index("strategy")["average_mean"].idxmax()
print(f"best average: {best}")

# %% [markdown]
# ## Reading
# Every strategy sees the same prompts and evaluation draws for a given seed, so the claims use
# paired per-seed differences from `random` with t intervals over seeds. At `probe_lrs` the
# sweep above shows whether the baseline and QB+RB collapse; RB stops updating by
# construction once there are no correct rollouts (no balanced batch), which freezes a collapsed
# policy rather than rescuing it. RB's sample cost is in the timing and Table 2 columns above.
# With few seeds and a small evaluation set, differences of a few points are within noise: the
# light run of `make figures` (tiny) is a smoke test of the design, `make table2` is the test.

# %%
rows = []
T2 = f"Table 2 ({len(seeds)} seeds x {iterations} iterations)"  # the run size, in the claim's figure column
T2_SWEEP = f"Table 2, lr sweep ({len(probe_seeds)} seeds x {iterations} iterations)"
for name, sign, stmt in (("QB+RB", 1, "QB+RB beats the baseline"), ("QB", 1, "QB beats the baseline"),
                         ("RB", 1, "RB beats the baseline"), ("sign_partitioned", -1, "sign partitioning hurts")):
    if name in fa and "random" in fa:
        d = 100 * (fa[name] - fa["random"])
        rows.append(C.Claim(f"table2_{name}", T2, stmt, "yes", *ST.t_interval(d), n=len(d),
                            unit="pts vs random (paired)", rule="direction", params=dict(sign=sign),
                            detail=f"final average {100 * fa[name].mean():.1f}% vs random {100 * fa['random'].mean():.1f}%"))
if "random" in fa:
    k = int((fa["random"] < 0.5 * start / 100).sum())
    r, lo, hi, n = ST.proportion(fa["random"] < 0.5 * start / 100)
    rows.append(C.Claim("table2_baseline_collapse", T2, "the baseline is unstable (collapses)", "yes",
                        r, lo, hi, n=n, unit="share of baseline runs collapsed", rule="direction", params=dict(sign=1),
                        detail=f"{k}/{n} collapsed at lr {lr:g} (Clopper–Pearson)"))
for r_ in (probe_lrs if len(sweep) else []):
    at = sweep[sweep.lr == r_].pivot(index="seed", columns="strategy", values="final")
    if "random" in at:
        k = int(sweep[(sweep.lr == r_) & (sweep.strategy == "random")].collapsed.sum())
        pr, lo, hi, n = ST.proportion(sweep[(sweep.lr == r_) & (sweep.strategy == "random")].collapsed)
        rows.append(C.Claim(f"table2_baseline_collapse_lr{r_:g}", T2_SWEEP, f"the baseline collapses at lr {r_:g}",
                            "yes", pr, lo, hi, n=n, unit="share of baseline runs collapsed", rule="direction",
                            params=dict(sign=1), detail=f"{k}/{n} collapsed (Clopper–Pearson)"))
    if "random" in at and "QB+RB" in at:
        d = 100 * (at["QB+RB"] - at["random"])
        rows.append(C.Claim(f"table2_QB+RB_lr{r_:g}", T2_SWEEP, f"QB+RB beats the baseline at lr {r_:g}", "yes",
                            *ST.t_interval(d), n=len(d), unit="pts vs random (paired)", rule="direction",
                            params=dict(sign=1), detail=f"final average {100 * at['QB+RB'].mean():.1f}% vs random "
                            f"{100 * at['random'].mean():.1f}%"))
C.record(results_dir, "07", rows);

# %% [markdown]
# ## The same strategies on an RL engine (TRL)
# `engine.train_trl` runs a strategy inside TRL's `GRPOTrainer` (`BatchingGRPOTrainer`: the same
# plans and RB buffer, the update configured as docs/methods.md says, see `cancellation/engine.py`), with the
# cancellation monitor attached. On the tiny profile this is a cross-check of the small trainer:
# same policy, prompts source, batch shape, learning rate and evaluation; TRL draws its own
# prompts and samples with HF `generate`, so the curves agree in kind, not draw for draw. On the
# paper profile (`engine = "trl"`) every run above — Fig. 8, Table 2, Fig. 7(a), the lr sweep — is
# already this call (vLLM colocated on one GPU; `accelerate launch --config_file
# configs/accelerate_zero2.yaml` across GPUs), read back by `engine.small_trainer_frames`, and this
# section has nothing to compare with: the small trainer is not run there.

# %%
trl_runs = []
if engine == "trl":
    print("engine = 'trl': the runs above are already TRL's; the small trainer is not run, so there is no "
          "small-vs-TRL cross-check on this profile (run the tiny profile for it).")
for name in (trl_strategies if engine == "small" else []):
    for s in trl_seeds:
        out = trl_out(name, s)  # the same cached TRL run the engine="trl" path uses
        trl_runs.append({k: out[k].assign(strategy=name, seed=s) for k in ("evals", "monitor")})
if trl_runs:
    te = pd.concat([r["evals"] for r in trl_runs], ignore_index=True)
    tm = pd.concat([r["monitor"] for r in trl_runs], ignore_index=True)
    cache.write_table(te, Path(results_dir) / "fig08_trl_curves.parquet")
    cache.write_table(tm, Path(results_dir) / "fig08_trl_monitor.parquet")
    tavg = te.groupby(["strategy", "seed", "iteration"]).accuracy.mean().rename("trl").reset_index()
    small = avg[avg.strategy.isin(trl_strategies) & avg.seed.isin(trl_seeds)].rename(columns={"accuracy": "small"})
    both = small.merge(tavg, on=["strategy", "seed", "iteration"], how="outer").sort_values(["strategy", "iteration"])
    print("average held-out accuracy, small trainer vs TRL (same strategy, seed, batch shape, lr):")
    print((both.set_index(["strategy", "seed", "iteration"])[["small", "trl"]] * 100).round(1).to_string())
    mon = tm[tm.conf_bin == "all"].groupby(["strategy", "sign", "status"]).fraction.mean().unstack("status")
    print("cancellation monitor on the TRL runs (mean share per optimizer step):")
    print(mon.round(3).to_string())
