"""cancellation.thesis (the hypothesis rows of notebook 04) against brute force: the shared /
specific classes, the copies mask, the raw and matched contrasts, the two-stage bootstrap's draws,
and the updates themselves (positive-only == GRPO with A·1[r=1]; the masked update == the loss with
those tokens dropped), by autograd on a small model."""
import copy
import dataclasses
import itertools
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
import torch

from cancellation import claims as C
from cancellation import coupling, grpo, measure, thesis, thesis_null
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def _tokens(seed=0, n_batches=3, groups=3, G=4, L=6, vocab=5, K=2):
    """A token table as fig04 builds it: Δ of every update, the masks, first-order terms, and K null shuffles
    (each a within-group permutation of the group's advantages, with its own Δ)."""
    rng = np.random.default_rng(seed)
    rows = []
    perms = {(b, g, s): rng.permutation(G) for b in range(n_batches) for g in range(groups) for s in range(1, K + 1)}
    for b, g, i in itertools.product(range(n_batches), range(groups), range(G)):
        advs = [1.0, -1.0, 0.5, -0.5] if g < groups - 1 else [0.0] * 4   # the last group: all equal rewards
        for t in range(L):
            rows.append(dict(batch=b, group=g, rollout=g * G + i, position=t, token_id=int(rng.integers(vocab)),
                             advantage=advs[i], prob=float(rng.uniform()),
                             category=["Math", "Template"][t % 2], copy_masked=bool(rng.integers(2)),
                             random_masked=float(rng.integers(3)) / 2,
                             **{f"delta_{u}": float(rng.normal()) for u in thesis.UPDATES},
                             **{f: float(rng.normal()) for f in thesis.FIRST_ORDER},
                             **{f"null_adv_{s}": advs[perms[(b, g, s)][i]] for s in range(1, K + 1)},
                             **{f"null_{u}_{s}": float(rng.normal()) for s in range(1, K + 1) for u in thesis.PERMUTED}))
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


def test_context_classes_match_a_loop():
    """In context: shared when the same id after the same k response tokens occurs in an opposite-sign rollout
    of the group (k = 0 is the ids definition)."""
    t = _tokens(seed=5, vocab=3)
    for k in (0, 1, 2):
        d = t.copy()
        got = thesis.classify(d, thesis.context_keys(d, k))
        seqs = {(r.batch, r.rollout): list(g.sort_values("position").token_id) for r, g in
                [(g.iloc[0], g) for _, g in t.groupby(["batch", "rollout"])]}
        key = lambda r: tuple([-1] * max(0, k - r.position) + seqs[(r.batch, r.rollout)][max(0, r.position - k):r.position + 1])  # noqa: E731
        for i, r in t.iterrows():
            if r.advantage == 0:
                assert got[i] == ""
                continue
            other = t[(t.batch == r.batch) & (t.group == r.group) & (np.sign(t.advantage) == -np.sign(r.advantage))]
            assert got[i] == ("shared" if key(r) in {key(o) for _, o in other.iterrows()} else "specific"), (k, i)
    shares = thesis.specific_shares(t, max_k=3)
    assert (shares.groupby("pool").specific_share.apply(lambda x: x.is_monotonic_increasing)).all()


def test_choose_k_is_the_smallest_k_reaching_the_share_in_both_pools():
    sh = pd.DataFrame(dict(defn=["ids"] * 2 + ["context"] * 6, k=[0, 0, 1, 1, 2, 2, 3, 3],
                           pool=["pos", "neg"] * 4, specific_share=[0.05, 0.06, 0.1, 0.3, 0.25, 0.19, 0.4, 0.5]))
    assert thesis.choose_k(sh) == 3 and thesis.choose_k(sh, 0.1) == 1 and thesis.choose_k(sh, 0.9) == 3


def test_random_mask_is_disjoint_from_the_copies_and_matches_their_count_where_it_can(batch):
    """Per group and confidence bin, by a loop over positions: the random mask zeroes only A < 0 response tokens that
    are not copies, as many as the copies there, or every non-copy there when they are fewer."""
    copies = thesis.copies_mask(batch)
    prob = torch.rand(batch.input_ids.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    bins = [0.3, 0.7]
    draws = [thesis.random_mask(batch, copies, prob, bins, seed=s) for s in (0, 1)]
    m = batch.response_mask
    b = np.digitize(prob.numpy(), bins)
    short = 0
    for w in draws:
        assert ((w == 0) <= (m & (batch.advantage < 0)[:, None])).all()   # only A < 0 response tokens are masked
        assert not ((w == 0) & (copies == 0)).any()                        # never a copy
        for g in batch.group.unique().tolist():
            for k in range(len(bins) + 1):
                cell = [(i, j) for i in range(len(batch)) for j in range(m.shape[1])
                        if m[i, j] and batch.group[i] == g and batch.advantage[i] < 0 and b[i, j] == k]
                n_copy = sum(float(copies[i, j]) == 0 for i, j in cell)
                n_free = len(cell) - n_copy
                assert sum(float(w[i, j]) == 0 for i, j in cell) == min(n_copy, n_free)
                short += n_free < n_copy
    assert (draws[0] == 0).any() and not torch.equal(draws[0], draws[1])
    assert short   # this batch has cells where the non-copies are fewer than the copies (the tiny task's case)


def test_permuted_shuffles_rewards_with_their_advantages_within_groups(batch):
    p = thesis.permuted(batch, seed=3)
    assert not torch.equal(p.advantage, batch.advantage)
    for g in batch.group.unique():
        r = batch.group == g
        a = sorted(zip(batch.reward[r].tolist(), batch.advantage[r].tolist()))
        assert sorted(zip(p.reward[r].tolist(), p.advantage[r].tolist())) == a
    assert torch.equal(p.input_ids, batch.input_ids)


def test_first_order_terms_split_the_first_order_delta(model64, batch):
    """The four sources sum to coupling.first_order_delta (Eq. 9), and each equals a loop over the dense
    kernel with its own condition on (j, k)."""
    f = coupling.features(model64, batch, compute=KNOBS)
    grp = batch.group[f.rows]
    terms = thesis.first_order_terms(f, grp, lr=0.1, chunk=37)
    total = coupling.first_order_delta(f, 0.1)
    assert torch.allclose(sum(terms.values()), total, rtol=1e-10, atol=1e-14)
    K = coupling.kernel(f)
    A, o, n = f.A, f.o, len(f)
    for j in range(0, n, max(1, n // 12)):
        acc = dict.fromkeys(thesis.FIRST_ORDER, 0.0)
        for k in range(n):
            v = 0.1 / n * float(A[k] * K[j, k])
            if float(A[j] * A[k]) < 0 and o[j] == o[k]:
                acc["fo_same_id_group" if grp[j] == grp[k] else "fo_same_id_other"] += v
            elif float(A[j] * A[k]) < 0:
                acc["fo_other_id"] += v
            else:
                acc["fo_same_sign"] += v
        for name, v in acc.items():
            assert float(terms[name][j]) == pytest.approx(v, rel=1e-9, abs=1e-15), (j, name)


# ----------------------------------------------------------------------------- summary against loops
_RECORDS: list = [None, None]   # the last cells table _loop_stat read and its rows as dicts


def _records(c) -> list:
    """`c.to_dict("records")`, converted once per table: the callers loop over one cells table (75k rows on
    the tiny profile, ~0.5 s a conversion) for dozens of statistics. The table is kept alive beside its rows,
    so an identity check cannot match a new table at a reused address."""
    if _RECORDS[0] is not c:
        _RECORDS[:] = [c, c.to_dict("records")]
    return _RECORDS[1]


def _loop_stat(c, pool, defn, stat, cat="all", states="all"):
    """One statistic of thesis.summary by loops over the cells (the formulas of thesis.py's docstring); `states`:
    the shared class whole ('all'), or only its tokens at another state than any copy's ('other') / at a copy's
    own state ('same'), the specific class unchanged."""
    single = "sum_positive_only" if pool == "pos" else "sum_negative_only"
    rows = [r for r in _records(c) if r["pool"] == pool and r["defn"] == defn
            and (cat == "all" or r["category"] == cat)
            and (states == "all" or r["cls"] != "shared" or r["state"] == states)]
    val = {"cancellation": lambda r: r["sum_grpo"] - r[single], "single": lambda r: r[single],
           "grpo": lambda r: r["sum_grpo"], "copies_vs_random": lambda r: r["sum_grpo_masked"] - r["sum_grpo_random"],
           "fo_same_id": lambda r: r["sum_fo_same_id_group"] + r["sum_fo_same_id_other"],
           "fo_other_id": lambda r: r["sum_fo_other_id"]}

    def tot(cls, what, key="cls"):
        return (sum(val[what](r) for r in rows if r[key] == cls), sum(r["n"] for r in rows if r[key] == cls))

    def matched(rs, what, key, a, b, strata):
        acc = defaultdict(lambda: {a: [0.0, 0], b: [0.0, 0]})
        for r in rs:
            x = acc[tuple(r[s] for s in strata)][r[key]]
            x[0] += val[what](r)
            x[1] += r["n"]
        num = den = 0.0
        for s in acc.values():
            (va, na), (vb, nb) = s[a], s[b]
            if na and nb:
                w = na * nb / (na + nb)
                num, den = num + w * (va / na - vb / nb), den + w
        return num / den if den else float("nan")   # no stratum holds both classes: undefined
    if stat in ("shared_cancellation", "specific_cancellation"):
        v, n = tot(stat.split("_")[0], "cancellation")
        return v / n
    if stat == "shared_retained":
        return tot("shared", "grpo")[0] / tot("shared", "single")[0]
    if stat == "specific_amplification":
        return tot("specific", "grpo")[0] / tot("specific", "single")[0]
    if stat == "contrast":
        return matched(rows, "cancellation", "cls", "shared", "specific", ("token_id", "bin"))
    if stat == "copies_vs_random":
        v, n = tot("shared", "copies_vs_random")
        return v / n
    if stat == "fo_same_id_share":
        a, b = abs(tot("shared", "fo_same_id")[0]), abs(tot("shared", "fo_other_id")[0])
        return a / (a + b)
    if stat == "frequency":
        cnt = defaultdict(int)
        for r in _records(c):
            if r["defn"] == defn:
                cnt[(r["batch"], r["token_id"])] += r["n"]
        med = {}
        for bt in {b for b, _ in cnt}:
            toks = sorted(x for (b, i), v in cnt.items() if b == bt for x in [v] * v)
            med[bt] = toks[(len(toks) - 1) // 2]
        sh = [dict(r, freq="high" if cnt[(r["batch"], r["token_id"])] >= med[r["batch"]] else "low")
              for r in rows if r["cls"] == "shared"]
        return matched(sh, "cancellation", "freq", "high", "low", ("bin",))
    raise KeyError(stat)


LOOPED = ("shared_cancellation", "specific_cancellation", "shared_retained", "specific_amplification", "contrast",
          "copies_vs_random", "fo_same_id_share", "frequency")


def test_summary_points_match_loops_over_cells():
    t = _tokens(seed=3, vocab=4, L=5)   # few ids: shared prefixes (the state definition) occur
    c = thesis.cells(t, [0.5, 0.9], k=1)
    assert c.groupby("defn").n.sum().eq((t.advantage != 0).sum()).all()
    S = thesis.summary(c, ["Math", "Template"], n_boot=200, seed=0)
    seen = set()
    for r in S[S.statistic.isin(LOOPED)].itertuples():
        want = _loop_stat(c, r.pool, r.defn, r.statistic, r.category, r.states)
        assert r.value == pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True), r
        seen.add(r.statistic)
        assert np.isnan(r.lo) or r.lo <= r.hi
    assert seen == set(LOOPED)
    assert set(S.defn) == set(thesis.DEFNS) and set(S.states) == set(thesis.STATES)


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
    W = thesis.cluster_weights(np.arange(4), 200, seed=0)
    m, lo, hi = thesis.cluster_bootstrap({"N": N, "x": N.copy()}, lambda a: thesis.contrast(a["N"], a["x"]), W)
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


def test_can_pass_refuses_a_thesis_row_below_five_batches_and_all_of_reads_its_parts():
    est = "class mean, percentile cluster bootstrap (batches, then groups in a batch)"
    assert not C.can_pass("direction", dict(sign=1), 4, est)[0] and C.can_pass("direction", dict(sign=1), 5, est)[0]
    yes = ["a", "direction", 1.0, 0.5, 1.5, dict(sign=1)]
    no = ["b", "direction", -1.0, -1.5, -0.5, dict(sign=1)]
    maybe = ["c", "similar", 1.0, 0.5, 1.5, dict(target=1.0, tol=0.25)]
    assert C.all_of(0, 0, 0, parts=[yes, yes]) == C.REPRODUCED
    assert C.all_of(0, 0, 0, parts=[yes, no]) == C.NOT_REPRODUCED
    assert C.all_of(0, 0, 0, parts=[yes, maybe]) == C.INCONCLUSIVE
    assert not C.can_pass("all_of", dict(parts=[yes, yes]), 4, est)[0]


def test_first_order_terms_on_a_subset_are_the_full_terms_at_those_tokens(model64, batch):
    f = coupling.features(model64, batch, compute=KNOBS)
    grp = batch.group[f.rows]
    full = thesis.first_order_terms(f, grp, lr=0.1, chunk=50)
    J = torch.tensor([3, 0, 17, len(f) - 1])
    part = thesis.first_order_terms(f, grp, lr=0.1, chunk=2, J=J)
    for k in thesis.FIRST_ORDER:
        assert torch.allclose(part[k], full[k][J], rtol=1e-10, atol=1e-15), k


def test_first_order_means_count_only_the_tokens_with_terms():
    """With `fo_tokens` capping the tokens whose terms are computed, the mechanism rows average over those
    tokens (n_fo), not over every token of the class (a loop over the cells)."""
    t = _tokens(seed=3)
    t.loc[t.index % 3 == 0, list(thesis.FIRST_ORDER)] = np.nan
    c = thesis.cells(t, [0.5, 0.9], k=1)
    ids = c[(c.defn == "ids") & (c.pool == "pos") & (c.cls == "shared")]
    assert ids.n_fo.sum() < ids.n.sum()
    want = (ids.sum_fo_same_id_group + ids.sum_fo_same_id_other + ids.sum_fo_other_id).sum() / ids.n_fo.sum()
    S = thesis.summary(c, n_boot=200, seed=0)
    got = S[(S.defn == "ids") & (S.pool == "pos") & (S.statistic == "fo_opposite")].value.iloc[0]
    assert got == pytest.approx(want, rel=1e-12)


def test_null_deltas_are_the_exact_steps_of_each_shuffle(model64, batch):
    """The null's shortcut (per-rollout gradients at θ₀, one matrix product and one forward per shuffle) gives the
    Δlog p of the exact SGD step (grpo.Trials: a backward and a step per update) on the real signs and on within-
    group shuffles, for GRPO and both single-sign updates, to float64 round-off; θ₀ untouched."""
    knobs = Compute()
    lr = 0.1
    before = {k: v.clone() for k, v in model64.state_dict().items()}
    orders = torch.cat([torch.arange(len(batch))[None], thesis.shuffles(batch, 2, seed=3)])
    assert not torch.equal(orders[1], orders[0])   # a shuffle moved something (mixed groups)
    for o in orders[1:]:   # within groups: the same multiset of advantages per group
        for g in batch.group.unique():
            rows = (batch.group == g).nonzero().squeeze(1)
            assert sorted(batch.advantage[o[rows]].tolist()) == sorted(batch.advantage[rows].tolist())
    G = thesis.rollout_gradients(model64, batch, knobs)
    trials = grpo.Trials(model64, batch, knobs)
    m = batch.response_mask
    worst = 0.0
    for u in ("grpo", "positive_only", "negative_only"):
        got = thesis.null_deltas(model64, batch, knobs, lr, thesis.shuffle_weights(batch, orders, u), G=G)
        cfg = knobs.update(optimizer="sgd", lr=lr, scope="full", reweight=u)
        for k, o in enumerate(orders):
            shuffled = dataclasses.replace(batch, reward=batch.reward[o], advantage=batch.advantage[o])
            want = trials.delta(cfg, shuffled)
            assert want[m].abs().max() > 1e-3   # the step moved log-probs
            worst = max(worst, float((got[k][m] - want[m]).abs().max()))
    assert worst < 1e-10, worst
    assert trials.restore_error() == 0.0
    assert all(torch.equal(v, before[k]) for k, v in model64.state_dict().items())


def test_same_state_classes_match_a_loop():
    """Same state: shared when an opposite-sign rollout of the group has the same response up to and including
    the token (the whole prefix: the group shares the prompt); a subset of the ids definition's shared class."""
    t = _tokens(seed=7, vocab=2, L=5)   # two ids: long common prefixes occur
    got = thesis.classify(t, thesis.state_keys(t))
    ids = thesis.classify(t)
    seqs = {(b, r): list(g.sort_values("position").token_id) for (b, r), g in t.groupby(["batch", "rollout"])}
    prefix = lambda r: tuple(seqs[(r.batch, r.rollout)][:r.position + 1])  # noqa: E731
    n_shared = 0
    for i, r in t.iterrows():
        if r.advantage == 0:
            assert got[i] == ""
            continue
        other = t[(t.batch == r.batch) & (t.group == r.group) & (np.sign(t.advantage) == -np.sign(r.advantage))]
        want = "shared" if prefix(r) in {prefix(o) for _, o in other.iterrows()} else "specific"
        assert got[i] == want, i
        n_shared += want == "shared"
        assert want == "specific" or ids[i] == "shared"
    assert 0 < n_shared < (t.advantage != 0).sum()


# ----------------------------------------------------------------------------- the sign-shuffle null
def test_null_batch_is_the_exact_step_of_each_shuffle_on_the_mixed_rows(model64, batch):
    """thesis.null_batch against grpo.Trials (a backward and a step per update) on the whole batch: each shuffle's
    positive-only, negative-only and GRPO Δ on the rows of mixed groups (NaN on the others), to float64 round-off;
    the real signs' GRPO through the same path; the exact-steps path (G_limit 0) gives the same numbers."""
    knobs, lr, K, seed = Compute(), 0.1, 3, 11
    rows = thesis.mixed_rows(batch)
    assert 0 < len(rows) < len(batch)   # the fixture has a group without both rewards: the sub-batch is a real subset
    got = thesis.null_batch(model64, batch, knobs, lr, K, seed)
    steps = thesis.null_batch(model64, batch, knobs, lr, K, seed, G_limit=0)
    assert got["path"] == "gradients" and steps["path"] == "steps"
    orders = thesis.shuffles(batch, K, seed)
    trials = grpo.Trials(model64, batch, knobs)
    m = batch.response_mask
    tok_row = m.nonzero(as_tuple=True)[0]
    on = torch.isin(tok_row, rows).numpy()
    for u in thesis.PERMUTED:
        cfg = knobs.update(optimizer="sgd", lr=lr, scope="full", reweight=u)
        for s, o in enumerate(orders):
            shuffled = dataclasses.replace(batch, reward=batch.reward[o], advantage=batch.advantage[o])
            want = trials.delta(cfg, shuffled)[m].numpy()
            assert np.abs(got[u][s][on] - want[on]).max() < 1e-10, (u, s)
            assert np.isnan(got[u][s][~on]).all()
            assert np.abs(steps[u][s][on] - want[on]).max() < 1e-10, (u, s)
            assert np.array_equal(got["adv"][s], batch.advantage[o][tok_row].numpy())
    real = trials.delta(knobs.update(optimizer="sgd", lr=lr, scope="full", reweight="grpo"))[m].numpy()
    assert np.abs(got["real_grpo"][on] - real[on]).max() < 1e-10


def _as_real(t, s):
    """The token table with shuffle s's signs and Δ in the real columns (what the real path reads)."""
    u = t.copy()
    u["advantage"] = t[f"null_adv_{s}"]
    for name in thesis.PERMUTED:
        u[f"delta_{name}"] = t[f"null_{name}_{s}"]
    return u


def test_null_values_are_the_real_statistics_of_each_shuffle_by_loops():
    """Shuffle s of the null equals the real path's statistic (thesis.cells, then _loop_stat's loops over the cells)
    on the table whose signs and Δ are shuffle s's, for every definition (ids, context k = 1..4, state), view of the
    shared class and pool; shuffle 0 is the real signs."""
    t = _tokens(seed=4, vocab=3, L=5, K=2)
    nc = thesis_null.null_cells(t, 2, [0.5])
    V = thesis_null.null_values(nc)
    checked = 0
    for s in (0, 1, 2):
        u = t if s == 0 else _as_real(t, s)
        for defn, k in thesis_null.NULL_DEFNS:
            c = thesis.cells(u, [0.5], max(k, 1))
            cdefn = defn if defn != "context" else "context"
            for r in V[(V.shuffle == s) & (V.defn == defn) & (V.k == k)].itertuples():
                want = _loop_stat(c, r.pool, cdefn, r.statistic, "all", r.states)
                assert r.value == pytest.approx(want, rel=1e-10, abs=1e-12, nan_ok=True), (s, defn, k, r)
                checked += 1
    assert checked > 100 and set(V.states) == set(thesis.STATES)


def test_null_bands_p_values_by_a_loop():
    rng = np.random.default_rng(0)
    rows = []
    for s in range(40):
        for pool in ("pos", "neg"):
            rows.append(dict(defn="ids", k=0, states="all", pool=pool, statistic="contrast", shuffle=s,
                             value=float(rng.normal()) if s else (-3.0 if pool == "pos" else -0.2)))
    B = thesis_null.null_bands(pd.DataFrame(rows)).set_index("pool")
    for pool, side in (("pos", -1), ("neg", 1)):
        real = B.loc[pool, "real"]
        null = [r["value"] for r in rows if r["pool"] == pool and r["shuffle"] > 0]
        assert B.loc[pool, "p_paper"] == (1 + sum(side * (x - real) >= 0 for x in null)) / 40
        assert B.loc[pool, "p_other"] == (1 + sum(side * (x - real) <= 0 for x in null)) / 40
        assert B.loc[pool, "null_lo"] == pytest.approx(np.quantile(null, 0.025)) and B.loc[pool, "K"] == 39
    assert B.loc["pos", "p_paper"] == 1 / 40   # beyond every shuffle on the paper's side: the smallest p


def test_the_decision_rule_reads_its_parts_as_fixed_before_the_run():
    below = ["c", "direction", -1.0, -2.0, -0.5, dict(sign=-1, ref=0.0)]
    above = ["c", "direction", 1.0, 0.5, 2.0, dict(sign=-1, ref=0.0)]
    kept = ["r", "direction", 0.5, 0.2, 0.8, dict(sign=-1, ref=1.0)]
    more = ["r", "direction", 1.5, 1.2, 1.8, dict(sign=-1, ref=1.0)]
    yes = ["n", "null_test", -1.0, np.nan, np.nan, dict(sign=-1, p_paper=1 / 40, p_other=1.0, K=39)]
    no = ["n", "null_test", -1.0, np.nan, np.nan, dict(sign=-1, p_paper=0.3, p_other=0.7, K=39)]
    degenerate = ["n", "null_test", -1.0, np.nan, np.nan, dict(sign=-1, p_paper=1 / 40, p_other=1.0, K=39,
                                                               specific_share=0.06)]
    v = lambda c, s: C.thesis_verdict(np.nan, np.nan, np.nan, cancellation=c, credit=s)  # noqa: E731
    assert v([below, kept], [yes] * 4) == C.REPRODUCED
    assert v([below, kept], [yes, yes, yes, no]) == C.INCONCLUSIVE
    assert v([below, kept], [no] * 4) == C.NOT_REPRODUCED
    assert v([above, more], [yes] * 4) == C.NOT_REPRODUCED
    assert v([below, more], [yes] * 4) == C.INCONCLUSIVE
    assert v([below, kept], [yes, yes, yes, degenerate]) == C.NOT_DECIDABLE
    assert C.deciding_part(dict(cancellation=[above, more], credit=[yes] * 4)) == "cancellation"
    assert C.null_test(-1.0, np.nan, np.nan, sign=-1, p_paper=2 / 40, p_other=0.9, K=39) == C.NOT_REPRODUCED
    assert C.can_pass("null_test", dict(sign=-1, p_paper=0.5, p_other=0.5, K=19), 40, "permutation")[0] is False
    assert C.majority(0.509, 0.505, 0.513) == C.ABOUT_HALF and C.majority(0.7, 0.6, 0.8) == C.REPRODUCED
    assert C.majority(0.4, 0.3, 0.45) == C.NOT_REPRODUCED and C.majority(0.6, 0.4, 0.8) == C.INCONCLUSIVE
    assert C.null_control(-1.0, -2.0, -0.5, sign=-1) == C.NULL_PASSES
    assert C.null_control(-1.0, -2.0, 0.5, sign=-1) == C.NULL_DIFFERS
    assert C.judge("direction", -1.0, -2.0, -0.5, dict(sign=-1, size_share=0.12)) == C.NOT_DECIDABLE
