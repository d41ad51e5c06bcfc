"""The vLLM seam (GPU extra): rollouts, Monte Carlo continuations, and weights pushed into the engine.

`sample_vllm` draws rollouts and `sample_vllm_continuations` value.py's Monte Carlo continuations with a
vllm.LLM that `sampler.make_sampler` builds; `sync_weights` pushes updated weights into its engine. vLLM is
imported only when used (`import_vllm`, with its install hint): the CPU profiles never need it.
"""
from __future__ import annotations

import hashlib
import json

import torch

from .dryrun import dry_run


def import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise ImportError("the vllm backend needs vLLM (GPU): pip install -e '.[gpu]'") from e
    return vllm.LLM, vllm.SamplingParams, TokensPrompt


def vllm_dry_kw() -> dict:
    """vllm.LLM's extra arguments under the runner's --dry-run (random weights; the model directory may hold
    only config.json, as data/shapes/ does): dummy weights (make_sampler then pushes the HF model's random
    ones) and no tokenizer (prompts go in as token ids). Empty otherwise: a real run loads what is at the path."""
    return dict(load_format="dummy", skip_tokenizer_init=True) if dry_run() is not None else {}


def vllm_rank_kw() -> dict:
    """vllm.LLM's extra arguments in one rank of a torch.distributed group of several (a `run --procs N` rank:
    procs._worker joins the group through accelerate first); empty elsewhere.

    Such an engine must join the group rather than start its own, which fails with vLLM's "world size does not
    match": TRL's colocate mode does this (trl/generation/vllm_generation.py, VLLMGeneration._init_vllm, TRL 1.16:
    `LLM(..., distributed_executor_backend="external_launcher", seed=...)`), reading RANK, LOCAL_RANK and
    MASTER_ADDR/PORT that accelerate's launcher sets. With tensor_parallel_size 1 each rank is its own engine on
    the one GPU it sees (procs._worker narrows CUDA_VISIBLE_DEVICES and sets LOCAL_RANK=0). TRL passes
    seed=rank // tensor_parallel_size so that its ranks' unseeded requests differ; ours all carry their own seed
    (request_seed) and a unit must sample the same tokens on any N, so every rank keeps the run's seed (vLLM asks
    only that the ranks of one tensor-parallel group agree). Building such an engine is a collective over the
    group (vLLM's ExecutorWithExternalLauncher takes the least free memory of all ranks), so every rank must build
    its engines at the same points, as value._rank_rewards's ranks do (one engine each, first)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dict(distributed_executor_backend="external_launcher")
    return {}


def request_seed(seed: int, *key) -> int:
    """A vLLM request seed (< 2**31) from the batch seed and the request's key (prompt index, ...):
    distinct prompts get distinct random streams, the same call the same ones."""
    blob = json.dumps([int(seed)] + [int(k) for k in key]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "little") % 2**31


def sample_vllm(llm, prompts: list[list[int]], cfg, seed: int, stop) -> list[list[int]]:
    """cfg.G responses per prompt (token ids, G consecutive rows per prompt) from a vllm.LLM.

    The prompts go in as the exact token ids the HF path sees. SamplingParams are built directly
    (top_p=1, no top_k, no repetition penalty): the distribution our HF sampler draws from, not
    generation_config.json's defaults that LLM.get_default_sampling_params would apply.
    """
    _, SamplingParams, TokensPrompt = import_vllm()
    params = [SamplingParams(n=cfg.G, temperature=cfg.temperature, max_tokens=cfg.max_new_tokens,
                             seed=request_seed(seed, i), stop_token_ids=list(stop)) for i in range(len(prompts))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    seqs = [list(c.token_ids) for o in outs for c in o.outputs]
    if len(seqs) != cfg.G * len(prompts):
        raise RuntimeError(f"vLLM returned {len(seqs)} responses for {len(prompts)} prompts × G={cfg.G}")
    return seqs


def vllm_model(llm):
    """The torch module inside a vllm.LLM's engine (in-process engines only)."""
    paths = ("llm_engine.model_executor.driver_worker.worker.model_runner.model",   # V1 in-process, V0 wrapper
             "llm_engine.model_executor.driver_worker.model_runner.model")          # V0
    for path in paths:
        obj = llm
        try:
            for name in path.split("."):
                obj = getattr(obj, name)
        except AttributeError:
            continue
        return obj
    return None


def sync_weights(llm, model=None) -> int:
    """Push `model`'s current weights (default: `llm.hf_model`) into the vLLM engine after an
    update and reset its prefix cache, as TRL does for colocated vLLM; returns the number of tensors sent.

    Needs the engine in this process (make_sampler sets VLLM_ENABLE_V1_MULTIPROCESSING=0);
    otherwise falls back to `collective_rpc` with CPU copies of the weights.
    """
    model = model if model is not None else getattr(llm, "hf_model", None)
    if model is None:
        raise ValueError("sync_weights: no HF model given and the LLM has no .hf_model (build it with make_sampler)")
    state = model.state_dict()
    target = vllm_model(llm)
    if target is not None:
        target.load_weights(state.items())
    elif hasattr(llm, "collective_rpc"):
        cpu = [(k, v.detach().cpu()) for k, v in state.items()]
        llm.collective_rpc(_load_weights_rpc, args=(cpu,))
    else:
        raise RuntimeError("sync_weights: cannot reach the vLLM engine's model (no llm_engine.model_executor."
                           "driver_worker and no collective_rpc); set VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
                           "building the LLM, or rebuild it from saved weights after each update")
    # The engine's prefix cache (make_sampler turns it on) holds keys and values computed with the old weights:
    # without a reset, every prompt sharing a cached prefix (the instruction, the chat template) would be sampled
    # from them. TRL resets it after its own push (VLLMGeneration.sync_weights, unguarded: every vLLM the gpu extra
    # allows has LLM.reset_prefix_cache). Some versions answer False when blocks are still in use; between
    # generate calls none are, so False means stale keys and values would be sampled: stop.
    if llm.reset_prefix_cache() is False:
        raise RuntimeError("sync_weights: vLLM could not reset its prefix cache after the weight push (blocks still "
                           "in use); sampling now would reuse keys and values of the old weights")
    return len(state)


def _load_weights_rpc(worker, weights):  # pragma: no cover - runs inside a vLLM worker process
    worker.model_runner.model.load_weights(weights)


@torch.no_grad()
def first_tokens(model, prefix, M: int, seed: int, temperature: float = 1.0, ban: int | None = None) -> list[int]:
    """M first tokens after `prefix` from the HF model's next-token distribution, `ban` removed
    and renormalised, drawn by inverse CDF from the prefix's uniforms (as value.sample_continuations
    draws its first token, so both give the same tokens up to logits' rounding)."""
    dev = next(model.parameters()).device
    ids = torch.as_tensor([list(prefix)], device=dev)
    logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
    if temperature == 0:
        if ban is not None:
            logits = logits.clone()
            logits[ban] = -float("inf")
        return [int(logits.argmax())] * M
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    if ban is not None:
        probs[ban] = 0.0
        probs /= probs.sum()
    cdf = probs.cumsum(-1)
    u = torch.rand(1, M, generator=torch.Generator(device=dev).manual_seed(seed), dtype=torch.float64, device=dev)[0]
    return torch.searchsorted(cdf, u * cdf[-1]).clamp(max=len(probs) - 1).tolist()


def sample_vllm_continuations(llm, prefixes, M, budgets, seeds, temperature, bans, stop=(), model=None) -> list[torch.Tensor]:
    """The vLLM seam: n=M continuations per prefix, one (M, budget) tensor each, -1 after the end
    (build `llm` with enable_prefix_caching=True: the M rows and the two branches share prefixes).

    A banned first token ('exclude' estimator): the M first tokens come from the HF `model`
    (default `llm.hf_model`) with the ban removed (`first_tokens`, seeded by the request seed),
    and vLLM continues each distinct prefix ⊕ a with n = its count and max_tokens = budget - 1.
    """
    _, SamplingParams, TokensPrompt = import_vllm()
    stop = [int(s) for s in stop]
    jobs, rows = [], []  # jobs: (prompt ids, n, max_tokens, seed); rows: per prefix, (first token | None, job) per row
    for p, b, s, ban in zip(prefixes, budgets, seeds, bans):
        if ban is None:
            jobs.append((list(p), M, b, s % 2**31))
            rows.append([(None, len(jobs) - 1)] * M)
            continue
        hf = model if model is not None else getattr(llm, "hf_model", None)
        if hf is None:
            raise ValueError("estimator='exclude' with vLLM draws the first token from the HF model: pass model= "
                             "or build the LLM with sampler.make_sampler (it attaches .hf_model)")
        firsts = first_tokens(hf, p, M, s, temperature, ban)
        job_of = {}
        for a in sorted(set(firsts)):
            if a not in stop and b > 1:  # a stop id or the cap ends the continuation at its first token
                jobs.append((list(p) + [a], firsts.count(a), b - 1, request_seed(s, a)))
                job_of[a] = len(jobs) - 1
        rows.append([(a, job_of.get(a)) for a in firsts])
    params = [SamplingParams(n=n, temperature=temperature, max_tokens=mt, seed=sd, stop_token_ids=stop)
              for _, n, mt, sd in jobs]
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids, *_ in jobs], params, use_tqdm=False) if jobs else []
    pending = [iter([list(c.token_ids) for c in o.outputs]) for o in outs]
    res = []
    for r, b in zip(rows, budgets):
        seqs = [([] if a is None else [a]) + (next(pending[j]) if j is not None else []) for a, j in r]
        res.append(torch.tensor([q[:b] + [-1] * (b - len(q[:b])) for q in seqs], dtype=torch.long))
    return res
