"""Notebook 05's value-gap null (issue 61, item 4): the value gap after the real GRPO step against the gaps after
K within-group sign shuffles of the advantages, on Fig. 11's pool. The shuffled steps against the exact steps
and the real step, the shuffles' law, and the gaps, p-value and paired interval against brute-force loops (on a
synthetic table and on the committed tiny tables and claim rows)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cancellation import claims as C
from cancellation import stats as S
from cancellation import value
from cancellation.compute import Compute
from cancellation.figures import fig05

TINY = Path(__file__).resolve().parents[1] / "data" / "results" / "tiny"
LR = 0.1


@pytest.fixture(scope="module")
def steps(model64, batch):
    """null_steps on the test batch (K = 3) by both paths, and the real step as Fig. 5 takes it."""
    knobs = Compute()
    before = {k: v.clone() for k, v in model64.state_dict().items()}
    matrix = fig05.null_steps(model64, batch, knobs, LR, 3, seed=5)
    old = fig05.NULL_MATRIX_BYTES
    fig05.NULL_MATRIX_BYTES = 0   # force the exact path
    try:
        exact = fig05.null_steps(model64, batch, knobs, LR, 3, seed=5)
    finally:
        fig05.NULL_MATRIX_BYTES = old
    real = value.repeated_deltas(model64, batch, knobs.update(optimizer="sgd", lr=LR, scope="full", n_minibatches=1), 1)
    assert all(torch.equal(v, before[k]) for k, v in model64.state_dict().items())   # θ₀ untouched
    return matrix, exact, real[0]


def test_the_real_order_is_the_real_step(steps):
    """Row 0 of the null (identity order, weights = the batch's advantages, through the shuffles' path) is the
    real step's Δlog p (value.repeated_deltas, Fig. 5's split) to float64 round-off, by both paths."""
    matrix, exact, real = steps
    assert matrix["path"] == "matrix" and exact["path"] == "exact"
    assert np.abs(real).max() > 1e-4                     # the step moved log-probs
    assert np.abs(matrix["deltas"][0] - real).max() < 1e-10
    assert np.abs(exact["deltas"][0] - real).max() < 1e-10
    assert (matrix["orders"][0] == np.arange(len(matrix["orders"][0]))).all()


def test_both_paths_give_the_same_shuffled_steps(steps):
    matrix, exact, _ = steps
    assert (matrix["orders"] == exact["orders"]).all()
    assert matrix["deltas"].shape == exact["deltas"].shape == (4, matrix["deltas"].shape[1])
    assert np.abs(matrix["deltas"] - exact["deltas"]).max() < 1e-10
    assert np.abs(matrix["deltas"][1:] - matrix["deltas"][0]).max() > 1e-6   # a shuffle moved the step (one may
    # permute equal advantages only: a draw of the null like any other)


def test_shuffles_keep_each_groups_multiset_of_advantages(steps, batch):
    matrix, _, _ = steps
    A, g = batch.advantage.cpu().numpy(), batch.group.cpu().numpy()
    moved = False
    for o in matrix["orders"][1:]:
        for grp in np.unique(g):
            rows = np.flatnonzero(g == grp)
            assert sorted(o[rows]) == sorted(rows)               # rows of the group only
            assert sorted(A[o[rows]]) == sorted(A[rows])
        moved |= not np.array_equal(A[o], A)
    assert moved


def _table(seed=0, k1=8, n=60, groups=9):
    rng = np.random.default_rng(seed)
    pool = pd.DataFrame(dict(tok_idx=np.arange(n) * 2, group=rng.integers(0, groups, n),
                             sign=np.where(np.arange(n) < n // 2, "pos", "neg"), delta_hat=rng.normal(size=n)))
    deltas = rng.normal(scale=1e-5, size=(k1, 2 * n))
    deltas[:, ::7] = 0.0   # some stable tokens
    return pool, fig05.null_token_table(pool, deltas, 1e-6)


def _loop_gap(d, sign=None):
    d = d if sign is None else d[d.sign == sign]
    return d[d.status == "boosted"].delta_hat.mean() - d[d.status == "suppressed"].delta_hat.mean()


def _check_gaps(nt, tab):
    for k, d in nt.groupby("shuffle"):
        r = tab.set_index("shuffle").loc[k]
        assert r.gap == pytest.approx(_loop_gap(d), abs=1e-12)
        assert r.gap_pos == pytest.approx(_loop_gap(d, "pos"), abs=1e-12)
        assert r.gap_neg == pytest.approx(_loop_gap(d, "neg"), abs=1e-12)
        assert r.gap_balanced == pytest.approx((_loop_gap(d, "pos") + _loop_gap(d, "neg")) / 2, abs=1e-12)
        assert r.n_boosted == (d.status == "boosted").sum() and r.n_suppressed == (d.status == "suppressed").sum()
        assert r.real == (k == 0)


def _loop_test(nt, n_boot, seed):
    """null_test by loops: per replicate, the drawn groups' tokens copied (stats.resample_rows), every step's gap."""
    k1 = nt.shuffle.max() + 1
    steps = [d.reset_index(drop=True) for _, d in nt.groupby("shuffle")]
    out = {}
    for name, fn in (("pooled", _loop_gap), ("balanced", lambda d: (_loop_gap(d, "pos") + _loop_gap(d, "neg")) / 2)):
        g = np.array([fn(d) for d in steps])
        reps = []
        for rows in S.resample_rows(len(steps[0]), n_boot, seed, clusters=steps[0].group):
            gk = [fn(d.iloc[rows]) for d in steps]
            reps.append(gk[0] - np.mean(gk[1:]))
        lo, hi = S.percentile_interval(reps, q=(0.025, 0.975), min_defined=0.5)
        p = (1 + sum(x >= g[0] for x in g[1:])) / k1
        out[name] = dict(real=g[0], diff=g[0] - g[1:].mean(), lo=lo, hi=hi, p=p, null_median=np.median(g[1:]))
    return out


def test_gaps_p_value_and_interval_against_loops():
    _, nt = _table()
    tab = fig05.null_gaps(nt)
    _check_gaps(nt, tab)
    got, want = fig05.null_test(nt, 200, 3), _loop_test(nt, 200, 3)
    assert got["K"] == 7 and got["n_groups"] == nt.group.nunique()
    for name in fig05.NULL_STATS:
        for f in ("real", "diff", "lo", "hi", "p", "null_median"):
            assert got[name][f] == pytest.approx(want[name][f], abs=1e-12), (name, f)
        assert got[name]["resolution"] == 1 / 8


def test_permutation_p_counts_ties_as_extreme():
    assert fig05.permutation_p(1.0, [0.0, 1.0, 2.0]) == 3 / 4
    assert fig05.permutation_p(5.0, np.zeros(39)) == 1 / 40


@pytest.mark.skipif(not (TINY / "fig05_value_null_tokens.parquet").exists(), reason="no committed null table")
def test_committed_null_tables_and_rows_are_loops():
    """The committed per-shuffle table is the loop over the committed per-token table, and the claim rows read it
    (the point, p-value and interval recomputed; the interval with the notebook's n_boot and seed)."""
    nt = pd.read_parquet(TINY / "fig05_value_null_tokens.parquet")
    tab = pd.read_parquet(TINY / "fig05_value_null.parquet")
    _check_gaps(nt, tab)
    reg = C.read_registry(TINY / "claims.parquet").set_index("claim")
    P = fig05.Params()
    want = _loop_test(nt, P.n_boot, P.seed)
    for cid, name in (("fig05_value_gap_vs_null", "pooled"), ("fig05_value_gap_vs_null_balanced", "balanced")):
        r = reg.loc[cid]
        w = want[name]
        assert r.measured == pytest.approx(w["diff"], abs=1e-12)
        assert (r.lo, r.hi) == pytest.approx((w["lo"], w["hi"]), abs=1e-12)
        assert r.resampling == "group" and r.n == nt.group.nunique()
        assert f"p = {w['p']:.3f}" in r.detail
        assert r.verdict == C.direction(r.measured, r.lo, r.hi, sign=1)
