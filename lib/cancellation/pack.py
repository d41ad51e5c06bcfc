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
- A weight matrix's gradient is a matmul over positions (the reduction runs over the rows). In float64 on the
  AVX2 CPU it is unchanged by the padding's zero products it no longer adds (measured); in float32 it is not
  (up to 7e-7 relative: the kernel blocks the sum by the row count). So the probe also asks whether the packed
  weight gradient holds (`weight_grads_packed`); where it does not, `_PaddedWeightGrad` computes it in the padded
  layout, the packed rows scattered into zeros: the padded forward's own matmul, since its padding rows' output
  gradient is exactly zero (their outputs reach no loss; padding keys are masked) and a zero product adds
  nothing to a sum. The forward and the input gradient stay packed. Biases and norm weights are summed by a
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
    them, no attention dropout in training mode, no gradient checkpointing, no hooks on the body, and a row tile
    under which this CPU's matmuls keep the padded product's rows (`tile`)."""
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
    )
    why = next((why for ok, why in checks if not ok), None)
    if why is None and tile(model) is None:
        why = (f"this CPU's {p.dtype} matmuls keep none of the row tiles {TILES} (the probe: `tile`), so a packed "
               "product could round otherwise than the padded one")
    return why


def _grads(body) -> bool:
    return torch.is_grad_enabled() and any(q.requires_grad for q in body.parameters())


def _shapes(body) -> tuple:
    return tuple(sorted({tuple(m.weight.shape) for m in body.modules() if isinstance(m, torch.nn.Linear)}))


def tile(model) -> int | None:
    """The rows per tile under which this CPU's matmuls round the model's Linear products of a row subset as they
    round the same rows of the full product (`positions`' rule), forward and, while gradients are recorded, the
    input gradient (and the weight gradient computed in the padded layout); None when no tile of TILES holds.
    Probed once per dtype, thread count, shapes."""
    body = model.get_decoder()
    return _probe(next(body.parameters()).dtype, torch.get_num_threads(), _shapes(body), _grads(body))


def weight_grads_packed(model) -> bool:
    """Whether a weight's gradient summed over the packed rows alone is the padded one's, bit for bit, here (float64
    on the AVX2 CPU: yes; float32: no, so `hidden` computes it in the padded layout). Probed like `tile`."""
    body = model.get_decoder()
    T = tile(model)
    return T is not None and _probe_weight_grads(next(body.parameters()).dtype, torch.get_num_threads(),
                                                 _shapes(body), T)


@functools.cache
def _probe(dtype, threads: int, shapes: tuple, grads: bool) -> int | None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for T in TILES:
            if all(_holds(T, dtype, n, k, M, grads, g) for n, k in shapes for M in PROBE_ROWS):
                return T
    return None


@functools.cache
def _probe_weight_grads(dtype, threads: int, shapes: tuple, T: int) -> bool:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return all(_holds(T, dtype, n, k, M, True, g, packed_weight_grad=True) for n, k in shapes for M in PROBE_ROWS)


def _holds(T: int, dtype, n: int, k: int, M: int, grads: bool, g, packed_weight_grad: bool = False) -> bool:
    """Whether, for a random (M, k) input, (n, k) weight and bias and a random real/padding split of the M rows,
    the rows `positions` keeps at tile T give bit for bit the full product's rows and, with `grads`, its input
    gradient's rows and its weight gradient: summed over the kept rows alone (`packed_weight_grad`) or, as
    `_PaddedWeightGrad` sums it, over the padded layout with zeros at the rows not kept."""
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in ((M, k), (n, k), (n,)))
    real = torch.rand(M, generator=g) < 0.6
    rows = _keep(real, T)
    if rows is None or len(rows) < MIN_ROWS:   # `positions` packs no such batch
        return True
    same = linear_keeps_rows(x, rows, w, b) and linear_keeps_rows(x, rows, w)
    if same and grads:   # autograd's mm's: the padding's output gradient is zero (its outputs reach no loss)
        dy = torch.randn(M, n, generator=g, dtype=torch.float64).to(dtype) * real[:, None]
        want = dy.t() @ x
        got = dy[rows].t() @ x[rows] if packed_weight_grad else \
            _scatter(dy[rows], rows, M).t() @ _scatter(x[rows], rows, M)
        same = torch.equal(dy[rows] @ w, (dy @ w)[rows]) and torch.equal(got, want)
    return same


def linear_keeps_rows(x: torch.Tensor, rows: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> bool:
    """Whether F.linear of the rows `rows` of x alone gives the full product's rows bit for bit (the BLAS may
    round a row otherwise with the row count: what the pack here and the sampler's live rows both probe)."""
    return torch.equal(F.linear(x.index_select(0, rows), w, b), F.linear(x, w, b).index_select(0, rows))


def _scatter(t: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Packed rows (len(rows), ...) → (n, ...), zeros at the rows not kept."""
    return t.new_zeros(n, *t.shape[1:]).index_copy_(0, rows, t)


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


def packed_rows(model, am: torch.Tensor) -> torch.Tensor | None:
    """The flat rows `hidden` computes for attention mask `am` (`positions` at this CPU's `tile`), or None: the
    padded forward. A batch without padding or with fewer than MIN_ROWS real positions is not packed, and the
    probe does not run for it (at Qwen3-0.6B's shapes it takes about 30 s on one CPU thread: more than such a
    batch's forward)."""
    real = am.reshape(-1).bool()
    if bool(real.all()) or int(real.sum()) < MIN_ROWS or not on(model):
        return None
    return positions(am, tile(model))


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
        full = _scatter(g, ctx.rows, math.prod(ctx.lead)).view(*ctx.lead, *g.shape[1:])
        summed = full.sum(tuple(range(full.dim() - ctx.w_dim)), keepdim=True)
        return summed.view(g.shape[g.dim() - ctx.w_dim:]), None, None, None


def hidden(model, ids: torch.Tensor, am: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Final hidden states (B, L, d) of the body on input ids, attention mask and positions (B, L), computed at
    the flat positions `rows` (`packed_rows`), zeros elsewhere: there, the floats of `model.get_decoder()`'s
    own forward and, backward, of its parameters' gradients, bit for bit (module doc)."""
    why = refusal(model)
    if why is not None:
        raise ValueError(f"pack.hidden: the padded forward only, here: {why}")
    body = model.get_decoder()
    B, L = ids.shape
    rope, eager, functions, causal_mask = _functions(type(body.layers[0].self_attn).__module__)
    attention = functions.get_interface(model.config._attn_implementation, eager)
    grad = torch.is_grad_enabled()
    padded_dw = _grads(body) and not weight_grads_packed(model)   # float32 here: weight gradients in the padded layout

    def spread(w, shape, flat=False):   # flat: the padded layout (B·L, ...) of a Linear's addmm, else (B, L, ...)
        return _Spread.apply(w, rows, shape, (B * L,) if flat else (B, L)) if grad and w.requires_grad else w

    def linear(m, x):
        b = None if m.bias is None else spread(m.bias, (len(x), m.bias.shape[0]), flat=True)
        if padded_dw and m.weight.requires_grad:
            return _PaddedWeightGrad.apply(x, m.weight, b, rows, B * L)
        return F.linear(x, m.weight) if b is None else F.linear(x, m.weight, b)

    x = body.embed_tokens(ids.reshape(-1)[rows])
    probe = x.new_empty(B, L, 0)   # what the mask and the rotary tables read of the padded input: shape, dtype, device
    mask = causal_mask(config=body.config, inputs_embeds=probe, attention_mask=am, cache=None, position_ids=pos)
    cos, sin = body.rotary_emb(probe, pos)
    for layer in body.layers:
        a, mlp = layer.self_attn, layer.mlp
        h = _norm(layer.input_layernorm, x, spread)
        q, k, v = (_padded(linear(m, h), rows, B, L, a.head_dim) for m in (a.q_proj, a.k_proj, a.v_proj))
        if hasattr(a, "q_norm"):   # Qwen3's per-head norms, padded: their gradients flow in the module's layouts
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        out, _ = attention(a, q, k, v, mask, dropout=a.attention_dropout if a.training else 0.0, scaling=a.scaling,
                           sliding_window=None)
        x = x + linear(a.o_proj, out.reshape(B * L, -1).index_select(0, rows))
        h = _norm(layer.post_attention_layernorm, x, spread)
        x = x + linear(mlp.down_proj, mlp.act_fn(linear(mlp.gate_proj, h)) * linear(mlp.up_proj, h))
    x = _norm(body.norm, x, spread)
    return _scatter(x, rows, B * L).view(B, L, -1)


def _padded(t, rows, B, L, head_dim):
    """Packed (n, H·D) → (B, L, H, D), zeros at the positions not computed: the module's `proj(h).view(B, L, H, D)`."""
    return _scatter(t, rows, B * L).view(B, L, -1, head_dim)


class _PaddedWeightGrad(torch.autograd.Function):
    """F.linear(x, w, b) on packed rows x (nn.Linear's forward on (B·L, d): addmm with the bias), with autograd's
    own backward formulas (`mm_mat1_backward`, `mm_mat2_backward`) except that the weight's gradient is summed over
    the padded layout of n rows, x and the output gradient scattered into zeros at the rows not computed: the
    padded forward's matmul over positions, where this CPU's kernels sum a row subset otherwise (float32)."""

    @staticmethod
    def forward(ctx, x, w, b, rows, n):
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.n = rows, n
        return F.linear(x, w) if b is None else F.linear(x, w, b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = dy.mm(w) if ctx.needs_input_grad[0] else None
        dw = _scatter(dy, ctx.rows, ctx.n).t().mm(_scatter(x, ctx.rows, ctx.n)) if ctx.needs_input_grad[1] else None
        db = dy if ctx.needs_input_grad[2] else None   # addmm's: the output gradient, summed by `_Spread`
        return dx, dw, db, None, None


def _norm(m, x, spread):
    """An RMSNorm's forward (`_norm_kind`: policy.exact_norms' or transformers' own) on packed rows."""
    dt = torch.promote_types(x.dtype, torch.float32) if _norm_kind(m) == "exact" else torch.float32
    y = x.to(dt)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
    return spread(m.weight, x.shape) * y.to(x.dtype)
