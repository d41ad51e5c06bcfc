"""Small GRPO training runs for the tiny profile.

`delta_run` is a GRPO training run (sample -> advantages -> one GRPO step with a persistent
optimizer) that records, at every step, Δlog p of that step's update on its own batch: the
measurement behind Fig. 1, Fig. 9 and Fig. 10.

`train_run` is a GRPO training loop with mini-batch plans (random / query-preserved /
sign-partitioned), the reward-balanced buffer, held-out evaluation, checkpoints and resume:
the runs behind Fig. 7(a), Fig. 8 and Table 2.

Both, and Fig. 10's `sign_consistency_run`, are one loop, `grpo_loop` (sample rounds, the θ_old forward,
the mini-batch plan, `Step.update()`), and what each does around the update.
"""
from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from . import batching, grpo, measure, rollout, sources, tasks
from . import cache, coupling, policy, procs, seeds, stage, strategies
from .compute import Compute
from .sampler import make_sampler
from .vllm_seam import sync_weights, vllm_rank_kw

log = logging.getLogger(__name__)

# Columns of the per-token table kept for every step of a run (the rest is recomputable).
RUN_COLUMNS = ["step", "rollout", "group", "position", "token_id", "reward", "advantage", "sign", "prob", "entropy",
               "delta", "status"]


class _SamplesThePolicy:
    """What RunConfig and TrainConfig share: nested configs restored from dicts (a config read back
    from JSON or a checkpoint), and the SampleConfig of their training rounds."""

    def __post_init__(self):
        if isinstance(self.source, dict):
            self.source = sources.ProblemSource(**self.source)
        if isinstance(self.update, dict):
            self.update = grpo.UpdateConfig(**self.update)

    def sample_config(self, model=None) -> rollout.SampleConfig:
        return _sample_config(self, model)

    def cache_params(self) -> dict:
        """What a stage's key holds of the run (`run_params`)."""
        return run_params(self)


@dataclass
class RunConfig(_SamplesThePolicy):
    """A GRPO training run that measures each step's Δlog p on its own batch."""
    steps: int = 10                 # GRPO steps (one rollout batch each)
    n_prompts: int = 16             # prompts per batch
    G: int = 8                      # rollouts per prompt
    temperature: float = 1.0        # sampling temperature
    max_new_tokens: int = 96        # response length cap
    seed: int = 0                   # seeds prompts and sampling of every step
    eps: float = 1e-6               # boosted/suppressed threshold on Δlog p
    source: sources.ProblemSource = field(default_factory=sources.ProblemSource)  # prompts, rendering and verifier
    backend: str = "hf"             # sampler: 'hf' (the policy itself or a cast copy) or 'vllm' (synced each step)
    hf_sampler: str = "ours"        # the hf backend's path: 'ours', 'transformers' or 'auto' (sampling_path.resolve)
    sample_dtype: str = ""          # dtype of the sampler copy; "" samples from the training model itself
    gpu_memory_utilization: float = rollout.GPU_MEMORY_UTILIZATION  # vLLM's share of GPU memory (beside the model)
    sample_rows: int = 256          # rollouts per HF sampler call: bounds the sampler's KV cache
    update: grpo.UpdateConfig = field(default_factory=grpo.UpdateConfig)  # the GRPO update



def _sample_config(cfg, model=None) -> rollout.SampleConfig:
    """The SampleConfig of a run's training rounds (`rollout.run_sample_config`: the run's sizes, sampler and
    seed), its device and dtype following the model."""
    dev = str(next(model.parameters()).device) if model is not None else "cpu"
    dt = cfg.sample_dtype or (str(next(model.parameters()).dtype).removeprefix("torch.") if model is not None
                              else "float32")
    return rollout.run_sample_config(cfg, device=dev, dtype=dt, token_chunk=cfg.update.token_chunk)


class PolicySampler:
    """Samples from the current policy during training.

    'hf': the training model itself when the sample dtype is its own dtype (the tiny profile), else a
    cast copy whose weights are refreshed after every update; 'vllm': a vllm.LLM over the same
    checkpoint whose weights are pushed from the training model after every update.
    """

    def __init__(self, model, model_path, scfg: rollout.SampleConfig):
        self.scfg = scfg
        own = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.shared = scfg.backend == "hf" and scfg.dtype == own
        self.engine = model if self.shared else make_sampler(
            model, model_path, scfg.backend, scfg.dtype, scfg.seed, scfg.gpu_memory_utilization)

    @torch.no_grad()
    def sync(self, model):
        """Make the sampler's weights those of `model` (after an update)."""
        if self.shared:
            return
        if self.scfg.backend == "vllm":
            sync_weights(self.engine, model)
        else:  # load_state_dict casts to the copy's dtype
            self.engine.load_state_dict(model.state_dict())

    def sample(self, tok, problems, seed: int) -> rollout.RolloutBatch:
        return rollout.sample(self.engine, tok, self.scfg, problems=problems, seed=seed)


@dataclass
class Step:
    """One iteration of `grpo_loop`: its sampling rounds, the batch they released (None: a buffer released
    none), the θ_old statistics and mini-batch plan of that batch, and `update()`, which takes the step."""
    it: int
    drawn: list                     # the rounds sampled this iteration (RolloutBatch each)
    batch: rollout.RolloutBatch | None
    t_sample: float                 # seconds spent sampling
    old: measure.TokenStats | None = None   # log-probs and entropies before the update (θ_old of the ratio)
    plan: list | None = None        # the mini-batches (row indices) of the update
    t_old: float = 0.0              # seconds of the θ_old forward and the plan
    take: Callable[[], list] | None = field(default=None, repr=False)   # the update (set by grpo_loop)

    def update(self) -> list[dict]:
        """One optimizer step per mini-batch of `plan` (`minibatch_update`), then the sampler takes the new
        weights; the per-mini-batch infos ([] when the plan is empty: random_filter on a zero-variance batch)."""
        return self.take()


def grpo_loop(model, tok, cfg, opt, sampler, st: dict, iterations: int, *, plan: str = "random",
              plan_seed: str = "plan", buffer=None, cap=lambda st: 1, desc: str = "", progress: bool = True):
    """The one GRPO loop: every run of the library (a Δlog p run, the sign-consistency run, Table 2's
    strategy runs) is this loop and what its caller does around `Step.update()`.

    For each iteration from st['iteration'] to `iterations`: sample rounds (round r's problems and
    sampling seeds from `rollout.round_seeds(cfg.seed, r)`; with a `buffer`, until it releases a batch or
    `cap(st)` rounds), take the batch's θ_old statistics with one forward, split it by `plan` (seeded by
    seeds.derive(cfg.seed, plan_seed, it)), and yield a `Step`. The caller measures what it needs, calls
    `step.update()` at most once, and advances st['iteration'] (a checkpoint holds `st`). `st['round']`
    counts the rounds drawn."""
    def sample(r, k):
        pseed, sseed = rollout.round_seeds(cfg.seed, r)
        return sampler.sample(tok, cfg.source.draw(cfg.n_prompts, pseed), sseed)

    for it in tqdm(range(st["iteration"], iterations), desc=desc, disable=not progress, initial=st["iteration"],
                   total=iterations):
        t0 = time.time()
        batch, drawn = batching.sample_until_release(sample, buffer, st["round"], cap(st))
        st["round"] += len(drawn)
        step = Step(it=it, drawn=drawn, batch=batch, t_sample=time.time() - t0)
        if batch is not None:
            t1 = time.time()
            step.old = measure.token_stats(model, batch, cfg.update)
            step.plan = batching.make_plan(plan, batch.group, batch.advantage, cfg.update.n_minibatches,
                                           seed=seeds.derive(cfg.seed, plan_seed, it))
            step.t_old = time.time() - t1

            def take(step=step):
                infos = minibatch_update(model, step.batch, step.plan, step.old.logp, opt, cfg.update) \
                    if step.plan else []
                sampler.sync(model)
                return infos
            step.take = take
        yield step


def _run_loop(model, tokenizer, cfg: RunConfig, desc: str, progress: bool, model_path):
    """`grpo_loop` for a RunConfig: cfg.steps steps, one batch each, the random plan seeded per step
    ('grpo_step', as these runs were first cached), a persistent optimizer. `model_path` is needed only by a
    vLLM sampler (it loads the checkpoint, then takes our weights)."""
    opt = grpo.make_optimizer(model, cfg.update)
    cfg.source.load()  # a bad problem file fails here, before any sampling
    sampler = PolicySampler(model, model_path, cfg.sample_config(model))
    return grpo_loop(model, tokenizer, cfg, opt, sampler, dict(iteration=0, round=0), cfg.steps, plan_seed="grpo_step",
                     desc=desc, progress=progress)


def delta_run(model, tokenizer, cfg: RunConfig, progress: bool = True, on_step=None, model_path=None) -> pd.DataFrame:
    """Train `model` in place for cfg.steps GRPO steps (`grpo_loop`); return the per-token table of every step.

    At each step the loop's θ_old forward gives the log-probs before the update, and a second forward
    after it. `on_step(step, model, batch, before, after)` may add measurements (it must not update).
    """
    tables = []
    for step in _run_loop(model, tokenizer, cfg, f"GRPO run ({cfg.update.reweight})", progress, model_path):
        batch, before = step.batch, step.old
        infos = step.update()
        after = measure.token_stats(model, batch, cfg.update)
        if on_step is not None:
            on_step(step.it, model, batch, before, after)
        t = measure.token_table(batch, before, after, eps=cfg.eps, step=step.it)
        tables.append(t[RUN_COLUMNS])
        log.info("step %d: acc %.3f, mixed groups %d/%d, loss %.4f", step.it, float(batch.reward.mean()),
                 batch.mixed_groups(), cfg.n_prompts, infos[0]["loss"])
    return pd.concat(tables, ignore_index=True)


def cached_delta_run(model_path, cfg: RunConfig, dtype: str = "float64", device: str = "cpu") -> pd.DataFrame:
    """One cached `delta_run` from the saved policy at `model_path`: its per-token table.

    The key is the policy's content hash, dtype, device and the run's config (`run_params`), so
    every notebook asking for the same run (01's GRPO run, 08's frequency-matched control) reads
    one cache entry.
    """

    def compute():
        model, tok = policy.load_policy(model_path, dtype=dtype, device=device)
        return delta_run(model, tok, cfg, model_path=model_path)
    return stage.DELTA_RUN.cached(compute, model=policy.fingerprint(model_path), dtype=dtype, device=device, run=cfg)


def cached_delta_runs(specs: dict, dtype: str = "float64", device: str = "cpu", check=None) -> dict:
    """`cached_delta_run` of every (model_path, RunConfig) in `specs` (name -> pair), in order: name -> its
    table; `check(name, table)` after each (it may raise: on one process the later runs are not trained).
    With `run --procs N` (N > 1) the runs not cached yet are first trained by N ranks (procs.fan_out,
    `_rank_delta_runs`: a unit is one whole run, cached by its rank, with this process's torch threads; a vLLM
    run in a child outside the ranks' group), then all are read from the cache here: the same tables as on one process, bit for bit (a run depends
    only on its policy, config and seeds; tests/test_procs.py)."""
    key = lambda p, c: dict(model=policy.fingerprint(p), dtype=dtype, device=device, run=c)  # noqa: E731
    todo = list({stage.DELTA_RUN.key(**key(p, c)): (p, c) for p, c in specs.values()
                 if not stage.DELTA_RUN.is_cached(**key(p, c))}.values())   # a run two names share: once
    if procs.count() > 1 and len(todo) > 1:
        if str(device).startswith("cuda"):   # rank 0 trains on this process's GPU: hand back what its cache holds
            gc.collect()
            torch.cuda.empty_cache()
        procs.fan_out("cancellation.train:_rank_delta_runs", dict(dtype=dtype, device=device,
                                                                  threads=torch.get_num_threads()),
                      todo, cuda=str(device).startswith("cuda"), what="Δlog p runs")
    out = {}
    for name, (p, c) in specs.items():
        out[name] = cached_delta_run(p, c, dtype, device)
        if check is not None:
            check(name, out[name])
    return out


def _rank_delta_runs(shared: dict, units: list, local_rank) -> list:
    """One rank's share of `cached_delta_runs`: each (model_path, RunConfig) trained and cached.

    A run that samples with vLLM, in a rank of a group of several, trains in a child process outside the group
    (`procs.isolated`, as 07's TRL runs): built here, its engine would join the group (vllm_seam.vllm_rank_kw, the
    external launcher), and building such an engine is a collective that every rank must enter together. Ranks
    build one engine per run of their share, and the runs do not split evenly (3 runs on 2 ranks): the rank
    with the extra run would wait forever for the others. In the child the engine is one process's, as on
    `--procs 1`, so the run is the one-process run. HF runs (no engine) train here, as before."""
    torch.set_num_threads(shared["threads"])
    for p, c in units:
        if c.backend == "vllm" and vllm_rank_kw():
            procs.isolated("cancellation.train:_isolated_delta_run", p, c, shared["dtype"], shared["device"],
                           shared["threads"])
        else:
            cached_delta_run(p, c, shared["dtype"], shared["device"])
    return [True] * len(units)


def _isolated_delta_run(model_path, cfg: RunConfig, dtype: str, device: str, threads: int) -> bool:
    """`cached_delta_run` in `procs.isolated`'s child (a fresh process: the rank's torch threads set first)."""
    torch.set_num_threads(threads)
    cached_delta_run(model_path, cfg, dtype, device)
    return True


def sign_consistency_run(model, tokenizer, cfg: RunConfig, sgd_lr: float, progress: bool = True,
                         model_path=None) -> pd.DataFrame:
    """A GRPO training run (`grpo_loop`) that, before every step, compares an SGD lm_head step with an SGD
    full step on that step's batch (Fig. 10). Trains `model` in place."""
    out = []
    for step in _run_loop(model, tokenizer, cfg, "sign consistency run", progress, model_path):
        row = coupling.proxy_sign_consistency(model, step.batch, sgd_lr, cfg.eps, Compute.of_update(cfg.update))
        step.update()
        out.append({"step": step.it, "accuracy": float(step.batch.reward.mean()), **row})
    return pd.DataFrame(out)


def run_params(cfg) -> dict:
    """JSON-able parameters of a run (for cache keys): the config, the problem file's content hash
    instead of its path alone."""
    p = asdict(cfg)
    p["source"] = cfg.source.params()
    if not (p.get("reward_balanced") or p.get("dynamic_sampling")):  # run_rounds shapes a buffer's sampling only:
        p["run_rounds"] = 0    # a run without one is the same run whatever it is: one key (and one cache entry)
    stage.without_defaults(p, "run")   # fields added after runs were cached: at their default, the earlier key
    if isinstance(p.get("update"), dict):
        stage.without_defaults(p["update"], "update")
    files = [d for d in getattr(cfg, "eval_sets", ()) if d not in tasks.DIFFICULTIES]
    if files:  # held-out problem files by content too (generated sets keep their keys)
        p["eval_fingerprints"] = {d: eval_source(d, cfg.source).fingerprint() for d in files}
    return p


# --------------------------------------------------------------------------- training with evaluation
# The loop behind Fig. 7(a), Fig. 8 and Table 2: iterations of sample -> advantages -> plan ->
# one optimizer step per mini-batch, with held-out evaluation, checkpoints and resume.

@dataclass
class TrainConfig(_SamplesThePolicy):
    """A GRPO training run with a mini-batch plan, optional RB buffer, and periodic evaluation."""
    iterations: int = 16            # update phases (one released rollout batch each)
    n_prompts: int = 8              # prompts per sampling round
    G: int = 8                      # rollouts per prompt
    temperature: float = 1.0        # sampling temperature
    max_new_tokens: int = 96        # response length cap
    plan: str = "random"            # mini-batch plan: random | query_preserved | sign_partitioned
    reward_balanced: bool = False   # RB: update only on a batch with min(N+, N-) >= tau |B|
    dynamic_sampling: bool = False  # DS (DAPO): update only on a batch of |B| rollouts of mixed groups
    tau: float = 0.4                # RB quota of either sign
    max_rounds: int = 4             # RB/DS: sampling rounds per iteration before it gives up (no update)
    max_age: int = 2                # RB/DS: rounds a buffered rollout may wait before it is discarded
    run_rounds: int = 0             # RB/DS: sampling rounds for the whole run; >0: an iteration samples until the buffer releases (equal optimizer steps across strategies) while the run has rounds left; 0: max_rounds per iteration
    eval_every: int = 4             # iterations between evaluations (and one before training)
    eval_sets: list = field(default_factory=lambda: list(tasks.DIFFICULTIES))  # held-out difficulties or problem files
    eval_n: int = 64                # problems per evaluation set
    eval_samples: int = 1           # samples per problem (avg@k)
    eval_temperature: float = 1.0   # evaluation sampling temperature
    seed: int = 0                   # seeds prompts, sampling and plans (evaluation draws are seed-free)
    source: sources.ProblemSource = field(default_factory=sources.ProblemSource)  # training prompts, rendering, verifier
    backend: str = "hf"             # sampler: 'hf' or 'vllm' (synced after every iteration)
    hf_sampler: str = "ours"        # the hf backend's path: 'ours', 'transformers' or 'auto' (sampling_path.resolve)
    sample_dtype: str = ""          # dtype of the sampler copy; "" samples from the training model itself
    gpu_memory_utilization: float = rollout.GPU_MEMORY_UTILIZATION  # vLLM's share of GPU memory
    update: grpo.UpdateConfig = field(default_factory=lambda: grpo.UpdateConfig(n_minibatches=4))

    def __post_init__(self):
        if self.plan not in batching.PLANS:
            raise ValueError(f"TrainConfig.plan={self.plan!r}; allowed: {', '.join(batching.PLANS)}")
        if self.reward_balanced and self.dynamic_sampling:
            raise ValueError("TrainConfig: reward_balanced and dynamic_sampling are two release rules of one "
                             "buffer; choose one")
        super().__post_init__()

    @property
    def buffered(self) -> bool:
        """Sampling goes through the buffer (RB or DS): an iteration may sample several rounds."""
        return self.reward_balanced or self.dynamic_sampling

    @property
    def query_preserved(self) -> bool:
        """The plan keeps each query's rollouts in one mini-batch (`strategies.keeps_queries_whole`), so the
        buffer releases whole groups (QB+RB)."""
        return strategies.keeps_queries_whole(self.plan)

    @property
    def label(self) -> str:
        return self.plan + ("+RB" if self.reward_balanced else "+DS" if self.dynamic_sampling else "")


STRATEGY_FIELDS = ("plan", "reward_balanced", "dynamic_sampling")   # what a registered strategy sets of a TrainConfig


def strategy_config(name: str, params=None, **kw) -> TrainConfig:
    """The TrainConfig of registered strategy `name` (`cancellation.strategies`: its plan and release rule).
    The other fields: every TrainConfig field that `params` (e.g. notebook 07's Params, passed whole) has by
    the same name, a list copied, then `kw`."""
    s = strategies.lookup(name, "small")
    taken = {} if params is None else {
        f.name: list(v) if isinstance(v := getattr(params, f.name), list) else v
        for f in fields(TrainConfig) if f.name not in STRATEGY_FIELDS and hasattr(params, f.name)}
    return TrainConfig(plan=s.plan, reward_balanced=s.reward_balanced, dynamic_sampling=s.dynamic_sampling,
                       **{**taken, **kw})


def set_name(name: str) -> str:
    """Display name of a held-out set: a difficulty as is, a problem file by its stem."""
    from pathlib import Path
    return name if name in tasks.DIFFICULTIES else Path(name).stem


def eval_source(name: str, like: sources.ProblemSource | None = None) -> sources.ProblemSource:
    """The source of a held-out set: a difficulty of the generated task, or a problem file
    (rendered like the training source `like`)."""
    mode = like.answer_mode if like else "auto"   # graded as the training rewards are
    if name in tasks.DIFFICULTIES:
        return sources.ProblemSource(answer_mode=mode)
    # golds the reward can never credit: the training file's policy (refuse / skip / allow) holds here too
    return sources.ProblemSource(path=name, prompt_format=like.prompt_format if like else "auto", answer_mode=mode,
                               unrewardable_golds=like.unrewardable_golds if like else "refuse")


def eval_problems(name: str, n: int, like: sources.ProblemSource | None = None) -> list:
    """The first `n` problems of a held-out set (the same for every run)."""
    if name in tasks.DIFFICULTIES:
        return tasks.eval_set(name, n)
    return eval_source(name, like).load()[:n]


def evaluate(model, tok, sets, n: int, samples: int = 1, temperature: float = 1.0,
             max_new_tokens: int = 96, like: sources.ProblemSource | None = None, *, token_chunk: int) -> dict:
    """Accuracy (avg@samples) on each held-out set (a difficulty of the generated task or a file).

    The generated sets go through one batched sampling call (fewer decode loops); its seed is
    fixed, so every run and step of a comparison draws with the same random numbers (paired
    differences are less noisy). Each file set is one call with the same fixed seed. `token_chunk`:
    the run's Compute knob (rows per LM-head call of a decode step).
    """
    dev = str(next(model.parameters()).device)
    scfg = lambda src: rollout.SampleConfig(G=samples, temperature=temperature,  # noqa: E731
                                            max_new_tokens=max_new_tokens, device=dev, source=src,
                                            token_chunk=token_chunk)
    out = {}
    gen = [d for d in sets if d in tasks.DIFFICULTIES]
    if gen:
        problems = [p for d in gen for p in eval_problems(d, n)]
        b = rollout.sample(model, tok, scfg(eval_source(gen[0], like)), problems=problems, seed=4242)
        acc = b.reward.reshape(len(gen), -1).mean(1)
        out.update({d: float(a) for d, a in zip(gen, acc)})
    for d in sets:
        if d not in tasks.DIFFICULTIES:
            b = rollout.sample(model, tok, scfg(eval_source(d, like)), problems=eval_problems(d, n, like), seed=4242)
            out[d] = float(b.reward.mean())
    return {set_name(d): out[d] for d in sets}


def evaluate_run(model, tok, cfg: TrainConfig) -> dict:
    """`evaluate` as run `cfg` evaluates: its held-out sets, problems per set, samples, temperature and
    response cap, rendered and graded like its training source, with its update's token_chunk."""
    return evaluate(model, tok, cfg.eval_sets, cfg.eval_n, cfg.eval_samples, cfg.eval_temperature,
                    cfg.max_new_tokens, like=cfg.source, token_chunk=cfg.update.token_chunk)


def minibatch_update(model, batch, plan, old_logp, optimizer, cfg: grpo.UpdateConfig) -> list[dict]:
    """One optimizer step per mini-batch of `plan` (`grpo.grpo_step`), with per-step statistics:
    rows, positive/negative rollouts and gradient norm of each mini-batch.

    ρ is taken against `old_logp`, the iteration's log-probs before its first step, so ρ = 1
    on the first mini-batch and drifts after it.
    """
    s = batching.sign(batch.advantage)
    infos = grpo.grpo_step(model, batch, cfg, optimizer=optimizer, plan=plan, old_logp=old_logp, grad_norm=True)
    return [{**{k: v for k, v in info.items() if k != "grad_norm"}, "n_pos": int((s[rows] > 0).sum()),
             "n_neg": int((s[rows] < 0).sum()), "grad_norm": info["grad_norm"]} for info, rows in zip(infos, plan)]


def _save(path, state):
    """Write a checkpoint atomically under a unique temporary name (cache.atomic_write): an
    interruption never leaves a half-written checkpoint, two runs never share a temporary file."""
    cache.atomic_write(path, lambda tmp: torch.save(state, tmp))


def checkpoint_globals() -> list:
    """The classes a training checkpoint may hold besides tensors and plain containers (RB's buffer
    and its rollouts): the allow-list of `torch.load(weights_only=True)`, which executes nothing else."""
    return [batching.RewardBalancedBuffer, rollout.RolloutBatch, tasks.Problem]


def _load_checkpoint(path):
    """The checkpoint at `path`, or None when there is none; an unreadable one (truncated, not a
    torch file, or holding an object outside `checkpoint_globals()`: a planted pickle is never
    executed) is moved aside to `<path>.corrupt` with a warning naming it, and the run restarts
    (a run is a function of its config, so a restart gives the same result)."""
    import os

    if not path or not os.path.exists(path):
        return None
    try:
        with torch.serialization.safe_globals(checkpoint_globals()):
            ck = torch.load(path, weights_only=True)
        if not isinstance(ck, dict) or not {"config", "model", "optimizer", "torch_rng", "state"} <= set(ck):
            raise ValueError("not a train_run checkpoint")
        return ck
    except Exception as e:  # torch raises several types for a damaged file
        cache.move_aside(path, _load_error(e))
        return None


def _load_error(e: Exception) -> str:
    """One line for a failed checkpoint load (torch's weights-only refusal is a page of advice)."""
    import re
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if "Weights only load failed" in text:
        what = [ln.strip() for ln in text.splitlines() if "Unsupported" in ln]
        return ("holds objects outside the checkpoint allow-list, not executed"
                + (f" ({what[0][:200]})" if what else ""))
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def train_run(model, tok, cfg: TrainConfig, ckpt_path=None, ckpt_every: int = 1, progress: bool = True,
              on_iteration=None, model_path=None, initial_eval: dict | None = None, ckpt_seconds: float = 0.0) -> dict:
    """Train `model` in place; returns {'iterations', 'minibatches', 'evals'} DataFrames.

    Iteration: sample a round of cfg.n_prompts x cfg.G rollouts (with RB: into the buffer, and
    keep sampling until it releases a τ-balanced batch, at most cfg.max_rounds rounds), take the
    θ_old log-probs and entropies with one forward, split by cfg.plan, one optimizer step per
    mini-batch. Every seed derives from (cfg.seed, round or iteration), so the run is a function
    of its config. With `ckpt_path`, the model, optimizer, buffer, counters, RNG state and
    history are saved every `ckpt_every` iterations (and, with `ckpt_seconds`, only once that many
    seconds have passed since the last save; the last iteration always), and a run finds and continues
    its checkpoint: interrupted + resumed == uninterrupted, bit for bit.
    `on_iteration(it, model)` is called after each iteration (after the checkpoint).
    `initial_eval`: the evaluation of the starting policy ({set: accuracy}, e.g. cached: it is the
    same for every run from one checkpoint) used instead of evaluating at iteration 0.
    A second run on the same `ckpt_path` waits for the first (a file lock), then resumes its
    checkpoint; an unreadable checkpoint is moved aside with a warning and the run restarts.
    """
    import contextlib


    opt = grpo.make_optimizer(model, cfg.update)
    cfg.source.load()  # a bad problem file fails here, before any sampling
    for d in cfg.eval_sets:
        if d not in tasks.DIFFICULTIES:
            eval_source(d, cfg.source).load()
    sampler = PolicySampler(model, model_path, cfg.sample_config(model))
    # One run per checkpoint at a time: a second run of the same config waits, then resumes the
    # finished checkpoint (and returns at once) instead of racing the first.
    with cache.lock(ckpt_path) if ckpt_path else contextlib.nullcontext():
        return _train_run(model, tok, cfg, opt, sampler, ckpt_path, (ckpt_every, ckpt_seconds), progress,
                          on_iteration, initial_eval)


def _train_run(model, tok, cfg, opt, sampler, ckpt_path, ckpt_when, progress, on_iteration, initial_eval) -> dict:
    B = cfg.n_prompts * cfg.G
    st = dict(iteration=0, round=0, iters=[], mbs=[], evals=[],
              buffer=batching.RewardBalancedBuffer(B, cfg.tau, cfg.query_preserved, cfg.max_age,
                                                   mixed_groups=cfg.dynamic_sampling)
              if cfg.buffered else None)
    ck = _load_checkpoint(ckpt_path)
    if ck is not None:
        if ck["config"] != run_params(cfg):
            raise ValueError(f"checkpoint {ckpt_path} belongs to another config; delete it or change the path")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sampler.sync(model)
        torch.set_rng_state(ck["torch_rng"])
        st = ck["state"]
        log.info("resumed %s at iteration %d", ckpt_path, st["iteration"])
    saved = time.monotonic()   # the last checkpoint (or the start): ckpt_seconds counts from here

    def do_eval(it):
        t = time.time()
        acc = evaluate_run(model, tok, cfg)
        st["evals"] += [dict(iteration=it, updates=it * cfg.update.n_minibatches, set=d, accuracy=a,
                             seconds=time.time() - t) for d, a in acc.items()]

    if st["iteration"] == 0 and not st["evals"]:
        if initial_eval is None:
            do_eval(0)
        else:
            st["evals"] += [dict(iteration=0, updates=0, set=d, accuracy=a, seconds=0.0) for d, a in initial_eval.items()]

    def cap(st):
        if not cfg.buffered:
            return 1
        if cfg.run_rounds:  # equal optimizer steps: keep sampling while the run's budget lasts
            return max(0, cfg.run_rounds - st["round"])
        return cfg.max_rounds

    for step in grpo_loop(model, tok, cfg, opt, sampler, st, cfg.iterations, plan=cfg.plan, plan_seed="plan",
                          buffer=st["buffer"], cap=cap, desc=f"train {cfg.label} s{cfg.seed}", progress=progress):
        it, batch, drawn = step.it, step.batch, step.drawn
        row = dict(iteration=it, rounds=len(drawn), sampled_acc=float(torch.cat([d.reward for d in drawn]).mean())
                   if drawn else float("nan"), updated=batch is not None, t_sample=step.t_sample)
        if st["buffer"] is not None:
            row.update({f"buffer_{k}": v for k, v in st["buffer"].stats().items()
                        if k in ("discarded", "delayed", "buffered", "sampled", "released")
                        or (k == "filtered" and cfg.dynamic_sampling)})
        if batch is not None:
            t1 = time.time()
            infos = step.update()
            row["updated"] = bool(infos)  # random_filter: a batch of zero-variance groups only takes no step
            s = batching.sign(batch.advantage)
            m = batch.response_mask
            row.update(batch_acc=float(batch.reward.mean()), entropy=float(step.old.entropy[m].mean()),
                       n_rollouts=len(batch), n_pos=int((s > 0).sum()), n_neg=int((s < 0).sum()),
                       n_tokens=int(m.sum()), resp_len=float(m.sum(1).double().mean()),
                       loss=float(np.mean([i["loss"] for i in infos])) if infos else float("nan"),
                       t_update=step.t_old + time.time() - t1)
            st["mbs"] += [dict(i, iteration=it) for i in infos]
        texts = [t for d in drawn for t in d.texts]
        covered = cfg.source.with_answer(texts)
        if covered is not None:   # a problem file: how many sampled responses the reward found an answer in
            row["with_answer"], row["graded"] = covered, len(texts)
        st["iters"].append(row)
        st["iteration"] = it + 1
        if (it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations:
            do_eval(it + 1)
        every, seconds = ckpt_when
        due = (it + 1) % every == 0 and time.monotonic() - saved >= seconds
        if ckpt_path and (due or it + 1 == cfg.iterations):
            _save(ckpt_path, dict(config=run_params(cfg), model=model.state_dict(), optimizer=opt.state_dict(),
                                  torch_rng=torch.get_rng_state(), state=st))
            saved = time.monotonic()
        log.info("iteration %d: %s", it, {k: v for k, v in row.items() if isinstance(v, (int, float))})
        if on_iteration is not None:
            on_iteration(it, model)
    return {"iterations": pd.DataFrame(st["iters"]), "minibatches": pd.DataFrame(st["mbs"]),
            "evals": pd.DataFrame(st["evals"])}


# --------------------------------------------------------------------------- cached runs, in parallel
CKPT_SECONDS = 60.0   # a cached run saves its checkpoint at most once a minute (and at its last iteration)


def _train_inputs(model_path, cfg: TrainConfig, dtype: str, device: str, threads: int) -> dict:
    """The inputs of one small-trainer run (stage.TRAIN_RUN)."""
    return dict(model=policy.fingerprint(model_path), dtype=dtype, device=device, threads=threads, run=cfg)


def cached_train(model_path, cfg: TrainConfig, dtype: str = "float32", device: str = "cpu", threads: int = 1,
                 progress: bool = True) -> dict:
    """One cached `train_run` from the policy at `model_path`: {'iterations', 'minibatches', 'evals'}.

    The key is the policy's content hash, dtype, device, torch threads (float32 sums depend on
    them) and the config. The run is checkpointed under the cache's ckpt/ folder at the end of an
    iteration once CKPT_SECONDS have passed since the last save (every iteration wrote ~11 GB an hour
    per process: 13 MB each, for a resume that loses at most a minute), so an interrupted run resumes;
    the checkpoint is deleted once the result is cached.
    """
    inputs = _train_inputs(model_path, cfg, dtype, device, threads)
    ckpt_dir = cache.DEFAULT_DIR / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / f"{stage.TRAIN_RUN.key(**inputs)}.pt"

    def compute():
        torch.set_num_threads(threads)
        model, tok = policy.load_policy(model_path, dtype=dtype, device=device)
        # iteration 0's evaluation is the same for every run from this policy: computed once
        ev0 = stage.INITIAL_EVAL.cached(
            lambda: evaluate_run(model, tok, cfg),
            model=inputs["model"], dtype=dtype, device=device, threads=threads, sets=list(cfg.eval_sets),
            n=cfg.eval_n, samples=cfg.eval_samples, temperature=cfg.eval_temperature,
            max_new_tokens=cfg.max_new_tokens, source=cfg.source, files=run_params(cfg).get("eval_fingerprints"))
        return train_run(model, tok, cfg, ckpt_path=ckpt, model_path=model_path, progress=progress, initial_eval=ev0,
                         ckpt_seconds=CKPT_SECONDS)

    out = stage.TRAIN_RUN.cached(compute, **inputs)
    ckpt.unlink(missing_ok=True)  # the cached result supersedes the checkpoint
    return out


def _train_worker(args) -> str:
    model_path, cfg, kw = args
    cached_train(model_path, cfg, progress=False, **kw)
    return f"{cfg.label} seed {cfg.seed} lr {cfg.update.lr:g}"


def _extra_worker(args) -> str:
    name, fn, fargs, threads = args
    torch.set_num_threads(threads)
    fn(*fargs)
    return name


def cached_train_many(model_path, cfgs: list[TrainConfig], workers: int = 1, dtype: str = "float32",
                      device: str = "cpu", threads: int = 1, progress: bool = True, extra=()) -> list[dict]:
    """`cached_train` for every config, in order. With `workers` > 1 the runs not cached yet are
    first computed by that many processes (spawned, each with `threads` torch threads, so every
    run gives the same numbers as in one process); a progress bar counts finished runs.

    `extra`: more cached computations for the same pool, (name, is_cached, fn, args) each:
    `is_cached()` (called here) says whether fn(*args) is in the cache already; fn, a module-level
    function, computes and caches it in a worker (its return value is dropped: the caller reads the
    cache afterwards). Without workers they are left to the caller. The pool takes the longer work
    first (`extra`: notebook 07's TRL runs and Eq. 14 take ~50 s each on tiny; then RB runs, which
    sample up to max_rounds per iteration; then the other runs), so no worker idles while the last
    long job finishes; the order changes no number."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    kw = dict(dtype=dtype, device=device, threads=threads)
    if workers > 1:
        todo = [c for c in cfgs if not stage.TRAIN_RUN.is_cached(**_train_inputs(model_path, c, **kw))]
        todo.sort(key=lambda c: not c.buffered)   # stable: RB/DS runs (the longest) first, otherwise in order
        more = [(name, fn, args) for name, is_cached, fn, args in extra if not is_cached()]
        if todo or more:
            with ProcessPoolExecutor(min(workers, len(todo) + len(more)), mp_context=get_context("spawn")) as ex:
                futs = [ex.submit(_extra_worker, (name, fn, args, threads)) for name, fn, args in more]
                futs += [ex.submit(_train_worker, (model_path, c, kw)) for c in todo]
                for f in tqdm(as_completed(futs), total=len(futs), desc=f"training runs ({workers} processes)",
                              disable=not progress):
                    log.info("finished %s", f.result())
    return [cached_train(model_path, c, progress=progress, **kw) for c in cfgs]
