"""Whole TRL runs as notebook 07 runs them: keyed, cached and checkpointed as the small trainer's runs are
(`train.cached_train`), and fanned out over `--procs N` ranks.

A run is the small trainer's config of the same run (`train.TrainConfig`, the config its cache key holds:
key and run have one source) under a strategy name, plus a `TrlSetup` (the policy, dtype, device, threads,
gradient checkpointing, the Compute knobs and the checkpoint cadence). `trl_arguments` maps the config to
`train_trl`'s arguments; `cached_run` is one cached run (stage.TRAIN_TRL), `run_frames` its output as the
small trainer's frames, `run_many` every run over the ranks. TRL and transformers are imported only when a
run trains or is read back (`runner`, through the package's lazy names).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch

from .. import cache, engine, policy, procs, stage, train
from ..compute import Compute
from ..guard import knob
from .data import micro_batch, micro_rows

# what a cached TRL run keeps of train_trl's output
RECORDS = ("evals", "iterations", "minibatches", "monitor", "steps", "eval_times")


@dataclass(frozen=True)
class TrlSetup:
    """What a TRL run needs beside its config: where it starts and how it computes (none of it in the config)."""
    model_path: str                # the policy every run starts from
    dtype: str                     # training precision
    device: str                    # where it trains
    threads: int                   # torch CPU threads (a run in a fresh process pins them, as compute() does)
    compute: Compute               # the memory knobs (token_chunk bounds TRL's loss forwards)
    save_every: int                # iterations between checkpoints under the run's cache folder (0: none)
    gradient_checkpointing: bool = knob("gradient_checkpointing")   # TRL's activation checkpointing (a memory knob)


def trl_arguments(run: train.TrainConfig) -> dict:
    """`engine.train_trl`'s arguments for the run that small-trainer config `run` describes (the config a TRL run's
    cache key holds, so key and run have one source): the same batch shape, lr, sampling, RB / DS knobs, seed,
    evaluation cadence and backend. TRL has no whole-run budget (`run_rounds`)."""
    return dict(iterations=run.iterations, n_prompts=run.n_prompts, G=run.G, n_minibatches=run.update.n_minibatches,
                lr=run.update.lr, max_new_tokens=run.max_new_tokens, temperature=run.temperature, tau=run.tau,
                max_rounds=run.max_rounds, max_age=run.max_age, seed=run.seed, use_vllm=run.backend == "vllm",
                eval_every=run.eval_every)


def run_inputs(setup: TrlSetup, strategy: str, run: train.TrainConfig) -> dict:
    """The inputs of one TRL run (stage.TRAIN_TRL): the policy's content hash, dtype, device, the strategy and the
    run's config; the micro-batch rows only when token_chunk binds (accumulated micro-batches; else the key is as
    before)."""
    u = run.update
    binds = micro_batch(run.n_prompts, run.G, u.n_minibatches, run.max_new_tokens, u.token_chunk) \
        < run.n_prompts * run.G // u.n_minibatches
    return dict(model=policy.fingerprint(setup.model_path), dtype=setup.dtype, device=setup.device, strategy=strategy,
                run=run, trl_micro_rows=micro_rows(run.max_new_tokens, u.token_chunk) if binds else None)


def is_cached(setup: TrlSetup, strategy: str, run: train.TrainConfig) -> bool:
    """Whether the run is in the cache already."""
    return stage.TRAIN_TRL.is_cached(**run_inputs(setup, strategy, run))


def cached_run(setup: TrlSetup, strategy: str, run: train.TrainConfig) -> dict:
    """One cached TRL run (engine.train_trl): its raw frames plus the per-step record (`RECORDS`). Checkpointed
    every `save_every` iterations under the cache's ckpt/trl/<key>/ (an interrupted run resumes); the checkpoints
    are deleted once the run is cached."""
    inputs = run_inputs(setup, strategy, run)
    out_dir = cache.DEFAULT_DIR / "ckpt" / "trl" / stage.TRAIN_TRL.key(**inputs)  # one per run: runs may overlap
    out_dir.mkdir(parents=True, exist_ok=True)

    def compute():
        m, tk = policy.load_policy(setup.model_path, dtype=setup.dtype, device=setup.device)
        out = engine.train_trl(
            setup.model_path, run.source, strategy, output_dir=str(out_dir), model=m, tokenizer=tk,
            **trl_arguments(run), dtype=setup.dtype, gradient_checkpointing=setup.gradient_checkpointing,
            compute=setup.compute, eval_fn=lambda mm, tt: train.evaluate_run(mm, tt, run),
            save_every=setup.save_every, resume=True)
        return {k: out[k] for k in RECORDS}

    out = stage.TRAIN_TRL.cached(compute, **inputs)
    for ckpt in out_dir.glob("checkpoint-*"):   # the run is cached: its checkpoints have served
        shutil.rmtree(ckpt, ignore_errors=True)
    return out


def run_frames(setup: TrlSetup, strategy: str, run: train.TrainConfig) -> dict:
    """A cached TRL run as the small trainer's three frames (engine.small_trainer_frames) plus its monitor, each
    with the run's strategy and seed."""
    out = cached_run(setup, strategy, run)
    frames = engine.small_trainer_frames(out, run.update.n_minibatches)
    frames["monitor"] = out["monitor"]
    return {k: df.assign(strategy=strategy, seed=run.seed) for k, df in frames.items()}


def run_many(setup: TrlSetup, units: list, what: str = "TRL runs") -> list:
    """`run_frames` of every (strategy, run config) of `units`, in order; with --procs N whole runs over N ranks
    (`procs.fan_out`), each trained on one process, so the frames are the one-process run's whatever N is."""
    return procs.fan_out("cancellation.engine.runs:_ranks", setup, list(units),
                         cuda=str(setup.device).startswith("cuda"), what=what)


def _ranks(setup: TrlSetup, units, local_rank=None) -> list:
    """`procs.fan_out`'s worker: the runs `units`. In a rank each run trains in a child process outside the ranks'
    group (`procs.isolated`: TRL's Accelerator sees one process), so a run is the one-process run whatever N is."""
    if os.environ.get(procs.RANK_ENV):
        return [procs.isolated("cancellation.engine.runs:_pinned", setup, *u) for u in units]
    return [run_frames(setup, *u) for u in units]


def _pinned(setup: TrlSetup, strategy: str, run: train.TrainConfig) -> dict:
    """`run_frames` in a fresh process: torch's CPU threads pinned first, as a figure's compute() pins the
    kernel's (`figures.base.pin_threads`: on the CPU only)."""
    if str(setup.device) == "cpu":
        torch.set_num_threads(setup.threads)
    return run_frames(setup, strategy, run)
