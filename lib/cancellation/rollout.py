"""RolloutBatch, batched sampling, rewards and group-normalised advantages.

Layout of a batch (one row per rollout): left-padded prompt, then the sampled response, then
right padding. `attention_mask` marks real tokens, `response_mask` the response tokens (the
<eos> included), positions are `cumsum(attention_mask) - 1` so padding never shifts them.
Position t of every per-token tensor refers to token `input_ids[:, t]` predicted from the
tokens before it.

Sampling backends sit behind `sample_batch(..., backend=)`: 'hf' is our own batched KV-cache
sampler over any `transformers` causal LM (seeded by a private torch.Generator, so it is
reproducible and touches no global RNG); 'vllm' is the seam for the GPU profile.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from . import tasks


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
    """
    reward = reward.to(torch.float64)
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


@torch.no_grad()
def generate(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, eos_id: int, pad_id: int,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Batched ancestral sampling with a KV cache; returns (B, T) new tokens, pad after <eos>.

    temperature 0 is greedy decoding. The cache is any `transformers` Cache (DynamicCache).
    """
    from transformers import DynamicCache

    B = input_ids.shape[0]
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, past_key_values=cache,
                use_cache=True)
    logits, next_pos = out.logits[:, -1], pos[:, -1] + 1
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    new_tokens = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.double() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        new_tokens.append(tok)
        done = done | (tok == eos_id)
        if bool(done.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attention_mask, position_ids=next_pos[:, None],
                    past_key_values=out.past_key_values, use_cache=True)
        logits, next_pos = out.logits[:, -1], next_pos + 1
    return torch.stack(new_tokens, dim=1)


def assemble(tokenizer, problems, prompt_ids, prompt_mask, new_tokens, G: int, verifier=None) -> RolloutBatch:
    """Build a RolloutBatch from left-padded prompts (B, P) and sampled tokens (B, T)."""
    verifier = verifier or tasks.verify
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    B, T = new_tokens.shape
    # a response token is real up to and including the first <eos>
    is_eos = new_tokens == eos
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    resp = ~after_eos
    input_ids = torch.cat([prompt_ids, torch.where(resp, new_tokens, torch.full_like(new_tokens, pad))], dim=1)
    attention_mask = torch.cat([prompt_mask, resp.long()], dim=1)
    response_mask = torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), resp], dim=1)
    texts = [tokenizer.decode(new_tokens[i][resp[i]].tolist()) for i in range(B)]
    group = torch.arange(len(problems)).repeat_interleave(G)
    reward = torch.tensor([verifier(problems[g], t) for g, t in zip(group.tolist(), texts)], dtype=torch.float64)
    return RolloutBatch(input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, group=group,
                        reward=reward, advantage=group_advantages(reward, group), problems=list(problems), texts=texts)


def sample_batch(model, tokenizer, problems, G: int = 8, temperature: float = 1.0, max_new_tokens: int = 96,
                 seed: int = 0, backend: str = "hf", chunk_size: int = 256, verifier=None) -> RolloutBatch:
    """Sample G rollouts per problem, score them, and compute group advantages.

    Reproducible: the same model, problems and seed give the same batch (hf backend).
    """
    if backend == "vllm":
        return _sample_vllm(model, tokenizer, problems, G, temperature, max_new_tokens, seed, verifier)
    if backend != "hf":
        raise ValueError(f"unknown sampling backend {backend!r}; use 'hf' or 'vllm'")
    prompts = [p.prompt for p in problems for _ in range(G)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    chunks = []
    for s in range(0, len(prompts), chunk_size):
        ids = enc["input_ids"][s:s + chunk_size].to(device)
        am = enc["attention_mask"][s:s + chunk_size].to(device)
        chunks.append(generate(model, ids, am, max_new_tokens, temperature, tokenizer.eos_token_id,
                               tokenizer.pad_token_id, generator=gen).cpu())
    T = max(c.shape[1] for c in chunks)
    new = torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=tokenizer.pad_token_id) for c in chunks])
    return assemble(tokenizer, problems, enc["input_ids"], enc["attention_mask"], new, G, verifier)


def make_sampler(model, model_path, backend: str = "hf", dtype: str = "float32", seed: int = 0):
    """What `sample_batch(backend=...)` samples from: a copy of `model` in `dtype` ('hf'), or a
    vllm.LLM over the same weights with prefix caching ('vllm', GPU profile)."""
    if backend == "vllm":
        try:
            from vllm import LLM
        except ImportError as e:  # pragma: no cover - optional dependency
            raise ImportError("the vllm backend needs vLLM: pip install -e '.[gpu]'") from e
        return LLM(str(model_path), dtype=dtype, seed=seed, enable_prefix_caching=True)
    from .policy import cast
    return cast(model, dtype)


def _sample_vllm(model, tokenizer, problems, G, temperature, max_new_tokens, seed, verifier):  # pragma: no cover
    """vLLM backend (GPU profile): `model` is a vllm.LLM built from the same weights."""
    try:
        from vllm import SamplingParams
    except ImportError as e:
        raise ImportError("the vllm backend needs vLLM: pip install -e '.[gpu]'") from e
    sp = SamplingParams(n=G, temperature=temperature, max_tokens=max_new_tokens, seed=seed)
    outs = model.generate([p.prompt for p in problems], sp)
    enc = tokenizer([p.prompt for p in problems for _ in range(G)], return_tensors="pt", padding=True,
                    padding_side="left", add_special_tokens=False)
    seqs = [list(c.token_ids) for o in outs for c in o.outputs]
    T = max(map(len, seqs))
    new = torch.tensor([s + [tokenizer.pad_token_id] * (T - len(s)) for s in seqs])
    return assemble(tokenizer, problems, enc["input_ids"], enc["attention_mask"], new, G, verifier)
