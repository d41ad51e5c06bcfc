"""The sign-shuffle null's pooled statistics (notebook 04, App. E.1): the token table's null columns (`null_columns`:
what `thesis.null_batch` gives, as `fig04.thesis_updates` stores it), their sufficient statistics pooled over batches
and groups for every definition of NULL_DEFNS (`null_cells`), each shuffle's statistics (`null_values`) and the real
value against the null's median, central 95% band and permutation p-values (`null_bands`). The classes, views and
statistics are thesis.py's (`classify`, `state_view`, `CLASS_STATS`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .thesis import CLASS_STATS, MAX_K, PERMUTED, STATES, classify, context_keys, state_keys, state_view

NULL_DEFNS = (("ids", 0),) + tuple(("context", k) for k in range(1, MAX_K + 1)) + (("state", 0),)
NULL_KEYS = ["defn", "k", "shuffle", "pool", "cls", "state", "token_id", "bin"]
NULL_VALUE_COLUMNS = ["defn", "k", "states", "pool", "statistic", "shuffle", "value"]
NULL_BAND_COLUMNS = ["defn", "k", "states", "pool", "statistic", "real", "null_median", "null_lo", "null_hi", "K", "side",
                     "p_paper", "p_other"]
NULL_STATS = ("shared_cancellation", "specific_cancellation", "shared_retained", "specific_amplification", "contrast")


def null_columns(K: int) -> list[str]:
    """The token table's columns of the null: each shuffle's advantage and its three updates' Δ."""
    return [f"null_adv_{s}" for s in range(1, K + 1)] + [f"null_{u}_{s}" for s in range(1, K + 1) for u in PERMUTED]


def null_cells(tokens: pd.DataFrame, K: int, bins) -> pd.DataFrame:
    """The null's sufficient statistics, pooled over batches and groups (the point of a pooled statistic needs no
    cluster): per (defn, k, shuffle, pool, cls, state, token_id, bin) the count `n` and the sums of the
    single-sign Δ (`sum_single`: positive-only in the A > 0 pool, negative-only in A < 0) and of the GRPO Δ
    (`sum_grpo`), for every definition of NULL_DEFNS (ids; context k = 1..MAX_K; state). Shuffle 0 is the real
    signs (delta_<u>, advantage); shuffle s ≥ 1 reads null_adv_<s> and null_<u>_<s> (`null_columns`): its pools
    and classes are the shuffled signs', so shuffle s is the same statistic under the s-th shuffle of every batch."""
    t = tokens.copy()
    ctx = context_keys(t, MAX_K)
    st = state_keys(t)
    t["bin"] = np.digitize(t.prob, bins)
    out = []
    for s in range(K + 1):
        sign = "advantage" if s == 0 else f"null_adv_{s}"
        col = (lambda u: f"delta_{u}") if s == 0 else (lambda u, s=s: f"null_{u}_{s}")
        state = np.where(classify(t, st, sign) == "shared", "same", "other")
        pos = t[sign].to_numpy() > 0
        base = pd.DataFrame({"pool": np.where(pos, "pos", "neg"), "state": state, "token_id": t.token_id.to_numpy(),
                             "bin": t["bin"].to_numpy(), "n": 1,
                             "sum_single": np.where(pos, t[col("positive_only")], t[col("negative_only")]),
                             "sum_grpo": t[col("grpo")].to_numpy()})
        for defn, k in NULL_DEFNS:
            keys = st if defn == "state" else ctx[:k + 1]
            cls = classify(t, keys, sign).to_numpy()
            d = base.assign(cls=cls)[cls != ""]
            g = d.groupby(["pool", "cls", "state", "token_id", "bin"], observed=True)[["n", "sum_single", "sum_grpo"]]
            out.append(g.sum().reset_index().assign(defn=defn, k=k, shuffle=s))
    return pd.concat(out, ignore_index=True)[NULL_KEYS + ["n", "sum_single", "sum_grpo"]]


def pooled(d: pd.DataFrame) -> dict:
    """{"N", "single", "grpo", "cancellation"} as (1, strata, classes) arrays of one pool's pooled cells."""
    st, _ = pd.factorize(pd.MultiIndex.from_frame(d[["token_id", "bin"]]))
    k = (d.cls.to_numpy() == "specific").astype(int)
    shape = (1, int(st.max()) + 1 if len(st) else 0, 2)
    arr = {}
    for name, v in (("N", d.n), ("single", d.sum_single), ("grpo", d.sum_grpo)):
        arr[name] = np.zeros(shape)
        np.add.at(arr[name], (0, st, k), v.to_numpy(dtype=float))
    arr["cancellation"] = arr["grpo"] - arr["single"]
    return arr


def null_values(nc: pd.DataFrame) -> pd.DataFrame:
    """Per (defn, k, states, pool, statistic, shuffle): the pooled statistic (CLASS_STATS of NULL_STATS) of the null
    cells `nc` (`null_cells`); shuffle 0 is the real signs. 'other' and 'same' views (`state_view`) on every
    definition but state (where shared is 'same' by definition)."""
    rows = []
    for (defn, k, s, pool), d in nc.groupby(["defn", "k", "shuffle", "pool"], sort=True):
        for states in (("all",) if defn == "state" else STATES):
            v = state_view(d, states)
            if v.cls.nunique() < 2:
                continue
            a = pooled(v)
            for stat in NULL_STATS:
                rows.append(dict(defn=defn, k=k, states=states, pool=pool, statistic=stat, shuffle=s,
                                 value=float(CLASS_STATS[stat](a)[0])))
    return pd.DataFrame(rows, columns=NULL_VALUE_COLUMNS)


# the side of the null a statistic must leave on to support the paper (contrast: shared lose more than specific,
# so more negative in A > 0 and more positive in A < 0; amplification: the specific class's gain grows)
PAPER_SIDE = {("contrast", "pos"): -1, ("contrast", "neg"): 1, ("specific_amplification", "pos"): 1,
              ("specific_amplification", "neg"): 1, ("shared_cancellation", "pos"): -1,
              ("shared_cancellation", "neg"): 1, ("specific_cancellation", "pos"): 1,
              ("specific_cancellation", "neg"): -1, ("shared_retained", "pos"): -1, ("shared_retained", "neg"): -1}


def null_bands(values: pd.DataFrame) -> pd.DataFrame:
    """Per (defn, k, states, pool, statistic): the real value (shuffle 0), the null's median and central 95% band
    (2.5% and 97.5% quantiles of shuffles 1..K), K, and the one-sided permutation p-values toward the paper's side
    (`p_paper`: (1 + #{null at or beyond the real value on that side}) / (K + 1)) and away from it (`p_other`);
    their resolution is 1 / (K + 1). NaN statistics (an empty class under a shuffle) are left out of the null."""
    rows = []
    for key, d in values.groupby(["defn", "k", "states", "pool", "statistic"], sort=True):
        real = d[d.shuffle == 0].value
        null = d[d.shuffle > 0].value.dropna().to_numpy()
        if real.empty or not len(null):
            continue
        r = float(real.iloc[0])
        side = PAPER_SIDE[(key[4], key[3])]
        beyond = (side * (null - r) >= 0).sum()        # as or more extreme than r toward the paper's side
        against = (side * (null - r) <= 0).sum()       # ... away from it
        lo, med, hi = np.quantile(null, [0.025, 0.5, 0.975])
        rows.append(dict(zip(["defn", "k", "states", "pool", "statistic"], key), real=r, null_median=float(med),
                         null_lo=float(lo), null_hi=float(hi), K=len(null), side=side,
                         p_paper=(1 + beyond) / (len(null) + 1), p_other=(1 + against) / (len(null) + 1)))
    return pd.DataFrame(rows, columns=NULL_BAND_COLUMNS)
