"""Intervals used across the notebooks, in one place.

Percentile bootstrap of a mean, of a difference of means (the value gap), of the balanced gap
(the average of the gaps inside positive and inside negative rollouts, notebook 05), of several
statistics on shared resamples (`bootstrap_stats`,
Boost Rate and Mean Boost of Table 1), Student-t intervals of a mean (over batches, seeds or
steps) and Clopper–Pearson intervals of a proportion.

Every bootstrap draws its resamples as `np.random.default_rng(seed).integers(0, n, (n_boot, n))`
in a fixed order (documented per function), so the same seed gives the same replicates as the
implementations these functions replaced (value.bootstrap_mean/bootstrap_gap,
coupling.boost_stats and notebook 05's balanced gap).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as _st


def _arr(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=float)


def bootstrap_stats(x, fns: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95, q=None) -> dict:
    """{name: (point, lo, hi)} for statistics fn(sample, axis) computed on the same resamples of x.

    `fns` maps a name to a function f(a, axis) (e.g. np.mean); point = f(x, axis=0). The interval
    is the percentile interval at `level` (or at the quantiles `q` = (lo, hi) when given)."""
    x = _arr(x)
    if len(x) == 0:
        return {k: (np.nan, np.nan, np.nan) for k in fns}
    idx = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
    xs = x[idx]
    q = [(1 - level) / 2, (1 + level) / 2] if q is None else list(q)
    out = {}
    for k, f in fns.items():
        r = f(xs, axis=1)
        out[k] = (float(f(x, axis=0)), float(np.quantile(r, q[0])), float(np.quantile(r, q[1])))
    return out


def bootstrap_mean(x, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap interval of the mean of x."""
    return bootstrap_stats(x, {"mean": np.mean}, n_boot, seed, q=(alpha / 2, 1 - alpha / 2))["mean"]


def bootstrap_gap(b, s, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean(b) − mean(s), lo, hi): the value gap with a percentile bootstrap interval.

    b and s are resampled independently, b's draws first, from one generator."""
    b, s = _arr(b), _arr(s)
    if len(b) == 0 or len(s) == 0:
        return np.nan, np.nan, np.nan
    rng = np.random.default_rng(seed)
    g = b[rng.integers(0, len(b), (n_boot, len(b)))].mean(1) - s[rng.integers(0, len(s), (n_boot, len(s)))].mean(1)
    return float(b.mean() - s.mean()), float(np.quantile(g, alpha / 2)), float(np.quantile(g, 1 - alpha / 2))


def balanced_gap(cells, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """The balanced gap: the mean over strata of mean(b) − mean(s), with a percentile bootstrap.

    `cells`: [(b, s), ...] one pair per stratum (e.g. positive, then negative rollouts). Tokens are
    resampled within each of the 2·len(cells) cells, in the order b₁, s₁, b₂, s₂, … from one
    generator (notebook 05's order). NaN when a cell is empty."""
    cells = [(_arr(b), _arr(s)) for b, s in cells]
    if not cells or any(len(x) == 0 for bs in cells for x in bs):
        return np.nan, np.nan, np.nan
    rng = np.random.default_rng(seed)
    boot = sum(x[rng.integers(0, len(x), (n_boot, len(x)))].mean(1) * (1 if i == 0 else -1)
               for bs in cells for i, x in enumerate(bs)) / len(cells)
    g = sum(b.mean() - s.mean() for b, s in cells) / len(cells)
    return float(g), float(np.quantile(boot, alpha / 2)), float(np.quantile(boot, 1 - alpha / 2))


def t_interval(x, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): Student-t interval of the mean of x (NaN bounds for fewer than 2 values)."""
    x = _arr(x)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return np.nan, np.nan, np.nan
    h = t_halfwidth(x, level)
    return float(x.mean()), float(x.mean() - h), float(x.mean() + h)


def ols_coef(y, X, j: int = 0, level: float = 0.95) -> tuple[float, float, float, float]:
    """(β_j, lo, hi, se) of the least-squares fit y ≈ [1, X] β (an intercept is added; column j of X
    is coefficient j + 1), with a heteroskedasticity-robust (HC1) standard error and a Student-t
    interval on n − k degrees of freedom."""
    from scipy import stats as _st
    y = _arr(y)
    X = np.column_stack([np.ones(len(y)), np.asarray(X, float)])
    n, k = X.shape
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    bread = np.linalg.inv(X.T @ X)
    meat = (X * resid[:, None] ** 2).T @ X
    cov = bread @ meat @ bread * n / (n - k)
    se = float(np.sqrt(cov[j + 1, j + 1]))
    h = _st.t.ppf(0.5 + level / 2, n - k) * se
    b = float(beta[j + 1])
    return b, b - h, b + h, se


def t_halfwidth(x, level: float = 0.95) -> float:
    """Half width of the Student-t interval of the mean of x (NaN for fewer than 2 values)."""
    x = _arr(x)
    if len(x) < 2:
        return float("nan")
    return float(_st.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson) interval of a proportion k/n."""
    if n <= 0:
        return np.nan, np.nan
    a = 1 - level
    lo = 0.0 if k <= 0 else float(_st.beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k >= n else float(_st.beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def cluster_ratio(num, den, clusters, n_boot: int = 1000, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float, float, int]:
    """(Σ num / Σ den, lo, hi, n_clusters): a ratio of sums with a percentile bootstrap over clusters.

    Observations of one cluster (e.g. the tokens of one rollout, which share a prompt and a context)
    are resampled together: clusters are numbered in order of first appearance, a replicate draws
    `default_rng(seed).integers(0, n, (n_boot, n))` of them, and replicates with a zero denominator
    are dropped."""
    num, den = _arr(num), _arr(den)
    cl = pd.factorize(np.asarray(clusters))[0]
    n = int(cl.max()) + 1 if len(cl) else 0
    if n == 0 or den.sum() == 0:
        return np.nan, np.nan, np.nan, n
    cn, cd = np.bincount(cl, num, n), np.bincount(cl, den, n)
    idx = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = cn[idx].sum(1) / cd[idx].sum(1)
    r = r[np.isfinite(r)]
    a = (1 - level) / 2
    return float(cn.sum() / cd.sum()), float(np.quantile(r, a)), float(np.quantile(r, 1 - a)), n


def proportion(flags, level: float = 0.95) -> tuple[float, float, float, int]:
    """(share, lo, hi, n) of True in `flags`, with the Clopper–Pearson interval."""
    f = np.asarray(flags, bool)
    lo, hi = clopper_pearson(int(f.sum()), len(f), level)
    return (float(f.mean()) if len(f) else np.nan), lo, hi, len(f)


def sign_balanced_gap(values, sign, status) -> float:
    """Mean over rollout signs of mean(Δ̂ | boosted) − mean(Δ̂ | suppressed); NaN if a cell is empty."""
    values, sign, status = _arr(values), np.asarray(sign), np.asarray(status)
    gaps = []
    for s in ("pos", "neg"):
        b, m = values[(sign == s) & (status == "boosted")], values[(sign == s) & (status == "suppressed")]
        if len(b) == 0 or len(m) == 0:
            return np.nan
        gaps.append(b.mean() - m.mean())
    return float(np.mean(gaps))


def paired_gap_change(values, sign, status_a, status_b, n_boot: int = 2000, seed: int = 0,
                      alpha: float = 0.05) -> tuple[float, float, float]:
    """gap(status_b) − gap(status_a) on the same tokens (sign_balanced_gap), with a paired
    percentile bootstrap: each replicate resamples the tokens once and splits them both ways,
    so what the two splits share cancels (e.g. Fig. 11: step K against step 1)."""
    values, sign = _arr(values), np.asarray(sign)
    status_a, status_b = np.asarray(status_a), np.asarray(status_b)
    d = sign_balanced_gap(values, sign, status_b) - sign_balanced_gap(values, sign, status_a)
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        i = rng.integers(0, len(values), len(values))
        reps.append(sign_balanced_gap(values[i], sign[i], status_b[i]) - sign_balanced_gap(values[i], sign[i], status_a[i]))
    reps = np.asarray(reps)
    reps = reps[np.isfinite(reps)]
    if not np.isfinite(d) or len(reps) < n_boot // 2:
        return float(d), np.nan, np.nan
    return float(d), float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2))


def bootstrap_peak(values, sign, status, score, ks, n_boot: int = 1000, seed: int = 0,
                   alpha: float = 0.05) -> tuple[float, float, float]:
    """Where the sign-balanced gap peaks over top-k% subsets by `score` (Fig. 5(b): k of the
    highest-entropy tokens), with a percentile bootstrap of the argmax: each replicate resamples
    the tokens, keeps the score thresholds of the full pool, and finds its own peak k."""
    values, sign, status, score = _arr(values), np.asarray(sign), np.asarray(status), _arr(score)
    ks = list(ks)
    thr = [np.quantile(score, 1 - k / 100) for k in ks]

    def peak(i):
        g = [sign_balanced_gap(values[i][score[i] >= t], sign[i][score[i] >= t], status[i][score[i] >= t])
             for t in thr]
        return ks[int(np.nanargmax(g))] if np.isfinite(g).any() else np.nan

    point = peak(np.arange(len(values)))
    rng = np.random.default_rng(seed)
    reps = np.array([peak(rng.integers(0, len(values), len(values))) for _ in range(n_boot)], dtype=float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return float(point), np.nan, np.nan
    return float(point), float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2))


def bootstrap_peak_minus_end(values, sign, status, score, ks, n_boot: int = 1000, seed: int = 0,
                             alpha: float = 0.05) -> tuple[float, float, float, float]:
    """The sign-balanced gap at its peak over top-k% subsets by `score` minus the gap at the
    largest k (Fig. 5(b): "rises, then falls"): (d, lo, hi, k_peak). The peak k is chosen once, on
    the full pool (so the point is biased up); each replicate resamples the tokens once, keeps the
    full pool's score thresholds and takes gap(k_peak) − gap(largest k) on the same tokens (paired),
    so the interval can fall below 0. Replicates with a non-finite difference are dropped."""
    values, sign, status, score = _arr(values), np.asarray(sign), np.asarray(status), _arr(score)
    ks = list(ks)
    end = int(np.argmax(ks))
    thr = [np.quantile(score, 1 - k / 100) for k in ks]

    def gaps(i):
        v, sg, st, sc = values[i], sign[i], status[i], score[i]
        return np.array([sign_balanced_gap(v[sc >= t], sg[sc >= t], st[sc >= t]) for t in thr])

    g = gaps(np.arange(len(values)))
    if not np.isfinite(g).any():
        return np.nan, np.nan, np.nan, np.nan
    pk = int(np.nanargmax(g))
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        i = rng.integers(0, len(values), len(values))
        v, sg, st, sc = values[i], sign[i], status[i], score[i]
        a, b = (sign_balanced_gap(v[sc >= thr[j]], sg[sc >= thr[j]], st[sc >= thr[j]]) for j in (pk, end))
        reps.append(a - b)
    reps = np.asarray(reps, float)
    reps = reps[np.isfinite(reps)]
    d = float(g[pk] - g[end])
    if not len(reps):
        return d, np.nan, np.nan, float(ks[pk])
    return d, float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2)), float(ks[pk])


def rollout_pair_bootstrap(stat, cj, ck, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                           pairs: bool = True) -> tuple[float, float, float, int]:
    """(stat(1), lo, hi, n_rollouts): a percentile bootstrap of a statistic of token pairs (j, k) that
    share rollouts, resampling the rollouts (and, when `pairs`, the sampled pairs) together.

    `stat(w)` computes the statistic with one weight per pair (w = 1 gives the point). A replicate
    draws the rollouts of the union of `cj` and `ck` with replacement (w_r = how often rollout r is
    drawn) and, when `pairs`, the pairs with replacement (m_i); pair i then counts
    w_{cj_i} · w_{ck_i} · m_i times, so every pair that touches a rollout moves with it (the two-way
    "pigeonhole" bootstrap of dyadic data). Draws, per replicate from `default_rng(seed)`: the
    rollouts' `integers(0, n_rollouts, n_rollouts)`, then the pairs' `integers(0, n_pairs, n_pairs)`.
    Replicates with a non-finite statistic are dropped."""
    cj, ck = np.asarray(cj), np.asarray(ck)
    n = len(cj)
    lab, uniq = pd.factorize(np.concatenate([cj, ck]))
    lj, lk, nr = lab[:n], lab[n:], len(uniq)
    point = float(stat(np.ones(n)))
    if n == 0 or nr == 0:
        return np.nan, np.nan, np.nan, nr
    rng = np.random.default_rng(seed)
    reps = np.empty(n_boot)
    for b in range(n_boot):
        w = np.bincount(rng.integers(0, nr, nr), minlength=nr).astype(float)
        pw = w[lj] * w[lk]
        if pairs:
            pw = pw * np.bincount(rng.integers(0, n, n), minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            reps[b] = stat(pw)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return point, np.nan, np.nan, nr
    a = (1 - level) / 2
    return point, float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a)), nr


def rollout_matrix_ratio(S, N, n_boot: int = 1000, seed: int = 0,
                         level: float = 0.95) -> tuple[float, float, float, int]:
    """(Σ S / Σ N, lo, hi, n_rollouts): a ratio over every pair (j, k), given per (rollout of j,
    rollout of k) the sums S and counts N as (n, n) matrices over one list of rollouts, with the
    two-way bootstrap of `rollout_pair_bootstrap` (pairs=False: every pair is in, none sampled):
    a replicate draws the n rollouts with replacement (`default_rng(seed).integers(0, n, n)` per
    replicate, weights w) and takes wᵀSw / wᵀNw."""
    S, N = np.asarray(S, float), np.asarray(N, float)
    nr = S.shape[0]
    if nr == 0 or N.sum() == 0:
        return np.nan, np.nan, np.nan, nr
    rng = np.random.default_rng(seed)
    W = np.stack([np.bincount(rng.integers(0, nr, nr), minlength=nr) for _ in range(n_boot)]).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.einsum("bi,ij,bj->b", W, S, W) / np.einsum("bi,ij,bj->b", W, N, W)
    r = r[np.isfinite(r)]
    a = (1 - level) / 2
    return float(S.sum() / N.sum()), float(np.quantile(r, a)), float(np.quantile(r, 1 - a)), nr


def cluster_bootstrap(stat, clusters, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float, float, int]:
    """(stat(all rows), lo, hi, n_clusters): a percentile bootstrap of `stat(idx)` (idx: row positions)
    resampling whole clusters: clusters numbered in order of first appearance, a replicate draws
    `default_rng(seed).integers(0, n, (n_boot, n))`'s row of them and takes every row of each drawn
    cluster. Replicates with a non-finite statistic are dropped."""
    cl = pd.factorize(np.asarray(clusters))[0]
    n = int(cl.max()) + 1 if len(cl) else 0
    if n == 0:
        return np.nan, np.nan, np.nan, 0
    members = [np.nonzero(cl == c)[0] for c in range(n)]
    idx = np.random.default_rng(seed).integers(0, n, (n_boot, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = np.array([stat(np.concatenate([members[c] for c in row])) for row in idx], float)
    reps = reps[np.isfinite(reps)]
    point = float(stat(np.arange(len(cl))))
    if not len(reps):
        return point, np.nan, np.nan, n
    a = (1 - level) / 2
    return point, float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a)), n


def ols_slope(x, y) -> float:
    """The least-squares slope of y on x (with an intercept); NaN when x is constant."""
    x, y = _arr(x), _arr(y)
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx ** 2).sum())
