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

STATUSES = ("boosted", "suppressed", "stable")


def forward_logits(model, batch, rows=None, output_hidden: bool = False):
    """One forward over (a subset of) rows; returns logits (b, L, V) [and final hidden (b, L, d)]."""
    ids, am = batch.input_ids, batch.attention_mask
    if rows is not None:
        ids, am = ids[rows], am[rows]
    dev = next(model.parameters()).device
    ids, am = ids.to(dev), am.to(dev)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=am, position_ids=pos, output_hidden_states=output_hidden,
                use_cache=False)
    # hidden_states[-1] is the input of the LM head, after the final norm (Qwen2/Llama convention)
    return (out.logits, out.hidden_states[-1]) if output_hidden else out.logits


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


@torch.no_grad()
def token_stats(model, batch, chunk_rows: int = 64, hidden: bool = False) -> TokenStats:
    """Log-probs and entropies of every token of `batch` in row chunks of `chunk_rows`.

    The chunking is fixed by `chunk_rows` alone, so two calls with the same model give
    bit-identical results (the noise floor of a no-op update is then exactly 0 on CPU).
    """
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
    logp, ent = torch.zeros(B, L, dtype=dt), torch.zeros(B, L, dtype=dt)
    with torch.no_grad():
        for i in range(B):
            keep = batch.attention_mask[i].bool()
            idx = keep.nonzero().squeeze(1)
            ids = batch.input_ids[i, keep][None]
            lsm = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
            logp[i, idx[1:]] = lsm.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()
            ent[i, idx[1:]] = -(lsm.exp() * lsm).sum(-1).cpu()
    return TokenStats(logp, ent)


def classify(delta: torch.Tensor | np.ndarray, eps: float = 1e-6):
    """'boosted' (Δ > ε), 'suppressed' (Δ < −ε) or 'stable' for each Δlog p."""
    d = np.asarray(delta)
    return np.where(d > eps, "boosted", np.where(d < -eps, "suppressed", "stable"))


def token_table(batch, before: TokenStats, after: TokenStats | None = None, tokenizer=None,
                eps: float = 1e-6, **extra) -> pd.DataFrame:
    """The tidy per-token table: one row per response token.

    Columns: rollout, group, position (index within the response), token_id, token, reward,
    advantage, sign (pos/neg/zero), logp_before, prob, entropy, and with `after`: logp_after,
    delta, status. Scalar keyword arguments become constant columns (step, run, model, ...).
    """
    m = batch.response_mask
    rows, cols = m.nonzero(as_tuple=True)
    first = m.float().argmax(1)
    adv = batch.advantage[rows].numpy()
    df = pd.DataFrame({
        "rollout": rows.numpy(), "group": batch.group[rows].numpy(), "position": (cols - first[rows]).numpy(),
        "token_id": batch.input_ids[rows, cols].numpy(), "reward": batch.reward[rows].numpy(), "advantage": adv,
        "sign": np.where(adv > 0, "pos", np.where(adv < 0, "neg", "zero")),
        "logp_before": before.logp[rows, cols].double().numpy(),
        "prob": before.logp[rows, cols].double().exp().numpy(),
        "entropy": before.entropy[rows, cols].double().numpy(),
    })
    if tokenizer is not None:
        vocab = np.array(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), dtype=object)
        df.insert(4, "token", vocab[df["token_id"].to_numpy()])
    if after is not None:
        df["logp_after"] = after.logp[rows, cols].double().numpy()
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
def noise_floor(model, batch, chunk_rows: int = 64, step_fn=None) -> dict:
    """Measured Δlog p when nothing should change.

    'repeat': two forward passes, no update. 'zero_update': before/after an update whose token
    weights are all zero (`step_fn(model, batch)` performs it; skipped if None). Reported as
    the max |Δ| over response tokens; ε must sit above both.
    """
    m = batch.response_mask
    a = token_stats(model, batch, chunk_rows).logp
    b = token_stats(model, batch, chunk_rows).logp
    out = {"repeat": float((a - b)[m].abs().max())}
    if step_fn is not None:
        with torch.enable_grad():
            step_fn(model, batch)
        c = token_stats(model, batch, chunk_rows).logp
        out["zero_update"] = float((c - a)[m].abs().max())
    return out
