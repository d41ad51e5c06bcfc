"""THE sampler's entry points: `generate` (one HF batch, whichever decode path fits), `sample_hf`,
`make_sampler`/`load_sampler` (what `rollout.sample` samples from).

The decode paths live in rooms of their own, and `generate` picks one:

- decode_static.py: a static KV cache and, on CUDA, a decode step captured once per bucket as a CUDA graph
  (`generate_static`; also value.py's Monte Carlo continuations);
- decode_lean.py: the lean CPU step (`LeanStep`, `generate_lean`): the body forward's floats without its
  per-token module calls;
- decode_hf.py: the eager DynamicCache loop (`generate_eager`, the reference) and transformers' own generate
  (`generate_transformers`, where gpu-check measured it faster: sampling_path.py);
- vllm_seam.py: vLLM's rollouts and Monte Carlo continuations, and `sync_weights`;
- decode_common.py: what they share (shape buckets, draws, the body forward with a cache).
"""
from __future__ import annotations

import os

import torch

from . import sampling_path
from .decode_common import model_device, supported
from .decode_hf import generate_eager, generate_transformers
from .decode_lean import generate_lean, lean_supported
from .decode_static import generate_static
from .dryrun import dry_run
from .policy import cast, load_policy
from .vllm_seam import import_vllm, sync_weights, vllm_dry_kw, vllm_rank_kw


@torch.no_grad()
def generate(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
             generator: torch.Generator | None = None, *, token_chunk: int,
             static: bool | None = None, lean: bool | None = None, path: str = "ours") -> torch.Tensor:
    """Batched ancestral sampling with a KV cache; returns (B, T) new tokens, pad after the first stop id.

    On CUDA with bfloat16/float16/float32 weights (`static` None) this is `generate_static`: a static
    KV cache and a decode step captured as a CUDA graph, drawing by inverse CDF from uniforms of
    `generator` (same law, other draws than the eager path). Otherwise (CPU, float64 on CUDA, or
    `static=False`) it is the eager DynamicCache loop (`decode_hf.generate_eager`), which the tiny
    profile's tables used; on a CPU, for the decoders `lean_supported` accepts (Qwen2, Qwen3), that loop runs as
    `decode_lean.generate_lean` (`lean` None or True): the same tokens from the same generator, at the
    CPU's pace (a preallocated cache, no module calls per token). lean=False: the eager loop (bench).

    `stop`: one stop id or a list. temperature 0 is greedy decoding. `generator` must live on the
    model's device. Logits are computed for the last position only (prefill included) and for at
    most `token_chunk` rows at a time (`draw_chunked`); the DynamicCache holds keys/values in the
    model's dtype. The softmax is float64, so draws do not depend on the weights' dtype beyond
    the logits themselves.

    path: 'ours' (all the above), 'transformers' (`generate_transformers`: transformers' own generate, static
    cache) or 'auto' (`sampling_path.resolve` for the model's device: ours, since one call carries no notebook's
    sampling calls to decide at; a figure passes the path its Params resolved, end to end per notebook).
    """
    dev = input_ids.device
    if sampling_path.resolve(path, str(dev)) == "transformers":
        return generate_transformers(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                                     generator=generator)
    if static is None:
        static = (dev.type == "cuda" and next(model.parameters()).dtype != torch.float64
                  and supported(model))
    if static:
        return generate_static(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                               generator=generator, token_chunk=token_chunk, capture=dev.type == "cuda")
    if (dev.type == "cpu" if lean is None else lean) and lean_supported(model):   # the same tokens, without transformers' per-step overhead
        return generate_lean(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                             generator=generator, token_chunk=token_chunk)
    return generate_eager(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                          generator=generator, token_chunk=token_chunk)


def sample_hf(model, ids, mask, cfg, seed: int, stop, pad: int) -> torch.Tensor:
    """(B, T) new tokens from the HF model (`cfg`: a `rollout.SampleConfig`; its hf_sampler picks ours or
    transformers' generate), cfg.chunk_size rows per call, one generator on the model's device across chunks."""
    device = model_device(model)
    if torch.device(cfg.device).type != device.type:
        raise ValueError(f"SampleConfig.device={cfg.device!r} but the sampler is on {device}; build it with "
                         f"make_sampler(..., device={cfg.device!r}) or set device to match")
    gen = torch.Generator(device=device).manual_seed(seed)
    chunks = []
    for s in range(0, ids.shape[0], cfg.chunk_size):
        chunks.append(generate(model, ids[s:s + cfg.chunk_size].to(device), mask[s:s + cfg.chunk_size].to(device),
                               cfg.max_new_tokens, cfg.temperature, stop, pad, generator=gen,
                               token_chunk=cfg.token_chunk, path=cfg.hf_sampler).cpu())
    T = max(c.shape[1] for c in chunks)
    return torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=pad) for c in chunks])


def make_sampler(model, model_path, backend: str = "hf", dtype: str = "float32", seed: int = 0,
                 gpu_memory_utilization: float = 0.3, device: str | None = None):
    """What `sample` samples from: a copy of `model` in `dtype` (on `device` if given) for 'hf';
    for 'vllm' a vllm.LLM over the weights at `model_path` with prefix caching, taking
    `gpu_memory_utilization` of the GPU (the HF model sits beside it), with `model` attached as
    `.hf_model` (its stop ids, `sync_weights`, and the 'exclude' estimator's first token)."""
    if backend == "vllm":
        LLM, _, _ = import_vllm()
        # keep the engine in this process (as TRL's colocate mode) so sync_weights can reach its model
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(str(model_path), dtype=dtype, seed=seed, enable_prefix_caching=True,
                  gpu_memory_utilization=gpu_memory_utilization, **vllm_dry_kw(), **vllm_rank_kw())
        llm.hf_model = model
        if dry_run() is not None:   # the engine's dummy weights replaced by the HF model's random ones
            sync_weights(llm, model)
        return llm
    if backend != "hf":
        raise ValueError(f"unknown sampling backend {backend!r}; use 'hf' or 'vllm'")
    sampler = cast(model, dtype)
    return sampler.to(device) if device is not None else sampler


def load_sampler(recipe: dict):
    """(model, tokenizer, sampler) from a recipe: model_path, dtype and device of the float policy
    (policy.load_policy), backend, sample_dtype, seed and gpu_memory_utilization of the sampler
    (make_sampler), threads (CPU). Seeds torch with `seed` first. The sampler carries the recipe as
    `.cancellation_recipe`, so a stage split over processes (procs.py) rebuilds the same sampler
    in every rank."""
    torch.manual_seed(recipe["seed"])
    if recipe["device"] == "cpu":
        torch.set_num_threads(recipe.get("threads", 1))
    model, tok = load_policy(recipe["model_path"], dtype=recipe["dtype"], device=recipe["device"])
    sampler = make_sampler(model, recipe["model_path"], recipe["backend"], recipe["sample_dtype"], recipe["seed"],
                           recipe["gpu_memory_utilization"])
    model.cancellation_recipe = sampler.cancellation_recipe = dict(recipe)
    return model, tok, sampler
