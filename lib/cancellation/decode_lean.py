"""The lean CPU decode step: a Qwen2/Qwen3 body's decode step without its per-token module calls.

On a CPU a tiny model's decode step is overhead: per token, transformers' DynamicCache concatenates
every layer's whole keys/values (the largest share for the tiny policy), builds a 4-D mask, and runs
each module through its wrappers. `LeanStep` calls the same functions on the same tensors in the same
order (so every float, and so every draw, is bit for bit what the module forward gives), with a
preallocated cache written in place and attended over its written columns only.

`generate_lean` is `sampler.generate`'s eager loop run through it (the CPU default); the static-cache
path's eager step (decode_static.py) runs through it too. Live rows (below): once rows stop, the step runs
on fewer rows only at row counts a probe on this machine showed to round every row as the full batch does.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from . import measure, pack
from .decode_common import draw_chunked, draw_multinomial, last_hidden, model_device, supported

LEAN_TYPES = ("qwen2", "qwen3")    # the decoder layouts we ship (tiny policies: Qwen2; stand-ins, paper: Qwen3)


def lean_supported(model) -> bool:
    """Whether the lean step reproduces this model's forward: a Qwen2/Qwen3 decoder with full attention
    only, stock attention functions, no attention dropout in training mode, and no forward hooks (the
    lean step calls modules' forward directly)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in LEAN_TYPES or not supported(model):
        return False
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    if model.training and getattr(cfg, "attention_dropout", 0.0):   # the lean step never drops attention
        return False
    return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@functools.cache
def _attention_functions(module_name: str):
    """(apply_rotary_pos_emb, the attention interface lookup) of a modeling module: the functions its
    attention forward calls, so the lean step rounds exactly as it does."""
    import importlib

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    mod = importlib.import_module(module_name)
    return mod.apply_rotary_pos_emb, mod.eager_attention_forward, ALL_ATTENTION_FUNCTIONS


def _linear(m):
    """(weight, bias) of an nn.Linear: `F.linear(x, *_linear(m))` is its forward, without the module call."""
    return m.weight, m.bias


class _LeanLayer:
    """One decoder layer's weights and norms, looked up once: a decode step then makes no module calls
    (each costs microseconds of Python per token, the same order as the tiny model's arithmetic)."""

    def __init__(self, layer):
        a, mlp = layer.self_attn, layer.mlp
        self.attn, self.head_dim, self.scaling = a, a.head_dim, a.scaling
        # norms through their forward as installed (policy.exact_norms replaces it on float64 models)
        self.ln1, self.ln2 = layer.input_layernorm.forward, layer.post_attention_layernorm.forward
        self.q_norm = a.q_norm.forward if hasattr(a, "q_norm") else None   # Qwen3: per-head norms of q and k
        self.k_norm = a.k_norm.forward if hasattr(a, "k_norm") else None
        self.q, self.k, self.v, self.o = (_linear(m) for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
        self.gate, self.up, self.down = (_linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        self.act = mlp.act_fn.forward


class LeanStep:
    """One decode step of a Qwen2/Qwen3 body over a preallocated KV cache (rows, kv heads, L, head dim).

    `fill` takes the prefill's DynamicCache; `__call__(tok, pos, col, mask)` feeds tokens (rows,) at
    positions `pos` (rows, 1), writes their keys/values at cache column `col`, attends over columns
    0..col with `mask` (None, or a (rows, 1, 1, >= col + 1) bool or additive mask, sliced here) and
    returns the final norm's hidden states (rows, d): what `body(...).last_hidden_state[:, -1]` gives,
    bit for bit (the same functions on the same tensors in the same order as the modules' forward).

    Attention on live rows only: after `drop(done)`, rows that have stopped leave the cache and the
    attention (`live`: the rows still in it). Attention is computed per (row, head), so the live rows'
    outputs do not change (on one thread: on more, CPU attention splits its work by the row count and
    may round a row otherwise; see the live-rows guard below); the stopped rows get zeros and are never
    read (their tokens are pad).

    Every op on live rows: after `narrow(rows)` the step runs on `rows` only (the caller feeds
    tok[rows], pos[rows] and gets their hidden states). A matmul's rows may round differently with the
    row count (BLAS blocks rows by count and by ISA), so the caller narrows only to row counts that
    `rows_stable` verified on this machine; otherwise every op keeps all rows, as before.
    """

    def __init__(self, model):
        body = model.get_decoder()
        self.embed, self.rotary, self.norm = body.embed_tokens, body.rotary_emb, body.norm.forward
        self.layers = [_LeanLayer(layer) for layer in body.layers]
        rope, eager, functions = _attention_functions(type(body.layers[0].self_attn).__module__)
        self.rope = rope
        self.attention = functions.get_interface(model.config._attn_implementation, eager)
        self.keys = self.values = None
        self.n = 0           # rows of the batch (all rows)
        self.written = 0     # cache columns written so far (the rest are never read before being written)
        self.rows = None     # indices of the rows every op runs on: the step's inputs and outputs (None: all)
        self.live = None     # indices of the rows still in the cache and the attention, within `rows` (None: all)
        self.sel = None      # positions of `live` within `rows` (None: the same rows)

    def fill(self, kv, L: int):
        """Copy the prefill's keys/values (rows, kv heads, P, D) into buffers of L columns."""
        self.keys, self.values = [], []
        self.n, self.rows, self.live, self.sel = kv.layers[0].keys.shape[0], None, None, None
        self.written = kv.layers[0].keys.shape[2]
        for layer in kv.layers:
            for bufs, src in ((self.keys, layer.keys), (self.values, layer.values)):
                B, H, P, D = src.shape
                buf = src.new_empty(B, H, L, D)
                buf[:, :, :P] = src
                bufs.append(buf)

    def drop(self, done: torch.Tensor, mask):
        """Take the rows that have stopped (`done`, over all rows) out of the cache and the attention;
        returns the attention mask of the rows that stay (None stays None)."""
        return self._keep((~done[self._live()]).nonzero().squeeze(1), mask)

    def narrow(self, rows: torch.Tensor, mask):
        """Run every op on `rows` only (sorted indices of all rows, a subset of the current `rows` holding
        every row still running); the cache keeps its rows among them. Returns the cache rows' mask."""
        self.rows = rows
        return self._keep(torch.isin(self._live(), rows).nonzero().squeeze(1), mask)

    def _live(self) -> torch.Tensor:
        return self.live if self.live is not None else torch.arange(self.n, device=self.keys[0].device)

    def _keep(self, keep: torch.Tensor, mask):
        """Keep the cache rows at positions `keep` of `live`; `sel` maps them into `rows`."""
        self.keys = [self._take(K, keep) for K in self.keys]
        self.values = [self._take(V, keep) for V in self.values]
        self.live = self._live().index_select(0, keep)
        rows = self.rows if self.rows is not None else torch.arange(self.n, device=keep.device)
        self.sel = None if len(self.live) == len(rows) else torch.searchsorted(rows, self.live)
        return None if mask is None else mask.index_select(0, keep)

    def _take(self, X, keep):
        """X's rows `keep`, its written columns copied (the others are written before they are read); a
        sampler's cache carries no gradient (detached: index_select into a view records none)."""
        new = X.new_empty(len(keep), *X.shape[1:])
        torch.index_select(X[:, :, :self.written].detach(), 0, keep, out=new[:, :, :self.written])
        return new

    def __call__(self, tok, pos, col: int, mask):
        self.written = max(self.written, col + 1)
        x = self.embed(tok[:, None])
        cos, sin = self.rotary(x, pos)
        m = None if mask is None else mask[..., :col + 1]
        for i, ly in enumerate(self.layers):
            x = x + self._attend(ly, ly.ln1(x), cos, sin, i, col, m)
            h = ly.ln2(x)
            x = x + F.linear(ly.act(F.linear(h, *ly.gate)) * F.linear(h, *ly.up), *ly.down)
        return self.norm(x)[:, -1]

    def _attend(self, ly, h, cos, sin, i, col, mask):
        """Qwen2Attention/Qwen3Attention.forward for one new position, its keys/values written at `col`."""
        shape = (*h.shape[:-1], -1, ly.head_dim)
        q, k = F.linear(h, *ly.q).view(shape), F.linear(h, *ly.k).view(shape)
        if ly.q_norm is not None:
            q, k = ly.q_norm(q), ly.k_norm(k)
        q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        v = F.linear(h, *ly.v).view(shape).transpose(1, 2)
        if self.sel is not None:
            q, k, v = (t.index_select(0, self.sel) for t in (q, k, v))
        K, V = self.keys[i], self.values[i]
        K[:, :, col] = k[:, :, 0]    # written in place: no per-step concatenation of the whole cache
        V[:, :, col] = v[:, :, 0]
        out, _ = self.attention(ly.attn, q, K[:, :, :col + 1], V[:, :, :col + 1], mask, dropout=0.0,
                                scaling=ly.scaling, sliding_window=None)
        if self.sel is not None:   # stopped rows: zeros (finite, never read)
            out = out.new_zeros(h.shape[0], *out.shape[1:]).index_copy_(0, self.sel, out)
        return F.linear(out.reshape(*h.shape[:-1], -1).contiguous(), *ly.o)


# --------------------------------------------------------------------------- live rows: the guard
# Running a decode step on the live rows only changes each op's row count, and a kernel may then round a
# row otherwise: a BLAS kernel blocks rows by count (full panels of 4 or 8 rows, another kernel for the
# remainder) and by ISA (AVX2 here, AVX-512 where the committed tables were made), and with more than one
# thread both the matmuls and CPU attention split their work by count (measured, torch 2.13 on 2 threads:
# SDPA gives a row other floats in a batch of 12 than of 16). A table would move without an error, so the
# step narrows only on one thread and only to row counts that a probe on this machine, in this process, at
# these shapes showed to give the full batch's floats.
LIVE_ROW_MULTIPLE = 4   # live rows round up to a multiple of this (AVX2: float64 rows bit-stable at multiples of 4)
PROBE_COLUMNS = 8       # cache columns the probe's step attends over (some masked)
_STABLE_ROWS: dict = {}   # (model class, dtype, parameter shapes, B, r) -> rows_probe's verdict


def rows_stable(model, B: int, r: int) -> bool:
    """Whether a decode step over r of B rows gives those rows exactly the floats it gives them among
    all B, on this machine: one thread, and `rows_probe` (once per process and per dtype, shapes, B, r)."""
    if torch.get_num_threads() != 1:
        return False
    key = (type(model).__name__, str(next(model.parameters()).dtype),
           tuple(tuple(p.shape) for p in model.parameters()), B, r)
    if key not in _STABLE_ROWS:
        _STABLE_ROWS[key] = rows_probe(model, B, r)
    return _STABLE_ROWS[key]


def spread_rows(B: int, r: int) -> torch.Tensor:
    """r sorted indices among B spread over the batch, the first and the last row included: each row
    moves to another place in the smaller batch, the last one out of a remainder panel if B has one."""
    return torch.arange(r) * (B - 1) // max(r - 1, 1)


def rows_probe(model, B: int, r: int) -> bool:
    """Compare with torch.equal, on random inputs from a private generator, B rows against `spread_rows`'
    r rows: every linear layer of the lean step and the LM head, then a whole lean step (norms, rotary,
    activations, attention over PROBE_COLUMNS cache columns, with and without a mask) through the LM head."""
    g = torch.Generator().manual_seed(0)
    dev, dt = model_device(model), next(model.parameters()).dtype

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dev, dt)
    idx = spread_rows(B, r).to(dev)
    step = LeanStep(model)
    head = model.get_output_embeddings()
    linears = [w for ly in step.layers for w in (ly.q, ly.k, ly.v, ly.o, ly.gate, ly.up, ly.down)]
    xs = {}   # one random input per input width
    for w, b in linears + [(head.weight, getattr(head, "bias", None))]:
        if w.shape[1] not in xs:
            xs[w.shape[1]] = randn(B, w.shape[1])
        x = xs[w.shape[1]]
        if not pack.linear_keeps_rows(x, idx, w, b):
            return False
    C = PROBE_COLUMNS
    kv = [tuple(randn(B, ly.k[0].shape[0] // ly.head_dim, C + 1, ly.head_dim) for _ in range(2))
          for ly in step.layers]
    tok = torch.randint(model.config.vocab_size, (B,), generator=g).to(dev)
    pos = torch.randint(C, 2 * C, (B, 1), generator=g).to(dev)
    mask = (torch.rand(B, 1, 1, C + 1, generator=g) > 0.2).index_fill_(3, torch.tensor([C]), True).to(dev)
    for m in (None, mask):
        full = _probe_step(model, step, kv, tok, pos, m)
        sub = _probe_step(model, step, [(K[idx], V[idx]) for K, V in kv], tok[idx], pos[idx],
                          None if m is None else m[idx])
        if not torch.equal(sub, full.index_select(0, idx)):
            return False
    return True


def _probe_step(model, step, kv, tok, pos, mask):
    """The LM head's logits after one lean step of the rows `tok` at `pos`, over a cache `kv` ((keys,
    values) per layer, the last column free) and `mask`."""
    step.keys, step.values = [K.clone() for K, _ in kv], [V.clone() for _, V in kv]
    C = kv[0][0].shape[2] - 1
    step.n, step.rows, step.live, step.sel, step.written = len(tok), None, None, None, C
    return measure.head_logits(model, step(tok, pos, C, mask))


def _stable_count(model, B: int, n_live: int, ops: int) -> int | None:
    """The fewest rows, a multiple of LIVE_ROW_MULTIPLE from n_live up and fewer than the `ops` rows the step
    runs on now, that `rows_stable` accepts (e.g. multiples of 8 only, on a CPU that blocks rows by 8); None:
    keep the rows."""
    first = LIVE_ROW_MULTIPLE * math.ceil(n_live / LIVE_ROW_MULTIPLE)
    return next((r for r in range(first, ops, LIVE_ROW_MULTIPLE) if rows_stable(model, B, r)), None)


def _narrowed(rows: torch.Tensor, done: torch.Tensor, r: int) -> torch.Tensor:
    """r sorted rows among `rows`: every row still running, then stopped ones (their tokens are pad and
    their outputs never read) to fill r, a count `rows_stable` accepted."""
    stopped = done[rows]
    return torch.cat([rows[~stopped], rows[stopped][:r - int((~stopped).sum())]]).sort().values


def _draw_rows(model, h, rows, B: int, token_chunk: int, draw) -> torch.Tensor:
    """`draw_chunked` of all B rows when h holds only `rows`' hidden states (B <= token_chunk: one chunk):
    their logits among zero logits for the other rows (stopped: a uniform law, drawn and discarded), so
    the draw sees the (B, V) logits it always saw and consumes the generator as it always did."""
    if rows is None:
        return draw_chunked(model, h, token_chunk, draw)
    z = measure.head_logits(model, h)
    return draw(z.new_zeros(B, z.shape[1]).index_copy_(0, rows, z), slice(0, B))


def generate_lean(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
                  generator: torch.Generator | None = None, *, token_chunk: int,
                  drop_rows: bool = True, live_rows: bool = True) -> torch.Tensor:
    """`generate`'s eager loop with the lean step: the same prefill, the same multinomial draws
    from the same generator (every row drawn every step, so the generator's stream is unchanged), the
    same attention masks (none when no prompt is padded, else the padding mask as a bool), and the same
    stop rule: (B, T) new tokens, pad after the first stop id, as many columns as steps drawn.
    Runs under inference mode (no autograd bookkeeping per op: ~7% of a stand-in step); the tokens
    come back as an ordinary tensor. drop_rows: once a quarter of the live rows have stopped, attend
    over the live rows only (`LeanStep.drop`; the same tokens). live_rows (with drop_rows, B <= token_chunk):
    run every op on the live rows rounded up to a multiple of LIVE_ROW_MULTIPLE, at the counts
    `rows_stable` accepts on this machine (`LeanStep.narrow`; the same tokens), else as drop_rows alone."""
    with torch.inference_mode():
        out = _lean_loop(model, input_ids, attention_mask, max_new_tokens, temperature, stop, pad_id, generator,
                         token_chunk, drop_rows, live_rows)
    return out.clone()


def _lean_loop(model, input_ids, attention_mask, T, temperature, stop, pad_id, generator, token_chunk,
               drop_rows=True, live_rows=True):
    from transformers import DynamicCache

    dev = input_ids.device
    stop = torch.as_tensor([stop] if isinstance(stop, int) else list(stop), dtype=torch.long, device=dev)
    B, P = input_ids.shape
    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    h, kv = last_hidden(model, DynamicCache(), input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
    step = LeanStep(model)
    step.fill(kv, P + T)
    del kv
    # transformers passes no mask when no prompt is padded (and SDPA then takes its grouped-query path)
    mask = None
    if not bool(attention_mask.bool().all()):
        mask = torch.ones(B, 1, 1, P + T, dtype=torch.bool, device=dev)
        mask[:, 0, 0, :P] = attention_mask.bool()
    next_pos = pos[:, -1:] + 1
    out = torch.full((B, T), pad_id, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    pad = torch.full((B,), pad_id, dtype=torch.long, device=dev)

    def draw(logits, rows):
        return draw_multinomial(logits, temperature, generator)

    live, ops = B, B                 # rows in the cache at the last drop; rows every op runs on
    # on more than one thread CPU attention splits its work by the row count, so a row can round otherwise in a
    # smaller batch (measured, torch 2.13, 2 threads): rows leave the batch on one thread only (the notebooks')
    drop_rows = drop_rows and (dev.type != "cpu" or torch.get_num_threads() == 1)
    narrow = drop_rows and live_rows and B <= token_chunk
    for k in range(T):
        tok = torch.where(done, pad, _draw_rows(model, h, step.rows, B, token_chunk, draw))
        out[:, k] = tok
        done |= torch.isin(tok, stop)
        n_done = int(done.sum())
        if k == T - 1 or n_done == B:
            return out[:, :k + 1]
        if drop_rows and B - n_done <= 0.75 * live:   # a quarter of the live rows stopped: leave them out
            r = _stable_count(model, B, B - n_done, ops) if narrow else None
            if r is not None:   # every op on r rows: verified to give the same floats
                rows = step.rows if step.rows is not None else torch.arange(B, device=dev)
                mask = step.narrow(_narrowed(rows, done, r), mask)
                ops = r
            else:   # attend without them; every other op keeps its rows
                mask = step.drop(done, mask)
            live = B - n_done
        rows = step.rows
        h = step(tok, next_pos, P + k, mask) if rows is None else step(tok[rows], next_pos[rows], P + k, mask)
        next_pos = next_pos + 1
    return out[:, :0]   # T = 0: no step drawn
