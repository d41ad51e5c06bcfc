"""Fig. 7(a), Fig. 8 and Table 2 (notebook 07): batching strategies in training.

`compute(P)` trains every strategy over `seeds` at `lr`, the stability sweep's runs at each of
`probe_lrs` and (engine 'small') the TRL cross-check runs, then builds the tables the notebook
shows and writes. Each training run is cached on its own, under the key of the run it is (the
policy's content hash, dtype, device, threads and the run's config: `train.cached_train`, or
`train_trl` for a TRL run) and checkpointed every iteration, so runs are shared between the
strategies' table and the sweep, an interrupted notebook resumes, and changing any parameter
of a run recomputes it; the aggregation on top is cheap and recomputed every time (the wall
time it reports is this session's). The TRL runs are `engine.runs`' (`cached_run`, `run_many`), described by
the small trainer's config of the same run (`_config`) and `trl_setup(P)`. `fig07_claims.claims(R, P)` gives the
notebook's claim rows, and `fig07_claims` writes what it prints (`summary`, `table2_summary`, ...).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

from .. import cache, eq14, extract, policy, rollout, stage, strategies, tasks, train
from .. import engine as rl_engine
from .. import workload as W
from . import base, replot
from .base import param

STRATEGY_NAMES = list(strategies.TABLE2_ROWS)     # the default rows of Table 2 (cancellation.strategies)
STRATEGY_CHOICES = list(strategies.STRATEGIES)     # every registered strategy
SMALL_ONLY = strategies.small_only()               # the strategies TRL does not run (random+filter)
COLORS = strategies.COLORS                         # name -> colour, read off the registry (a live view)


@dataclass
class Params(base.FigureParams):
    """Notebook 07's parameters."""
    CONSTRAINTS = (
        (lambda workers, engine, device: workers == 1 or (engine == 'small' and device == 'cpu'),
         "workers > 1 parallelises the small trainer on the CPU only (set workers: 1 for engine trl or a GPU)"),
        (lambda run_rounds, iterations: run_rounds == 0 or run_rounds >= iterations,
         "run_rounds (a whole run's RB sampling budget) must be 0 or at least iterations"),
        (lambda trl_strategies, engine, strategies, probe_strategies: _trl_runs_all(trl_strategies) and (
            engine == 'small' or _trl_runs_all(strategies + probe_strategies)),
         f"{', '.join(SMALL_ONLY)}: the small trainer only (not wired into TRL)"),
        (lambda engine, budget_strategies: engine == 'small' or not budget_strategies,
         "the equal-rollout-budget arm (budget_strategies) runs on the small trainer only (TRL's RB has no "
         "whole-run budget); set budget_strategies: []"),
    )
    model_path: str = base.model_path(doc="the policy every run starts from")
    dtype: str = base.dtype("float32", "training precision (Adam steps are large; float32 suffices)")
    engine: str = param("small", "small: the exact trainer of this artifact (tiny reference); "
                        "trl: TRL GRPOTrainer (paper scale)", choices=["small", "trl"])
    threads: int = param(1, "torch CPU threads per run (fixed: float32 sums depend on it; 1 is robust on a "
                         "shared CPU)", min=1)
    workers: int = param(1, "small engine: training runs computed in parallel processes (each with threads), "
                         "same numbers", min=1)
    strategies: list = param(list(STRATEGY_NAMES), "Table 2 rows (cancellation.strategies)",
                             choices=STRATEGY_CHOICES, nonempty=True, distinct=True)
    seeds: list = param([0, 1, 2], "training seeds per strategy (prompts, sampling, plans)",
                        min=0, nonempty=True, distinct=True)
    iterations: int = param(16, "update phases per run", min=1)
    n_prompts: int = base.n_prompts(8, "prompts per sampling round")
    G: int = base.G()
    n_minibatches: int = param(4, "optimizer steps per update phase", min=1)
    lr: float = param(3e-4, "Adam learning rate", gt=0)
    probe_lrs: list = param([1e-3], "larger learning rates of the stability sweep, each a separate set of runs",
                            gt=0, distinct=True)
    probe_strategies: list = param(["random", "QB", "RB", "QB+RB"], "strategies rerun at each of probe_lrs "
                                   "([] skips the sweep)",
                                   choices=STRATEGY_CHOICES, distinct=True)
    probe_seeds: list = param([0], "seeds of the stability sweep", min=0, distinct=True)
    budget_strategies: list = param([], "RB strategies rerun at the baseline's rollout budget (run_rounds = "
                                    "iterations: as many sampled rollouts as random, so fewer optimizer steps), "
                                    "paired with random over seeds ([] skips)", choices=["RB", "QB+RB"],
                                    distinct=True)
    imbalance_plans: int = param(4, "Eq. 14: plans drawn per strategy (random, QB, sign-partitioned) on each seed's "
                                 "first batch, each mini-batch's gradient taken at the starting policy (0 skips)", min=0)
    tau: float = param(0.4, "RB: min(N+, N-) at least tau times the batch size", min=0, max=0.5)
    max_rounds: int = param(4, "RB and DS: sampling rounds per iteration before it skips the update", min=1)
    max_age: int = param(2, "RB and DS: rounds a buffered rollout may wait before it is discarded", min=0)
    run_rounds: int = param(0, "RB and DS: sampling rounds for a whole run; above 0 an iteration samples until a batch "
                            "is released (equal optimizer steps)", min=0)
    temperature: float = base.temperature(doc="training sampling temperature")
    max_new_tokens: int = base.max_new_tokens()
    eval_every: int = param(4, "iterations between held-out evaluations", min=1)
    eval_sets: list = param(["easy", "medium", "hard"], "held-out sets: difficulty levels (tasks.eval_set) or "
                            "problem files", path="file-or-choice", choices=["easy", "medium", "hard"],
                            nonempty=True, distinct=True)
    eval_n: int = param(64, "problems per evaluation set", min=1)
    eval_samples: int = param(1, "samples per problem (avg@k)", min=1)
    eval_temperature: float = param(1.0, "evaluation temperature (1: the temperature the policy trains at)", gt=0)
    sample_dtype: str = base.sample_dtype(doc="dtype of the sampler copy; empty: the training model itself "
                                              "(paper: bfloat16)")
    backend: str = base.backend("sampler: 'hf' or 'vllm' (weights pushed after every update)")
    gpu_memory_utilization: float = base.gpu_memory_utilization()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    trl_strategies: list = param(["random", "QB+RB"], "strategies also trained on TRL (engine.train_trl) as a "
                                 "cross-check ([] skips)", choices=STRATEGY_CHOICES, distinct=True)
    trl_seeds: list = param([0], "seeds of the TRL runs", min=0, distinct=True)
    trl_checkpoint_every: int = param(4, "TRL runs: iterations between checkpoints under the run's cache folder "
                                      "(an interrupted run resumes from its last; 0: none); changes no number",
                                      min=0)


def _trl_runs_all(names) -> bool:
    """Every strategy of `names` is wired into TRL (the registry's `trl`; an unknown name is the choices' error)."""
    return all(strategies.STRATEGIES[n].trl for n in names if n in strategies.STRATEGIES)


def with_composition(mbs: pd.DataFrame) -> pd.DataFrame:
    """The mini-batch table with `composition`: 'mixed' when it holds rollouts of both advantage signs, else
    'one sign'."""
    return mbs.assign(composition=np.where((mbs.n_pos > 0) & (mbs.n_neg > 0), "mixed", "one sign"))


def rollout_ratio(R) -> pd.Series:
    """Rollouts each strategy sampled (Table 2's `rollouts_sampled`, mean over seeds) as a multiple of the
    baseline's (random's); NaN without a random row."""
    t = R.table2.set_index("strategy").rollouts_sampled
    return t / t["random"] if "random" in t.index else t * np.nan


TIMING_DIR = "timing"   # <results_dir>/timing/: the runs' wall-clock seconds, which change with every cold run
SECONDS = ("t_sample", "t_update", "seconds")
KEYS = ("strategy", "lr", "seed", "iteration", "set")


def split_seconds(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the table without its wall-clock columns, those columns with the row's keys): results stay
    identical across reruns, the seconds go to <results_dir>/timing/."""
    keys = [c for c in KEYS if c in df.columns]
    secs = [c for c in SECONDS if c in df.columns]
    return df.drop(columns=secs), df[keys + secs]


def join_seconds(results: pd.DataFrame, seconds: pd.DataFrame) -> pd.DataFrame:
    """`split_seconds` undone (`load`): the table with its wall-clock columns back, row for row (their keys must
    agree: a timing table of another run is refused); the seconds come last."""
    keys = [c for c in KEYS if c in seconds.columns]
    if not results[keys].reset_index(drop=True).equals(seconds[keys].reset_index(drop=True)):
        raise replot.ReplotError(f"07: the timing table's rows ({', '.join(keys)}) are not the results table's: "
                                 "run the notebook (make fig07) to write both again")
    return pd.concat([results.reset_index(drop=True), seconds.drop(columns=keys).reset_index(drop=True)], axis=1)


@dataclass
class Result:
    """What Fig. 7(a), Fig. 8 and Table 2 plot and read."""
    runs: dict                   # how many runs, this session's seconds, threads, engine (`fig07_claims.summary(R)`;
                                 # Table 2's lines: `fig07_claims.table2_summary(R, P)`)
    set_names: list              # held-out sets as displayed (a file by its stem)
    cols: list                   # set_names + ['average']
    evals: pd.DataFrame | None   # per (strategy, seed, iteration, set): accuracy, seconds (None when `load`ed:
                                 # only compute reads it)
    iters: pd.DataFrame          # per (strategy, seed, iteration): rounds, updated, batch stats, timing
    minibatches: pd.DataFrame    # per mini-batch step; `composition` (mixed / one sign) added, not written
    curves: pd.DataFrame         # held-out accuracy per (strategy, seed, iteration, set), 'average' included
    timing: pd.DataFrame         # per strategy: sampling / update / evaluation seconds
    agg: pd.DataFrame            # final accuracy per (strategy, set): mean, ci (95% t half-width)
    table2: pd.DataFrame         # Table 2 (unrounded; written rounded to 3 decimals)
    start: float                 # average held-out accuracy at iteration 0 (%)
    final_avg: pd.DataFrame      # final average accuracy, seed x strategy
    probe_evals: pd.DataFrame | None   # the sweep's evaluations (None without a sweep)
    sweep: pd.DataFrame          # per (strategy, lr, seed): final average, optimizer steps, collapsed
    grad_norm: pd.DataFrame      # median mini-batch gradient norm, strategy x composition
    drift: pd.Series             # mean |ρ − 1| at the last mini-batch step, per strategy
    trl_monitor: pd.DataFrame | None = None   # the TRL runs' cancellation monitor (engine 'trl' or the cross-check)
    trl_evals: pd.DataFrame | None = None     # the cross-check's TRL evaluations (engine 'small')
    trl_vs_small: pd.DataFrame | None = None  # average held-out accuracy, small trainer vs TRL
    trl_monitor_shares: pd.DataFrame | None = None  # mean monitor share per (strategy, sign) x status
    budget: pd.DataFrame | None = None  # equal rollout budget: per (strategy, seed) final average, rollouts, steps
    imbalance: pd.DataFrame | None = None  # Eq. 14: per (seed, plan, draw) cross-advantage mass and gradient size

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables (the wall-clock seconds apart, in timing/), and for `load` the runs' counts and
        seconds (replot.save), which no table holds."""
        d = Path(results_dir)
        d.mkdir(parents=True, exist_ok=True)
        t = d / TIMING_DIR   # wall-clock seconds apart from the results: a rerun moves only these
        t.mkdir(exist_ok=True)
        cache.write_table(self.curves, d / "fig08_training_curves.parquet")
        results, seconds = split_seconds(self.iters)
        cache.write_table(results, d / "fig08_iterations.parquet")
        cache.write_table(seconds, t / "fig08_iterations_seconds.parquet")
        cache.write_table(self.minibatches.drop(columns=["composition"]), d / "fig07a_minibatches.parquet")
        cache.write_table(self.timing.reset_index(), t / "table2_timing.csv")
        cache.write_table(self.table2.round(3), d / "table2_batching.csv")
        if self.probe_evals is not None:
            results, seconds = split_seconds(self.probe_evals)
            cache.write_table(results, d / "fig08_probe_evals.parquet")
            cache.write_table(seconds, t / "fig08_probe_evals_seconds.parquet")
            cache.write_table(self.sweep, d / "table2_lr_sweep.csv")
        if self.trl_evals is not None:
            cache.write_table(self.trl_evals, d / "fig08_trl_curves.parquet")
        if self.trl_monitor is not None:
            cache.write_table(self.trl_monitor, d / "fig08_trl_monitor.parquet")
        if self.budget is not None:
            cache.write_table(self.budget, d / "table2_equal_rollouts.csv")
        if self.imbalance is not None:
            cache.write_table(self.imbalance, d / "table2_local_imbalance.csv")
        replot.save(d, P, runs=self.runs)


def _sweep_runs(P: Params) -> bool:
    """Whether P has a stability sweep (compute's probe jobs)."""
    return bool(P.probe_lrs and P.probe_strategies and P.probe_seeds)


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots): the tidy tables read back
    (their wall-clock seconds rejoined from timing/: `join_seconds`), Table 2, the final accuracies, Fig. 7(a)'s
    numbers and the TRL cross-check derived from them by the functions compute uses (`final_tables`,
    `minibatch_tables`, `cross_check_tables`), the runs' counts and seconds restored (`replot.restore`).
    Table 2 comes from the unrounded curves and iterations, not from table2_batching.csv (3 decimals).
    `evals` (the runs' raw evaluations with their seconds) is None: nothing after compute reads it (the
    curves hold its accuracies, table2_timing its seconds)."""
    d, t = Path(results_dir), Path(results_dir) / TIMING_DIR
    kept, tab = replot.restore(d, P), replot.table
    curves = tab(d, "fig08_training_curves.parquet")
    iters = join_seconds(tab(d, "fig08_iterations.parquet"), tab(t, "fig08_iterations_seconds.parquet"))
    timing = tab(t, "table2_timing.csv").set_index("strategy")
    probe_evals, sweep = None, pd.DataFrame()
    if _sweep_runs(P):
        probe_evals = join_seconds(tab(d, "fig08_probe_evals.parquet"), tab(t, "fig08_probe_evals_seconds.parquet"))
        sweep = tab(d, "table2_lr_sweep.csv")   # its optimizer steps are the sweep runs' own: no other table
    more = {}
    if P.engine == "trl":
        more["trl_monitor"] = tab(d, "fig08_trl_monitor.parquet")
    elif P.trl_strategies:
        more.update(cross_check_tables(P, curves, tab(d, "fig08_trl_curves.parquet"),
                                       tab(d, "fig08_trl_monitor.parquet")))
    if P.engine == "small" and P.budget_strategies:
        more["budget"] = tab(d, "table2_equal_rollouts.csv")
    if P.imbalance_plans:
        more["imbalance"] = tab(d, "table2_local_imbalance.csv")
    return Result(runs=kept["runs"], evals=None, iters=iters, curves=curves, timing=timing, probe_evals=probe_evals,
                  sweep=sweep, **final_tables(P, curves, iters),
                  **minibatch_tables(tab(d, "fig07a_minibatches.parquet")), **more)


# ----------------------------------------------------------------------------- the runs
def _config(P: Params, source, name, seed, lr, run_rounds=None) -> train.TrainConfig:
    """The small trainer's config of one run: strategy `name` (the registry's plan and release rule), P's fields
    of the same names passed whole (`train.strategy_config`), this run's seed, the problems, the update at
    `lr` (Adam, P's mini-batches and Compute knobs) and, for the equal-rollout-budget arm, its `run_rounds`."""
    budget = {} if run_rounds is None else {"run_rounds": run_rounds}
    return train.strategy_config(name, P, seed=seed, source=source, hf_sampler=P.hf_path(), **budget,
                                 update=P.compute().update(optimizer="adam", lr=lr, n_minibatches=P.n_minibatches))


def _small_runs(P: Params, source, jobs):
    """Cached runs of the small trainer (train.cached_train_many: checkpointed every iteration, so
    an interruption resumes; `workers` processes compute the missing ones), one per (name, seed, lr[,
    run_rounds]). The same pool computes the TRL cross-check runs and Eq. 14's table, which the
    notebook then reads from the cache (one process would leave the other cores idle meanwhile)."""
    extra, setup = [], trl_setup(P)
    for name in P.trl_strategies:
        for s in P.trl_seeds:
            job = (setup, *_trl_job(P, source, name, s, P.lr))
            extra.append((f"TRL {name} seed {s}", functools.partial(rl_engine.is_cached, *job), rl_engine.cached_run,
                          job))
    if P.imbalance_plans:
        extra.append(("Eq. 14", functools.partial(stage.LOCAL_IMBALANCE.is_cached, **_imbalance_inputs(P, source)[0]),
                      local_imbalance, (P, source)))
    outs = train.cached_train_many(P.model_path, [_config(P, source, *j) for j in jobs],
                                   workers=P.workers, dtype=P.dtype, device=P.device, threads=P.threads, extra=extra)
    return [{k: df.assign(strategy=j[0], seed=j[1]) for k, df in out.items()} for j, out in zip(jobs, outs)]


def trl_setup(P: Params):
    """What P's TRL runs need beside their configs (`engine.TrlSetup`): the policy, dtype, device, threads,
    gradient checkpointing, the Compute knobs and the checkpoint cadence."""
    return rl_engine.TrlSetup(model_path=P.model_path, dtype=P.dtype, device=P.device, threads=P.threads,
                              gradient_checkpointing=P.gradient_checkpointing, compute=P.compute(),
                              save_every=P.trl_checkpoint_every)


def _trl_job(P: Params, source, name, seed, lr) -> tuple:
    """One TRL run of P (`engine.runs`): its strategy and the small trainer's config of the same run."""
    return name, _config(P, source, name, seed, lr)


def admit_eval_sets(P: Params, source) -> None:
    """The held-out problem files of `eval_sets` through the training file's gold check
    (`base.problem_source`): a gold the reward can never credit undercounts every run's accuracy, so it
    is said (or refused, per `unrewardable_golds`) before the first run, one line per file."""
    if policy.dry_run() is not None:
        return
    for name in P.eval_sets:
        if name not in tasks.DIFFICULTIES:
            line = train.eval_source(name, source).admit()
            if line:
                print(f"held-out set {name}: {line}", flush=True)


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    admit_eval_sets(P, source)
    t0 = time.time()
    jobs = [(name, s, P.lr) for name in P.strategies for s in P.seeds]
    probe_jobs = [(name, s, r) for r in P.probe_lrs for name in P.probe_strategies for s in P.probe_seeds]
    # the equal-rollout-budget arm: RB may sample `iterations` rounds in the whole run, random's count
    budget_jobs = [(name, s, P.lr, P.iterations) for name in P.budget_strategies for s in P.seeds]
    budget = []
    if P.engine == "trl":   # --procs N: whole runs over N ranks, each trained on one process (the same tables)
        every = rl_engine.run_many(trl_setup(P), [_trl_job(P, source, *j) for j in jobs + probe_jobs],
                                   what="TRL runs (strategy x seed)")
        runs, probe = every[:len(jobs)], every[len(jobs):]
    else:  # one pool for all, so the workers stay busy
        every = _small_runs(P, source, jobs + probe_jobs + budget_jobs)
        runs, probe, budget = (every[:len(jobs)], every[len(jobs):len(jobs) + len(probe_jobs)],
                               every[len(jobs) + len(probe_jobs):])
    probe = [{k: df.assign(lr=r) for k, df in out.items()} for out, (_, _, r) in zip(probe, probe_jobs)]
    wall = time.time() - t0
    R = _tables(P, runs, probe)
    R.budget = _budget_table(P, budget) if budget else None
    R.imbalance = local_imbalance(P, source) if P.imbalance_plans else None
    R.runs = dict(runs=len(runs) + len(probe) + len(budget), strategies=len(P.strategies), seeds=list(P.seeds),
                  sweep=len(probe), budget=len(budget), seconds=wall, threads=torch.get_num_threads(), engine=P.engine)
    if P.engine == "small" and P.trl_strategies:
        _cross_check(P, source, R)
    return R


def _budget_table(P: Params, runs) -> pd.DataFrame:
    """Per (strategy, seed) of the equal-rollout-budget arm: final average held-out accuracy (the mean of
    the sets at the last iteration), rollouts sampled and optimizer steps taken."""
    rows = []
    for r in runs:
        ev, it = r["evals"], r["iterations"]
        rows.append(dict(strategy=ev.strategy.iloc[0], seed=int(ev.seed.iloc[0]),
                         final=float(ev[ev.iteration == P.iterations].accuracy.mean()),
                         rollouts_sampled=int(it.rounds.sum()) * P.n_prompts * P.G,
                         optimizer_steps=int(it.updated.sum()) * P.n_minibatches))
    return pd.DataFrame(rows)


def _imbalance_inputs(P: Params, source) -> tuple[dict, list]:
    """Eq. 14's inputs (stage.LOCAL_IMBALANCE: the policy, dtype, device, threads, draws and each seed's run
    config) and those configs."""
    # sampled by the HF path on the training model (a vLLM engine here would hold GPU memory beside the runs')
    cfgs = [dataclasses.replace(_config(P, source, "random", s, P.lr), backend="hf") for s in P.seeds]
    return dict(model=policy.fingerprint(P.model_path), dtype=P.dtype, device=P.device, threads=P.threads,
                draws=P.imbalance_plans, plans=strategies.local_imbalance_plans(), runs=cfgs), cfgs


def local_imbalance(P: Params, source) -> pd.DataFrame:
    """Eq. 14 on real batches: for each seed, the batch its runs sample first (the same prompts and
    sampling seeds, from the starting policy), measured by `eq14.local_imbalance` under `imbalance_plans`
    draws of each plan in the registry's Eq. 14 plans (`strategies.local_imbalance_plans()`: random, QB,
    sign-partitioned; draw 0 is the split the run itself used at iteration 0): one row per (seed, plan,
    draw), its columns documented there. Cached under the policy, dtype, device, threads and every seed's
    run config.
    """
    inputs, cfgs = _imbalance_inputs(P, source)

    def compute():
        torch.set_num_threads(P.threads)
        model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
        sampler = train.PolicySampler(model, P.model_path, cfgs[0].sample_config(model))
        rows = []
        for cfg in cfgs:
            pseed, sseed = rollout.round_seeds(cfg.seed, 0)    # the run's first sampling round
            batch = sampler.sample(tok, cfg.source.draw(cfg.n_prompts, pseed), sseed)
            rows += eq14.local_imbalance(model, batch, cfg.update, inputs["plans"], P.imbalance_plans, cfg.seed)
        return pd.DataFrame(rows)

    return stage.LOCAL_IMBALANCE.cached(compute, **inputs)


def scatter_vs_qb(m: pd.DataFrame) -> pd.Series:
    """Each row's grad_var over QB's on the same seed and plan draw (the pairing Eq. 14's rows read)."""
    qb = m[m.strategy == "QB"].set_index(["seed", "draw"]).grad_var
    return pd.Series(m.grad_var.values / qb.reindex(pd.MultiIndex.from_frame(m[["seed", "draw"]])).values, m.index)


def imbalance_table(R: Result) -> pd.DataFrame:
    """Eq. 14 per plan, mean over seeds and draws: the retained cross-advantage mass (and random's
    closed form), the share of cells with S_B ≠ 0, the scatter of the mini-batch gradients
    around the whole batch's (grad_var), also relative to QB's on the same seed and draw, and the
    cross-sign advantage mass kept inside mini-batches (whole batch, within groups)."""
    m = R.imbalance.copy()
    m["grad_var_vs_QB"] = scatter_vs_qb(m)
    m.loc[m.strategy != "random", "retained_expected"] = np.nan   # the closed form is random's
    cols = ["retained", "retained_expected", "sb_nonzero", "grad_var", "grad_var_vs_QB"]
    if "shared_sq" in m:   # tables written before the shared-direction column have none
        m["shared_share"] = m.shared_sq / m.grad_var
        cols += ["shared_sq", "shared_share"]
    cols += [c for c in ("cross_sign", "cross_sign_group") if c in m]   # tables written before: none
    return m.groupby("strategy", sort=False)[cols].mean()


def ci(x):
    x = np.asarray(x, float)
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def coverage_line(iters: pd.DataFrame, P: Params) -> str:
    """One line on the reward's coverage over the runs' sampled responses (a problem file; '' for the
    generated task): how many of the `graded` held an answer the extraction mode finds (`with_answer`, per
    iteration in fig08_iterations), so a low coverage is visible, not discovered."""
    if "with_answer" not in iters:
        return ""
    counted = iters[iters.with_answer.notna()]   # iterations run before the column existed have none
    total = int(counted.graded.sum())   # TRL on N processes: rank 0's shard, as with_answer
    n = int(counted.with_answer.sum())
    mode = extract.FILE_MODE if P.answer_mode == "auto" else P.answer_mode
    return (f"answer coverage (answer_mode {mode}): {n} of {total} sampled responses ({100 * n / max(total, 1):.1f}%) "
            "hold an answer the reward can grade; the rest count as wrong")


def _tables(P: Params, runs, probe) -> Result:
    evals = pd.concat([r["evals"] for r in runs], ignore_index=True)
    iters = pd.concat([r["iterations"] for r in runs], ignore_index=True)
    # an iteration without a step has no batch statistics: NaN (never None), so tables and plots stay numeric
    for c in iters.select_dtypes(include="object").columns:
        if c not in KEYS and iters[c].map(lambda v: v is None or isinstance(v, (int, float))).all():
            iters[c] = pd.to_numeric(iters[c])
    iters["updated"] = iters.updated.astype(bool)
    signal = iters.updated & (iters.n_pos.fillna(0) > 0) & (iters.n_neg.fillna(0) > 0)
    if not signal.any():   # no run took a step on a batch with A > 0 and A < 0: nothing of Fig. 7(a), 8, Table 2
        rows = P.n_prompts * P.G
        total = int(iters.rounds.sum()) * rows
        rewarded = int(round(float((iters.sampled_acc.fillna(0) * iters.rounds).sum()) * rows))
        # graded in the run processes: their coverage, counted from the sampled texts, stands for the grader's report
        raise base.no_signal("07: the training runs", rewarded, total, None, report=coverage_line(iters, P))
    mbs = pd.concat([r["minibatches"] for r in runs], ignore_index=True)
    avg = evals.groupby(["strategy", "seed", "iteration"], as_index=False).accuracy.mean().assign(set="average")
    curves = pd.concat([evals[["strategy", "seed", "iteration", "set", "accuracy"]], avg], ignore_index=True)
    tmon = pd.concat([r["monitor"] for r in runs], ignore_index=True) if P.engine == "trl" else None
    # where the time goes
    ev_time = evals.groupby(["strategy", "seed", "iteration"]).seconds.first().groupby("strategy").sum()
    timing = iters.groupby("strategy").agg(iterations=("iteration", "size"), rounds=("rounds", "sum"),
                                           sample_s=("t_sample", "sum"), update_s=("t_update", "sum"))
    timing["eval_s"] = ev_time
    timing["sample_per_iter_s"] = timing.sample_s / timing.iterations
    timing["update_per_iter_s"] = timing.update_s / timing.iterations
    timing["sample_share"] = timing.sample_s / (timing.sample_s + timing.update_s)
    timing = timing.reindex(P.strategies)
    T2 = final_tables(P, curves, iters)   # Table 2, the final accuracies, the start
    start = T2["start"]
    # the stability sweep
    sweep, pe = pd.DataFrame(), None
    if probe:
        pe = pd.concat([r["evals"] for r in probe], ignore_index=True)
        pit = pd.concat([r["iterations"] for r in probe], ignore_index=True)
        at_lr = lambda df: df[df.strategy.isin(P.probe_strategies) & df.seed.isin(P.probe_seeds)].assign(lr=P.lr)  # noqa: E731
        se = pd.concat([at_lr(evals), pe], ignore_index=True)
        fin = (se[se.iteration == P.iterations].groupby(["strategy", "lr", "seed"]).accuracy.mean().rename("final")
               .reset_index())
        steps_ = (pd.concat([at_lr(iters), pit]).groupby(["strategy", "lr", "seed"]).updated.sum()
                  .mul(P.n_minibatches).rename("optimizer_steps").reset_index())
        sweep = fin.merge(steps_, on=["strategy", "lr", "seed"])
        sweep["collapsed"] = sweep.final < 0.5 * start / 100
    return Result(runs={}, evals=evals, iters=iters, curves=curves, timing=timing, probe_evals=pe, sweep=sweep,
                  trl_monitor=tmon, **T2, **minibatch_tables(mbs))


def set_names_of(P: Params) -> list:
    """The held-out sets as displayed (a file by its stem)."""
    return [train.set_name(d) for d in P.eval_sets]


def final_tables(P: Params, curves: pd.DataFrame, iters: pd.DataFrame) -> dict:
    """Table 2 (unrounded) and what it is read off, from the held-out curves and the iterations (compute and
    `load` share it): the Result's set_names, cols, agg (final accuracy per strategy and set: mean, 95% t
    half-width), table2, start (average accuracy at iteration 0, %) and final_avg (seed x strategy)."""
    set_names = set_names_of(P)
    final = curves[curves.iteration == P.iterations]
    cols = set_names + ["average"]
    agg = final.groupby(["strategy", "set"]).accuracy.agg(["mean", ci]).reset_index()
    last = iters.sort_values("iteration").groupby(["strategy", "seed"]).last()
    counts = iters.groupby(["strategy", "seed"]).rounds.sum().mul(P.n_prompts * P.G).groupby("strategy").mean()
    table2 = pd.DataFrame(index=pd.Index(P.strategies, name="strategy"))
    table2["QB"] = [strategies.STRATEGIES[s].query_preserved for s in P.strategies]
    table2["RB"] = [strategies.STRATEGIES[s].reward_balanced for s in P.strategies]
    for c in cols:
        a = agg[agg.set == c].set_index("strategy")
        table2[f"{c}_mean"], table2[f"{c}_ci95"] = 100 * a["mean"], 100 * a["ci"]
    table2["rollouts_sampled"] = counts
    table2["optimizer_steps"] = iters.groupby(["strategy", "seed"]).updated.sum().mul(P.n_minibatches) \
        .groupby("strategy").mean()
    for k in ("discarded", "delayed"):
        col = f"buffer_{k}"
        table2[f"rollouts_{k}"] = last[col].groupby("strategy").mean() if col in last else np.nan
    table2["n_seeds"] = len(P.seeds)
    start = 100 * curves[(curves.iteration == 0) & (curves.set == "average")].accuracy.mean()
    table2 = table2.reset_index()
    fa = final[final.set == "average"].pivot(index="seed", columns="strategy", values="accuracy")
    return dict(set_names=set_names, cols=cols, agg=agg, table2=table2, start=start, final_avg=fa)


def minibatch_tables(mbs: pd.DataFrame) -> dict:
    """Fig. 7(a)'s numbers from the mini-batch table (compute and `load`): the table with its composition, the
    median gradient norm per strategy and composition, the mean |ρ − 1| at the last mini-batch step."""
    mbs = with_composition(mbs)
    gn = mbs.groupby(["strategy", "composition"]).grad_norm.median().unstack()
    drift = mbs[mbs.minibatch == mbs.minibatch.max()].groupby("strategy").ratio_dev.mean()
    return dict(minibatches=mbs, grad_norm=gn, drift=drift)


def _cross_check(P: Params, source, R: Result) -> None:
    """Engine 'small': the same strategies on TRL (the same cached runs the engine='trl' path uses)."""
    trl_runs, setup = [], trl_setup(P)
    for name in P.trl_strategies:
        for s in P.trl_seeds:
            out = rl_engine.cached_run(setup, *_trl_job(P, source, name, s, P.lr))
            trl_runs.append({k: out[k].assign(strategy=name, seed=s) for k in ("evals", "monitor")})
    te = pd.concat([r["evals"] for r in trl_runs], ignore_index=True)
    tm = pd.concat([r["monitor"] for r in trl_runs], ignore_index=True)
    for k, v in cross_check_tables(P, R.curves, te, tm).items():
        setattr(R, k, v)


def cross_check_tables(P: Params, curves: pd.DataFrame, te: pd.DataFrame, tm: pd.DataFrame) -> dict:
    """The cross-check's fields from the small trainer's curves and the TRL runs' evaluations `te` and monitor
    `tm` (compute and `load`): trl_evals, trl_monitor, trl_vs_small (average held-out accuracy per strategy,
    seed and iteration, small vs TRL) and trl_monitor_shares (mean monitor share per (strategy, sign) x status)."""
    avg = curves[curves.set == "average"].drop(columns="set")   # the mean over the sets per run and iteration
    tavg = te.groupby(["strategy", "seed", "iteration"]).accuracy.mean().rename("trl").reset_index()
    small = avg[avg.strategy.isin(P.trl_strategies) & avg.seed.isin(P.trl_seeds)].rename(columns={"accuracy": "small"})
    both = small.merge(tavg, on=["strategy", "seed", "iteration"], how="outer").sort_values(["strategy", "iteration"])
    shares = tm[tm.conf_bin == "all"].groupby(["strategy", "sign", "status"]).fraction.mean().unstack("status")
    return dict(trl_evals=te, trl_monitor=tm, trl_vs_small=both.set_index(["strategy", "seed", "iteration"])[["small", "trl"]],
                trl_monitor_shares=shares)


def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows, cr = W.Work(), P.n_prompts * P.G, P.chunk_rows
    evals_per_run = P.iterations // P.eval_every + 1
    eval_rows = len(P.eval_sets) * P.eval_n * P.eval_samples
    if P.engine == "trl":   # every run on TRL's GRPOTrainer (engine.train_trl): its own blocks (workload.trl_run)
        jobs = [s for s in P.strategies for _ in P.seeds] + \
            [s for _ in P.probe_lrs for s in P.probe_strategies for _ in P.probe_seeds]
        with w.split("TRL runs (strategy x seed)", len(jobs)):
            for s in jobs:
                W.trl_run(w, P, z, rb=strategies.STRATEGIES[s].reward_balanced)
                W.sample(w, eval_rows, z, times=evals_per_run)   # evaluation: train.evaluate, our sampler
        w.notes.append("TRL runs: transformers' generate, TRL's fused-head log-prob and loss forwards, the "
                       "Trainer's per-run/step/log overhead (workload.trl_run); RB: about two sampling rounds "
                       "per iteration; " + ("the fused head on completions only (Triton)" if W.trl_compact(P)
                                            else "the fused head on every position of the rows (no Triton: CPU)")
                       + ("; backend vllm: TRL's colocated vLLM generates, timed as trl_generate (an upper bound)"
                          if P.backend == "vllm" else ""))
    else:
        runs = len(P.strategies) * len(P.seeds) + len(P.probe_lrs) * len(P.probe_strategies) * len(P.probe_seeds)
        runs += len(P.budget_strategies) * len(P.seeds)   # equal-rollout arm: at most as many rounds
        rb = any(strategies.STRATEGIES[s].reward_balanced for s in P.strategies)
        rounds = P.iterations * (2 if rb else 1)          # RB samples extra rounds: about 2 per iteration
        with w.split("runs (strategy x seed)", runs):
            W.sample(w, rows, z, times=runs * rounds)
            W.analysis(w, rows, z, cr, times=runs * P.iterations)
            W.step(w, "full", rows, z, cr, P.n_minibatches, times=runs * P.iterations)
            W.sample(w, eval_rows, z, times=runs * evals_per_run)
        if rb:
            w.notes.append("RB: about two sampling rounds per iteration")
        trl = [s for s in P.trl_strategies for _ in P.trl_seeds]
        if trl:   # the TRL cross-check runs beside the small trainer's
            with w.split("TRL cross-check runs", len(trl)):
                for s in trl:
                    W.trl_run(w, P, z, rb=strategies.STRATEGIES[s].reward_balanced)
                    W.sample(w, eval_rows, z, times=evals_per_run)
            w.notes.append(f"{len(trl)} TRL cross-check runs (workload.trl_run)")
    d = P.imbalance_plans
    if d:  # Eq. 14: each seed's first batch, and 3 plans x d draws + the whole batch of gradients at θ0
        with w.split("Eq. 14's seeds", len(P.seeds)):
            W.sample(w, rows, z, times=len(P.seeds))
            W.analysis(w, rows, z, cr, times=len(P.seeds))
            W.step(w, "full", rows, z, cr, P.n_minibatches, times=len(P.seeds) * (3 * d + 1))
        w.notes.append(f"Eq. 14: {len(P.seeds)} batches, {3 * d + 1} gradient passes each")
    w.full_grads = w.adam = True
    return w
