"""stats: intervals against independent computations (scipy, brute-force loops)."""
import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from cancellation import coupling, stats, value


def test_clopper_pearson_against_scipy_beta():
    for k, n in [(0, 10), (3, 10), (10, 10), (47, 100), (1, 400)]:
        lo, hi = stats.clopper_pearson(k, n)
        want_lo = st.beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
        want_hi = st.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
        assert lo == pytest.approx(want_lo, abs=1e-12) and hi == pytest.approx(want_hi, abs=1e-12)
        if 0 < k < n:  # coverage property: P(X >= k | lo) = 0.025 and P(X <= k | hi) = 0.025
            assert st.binom.sf(k - 1, n, lo) == pytest.approx(0.025, abs=1e-9)
            assert st.binom.cdf(k, n, hi) == pytest.approx(0.025, abs=1e-9)
    share, lo, hi, n = stats.proportion([True, False, False, True])
    assert (share, n) == (0.5, 4) and (lo, hi) == stats.clopper_pearson(2, 4)


def test_t_interval_against_scipy():
    x = np.array([0.3, -0.1, 0.25, 0.4, 0.05, 0.2])
    m, lo, hi = stats.t_interval(x)
    want = st.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=st.sem(x))
    assert m == pytest.approx(x.mean()) and (lo, hi) == pytest.approx(want, abs=1e-12)
    assert np.isnan(stats.t_interval([1.0])[1])


def _loop_means(x, idx):
    return np.array([sum(x[j] for j in row) / len(row) for row in idx])


def test_bootstrap_mean_and_gap_against_brute_force_loop():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=37), rng.normal(0.5, 2, size=23)
    # brute force: draw the same indices, average with Python loops, take the percentiles
    idx = np.random.default_rng(3).integers(0, len(x), (300, len(x)))
    means = _loop_means(x, idx)
    assert stats.bootstrap_mean(x, 300, 3) == pytest.approx((x.mean(), *np.quantile(means, [0.025, 0.975])), abs=1e-12)
    g = np.random.default_rng(3)
    ib, is_ = g.integers(0, len(x), (300, len(x))), g.integers(0, len(y), (300, len(y)))
    gaps = _loop_means(x, ib) - _loop_means(y, is_)
    assert stats.bootstrap_gap(x, y, 300, 3) == pytest.approx((x.mean() - y.mean(), *np.quantile(gaps, [0.025, 0.975])),
                                                              abs=1e-12)
    assert value.bootstrap_mean(x, 300, 3) == stats.bootstrap_mean(x, 300, 3)
    assert value.bootstrap_gap(x, y, 300, 3) == stats.bootstrap_gap(x, y, 300, 3)


def test_balanced_gap_against_brute_force_loop():
    rng = np.random.default_rng(1)
    cells = [(rng.normal(1, 1, 12), rng.normal(0, 1, 9)), (rng.normal(0.5, 1, 7), rng.normal(0, 1, 15))]
    g = np.random.default_rng(11)
    reps = np.zeros(200)
    for i, (b, s) in enumerate(cells):
        reps += _loop_means(b, g.integers(0, len(b), (200, len(b)))) / 2
        reps -= _loop_means(s, g.integers(0, len(s), (200, len(s)))) / 2
    point = np.mean([b.mean() - s.mean() for b, s in cells])
    assert stats.balanced_gap(cells, 200, 11) == pytest.approx((point, *np.quantile(reps, [0.025, 0.975])), abs=1e-12)
    assert np.isnan(stats.balanced_gap([(cells[0][0], [])], 10, 0)[0])


def test_boost_stats_exact_rate_interval_and_bootstrap_mean():
    d = np.random.default_rng(0).normal(0.1, 1, 50)
    out = coupling.boost_stats(d, 400, 7)
    k = int((d > 0).sum())
    assert out["boost_rate"] == k / 50 and out["n"] == 50
    assert out["boost_rate_lo"] == pytest.approx(st.beta.ppf(0.025, k, 50 - k + 1))   # Clopper–Pearson by scipy
    assert out["boost_rate_hi"] == pytest.approx(st.beta.ppf(0.975, k + 1, 50 - k))
    idx = np.random.default_rng(7).integers(0, 50, (400, 50))
    mb = np.array([np.mean([d[j] for j in row]) for row in idx])
    assert (out["mean_boost_lo"], out["mean_boost_hi"]) == pytest.approx(tuple(np.quantile(mb, [0.025, 0.975])))
    full = coupling.boost_stats(np.ones(400), 100, 0)  # 400/400: no longer a zero-width interval
    assert full["boost_rate_lo"] < 0.995 and full["boost_rate_hi"] == 1.0


def test_paired_gap_change_against_a_hand_loop():
    """The point value by hand; the interval pairs the splits (identical splits give exactly 0)."""
    rng = np.random.default_rng(3)
    n = 60
    v = rng.normal(size=n)
    sign = np.where(np.arange(n) % 2, "pos", "neg")
    a = np.where(rng.random(n) < 0.5, "boosted", "suppressed")
    b = np.where(rng.random(n) < 0.5, "boosted", "suppressed")

    def gap(st):
        out = []
        for s in ("pos", "neg"):
            bb = [x for x, g, t in zip(v, sign, st) if g == s and t == "boosted"]
            ss = [x for x, g, t in zip(v, sign, st) if g == s and t == "suppressed"]
            out.append(sum(bb) / len(bb) - sum(ss) / len(ss))
        return sum(out) / 2

    d, lo, hi = stats.paired_gap_change(v, sign, a, b, n_boot=300, seed=1)
    assert np.isclose(d, gap(b) - gap(a)) and lo <= d <= hi
    assert stats.paired_gap_change(v, sign, a, a, n_boot=50) == (0.0, 0.0, 0.0)


def test_bootstrap_peak_finds_a_planted_peak():
    """Tokens whose value gap exists only at mid scores: the peak and its interval sit there."""
    rng = np.random.default_rng(0)
    n = 2000
    score = rng.random(n)
    sign = np.where(rng.random(n) < 0.5, "pos", "neg")
    status = np.where(rng.random(n) < 0.5, "boosted", "suppressed")
    mid = (score > 0.5) & (score < 0.7)  # the top 30-50% by score
    values = rng.normal(0, 0.1, n) + np.where(mid & (status == "boosted"), 1.0, 0.0)
    k, lo, hi = stats.bootstrap_peak(values, sign, status, score, [10, 20, 30, 40, 50, 60, 80, 100], n_boot=200)
    assert k == 50 and 40 <= lo <= hi <= 60


def test_cluster_ratio_against_a_loop_that_copies_clusters():
    """Each replicate rebuilt token by token: the drawn clusters' tokens concatenated (a cluster drawn
    twice, twice), then Σ num / Σ den; clusters numbered by first appearance; the point is the ratio of sums."""
    rng = np.random.default_rng(3)
    clusters = rng.integers(0, 9, 60) * 7 + 100       # 9 clusters with arbitrary labels
    num, den = rng.normal(size=60), rng.uniform(0.5, 2, 60)
    m, lo, hi, n = stats.cluster_ratio(num, den, clusters, n_boot=300, seed=5)
    assert n == len(set(clusters)) and m == pytest.approx(num.sum() / den.sum(), rel=1e-12)
    labels = list(dict.fromkeys(clusters.tolist()))  # order of first appearance
    draws = np.random.default_rng(5).integers(0, n, (300, n))
    reps = []
    for row in draws:
        nn = dd = 0.0
        for c in row:
            for t in range(60):
                if clusters[t] == labels[c]:
                    nn += num[t]
                    dd += den[t]
        reps.append(nn / dd)
    assert lo == pytest.approx(np.quantile(reps, 0.025), rel=1e-10)
    assert hi == pytest.approx(np.quantile(reps, 0.975), rel=1e-10)


# ----------------------------------------------------------------------------- the one cluster-bootstrap engine
def _loop_two_stage(batch, group, n_boot, seed):
    """Per replicate, by hand: draw the batches (sorted labels) with replacement, then inside each drawn
    batch, in draw order, its groups (sorted labels) with replacement; a row counts how often its
    (batch, group) was drawn."""
    rng = np.random.default_rng(seed)
    batches = sorted(set(batch.tolist()))
    out = []
    for _ in range(n_boot):
        count = {}
        for bi in rng.integers(0, len(batches), len(batches)):
            groups = sorted({g for b, g in zip(batch, group) if b == batches[bi]})
            for gi in rng.integers(0, len(groups), len(groups)):
                key = (batches[bi], groups[gi])
                count[key] = count.get(key, 0) + 1
        out.append([float(count.get((b, g), 0)) for b, g in zip(batch, group)])
    return np.array(out)


def test_nested_way_draws_batches_then_their_groups_like_a_loop():
    rng = np.random.default_rng(11)
    batch = rng.choice([30, 10, 20, 40], 80)                  # unsorted labels, rows in no order
    group = batch * 100 + rng.integers(0, 5, 80)              # groups live inside one batch each
    got = np.stack(list(stats.cluster_resamples([stats.nested(batch, group)], 200, seed=4)))
    assert np.array_equal(got, _loop_two_stage(batch, group, 200, 4))
    with pytest.raises(ValueError, match="several units"):
        stats.nested(batch, rng.integers(0, 3, 80))          # a group spread over batches is not nested


def test_crossed_dyadic_and_pair_ways_against_a_loop():
    """rollout_pair_bootstrap's design: one draw of the rollouts (a pair counts w_j · w_k), then one of
    the pairs; the statistic's replicates and percentiles by hand."""
    rng = np.random.default_rng(2)
    rj, rk = rng.integers(0, 7, 50) * 3 + 1, rng.integers(0, 7, 50) * 3 + 1
    x = rng.normal(size=50)
    m, lo, hi, n = stats.cluster_bootstrap(lambda w: (w * x).sum() / w.sum(), stats.dyadic(rj, rk), np.arange(50),
                                           n_boot=300, seed=9)
    units = sorted(set(rj.tolist()) | set(rk.tolist()))
    g, reps = np.random.default_rng(9), []
    for _ in range(300):
        wr = {u: 0.0 for u in units}
        for i in g.integers(0, len(units), len(units)):
            wr[units[i]] += 1
        wp = np.bincount(g.integers(0, 50, 50), minlength=50)
        w = np.array([wr[a] * wr[b] * wp[i] for i, (a, b) in enumerate(zip(rj, rk))])
        reps.append((w * x).sum() / w.sum() if w.sum() else np.nan)
    reps = np.array(reps)[np.isfinite(reps)]
    assert n == len(units) and m == pytest.approx(x.mean(), rel=1e-12)
    a = (1 - 0.95) / 2
    assert (lo, hi) == (np.quantile(reps, a), np.quantile(reps, 1 - a))   # bit for bit: the same draws
    # the named wrapper is this design on the rollouts numbered by first appearance (pd.factorize codes)
    lab = pd.factorize(np.concatenate([rj, rk]))[0]
    want = stats.cluster_bootstrap(lambda w: (w * x).sum() / w.sum(), stats.dyadic(lab[:50], lab[50:]), np.arange(50),
                                   n_boot=300, seed=9)
    assert stats.rollout_pair_bootstrap(lambda w: (w * x).sum() / w.sum(), rj, rk, 300, 9) == want


def test_rows_form_copies_clusters_in_draw_order_like_a_loop():
    """With rows=True the statistic sees the drawn clusters' rows, cluster by cluster in draw order
    (a cluster drawn twice, twice), so it is bit-identical to a loop that copies them."""
    rng = np.random.default_rng(5)
    cl = rng.integers(0, 12, 70) * 5 - 20
    x, y = rng.normal(size=70), rng.normal(size=70)
    m, lo, hi, n = stats.cluster_bootstrap(lambda i: stats.ols_slope(x[i], y[i]), cl, n_boot=250, seed=1, rows=True)
    labels = sorted(set(cl.tolist()))
    g, reps = np.random.default_rng(1), []
    for _ in range(250):
        rows = [t for c in g.integers(0, len(labels), len(labels)) for t in range(70) if cl[t] == labels[c]]
        reps.append(stats.ols_slope(x[rows], y[rows]))
    assert n == len(labels) and m == stats.ols_slope(x, y)
    a = (1 - 0.95) / 2                                      # the quantiles every bootstrap here reads
    assert lo == np.quantile(reps, a) and hi == np.quantile(reps, 1 - a)


def test_percentile_interval_drops_undefined_replicates_and_gives_none_below_min_defined():
    reps = np.r_[np.arange(95.0), [np.nan] * 5]
    a = (1 - 0.95) / 2
    assert stats.percentile_interval(reps) == (float(np.quantile(np.arange(95.0), a)),
                                               float(np.quantile(np.arange(95.0), 1 - a)))
    assert stats.percentile_interval(reps, q=(0.1, 0.9)) == tuple(np.quantile(np.arange(95.0), [0.1, 0.9]))
    assert stats.percentile_interval(reps, min_defined=0.95) != (np.nan, np.nan)
    assert np.isnan(stats.percentile_interval(np.r_[reps, np.nan], min_defined=0.95)).all()
    assert np.isnan(stats.percentile_interval([np.nan, np.inf])).all()


# ----------------------------------------------------------------------------- notebook 05: query groups resampled
def _loop_group_draws(labels, n_boot, seed):
    """Per replicate, by hand: the clusters (sorted labels) drawn with `default_rng(seed).integers(0, n, n)`,
    the engine's draw, and every drawn cluster's rows copied in, cluster by cluster in draw order."""
    units = sorted(set(labels.tolist()))
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        yield [t for c in rng.integers(0, len(units), len(units)) for t in range(len(labels)) if labels[t] == units[c]]


def _loop_gap(rows, x, is_b):
    b = [x[t] for t in rows if is_b[t]]
    s = [x[t] for t in rows if not is_b[t]]
    return sum(b) / len(b) - sum(s) / len(s) if b and s else float("nan")


def _loop_sign_balanced(rows, x, sign, status):
    out = []
    for sg in ("pos", "neg"):
        b = [x[t] for t in rows if sign[t] == sg and status[t] == "boosted"]
        s = [x[t] for t in rows if sign[t] == sg and status[t] == "suppressed"]
        if not b or not s:
            return float("nan")
        out.append(sum(b) / len(b) - sum(s) / len(s))
    return sum(out) / 2


def _percentiles(reps, n_boot):
    reps = np.array(reps, float)
    ok = reps[np.isfinite(reps)]
    assert len(ok) >= n_boot // 2
    return tuple(np.quantile(ok, [0.025, 0.975]))


def _grouped_tokens(seed=8, n=140, n_groups=9):
    rng = np.random.default_rng(seed)
    group = rng.integers(0, n_groups, n) * 10 + 3                      # arbitrary labels, rows in no order
    effect = rng.normal(0, 0.6, n_groups * 10 + 10)[group]             # a shared group effect: not independent
    sign = rng.choice(["pos", "neg"], n)
    status = rng.choice(["boosted", "suppressed"], n)
    x = effect + rng.normal(size=n) + 0.3 * (status == "boosted")
    return x, sign, status, group


def test_group_gap_intervals_equal_a_loop_that_copies_the_groups():
    """bootstrap_gap / balanced_gap / bootstrap_mean with clusters=: the groups drawn as the engine draws
    them (sorted labels, `default_rng(seed).integers`), each drawn group's tokens copied in by a loop;
    replicates without a cell dropped; the percentiles of those replicates."""
    x, sign, status, group = _grouped_tokens()
    is_b = status == "boosted"
    b, s = x[is_b], x[~is_b]
    n_boot, seed = 300, 4
    got = stats.bootstrap_gap(b, s, n_boot, seed, clusters=(group[is_b], group[~is_b]))
    order = np.r_[np.flatnonzero(is_b), np.flatnonzero(~is_b)]         # the b values first, as the function sees them
    xo, bo, go = x[order], is_b[order], group[order]
    reps = [_loop_gap(rows, xo, bo) for rows in _loop_group_draws(go, n_boot, seed)]
    assert got == pytest.approx((b.mean() - s.mean(), *_percentiles(reps, n_boot)), abs=1e-12)
    # the sign-balanced gap: one draw of the groups for both signs' cells
    cells = [(x[(sign == sg) & is_b], x[(sign == sg) & ~is_b]) for sg in ("pos", "neg")]
    labs = [(group[(sign == sg) & is_b], group[(sign == sg) & ~is_b]) for sg in ("pos", "neg")]
    got = stats.balanced_gap(cells, n_boot, seed, clusters=labs)
    order = np.concatenate([np.flatnonzero((sign == sg) & (is_b == wb))
                            for sg in ("pos", "neg") for wb in (True, False)])
    reps = [_loop_sign_balanced(rows, x[order], sign[order], status[order])
            for rows in _loop_group_draws(group[order], n_boot, seed)]
    point = np.mean([bb.mean() - ss.mean() for bb, ss in cells])
    assert got == pytest.approx((point, *_percentiles(reps, n_boot)), abs=1e-12)
    reps = [sum(x[t] for t in rows) / len(rows) for rows in _loop_group_draws(group, n_boot, seed)]
    assert stats.bootstrap_mean(x, n_boot, seed, clusters=group) == pytest.approx(
        (x.mean(), *np.quantile(reps, [0.025, 0.975])), abs=1e-12)
    with pytest.raises(ValueError, match="labels"):
        stats.bootstrap_mean(x, 10, 0, clusters=group[:-1])


def test_group_paired_change_and_peaks_equal_a_loop_that_copies_the_groups():
    """paired_gap_change, bootstrap_peak and bootstrap_peak_minus_end with clusters=: the same group draws
    by a loop, the statistic recomputed on the copied tokens."""
    x, sign, status, group = _grouped_tokens(seed=3, n=160)
    rng = np.random.default_rng(1)
    status_b = np.where(rng.random(len(x)) < 0.2, np.where(status == "boosted", "suppressed", "boosted"), status)
    n_boot, seed = 200, 6
    d, lo, hi = stats.paired_gap_change(x, sign, status, status_b, n_boot, seed, clusters=group)
    reps = [_loop_sign_balanced(r, x, sign, status_b) - _loop_sign_balanced(r, x, sign, status)
            for r in _loop_group_draws(group, n_boot, seed)]
    want = _loop_sign_balanced(range(len(x)), x, sign, status_b) - _loop_sign_balanced(range(len(x)), x, sign, status)
    assert (d, lo, hi) == pytest.approx((want, *_percentiles(reps, n_boot)), abs=1e-12)
    score, ks = rng.random(len(x)), [25, 50, 75, 100]
    thr = [np.quantile(score, 1 - k / 100) for k in ks]

    def gaps(rows):
        return [_loop_sign_balanced([t for t in rows if score[t] >= th], x, sign, status) for th in thr]

    peaks, diffs = [], []
    g0 = gaps(range(len(x)))
    pk = int(np.nanargmax(g0))
    for rows in _loop_group_draws(group, n_boot, seed):
        g = gaps(rows)
        peaks.append(ks[int(np.nanargmax(g))] if np.isfinite(g).any() else np.nan)
        diffs.append(g[pk] - g[-1])
    ok = np.array(peaks, float)[np.isfinite(peaks)]
    assert stats.bootstrap_peak(x, sign, status, score, ks, n_boot, seed, clusters=group) == pytest.approx(
        (ks[pk], *np.quantile(ok, [0.025, 0.975])), abs=1e-12)
    ok = np.array(diffs, float)[np.isfinite(diffs)]
    assert stats.bootstrap_peak_minus_end(x, sign, status, score, ks, n_boot, seed, clusters=group) == pytest.approx(
        (g0[pk] - g0[-1], *np.quantile(ok, [0.025, 0.975]), ks[pk]), abs=1e-12)


def test_one_token_per_group_is_a_token_bootstrap_in_distribution():
    """With every token its own group the cluster bootstrap is the token bootstrap (other draws, so the
    intervals agree to Monte Carlo error); where the gap itself differs between groups, resampling the
    groups widens the interval."""
    rng = np.random.default_rng(0)
    b, s = rng.normal(0.3, 1, 400), rng.normal(0, 1.5, 300)
    tok = stats.bootstrap_gap(b, s, 4000, 1)
    one = stats.bootstrap_gap(b, s, 4000, 1, clusters=(np.arange(400), 400 + np.arange(300)))
    half = 1.96 * np.sqrt(b.var(ddof=1) / 400 + s.var(ddof=1) / 300)
    assert one[0] == tok[0] and abs(one[1] - tok[1]) < 0.08 * half and abs(one[2] - tok[2]) < 0.08 * half
    x = rng.normal(size=500)
    m_tok, m_one = stats.bootstrap_mean(x, 4000, 2), stats.bootstrap_mean(x, 4000, 2, clusters=np.arange(500)[::-1])
    h = 1.96 * x.std(ddof=1) / np.sqrt(500)
    assert m_one[0] == m_tok[0] and abs(m_one[1] - m_tok[1]) < 0.08 * h and abs(m_one[2] - m_tok[2]) < 0.08 * h
    _, _, status, group = _grouped_tokens(seed=2, n=400, n_groups=10)
    is_b = status == "boosted"
    x = rng.normal(size=400) + is_b * rng.normal(0.3, 0.8, 200)[group]   # each group its own gap
    g_tok = stats.bootstrap_gap(x[is_b], x[~is_b], 1000, 0)
    g_grp = stats.bootstrap_gap(x[is_b], x[~is_b], 1000, 0, clusters=(group[is_b], group[~is_b]))
    assert g_grp[0] == g_tok[0] and g_grp[2] - g_grp[1] > g_tok[2] - g_tok[1]
