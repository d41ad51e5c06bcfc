"""Small GRPO training runs for the tiny profile.

`delta_run` is a GRPO training run (sample -> advantages -> one GRPO step with a persistent
optimizer) that records, at every step, Δlog p of that step's update on its own batch: the
measurement behind Fig. 1, Fig. 9 and Fig. 10.

`train_run` is a GRPO training loop with mini-batch plans (random / query-preserved /
sign-partitioned), the reward-balanced buffer, held-out evaluation, checkpoints and resume:
the runs behind Fig. 7(a), Fig. 8 and Table 2.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import torch

from . import batching, grpo, measure, rollout, tasks

log = logging.getLogger(__name__)

# Columns of the per-token table kept for every step of a run (the rest is recomputable).
RUN_COLUMNS = ["step", "rollout", "group", "position", "token_id", "reward", "advantage", "sign", "prob", "entropy",
               "delta", "status"]


@dataclass
class RunConfig:
    """A GRPO training run that measures each step's Δlog p on its own batch."""
    steps: int = 10                 # GRPO steps (one rollout batch each)
    n_prompts: int = 16             # prompts per batch
    G: int = 8                      # rollouts per prompt
    temperature: float = 1.0        # sampling temperature
    max_new_tokens: int = 96        # response length cap
    seed: int = 0                   # seeds prompts and sampling of every step
    eps: float = 1e-6               # boosted/suppressed threshold on Δlog p
    kinds: list = field(default_factory=lambda: list(tasks.KINDS))  # problem kinds (generated task)
    problems_path: str = ""         # a .parquet/.jsonl of real problems instead (paper profile)
    update: grpo.UpdateConfig = field(default_factory=grpo.UpdateConfig)  # the GRPO update


def delta_run(model, tokenizer, cfg: RunConfig, progress: bool = True, on_step=None) -> pd.DataFrame:
    """Train `model` in place for cfg.steps GRPO steps; return the per-token table of every step.

    At each step: a fresh batch is sampled from the current policy, log-probs are taken by a
    training forward before the update (also θ_old of the clipped ratio), one GRPO step runs
    (cfg.update.n_minibatches optimizer steps), and a second forward gives the log-probs after.
    `on_step(step, model, batch, before, after)` may add measurements (it must not update).
    """
    from tqdm import tqdm

    opt = grpo.make_optimizer(model, cfg.update)
    pool = tasks.load_problems(cfg.problems_path) if cfg.problems_path else None
    verifier = tasks.verifier_for(cfg.problems_path)
    tables = []
    for step in tqdm(range(cfg.steps), desc=f"GRPO run ({cfg.update.reweight})", disable=not progress):
        problems = tasks.draw_problems(cfg.n_prompts, 1_000_003 * (cfg.seed + 1) + step, cfg.kinds, pool)
        batch = rollout.sample_batch(model, tokenizer, problems, G=cfg.G, temperature=cfg.temperature,
                                     max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 7919 + step,
                                     verifier=verifier)
        before = measure.token_stats(model, batch, cfg.update.chunk_rows)
        infos = grpo.grpo_step(model, batch, cfg.update, optimizer=opt, old_logp=before.logp, seed=cfg.seed + step)
        after = measure.token_stats(model, batch, cfg.update.chunk_rows)
        if on_step is not None:
            on_step(step, model, batch, before, after)
        t = measure.token_table(batch, before, after, eps=cfg.eps, step=step)
        tables.append(t[RUN_COLUMNS])
        log.info("step %d: acc %.3f, mixed groups %d/%d, loss %.4f", step, float(batch.reward.mean()),
                 batch.mixed_groups(), cfg.n_prompts, infos[0]["loss"])
    return pd.concat(tables, ignore_index=True)


def run_params(cfg: RunConfig) -> dict:
    """JSON-able parameters of a run (for cache keys)."""
    return asdict(cfg)


# --------------------------------------------------------------------------- training with evaluation
# The loop behind Fig. 7(a), Fig. 8 and Table 2: iterations of sample -> advantages -> plan ->
# one optimizer step per mini-batch, with held-out evaluation, checkpoints and resume.

@dataclass
class TrainConfig:
    """A GRPO training run with a mini-batch plan, optional RB buffer, and periodic evaluation."""
    iterations: int = 16            # update phases (one released rollout batch each)
    n_prompts: int = 8              # prompts per sampling round
    G: int = 8                      # rollouts per prompt
    temperature: float = 1.0        # sampling temperature
    max_new_tokens: int = 96        # response length cap
    plan: str = "random"            # mini-batch plan: random | query_preserved | sign_partitioned
    reward_balanced: bool = False   # RB: update only on a batch with min(N+, N-) >= tau |B|
    tau: float = 0.4                # RB quota of either sign
    max_rounds: int = 4             # RB: sampling rounds per iteration before it gives up (no update)
    max_age: int = 2                # RB: rounds a buffered rollout may wait before it is discarded
    eval_every: int = 4             # iterations between evaluations (and one before training)
    eval_sets: list = field(default_factory=lambda: list(tasks.DIFFICULTIES))  # held-out difficulties
    eval_n: int = 64                # problems per evaluation set
    eval_samples: int = 1           # samples per problem (avg@k)
    eval_temperature: float = 1.0   # evaluation sampling temperature
    seed: int = 0                   # seeds prompts, sampling and plans (evaluation draws are seed-free)
    kinds: list = field(default_factory=lambda: list(tasks.KINDS))  # training problem kinds
    update: grpo.UpdateConfig = field(default_factory=lambda: grpo.UpdateConfig(n_minibatches=4))

    def __post_init__(self):
        if self.plan not in batching.PLANS:
            raise ValueError(f"TrainConfig.plan={self.plan!r}; allowed: {', '.join(batching.PLANS)}")
        if isinstance(self.update, dict):
            self.update = grpo.UpdateConfig(**self.update)


# Table 2's rows: name -> (mini-batch plan, reward-balanced buffer)
STRATEGIES = {"random": ("random", False), "QB": ("query_preserved", False), "RB": ("random", True),
              "QB+RB": ("query_preserved", True), "sign_partitioned": ("sign_partitioned", False)}


def strategy_config(name: str, **kw) -> TrainConfig:
    """A TrainConfig for one of STRATEGIES (other fields from `kw`)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown batching strategy {name!r}; allowed: {', '.join(STRATEGIES)}")
    plan, rb = STRATEGIES[name]
    return TrainConfig(plan=plan, reward_balanced=rb, **kw)


def evaluate(model, tok, sets, n: int, samples: int = 1, temperature: float = 1.0,
             max_new_tokens: int = 96) -> dict:
    """Accuracy (avg@samples) on each held-out set tasks.eval_set(d, n).

    All sets go through one batched sampling call (fewer decode loops); its seed is fixed, so
    every run and step of a comparison draws with the same random numbers (paired
    differences are less noisy).
    """
    problems = [p for d in sets for p in tasks.eval_set(d, n)]
    b = rollout.sample_batch(model, tok, problems, G=samples, temperature=temperature,
                             max_new_tokens=max_new_tokens, seed=4242)
    acc = b.reward.reshape(len(sets), n * samples).mean(1)
    return {d: float(a) for d, a in zip(sets, acc)}


def minibatch_update(model, batch, plan, old_logp, optimizer, cfg: grpo.UpdateConfig) -> list[dict]:
    """One optimizer step per mini-batch of `plan` (grpo.grpo_step, plus per-step statistics).

    ρ is taken against `old_logp`, the iteration's log-probs before its first step, so ρ = 1
    on the first mini-batch and drifts after it.
    """
    params = grpo.scope_params(model, cfg.scope)
    weight = grpo.reweight_advantage(batch, cfg.reweight)
    s = batching.sign(batch.advantage)
    infos = []
    with grpo.only_grad_for(model, params):
        for k, rows in enumerate(plan):
            optimizer.zero_grad(set_to_none=True)
            info = grpo.accumulate_grad(model, batch, rows, old_logp, weight, cfg)
            grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None))
            optimizer.step()
            infos.append(dict(info, minibatch=k, rows=len(rows), n_pos=int((s[rows] > 0).sum()),
                              n_neg=int((s[rows] < 0).sum()), grad_norm=float(grad_norm)))
    return infos


def _save(path, state):
    import os
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: an interruption never leaves a half-written checkpoint


def train_run(model, tok, cfg: TrainConfig, ckpt_path=None, ckpt_every: int = 1, progress: bool = True,
              on_iteration=None) -> dict:
    """Train `model` in place; returns {'iterations', 'minibatches', 'evals'} DataFrames.

    Iteration: sample a round of cfg.n_prompts x cfg.G rollouts (with RB: into the buffer, and
    keep sampling until it releases a τ-balanced batch, at most cfg.max_rounds rounds), take the
    θ_old log-probs and entropies with one forward, split by cfg.plan, one optimizer step per
    mini-batch. Every seed derives from (cfg.seed, round or iteration), so the run is a function
    of its config. With `ckpt_path`, the model, optimizer, buffer, counters, RNG state and
    history are saved every `ckpt_every` iterations, and a run finds and continues its
    checkpoint: interrupted + resumed == uninterrupted, bit for bit.
    `on_iteration(it, model)` is called after each iteration (after the checkpoint).
    """
    import os
    import time

    from tqdm import tqdm

    opt = grpo.make_optimizer(model, cfg.update)
    B = cfg.n_prompts * cfg.G
    st = dict(iteration=0, round=0, iters=[], mbs=[], evals=[],
              buffer=batching.RewardBalancedBuffer(B, cfg.tau, cfg.plan == "query_preserved", cfg.max_age)
              if cfg.reward_balanced else None)
    if ckpt_path and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["config"] != asdict(cfg):
            raise ValueError(f"checkpoint {ckpt_path} belongs to another config; delete it or change the path")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        st = ck["state"]
        log.info("resumed %s at iteration %d", ckpt_path, st["iteration"])

    def do_eval(it):
        t = time.time()
        acc = evaluate(model, tok, cfg.eval_sets, cfg.eval_n, cfg.eval_samples, cfg.eval_temperature,
                       cfg.max_new_tokens)
        st["evals"] += [dict(iteration=it, updates=it * cfg.update.n_minibatches, set=d, accuracy=a,
                             seconds=time.time() - t) for d, a in acc.items()]

    if st["iteration"] == 0 and not st["evals"]:
        do_eval(0)
    name = cfg.plan + ("+RB" if cfg.reward_balanced else "")
    for it in tqdm(range(st["iteration"], cfg.iterations), desc=f"train {name} s{cfg.seed}", disable=not progress,
                   initial=st["iteration"], total=cfg.iterations):
        t0 = time.time()
        batch, rounds, drawn = None, 0, []
        while batch is None and rounds < (cfg.max_rounds if cfg.reward_balanced else 1):
            r = st["round"]
            problems = tasks.draw_problems(cfg.n_prompts, 1_000_003 * (cfg.seed + 1) + r, cfg.kinds)
            b = rollout.sample_batch(model, tok, problems, G=cfg.G, temperature=cfg.temperature,
                                     max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 7919 + r)
            drawn.append(b)
            st["round"], rounds = r + 1, rounds + 1
            if st["buffer"] is None:
                batch = b
            else:
                st["buffer"].add(b, r)
                batch = st["buffer"].release(r)
        t_sample = time.time() - t0
        row = dict(iteration=it, rounds=rounds, sampled_acc=float(torch.cat([d.reward for d in drawn]).mean()),
                   updated=batch is not None, t_sample=t_sample)
        if st["buffer"] is not None:
            row.update({f"buffer_{k}": v for k, v in st["buffer"].stats().items()
                        if k in ("discarded", "delayed", "buffered", "sampled", "released")})
        if batch is not None:
            t1 = time.time()
            old = measure.token_stats(model, batch, cfg.update.chunk_rows)
            plan = batching.make_plan(cfg.plan, batch.group, batch.advantage, cfg.update.n_minibatches,
                                      seed=cfg.seed * 104_729 + it)
            infos = minibatch_update(model, batch, plan, old.logp, opt, cfg.update)
            s = batching.sign(batch.advantage)
            m = batch.response_mask
            row.update(batch_acc=float(batch.reward.mean()), entropy=float(old.entropy[m].mean()),
                       n_rollouts=len(batch), n_pos=int((s > 0).sum()), n_neg=int((s < 0).sum()),
                       n_tokens=int(m.sum()), resp_len=float(m.sum(1).double().mean()),
                       loss=float(np.mean([i["loss"] for i in infos])), t_update=time.time() - t1)
            st["mbs"] += [dict(i, iteration=it) for i in infos]
        st["iters"].append(row)
        st["iteration"] = it + 1
        if (it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations:
            do_eval(it + 1)
        if ckpt_path and ((it + 1) % ckpt_every == 0 or it + 1 == cfg.iterations):
            _save(ckpt_path, dict(config=asdict(cfg), model=model.state_dict(), optimizer=opt.state_dict(),
                                  torch_rng=torch.get_rng_state(), state=st))
        log.info("iteration %d: %s", it, {k: v for k, v in row.items() if isinstance(v, (int, float))})
        if on_iteration is not None:
            on_iteration(it, model)
    return {"iterations": pd.DataFrame(st["iters"]), "minibatches": pd.DataFrame(st["mbs"]),
            "evals": pd.DataFrame(st["evals"])}
