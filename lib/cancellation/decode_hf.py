"""The decode paths through transformers' own machinery: the eager DynamicCache loop and transformers' generate.

`generate_eager` is the reference loop: a DynamicCache, one body forward per token, the multinomial
draw; the tiny profile's tables were sampled with it (on a CPU `sampler.generate` runs the lean step
instead, decode_lean.py, which draws the same tokens from the same generator). `generate_transformers`
is transformers' own `generate` with a static cache (compiled by transformers on CUDA), the same law;
`sampler.generate(path=...)` picks it, and a figure's `hf_sampler` ('auto': sampling_path.py,
gpu-check's measured choice on CUDA, ours on a CPU) says which.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .decode_common import bucket_rows, draw_chunked, draw_multinomial, last_hidden

HF_LEN_BUCKET = 64   # prompts left-padded to a multiple of this: fewer static-cache shapes, fewer recompiles


@torch.no_grad()
def generate_transformers(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop,
                          pad_id: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T) new tokens from transformers' own `generate` with a static KV cache (which transformers
    torch.compiles on CUDA): the path gpu-check measured faster than ours on the H200 (sampling_path.py).

    The same law as `sampler.generate`: ancestral sampling at `temperature` (0: greedy) with every other logits
    processor off (top-k, top-p, min-p, repetition penalty: set here, so a checkpoint's generation_config.json
    cannot switch one on), the same stop ids and pad after the first stop. Other draws: transformers samples
    from torch's global generator, which runs forked and seeded from `generator`, so a seed reproduces on one
    device. On CUDA prompts are left-padded to a multiple of HF_LEN_BUCKET and rows to `bucket_rows` (copies of
    row 0, dropped): a handful of cache shapes, so compile runs a handful of times. No stop id (stop < 0 only):
    every row runs to the cap (min_new_tokens), as gpu-check's benchmark ran it."""
    from transformers import GenerationConfig   # imported late: transformers is slow to import

    dev, B = input_ids.device, input_ids.shape[0]
    stops = [int(s) for s in ([stop] if isinstance(stop, int) else list(stop)) if int(s) >= 0]
    P, rows = input_ids.shape[1], B
    if dev.type == "cuda":   # only compile needs few shapes; on a CPU the padding would be work for nothing
        P, rows = -(-P // HF_LEN_BUCKET) * HF_LEN_BUCKET, bucket_rows(B)
    ids = F.pad(input_ids, (P - input_ids.shape[1], 0), value=pad_id)
    mask = F.pad(attention_mask, (P - attention_mask.shape[1], 0), value=0)
    ids, mask = torch.cat([ids, ids[:1].expand(rows - B, -1)]), torch.cat([mask, mask[:1].expand(rows - B, -1)])
    law = (dict(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0, min_p=None, typical_p=1.0)
           if temperature > 0 else dict(do_sample=False))
    gc = GenerationConfig(**law, repetition_penalty=1.0, no_repeat_ngram_size=0, max_new_tokens=max_new_tokens,
                          min_new_tokens=0 if stops else max_new_tokens, eos_token_id=stops or None,
                          pad_token_id=pad_id, cache_implementation="static")
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)) if generator is not None \
        else torch.initial_seed()
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
    return out[:B, P:]


@torch.no_grad()
def generate_eager(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
                   generator: torch.Generator | None = None, *, token_chunk: int) -> torch.Tensor:
    """`sampler.generate`'s eager DynamicCache loop: (B, T) new tokens, pad after the first stop id; the
    multinomial draw from `generator`, every row every step (see `sampler.generate` for the law)."""
    from transformers import DynamicCache

    dev = input_ids.device
    stop = torch.as_tensor([stop] if isinstance(stop, int) else list(stop), dtype=torch.long, device=dev)
    B = input_ids.shape[0]

    def draw(logits, rows):
        return draw_multinomial(logits, temperature, generator)

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
