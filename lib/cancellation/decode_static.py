"""The static-cache path: a preallocated KV cache, a decode step captured once per bucket on CUDA.

The eager DynamicCache loop (decode_hf.generate_eager): every decode step is ~30 kernel launches per layer
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
- Draws: 'multinomial' is the eager loop's draw (float64 softmax, torch.multinomial with the
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
layers, or whose decoder takes no `position_ids`, stay on the eager loop (decode_hf.generate_eager).

Monte Carlo continuations (value.py) sample here too: one prefill per prefix, its cache copied into M rows.
"""
from __future__ import annotations

import functools
import time

import torch

from . import measure
from .decode_common import bucket_len, bucket_rows, cache_kw, draw_multinomial, icdf, last_hidden, supported
from .decode_lean import LeanStep, lean_supported


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
            tok = draw_multinomial(logits, self.temperature, self.generator)
        else:
            probs = torch.softmax(logits.double() / self.temperature, dim=-1)
            if self.has_ban:  # first draw: π renormalised without the banned token (a divide by 1 elsewhere)
                bn = self.ban[rows]
                b = ((bn >= 0) & (self.k == 0))[:, None]
                idx = bn.clamp(min=0)[:, None]
                probs = probs.scatter(1, idx, torch.where(b, torch.zeros_like(idx, dtype=probs.dtype),
                                                          probs.gather(1, idx)))
                probs = probs / torch.where(b, probs.sum(-1, keepdim=True), torch.ones_like(probs[:, :1]))
            tok = icdf(probs, self.U.index_select(0, self.k).squeeze(0)[rows])
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
