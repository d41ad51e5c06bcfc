"""Per-token statistics from the training forward, Δlog p, and the tidy per-token table.

Every statistic comes from batched forward passes over rows of the RolloutBatch (chunked to
bound memory), never from a Python loop over sequences, and never from sampler log-probs.
Tensors are (B, L) and aligned with `input_ids`: entry t describes token t given tokens < t
(column 0 is 0); only entries under `response_mask` are meaningful.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from . import guard, pack

STATUSES = ("boosted", "suppressed", "stable")
CONFIDENT = 0.9  # the paper's confidence split: a token with p ≥ CONFIDENT is confident, p < CONFIDENT uncertain


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _inputs(model, batch, rows=None, cols=None):
    ids, am = batch.input_ids, batch.attention_mask
    if rows is not None:
        ids, am = ids[rows], am[rows]
    if cols is not None:   # a chunk's real columns (`chunks`): the positions count from its first one
        ids, am = ids[:, cols], am[:, cols]
    dev = _device(model)
    ids, am = ids.to(dev), am.to(dev)
    return ids, am, (am.cumsum(-1) - 1).clamp(min=0)


def forward_logits(model, batch, rows=None, output_hidden: bool = False):
    """One forward over (a subset of) rows; returns logits (b, L, V) [and final hidden (b, L, d)].

    Materialises the full (b, L, V) logits: used by the `*_unchunked` references only.
    """
    ids, am, pos = _inputs(model, batch, rows)
    out = model(input_ids=ids, attention_mask=am, position_ids=pos, output_hidden_states=output_hidden,
                use_cache=False)
    # hidden_states[-1] is the input of the LM head, after the final norm (Qwen2/Llama convention)
    return (out.logits, out.hidden_states[-1]) if output_hidden else out.logits


def forward_hidden(model, batch, rows=None, cols=None) -> torch.Tensor:
    """Final hidden states (b, L, d) of (a subset of) rows: the LM-head input, after the final norm.

    Runs only the model body (`model.get_decoder()`), so no logits exist; `head_logits` turns
    any subset of positions into logits. Same forward as the full model's (mask, positions).
    `cols`: a slice of columns holding every real token of those rows (`chunks`); L is then its width.
    Where `pack.on(model)`, norms, projections and MLP run on the real positions only (`pack.hidden`: the
    same floats there, and the same gradients; zeros at the padding, which no caller reads).
    """
    ids, am, pos = _inputs(model, batch, rows, cols)
    keep = pack.packed_rows(model, am)
    if keep is not None:
        return pack.hidden(model, ids, am, pos, keep)
    return model.get_decoder()(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).last_hidden_state


def chunks(attention_mask: torch.Tensor, rows, knobs):
    """The body forwards of `rows` (an index tensor into the batch): (row indices, column slice) per
    chunk of `knobs.chunk_rows` rows, in order, over every column.

    With `knobs.trim_padding` the rows go shortest first (by their last real column, a stable sort) and
    each chunk keeps only the columns from its first to its last real token, so a chunk of short
    responses does not pay for the batch's longest. Exact in arithmetic: the model is causal, the
    cut columns are padding (masked, and leading ones add nothing to the positions' cumulative
    count); the floats change by round-off (other matmul shapes, other rows per chunk), which is why
    it is a knob, off in the tiny profile's committed tables.
    """
    rows = torch.as_tensor(rows)
    L = attention_mask.shape[1]
    trim = getattr(knobs, "trim_padding", False)
    if trim and len(rows):
        real = attention_mask[rows].bool()
        last = torch.where(real, torch.arange(L), -1).max(1).values
        rows = rows[torch.argsort(last, stable=True)]
    for s in range(0, len(rows), knobs.chunk_rows):
        r = rows[s:s + knobs.chunk_rows]
        cols = slice(0, L)
        if trim:
            live = attention_mask[r].bool().any(0).nonzero().squeeze(1)
            if len(live):
                cols = slice(int(live[0]), int(live[-1]) + 1)
        yield r, cols


def head_logits(model, h: torch.Tensor) -> torch.Tensor:
    """Logits of LM-head inputs h (..., d): `model.get_output_embeddings()(h)`.

    Assumes logits = lm_head(h) as in Qwen2/Qwen3/Llama/Mistral (no logit scaling). Models whose
    config asks for a scale (`logit_scale`, Cohere) or a soft cap (`final_logit_softcapping`,
    Gemma 2) get it applied here, as their own forward does.
    """
    z = model.get_output_embeddings()(h)
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    if scale is not None and scale != 1:
        z = z * scale
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        z = torch.tanh(z / cap) * cap
    return z


def response_positions(mask: torch.Tensor):
    """(rows, cols), on the CPU, of the positions whose statistics matter: response tokens at column ≥ 1."""
    m = mask.detach().bool().cpu().clone()
    m[:, 0] = False
    return m.nonzero(as_tuple=True)


def token_logp(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log π(token_t | < t) aligned to positions (column 0 = 0); differentiable."""
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None].to(logits.device)).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0))


@dataclass
class TokenStats:
    """Per-token statistics of a batch under one set of parameters."""
    logp: torch.Tensor      # (B, L) log-prob of the sampled token
    entropy: torch.Tensor   # (B, L) entropy of the next-token distribution
    hidden: torch.Tensor | None = None   # (B, L, d) LM-head input, if asked for

    @property
    def prob(self) -> torch.Tensor:
        return self.logp.exp()


def _logp_entropy(model, h: torch.Tensor, targets: torch.Tensor, entropy: bool = True):
    """log π(target) and entropy from LM-head inputs h (n, d): one (n, V) logits tensor at a time."""
    lsm = torch.log_softmax(head_logits(model, h), dim=-1)
    lp = lsm.gather(-1, targets[:, None]).squeeze(-1)
    if not entropy:
        return lp, None
    p = lsm.exp()
    return lp, -p.mul_(lsm).sum(-1)


@torch.no_grad()
def token_stats(model, batch, knobs, hidden: bool = False) -> TokenStats:
    """Log-probs and entropies of every response token of `batch`, with memory bounded by chunks.

    `knobs`: the run's Compute (or a config that carries its knobs, an UpdateConfig), passed whole.
    The model body runs on `knobs.chunk_rows` rows at a time (`chunks`: with `knobs.trim_padding`,
    over each chunk's real columns only; final hidden states only, no logits);
    logits, log-softmax and entropy are then computed for at most `knobs.token_chunk` response
    positions at a time, so the largest vocabulary-wide tensor is (token_chunk, V). Entries
    outside `response_mask` are 0. Results are on the CPU, in the model's dtype. The chunking
    is fixed by the two chunk sizes alone, so two calls with the same model give bit-identical
    results (the noise floor of a no-op update is then exactly 0 on CPU).
    """
    B, L = batch.input_ids.shape
    guard.tally_batch(B * L)  # the memory guard's tally (tests); a no-op otherwise
    out = None
    for rows, cols in chunks(batch.attention_mask, torch.arange(B), knobs):
        out = stats_of_chunk(model, batch, rows, cols, forward_hidden(model, batch, rows, cols), knobs.token_chunk,
                             out, hidden)
    if out is None:
        dt = next(model.parameters()).dtype
        out = TokenStats(torch.zeros(B, L, dtype=dt), torch.zeros(B, L, dtype=dt))
    return out


@torch.no_grad()
def stats_of_chunk(model, batch, rows, cols, h: torch.Tensor, token_chunk: int, out: TokenStats | None = None,
                   hidden: bool = False) -> TokenStats:
    """`token_stats`' statistics of one chunk (`chunks`: rows, column slice) from its final hidden states h,
    written into `out` (allocated (B, L) on the first chunk) and returned. h may carry a graph (a forward
    shared with the updates, `grpo.Trials`): nothing here is recorded in it."""
    B, L = batch.input_ids.shape
    if out is None:
        out = TokenStats(torch.zeros(B, L, dtype=h.dtype), torch.zeros(B, L, dtype=h.dtype),
                         torch.zeros(B, L, h.shape[-1], dtype=h.dtype) if hidden else None)
    r, c = response_positions(batch.response_mask[rows][:, cols])
    ids = batch.input_ids[rows][:, cols][r, c].to(h.device)
    rd, cd = r.to(h.device), c.to(h.device)
    for t in range(0, len(r), token_chunk):
        k = slice(t, t + token_chunk)
        lp, e = _logp_entropy(model, h[rd[k], cd[k] - 1], ids[k])   # h at t-1 predicts token t
        out.logp[rows[r[k]], cols.start + c[k]] = lp.cpu()
        out.entropy[rows[r[k]], cols.start + c[k]] = e.cpu()
    if hidden:   # the hidden state that predicts token t sits at t - 1 (zeros at columns a trim cut and, packed, at padding)
        out.hidden[rows, cols.start + 1:cols.stop] = h[:, :-1].cpu()
    return out


@torch.no_grad()
def token_stats_unchunked(model, batch, knobs, hidden: bool = False) -> TokenStats:
    """The old way (reference for tests and `make bench`): full (rows, L, V) logits per chunk of
    `knobs.chunk_rows` rows (`knobs.token_chunk` is ignored: that is the point)."""
    chunk_rows = knobs.chunk_rows
    logps, ents, hs = [], [], []
    for s in range(0, len(batch), chunk_rows):
        rows = slice(s, s + chunk_rows)
        out = forward_logits(model, batch, rows, output_hidden=hidden)
        logits, h = out if hidden else (out, None)
        ids = batch.input_ids[rows].to(logits.device)
        lsm = torch.log_softmax(logits[:, :-1], dim=-1)
        logps.append(torch.nn.functional.pad(lsm.gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0)).cpu())
        ents.append(torch.nn.functional.pad(-(lsm.exp() * lsm).sum(-1), (1, 0)).cpu())
        if hidden:  # hidden state that predicts token t sits at position t-1
            hs.append(torch.nn.functional.pad(h[:, :-1], (0, 0, 1, 0)).cpu())
    return TokenStats(torch.cat(logps), torch.cat(ents), torch.cat(hs) if hidden else None)


def token_stats_per_sequence(model, batch) -> TokenStats:
    """The naive reference: one unpadded forward per sequence (for tests and `make bench`)."""
    B, L = batch.input_ids.shape
    dt = next(model.parameters()).dtype
    dev = _device(model)
    logp, ent = torch.zeros(B, L, dtype=dt), torch.zeros(B, L, dtype=dt)
    with torch.no_grad():
        for i in range(B):
            keep = batch.attention_mask[i].bool()
            idx = keep.nonzero().squeeze(1)
            ids = batch.input_ids[i, keep][None].to(dev)
            lsm = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
            logp[i, idx[1:]] = lsm.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
            ent[i, idx[1:]] = -(lsm.exp() * lsm).sum(-1).cpu()
    return TokenStats(logp, ent)


def classify(delta: torch.Tensor | np.ndarray, eps: float = 1e-6):
    """'boosted' (Δ > ε), 'suppressed' (Δ < −ε) or 'stable' for each Δlog p."""
    d = np.asarray(delta)
    return np.where(d > eps, "boosted", np.where(d < -eps, "suppressed", "stable"))


def token_strings(tokenizer, ids) -> np.ndarray:
    """Token strings of `ids`; ids past the tokenizer (a model vocabulary padded beyond it, e.g.
    Qwen's 151,936 > 151,669) become the placeholder "<pad:ID>" instead of raising IndexError."""
    ids = np.asarray(ids, dtype=np.int64)
    vocab = np.array(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), dtype=object)
    out = np.empty(len(ids), dtype=object)
    inside = (ids >= 0) & (ids < len(vocab))
    out[inside] = vocab[ids[inside]]
    out[~inside] = [f"<pad:{i}>" for i in ids[~inside]]
    return out


def token_table(batch, before: TokenStats, after: TokenStats | None = None, tokenizer=None,
                eps: float = 1e-6, **extra) -> pd.DataFrame:
    """The tidy per-token table: one row per response token.

    Columns: rollout, group, position (index within the response), token_id, token, reward,
    advantage, sign (pos/neg/zero), logp_before, prob, entropy, and with `after`: logp_after,
    delta, status. Scalar keyword arguments become constant columns (step, run, model, ...).
    """
    m = batch.response_mask.cpu()
    rows, cols = m.nonzero(as_tuple=True)
    first = m.float().argmax(1)
    at = lambda t: t.detach()[rows.to(t.device), cols.to(t.device)].cpu()  # noqa: E731
    per_row = lambda t: t.detach()[rows.to(t.device)].cpu().numpy()  # noqa: E731
    adv = per_row(batch.advantage)
    ids = at(batch.input_ids).numpy()
    lp = at(before.logp).double()
    df = pd.DataFrame({
        "rollout": rows.numpy(), "group": per_row(batch.group), "position": (cols - first[rows]).numpy(),
        "token_id": ids, "reward": per_row(batch.reward), "advantage": adv,
        "sign": np.where(adv > 0, "pos", np.where(adv < 0, "neg", "zero")),
        "logp_before": lp.numpy(),
        "prob": lp.exp().numpy(),
        "entropy": at(before.entropy).double().numpy(),
    })
    if tokenizer is not None:
        df.insert(4, "token", token_strings(tokenizer, ids))
    if after is not None:
        df["logp_after"] = at(after.logp).double().numpy()
        df["delta"] = df["logp_after"] - df["logp_before"]
        df["status"] = classify(df["delta"], eps)
    for k, v in extra.items():
        df[k] = v
    return df


def flip_fractions(df: pd.DataFrame, by=("sign",)) -> pd.DataFrame:
    """Share of boosted / suppressed / stable tokens per group of `by` (tidy: one row per status)."""
    by = list(by)
    counts = df.groupby(by + ["status"]).size().unstack("status", fill_value=0)
    for s in STATUSES:
        if s not in counts:
            counts[s] = 0
    frac = counts[list(STATUSES)].div(counts[list(STATUSES)].sum(1), axis=0)
    return frac.reset_index().melt(id_vars=by, var_name="status", value_name="fraction")


@torch.no_grad()
def noise_floor(model, batch, knobs, step_fn=None) -> dict:
    """Measured Δlog p when nothing should change.

    'repeat': two forward passes, no update. 'zero_update': before/after an update whose token
    weights are all zero (`step_fn(model, batch)` performs it; skipped if None). Reported as
    the max |Δ| over response tokens; ε must sit above both. `knobs`: the run's Compute, so the floor is
    that of the forwards the analysis really uses.
    """
    m = batch.response_mask
    a = token_stats(model, batch, knobs).logp
    b = token_stats(model, batch, knobs).logp
    out = {"repeat": float((a - b)[m].abs().max())}
    if step_fn is not None:
        with torch.enable_grad():
            step_fn(model, batch)
        c = token_stats(model, batch, knobs).logp
        out["zero_update"] = float((c - a)[m].abs().max())
    return out
