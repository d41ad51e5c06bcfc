"""The cancellation hypothesis as a test that could fail (notebook 04, App. E.1 / Algorithm 2).

On one fixed batch and one saved θ₀, single SGD updates are taken from θ₀ and Δlog p is measured on
the whole batch after each: positive-only (A·1[r=1]), negative-only (A·1[r=0]), GRPO (A), and GRPO
with the *opposite-sign copies* masked (`copies_mask`: every token of an A < 0 rollout whose token id
occurs in an A > 0 rollout of the same group gets loss weight 0; the falsification update).

Every token occurrence of an A > 0 rollout is *shared* when its token id also occurs in an A < 0
rollout of the same group, else *specific* (success-specific); mirrored for A < 0 rollouts
(failure-specific). `classify` does it on the token table, `copies_mask` on the batch tensors (the
same definition). Zero-advantage groups carry no signal and are left out.

Cancellation of a token: c = Δ_GRPO − Δ_single-sign, the single-sign update being positive-only for
the A > 0 pool and negative-only for the A < 0 pool (what adding the opposite sign did to it).
Contrasts compare the two classes: *raw* (difference of class means) and *matched* (within strata
of token id × confidence bin, the difference of class means, averaged with the weights
n_shared·n_specific/(n_shared + n_specific); strata holding one class only drop out). Intervals:
percentile bootstrap over batches, then over the groups (query groups: their rollouts, tokens and
classes together) of each drawn batch — `cluster_bootstrap`, drawn by the notebooks' one cluster
bootstrap engine (`stats.nested(batch, group)` through `stats.cluster_resamples`); no interval with
fewer than `MIN_BATCHES` batches.

`cells` reduces the token table to the sufficient statistics (per batch, group, pool, class,
category, token id and confidence bin: counts and sums of every Δ), the committed table
`fig04_thesis_cells.parquet`; every contrast and interval is a function of it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from . import stats as S

UPDATES = ("positive_only", "negative_only", "grpo", "grpo_masked")
POOLS = ("pos", "neg")
CLASSES = ("shared", "specific")
KEYS = ["batch", "group", "pool", "cls", "category", "token_id", "bin"]
SUMS = [f"sum_{u}" for u in UPDATES]
SUMMARY_COLUMNS = ["pool", "category", "n_shared", "n_specific", "clusters", "batches", "matched_share", "statistic",
                   "estimator", "contrast", "lo", "hi", "mean_shared", "mean_specific"]
MIN_BATCHES = 5   # fewer batches: no interval (a percentile bootstrap over 2-4 batches says little)
# what each statistic is: a difference of two updates' Δ (None: Δ of the first alone)
VALUES = {"cancellation": ("grpo", "single"), "net": ("grpo", None), "masked_cancellation": ("grpo_masked", "single")}


def copies_mask(batch) -> torch.Tensor:
    """(B, L) loss weights: 0 on each token of an A < 0 rollout whose token id occurs among the
    response tokens of an A > 0 rollout of the same group, 1 elsewhere."""
    w = torch.ones(batch.input_ids.shape, dtype=torch.float64, device=batch.input_ids.device)
    m, adv = batch.response_mask.bool(), batch.advantage
    for g in batch.group.unique():
        rows = batch.group == g
        pos, neg = rows & (adv > 0), rows & (adv < 0)
        if not pos.any() or not neg.any():
            continue
        ids = batch.input_ids[pos][m[pos]].unique()
        hit = torch.isin(batch.input_ids, ids) & m & neg[:, None]
        w[hit] = 0.0
    return w


def classify(tokens: pd.DataFrame) -> pd.Series:
    """Per token: 'shared' / 'specific' by the rule above, '' for zero-advantage tokens."""
    t = tokens[["batch", "group", "token_id"]].assign(p=tokens.advantage > 0, n=tokens.advantage < 0)
    has = t.groupby(["batch", "group", "token_id"])[["p", "n"]].any().rename(columns={"p": "in_pos", "n": "in_neg"})
    j = t.join(has, on=["batch", "group", "token_id"])
    shared = (j.p & j.in_neg) | (j.n & j.in_pos)
    out = np.where(shared, "shared", "specific")
    return pd.Series(np.where(j.p | j.n, out, ""), index=tokens.index, name="cls")


def cells(tokens: pd.DataFrame, bins) -> pd.DataFrame:
    """The sufficient statistics: per (batch, group, pool, cls, category, token_id, bin) the token
    count `n` and the sums of Δ under every update (`sum_<update>`). `tokens` needs delta_<update>
    for UPDATES, advantage, prob, category; `bins`: the confidence-bin edges on p."""
    t = tokens.assign(cls=classify(tokens))
    t = t[t.cls != ""]
    t = t.assign(pool=np.where(t.advantage > 0, "pos", "neg"), bin=np.digitize(t.prob, bins),
                 **{f"sum_{u}": t[f"delta_{u}"] for u in UPDATES})
    out = t.groupby(KEYS, observed=True).agg(n=("token_id", "size"), **{s: (s, "sum") for s in SUMS}).reset_index()
    return out


def single(pool: str) -> str:
    return "positive_only" if pool == "pos" else "negative_only"


def _value_sums(c: pd.DataFrame, what: str, pool: str) -> np.ndarray:
    a, b = VALUES[what]
    v = c[f"sum_{a}"].to_numpy()
    return v - c[f"sum_{single(pool)}"].to_numpy() if b == "single" else v


def arrays(c: pd.DataFrame, pool: str, whats) -> tuple:
    """Dense (clusters, strata, 2 classes) arrays of counts and of the sums of each statistic in
    `whats`, for one pool; and the batch of every cluster."""
    c = c[c.pool == pool]
    cl, clusters = pd.factorize(pd.MultiIndex.from_frame(c[["batch", "group"]]))
    st, _ = pd.factorize(pd.MultiIndex.from_frame(c[["token_id", "bin"]]))
    k = (c.cls.to_numpy() == "specific").astype(int)
    C, S = len(clusters), int(st.max()) + 1 if len(st) else 0
    N = np.zeros((C, S, 2))
    np.add.at(N, (cl, st, k), c.n.to_numpy())
    V = {}
    for w in whats:
        V[w] = np.zeros((C, S, 2))
        np.add.at(V[w], (cl, st, k), _value_sums(c, w, pool))
    return N, V, np.asarray([b for b, _ in clusters])


def contrast(n: np.ndarray, v: np.ndarray, how: str) -> np.ndarray:
    """shared − specific of per-class means, over the last two axes (strata, class): 'raw' pools
    the strata, 'matched' averages within-stratum differences with weights n₁n₂/(n₁+n₂)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if how == "raw":
            ns, vs = n.sum(-2), v.sum(-2)
            return vs[..., 0] / ns[..., 0] - vs[..., 1] / ns[..., 1]
        m = v / n
        w = n[..., 0] * n[..., 1] / (n[..., 0] + n[..., 1])
        d = np.where(w > 0, m[..., 0] - m[..., 1], 0.0)
        w = np.where(w > 0, w, 0.0)
        return (w * d).sum(-1) / w.sum(-1)


def class_means(n: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    ns, vs = n.sum(0).sum(0), v.sum(0).sum(0)
    return float(vs[0] / ns[0]), float(vs[1] / ns[1])


def cluster_weights(batch_of: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, clusters) multiplicities of the two-stage bootstrap: batches with replacement, then
    the clusters (groups) of each drawn batch with replacement (`stats.nested(batch, cluster)`, drawn
    by `stats.cluster_resamples`)."""
    way = S.nested(batch_of, np.arange(len(batch_of)))
    return np.array(list(S.cluster_resamples([way], n_boot, seed)), dtype=float).reshape(n_boot, len(batch_of))


def cluster_bootstrap(N, V: dict, batch_of, stat, n_boot: int = 1000, seed: int = 0, level: float = 0.95, W=None):
    """(point, lo, hi) of stat(n, v_dict) -> array over the leading axis, with the two-stage
    bootstrap of `cluster_weights` (or the given multiplicities W): every replicate's cluster sums at
    once (W @ the per-cluster arrays); replicates where the statistic is undefined are dropped, and
    there is no interval (NaN) when that is over 5% of them (`stats.percentile_interval`)."""
    C = N.shape[0]
    flat = lambda A, W: (W @ A.reshape(C, -1)).reshape((W.shape[0],) + A.shape[1:])  # noqa: E731
    one = np.ones((1, C))
    point = float(stat(flat(N, one), {k: flat(v, one) for k, v in V.items()})[0])
    W = cluster_weights(batch_of, n_boot, seed) if W is None else W
    reps = stat(flat(N, W), {k: flat(v, W) for k, v in V.items()})
    return (point, *S.percentile_interval(reps, level, min_defined=0.95))


def summary(c: pd.DataFrame, categories=(), n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The tidy table of every contrast: per pool, category ('all' or one of `categories`),
    statistic (cancellation, net, masked_cancellation, and masked − GRPO cancellation: 'mask_effect')
    and estimator (raw, matched): the shared − specific contrast with its cluster-bootstrap interval,
    the class means, token counts, clusters, batches and the share of tokens in matched strata."""
    rows = []
    for pool in POOLS:
        for cat in ("all",) + tuple(categories):
            d = c if cat == "all" else c[c.category == cat]
            d = d[d.pool == pool]
            if d.empty or d.cls.nunique() < 2:
                continue
            N, V, batch_of = arrays(d, pool, VALUES)
            n_sh, n_sp = N[..., 0].sum(), N[..., 1].sum()
            both = (N.sum(0) > 0).all(-1)                      # strata holding both classes
            coverage = float(N.sum(0)[both].sum() / N.sum())
            W = cluster_weights(batch_of, n_boot, seed)       # one set of draws for every statistic: paired
            base = dict(pool=pool, category=cat, n_shared=int(n_sh), n_specific=int(n_sp),
                        clusters=len(batch_of), batches=len(np.unique(batch_of)), matched_share=coverage)
            for how in ("raw", "matched"):
                whats = list(VALUES) + ["mask_effect"]
                for what in whats:
                    if what == "mask_effect":
                        f = lambda n, v, h=how: contrast(n, v["masked_cancellation"], h) - contrast(n, v["cancellation"], h)  # noqa: E731
                        ms, mp = np.nan, np.nan
                    else:
                        f = lambda n, v, h=how, w=what: contrast(n, v[w], h)  # noqa: E731
                        ms, mp = class_means(N, V[what])
                    m, lo, hi = cluster_bootstrap(N, V, batch_of, f, W=W)
                    if base["batches"] < MIN_BATCHES:
                        lo = hi = np.nan
                    rows.append(dict(base, statistic=what, estimator=how, contrast=m, lo=lo, hi=hi,
                                     mean_shared=ms, mean_specific=mp))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
