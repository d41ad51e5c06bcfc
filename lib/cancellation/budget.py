"""Sampling budget and reward composition (paper §3.3 Fig. 6, §4 Fig. 7(b)).

One base rollout batch and one pool of tokens valued once (value.token_values). A *setting* is a
sub-batch of the base batch: `n_prompts` prompts × `n` rollouts each (`subsample`), or, per
query group, k positive and G−k negative rollouts (`composition_rows`). Group advantages are
recomputed on the sub-batch (verl: a group of one rollout gets A = r). One plain-SGD GRPO step
on the sub-batch (`pool_delta`) moves the log-probs of the pool's tokens; the boosted/suppressed
split of the pool changes with the setting, the values do not. The value gap of a split is
linear in the values: gap = Σ_n w_n Δ̂_n (`gap_weights`), which gives the bootstrap over pool
tokens and seeds (`gap_bootstrap`) and the Monte Carlo share of its variance in closed form
(`noise_budget`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from . import grpo, measure, rollout, stats


# --------------------------------------------------------------------------- sub-batches
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def subsample(batch, n_prompts: int, n: int, seed: int = 0) -> torch.Tensor:
    """Rows of `n_prompts` random groups with `n` random rollouts from each (sorted)."""
    groups = batch.group.unique()
    if n_prompts > len(groups):
        raise ValueError(f"subsample: n_prompts={n_prompts} > {len(groups)} groups in the batch")
    g = _gen(seed)
    rows = []
    for grp in groups[torch.randperm(len(groups), generator=g)[:n_prompts]]:
        idx = (batch.group == grp).nonzero().squeeze(1)
        if n > len(idx):
            raise ValueError(f"subsample: n={n} > {len(idx)} rollouts of group {int(grp)}")
        rows.append(idx[torch.randperm(len(idx), generator=g)[:n]])
    return torch.cat(rows).sort().values


def composition_groups(batch, G: int) -> list[int]:
    """Groups with at least G−1 positive and G−1 negative rollouts: every composition k = 1..G−1
    of G rollouts can be drawn from each of them (the same queries for every k)."""
    out = []
    for grp in batch.group.unique().tolist():
        r = batch.reward[batch.group == grp]
        if int((r > 0.5).sum()) >= G - 1 and int((r <= 0.5).sum()) >= G - 1:
            out.append(grp)
    return out


def composition_rows(batch, k: int, G: int, groups, seed: int = 0) -> torch.Tensor:
    """Rows with exactly k positive and G−k negative rollouts drawn at random from each of `groups`."""
    g = _gen(seed)
    rows = []
    for grp in groups:
        m = batch.group == grp
        pos = (m & (batch.reward > 0.5)).nonzero().squeeze(1)
        neg = (m & (batch.reward <= 0.5)).nonzero().squeeze(1)
        if k > len(pos) or G - k > len(neg):
            raise ValueError(f"composition_rows: group {grp} has {len(pos)} positive / {len(neg)} negative "
                             f"rollouts; k={k} of G={G} needs {k} / {G - k}")
        rows += [pos[torch.randperm(len(pos), generator=g)[:k]], neg[torch.randperm(len(neg), generator=g)[:G - k]]]
    return torch.cat(rows).sort().values


def regroup(batch, rows) -> "rollout.RolloutBatch":
    """The sub-batch of `rows` with group advantages recomputed on it (what the update sees)."""
    sub = batch.select(rows)
    sub.advantage = rollout.group_advantages(sub.reward, sub.group)
    return sub


# --------------------------------------------------------------------------- the update
def pool_index(batch, pool: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pool rows of the batch, row of each pool token within them, column of each pool token)."""
    roll, pos = np.array(pool["rollout"], dtype=np.int64), np.array(pool["position"], dtype=np.int64)
    rows = torch.from_numpy(np.unique(roll))
    local = torch.from_numpy(np.searchsorted(rows.numpy(), roll))
    first = batch.response_mask.float().argmax(1)
    cols = first[torch.from_numpy(roll)] + torch.from_numpy(pos)
    return rows, local, cols


def pool_logp(model, batch, pool: pd.DataFrame, chunk_rows: int = 64, token_chunk: int = 4096) -> np.ndarray:
    """log π of every pool token under `model` (one forward over the pool's rows only)."""
    rows, local, cols = pool_index(batch, pool)
    lp = measure.token_stats(model, batch.select(rows), chunk_rows, token_chunk=token_chunk).logp
    return lp[local, cols].double().cpu().numpy()


def pool_delta(model, batch, rows, pool: pd.DataFrame, cfg: grpo.UpdateConfig, old_logp: torch.Tensor,
               before: np.ndarray) -> np.ndarray:
    """Δlog p of the pool's tokens after one GRPO step on the sub-batch `rows` (advantages
    recomputed there). `old_logp`: (B, L) log-probs of the whole batch under θ (ρ = 1);
    `before`: pool_logp under θ. The model's parameters are restored afterwards."""
    sub = regroup(batch, rows)
    with grpo.trial(model, cfg.scope):
        grpo.grpo_step(model, sub, cfg, old_logp=old_logp[torch.as_tensor(rows)])
        return pool_logp(model, batch, pool, cfg.chunk_rows, cfg.token_chunk) - before


# --------------------------------------------------------------------------- the value gap
def gap_weights(status: np.ndarray) -> np.ndarray:
    """w (S, N) with gap_s = Σ_n w_sn Δ̂_n = mean Δ̂(boosted) − mean Δ̂(suppressed) under split s
    (stats.split_gap_weights; a split with no boosted or no suppressed token has a NaN row)."""
    return stats.split_gap_weights(status)


def gap_bootstrap(values: np.ndarray, status: np.ndarray, n_boot: int = 1000, seed: int = 0,
                  alpha: float = 0.05) -> tuple[float, float, float, np.ndarray]:
    """(gap, lo, hi, replicates): the value gap averaged over the S splits (seeds) of `status`
    (S, N), two-stage bootstrap over pool tokens and seeds (stats.weighted_gap_bootstrap; the same
    `seed` gives paired replicates across settings on one pool)."""
    return stats.weighted_gap_bootstrap(values, status, n_boot, seed, alpha)


def noise_budget(values: np.ndarray, se: np.ndarray, status_a: np.ndarray, status_b: np.ndarray,
                 n_boot: int = 1000, seed: int = 0) -> dict:
    """Where the uncertainty of d = gap(b) − gap(a) (same pool, seeds independent) comes from.

    var_seed: from the spread of the per-seed gaps (Var_s / S for each setting, summed);
    var_mc: Monte Carlo noise of the values, Σ_n (w̄_b − w̄_a)_n² se_n² (exact: d is linear in Δ̂);
    var_pool: which tokens are in the pool, the token-resampling variance of d with seed means
    fixed, minus var_mc. They scale as 1/S, 1/(M·N) and 1/N (N: pool size)."""
    v, se = np.asarray(values, float), np.asarray(se, float)
    wa, wb = gap_weights(status_a), gap_weights(status_b)
    ga, gb = wa @ v, wb @ v
    dw = np.nanmean(wb, 0) - np.nanmean(wa, 0)
    var_seed = float(np.nanvar(ga, ddof=1) / len(ga) + np.nanvar(gb, ddof=1) / len(gb)) if len(ga) > 1 else np.nan
    var_mc = float(np.sum(dw ** 2 * se ** 2))
    rng = np.random.default_rng(seed)
    N = len(v)
    reps = []
    for _ in range(n_boot):  # token resampling only (weights recomputed on the resample), seeds fixed
        c = np.bincount(rng.integers(0, N, N), minlength=N).astype(float)
        d = 0.0
        for st, sgn in ((status_b, 1), (status_a, -1)):
            bo, su = (np.atleast_2d(st) == "boosted") * c, (np.atleast_2d(st) == "suppressed") * c
            with np.errstate(invalid="ignore", divide="ignore"):
                d += sgn * np.nanmean((bo @ v) / bo.sum(1) - (su @ v) / su.sum(1))
        reps.append(d)
    var_tok = float(np.nanvar(reps, ddof=1))
    return dict(d=float(np.nanmean(gb) - np.nanmean(ga)), var_seed=var_seed, var_mc=var_mc,
                var_pool=max(var_tok - var_mc, 0.0), var_tokens=var_tok)


def needed(nb: dict, S: int, M: int, N: int, target: float | None = None, z: float = 2.0) -> dict:
    """The smallest seeds S', continuations M' or pool size N' (one at a time, others as
    measured) that bring the standard error of d below |target|/z (target: the measured d);
    inf where the other components alone already exceed it."""
    t = abs(nb["d"] if target is None else target)
    cap = (t / z) ** 2
    vs, vm, vp = (0.0 if np.isnan(nb["var_seed"]) else nb["var_seed"]), nb["var_mc"], nb["var_pool"]
    out = {}
    # the MC term scales as 1/(M·N): a larger pool shrinks it as well as the pool term
    for name, own, n0 in (("seeds", vs, S), ("M", vm, M), ("pool", vp + vm, N)):
        rest = vs + vm + vp - own
        out[name] = float(np.ceil(n0 * own / (cap - rest))) if cap > rest else np.inf
        if own == 0 and cap > rest:
            out[name] = float(n0)
    # all three scaled together by the same factor f (the cheapest combined reading)
    total = vs + vm + vp
    out["factor_all"] = float(total / cap) if cap > 0 else np.inf
    out["se"] = float(np.sqrt(total))
    return out
