"""The body forward with the padding packed out (issue 52, "padding pack"): the padded forward's floats, bit for bit.

A batch of left-padded prompts and right-padded responses is largely padding (notebook 01's: a half to four
fifths real positions). Norms, projections and the MLP act on each position alone, so `hidden` runs them on a packed
(n, d) tensor of the positions that matter; attention, which mixes positions, runs in the padded (B, H, L, D)
layout with the model's own mask and attention function: the packed q, k, v are scattered into zeros (padding
keys are masked, so their values never reach a real query) and its output is gathered back.

Why the floats are the padded forward's, and the parameters' gradients too:
- A float64/float32 matmul (MKL, the AVX2 CPU it was built on) rounds each row of its left operand alone when
  the row sits in a 4-row tile; the last M mod 4 rows go through an edge tile that rounds otherwise (measured: a
  row subset's product differs from the full product's rows exactly there). So the packed rows are the real
  positions, the batch's last B·L mod T positions (the padded matmul's edge tile, same size, same place), and as
  many leading padding positions as make the count ≡ B·L (mod T): every row then sits where the padded matmul
  put it, in a full tile or in the edge tile.
- The tile is a property of the CPU's BLAS kernels (its instruction set, its thread count), so it is not
  assumed: `tile` probes it once per process, dtype, thread count and weight shapes, on random operands of the
  model's own Linear shapes at row counts with every edge size, forward and (when gradients are recorded) the
  input and weight gradients, for T = 4, 8, 16 in turn. A CPU where none holds packs nothing (`refusal` says so),
  so a table cannot change bits on a machine the rule was not measured on.
- Elementwise ops round each element alone; each norm reduces one row; RoPE's tables are the model's own,
  computed over the padded (B, L) positions, and RoPE and Qwen3's per-head q/k norms run in the padded layout.
- A weight matrix's gradient (a matmul over positions) in float64 is unchanged by the padding's zero products
  it no longer adds (measured; in float32 it is not: `refusal`). Biases and norm weights are summed by a
  reduction whose blocking depends on the row count: `_Spread` gives them the padded forward's reduction, over
  the same (B, L) layout, zeros at the padding.
Positions left out (padding, except the few above) are not computed: `hidden` gives zeros there. The callers
read the hidden states that predict response tokens only (real positions).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import math

import torch
import torch.nn.functional as F

from . import policy

PACK_TYPES = ("qwen2", "qwen3")   # the decoder layouts we ship (tiny policies: Qwen2; stand-ins, paper: Qwen3)
TILE = 4                          # rows per MKL matmul tile, float64 and float32 (measured on the AVX2 CPU)
TILES = (4, 8, 16)                # the tiles `tile` tries, in order
PROBE_ROWS = (131, 258, 1025, 1031, 4100)   # probe row counts: edge tiles of 0 to 7 rows (mod 4, 8, 16)
MIN_ROWS = 64                     # fewer packed rows: the padded forward (float32 takes other kernels below 8)
_OFF: list = []                   # open `padded()` contexts


def refusal(model) -> str | None:
    """Why `hidden` would not reproduce this model's body forward here, or None: it needs a Qwen2/Qwen3 decoder on
    a CPU in float64 or float32, full attention only, stock attention functions, RMSNorms as `policy.exact_norms` or transformers install
    them, no attention dropout in training mode, no gradient checkpointing, no hooks on the body, and, when the
    body's gradients are recorded, float64 (float32's matmul sums a weight's gradient over positions in blocks
    that the padding's zero rows shift: up to 7e-7 relative, measured)."""
    cfg, body = model.config, model.get_decoder()
    p = next(body.parameters())
    checks = (
        (getattr(cfg, "model_type", None) in PACK_TYPES, f"model_type {getattr(cfg, 'model_type', None)!r} is not "
                                                         f"one of {PACK_TYPES}"),
        (p.device.type == "cpu", f"a {p.device.type} device (the tiles are MKL's)"),
        (p.dtype in (torch.float64, torch.float32), f"{p.dtype} (the tiles are measured in float64 and float32)"),
        (set(getattr(cfg, "layer_types", None) or ["full_attention"]) == {"full_attention"}, "sliding-window layers"),
        (getattr(cfg, "_attn_implementation", None) in ("sdpa", "eager"),
         f"attention {getattr(cfg, '_attn_implementation', None)!r}"),
        (not (model.training and getattr(cfg, "attention_dropout", 0.0)), "attention dropout in training mode"),
        (not any(getattr(m, "gradient_checkpointing", False) for m in model.modules()), "gradient checkpointing"),
        (all(_norm_kind(m) for m in body.modules() if type(m).__name__.endswith("RMSNorm")), "a norm of its own"),
        (not any(m._forward_hooks or m._forward_pre_hooks for m in body.modules()), "hooks on the body"),
        (p.dtype == torch.float64 or not _grads(body), f"gradients in {p.dtype}"),
    )
    why = next((why for ok, why in checks if not ok), None)
    if why is None and tile(model) is None:
        why = (f"this CPU's {p.dtype} matmuls keep none of the row tiles {TILES} (the probe: `tile`), so a packed "
               "product could round otherwise than the padded one")
    return why


def _grads(body) -> bool:
    return torch.is_grad_enabled() and any(q.requires_grad for q in body.parameters())


def tile(model) -> int | None:
    """The rows per tile under which this CPU's matmuls round the model's Linear products of a row subset as they
    round the same rows of the full product (`positions`' rule), forward and, while gradients are recorded, the
    input and weight gradients; None when no tile of TILES holds. Probed once per dtype, thread count, shapes."""
    body = model.get_decoder()
    shapes = tuple(sorted({tuple(m.weight.shape) for m in body.modules() if isinstance(m, torch.nn.Linear)}))
    return _probe(next(body.parameters()).dtype, torch.get_num_threads(), shapes, _grads(body))


@functools.cache
def _probe(dtype, threads: int, shapes: tuple, grads: bool) -> int | None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for T in TILES:
            if all(_holds(T, dtype, n, k, M, grads, g) for n, k in shapes for M in PROBE_ROWS):
                return T
    return None


def _holds(T: int, dtype, n: int, k: int, M: int, grads: bool, g) -> bool:
    """Whether, for a random (M, k) input, (n, k) weight and bias and a random real/padding split of the M rows,
    the rows `positions` keeps at tile T give bit for bit the full product's rows (and gradients)."""
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in ((M, k), (n, k), (n,)))
    real = torch.rand(M, generator=g) < 0.6
    rows = _keep(real, T)
    if rows is None or len(rows) < MIN_ROWS:   # `positions` packs no such batch
        return True
    same = torch.equal(F.linear(x[rows], w, b), F.linear(x, w, b)[rows]) and \
        torch.equal(F.linear(x[rows], w), F.linear(x, w)[rows])
    if same and grads:   # autograd's mm's: the padding's output gradient is zero (its outputs reach no loss)
        dy = torch.randn(M, n, generator=g, dtype=torch.float64).to(dtype) * real[:, None]
        same = torch.equal(dy[rows] @ w, (dy @ w)[rows]) and torch.equal(dy[rows].t() @ x[rows], dy.t() @ x)
    return same


@contextlib.contextmanager
def padded():
    """Every body forward padded (the old way) for the duration: the reference of tests and `make bench B=pack`."""
    _OFF.append(True)
    try:
        yield
    finally:
        _OFF.pop()


def on(model) -> bool:
    """Whether `measure.forward_hidden` packs this model's forward now (not inside `padded`, no `refusal`)."""
    return not _OFF and refusal(model) is None


def _norm_kind(m) -> str | None:
    """'exact' (policy.exact_norms' forward), 'stock' (the class's own, float32 inside) or None (other)."""
    f = m.__dict__.get("forward")
    if f is None:
        return "stock" if type(m).__name__ in ("Qwen2RMSNorm", "Qwen3RMSNorm") else None
    return "exact" if getattr(f, "__func__", None) is policy._rmsnorm_forward else None


@functools.cache
def _functions(module_name: str):
    """(apply_rotary_pos_emb, eager attention, the attention interface lookup, create_causal_mask) of a
    modeling module: the functions its forward calls, so the packed forward rounds exactly as it does."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    mod = importlib.import_module(module_name)
    return mod.apply_rotary_pos_emb, mod.eager_attention_forward, ALL_ATTENTION_FUNCTIONS, mod.create_causal_mask


def positions(am: torch.Tensor, tile: int = TILE) -> torch.Tensor | None:
    """Flat indices into (B·L) of the rows `hidden` computes at matmul tile `tile` (see the module doc), in order;
    None when packing saves nothing or the matmuls would be too small (the padded forward then runs)."""
    rows = _keep(am.reshape(-1).bool(), tile)
    if rows is None or len(rows) == am.numel() or len(rows) < MIN_ROWS:
        return None
    return rows


def _keep(real: torch.Tensor, tile: int) -> torch.Tensor | None:
    """The flat rows kept of M rows whose real ones are `real` (M,): the real rows, the last M mod tile rows (the
    edge tile, in place) and the first padding rows that make the count ≡ M (mod tile); None if too few exist."""
    total = real.numel()
    edge = total % tile
    keep = real.clone()
    if edge:
        keep[total - edge:] = True
    lead = (edge - int(keep.sum())) % tile
    pad = (~keep).nonzero().squeeze(1)[:lead]
    if len(pad) < lead:
        return None
    keep[pad] = True
    return keep.nonzero().squeeze(1)


class _Spread(torch.autograd.Function):
    """A bias or norm weight w broadcast over a packed operand of shape (n, ...); its gradient summed as the
    padded forward's autograd sums it (`at::sum_to`): over the padded layout `lead` + (...), zeros at the
    positions not computed, every dim but w's own."""

    @staticmethod
    def forward(ctx, w, rows, shape, lead):
        ctx.rows, ctx.lead, ctx.w_dim = rows, lead, w.dim()
        return w.expand(shape)

    @staticmethod
    def backward(ctx, g):
        full = g.new_zeros(math.prod(ctx.lead), *g.shape[1:]).index_copy_(0, ctx.rows, g)
        full = full.view(*ctx.lead, *g.shape[1:])
        summed = full.sum(tuple(range(full.dim() - ctx.w_dim)), keepdim=True)
        return summed.view(g.shape[g.dim() - ctx.w_dim:]), None, None, None


def hidden(model, ids: torch.Tensor, am: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Final hidden states (B, L, d) of the body on input ids, attention mask and positions (B, L), computed at
    the flat positions `rows` (`positions(am)`), zeros elsewhere: there, the floats of `model.get_decoder()`'s
    own forward and, backward, of its parameters' gradients, bit for bit (module doc)."""
    why = refusal(model)
    if why is not None:
        raise ValueError(f"pack.hidden: the padded forward only, here: {why}")
    body = model.get_decoder()
    B, L = ids.shape
    rope, eager, functions, causal_mask = _functions(type(body.layers[0].self_attn).__module__)
    attention = functions.get_interface(model.config._attn_implementation, eager)
    grad = torch.is_grad_enabled()

    def spread(w, shape, flat=False):   # flat: the padded layout (B·L, ...) of a Linear's addmm, else (B, L, ...)
        return _Spread.apply(w, rows, shape, (B * L,) if flat else (B, L)) if grad and w.requires_grad else w

    x = body.embed_tokens(ids.reshape(-1)[rows])
    probe = x.new_empty(B, L, 0)   # what the mask and the rotary tables read of the padded input: shape, dtype, device
    mask = causal_mask(config=body.config, inputs_embeds=probe, attention_mask=am, cache=None, position_ids=pos)
    cos, sin = body.rotary_emb(probe, pos)
    for layer in body.layers:
        a, mlp = layer.self_attn, layer.mlp
        h = _norm(layer.input_layernorm, x, spread)
        q, k, v = (_padded(_linear(m, h, spread), rows, B, L, a.head_dim) for m in (a.q_proj, a.k_proj, a.v_proj))
        if hasattr(a, "q_norm"):   # Qwen3's per-head norms, padded: their gradients flow in the module's layouts
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        out, _ = attention(a, q, k, v, mask, dropout=a.attention_dropout if a.training else 0.0, scaling=a.scaling,
                           sliding_window=None)
        x = x + _linear(a.o_proj, out.reshape(B * L, -1).index_select(0, rows), spread)
        h = _norm(layer.post_attention_layernorm, x, spread)
        x = x + _linear(mlp.down_proj, mlp.act_fn(_linear(mlp.gate_proj, h, spread)) * _linear(mlp.up_proj, h, spread),
                        spread)
    x = _norm(body.norm, x, spread)
    return x.new_zeros(B * L, x.shape[-1]).index_copy(0, rows, x).view(B, L, -1)


def _padded(t, rows, B, L, head_dim):
    """Packed (n, H·D) → (B, L, H, D), zeros at the positions not computed: the module's `proj(h).view(B, L, H, D)`."""
    return t.new_zeros(B * L, t.shape[1]).index_copy(0, rows, t).view(B, L, -1, head_dim)


def _linear(m, x, spread):
    """nn.Linear's forward on packed rows (a 2-D input: addmm with the bias, as the module's on (B·L, d))."""
    if m.bias is None:
        return F.linear(x, m.weight)
    return F.linear(x, m.weight, spread(m.bias, (len(x), m.bias.shape[0]), flat=True))


def _norm(m, x, spread):
    """An RMSNorm's forward (`_norm_kind`: policy.exact_norms' or transformers' own) on packed rows."""
    dt = torch.promote_types(x.dtype, torch.float32) if _norm_kind(m) == "exact" else torch.float32
    y = x.to(dt)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    return spread(m.weight, x.shape) * y.to(x.dtype)
