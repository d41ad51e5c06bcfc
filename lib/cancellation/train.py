"""Small GRPO training runs for the tiny profile.

`delta_run` is a GRPO training run (sample -> advantages -> one GRPO step with a persistent
optimizer) that records, at every step, Δlog p of that step's update on its own batch: the
measurement behind Fig. 1, Fig. 9 and Fig. 10.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

from . import grpo, measure, rollout, tasks

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
    from tqdm.auto import tqdm

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
