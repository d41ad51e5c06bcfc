"""Measured unit costs of the paper profile's building blocks at the paper's model shapes.

No hub weights can be fetched on a lent GPU (nor in CI), so this builds a randomly initialised
model with the exact architecture of Qwen3-1.7B-Base / Qwen3-4B-Base / Qwen2.5-Math-7B (the
config values of their hub `config.json`) and times, on one synthetic rollout batch of fixed
lengths, the calls the notebooks make: the chunked analysis forward (`measure.token_stats`), a
full-parameter Adam GRPO step and an SGD lm_head step (`grpo.grpo_step`, float32, gradient
checkpointing as in paper.yaml) and HF sampling on a bfloat16 copy (`rollout.generate`, no stop
id, so every row runs to `response` tokens). Cost per token does not depend on the weights'
values, so these numbers hold for the real checkpoints; what they cannot say is how long real
responses are (the paper's run lengths set that).

    python -m cancellation.scale --shape qwen3-1.7b --device cuda --out scale.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from . import grpo, measure, policy, rollout

# Architectures copied from the models' hub config.json files (Qwen3-1.7B-Base, Qwen3-4B-Base, Qwen2.5-Math-7B).
SHAPES = {
    "qwen3-1.7b": dict(arch="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(arch="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-math-7b": dict(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                            num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                            tie_word_embeddings=False),
}


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


def _timed(fn, device):
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


def probe(shape: str, device: str = "cuda", n_prompts: int = 4, G: int = 8, prompt: int = 128, response: int = 1024,
          chunk_rows: int = 4, token_chunk: int = 2048, sample_rows: int = 64, sample_tokens: int = 512,
          steps: tuple = ("analysis", "adam_full", "sgd_lm_head", "sample")) -> list[dict]:
    """Time each building block once after one warm-up call; one row per block."""
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

    stats = lambda: measure.token_stats(model, batch, chunk_rows, token_chunk=token_chunk)  # noqa: E731
    if "analysis" in steps:
        stats()
        secs, peak, _ = _timed(stats, device)
        add("analysis_forward", secs, peak, n_tok)
    old = stats().logp if {"adam_full", "sgd_lm_head"} & set(steps) else None   # θ_old of the steps
    for name, cfg in (("adam_full", grpo.UpdateConfig(optimizer="adam", lr=1e-6, scope="full")),
                      ("sgd_lm_head", grpo.UpdateConfig(optimizer="sgd", lr=0.1, scope="lm_head"))):
        if name not in steps:
            continue
        cfg.chunk_rows, cfg.token_chunk, cfg.gradient_checkpointing = chunk_rows, token_chunk, True
        opt = grpo.make_optimizer(model, cfg)
        step = lambda: grpo.grpo_step(model, batch, cfg, optimizer=opt, old_logp=old)  # noqa: E731
        step()                                    # warm-up (allocates Adam state)
        secs, peak, _ = _timed(step, device)
        add(f"grpo_step_{name}", secs, peak, n_tok)
        del opt
    if "sample" in steps:
        sampler = policy.cast(model, "bfloat16")
        del model
        torch.cuda.empty_cache() if device == "cuda" else None
        ids = batch.input_ids[:1, :prompt].repeat(sample_rows, 1).to(device)
        mask = torch.ones_like(ids)
        gen = torch.Generator(device=device).manual_seed(0)
        run = lambda n: rollout.generate(sampler, ids, mask, n, 1.0, [-1], 0, generator=gen)  # noqa: E731
        with torch.no_grad():
            run(8)
            secs, peak, out = _timed(lambda: run(sample_tokens), device)
        add("hf_sample_bf16", secs, peak, out.numel(), rows=sample_rows)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", nargs="+", default=["qwen3-1.7b"], choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--sample-tokens", type=int, default=512)
    ap.add_argument("--sample-rows", type=int, default=64)
    ap.add_argument("--steps", nargs="+", default=["analysis", "adam_full", "sgd_lm_head", "sample"])
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = []
    for s in a.shape:
        rows += probe(s, a.device, response=a.response, sample_tokens=a.sample_tokens,
                      sample_rows=a.sample_rows, steps=tuple(a.steps))
        torch.cuda.empty_cache() if a.device == "cuda" else None
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
