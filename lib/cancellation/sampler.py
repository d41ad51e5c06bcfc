"""The static-cache sampler: a preallocated KV cache, a decode step captured once per bucket on CUDA.

`generate` (below) is a DynamicCache loop: every decode step is ~30 kernel launches per layer
issued from Python, and on a GPU the launches (not the weights' reads) set the pace. This module
runs the same ancestral sampling with shapes that never change, so one decode step can be
recorded once as a CUDA graph and replayed:

- `StaticLayer`: one layer's keys/values preallocated for `L` positions (rows, kv heads, L, head
  dim). A decode step writes its column in place at `write_pos`, a device tensor, and attends over
  the whole buffer through a 4-D additive mask whose unwritten and padded columns hold the dtype's
  minimum (exp of it is exactly 0).
- The decode step (`_Decoder.step`) reads the step index, the positions and the mask from device
  tensors and writes the drawn token, its log-probability and the rows' stop flags into device
  buffers: no host sync per step. The host reads "every row stopped" every `check_every` steps.
- Draws: 'multinomial' is `generate`'s draw (float64 softmax, torch.multinomial with the
  caller's generator), used by the eager path so that it draws exactly today's tokens. 'icdf'
  draws by inverse CDF from uniforms drawn up front with the seeded generator on the model's
  device, one per (step, row): the same law (float64 softmax and cumulative sum), no random-number
  generator inside the captured graph, and a row's draws do not depend on padding rows.
- Buckets: on the captured path the rows are padded to a power of two (copies of the first row,
  dropped from the result) and the cache length rounded up to a multiple of 256, so a run captures
  a handful of graphs. Graphs live on the model object (`_static_graphs`) and are reused while the
  model lives; weights updated in place are seen by the next replay.

`generate_static(..., capture=None)` chooses: captured on CUDA for every dtype but float64, eager
otherwise (CPU and float64: the tiny profile samples exactly as before; on a CPU the eager step runs
through `LeanStep`, the body forward's floats without its per-token module calls). Models with sliding-window
layers, or whose decoder takes no `position_ids`, stay on `generate`'s eager loop.

`generate_transformers` is the other path of the hf backend: transformers' own `generate` with a static
cache (compiled by transformers on CUDA), the same law; `generate(path=...)` picks it, and a figure's
`hf_sampler` ('auto': sampling_path.py, gpu-check's measured choice on CUDA, ours on a CPU) says which.

The vLLM seam is here too: `make_sampler`/`load_sampler` build what `rollout.sample` samples from,
`sample_vllm` (rollouts) and `sample_vllm_continuations` (value.py's Monte Carlo continuations) draw
with vLLM, and `sync_weights` pushes updated weights into its engine.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
import time

import torch
import torch.nn.functional as F

from . import measure, pack, sampling_path
from .dryrun import dry_run
from .policy import cast, load_policy

ROW_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LEN_BUCKET = 256


@functools.cache
def _static_layer_class():
    from transformers.cache_utils import DynamicLayer  # imported late: transformers is slow to import

    class StaticLayer(DynamicLayer):
        """One layer's keys/values preallocated for (rows, kv heads, L, head dim); a decode step
        writes its column in place at `write_pos` (a device tensor shared by every layer).

        zero: hold zeros where nothing was written (the captured step attends every column, and a
        masked column's 0 weight times an uninitialised value could be NaN). The eager step attends the
        written columns only, so its buffers are left uninitialised (zeroing them was 8% of a Monte Carlo
        batch's time in the profile, 2026-11-27)."""

        def __init__(self, rows: int, H: int, L: int, D: int, dtype, device, write_pos: torch.Tensor,
                     zero: bool = True):
            super().__init__()
            new = torch.zeros if zero else torch.empty
            self.keys = new(rows, H, L, D, dtype=dtype, device=device)
            self.values = new(rows, H, L, D, dtype=dtype, device=device)
            self.write_pos, self.n_prefill, self.live, self.zero = write_pos, 0, None, zero
            self.dtype, self.device, self.is_initialized = dtype, device, True

        def fill(self, keys, values, repeats: int, n_real: int):
            """The prefill's keys/values (B, H, n, D): each prefix copied into its `repeats` rows (one
            prefill shared by its continuations), padding rows from prefix 0; the rest zeroed (`zero`) or
            left as it is (the eager step writes a column before it reads it)."""
            B, H, n, D = keys.shape
            for buf, src in ((self.keys, keys), (self.values, values)):
                if self.zero:
                    buf.zero_()
                buf[:n_real, :, :n].view(B, repeats, H, n, D).copy_(src[:, None])
                buf[n_real:, :, :n] = src[:1]
            self.n_prefill = n

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys.index_copy_(2, self.write_pos, key_states)
            self.values.index_copy_(2, self.write_pos, value_states)
            if self.live is not None:  # eager: attend over the written columns only (a captured step takes all)
                return self.keys[:, :, :self.live], self.values[:, :, :self.live]
            return self.keys, self.values

        def get_seq_length(self) -> int:  # only used by callers that pass no positions (we pass them)
            return self.n_prefill

        def get_max_cache_shape(self) -> int:
            return self.keys.shape[2]

    return StaticLayer


def static_layer(layer, L: int, write_pos: torch.Tensor, rows: int, zero: bool = True):
    """A StaticLayer of `rows` rows and length L shaped after a prefilled layer (its heads, head dim, dtype)."""
    _, H, _, D = layer.keys.shape
    return _static_layer_class()(rows, H, L, D, layer.keys.dtype, layer.keys.device, write_pos, zero)


def supported(model) -> bool:
    """Whether the static path can run this model: every layer full attention (no sliding window)."""
    types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return set(types) == {"full_attention"}


def bucket_rows(n: int) -> int:
    return next((b for b in ROW_BUCKETS if b >= n), n)


def bucket_len(n: int) -> int:
    return LEN_BUCKET * math.ceil(n / LEN_BUCKET)


def _draw_multinomial(logits, temperature, generator):
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def _icdf(probs, u):
    """Inverse-CDF draw: per row, the token whose cumulative probability first exceeds u · total
    (u (rows,) in [0, 1)); float64 probabilities keep the law exact up to round-off."""
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, u.double()[:, None] * cdf[:, -1:]).squeeze(1).clamp(max=probs.shape[1] - 1)


def _draw_icdf(logits, temperature, u):
    """The decode step's inverse-CDF draw without bans (tests check its law)."""
    if temperature == 0:
        return logits.argmax(-1)
    return _icdf(torch.softmax(logits.double() / temperature, dim=-1), u)


class _Decoder:
    """Static buffers of one (rows, cache length) bucket and the decode step that reads and writes them."""

    def __init__(self, model, rows: int, L: int, T: int, token_chunk: int, temperature: float, draw: str,
                 stop: torch.Tensor, pad_id: int, has_ban: bool = False, record_logp: bool = False,
                 captured: bool = False, whole_cache: bool = False, lean: bool | None = None):
        dev = next(model.parameters()).device
        self.record_logp, self.captured = record_logp, captured   # what the step computes beyond the tokens
        self.whole_cache = captured or whole_cache                # attend over every cache column (graph shapes)
        self.model, self.body, self.rows, self.L, self.T = model, model.get_decoder(), rows, L, T
        self.token_chunk, self.temperature, self.draw, self.stop, self.pad_id = token_chunk, temperature, draw, stop, pad_id
        self.has_ban = has_ban
        self.kw = cache_kw(self.body)
        dt = next(model.parameters()).dtype
        self.neg = torch.finfo(dt).min
        z = lambda *s, **k: torch.zeros(*s, device=dev, **k)  # noqa: E731
        self.k = z(1, dtype=torch.long)                 # decode step index
        self.p = z(1, dtype=torch.long)                 # prompt length (first decode column)
        self.write_pos = z(1, dtype=torch.long)         # cache column of the token being fed
        self.h = z(rows, model.config.hidden_size, dtype=dt)
        self.pos = z(rows, 1, dtype=torch.long)
        self.mask = torch.full((rows, 1, 1, L), self.neg, dtype=dt, device=dev)
        self.done = z(rows, dtype=torch.bool)
        self.budget = z(rows, dtype=torch.long)         # a row stops after this many tokens
        self.ban = z(rows, dtype=torch.long)            # a token id the first draw may not be (-1: none)
        self.all_done_at = torch.full((1,), T, dtype=torch.long, device=dev)
        self.out = torch.full((rows, T), pad_id, dtype=torch.long, device=dev)
        self.logp = z(rows, T, dtype=torch.float32)
        self.U = z(T, rows, dtype=torch.float64)
        self.row_idx = torch.arange(rows, device=dev)   # live row -> output row (eager compaction drops rows)
        self.generator = None
        self.cache = None
        self.graph = None
        # eager on a CPU (lean None) or when asked: the lean step, the body forward's floats without its
        # per-token module calls (tested bit for bit); lean=False: the body forward (the reference)
        use_lean = dev.type == "cpu" if lean is None else lean
        self.lean = LeanStep(model) if use_lean and not self.whole_cache and lean_supported(model) else None

    def load(self, h, layers, mask2d, next_pos, generator=None, U=None, repeats: int = 1, budget=None, ban=None):
        """Start a batch: the prefill's last hidden states (B, d), cache layers, prompt mask (B, P) and
        next positions (B,) of B prompts, each expanded to `repeats` rows (padding rows copy prompt 0);
        per-row uniforms U (T, B * repeats), budgets and first-token bans; reset the step buffers."""
        B, P = mask2d.shape
        n_real = B * repeats

        def expand(x):
            x = x.repeat_interleave(repeats, 0) if repeats > 1 else x
            return torch.cat([x, x[:1].expand(self.rows - n_real, *x.shape[1:])]) if self.rows > n_real else x
        self.p.fill_(P)
        self.k.zero_()
        self.h.copy_(expand(h))
        self.pos.copy_(expand(next_pos)[:, None])
        self.mask.fill_(self.neg)
        self.mask[:, 0, 0, :P].masked_fill_(expand(mask2d).bool(), 0.0)
        self.done.zero_()
        self.done[n_real:] = True   # padding rows count as stopped: they never hold the run open
        self.budget.fill_(self.T)
        if budget is not None:
            self.budget[:n_real] = budget
        self.ban.fill_(-1)
        if ban is not None:
            self.ban[:n_real] = ban
        self.all_done_at.fill_(self.T)
        self.out.fill_(self.pad_id)
        self.logp.zero_()
        self.generator = generator
        self.U.zero_()
        if U is not None:
            self.U[:, :n_real] = U
        if self.cache is None:
            from transformers import DynamicCache
            self.cache = DynamicCache()
            self.cache.layers = [static_layer(layer, self.L, self.write_pos, self.rows, zero=self.whole_cache)
                                 for layer in layers]
        for mine, layer in zip(self.cache.layers, layers):
            mine.fill(layer.keys, layer.values, repeats, n_real)
        self._share_cache()

    def _share_cache(self):
        """The lean step writes and attends the static layers' own buffers (one cache, two readers)."""
        if self.lean is not None:
            self.lean.keys = [layer.keys for layer in self.cache.layers]
            self.lean.values = [layer.values for layer in self.cache.layers]

    def _draw(self, logits, rows):
        if self.temperature == 0:
            tok = logits.argmax(-1)
        elif self.draw == "multinomial":
            tok = _draw_multinomial(logits, self.temperature, self.generator)
        else:
            probs = torch.softmax(logits.double() / self.temperature, dim=-1)
            if self.has_ban:  # first draw: π renormalised without the banned token (a divide by 1 elsewhere)
                bn = self.ban[rows]
                b = ((bn >= 0) & (self.k == 0))[:, None]
                idx = bn.clamp(min=0)[:, None]
                probs = probs.scatter(1, idx, torch.where(b, torch.zeros_like(idx, dtype=probs.dtype),
                                                          probs.gather(1, idx)))
                probs = probs / torch.where(b, probs.sum(-1, keepdim=True), torch.ones_like(probs[:, :1]))
            tok = _icdf(probs, self.U.index_select(0, self.k).squeeze(0)[rows])
        if not self.record_logp:
            return tok, None
        lp = torch.log_softmax(logits.float(), -1).gather(1, tok[:, None]).squeeze(1)
        return tok, lp

    def step(self, forward: bool = True):
        """Draw the tokens of step k from h, record them, and (forward) feed them to get the next h."""
        tok = self.draw_step()
        if forward:
            self.forward_step(tok)
        self.k += 1

    def draw_step(self) -> torch.Tensor:
        """The tokens of step k from h (pad on stopped rows), recorded with their log-probs and stops."""
        toks, lps = [], []
        for s in range(0, self.rows, self.token_chunk):
            tok, lp = self._draw(measure.head_logits(self.model, self.h[s:s + self.token_chunk]),
                                 slice(s, min(s + self.token_chunk, self.rows)))
            toks.append(tok)
            lps.append(lp)
        tok = toks[0] if len(toks) == 1 else torch.cat(toks)
        tok = torch.where(self.done, torch.full_like(tok, self.pad_id), tok)
        col = self.k.expand(self.rows)
        self.out.index_put_((self.row_idx, col), tok)
        if self.record_logp:
            lp = lps[0] if len(lps) == 1 else torch.cat(lps)
            self.logp.index_put_((self.row_idx, col), torch.where(self.done, torch.zeros_like(lp), lp))
        self.done |= torch.isin(tok, self.stop) | (self.budget <= self.k + 1)
        if self.captured:  # the host reads this every check_every steps (the eager loop checks done itself)
            first = (self.all_done_at == self.T) & self.done.all()
            self.all_done_at.copy_(torch.where(first, self.k, self.all_done_at))
        self.tok = tok
        return tok

    def forward_step(self, tok):
        """Feed step k's tokens at cache column p + k: the next h."""
        self.write_pos.copy_(self.p + self.k)
        self.mask.index_fill_(3, self.write_pos, 0.0)
        mask = self.mask
        if self.lean is not None:   # the same functions on the same tensors as the body forward below
            with torch.inference_mode():
                h = self.lean(tok, self.pos, int(self.write_pos), mask)
            self.h.copy_(h)
            self.pos += 1
            return
        if not self.whole_cache:  # eager: shapes may change, so attend over the written columns only
            live = int(self.write_pos) + 1
            for layer in self.cache.layers:
                layer.live = live
            mask = self.mask[..., :live]
        out = self.body(input_ids=tok[:, None], attention_mask={"full_attention": mask},
                        position_ids=self.pos, use_cache=True, **{self.kw: self.cache})
        self.h.copy_(out.last_hidden_state[:, -1])
        self.pos += 1

    def compact(self):
        """Eager only: drop the rows that have stopped from every per-row buffer and the cache (the
        outputs keep their rows: `row_idx` maps live rows to them). A row's draws depend only on
        its own uniforms, so this changes no sample."""
        keep = (~self.done).nonzero().squeeze(1)
        for name in ("h", "pos", "mask", "done", "budget", "ban", "row_idx", "tok"):
            setattr(self, name, getattr(self, name)[keep])
        self.U = self.U[:, keep]
        written = int(self.p) + int(self.k)   # columns written so far: the prompt's and steps 0..k-1's
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                new = old.new_empty(len(keep), *old.shape[1:])   # eager: unwritten columns are never read
                torch.index_select(old[:, :, :written], 0, keep, out=new[:, :, :written])
                setattr(layer, name, new)
        self._share_cache()
        self.rows = len(keep)

    def capture(self):
        """Record one decode step as a CUDA graph (after warm-up steps on a side stream, which move
        the step counters; the caller reloads the batch after this)."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()


def _prefill(model, input_ids, attention_mask):
    from transformers import DynamicCache

    pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    h, kv = last_hidden(model, DynamicCache(), input_ids=input_ids, attention_mask=attention_mask, position_ids=pos)
    return h, kv, pos[:, -1] + 1


@torch.no_grad()
def generate_static(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
                    generator: torch.Generator | None = None, *, token_chunk: int,
                    capture: bool | None = None, draw: str | None = None, check_every: int = 16,
                    return_logprobs: bool = False, pad_rows: int | None = None, repeats: int = 1, uniforms=None,
                    budgets=None, bans=None, compact: bool | None = None, graph_shapes: bool = False,
                    lean: bool | None = None):
    """Ancestral sampling with a static KV cache; returns (B * repeats, T) new tokens, pad after the
    first stop id (and, with return_logprobs, (B * repeats, T) float32 log π of each drawn token at
    temperature 1 over the sampled logits; 0 after the stop).

    capture: record the decode step as a CUDA graph (default: on CUDA unless the
    weights are float64). draw: 'multinomial' (generate's draw; eager only) or 'icdf' (default when
    capturing, or when `uniforms` are given). The eager path checks for "all rows stopped" after
    every step and stops where generate stops, so with 'multinomial' it consumes the
    generator exactly as it does. pad_rows: pad the batch to this many rows (default: a power of two
    when capturing, none eagerly); padding rows copy prompt 0, count as stopped from the start and
    are dropped from the result.

    Monte Carlo continuations (value.py): repeats=M samples M continuations of each of the B
    prefixes from one prefill (its KV cache copied into M rows); uniforms (T, B * M) are the rows'
    own uniforms (row b * M + m), so a row's draws do not depend on its batch; budgets (B * M,) stop
    a row after that many tokens; bans (B * M,) a token id the first draw may not be (-1: none).
    compact (eager 'icdf' only, the default there): rows that stopped leave the batch once a quarter
    have (no sample changes; on a GPU in bfloat16 a smaller batch may round its matmuls differently).
    graph_shapes: run the eager path with the captured step's shapes (row and length buckets, the
    whole cache attended, no compaction): what the captured step computes, kernel for kernel, so
    the two can be compared bit for bit (attention rounds differently over other lengths).
    lean: the eager step through `LeanStep` (None: on a CPU, for the decoders `lean_supported` accepts;
    the same floats as the body forward, so the same tokens), False: through the body's modules.
    """
    dev = input_ids.device
    dt = next(model.parameters()).dtype
    if capture is None:
        capture = dev.type == "cuda" and dt != torch.float64
    draw = draw or ("icdf" if capture or uniforms is not None else "multinomial")
    if capture and draw != "icdf":
        raise ValueError("generate_static: a captured decode step draws by inverse CDF (draw='icdf')")
    if capture and dev.type != "cuda":
        raise ValueError("generate_static: capture needs a CUDA device")
    if bans is not None and draw != "icdf":
        raise ValueError("generate_static: first-token bans need draw='icdf'")
    if not supported(model):
        raise ValueError("generate_static: the model has sliding-window layers, which the static cache's "
                         "full-attention mask does not cover; sample it with generate(static=False)")
    stop = torch.as_tensor([stop] if isinstance(stop, int) else list(stop), dtype=torch.long, device=dev)
    B, P = input_ids.shape
    n_real, T = B * repeats, max_new_tokens
    graph_shapes = capture or graph_shapes
    rows, L = (bucket_rows(n_real), bucket_len(P + T)) if graph_shapes else (n_real, P + T)
    if pad_rows is not None:  # an explicit row bucket (tests; the captured path's default is bucket_rows)
        rows = max(n_real, int(pad_rows))
    U = uniforms
    if draw == "icdf" and U is None:
        if generator is None:
            generator = torch.Generator(device=dev).manual_seed(0)
        U = torch.rand(T, n_real, generator=generator, dtype=torch.float64, device=dev)
    h, kv, next_pos = _prefill(model, input_ids, attention_mask)
    layers = list(kv.layers)
    has_ban = bans is not None and bool((torch.as_tensor(bans) >= 0).any())
    load = dict(generator=generator, U=U, repeats=repeats, budget=budgets, ban=bans if has_ban else None)
    if capture:
        graphs = model.__dict__.setdefault("_static_graphs", {})
        key = (rows, L, T, token_chunk, float(temperature), tuple(stop.tolist()), int(pad_id), dt, has_ban,
               return_logprobs)
        dec = graphs.get(key)
        if dec is None:
            dec = _Decoder(model, rows, L, T, token_chunk, temperature, draw, stop, pad_id, has_ban,
                           record_logp=return_logprobs, captured=True)
            dec.load(h, layers, attention_mask, next_pos, **load)
            t0 = time.perf_counter()
            dec.capture()
            torch.cuda.synchronize()
            dec.capture_seconds = time.perf_counter() - t0
            graphs[key] = dec
        dec.load(h, layers, attention_mask, next_pos, **load)
        for k in range(T):
            dec.graph.replay()
            if (k + 1) % check_every == 0 and int(dec.all_done_at) < T:
                break
    else:
        dec = _Decoder(model, rows, L, T, token_chunk, temperature, draw, stop, pad_id, has_ban,
                       record_logp=return_logprobs, whole_cache=graph_shapes, lean=lean)
        dec.load(h, layers, attention_mask, next_pos, **load)
        # icdf rows own their uniforms, so finished rows can leave the batch (as the old MC sampler did);
        # the multinomial draw's generator stream depends on the row count, so it keeps every row
        compact = (draw == "icdf" and not graph_shapes) if compact is None else compact and draw == "icdf"
        live = n_real
        n = T
        for k in range(T):
            dec.draw_step()
            if k == T - 1 or bool(dec.done.all()):
                n = k + 1
                break
            if compact:
                n_alive = int((~dec.done).sum())
                if n_alive <= 0.75 * live:
                    dec.compact()
                    live = n_alive
            dec.forward_step(dec.tok)
            dec.k += 1
    if capture:
        n = min(int(dec.all_done_at) + 1, T)
    out = dec.out[:n_real, :n].clone()
    return (out, dec.logp[:n_real, :n].clone()) if return_logprobs else out


# --------------------------------------------------------------------------- the lean CPU decode step
# On a CPU a tiny model's decode step is overhead: per token, transformers' DynamicCache concatenates
# every layer's whole keys/values (the largest share for the tiny policy), builds a 4-D mask, and runs
# each module through its wrappers. The lean step below calls the same functions on the same tensors
# in the same order (so every float, and so every draw, is bit for bit what the module forward gives),
# with a preallocated cache written in place and attended over its written columns only.
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
    dev, dt = _device(model), next(model.parameters()).dtype

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
        return _draw_multinomial(logits, temperature, generator)

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


# --------------------------------------------------------------------------- the eager DynamicCache loop
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


# --------------------------------------------------------------------------- transformers' own generate (CUDA default)
HF_LEN_BUCKET = 64   # prompts left-padded to a multiple of this: fewer static-cache shapes, fewer recompiles


@torch.no_grad()
def generate_transformers(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop,
                          pad_id: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, T) new tokens from transformers' own `generate` with a static KV cache (which transformers
    torch.compiles on CUDA): the path gpu-check measured faster than ours on the H200 (sampling_path.py).

    The same law as `generate`: ancestral sampling at `temperature` (0: greedy) with every other logits
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
def generate(model, input_ids, attention_mask, max_new_tokens: int, temperature: float, stop, pad_id: int,
             generator: torch.Generator | None = None, *, token_chunk: int,
             static: bool | None = None, lean: bool | None = None, path: str = "ours") -> torch.Tensor:
    """Batched ancestral sampling with a KV cache; returns (B, T) new tokens, pad after the first stop id.

    On CUDA with bfloat16/float16/float32 weights (`static` None) this is `generate_static`: a static
    KV cache and a decode step captured as a CUDA graph, drawing by inverse CDF from uniforms of
    `generator` (same law, other draws than the eager path). Otherwise (CPU, float64 on CUDA, or
    `static=False`) it is the eager DynamicCache loop below, which the tiny profile's tables used; on
    a CPU, for the decoders `lean_supported` accepts (Qwen2, Qwen3), that loop runs as
    `generate_lean` (`lean` None or True): the same tokens from the same generator, at the
    CPU's pace (a preallocated cache, no module calls per token). lean=False: the loop below (bench).

    `stop`: one stop id or a list. temperature 0 is greedy decoding. `generator` must live on the
    model's device. Logits are computed for the last position only (prefill included) and for at
    most `token_chunk` rows at a time (`draw_chunked`); the DynamicCache holds keys/values in the
    model's dtype. The softmax is float64, so draws do not depend on the weights' dtype beyond
    the logits themselves.

    path: 'ours' (all the above), 'transformers' (`generate_transformers`: transformers' own generate, static
    cache) or 'auto' (`sampling_path.resolve` for the model's device: ours, since one call carries no notebook's
    sampling calls to decide at; a figure passes the path its Params resolved, end to end per notebook).
    """
    from transformers import DynamicCache

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
    stop = torch.as_tensor([stop] if isinstance(stop, int) else list(stop), dtype=torch.long, device=dev)
    B = input_ids.shape[0]

    def draw(logits, rows):
        return _draw_multinomial(logits, temperature, generator)

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


def sample_hf(model, ids, mask, cfg, seed: int, stop, pad: int) -> torch.Tensor:
    """(B, T) new tokens from the HF model (`cfg`: a `rollout.SampleConfig`; its hf_sampler picks ours or
    transformers' generate), cfg.chunk_size rows per call, one generator on the model's device across chunks."""
    device = _device(model)
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


# --------------------------------------------------------------------------- vLLM (GPU extra): rollouts and MC continuations
def _import_vllm():
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
    _, SamplingParams, TokensPrompt = _import_vllm()
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
