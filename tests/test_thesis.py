"""cancellation.thesis (the hypothesis rows of notebook 04) against brute force: the shared /
specific classes, the copies mask, the raw and matched contrasts, the two-stage bootstrap's draws,
and the updates themselves (positive-only == GRPO with A·1[r=1]; the masked update == the loss with
those tokens dropped), by autograd on a small model."""
import copy
import itertools

import numpy as np
import pandas as pd
import pytest
import torch

from cancellation import grpo, measure, thesis
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def _tokens(seed=0, n_batches=3, groups=3, G=4, L=6, vocab=5):
    rng = np.random.default_rng(seed)
    rows = []
    for b, g, i in itertools.product(range(n_batches), range(groups), range(G)):
        adv = [1.0, -1.0, 0.5, -0.5][i] if g < groups - 1 else 0.0   # the last group: all equal rewards
        for t in range(L):
            rows.append(dict(batch=b, group=g, rollout=g * G + i, position=t, token_id=int(rng.integers(vocab)),
                             advantage=adv, prob=float(rng.uniform()), category=["Math", "Template"][t % 2],
                             **{f"delta_{u}": float(rng.normal()) for u in thesis.UPDATES}))
    return pd.DataFrame(rows)


def test_classify_matches_a_loop():
    t = _tokens()
    got = thesis.classify(t)
    for k, r in t.iterrows():
        if r.advantage == 0:
            assert got[k] == ""
            continue
        other = t[(t.batch == r.batch) & (t.group == r.group) & (np.sign(t.advantage) == -np.sign(r.advantage))]
        assert got[k] == ("shared" if r.token_id in set(other.token_id) else "specific")
    assert {"shared", "specific", ""} == set(got)


def test_copies_mask_matches_classify(batch):
    w = thesis.copies_mask(batch)
    m = batch.response_mask
    t = _table(batch)
    cls = thesis.classify(t)
    want = ((cls == "shared") & (t.advantage < 0)).to_numpy()
    assert ((w[m] == 0).numpy() == want).all() and want.any()
    assert (w[~m] == 1).all()
    for r in t[want].itertuples():  # brute force: a masked token's id is in an A > 0 rollout of its group
        pos = t[(t.group == r.group) & (t.advantage > 0)]
        assert r.advantage < 0 and r.token_id in set(pos.token_id)


def _table(batch):
    m = batch.response_mask
    rows, cols = m.nonzero(as_tuple=True)
    return pd.DataFrame({"batch": 0, "group": batch.group[rows].numpy(), "rollout": rows.numpy(),
                         "token_id": batch.input_ids[rows, cols].numpy(), "advantage": batch.advantage[rows].numpy()})


def _brute_contrasts(c, pool, what, cats=None):
    """raw and matched shared − specific of one statistic, by loops over the cells."""
    a, b = thesis.VALUES[what]
    base = thesis.single(pool)
    tot = {"shared": [0.0, 0], "specific": [0.0, 0]}
    strata = {}
    for r in c.itertuples():
        if r.pool != pool or (cats and r.category not in cats):
            continue
        v = getattr(r, f"sum_{a}") - (getattr(r, f"sum_{base}") if b == "single" else 0.0)
        tot[r.cls][0] += v
        tot[r.cls][1] += r.n
        s = strata.setdefault((r.token_id, r.bin), {"shared": [0.0, 0], "specific": [0.0, 0]})
        s[r.cls][0] += v
        s[r.cls][1] += r.n
    raw = tot["shared"][0] / tot["shared"][1] - tot["specific"][0] / tot["specific"][1]
    num = den = 0.0
    for s in strata.values():
        (vs, ns), (vp, np_) = s["shared"], s["specific"]
        if ns and np_:
            w = ns * np_ / (ns + np_)
            num += w * (vs / ns - vp / np_)
            den += w
    return raw, num / den


def test_summary_points_match_loops_over_cells():
    t = _tokens(seed=3)
    c = thesis.cells(t, [0.5, 0.9])
    assert c.n.sum() == (t.advantage != 0).sum()
    S = thesis.summary(c, ["Math", "Template"], n_boot=200, seed=0)
    for r in S.itertuples():
        cats = None if r.category == "all" else [r.category]
        d = c[(c.pool == r.pool) & ((c.category == r.category) if cats else True)]
        if r.statistic == "mask_effect":
            raw = [_brute_contrasts(d, r.pool, w, cats) for w in ("masked_cancellation", "cancellation")]
            want = {"raw": raw[0][0] - raw[1][0], "matched": raw[0][1] - raw[1][1]}[r.estimator]
        else:
            want = dict(zip(("raw", "matched"), _brute_contrasts(d, r.pool, r.statistic, cats)))[r.estimator]
        assert r.contrast == pytest.approx(want, rel=1e-12, abs=1e-12), r
        assert np.isnan(r.lo) or r.lo <= r.hi


def test_two_stage_bootstrap_draws_whole_batches_then_groups():
    batch_of = np.array([0, 0, 0, 1, 1, 2])
    W = thesis.cluster_weights(batch_of, 300, seed=1)
    for row in W:
        per = {b: row[batch_of == b].sum() for b in (0, 1, 2)}
        # each drawn batch contributes as many group draws as it has groups
        assert per[0] % 3 == 0 and per[1] % 2 == 0 and per[2] % 1 == 0
        assert per[0] / 3 + per[1] / 2 + per[2] == 3
    # groups inside a batch vary: not all weights of batch 0 equal in every replicate
    assert any(len(set(row[:3])) > 1 for row in W)


def test_undefined_statistic_gives_no_interval():
    N = np.zeros((4, 1, 2))
    N[0, 0] = [1, 1]          # one cluster holds the only matched stratum
    N[1:, 0, 0] = 1
    V = {"x": N.copy()}
    m, lo, hi = thesis.cluster_bootstrap(N, V, np.arange(4), lambda n, v: thesis.contrast(n, v["x"], "matched"),
                                         n_boot=200)
    assert m == 0.0 and np.isnan(lo) and np.isnan(hi)


def _grads(model, batch, cfg, **kw):
    model.zero_grad(set_to_none=True)
    old = measure.token_stats(model, batch, KNOBS).logp
    with grpo.only_grad_for(model, grpo.scope_params(model, cfg.scope)):
        grpo.accumulate_grad(model, batch, torch.arange(len(batch)), old, grpo.reweight_advantage(batch, cfg.reweight),
                             cfg, **kw)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_positive_only_is_grpo_with_positive_advantages_and_the_mask_drops_the_copies(fresh, batch):
    """App. E.1: the positive-only update == the GRPO update with A·1[r=1] (autograd, float64); the
    copies-masked update == the GRPO loss summed over the unmasked tokens only, same denominator."""
    b = batch.select([0, 1, 2, 3, 8, 9, 10, 11])
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.1, reweight="positive_only")
    pos = _grads(fresh, b, cfg)
    b2 = copy.copy(b)
    b2.advantage = b.advantage * (b.reward > 0.5)
    grpo_pos = _grads(fresh, b2, grpo.UpdateConfig(optimizer="sgd", lr=0.1))
    for x, y in zip(pos, grpo_pos):
        assert torch.allclose(x, y, rtol=0, atol=0)
    w = thesis.copies_mask(b)
    assert (w == 0).any()
    masked = _grads(fresh, b, grpo.UpdateConfig(optimizer="sgd", lr=0.1), token_weight=w)
    # brute force: the token-mean loss with the masked tokens' terms left out, N unchanged
    fresh.zero_grad(set_to_none=True)
    old = measure.token_stats(fresh, b, KNOBS).logp
    with grpo.only_grad_for(fresh, list(fresh.parameters())):
        logp = measure.token_logp(measure.forward_logits(fresh, b), b.input_ids)
        loss = grpo.policy_loss(logp, old, b.advantage[:, None].expand_as(logp), b.response_mask & (w > 0),
                                n_tokens=b.response_mask.sum())
        loss.backward()
        brute = [p.grad.clone() for p in fresh.parameters() if p.grad is not None]
    assert len(brute) == len(masked)
    for x, y in zip(masked, brute):
        assert torch.allclose(x, y, rtol=1e-9, atol=1e-12 * float(y.abs().max() + 1e-300))
