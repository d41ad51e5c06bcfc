"""The referees' controls against independent computations: frequency matching by counting, the
cross-sign kernel summary by a brute-force loop over pairs, full-parameter inner products by autograd."""
import numpy as np
import pandas as pd
import pytest
import torch

from cancellation import controls, coupling, measure
from cancellation.compute import Compute


def _tokens(seed=0, n=3000):
    g = np.random.default_rng(seed)
    return pd.DataFrame({"step": g.integers(0, 3, n), "token_id": g.integers(0, 12, n),
                         "sign": g.choice(["pos", "neg", "zero"], n, p=[0.5, 0.3, 0.2]),
                         "status": g.choice(measure.STATUSES, n), "delta": g.normal(size=n)})


def test_frequency_match_equal_counts_per_id():
    t = _tokens()
    m = controls.frequency_match(t, by=("step",), seed=1)
    c = m.groupby(["step", "token_id", "sign"]).size().unstack("sign", fill_value=0)
    assert (c["pos"] == c["neg"]).all() and set(m.sign) == {"pos", "neg"}
    # the kept count is the smaller of the two, for every (step, id) with both signs
    full = t[t.sign != "zero"].groupby(["step", "token_id", "sign"]).size().unstack("sign", fill_value=0)
    assert (c["pos"] == full.min(axis=1).loc[c.index]).all()
    assert m.merge(t, how="left", indicator=True)._merge.eq("both").all()   # rows are a subset


def test_within_id_gap_by_hand():
    t = _tokens(2)
    w = controls.within_id_gap(t, "boosted").set_index(["step", "token_id"])
    for (s, i), row in w.sample(10, random_state=0).iterrows():
        d = t[(t.step == s) & (t.token_id == i)]
        share = lambda sg: (d[d.sign == sg].status == "boosted").mean()  # noqa: E731
        assert np.isclose(row.gap, 100 * (share("pos") - share("neg")))


def test_cross_kernel_summary_equals_brute_force(model64, batch):
    f = coupling.features(model64, batch, compute=Compute())
    s = controls.cross_kernel_summary(f, threshold=0.5, chunk=7, vocab_chunk=11, n_boot=50)
    Kd = coupling.kernel(f)
    A, p, o = f.A.tolist(), f.p.tolist(), f.o.tolist()
    cells = {}
    for j in range(len(f)):
        for k in range(len(f)):
            if A[j] > 0 and A[k] < 0:
                key = (controls.CONF_BINS[p[j] >= 0.5], controls.CONF_BINS[p[k] >= 0.5],
                       "same" if o[j] == o[k] else "different")
                cells.setdefault(key, []).append(float(Kd[j, k]))
    assert s.n_pairs.sum() == sum(len(v) for v in cells.values())
    for _, r in s.iterrows():
        v = np.array(cells.get((r.bin_j, r.bin_k, r.pair), []))
        assert r.n_pairs == len(v)
        if len(v):
            assert np.isclose(r.mean_K, v.mean(), rtol=1e-9, atol=1e-15)
            assert np.isclose(r.mean_abs_K, np.abs(v).mean(), rtol=1e-9, atol=1e-15)
            assert np.isclose(r.share_positive, (v > 0).mean())
    m, lo, hi, n = controls.pooled_same_token(f, n_boot=50)
    same = np.concatenate([v for k, v in cells.items() if k[2] == "same"])
    assert n == len(same) and np.isclose(m, same.mean(), rtol=1e-9) and lo <= m <= hi


def test_full_grad_inner_equals_autograd(model64, batch):
    f = coupling.features(model64, batch, compute=Compute())
    J, K = controls.sample_tokens(f, 8, threshold=0.5, seed=0)
    ip = controls.full_grad_inner(model64, batch, f, J, K, grad_chunk=3)
    # independent: one unpadded forward of the whole model per token, full logits, autograd
    params = [p for p in model64.parameters() if p.requires_grad]

    def grad(j):
        r, c = int(f.rows[j]), int(f.cols[j])
        keep = batch.attention_mask[r].bool()
        pos = int(keep[:c].sum())                      # index of token c among the row's kept tokens
        ids = batch.input_ids[r, keep][None]
        lp = torch.log_softmax(model64(input_ids=ids).logits[0, pos - 1], -1)[ids[0, pos]]
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(lp, params)])

    for a, b in ((0, 0), (len(J) - 1, len(K) - 1), (1, 2)):
        ref = float(grad(int(J[a])) @ grad(int(K[b])))
        assert np.isclose(float(ip[a, b]), ref, rtol=1e-8, atol=1e-12 * abs(ref) + 1e-14)
    pairs = controls.pair_table(f, J, K, ip, threshold=0.5)
    assert len(pairs) == len(J) * len(K)
    assert np.allclose(pairs.lm_head_K, coupling.kernel(f, J, K).reshape(-1).numpy(), rtol=1e-9, atol=1e-15)


def test_cross_kernel_cells_equal_brute_force_per_pair_of_rollouts(model64, batch):
    """The per-(rollout of j, rollout of k) sums behind the two-way intervals of Fig. 12(b)."""
    f = coupling.features(model64, batch, compute=Compute())
    cells = controls.cross_kernel_cells(f, threshold=0.5, chunk=7, vocab_chunk=11)
    Kd = coupling.kernel(f)
    A, p, o, rows = f.A.tolist(), f.p.tolist(), f.o.tolist(), f.rows.tolist()
    want = {}
    for j in range(len(f)):
        for k in range(len(f)):
            if A[j] > 0 and A[k] < 0:
                key = (rows[j], rows[k], controls.CONF_BINS[p[j] >= 0.5], controls.CONF_BINS[p[k] >= 0.5],
                       "same" if o[j] == o[k] else "different")
                n, s = want.get(key, (0, 0.0))
                want[key] = (n + 1, s + float(Kd[j, k]))
    got = {(r.row_j, r.row_k, r.bin_j, r.bin_k, r.pair): (r.n_pairs, r.sum_K) for r in cells.itertuples()}
    assert set(got) == set(want)
    for key, (n, s) in want.items():
        assert got[key][0] == n and np.isclose(got[key][1], s, rtol=1e-9, atol=1e-15)
    summ = controls.cross_kernel_summary(n_boot=50, cells=cells)
    assert (summ.mean_K_lo.dropna() <= summ.mean_K.dropna() + 1e-12).all()


def test_pair_intervals_point_is_the_cell_mean_and_the_interval_moves_with_the_rollouts():
    """Fig. 12(c)'s error bars: per (bin_j, bin_k, pair) cell the point is the mean of the pairs (a loop), and
    the interval resamples the rollouts of j and k (a cell whose pairs all share one rollout value has none)."""
    rng = np.random.default_rng(0)
    rows = [dict(bin_j=bj, bin_k=bk, pair=pr, row_j=int(rng.integers(4)), row_k=4 + int(rng.integers(4)),
                 full_inner=float(rng.normal(1.0 if pr == "same" else 0.0)))
            for bj in ("p<0.9", "p>=0.9") for bk in ("p<0.9", "p>=0.9") for pr in ("same", "different") for _ in range(30)]
    pairs = pd.DataFrame(rows)
    got = controls.pair_intervals(pairs, n_boot=300, seed=1)
    assert len(got) == 8
    for r in got.itertuples():
        xs = [x["full_inner"] for x in rows if (x["bin_j"], x["bin_k"], x["pair"]) == (r.bin_j, r.bin_k, r.pair)]
        assert r.mean == pytest.approx(sum(xs) / len(xs), rel=1e-12)
        assert r.lo <= r.mean <= r.hi and r.hi - r.lo > 0
