"""RolloutBatch, batched sampling, rewards and group-normalised advantages.

Layout of a batch (one row per rollout): left-padded prompt, then the sampled response, then
right padding. `attention_mask` marks real tokens, `response_mask` the response tokens (the
<eos> included), positions are `cumsum(attention_mask) - 1` so padding never shifts them.
Position t of every per-token tensor refers to token `input_ids[:, t]` predicted from the
tokens before it.

One way in: `sample(sampler, tokenizer, SampleConfig(...))` draws problems from the config's
ProblemSource, renders them (chat template or raw), samples G responses per prompt, scores them
with the source's verifier and normalises advantages per group. A response ends at the first of
ANY stop id (`stop_ids`: the tokenizer's eos and the checkpoint's generation_config eos ids, as
chat models stop on e.g. <|im_end|>), so the HF and vLLM backends agree on where it ends.

Backends: 'hf' is our own batched KV-cache sampler over any `transformers` causal LM, seeded by a
private torch.Generator on the model's device (reproducible per device, touches no global RNG);
prefill computes logits for the last position only and the KV cache stays in the model's dtype.
'vllm' (GPU extra) receives the exact token ids the HF path would see (TokensPrompt), and
`sync_weights` pushes the HF model's weights into it after each update.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field, fields

import torch

from . import measure, seeds, tasks


@dataclass
class RolloutBatch:
    """G rollouts for each of several prompts, with rewards and advantages."""
    input_ids: torch.Tensor        # (B, L) long
    attention_mask: torch.Tensor   # (B, L) long, 1 on real tokens
    response_mask: torch.Tensor    # (B, L) bool, True on response tokens
    group: torch.Tensor            # (B,) long, index of the prompt in `problems`
    reward: torch.Tensor           # (B,) float
    advantage: torch.Tensor        # (B,) float, group-normalised (verl GRPO)
    problems: list = field(default_factory=list)   # tasks.Problem per group
    texts: list = field(default_factory=list)      # decoded responses, one per row

    def __len__(self):
        return self.input_ids.shape[0]

    @property
    def position_ids(self) -> torch.Tensor:
        return (self.attention_mask.cumsum(-1) - 1).clamp(min=0)

    @property
    def n_tokens(self) -> int:
        return int(self.response_mask.sum())

    def select(self, rows) -> "RolloutBatch":
        """Sub-batch of the given row indices (groups keep their ids)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("input_ids", "attention_mask", "response_mask", "group", "reward", "advantage"):
            kw[k] = kw[k][rows]
        kw["texts"] = [self.texts[i] for i in rows.tolist()] if self.texts else []
        return RolloutBatch(**kw)

    def to(self, device) -> "RolloutBatch":
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in kw.items():
            if isinstance(v, torch.Tensor):
                kw[k] = v.to(device)
        return RolloutBatch(**kw)

    def token_advantage(self) -> torch.Tensor:
        """(B, L) advantage broadcast to tokens, zero off the response."""
        return self.advantage[:, None].to(torch.float64) * self.response_mask

    def mixed_groups(self) -> int:
        """Number of groups with both a correct and a wrong rollout."""
        n = 0
        for g in self.group.unique():
            r = self.reward[self.group == g]
            n += int(r.min() != r.max())
        return n


def group_advantages(reward: torch.Tensor, group: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """verl `compute_grpo_outcome_advantage`: (r - mean_g) / (std_g + eps), std unbiased.

    A group of one rollout gets mean 0 and std 1 (so A = r); all-equal groups get A = 0.
    A NaN or infinite reward (which would turn its whole group's advantages into NaN) is a
    ValueError naming the rollout (row) and its group.
    """
    reward = reward.to(torch.float64)
    bad = (~torch.isfinite(reward)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        more = f"; {len(bad)} non-finite rewards in all, rows {bad[:10]}{' ...' if len(bad) > 10 else ''}" if len(bad) > 1 else ""
        raise ValueError(f"group_advantages: reward of rollout {i} (group {int(group[i])}) is {reward[i].item()}, "
                         f"not finite; it would make group {int(group[i])}'s advantages NaN{more}")
    adv = torch.zeros_like(reward)
    for g in group.unique():
        m = group == g
        r = reward[m]
        if r.numel() == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = r.mean(), r.std(unbiased=True)
        adv[m] = (r - mean) / (std + eps)
    return adv


@dataclass
class SampleConfig:
    """How to sample one batch: which prompts, how many rollouts each, with what and where."""
    n_prompts: int = 16             # prompts per batch, drawn from `source`
    G: int = 8                      # rollouts per prompt (one group)
    temperature: float = 1.0        # sampling temperature; 0 is greedy decoding
    max_new_tokens: int = 96        # response cap in tokens
    backend: str = "hf"             # 'hf' (our KV-cache sampler) or 'vllm' (GPU extra)
    device: str = "cpu"             # where the HF sampler runs (make_sampler puts it there; sample checks it)
    dtype: str = "float32"          # sampler weights dtype (tiny analysis copies may be float64)
    seed: int = 0                   # default seed of `sample` (problem draw and sampling)
    source: tasks.ProblemSource = field(default_factory=lambda: tasks.ProblemSource())  # problems, rendering, verifier
    chunk_size: int = 256           # rollouts per HF sampler call: bounds the KV cache
    token_chunk: int = 4096         # rows per LM-head call of a decode step: bounds its (rows, V) logits (Compute)
    gpu_memory_utilization: float = 0.3   # vLLM's share of GPU memory (the HF model sits beside it)

    def __post_init__(self):
        if self.backend not in ("hf", "vllm"):
            raise ValueError(f"SampleConfig.backend={self.backend!r}; allowed: hf, vllm")
        for name in ("n_prompts", "G", "max_new_tokens", "chunk_size", "token_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"SampleConfig.{name}={getattr(self, name)}: must be at least 1")
        from .compute import check_update
        check_update(self)  # with the Compute guard on (tests): token_chunk must be the profile's

    def cache_params(self) -> dict:
        """What a stage's key holds of it (`config_params`: the problem file by content hash)."""
        return config_params(self)


def config_params(cfg: SampleConfig) -> dict:
    """JSON-able parameters of a SampleConfig for cache keys: the problem file by content hash."""
    from dataclasses import asdict
    p = asdict(cfg)
    p["source"] = cfg.source.params()
    return p


def round_seeds(seed: int, round: int) -> tuple[int, int]:
    """(problem-draw seed, sampling seed) of training round `round` (the tiny tables' recipe)."""
    return seeds.derive(seed, "round_problems", round), seeds.derive(seed, "round_sampling", round)


def stop_ids(tokenizer, model=None) -> list[int]:
    """Every token id that ends a response: the tokenizer's eos, then the checkpoint's
    generation_config eos ids (an int or a list; chat models add e.g. <|im_end|>), deduplicated."""
    ids = [tokenizer.eos_token_id]
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(eos) if isinstance(eos, (list, tuple)) else [eos]
    out = list(dict.fromkeys(int(i) for i in ids if i is not None))
    if not out:
        raise ValueError("no stop id: the tokenizer has no eos_token_id and the model's generation_config none")
    return out


def _device(model) -> torch.device:
    return next(model.parameters()).device


def cache_kw(module) -> str:
    """The name `module.forward` takes its KV cache under: `cache` in recent transformers 5.x (which
    warns on the old name), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def out_cache(out):
    """The KV cache of a model output, under either name."""
    kv = getattr(out, "cache", None)
    return kv if kv is not None else out.past_key_values


def last_hidden(model, kv, **inputs):
    """One body forward with the KV cache `kv`: the LM-head input at the last position (B, d) and the cache."""
    body = model.get_decoder()
    out = body(**inputs, **{cache_kw(body): kv}, use_cache=True)
    return out.last_hidden_state[:, -1], out_cache(out)


def draw_chunked(model, h: torch.Tensor, token_chunk: int, draw) -> torch.Tensor:
    """Tokens (B,) drawn from the LM head's logits of h (B, d), at most `token_chunk` rows of logits
    at a time (a decode step's (B, V) logits are 152k wide on Qwen): `draw(logits, rows)` returns
    the tokens of the rows in slice `rows`. One chunk, the whole batch, when B ≤ token_chunk."""
    return torch.cat([draw(measure.head_logits(model, h[s:s + token_chunk]), slice(s, min(s + token_chunk, len(h))))
                      for s in range(0, len(h), token_chunk)])


@torch.no_grad()
def generate(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
             generator: torch.Generator | None = None, token_chunk: int = 4096,
             static: bool | None = None, lean: bool | None = None) -> torch.Tensor:
    """Batched ancestral sampling with a KV cache; returns (B, T) new tokens, pad after the first stop id.

    On CUDA with bfloat16/float16/float32 weights (`static` None) this is `sampler.generate_static`: a static
    KV cache and a decode step captured as a CUDA graph, drawing by inverse CDF from uniforms of
    `generator` (same law, other draws than the eager path). Otherwise (CPU, float64 on CUDA, or
    `static=False`) it is the eager DynamicCache loop below, which the tiny profile's tables used; on
    a CPU, for the decoders `sampler.lean_supported` accepts (Qwen2, Qwen3), that loop runs as
    `sampler.generate_lean` (`lean` None or True): the same tokens from the same generator, at the
    CPU's pace (a preallocated cache, no module calls per token). lean=False: the loop below (bench).

    `stop`: one stop id or a list. temperature 0 is greedy decoding. `generator` must live on the
    model's device. Logits are computed for the last position only (prefill included) and for at
    most `token_chunk` rows at a time (`draw_chunked`); the DynamicCache holds keys/values in the
    model's dtype. The softmax is float64, so draws do not depend on the weights' dtype beyond
    the logits themselves.
    """
    from transformers import DynamicCache

    from . import sampler
    dev = input_ids.device
    if static is None:
        static = (dev.type == "cuda" and next(model.parameters()).dtype != torch.float64
                  and sampler.supported(model))
    if static:
        return sampler.generate_static(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                                       generator=generator, token_chunk=token_chunk, capture=dev.type == "cuda")
    if (dev.type == "cpu" if lean is None else lean) and sampler.lean_supported(model):   # the same tokens, without transformers' per-step overhead
        return sampler.generate_lean(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id,
                                     generator=generator, token_chunk=token_chunk)
    stop = torch.as_tensor([stop] if isinstance(stop, int) else list(stop), dtype=torch.long, device=dev)
    B = input_ids.shape[0]

    def draw(logits, rows):
        return sampler._draw_multinomial(logits, temperature, generator)

    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    h, kv = last_hidden(model, DynamicCache(), input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
    next_pos = pos[:, -1] + 1
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    new_tokens = []
    for _ in range(max_new_tokens):
        tok = draw_chunked(model, h, token_chunk, draw)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        new_tokens.append(tok)
        done = done | torch.isin(tok, stop)
        if bool(done.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        h, kv = last_hidden(model, kv, input_ids=tok[:, None], attention_mask=attention_mask,
                            position_ids=next_pos[:, None])
        next_pos = next_pos + 1
    return torch.stack(new_tokens, dim=1)


def assemble(tokenizer, problems, prompt_ids, prompt_mask, new_tokens, G: int, verifier=None, stop=None,
             lengths=None) -> RolloutBatch:
    """Build a RolloutBatch from left-padded prompts (B, P) and sampled tokens (B, T).

    A response is its tokens up to and including the first of the `stop` ids (default: the
    tokenizer's eos) and, when `lengths` (B,) is given, at most that many tokens.
    """
    verifier = verifier or tasks.verify
    stop = [tokenizer.eos_token_id] if stop is None else list(stop)
    pad = _pad_id(tokenizer, stop)
    B, T = new_tokens.shape
    is_stop = torch.isin(new_tokens, torch.as_tensor(stop, dtype=torch.long))
    after_stop = (is_stop.cumsum(1) - is_stop.long()) > 0
    resp = ~after_stop
    if lengths is not None:
        resp &= torch.arange(T)[None] < torch.as_tensor(lengths)[:, None]
    input_ids = torch.cat([prompt_ids, torch.where(resp, new_tokens, torch.full_like(new_tokens, pad))], dim=1)
    attention_mask = torch.cat([prompt_mask, resp.long()], dim=1)
    response_mask = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), resp], dim=1)
    texts = [tokenizer.decode(new_tokens[i][resp[i]].tolist(), skip_special_tokens=True) for i in range(B)]
    group = torch.arange(len(problems)).repeat_interleave(G)
    reward = torch.tensor([verifier(problems[g], t) for g, t in zip(group.tolist(), texts)], dtype=torch.float64)
    return RolloutBatch(input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, group=group,
                        reward=reward, advantage=group_advantages(reward, group), problems=list(problems), texts=texts)


def _pad_id(tokenizer, stop) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]


def encode_prompts(tokenizer, texts) -> list[list[int]]:
    """Token ids of each rendered prompt, as both backends see them (no special tokens added:
    a chat template already holds its own)."""
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _left_pad(seqs, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(map(len, seqs))
    ids = torch.full((len(seqs), P), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), P), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, P - len(s):], mask[i, P - len(s):] = torch.as_tensor(s), 1
    return ids, mask


def sample(sampler, tokenizer, cfg: SampleConfig, problems=None, seed: int | None = None) -> RolloutBatch:
    """Sample cfg.G rollouts per problem, score them with the source's verifier, and compute group
    advantages. `problems` default: cfg.source.draw(cfg.n_prompts, seed); `seed` default cfg.seed.

    `sampler` is what `make_sampler` returns: a HF causal LM ('hf') or a vllm.LLM ('vllm').
    Reproducible per device: the same sampler, problems and seed give the same batch.
    """
    seed = cfg.seed if seed is None else int(seed)
    problems = cfg.source.draw(cfg.n_prompts, seed) if problems is None else list(problems)
    if not problems:
        raise ValueError("sample: no problems to sample from")
    prompts = encode_prompts(tokenizer, [cfg.source.render(p, tokenizer) for p in problems])
    stop = stop_ids(tokenizer, getattr(sampler, "hf_model", sampler))
    pad = _pad_id(tokenizer, stop)
    ids, mask = _left_pad(prompts, pad)
    ids, mask = ids.repeat_interleave(cfg.G, 0), mask.repeat_interleave(cfg.G, 0)
    lengths = None
    if cfg.backend == "vllm":
        seqs = _sample_vllm(sampler, prompts, cfg, seed, stop)
        lengths = [len(s) for s in seqs]
        T = max(max(lengths), 1)
        new = torch.tensor([s + [pad] * (T - len(s)) for s in seqs], dtype=torch.long)
    else:
        new = _sample_hf(sampler, ids, mask, cfg, seed, stop, pad)
    return assemble(tokenizer, problems, ids, mask, new, cfg.G, cfg.source.verifier(), stop, lengths)


def _sample_hf(model, ids, mask, cfg: SampleConfig, seed: int, stop, pad: int) -> torch.Tensor:
    """(B, T) new tokens from our KV-cache sampler, cfg.chunk_size rows per call, one generator
    on the model's device across chunks."""
    device = _device(model)
    if torch.device(cfg.device).type != device.type:
        raise ValueError(f"SampleConfig.device={cfg.device!r} but the sampler is on {device}; build it with "
                         f"make_sampler(..., device={cfg.device!r}) or set device to match")
    gen = torch.Generator(device=device).manual_seed(seed)
    chunks = []
    for s in range(0, ids.shape[0], cfg.chunk_size):
        chunks.append(generate(model, ids[s:s + cfg.chunk_size].to(device), mask[s:s + cfg.chunk_size].to(device),
                               cfg.max_new_tokens, cfg.temperature, stop, pad, generator=gen,
                               token_chunk=cfg.token_chunk).cpu())
    T = max(c.shape[1] for c in chunks)
    return torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=pad) for c in chunks])


# --------------------------------------------------------------------------- vLLM (GPU extra)
def _import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise ImportError("the vllm backend needs vLLM (GPU): pip install -e '.[gpu]'") from e
    return vllm.LLM, vllm.SamplingParams, TokensPrompt


def make_sampler(model, model_path, backend: str = "hf", dtype: str = "float32", seed: int = 0,
                 gpu_memory_utilization: float = 0.3, device: str | None = None):
    """What `sample` samples from: a copy of `model` in `dtype` (on `device` if given) for 'hf';
    for 'vllm' a vllm.LLM over the weights at `model_path` with prefix caching, taking
    `gpu_memory_utilization` of the GPU (the HF model sits beside it), with `model` attached as
    `.hf_model` (its stop ids, `sync_weights`, and the 'exclude' estimator's first token)."""
    if backend == "vllm":
        LLM, _, _ = _import_vllm()
        # keep the engine in this process (as TRL's colocate mode) so sync_weights can reach its model
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(str(model_path), dtype=dtype, seed=seed, enable_prefix_caching=True,
                  gpu_memory_utilization=gpu_memory_utilization)
        llm.hf_model = model
        return llm
    if backend != "hf":
        raise ValueError(f"unknown sampling backend {backend!r}; use 'hf' or 'vllm'")
    from .policy import cast
    sampler = cast(model, dtype)
    return sampler.to(device) if device is not None else sampler


def load_sampler(recipe: dict):
    """(model, tokenizer, sampler) from a recipe: model_path, dtype and device of the float policy
    (policy.load_policy), backend, sample_dtype, seed and gpu_memory_utilization of the sampler
    (make_sampler), threads (CPU). Seeds torch with `seed` first. The sampler carries the recipe as
    `.cancellation_recipe`, so a stage split over processes (procs.py) rebuilds the same sampler
    in every rank."""
    import torch

    from .policy import load_policy
    torch.manual_seed(recipe["seed"])
    if recipe["device"] == "cpu":
        torch.set_num_threads(recipe.get("threads", 1))
    model, tok = load_policy(recipe["model_path"], dtype=recipe["dtype"], device=recipe["device"])
    sampler = make_sampler(model, recipe["model_path"], recipe["backend"], recipe["sample_dtype"], recipe["seed"],
                           recipe["gpu_memory_utilization"])
    model.cancellation_recipe = sampler.cancellation_recipe = dict(recipe)
    return model, tok, sampler


def request_seed(seed: int, *key) -> int:
    """A vLLM request seed (< 2**31) from the batch seed and the request's key (prompt index, ...):
    distinct prompts get distinct random streams, the same call the same ones."""
    blob = json.dumps([int(seed)] + [int(k) for k in key]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "little") % 2**31


def _sample_vllm(llm, prompts: list[list[int]], cfg: SampleConfig, seed: int, stop) -> list[list[int]]:
    """cfg.G responses per prompt (token ids, G consecutive rows per prompt) from a vllm.LLM.

    The prompts go in as the exact token ids the HF path sees. SamplingParams are built directly
    (top_p=1, no top_k, no repetition penalty): the distribution our HF sampler draws from, not
    generation_config.json's defaults that LLM.get_default_sampling_params would apply.
    """
    _, SamplingParams, TokensPrompt = _import_vllm()
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
    update, as TRL does for colocated vLLM; returns the number of tensors sent.

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
    return len(state)


def _load_weights_rpc(worker, weights):  # pragma: no cover - runs inside a vLLM worker process
    worker.model_runner.model.load_weights(weights)
