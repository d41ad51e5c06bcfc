"""Sampling budget: sub-batches and their advantages against a hand loop, the pool's Δlog p
against a hand-written SGD step, and the gap's bootstrap and noise budget against simulation."""
import copy
import statistics

import numpy as np
import pytest
import torch

from cancellation import budget, grpo, measure
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def verl_advantages(rewards):
    """verl compute_grpo_outcome_advantage for one group, written out (a single rollout: A = r)."""
    if len(rewards) == 1:
        return [rewards[0] / (1 + 1e-6)]
    m, s = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - m) / (s + 1e-6) for r in rewards]


def test_composition_groups(batch):
    # rewards per group: [1,0,0,1], [1,1,1,1], [0,1,0,0]
    assert budget.composition_groups(batch, 3) == [0]
    assert budget.composition_groups(batch, 2) == [0, 2]


def hand_sgd_delta(model, batch, rows, pool, lr):
    """Δlog p of the pool tokens after a hand-written SGD step on the unpadded sub-batch rollouts:
    at ρ = 1 the clipped token-mean loss has the gradient of −(1/N) Σ_i A_i Σ_t log p_it."""
    m = copy.deepcopy(model)

    def seq_logp(i):  # log p of every token of row i, from an unpadded forward, keyed by column
        keep = batch.attention_mask[i].bool()
        cols = keep.nonzero().squeeze(1)
        ids = batch.input_ids[i, keep][None]
        lp = torch.log_softmax(m(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        return dict(zip(cols[1:].tolist(), lp))

    rewards = batch.reward[rows]
    adv = {}
    for g in batch.group[rows].unique().tolist():
        sel = [int(r) for r in rows if int(batch.group[r]) == g]
        adv.update(zip(sel, verl_advantages(batch.reward[sel].tolist())))
    n_tok = int(batch.response_mask[rows].sum())
    first = batch.response_mask.float().argmax(1)
    with torch.no_grad():
        before = [float(seq_logp(int(r))[int(first[r] + p)]) for r, p in zip(pool.rollout, pool.position)]
    loss = 0.0
    for r in rows.tolist():
        lp = seq_logp(r)
        resp = batch.response_mask[r].nonzero().squeeze(1).tolist()
        loss = loss - adv[r] * sum(lp[c] for c in resp) / n_tok
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            p -= lr * p.grad
        after = [float(seq_logp(int(r))[int(first[r] + p)]) for r, p in zip(pool.rollout, pool.position)]
    assert rewards.numel() == len(rows)
    return np.array(after) - np.array(before)


def test_pool_delta_matches_hand_sgd_step(fresh, batch, tok):
    before = measure.token_stats(fresh, batch, KNOBS)
    table = measure.token_table(batch, before)
    pool = table.sample(n=40, random_state=0).sort_values(["rollout", "position"]).reset_index(drop=True)
    state = copy.deepcopy(fresh.state_dict())
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=1.0, scope="full")
    pb = budget.pool_logp(fresh, batch, pool, KNOBS)
    assert np.allclose(pb, pool.logp_before, atol=1e-12, rtol=0)
    rows = budget.nested_rows(budget.nested_order(batch, seed=0), 2, 3)
    d = budget.pool_delta(fresh, batch, rows, pool, cfg, before.logp, pb)
    ref = hand_sgd_delta(fresh, batch, rows, pool, lr=1.0)
    assert np.abs(ref).max() > 1e-6  # the step moves the pool
    assert np.allclose(d, ref, rtol=1e-7, atol=1e-12)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in state.items())  # θ restored exactly


# --------------------------------------------------------------------------- the fair test (nested sub-batches)
def test_budget_plan_is_nested_and_valued_rows_are_in_every_update(batch):
    plan = budget.budget_plan(batch, [1, 2, 3], 3, [1, 2, 4], 2, 2, seeds=[0, 1, 2])
    for s in (0, 1, 2):
        for panel in ("prompts", "rollouts"):
            es = [e for e in plan if e["seed"] == s and e["panel"] == panel]
            assert len({tuple(e["valued"].tolist()) for e in es}) == 1  # one valued set per seed and panel
            for a, b in zip(es, es[1:]):
                assert set(a["rows"].tolist()) < set(b["rows"].tolist())  # nested, strictly growing
            for e in es:
                assert set(e["valued"].tolist()) <= set(e["rows"].tolist())
                groups = batch.group[e["rows"]]
                n = e["x"] if panel == "rollouts" else 3
                P = e["x"] if panel == "prompts" else 2
                assert len(groups.unique()) == P and all(int((groups == g).sum()) == n for g in groups.unique())
        va = [e for e in plan if e["seed"] == s and e["panel"] == "prompts"][0]["valued"]
        assert len(va) == 2 and len(batch.group[va].unique()) == 1  # 2 rollouts of the 1 core prompt
    # the seed's draws differ
    assert any(not torch.equal(a["rows"], b["rows"]) for a, b in zip(plan[:7], plan[7:14]))


def test_composition_plan_nested(batch):
    # rewards per group: [1,0,0,1], [1,1,1,1], [0,1,0,0]; G = 3 draws from group 0 (2 positive, 2 negative)
    groups, rows = budget.composition_rows_capped(batch, 3, 5, seed=0)
    assert groups == [0] and sorted(batch.reward[rows].tolist()) == [0, 0, 1, 1]
    plan = budget.composition_plan(batch, [0], 3, seeds=[0, 1])
    for s in (0, 1):
        es = [e for e in plan if e["seed"] == s]
        assert [e["x"] for e in es] == [1, 2]
        for e in es:
            assert int(batch.reward[e["rows"]].sum()) == e["x"] and len(e["rows"]) == 3
            assert set(e["valued"].tolist()) <= set(e["rows"].tolist())
            assert sorted(batch.reward[e["valued"]].tolist()) == [0.0, 1.0]


@pytest.mark.parametrize("score_dtype, tol", [(torch.float64, 1e-10), (torch.float32, 1e-7)])
def test_steps_from_scores_equal_real_grpo_steps(fresh, batch, score_dtype, tol):
    """Every setting's step taken as θ + Σ c_i h_i equals a real grpo_step on the sub-batch (budget.pool_delta,
    grpo.trial) and a hand-written SGD step on unpadded rows; θ is restored after the sweep."""
    before = measure.token_stats(fresh, batch, KNOBS)
    table = measure.token_table(batch, before)
    state = copy.deepcopy(fresh.state_dict())
    plan = budget.budget_plan(batch, [1, 3], 2, [1, 4], 3, 1, seeds=[0])
    vrows = np.unique(np.concatenate([e["valued"].numpy() for e in plan]))
    toks = budget.valued_tokens(table, vrows, 3, 1.0, seed=0)
    assert set(toks.rollout) == set(vrows.tolist()) and (toks.groupby("rollout").size() <= 3).all()
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=1.0, scope="full")
    hrows = np.arange(len(batch))
    H = budget.rollout_scores(fresh, batch, hrows, before.logp, cfg, dtype=score_dtype)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in state.items())
    sw = budget.sweep_deltas(fresh, batch, plan, toks, cfg, before.logp, H, hrows, block=5)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in state.items())  # θ restored exactly
    real_sw = budget.sweep_deltas(fresh, batch, plan, toks, cfg, before.logp)  # real grpo steps (pool_delta)
    assert (real_sw[["panel", "x", "seed", "tok"]].to_numpy() == sw[["panel", "x", "seed", "tok"]].to_numpy()).all()
    assert np.allclose(real_sw.delta, sw.delta, rtol=tol, atol=tol * np.abs(real_sw.delta).max())
    assert len(sw) == sum(int(np.isin(toks.rollout, e["valued"].numpy()).sum()) for e in plan)
    for e in plan:
        d = sw[(sw.panel == e["panel"]) & (sw.x == e["x"])].sort_values("tok")
        sel = toks.iloc[d.tok.to_numpy()]
        real = budget.pool_delta(fresh, batch, e["rows"], sel, cfg, before.logp,
                                 budget.pool_logp(fresh, batch, sel, KNOBS))
        assert np.abs(real).max() > 1e-6
        assert np.allclose(d.delta.to_numpy(), real, rtol=tol, atol=tol * np.abs(real).max())
        if e["panel"] == "rollouts" and e["x"] == 4:
            hand = hand_sgd_delta(fresh, batch, e["rows"], sel, lr=1.0)
            assert np.allclose(d.delta.to_numpy(), hand, rtol=max(tol, 1e-7), atol=1e-12 + tol * np.abs(hand).max())


def test_pooled_gap_bootstrap_matches_a_loop():
    rng = np.random.default_rng(0)
    n = 300
    seed_idx = rng.integers(0, 6, n)
    v = rng.normal(size=n)
    st = rng.choice(["boosted", "suppressed", "stable"], n, p=[0.45, 0.45, 0.1])
    counts = budget.seed_resamples(6, n_boot=50, seed=3)
    g, reps = budget.gap_replicates(v, st, seed_idx, counts)
    assert np.isclose(g, v[st == "boosted"].mean() - v[st == "suppressed"].mean())
    for b in range(50):  # brute force: concatenate each resampled seed's instances, count times
        vv = np.concatenate([np.repeat(v[seed_idx == s][None], int(c), 0).ravel() for s, c in enumerate(counts[b])])
        ss = np.concatenate([np.repeat(st[seed_idx == s][None], int(c), 0).ravel() for s, c in enumerate(counts[b])])
        assert np.isclose(reps[b], vv[ss == "boosted"].mean() - vv[ss == "suppressed"].mean())
    assert (counts.sum(1) == 6).all()
    # pooled weights reproduce the gap, a token counted once per instance
    tok = rng.integers(0, 40, n)
    vt = rng.normal(size=40)
    w = budget.gap_weights_pooled(tok, st, 40)
    assert np.isclose(w @ vt, budget.pooled_gap(vt[tok], st))


def test_trend_noise_mc_term_matches_simulation():
    rng = np.random.default_rng(1)
    N, n = 50, 400
    tok_a, tok_b = rng.integers(0, N, n), rng.integers(0, N, n)
    st_a = rng.choice(["boosted", "suppressed"], n)
    st_b = rng.choice(["boosted", "suppressed"], n)
    v, se = rng.normal(size=N), rng.uniform(0.05, 0.2, N)
    wa, wb = budget.gap_weights_pooled(tok_a, st_a, N), budget.gap_weights_pooled(tok_b, st_b, N)
    sims = []
    for _ in range(4000):  # re-draw the Monte Carlo noise of every value, recompute d from the instances
        vv = v + rng.normal(size=N) * se
        sims.append(budget.pooled_gap(vv[tok_b], st_b) - budget.pooled_gap(vv[tok_a], st_a))
    nb = budget.trend_noise(0.1, np.array(sims), wa, wb, se)
    assert np.isclose(nb["var_mc"], np.var(sims), rtol=0.1)
    assert nb["var_seed"] < 0.1 * nb["var_mc"]  # all the replicates' variance here is Monte Carlo noise


def test_seeds_needed_scales_the_whole_variance():
    nb = dict(d=0.1, var_seed=0.002, var_mc=0.0005, var_pool=0.0)
    S2 = budget.seeds_needed(nb, S=10)
    # with S2 seeds the variance (0.0025 at 10 seeds, all as 1/S) is at most (d/2)^2
    assert 0.0025 * 10 / S2 <= (0.1 / 2) ** 2 + 1e-15 and 0.0025 * 10 / (S2 - 1) > (0.1 / 2) ** 2
    assert budget.seeds_needed(dict(nb, d=0.0), S=10) == np.inf
def test_needed_scales_each_component():
    nb = dict(d=4.0, var_seed=1.0, var_mc=1.0, var_pool=1.0)  # SE² = 3 < (d/2)² = 4: resolved already
    out = budget.needed(nb, S=4, M=16, N=100)
    assert out["factor_all"] == pytest.approx(0.75) and out["se"] == pytest.approx(np.sqrt(3))
    nb = dict(d=2.0, var_seed=0.5, var_mc=0.25, var_pool=0.5)  # cap (d/2)² = 1
    out = budget.needed(nb, S=4, M=16, N=100)
    assert out["seeds"] == 8                    # 0.5·4/S' + 0.75 = 1
    assert out["M"] == np.inf                   # seeds + pool alone already reach the cap
    assert out["pool"] == 150                   # the pool term carries the MC term along: 0.75·100/N' + 0.5 = 1
    assert out["factor_all"] == pytest.approx(1.25)




def _composition_sweep(rng, n_tok=60, n_seeds=5, ks=(1, 2, 3, 4)):
    """A synthetic Fig. 7(b) sweep: every (k, seed) setting holds a random half of the tokens."""
    rows = []
    for k in ks:
        for s in range(n_seeds):
            tok = np.sort(rng.choice(n_tok, n_tok // 2, replace=False))
            st = rng.choice(["boosted", "suppressed", "stable"], len(tok), p=[0.45, 0.45, 0.1])
            rows += [dict(panel="composition", x=k, seed=100 + s, tok=int(t), status=str(x), n_rollouts=8, n_mixed=2)
                     for t, x in zip(tok, st)]
    import pandas as pd
    return pd.DataFrame(rows), pd.DataFrame({"delta_hat": rng.normal(size=n_tok)})


def test_group_resampled_composition_trend_matches_a_loop():
    """Each replicate rebuilt instance by instance: the drawn seeds' and groups' instances copied
    c_seed · c_group times; d = mean gap of the middle k − mean gap of the end k."""
    rng = np.random.default_rng(1)
    sw, tokens = _composition_sweep(rng)
    group = rng.integers(0, 4, len(tokens)) + 10
    subsets = {"all": np.ones(len(tokens), bool)}
    out = budget.composition_trend_groups(sw, tokens, group, subsets, n_boot=40, seed=7).iloc[0]
    seeds, groups = np.sort(sw.seed.unique()), np.unique(group)
    r = np.random.default_rng(7)
    cs = [np.bincount(i, minlength=5) for i in r.integers(0, 5, (40, 5))]
    cg = [np.bincount(i, minlength=4) for i in r.integers(0, 4, (40, 4))]
    v = tokens.delta_hat.to_numpy()

    def gap(d, wseed=None, wgroup=None):
        vals, st = [], []
        for t, s, x in zip(d.tok, d.seed, d.status):
            times = 1 if wseed is None else wseed[np.searchsorted(seeds, s)] * wgroup[np.searchsorted(groups, group[t])]
            vals += [v[t]] * int(times)
            st += [x] * int(times)
        vals, st = np.array(vals), np.array(st)
        return vals[st == "boosted"].mean() - vals[st == "suppressed"].mean()

    def trend(ws=None, wg=None):
        g = [gap(sw[sw.x == k], ws, wg) for k in (1, 2, 3, 4)]
        return np.mean(g[1:3]) - np.mean([g[0], g[3]])

    assert out.d == pytest.approx(trend(), rel=1e-12)
    reps = [trend(cs[b], cg[b]) for b in range(40)]
    assert (out.d_lo, out.d_hi) == pytest.approx(tuple(np.quantile(reps, [0.025, 0.975])), rel=1e-10)
    assert out.n_groups == 4 and out.n_seeds == 5


def test_group_resampled_trend_with_one_group_is_the_seed_only_trend():
    """With a single query group every group count is 1, so the interval is trend_table's seed-only one."""
    rng = np.random.default_rng(2)
    sw, tokens = _composition_sweep(rng)
    tokens["delta_se"] = 0.1
    subsets = {"all": np.ones(len(tokens), bool)}
    gaps, reps = budget.gap_table(sw, tokens.assign(reward=1.0), subsets, n_boot=200, seed=3)
    t = budget.trend_table(sw, tokens, gaps, reps, subsets, M=8)
    t = t[(t.panel == "composition") & (t.subset == "all")].iloc[0]
    g = budget.composition_trend_groups(sw, tokens, np.zeros(len(tokens), int), subsets, n_boot=200, seed=3).iloc[0]
    assert g.d == pytest.approx(t.d, rel=1e-12)
    assert (g.d_lo, g.d_hi) == pytest.approx((t.d_lo, t.d_hi), rel=1e-12)
