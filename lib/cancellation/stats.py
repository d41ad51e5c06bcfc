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

Bootstraps that resample units rather than observations (groups, batches then their groups,
rollouts of token pairs, token ids) share one engine at the end of this module: a design of `Way`s
(`nested` levels, `dyadic` memberships, crossed ways multiplying), drawn by `cluster_resamples`,
read by `cluster_bootstrap` and `percentile_interval`. `cluster_ratio`, `rollout_pair_bootstrap`,
`rollout_matrix_ratio`, `thesis.cluster_bootstrap` (notebook 04) and notebook 05's token-id
bootstrap are that engine with their statistic; each draws what its own loop drew before, in the same
order, so every committed interval is unchanged.

The value-gap intervals (`bootstrap_mean`, `bootstrap_gap`, `balanced_gap`, `paired_gap_change`,
`bootstrap_peak`, `bootstrap_peak_minus_end`; value.sign_gaps and value.repeated_gap above them) resample
tokens by default; given `clusters=` (a label per token, e.g. its query group) they resample the clusters
instead through the same engine (`cluster_resamples(rows=True)`: a drawn cluster brings all its tokens),
notebook 05's intervals: tokens of one query group share a prompt and are not independent.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def _mean(x: np.ndarray) -> float:
    """The mean, NaN for no values (without numpy's empty-slice warning)."""
    return float(x.mean()) if len(x) else np.nan


def _labels(clusters, n: int) -> np.ndarray:
    lab = np.asarray(clusters).ravel()
    if len(lab) != n:
        raise ValueError(f"clusters: {len(lab)} labels for {n} observations (one label per observation)")
    return lab


def resample_rows(n: int, n_boot: int, seed: int, clusters=None):
    """The row positions of n_boot bootstrap replicates of n observations: without `clusters`,
    `default_rng(seed).integers(0, n, n)` per replicate (tokens resampled); with `clusters` (a label
    per observation), the clusters resampled (`cluster_resamples(rows=True)`: n_c of the n_c clusters,
    sorted labels, drawn with `default_rng(seed).integers(0, n_c, n_c)` per replicate; each drawn
    cluster brings all its rows, in position order)."""
    if clusters is None:
        rng = np.random.default_rng(seed)
        for _ in range(n_boot):
            yield rng.integers(0, n, n)
        return
    yield from cluster_resamples([_labels(clusters, n)], n_boot, seed, rows=True)


def _cluster_interval(stat, labels, n_boot: int, seed: int, alpha: float,
                      min_defined: float = 0.5) -> tuple[float, float, float]:
    """(stat(all rows), lo, hi): `cluster_bootstrap(stat, labels, rows=True)` at quantiles alpha/2 and
    1 − alpha/2; replicates where the statistic is undefined (a drawn set without one of its cells)
    are dropped, and the interval is NaN when fewer than `min_defined` of them are defined."""
    point, lo, hi, _ = cluster_bootstrap(stat, labels, n_boot=n_boot, seed=seed, q=(alpha / 2, 1 - alpha / 2),
                                         rows=True, min_defined=min_defined)
    return (point, np.nan, np.nan) if not np.isfinite(point) else (point, lo, hi)


def bootstrap_mean(x, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                   clusters=None) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap interval of the mean of x.

    With `clusters` (a label per value, e.g. its query group) the clusters are resampled, each drawn
    cluster bringing all its values (`cluster_bootstrap(..., rows=True)`)."""
    if clusters is not None:
        x = _arr(x)
        if len(x) == 0:
            return np.nan, np.nan, np.nan
        return _cluster_interval(lambda i: _mean(x[i]), _labels(clusters, len(x)), n_boot, seed, alpha)
    return bootstrap_stats(x, {"mean": np.mean}, n_boot, seed, q=(alpha / 2, 1 - alpha / 2))["mean"]


def bootstrap_gap(b, s, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                  clusters=None) -> tuple[float, float, float]:
    """(mean(b) − mean(s), lo, hi): the value gap with a percentile bootstrap interval.

    b and s are resampled independently, b's draws first, from one generator. With `clusters` =
    (labels of b, labels of s) (e.g. the query group of every token) the clusters of b ∪ s are
    resampled instead, each drawn cluster bringing all its b and s values (a cluster bootstrap,
    `cluster_bootstrap(..., rows=True)`); a replicate that draws no b or no s value is dropped, and
    the interval is NaN when more than half are."""
    b, s = _arr(b), _arr(s)
    if len(b) == 0 or len(s) == 0:
        return np.nan, np.nan, np.nan
    if clusters is not None:
        cb, cs = clusters
        x = np.concatenate([b, s])
        isb = np.r_[np.ones(len(b), bool), np.zeros(len(s), bool)]
        lab = np.concatenate([_labels(cb, len(b)), _labels(cs, len(s))])
        return _cluster_interval(lambda i: _mean(x[i][isb[i]]) - _mean(x[i][~isb[i]]), lab, n_boot, seed, alpha)
    rng = np.random.default_rng(seed)
    g = b[rng.integers(0, len(b), (n_boot, len(b)))].mean(1) - s[rng.integers(0, len(s), (n_boot, len(s)))].mean(1)
    return float(b.mean() - s.mean()), float(np.quantile(g, alpha / 2)), float(np.quantile(g, 1 - alpha / 2))


def balanced_gap(cells, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                 clusters=None) -> tuple[float, float, float]:
    """The balanced gap: the mean over strata of mean(b) − mean(s), with a percentile bootstrap.

    `cells`: [(b, s), ...] one pair per stratum (e.g. positive, then negative rollouts). Tokens are
    resampled within each of the 2·len(cells) cells, in the order b₁, s₁, b₂, s₂, … from one
    generator (notebook 05's order). NaN when a cell is empty. With `clusters` = [(labels of b,
    labels of s), ...] (one pair per stratum, e.g. the query group of every token) the clusters of
    all cells are resampled at once, each drawn cluster bringing all its values in every cell (a
    cluster bootstrap, `cluster_bootstrap(..., rows=True)`); replicates with an empty cell are
    dropped, and the interval is NaN when more than half are."""
    cells = [(_arr(b), _arr(s)) for b, s in cells]
    if not cells or any(len(x) == 0 for bs in cells for x in bs):
        return np.nan, np.nan, np.nan
    if clusters is not None:
        k = len(cells)
        x = np.concatenate([v for bs in cells for v in bs])
        cell = np.concatenate([np.full(len(v), j) for j, v in enumerate(v for bs in cells for v in bs)])
        lab = np.concatenate([_labels(c, len(v)) for (b, s), cs in zip(cells, clusters) for v, c in zip((b, s), cs)])

        def stat(i):
            xi, ci = x[i], cell[i]
            return sum(_mean(xi[ci == 2 * j]) - _mean(xi[ci == 2 * j + 1]) for j in range(k)) / k
        return _cluster_interval(stat, lab, n_boot, seed, alpha)
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
    are resampled together: clusters are numbered in order of first appearance, a replicate draws n
    of them (`cluster_resamples`: as `default_rng(seed).integers(0, n, (n_boot, n))`), and replicates
    with a zero denominator are dropped."""
    num, den = _arr(num), _arr(den)
    cl = pd.factorize(np.asarray(clusters))[0]
    n = int(cl.max()) + 1 if len(cl) else 0
    if n == 0 or den.sum() == 0:
        return np.nan, np.nan, np.nan, n
    cn, cd = np.bincount(cl, num, n), np.bincount(cl, den, n)
    idx = np.stack(list(cluster_resamples([np.arange(n)], n_boot, seed, rows=True)))   # (n_boot, n) drawn clusters
    with np.errstate(invalid="ignore", divide="ignore"):
        r = cn[idx].sum(1) / cd[idx].sum(1)
    return (float(cn.sum() / cd.sum()), *percentile_interval(r, level), n)


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
                      alpha: float = 0.05, clusters=None) -> tuple[float, float, float]:
    """gap(status_b) − gap(status_a) on the same tokens (sign_balanced_gap), with a paired
    percentile bootstrap: each replicate resamples the tokens once and splits them both ways,
    so what the two splits share cancels (e.g. Fig. 11: step K against step 1). With `clusters` (a
    label per token, e.g. its query group) each replicate resamples the clusters instead, a drawn
    cluster bringing all its tokens (`resample_rows`). Replicates with an empty cell are dropped; NaN
    interval when fewer than half are left."""
    values, sign = _arr(values), np.asarray(sign)
    status_a, status_b = np.asarray(status_a), np.asarray(status_b)
    d = sign_balanced_gap(values, sign, status_b) - sign_balanced_gap(values, sign, status_a)
    reps = []
    for i in resample_rows(len(values), n_boot, seed, clusters):
        reps.append(sign_balanced_gap(values[i], sign[i], status_b[i]) - sign_balanced_gap(values[i], sign[i], status_a[i]))
    reps = np.asarray(reps)
    reps = reps[np.isfinite(reps)]
    if not np.isfinite(d) or len(reps) < n_boot // 2:
        return float(d), np.nan, np.nan
    return float(d), float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2))


def bootstrap_peak(values, sign, status, score, ks, n_boot: int = 1000, seed: int = 0,
                   alpha: float = 0.05, to=None, clusters=None) -> tuple[float, float, float]:
    """Where the sign-balanced gap peaks over top-k% subsets by `score` (Fig. 5(b): k of the
    highest-entropy tokens), with a percentile bootstrap of the argmax: each replicate resamples
    the tokens (with `clusters`, a label per token: the clusters, each bringing all its tokens;
    `resample_rows`), keeps the score thresholds of the full pool, and finds its own peak k. `to` (a
    function of k) maps the point and every replicate's k before the percentiles are read."""
    values, sign, status, score = _arr(values), np.asarray(sign), np.asarray(status), _arr(score)
    ks = list(ks)
    thr = [np.quantile(score, 1 - k / 100) for k in ks]

    def peak(i):
        g = [sign_balanced_gap(values[i][score[i] >= t], sign[i][score[i] >= t], status[i][score[i] >= t])
             for t in thr]
        k = ks[int(np.nanargmax(g))] if np.isfinite(g).any() else np.nan
        return to(k) if to is not None and np.isfinite(k) else k

    point = peak(np.arange(len(values)))
    reps = np.array([peak(i) for i in resample_rows(len(values), n_boot, seed, clusters)], dtype=float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return float(point), np.nan, np.nan
    return float(point), float(np.quantile(reps, alpha / 2)), float(np.quantile(reps, 1 - alpha / 2))


def bootstrap_peak_minus_end(values, sign, status, score, ks, n_boot: int = 1000, seed: int = 0,
                             alpha: float = 0.05, clusters=None) -> tuple[float, float, float, float]:
    """The sign-balanced gap at its peak over top-k% subsets by `score` minus the gap at the
    largest k (Fig. 5(b): "rises, then falls"): (d, lo, hi, k_peak). The peak k is chosen once, on
    the full pool (so the point is biased up); each replicate resamples the tokens once, keeps the
    full pool's score thresholds and takes gap(k_peak) − gap(largest k) on the same tokens (paired),
    so the interval can fall below 0. Replicates with a non-finite difference are dropped. With
    `clusters` (a label per token) each replicate resamples the clusters instead, each bringing all
    its tokens (`resample_rows`)."""
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
    reps = []
    for i in resample_rows(len(values), n_boot, seed, clusters):
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
    Replicates with a non-finite statistic are dropped. The design `cluster_bootstrap(stat,
    dyadic(rollout of j, rollout of k), pairs)` with the rollouts numbered by first appearance."""
    cj, ck = np.asarray(cj), np.asarray(ck)
    n = len(cj)
    lab = pd.factorize(np.concatenate([cj, ck]))[0]   # rollouts in order of first appearance
    ways = [dyadic(lab[:n], lab[n:])] + ([np.arange(n)] if pairs else [])
    return cluster_bootstrap(stat, *ways, n_boot=n_boot, seed=seed, level=level)


def rollout_matrix_ratio(S, N, n_boot: int = 1000, seed: int = 0,
                         level: float = 0.95) -> tuple[float, float, float, int]:
    """(Σ S / Σ N, lo, hi, n_rollouts): a ratio over every pair (j, k), given per (rollout of j,
    rollout of k) the sums S and counts N as (n, n) matrices over one list of rollouts, with the
    two-way bootstrap of `rollout_pair_bootstrap` (pairs=False: every pair is in, none sampled):
    a replicate draws the n rollouts with replacement (`cluster_resamples`: `default_rng(seed).integers(0,
    n, n)` per replicate, weights w) and takes wᵀSw / wᵀNw."""
    S, N = np.asarray(S, float), np.asarray(N, float)
    nr = S.shape[0]
    if nr == 0 or N.sum() == 0:
        return np.nan, np.nan, np.nan, nr
    W = np.stack(list(cluster_resamples([np.arange(nr)], n_boot, seed)))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.einsum("bi,ij,bj->b", W, S, W) / np.einsum("bi,ij,bj->b", W, N, W)
    return (float(S.sum() / N.sum()), *percentile_interval(r, level), nr)


def ols_slope(x, y) -> float:
    """The least-squares slope of y on x (with an intercept); NaN when x is constant."""
    x, y = _arr(x), _arr(y)
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx ** 2).sum())


# ----------------------------------------------------------------------------- the cluster bootstrap
# One engine for every bootstrap that resamples units (prompts' groups, batches, rollouts, pairs, token ids)
# rather than single observations. A design is a list of *ways*; each way resamples its own units and an
# observation's multiplicity in a replicate is the product over the ways of its units' multiplicities
# (crossed ways: the "pigeonhole" bootstrap of two-way data). A way is one level of units, or several
# nested levels (batches, then the groups of each drawn batch), or one level that an observation belongs to
# several times (dyadic data: a pair (j, k) belongs to the rollout of j and to the rollout of k).
@dataclass(frozen=True, eq=False)
class Way:
    """One way of a cluster design: unit levels, outer first (built by `nested` or `dyadic`).

    `codes[l]`: an (m, n_obs) array, the unit of every observation at level l, numbered 0..n_l − 1 in
    sorted order of the labels (pass `pd.factorize` codes to number units in order of first appearance);
    m = 1 except for a dyadic level. `children[l][u]`: the level-l units inside unit u of level l − 1,
    in sorted order."""
    codes: tuple
    sizes: tuple
    children: tuple
    members: list | None   # per innermost unit: its observations in position order (single membership only)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """The innermost units of one replicate, in draw order and with repeats: n₀ level-0 units drawn
        with `rng.integers(0, n₀, n₀)`; then, level by level, inside each drawn unit (in draw order) as
        many of its k children as it has, `rng.integers(0, k, k)` (a call even when k = 1)."""
        drawn = rng.integers(0, self.sizes[0], self.sizes[0])
        for kids in self.children[1:]:
            parts = [kids[u][rng.integers(0, len(kids[u]), len(kids[u]))] for u in drawn]
            drawn = np.concatenate(parts) if parts else np.zeros(0, int)
        return drawn

    def weights(self, drawn: np.ndarray) -> np.ndarray:
        """Per observation: how often its innermost unit was drawn (a dyadic level: the product over
        its memberships), float64."""
        counts = np.bincount(drawn, minlength=self.sizes[-1]).astype(float)
        w = counts[self.codes[-1][0]]
        for c in self.codes[-1][1:]:
            w = w * counts[c]
        return w

    def rows(self, drawn: np.ndarray) -> np.ndarray:
        """The observations of the drawn innermost units: each unit's observations in position order,
        units in draw order (a single-membership way only)."""
        if self.members is None:
            raise ValueError("rows: a dyadic way has no rows of a unit (use weights)")
        return np.concatenate([self.members[u] for u in drawn]) if len(drawn) else np.zeros(0, int)


def _members(codes: np.ndarray, n: int) -> list[np.ndarray]:
    order = np.argsort(codes, kind="stable")
    return np.split(order, np.cumsum(np.bincount(codes, minlength=n))[:-1])


def _codes(*labels) -> tuple[np.ndarray, int]:
    """Labels (one array per membership) -> (m, n_obs) codes in sorted order of the labels, n units."""
    lab = [np.asarray(x).ravel() for x in labels]
    uniq, inv = np.unique(np.concatenate(lab), return_inverse=True)
    return inv.reshape(len(lab), -1), len(uniq)


def nested(*levels) -> Way:
    """A way of nested unit levels, outer first, each given by its label per observation (a unit of
    level l must lie inside one unit of level l − 1): e.g. nested(batch, group) draws the batches with
    replacement, then the groups of each drawn batch with replacement."""
    if not levels:
        raise ValueError("nested() needs at least one level of unit labels")
    codes, sizes, children = [], [], [None]
    for lab in levels:
        c, n = _codes(lab)
        if len(codes):
            parent = np.full(n, -1)
            parent[c[0]] = codes[-1][0]
            if (parent[c[0]] != codes[-1][0]).any():
                raise ValueError("nested(): a unit of an inner level lies in several units of the level above")
            children.append(_members(parent, sizes[-1]))
        codes.append(c)
        sizes.append(n)
    return Way(tuple(codes), tuple(sizes), tuple(children), _members(codes[-1][0], sizes[-1]))


def dyadic(*memberships) -> Way:
    """A one-level way whose observations each belong to several of its units (dyadic data: a pair of
    tokens belongs to the rollout of each): one draw of the units, an observation counts the product of
    its units' multiplicities. Units are the union of every membership's labels."""
    c, n = _codes(*memberships)
    return Way((c,), (n,), (None,), None)


def _way(w) -> Way:
    return w if isinstance(w, Way) else nested(w)


def cluster_resamples(ways, n_boot: int = 1000, seed: int = 0, rows: bool = False):
    """Yield the n_boot replicates of a cluster design: per replicate, every way in order draws its units
    from one `default_rng(seed)` (`Way.draw`). Yields each replicate's per-observation weights (float64,
    the product over the ways), or with `rows` (one single-membership way) the drawn observations' row
    positions (`Way.rows`: units in draw order; a statistic of them sums in the same order as a loop that
    copies the clusters)."""
    ways = [_way(w) for w in ways]
    if rows and (len(ways) != 1 or len(ways[0].codes[-1]) != 1):
        raise ValueError("rows=True needs one way whose observations belong to one unit each")
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        if rows:
            yield ways[0].rows(ways[0].draw(rng))
            continue
        w = None
        for way in ways:
            ww = way.weights(way.draw(rng))
            w = ww if w is None else w * ww
        yield w


def percentile_interval(reps, level: float = 0.95, q=None, min_defined: float = 0.0) -> tuple[float, float]:
    """(lo, hi): the percentile interval of the finite replicates at `level` (quantiles (1 − level)/2 and
    1 − (1 − level)/2, or `q` = (lo, hi) when given); NaN when no replicate is finite or the finite share
    is below `min_defined`."""
    reps = np.asarray(reps, float)
    ok = np.isfinite(reps)
    if not ok.any() or ok.mean() < min_defined:
        return np.nan, np.nan
    a = (1 - level) / 2
    q = (a, 1 - a) if q is None else q
    return float(np.quantile(reps[ok], q[0])), float(np.quantile(reps[ok], q[1]))


def cluster_bootstrap(stat, *ways, n_boot: int = 1000, seed: int = 0, level: float = 0.95, q=None,
                      rows: bool = False, min_defined: float = 0.0) -> tuple[float, float, float, int]:
    """(point, lo, hi, n_units): a percentile bootstrap of a statistic over a cluster design.

    `ways`: `Way`s (`nested`, `dyadic`) or label arrays (a one-level way each). `stat(w)` takes one
    weight per observation (w = 1 gives the point), or with `rows` the row positions of the resampled
    observations (`arange(n_obs)` gives the point). Replicates from `cluster_resamples`; non-finite
    ones are dropped, and with `min_defined` the interval is NaN when fewer than that share are finite
    (`percentile_interval`). n_units: the units of the first way's outer level."""
    ws = [_way(w) for w in ways]
    n_obs, n_units = ws[0].codes[0].shape[1], ws[0].sizes[0]
    point = float(stat(np.arange(n_obs) if rows else np.ones(n_obs)))
    if n_obs == 0 or n_units == 0:
        return np.nan, np.nan, np.nan, n_units
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = np.array([stat(r) for r in cluster_resamples(ws, n_boot, seed, rows=rows)], float)
    return (point, *percentile_interval(reps, level, q, min_defined), n_units)
