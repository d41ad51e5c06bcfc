"""Measured unit costs of the paper profile's building blocks at the paper's model shapes.

No hub weights can be fetched on a lent GPU (nor in CI), so this builds a randomly initialised
model with the exact architecture of Qwen3-1.7B-Base / Qwen3-4B-Base / Qwen2.5-Math-7B (the
config values of their hub `config.json`) and times, on one synthetic rollout batch of fixed
lengths, the calls the notebooks make: the chunked analysis forward (`measure.token_stats`), a
full-parameter Adam GRPO step and an SGD lm_head step (`grpo.grpo_step`, float32, gradient
checkpointing as in paper.yaml) and HF sampling on a bfloat16 copy (`sampler.generate`, no stop
id, so every row runs to `response` tokens). Cost per token does not depend on the weights'
values, so these numbers hold for the real checkpoints; what they cannot say is how long real
responses are (the paper's run lengths set that).

    python -m cancellation.scale --shape qwen3-1.7b --device cuda --out scale.json   # rows per block
    python -m cancellation.scale --device cuda --out data/scale/<kind>.json          # the planner's units
    python -m cancellation.scale --device cpu --out data/scale/cpu.json              # (stand-in shape)

The planner (`cancellation.plan`) reads the second form: seconds per parameter-token and per call
of each block, so a measurement at one shape predicts another.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

from . import coupling, engine, grpo, manifest, measure, plan, policy, rollout, sources
from . import workload as W
from .compute import Compute
from .guard import _fused_compact
from .policy import TOKENIZER_FILES
from .sampler import generate
from .shapes import SHAPES, Shape, device_kind, device_memory
from .workload import Sizes


def build(shape: str, dtype=torch.float32, device: str = "cuda", seed: int = 0):
    """A random model of the named shape (initialised on `device`: 1.7B float32 is 7 GB)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    kw = dict(SHAPES[shape])
    arch = kw.pop("arch")
    cfg_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cfg_cls(**kw, rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg).to(dtype)
    return model.eval()


def synthetic_batch(n_prompts: int, G: int, prompt: int, response: int, vocab: int, seed: int = 0):
    """A RolloutBatch of random token ids with fixed lengths and mixed 0/1 rewards in every group."""
    g = torch.Generator().manual_seed(seed)
    B, L = n_prompts * G, prompt + response
    ids = torch.randint(0, vocab, (B, L), generator=g)
    resp = torch.zeros(B, L, dtype=torch.bool)
    resp[:, prompt:] = True
    group = torch.arange(n_prompts).repeat_interleave(G)
    reward = (torch.arange(B) % 2).double()
    return rollout.RolloutBatch(ids, torch.ones(B, L, dtype=torch.long), resp, group, reward,
                                rollout.group_advantages(reward, group))


def timed(fn, device):
    """(seconds, peak GiB allocated during fn, result)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return time.perf_counter() - t, peak, out


# Unit costs for the planner: sizes of the two timing points per block (they differ in length at equal
# calls, so a line through them separates the per-token cost from the per-call cost). CPU: the stand-in's
# scale, under a minute. `probe` (the paper shapes) runs with the cuda point's memory knobs.
UNIT_SIZES = {"cpu": dict(rows=8, chunk_rows=4, prompt=16, responses=(16, 112), sample_rows=(2, 16), sample_new=24,
                          kernel_tokens=(64, 256), token_chunk=64, vocab_chunk=256),
              "cuda": dict(rows=8, chunk_rows=4, prompt=128, responses=(256, 1024), sample_rows=(8, 64),
                           sample_new=256, kernel_tokens=(1024, 4096), token_chunk=2048, vocab_chunk=16384)}


def probe(shape: str, device: str = "cuda", n_prompts: int = 4, G: int = 8, prompt: int = 128, response: int = 1024,
          compute: Compute | None = None, sample_rows: int = 64, sample_tokens: int = 512,
          steps: tuple = ("analysis", "adam_full", "sgd_lm_head", "sample")) -> list[dict]:
    """Time each building block once after one warm-up call; one row per block. `compute`: the memory
    knobs of every forward and step (default: the cuda timing point's, with activation checkpointing)."""
    cc = compute or Compute(device=device, chunk_rows=UNIT_SIZES["cuda"]["chunk_rows"],
                            token_chunk=UNIT_SIZES["cuda"]["token_chunk"], gradient_checkpointing=True)
    model = build(shape, device=device)
    batch = synthetic_batch(n_prompts, G, prompt, response, model.config.vocab_size)
    n_tok, rows = batch.n_tokens, []
    base = dict(shape=shape, params_b=policy.n_params(model) / 1e9, device=device,
                gpu=torch.cuda.get_device_name() if device == "cuda" else "cpu")

    def add(name, secs, peak, tokens, **extra):
        rows.append(dict(base, block=name, seconds=secs, peak_gib=peak, tokens=tokens,
                         ms_per_1k_tokens=1e3 * secs / tokens * 1e3, **extra))
        print(f"{shape} {name}: {secs:.2f} s for {tokens} tokens ({rows[-1]['ms_per_1k_tokens']:.1f} ms / 1k tokens), "
              f"peak {peak:.1f} GiB", flush=True)

    stats = lambda: measure.token_stats(model, batch, cc)  # noqa: E731
    if "analysis" in steps:
        stats()
        secs, peak, _ = timed(stats, device)
        add("analysis_forward", secs, peak, n_tok)
    old = stats().logp if {"adam_full", "sgd_lm_head"} & set(steps) else None   # θ_old of the steps
    for name, cfg in (("adam_full", cc.update(optimizer="adam", lr=1e-6, scope="full")),
                      ("sgd_lm_head", cc.update(optimizer="sgd", lr=0.1, scope="lm_head"))):
        if name not in steps:
            continue
        opt = grpo.make_optimizer(model, cfg)
        step = lambda opt=opt, cfg=cfg: grpo.grpo_step(model, batch, cfg, optimizer=opt, old_logp=old)
        step()                                    # warm-up (allocates Adam state)
        secs, peak, _ = timed(step, device)
        add(f"grpo_step_{name}", secs, peak, n_tok)
        del opt
    if "sample" in steps:
        sampler = policy.cast(model, "bfloat16")
        del model
        torch.cuda.empty_cache() if device == "cuda" else None
        ids = batch.input_ids[:1, :prompt].repeat(sample_rows, 1).to(device)
        mask = torch.ones_like(ids)
        gen = torch.Generator(device=device).manual_seed(0)
        run = lambda n: generate(sampler, ids, mask, n, 1.0, [-1], 0, generator=gen,  # the path notebooks take
                                 token_chunk=cc.token_chunk, path="auto")  # noqa: E731
        with torch.no_grad():
            run(8)
            secs, peak, out = timed(lambda: run(sample_tokens), device)
        add("hf_sample_bf16", secs, peak, out.numel(), rows=sample_rows)
    return rows


# ----------------------------------------------------------------------------- unit costs for the planner
START_NOTEBOOK = """import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import transformers
from cancellation import claims, grader, plots, policy, tasks
from cancellation.figures import {modules}
from transformers.models.qwen2 import modeling_qwen2   # what loading a policy imports
from transformers.models.qwen3 import modeling_qwen3
grader.MathVerifier()(tasks.Problem("1 + 1", "2"), "The answer is $\\boxed{2}$.")   # a file source's grader
fig, ax = plots.figure(ncols=2, nrows=2, width=plots.WIDTH_2COL, height=4.6)
for a in ax.ravel():
    a.hist(np.random.default_rng(0).normal(size=10000), bins=60)
plots.save(out, "start", fig)
""".replace("{modules}", ", ".join(f.module for f in manifest.FIGURES))


def trim_probe(shape: str = "qwen3-1.7b", device: str = "cuda", n_prompts: int = 4, G: int = 4, prompt: int = 256,
               response: int = 1024, compute: Compute | None = None, seed: int = 0) -> list[dict]:
    """`trim_padding` at a paper shape: an analysis forward and a full-scope SGD step over every column vs
    each chunk's real columns only (measure.chunks), on a batch whose responses stop at lengths spread
    evenly from response/8 to response (a math RL batch's spread; the padding a sampler leaves after a
    stop). One row per block: seconds both ways (fastest of 3 after a warm-up), the share of positions
    the trimmed forwards run over, and the largest |Δ log p| or |Δθ| between the two ways. `compute`: the
    full-width knobs (default: the cuda timing point's, with activation checkpointing, as `probe`)."""
    model = build(shape, device=device, seed=seed)
    batch = synthetic_batch(n_prompts, G, prompt, response, model.config.vocab_size, seed)
    B, L = batch.input_ids.shape
    stops = torch.linspace(response / 8, response, B).round().long()[torch.randperm(B, generator=torch.Generator()
                                                                                    .manual_seed(seed))]
    for i, n in enumerate(stops.tolist()):
        batch.attention_mask[i, prompt + n:] = 0
        batch.response_mask[i, prompt + n:] = False
    full = compute or Compute(device=device, chunk_rows=UNIT_SIZES["cuda"]["chunk_rows"],
                              token_chunk=UNIT_SIZES["cuda"]["token_chunk"], gradient_checkpointing=True)
    cut = dataclasses.replace(full, trim_padding=True)
    positions = sum(len(r) * (c.stop - c.start) for r, c in measure.chunks(batch.attention_mask, torch.arange(B), cut))
    old = measure.token_stats(model, batch, full).logp
    init = {k: v.clone() for k, v in model.state_dict().items()}

    def step(knobs):
        model.load_state_dict(init)
        grpo.grpo_step(model, batch, knobs.update(optimizer="sgd", lr=1e-3, scope="full"), old_logp=old)
        return [p.detach().flatten()[:4096].clone() for p in model.parameters()]   # a slice of every tensor
    rows = []
    for name, fn, diff in (("analysis_forward", lambda k: measure.token_stats(model, batch, k).logp,
                            lambda a, b: float((a - b).abs().max())),
                           ("grpo_step_sgd_full", step,
                            lambda a, b: max(float((x - y).abs().max()) for x, y in zip(a, b)))):
        t_full, t_cut = best_time(lambda: fn(full), device), best_time(lambda: fn(cut), device)
        d = diff(fn(full), fn(cut))
        rows.append(dict(shape=shape, device=device, block=name, rows=B, columns=L, chunk_rows=full.chunk_rows,
                         positions_share=positions / (B * L), seconds_full=t_full, seconds_trim=t_cut,
                         speedup=t_full / t_cut, max_abs_diff=d))
        print(f"{shape} {name}: full {t_full:.2f} s, trim {t_cut:.2f} s ({t_full / t_cut:.2f}x; forwards over "
              f"{positions / (B * L):.0%} of the positions), max |Δ| {d:.1e}", flush=True)
    model.load_state_dict(init)
    return rows


def best_time(fn, device, reps: int = 3) -> float:
    """The fastest of `reps` timed calls after one warm-up (the machine is shared: the minimum is the cost)."""
    fn()
    return min(timed(fn, device)[0] for _ in range(reps))


def time_start(device: str) -> float:
    """Seconds a notebook takes before and after its work: kernel start, the imports every notebook
    makes (the figure modules, a model class, the math grader), one 2 x 2 figure saved as PDF and PNG
    (papermill, as the runner runs it)."""
    import tempfile
    from pathlib import Path

    import nbformat
    import papermill as pm
    with tempfile.TemporaryDirectory() as d:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(f"out = {d!r}"), nbformat.v4.new_code_cell(START_NOTEBOOK)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        src = Path(d) / "start.ipynb"
        nbformat.write(nb, src)
        t = time.perf_counter()
        pm.execute_notebook(str(src), str(Path(d) / "out.ipynb"), kernel_name="python3", progress_bar=False,
                            cwd=str(Path(__file__).resolve().parents[2]))
        return time.perf_counter() - t


# A larger random shape whose per-token costs are compute-bound on a CPU (the stand-in's are
# per-call overhead): the slopes come from it, the per-call costs from the stand-in.
CPU_SLOPE_SHAPE = dict(model_type="qwen3", vocab_size=8192, hidden_size=256, intermediate_size=768,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                       tie_word_embeddings=True, max_position_embeddings=512)


def _model(config, dtype, device, seed):
    """A random model: a SHAPES name, a config.json directory, or a dict of config values."""
    if isinstance(config, dict):
        from transformers import AutoConfig, AutoModelForCausalLM
        kw = dict(config)
        cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
        torch.manual_seed(seed)
        with torch.device(device):
            return AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype)).eval()
    if config in SHAPES:
        return build(config, dtype=getattr(torch, dtype), device=device, seed=seed)
    return policy.random_model(config, dtype, device, seed)


def _time_blocks(model, z: dict, device: str, dtype: str, seed: int, only=None, sample_dtype: str | None = None) -> dict:
    """Two timing points per block on `model`: block -> [(seconds, parameter-tokens or pair-vocab, calls)]
    (equal calls, different lengths; sampling: equal decode steps, different rows), plus Adam's update.
    `only`: just these blocks; sampling runs on a `sample_dtype` copy (the notebooks'
    sample_dtype: on CUDA bfloat16, which `sampler.generate` samples with the captured static-cache path)."""

    shape = Shape.from_config(model.config.to_dict())
    assert shape.params == policy.n_params(model), "plan.Shape's closed form disagrees with the model"
    V, cr, tc = shape.vocab, z["chunk_rows"], z["token_chunk"]
    cc = Compute(device=device, dtype=dtype, chunk_rows=cr, token_chunk=tc, gradient_checkpointing=True)
    out = {}
    batches = [synthetic_batch(z["rows"] // 2, 2, z["prompt"], r, V, seed) for r in z["responses"]]
    calls = -(-z["rows"] // cr)
    blocks = {"analysis": lambda b: cc.stats(model, b),
              "full_step": lambda b: grpo.grpo_step(model, b, cc.update(optimizer="sgd", lr=0.0, scope="full")),
              "sgd_lm_head": lambda b: grpo.grpo_step(model, b, cc.update(optimizer="sgd", lr=0.0, scope="lm_head"))}
    if only is not None:
        blocks = {k: v for k, v in blocks.items() if k in only}
    for fn in blocks.values():  # warm every block and size first: first calls pay one-time costs
        for b in batches:
            fn(b)
    for name, fn in blocks.items():
        out[name] = [(best_time(lambda: fn(b), device), z["rows"] * (z["prompt"] + r) * shape.body
                      + z["rows"] * r * shape.head, calls) for b, r in zip(batches, z["responses"])]
    if only is None:
        opt = torch.optim.Adam(model.parameters(), lr=0.0)  # touches every parameter and both moments per step
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        out["adam_update"] = best_time(opt.step, device, reps=3) / shape.params
        del opt
        model.zero_grad(set_to_none=True)
    if only is None or "sample" in only:
        sm = model if not sample_dtype or sample_dtype == dtype else policy.cast(model, sample_dtype)
        new, gen, pts = z["sample_new"], torch.Generator(device=device).manual_seed(seed), []
        for rows in z["sample_rows"]:
            ids = batches[0].input_ids[:1, :z["prompt"]].repeat(rows, 1).to(device)
            with torch.no_grad():
                t = best_time(lambda: generate(sm, ids, torch.ones_like(ids), new, 1.0, [-1], 0, generator=gen,
                                           token_chunk=tc, path="auto"), device)   # the notebooks' path here
            pts.append((t, rows * (z["prompt"] + new) * shape.body + rows * new * shape.head, new))
        out["sample"] = pts
        del sm
    if only is None or set(TRL_BLOCKS) & set(only):
        out.update(_time_trl_blocks(model, batches, z, device, seed, shape, only))
    if only is not None:
        return out
    pts = []
    for n in z["kernel_tokens"]:  # every pair of n tokens (kernel_matvec), blocks of min(n, 1024)
        b = synthetic_batch(1, max(n // 64, 1), 1, 64, V, seed)
        f = coupling.features(model, b, cc.stats(model, b, hidden=True), vocab_chunk=z["vocab_chunk"])
        c = min(1024, len(f))
        t = best_time(lambda: coupling.kernel_matvec(f, f.A, chunk=c, vocab_chunk=z["vocab_chunk"]), device)
        pts.append((t, len(f) ** 2 * V * (1 + 2 * shape.hidden / c), (-(-len(f) // c)) ** 2))
    out["kernel"] = pts
    return out


# ----------------------------------------------------------------------------- TRL's blocks (notebook 07, engine 'trl')
# What TRL's GRPOTrainer runs instead of our sampler and grpo_step (docs/paper.md, 07's row): transformers'
# `generate` (as TRL configures it: sampling, top_k 0, a dynamic cache, the training model's dtype), the
# fused-LM-head forward TRL computes log-probs with (`add_fused_lm_head`: without Triton, a CPU, every
# position of the rows goes through the head; with it only the labelled ones), with and without a graph, and
# the Trainer's own cost per run, per optimizer step and per logging step (`trl_overhead`).
TRL_BLOCKS = ("trl_generate", "trl_logp", "trl_step")
TRL_OVERHEAD = ("trl_run", "trl_optimizer_step", "trl_log")
# a whole TRL run on the stand-in at paper-smoke's 07 sizes (its `iterations` at two counts, so a line
# through the residuals separates the per-run from the per-step cost, and once without logging)
TRL_RUN = dict(n_prompts=2, G=4, n_minibatches=2, max_new_tokens=24, token_chunk=64, chunk_rows=4,
               gradient_checkpointing=True, iterations=(1, 5), reps=3, threads=1)   # threads: fig07.Params.threads


def trl_fused(device) -> bool:
    """Whether TRL's fused LM head scores only the labelled positions on `device` (Triton on CUDA/XPU)."""
    return _fused_compact(torch.device(device) if isinstance(device, str) else device)


def _time_trl_blocks(model, batches, z, device, seed, shape, only=None) -> dict:
    """Two timing points of each of TRL's model blocks on `model` (patched with TRL's fused LM head,
    which leaves its other forwards as they were): block -> [(seconds, parameter-tokens, calls)]. On a CPU
    at notebook 07's torch threads (TRL_RUN's)."""
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    threads = torch.get_num_threads()
    if str(device).startswith("cpu"):   # notebook 07 trains with `threads` torch threads (1): time TRL's blocks so
        torch.set_num_threads(TRL_RUN["threads"])
    try:
        return _trl_points(model, batches, z, device, seed, shape, only)
    finally:
        torch.set_num_threads(threads)


def _trl_points(model, batches, z, device, seed, shape, only) -> dict:
    from transformers import GenerationConfig
    cr, out = z["chunk_rows"], {}
    compact = trl_fused(device)

    def head(b):    # positions the fused head projects: the labelled ones (Triton), else every shifted position
        return int(b.response_mask.sum()) if compact else b.input_ids.shape[0] * (b.input_ids.shape[1] - 1)

    def fused(b, grad):
        def run():
            for i in range(0, len(b.input_ids), cr):
                ids, am = b.input_ids[i:i + cr].to(device), b.attention_mask[i:i + cr].to(device)
                labels = ids.masked_fill(~b.response_mask[i:i + cr].to(device), -100)
                with torch.set_grad_enabled(grad):
                    o = model(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True)
                    if grad:
                        o.log_probs.sum().backward()
            model.zero_grad(set_to_none=True)
        return run

    if only is None or "trl_logp" in only:
        out["trl_logp"] = [(best_time(fused(b, False), device), len(b.input_ids) * b.input_ids.shape[1] * shape.body
                            + head(b) * shape.head, -(-len(b.input_ids) // cr)) for b in batches]
    if only is None or "trl_step" in only:
        model.gradient_checkpointing_enable()
        model.train()
        out["trl_step"] = [(best_time(fused(b, True), device), len(b.input_ids) * b.input_ids.shape[1] * shape.body
                            + head(b) * shape.head, -(-len(b.input_ids) // cr)) for b in batches]
        model.gradient_checkpointing_disable()
        model.eval()
    if only is None or "trl_generate" in only:
        new, pts = z["sample_new"], []
        gc = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0,
                              top_k=0, pad_token_id=0, eos_token_id=None, disable_compile=True)
        for rows in z["sample_rows"]:
            ids = batches[0].input_ids[:1, :z["prompt"]].repeat(rows, 1).to(device)
            torch.manual_seed(seed)
            with torch.no_grad():
                t = best_time(lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                 generation_config=gc), device)
            pts.append((t, rows * (z["prompt"] + new) * shape.body + rows * new * shape.head, new))
        out["trl_generate"] = pts
    return out


def trl_run_work(P, shape, z, runs: int = 1, iterations: int | None = None, rb: bool = False, monitor: bool = True,
                 logging_steps: int = 1):
    """The planner's Work of `runs` TRL runs at P (workload.trl_run): what the residual fit below subtracts."""
    w = W.Work()
    W.trl_run(w, P, z, runs=runs, iterations=iterations, rb=rb, monitor=monitor, logging_steps=logging_steps)
    return w


def measure_trl_overhead(model_dir, units: dict, device: str = "cpu", dtype: str = "float32", seed: int = 0) -> dict:
    """TRL's Trainer overhead: whole `engine.train_trl` runs on `model_dir` (a policy with a tokenizer, the
    stand-in) at TRL_RUN's sizes, every completion forced to max_new_tokens (so the blocks' counts are exact),
    minus what `units` (this device's, TRL's model blocks included) predict for the same runs' blocks (the
    fastest of `reps`). The residual of TRL_RUN's two `iterations` counts with a log line per optimizer step,
    and of the larger without logging, gives
    seconds per run (policy load, trainer construction, the dataloader, `train()`'s set-up), per optimizer
    step (the Trainer's loop, callbacks, the step recorder and cancellation monitor's tables, skipped
    accumulation steps) and per logging step."""
    import tempfile
    from types import SimpleNamespace

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    src = sources.ProblemSource(path=os.path.join(root, "data", "standins", "dapo-math-17k.parquet"))
    r = dict(TRL_RUN)
    cc = Compute(device=device, dtype=dtype, chunk_rows=r["chunk_rows"], token_chunk=r["token_chunk"],
                 gradient_checkpointing=r["gradient_checkpointing"])
    shape = Shape.from_config(json.load(open(os.path.join(model_dir, "config.json"))))
    P = SimpleNamespace(n_prompts=r["n_prompts"], G=r["G"], n_minibatches=r["n_minibatches"],
                        max_new_tokens=r["max_new_tokens"], token_chunk=r["token_chunk"], chunk_rows=r["chunk_rows"],
                        device=device, model_path=model_dir, problems_path=src.path, prompt_format="auto")
    pm, px, _ = plan.prompt_lengths(P)
    z = Sizes(pm, px, r["max_new_tokens"])
    model_units = {"start": {"seconds": 0.0}, **{k: v for k, v in units.items() if k not in TRL_OVERHEAD}}
    threads = torch.get_num_threads()

    def run(iterations, logging_steps):
        best = float("inf")
        torch.set_num_threads(r["threads"] if device.startswith("cpu") else torch.get_num_threads())
        for _ in range(r["reps"]):
            with tempfile.TemporaryDirectory() as d:
                t = time.perf_counter()
                m, tk = policy.load_policy(model_dir, dtype=dtype, device=device)
                engine.train_trl(model_dir, src, "random", output_dir=d, model=m, tokenizer=tk, iterations=iterations,
                                 n_prompts=r["n_prompts"], G=r["G"], n_minibatches=r["n_minibatches"], seed=seed,
                                 max_new_tokens=r["max_new_tokens"], dtype=dtype, compute=cc,
                                 gradient_checkpointing=r["gradient_checkpointing"], logging_steps=logging_steps,
                                 generation_kwargs={"min_new_tokens": r["max_new_tokens"]})
                best = min(best, time.perf_counter() - t)
        w = trl_run_work(P, shape, z, iterations=iterations, logging_steps=logging_steps)
        blocks = {k: v for k, v in w.blocks.items() if k not in TRL_OVERHEAD}
        planned = sum(plan._block_seconds(blocks, shape, model_units).values())
        print(f"TRL run, {iterations} iterations, logging every {logging_steps}: {best:.2f} s, its blocks "
              f"{planned:.2f} s planned", flush=True)
        return best - planned, iterations * r["n_minibatches"]

    (r1, s1), (r3, s3), (q3, _) = run(r["iterations"][0], 1), run(r["iterations"][1], 1), run(r["iterations"][1], 10**6)
    log = max((r3 - q3) / s3, 0.0)
    step = max((r3 - r1) / (s3 - s1) - log, 0.0)
    per_run = max(r1 - s1 * (step + log), 0.0)
    torch.set_num_threads(threads)
    return {"trl_run": dict(s_per_param_token=0.0, s_per_call=per_run),
            "trl_optimizer_step": dict(s_per_param_token=0.0, s_per_call=step),
            "trl_log": dict(s_per_param_token=0.0, s_per_call=log)}, \
        dict(sizes={k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}, prompt=[pm, px],
             load_average=os.getloadavg()[0], residual_seconds={
                 f"run_{r['iterations'][0]}": r1, f"run_{r['iterations'][1]}": r3,
                 f"run_{r['iterations'][1]}_without_logging": q3})


def has_tokenizer(config) -> bool:
    """A policy directory TRL can train (a config.json directory with a tokenizer: the stand-in)."""
    return isinstance(config, str) and os.path.isdir(config) and any(
        os.path.exists(os.path.join(config, f)) for f in TOKENIZER_FILES)


def measure_units(config, device: str = "cpu", dtype: str = "float32", seed: int = 0, slope_config=None,
                  only=None, sample_dtype: str | None = None) -> dict:
    """Unit costs of the planner's blocks (`cancellation.plan`) on this device, measured on random
    models: seconds per parameter-token and per call of an analysis forward, a full-parameter
    step (gradient checkpointing on, SGD: Adam's update is timed apart, per parameter), an lm_head
    step and HF sampling; seconds per pair-vocabulary entry of the coupling kernel; the notebook
    start. Per-call costs come from `config` (a SHAPES name or a config.json directory); per-token
    costs from `slope_config` when given (on a CPU a small shape is overhead-bound, so its slope
    would not transfer to a large model), else from `config` too. `only` (e.g. ['sample']): just those
    blocks (merged into an existing file by `main --only`). Sampling is timed on a `sample_dtype` copy
    (default: bfloat16 on CUDA, as the paper profile's sample_dtype; the model's dtype on a CPU)."""
    sample_dtype = sample_dtype or ("bfloat16" if device.startswith("cuda") else dtype)

    z = UNIT_SIZES[device.split(":")[0]]
    model = _model(config, dtype, device, seed)
    shape = Shape.from_config(model.config.to_dict())
    small = _time_blocks(model, z, device, dtype, seed, only, sample_dtype)
    del model
    big, big_shape = small, shape
    if slope_config is not None:
        m = _model(slope_config, dtype, device, seed)
        big_shape = Shape.from_config(m.config.to_dict())
        big = _time_blocks(m, z, device, dtype, seed, only, sample_dtype)
        del m
    units = {}
    for name in ("analysis", "full_step", "sgd_lm_head", "sample") + TRL_BLOCKS:
        if name not in big:
            continue
        (t1, w1, c), (t2, w2, _) = big[name]
        a = (t2 - t1) / (w2 - w1) if t2 > t1 else t2 / w2
        (s1, v1, c1), _ = small[name]
        units[name] = dict(s_per_param_token=a, s_per_call=max(s1 - a * v1, 0.0) / c1)
    if only is not None:
        return dict(units=units, sample_dtype=sample_dtype,
                    points=[dict(shape=which, block=k, seconds=p[0], work=p[1], calls=p[2])
                            for which, res in (("config", small), ("slope", big if big is not small else {}))
                            for k, pts in res.items() for p in pts])
    units["adam_update"] = dict(s_per_param=big["adam_update"])
    trl_fit = None
    if has_tokenizer(config):  # TRL's Trainer overhead: whole runs on a policy TRL can train (the stand-in)
        over, trl_fit = measure_trl_overhead(config, units, device, dtype, seed)
        units.update(over)
    (t, w, _) = big["kernel"][-1]
    units["kernel"] = dict(s_per_pair_vocab=t / w, s_per_call=0.0)
    units["start"] = dict(seconds=time_start(device))
    points = [dict(shape=which, block=k, seconds=p[0], work=p[1], calls=p[2])
              for which, res in (("config", small), ("slope", big if big is not small else {}))
              for k, pts in res.items() if k != "adam_update" for p in pts]
    return dict(device_kind=device_kind(device), device=device,
                name=torch.cuda.get_device_name() if device.startswith("cuda") else _cpu_name(),
                threads=torch.get_num_threads(), load_average=os.getloadavg()[0], torch=torch.__version__,
                total_memory=device_memory(device) if device.startswith("cuda") else None,  # the planner's --device-kind
                dtype=dtype, sample_dtype=sample_dtype, shape=dict(vars(shape)), slope_shape=dict(vars(big_shape)), params=shape.params,
                measured=time.strftime("%Y-%m-%d"), units=units, points=points,
                **({"trl_overhead": trl_fit} if trl_fit else {}))


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", default=None, choices=sorted(SHAPES),
                    help="probe these paper shapes (rows per block; default for --device cuda: qwen3-1.7b)")
    ap.add_argument("--config", default=None,
                    help="measure the planner's unit costs on a random model of this config.json directory "
                         "(default: data/standins/model on cpu, qwen3-1.7b's shape on cuda) -> --out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--sample-tokens", type=int, default=512)
    ap.add_argument("--sample-rows", type=int, default=64)
    ap.add_argument("--steps", nargs="+", default=["analysis", "adam_full", "sgd_lm_head", "sample"])
    ap.add_argument("--out", default=None, help="write the JSON here (unit costs: data/scale/<device kind>.json)")
    ap.add_argument("--only", nargs="+", default=None,
                    choices=["analysis", "full_step", "sgd_lm_head", "sample", *TRL_BLOCKS, "trl_overhead"],
                    help="re-measure just these blocks and merge them into the existing --out file (trl_overhead: "
                         "TRL's Trainer per run, optimizer step and logging step, fitted against the file's units)")
    a = ap.parse_args(argv)
    if a.shape:  # the rows of the paper shapes' blocks (as before)
        rows = []
        for s in a.shape:
            rows += probe(s, a.device, response=a.response, sample_tokens=a.sample_tokens,
                          sample_rows=a.sample_rows, steps=tuple(a.steps))
            torch.cuda.empty_cache() if a.device == "cuda" else None
        out = rows
    else:
        from pathlib import Path
        root = Path(__file__).resolve().parents[2]
        config = a.config or (str(root / "data" / "standins" / "model") if a.device == "cpu" else "qwen3-1.7b")
        if a.only and not (a.out and os.path.isfile(a.out)):
            raise SystemExit("--only merges into an existing --out file of unit costs")
        model_only = [b for b in a.only if b != "trl_overhead"] if a.only else None
        out = measure_units(config, a.device, a.dtype, slope_config=CPU_SLOPE_SHAPE if a.device == "cpu" else None,
                            only=model_only) if model_only is None or model_only else None
        if a.only:
            old = json.load(open(a.out))
            if out is not None:
                old["units"].update(out["units"])
                old["points"] = [p for p in old["points"] if p["block"] not in a.only] + out["points"]
                old["sample_dtype"] = out["sample_dtype"]
            if "trl_overhead" in a.only:
                if not has_tokenizer(config):
                    raise SystemExit(f"trl_overhead needs a policy TRL can train (a directory with a tokenizer), not {config}")
                over, fit = measure_trl_overhead(config, old["units"], a.device, a.dtype)
                old["units"].update(over)
                old["trl_overhead"] = fit
            old.setdefault("remeasured", {}).update({b: time.strftime("%Y-%m-%d") for b in a.only})
            out = old
        print(json.dumps(out["units"], indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
