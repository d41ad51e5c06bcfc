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

Backends (`sampler.py` builds both: `make_sampler`, `load_sampler`; vLLM's calls in `vllm_seam.py`): 'hf' is our
own batched KV-cache sampler over any `transformers` causal LM, seeded by a private torch.Generator on
the model's device (reproducible per device, touches no global RNG); prefill computes logits for the
last position only and the KV cache stays in the model's dtype. 'vllm' (GPU extra) receives the exact
token ids the HF path would see (TokensPrompt), and `vllm_seam.sync_weights` pushes the HF model's
weights into it after each update.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from . import sampling_path, seeds, sources, stage, tasks
from .guard import check_update, knob
from .sampler import sample_hf
from .vllm_seam import sample_vllm


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


# vLLM's share of GPU memory beside the training model: the one declared default of every config that carries it
# (SampleConfig, train.RunConfig / TrainConfig, the figures' Params, TRL's colocated vLLM in engine.grpo_config)
GPU_MEMORY_UTILIZATION = 0.3


@dataclass
class SampleConfig:
    """How to sample one batch: which prompts, how many rollouts each, with what and where."""
    n_prompts: int = 16             # prompts per batch, drawn from `source`
    G: int = 8                      # rollouts per prompt (one group)
    temperature: float = 1.0        # sampling temperature; 0 is greedy decoding
    max_new_tokens: int = 96        # response cap in tokens
    backend: str = "hf"             # 'hf' (a Hugging Face model samples) or 'vllm' (GPU extra)
    hf_sampler: str = "ours"        # the hf backend's path: 'ours', 'transformers' (its generate) or 'auto' (sampling_path)
    device: str = "cpu"             # where the HF sampler runs (make_sampler puts it there; sample checks it)
    dtype: str = "float32"          # sampler weights dtype (tiny analysis copies may be float64)
    seed: int = 0                   # default seed of `sample` (problem draw and sampling)
    source: sources.ProblemSource = field(default_factory=lambda: sources.ProblemSource())  # problems, rendering, verifier
    chunk_size: int = 256           # rollouts per HF sampler call: bounds the KV cache
    token_chunk: int = knob("token_chunk")  # a decode step's LM-head calls: rows per call (guard.KNOB_FIELDS)
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION   # vLLM's share of GPU memory (the HF model sits beside it)

    def __post_init__(self):
        if self.backend not in ("hf", "vllm"):
            raise ValueError(f"SampleConfig.backend={self.backend!r}; allowed: hf, vllm")
        if self.hf_sampler not in sampling_path.PATHS:
            raise ValueError(f"SampleConfig.hf_sampler={self.hf_sampler!r}; allowed: {', '.join(sampling_path.PATHS)}")
        for name in ("n_prompts", "G", "max_new_tokens", "chunk_size", "token_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"SampleConfig.{name}={getattr(self, name)}: must be at least 1")
        check_update(self)  # with the Compute guard on (tests): token_chunk must be the profile's

    def cache_params(self) -> dict:
        """What a stage's key holds of it (`config_params`: the problem file by content hash)."""
        return config_params(self)


def run_sample_config(run, **over) -> SampleConfig:
    """The SampleConfig of a training run's rounds, read off the run's config whole (`train.RunConfig`,
    `train.TrainConfig`): every SampleConfig field the run declares by the same name (n_prompts, G, temperature,
    max_new_tokens, backend, seed, source, gpu_memory_utilization), `chunk_size` from its `sample_rows` when it has
    one, then `over` (what a run's config does not hold: device, dtype, token_chunk)."""
    kw = {f.name: getattr(run, f.name) for f in fields(SampleConfig) if hasattr(run, f.name)}
    if hasattr(run, "sample_rows"):
        kw["chunk_size"] = run.sample_rows
    return SampleConfig(**{**kw, **over})


def config_params(cfg: SampleConfig) -> dict:
    """JSON-able parameters of a SampleConfig for cache keys: the problem file by content hash."""
    from dataclasses import asdict
    p = asdict(cfg)
    p["source"] = cfg.source.params()
    return stage.without_defaults(p, "sample")   # hf_sampler: in the key only when it is not ours


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


def assemble(tokenizer, problems, prompt_ids, prompt_mask, new_tokens, G: int, verifier=None, stop=None,
             lengths=None) -> RolloutBatch:
    """Build a RolloutBatch from left-padded prompts (B, P) and sampled tokens (B, T).

    A response is its tokens up to and including the first of the `stop` ids (default: the
    tokenizer's eos) and, when `lengths` (B,) is given, at most that many tokens.
    """
    verifier = verifier or tasks.verify
    stop = [tokenizer.eos_token_id] if stop is None else list(stop)
    pad = pad_token_id(tokenizer, stop)
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


def pad_token_id(tokenizer, stop) -> int:
    """The id that pads a batch: the tokenizer's pad token, else the first stop id."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]


def encode_prompts(tokenizer, texts) -> list[list[int]]:
    """Token ids of each rendered prompt, as both backends see them (no special tokens added:
    a chat template already holds its own)."""
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def left_pad(seqs, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of token id lists left-padded with `pad` to the longest (the samplers' prompt layout)."""
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

    `sampler` is what `sampler.make_sampler` returns: a HF causal LM ('hf') or a vllm.LLM ('vllm').
    Reproducible per device: the same sampler, problems and seed give the same batch.
    """
    seed = cfg.seed if seed is None else int(seed)
    problems = cfg.source.draw(cfg.n_prompts, seed) if problems is None else list(problems)
    if not problems:
        raise ValueError("sample: no problems to sample from")
    prompts = encode_prompts(tokenizer, [cfg.source.render(p, tokenizer) for p in problems])
    stop = stop_ids(tokenizer, getattr(sampler, "hf_model", sampler))
    pad = pad_token_id(tokenizer, stop)
    ids, mask = left_pad(prompts, pad)
    ids, mask = ids.repeat_interleave(cfg.G, 0), mask.repeat_interleave(cfg.G, 0)
    lengths = None
    if cfg.backend == "vllm":
        seqs = sample_vllm(sampler, prompts, cfg, seed, stop)
        lengths = [len(s) for s in seqs]
        T = max(max(lengths), 1)
        new = torch.tensor([s + [pad] * (T - len(s)) for s in seqs], dtype=torch.long)
    else:
        new = sample_hf(sampler, ids, mask, cfg, seed, stop, pad)
    return assemble(tokenizer, problems, ids, mask, new, cfg.G, cfg.source.verifier(), stop, lengths)
