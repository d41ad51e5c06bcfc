"""What every decode path shares: the shape buckets, the draws, and the body forward with a KV cache.

The static-cache path (decode_static.py), the lean CPU step (decode_lean.py) and the eager loops
(decode_hf.py) all draw with these functions, so a token drawn on one path is drawn by the same code on
another; workload.py and plan.py read the buckets to count what a batch will cost without importing any path.
"""
from __future__ import annotations

import inspect
import math

import torch

from . import measure

# The captured path pads rows to a power of two and the cache length to a multiple of 256 (decode_static.py):
# a run then captures a handful of graphs; transformers' generate pads rows the same way (decode_hf.py).
ROW_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LEN_BUCKET = 256


def bucket_rows(n: int) -> int:
    return next((b for b in ROW_BUCKETS if b >= n), n)


def bucket_len(n: int) -> int:
    return LEN_BUCKET * math.ceil(n / LEN_BUCKET)


def supported(model) -> bool:
    """Whether the static path can run this model: every layer full attention (no sliding window)."""
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return set(types) == {"full_attention"}


def draw_multinomial(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def icdf(probs, u):
    """Inverse-CDF draw: per row, the token whose cumulative probability first exceeds u · total
    (u (rows,) in [0, 1)); float64 probabilities keep the law exact up to round-off."""
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:]).squeeze(1).clamp(max=probs.shape[1] - 1)


def draw_icdf(logits, temperature, u):
    """The decode step's inverse-CDF draw without bans (tests check its law)."""
    if temperature == 0:
        return logits.argmax(-1)
    return icdf(torch.softmax(logits.double() / temperature, dim=-1), u)


def model_device(model) -> torch.device:
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
