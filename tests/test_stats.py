"""stats: intervals against independent computations (scipy, brute-force loops)."""
import numpy as np
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
