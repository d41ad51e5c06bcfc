"""Mini-batch plans and the reward-balanced buffer, checked against their defining properties."""
import itertools

import pytest
import torch

from cancellation import batching, grpo, rollout, train


def _case(seed, n_groups=6, G=4, p=0.5):
    """Group ids and binary rewards -> verl group advantages (some groups all-equal)."""
    g = torch.Generator().manual_seed(seed)
    group = torch.arange(n_groups).repeat_interleave(G)
    reward = (torch.rand(n_groups * G, generator=g) < p).double()
    return group, reward, rollout.group_advantages(reward, group)


CASES = [_case(s, n, G, p) for s, (n, G, p) in enumerate(itertools.product((1, 3, 8), (1, 4, 8), (0.1, 0.5, 0.9)))]


def _is_partition(plan, n):
    rows = torch.cat(plan) if plan else torch.zeros(0, dtype=torch.long)
    return sorted(rows.tolist()) == list(range(n)) and all(len(p) for p in plan)


@pytest.mark.parametrize("n_mb", [1, 2, 4])
def test_random_equals_grpo_default_and_partitions(n_mb):
    for group, _, adv in CASES:
        plan = batching.random(group, n_mb, seed=3)
        ref = grpo.random_plan(len(group), n_mb, seed=3)
        assert all(torch.equal(a, b) for a, b in zip(plan, ref)) and len(plan) == len(ref)
        assert _is_partition(plan, len(group))


@pytest.mark.parametrize("n_mb", [1, 2, 4, 5])
def test_query_preserved_never_splits_a_group(n_mb):
    for group, _, adv in CASES:
        plan = batching.query_preserved(group, n_mb, seed=1)
        assert _is_partition(plan, len(group))
        where = {}
        for k, rows in enumerate(plan):
            for g in group[rows].tolist():
                where.setdefault(g, set()).add(k)
        assert all(len(v) == 1 for v in where.values())
        assert len(plan) == min(n_mb, len(group.unique()))
        # group counts per mini-batch differ by at most one
        sizes = [len(group[r].unique()) for r in plan]
        assert max(sizes) - min(sizes) <= 1


def test_random_plan_does_split_groups():
    """The baseline the interventions fix: with 4 mini-batches, random scatters some group."""
    group, _, _ = _case(0, n_groups=8, G=8)
    plan = batching.random(group, 4, seed=0)
    assert any(len({k for k, r in enumerate(plan) if (group[r] == g).any()}) > 1 for g in range(8))


@pytest.mark.parametrize("n_mb", [2, 3, 4])
def test_sign_partitioned_never_mixes_signs(n_mb):
    for group, _, adv in CASES:
        plan = batching.sign_partitioned(adv, n_mb, seed=2)
        assert _is_partition(plan, len(group)) and len(plan) <= n_mb
        for rows in plan:
            s = batching.sign(adv[rows])
            assert not ((s > 0).any() and (s < 0).any())
        if (adv > 0).any() and (adv < 0).any():  # both signs present: both get a mini-batch
            signs = {int(batching.sign(adv[r]).max()) if (adv[r] > 0).any() else -1 for r in plan
                     if (adv[r] != 0).any()}
            assert signs == {1, -1}


def test_sign_partitioned_needs_two_minibatches():
    with pytest.raises(ValueError, match="n_minibatches"):
        batching.sign_partitioned(CASES[5][2], 1)


@pytest.mark.parametrize("name", batching.PLANS)
def test_plans_deterministic_under_seed(name):
    group, _, adv = _case(7, n_groups=8, G=8)
    a = batching.make_plan(name, group, adv, 4, seed=11)
    b = batching.make_plan(name, group, adv, 4, seed=11)
    c = batching.make_plan(name, group, adv, 4, seed=12)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def _brute_force_feasible(group, adv, size, tau, qb):
    """Is there ANY subset (of rows, or of whole groups) of exactly `size` meeting the τ rule?"""
    s = batching.sign(adv)
    need = -(-int(round(tau * size * 1000)) // 1000)  # ceil for the τ values used here
    units = [(group == g).nonzero().squeeze(1) for g in group.unique()] if qb else \
        [torch.tensor([i]) for i in range(len(group))]
    if not qb:  # rows: counts suffice
        P, N, Z = int((s > 0).sum()), int((s < 0).sum()), int((s == 0).sum())
        return any(p >= need and q >= need and size - p - q <= Z for p in range(P + 1) for q in range(N + 1)
                   if p + q <= size)
    for k in range(len(units) + 1):
        for sub in itertools.combinations(units, k):
            rows = torch.cat(sub) if sub else torch.zeros(0, dtype=torch.long)
            if len(rows) == size and min(int((s[rows] > 0).sum()), int((s[rows] < 0).sum())) >= need:
                return True
    return False


@pytest.mark.parametrize("qb", [False, True])
@pytest.mark.parametrize("tau", [0.25, 0.4, 0.5])
def test_reward_balanced_tau_rule(qb, tau):
    released = 0
    for seed in range(40):
        group, _, adv = _case(seed, n_groups=6, G=4, p=[0.2, 0.5, 0.8][seed % 3])
        size = 12
        prio = torch.rand(len(group), generator=torch.Generator().manual_seed(seed)) if seed % 2 else None
        rows = batching.reward_balanced(group, adv, size, tau, query_preserved=qb, priority=prio)
        if rows is None:
            if not qb:  # row selection is exact: None only when no balanced subset exists
                assert not _brute_force_feasible(group, adv, size, tau, qb)
            continue
        released += 1
        s = batching.sign(adv[rows])
        assert len(rows) == size and len(set(rows.tolist())) == size
        assert min(int((s > 0).sum()), int((s < 0).sum())) >= tau * size - 1e-9
        if qb:  # whole groups only
            for g in group[rows].unique():
                assert int((group[rows] == g).sum()) == int((group == g).sum())
        assert torch.equal(rows, batching.reward_balanced(group, adv, size, tau, query_preserved=qb, priority=prio))
    assert released > 5


def test_reward_balanced_priority_order():
    # 4 positives, 4 negatives, 4 more positives; τ = 0.5 of |B| = 4 -> two of each sign
    adv = torch.tensor([1.0] * 4 + [-1.0] * 4 + [1.0] * 4)
    assert batching.reward_balanced(torch.arange(12), adv, 4, 0.5).tolist() == [0, 1, 4, 5]  # row order
    born = torch.tensor([0] * 8 + [1] * 4)  # the last four are fresher: they go first, negatives top up
    assert sorted(batching.reward_balanced(torch.arange(12), adv, 4, 0.5, priority=born).tolist()) == [4, 5, 8, 9]
    # with groups of two, whole groups by priority: group 4 (rows 8, 9) then negatives 2 (rows 4, 5)
    rows = batching.reward_balanced(torch.arange(6).repeat_interleave(2), adv, 4, 0.5, True, priority=born)
    assert sorted(rows.tolist()) == [4, 5, 8, 9]


def test_reward_balanced_rejects_bad_tau():
    with pytest.raises(ValueError, match="tau"):
        batching.reward_balanced(torch.arange(4), torch.ones(4), 4, 0.6)


def _fake_batch(reward, G):
    n = len(reward)
    reward = torch.tensor(reward, dtype=torch.float64)
    group = torch.arange(n // G).repeat_interleave(G)
    L = 5 + (n % 3)
    ids = torch.arange(n * L).reshape(n, L) % 7 + 1
    return rollout.RolloutBatch(input_ids=ids, attention_mask=torch.ones(n, L, dtype=torch.long),
                                response_mask=torch.ones(n, L, dtype=torch.bool), group=group, reward=reward,
                                advantage=rollout.group_advantages(reward, group), problems=list(range(n // G)),
                                texts=[str(i) for i in range(n)])


def test_buffer_accounting_and_each_rollout_at_most_once():
    """Rollouts released once at most; sampled = released + discarded + buffered; delays counted."""
    buf = batching.RewardBalancedBuffer(batch_size=8, tau=0.5, query_preserved=False, max_age=1)
    g = torch.Generator().manual_seed(0)
    seen = []
    for r in range(12):
        p = 0.9 if r % 4 else 0.3  # mostly saturated rounds: positives pile up and age out
        b = _fake_batch((torch.rand(8, generator=g) < p).double().tolist(), G=4)
        b.texts = [f"r{r}-{i}" for i in range(8)]  # identity of each rollout
        buf.add(b, r)
        out = buf.release(r)
        if out is not None:
            s = batching.sign(out.advantage)
            assert len(out) == 8 and int((s > 0).sum()) >= 4 and int((s < 0).sum()) >= 4
            seen += out.texts
            assert all(r - int(t.split("-")[0][1:]) <= 1 for t in out.texts)  # none older than max_age
    assert len(seen) == len(set(seen)) and buf.released == len(seen)
    assert buf.sampled == buf.released + buf.discarded + len(buf)
    assert buf.discarded > 0 and buf.delayed > 0


def test_concat_keeps_rows_and_renumbers_groups():
    a, b = _fake_batch([1, 0, 1, 1], G=2), _fake_batch([0, 0, 1, 0, 1, 1], G=2)
    c = batching.concat([a, b])
    assert len(c) == 10 and c.input_ids.shape[1] == max(a.input_ids.shape[1], b.input_ids.shape[1])
    assert c.group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    La = a.input_ids.shape[1]
    assert torch.equal(c.input_ids[:4, :La], a.input_ids) and not c.attention_mask[:4, La:].any()
    assert torch.equal(c.advantage, torch.cat([a.advantage, b.advantage]))


# ----------------------------------------------------------------------------- random+filter (DAPO's filter)
@pytest.mark.parametrize("seed", range(5))
def test_random_filter_drops_exactly_the_zero_variance_groups(seed):
    g = torch.Generator().manual_seed(seed)
    G, n_groups = 4, 7
    group = torch.arange(n_groups).repeat_interleave(G)
    reward = (torch.rand(n_groups * G, generator=g) < 0.5).double()
    reward[:G] = 1.0       # group 0: all correct
    reward[G:2 * G] = 0.0  # group 1: all wrong
    adv = torch.zeros_like(reward)
    for k in range(n_groups):  # group-normalised advantage, by hand
        r = reward[k * G:(k + 1) * G]
        adv[k * G:(k + 1) * G] = (r - r.mean()) / (r.std() + 1e-6)
    want = [i for i in range(len(group)) if len({float(reward[j]) for j in range(len(group)) if group[j] == group[i]}) > 1]
    plan = batching.make_plan("random_filter", group, adv, 3, seed=seed)
    rows = sorted(torch.cat(plan).tolist()) if plan else []
    assert rows == want                                  # every row of a mixed group once, no other row
    assert 0 < len(plan) <= 3 and all(len(p) for p in plan)
    assert train.strategy_config("random+filter").plan == "random_filter"


def test_random_filter_on_zero_variance_groups_only_takes_no_step():
    group = torch.arange(3).repeat_interleave(4)
    assert batching.random_filter(group, torch.zeros(12), 4) == []
    one = torch.zeros(12)
    one[[4, 5]] = torch.tensor([1.0, -1.0])
    plan = batching.random_filter(group, one, 8)
    assert sorted(torch.cat(plan).tolist()) == [4, 5, 6, 7] and len(plan) == 4


@pytest.mark.parametrize("name", ["random", "query_preserved", "sign_partitioned"])
def test_cross_advantage_matches_a_loop_over_pairs(name):
    """Eq. 14 per (mini-batch, group): S_B, Σ A², S_B² − Σ A² against Σ_{i≠j} A_i A_j by a loop."""
    for group, _, adv in CASES:
        for n_mb in (2, 3):
            plan = batching.make_plan(name, group, adv, n_mb, seed=5)
            x = batching.cross_advantage(group, adv, plan).set_index(["minibatch", "group"])
            a, n_cells = adv.tolist(), 0
            for b, rows in enumerate(plan):
                for g in sorted(set(group[rows].tolist())):
                    idx = [i for i in rows.tolist() if group[i] == g]
                    whole = [i for i in range(len(group)) if group[i] == g]
                    row = x.loc[(b, g)]
                    assert row.rows == len(idx)
                    assert row.S_B == pytest.approx(sum(a[i] for i in idx), abs=1e-12)
                    assert row.cross == pytest.approx(sum(a[i] * a[j] for i in idx for j in idx if i != j), abs=1e-12)
                    assert row.grouped == pytest.approx(sum(a[i] * a[j] for i in whole for j in whole if i != j),
                                                        abs=1e-12)
                    n_cells += 1
            assert n_cells == len(x)


def test_random_plans_keep_the_closed_form_share_of_the_cross_mass():
    """Averaged over random plans, the local cross-advantage mass is P(two rows share a mini-batch)
    times the grouped one: (n − 1)/(N − 1) = 15/63 for 4 mini-batches of 16 rows."""
    group, _, adv = _case(7, n_groups=8, G=8, p=0.5)
    grouped = batching.cross_advantage(group, adv, [torch.arange(len(group))]).cross.sum()
    assert grouped < 0  # zero-sum groups: −Σ A²
    p = batching.same_minibatch_probability(batching.random(group, 4, seed=0))
    assert p == pytest.approx(15 / 63)
    kept = torch.tensor([batching.cross_advantage(group, adv, batching.random(group, 4, seed=s)).cross.sum() / grouped
                         for s in range(1500)], dtype=torch.float64)
    assert abs(float(kept.mean()) - p) < 4 * float(kept.std()) / len(kept) ** 0.5
    qb = batching.cross_advantage(group, adv, batching.query_preserved(group, 4, seed=0))
    assert qb.cross.sum() == pytest.approx(grouped) and (qb.S_B.abs() < 1e-12).all()


# ----------------------------------------------------------------------------- DS (DAPO's dynamic sampling)
def _brute_force_ds(group, reward, size, priority):
    """DS by its definition, from the rewards (not the advantages): visit groups by their freshest row's
    priority (ties: first row), keep a group whose rewards are not all equal while it fits, stop at size."""
    first = {}
    for i, g in enumerate(group.tolist()):
        first.setdefault(g, (-float(priority[i]), i))
        first[g] = min(first[g], (-float(priority[i]), i))
    taken, n = [], 0
    for g in sorted(first, key=lambda g: first[g]):
        rows = [i for i, gg in enumerate(group.tolist()) if gg == g]
        if len({float(reward[i]) for i in rows}) > 1 and n + len(rows) <= size:
            taken += rows
            n += len(rows)
            if n == size:
                return sorted(taken)
    return None


@pytest.mark.parametrize("seed", range(20))
def test_dynamic_sampling_takes_the_freshest_mixed_groups_whole(seed):
    g = torch.Generator().manual_seed(seed)
    G, n_groups, size = 4, 9, 12
    group = torch.arange(n_groups).repeat_interleave(G)[torch.randperm(n_groups * G, generator=g)]
    reward = (torch.rand(n_groups * G, generator=g) < [0.2, 0.5, 0.85][seed % 3]).double()
    adv = rollout.group_advantages(reward, group)
    prio = torch.randint(0, 3, (n_groups * G,), generator=g) if seed % 2 else torch.zeros(n_groups * G)
    rows = batching.dynamic_sampling(group, adv, size, priority=prio)
    want = _brute_force_ds(group, reward, size, prio)
    assert (rows is None) == (want is None) and (rows is None or sorted(rows.tolist()) == want)


def test_ds_buffer_releases_full_batches_of_mixed_groups_and_counts_what_it_drops():
    buf = batching.RewardBalancedBuffer(batch_size=8, max_age=1, mixed_groups=True)
    g = torch.Generator().manual_seed(1)
    released = 0
    for r in range(10):
        b = _fake_batch((torch.rand(8, generator=g) < 0.7).double().tolist(), G=2)
        mixed = sum(len({float(x) for x in b.reward[b.group == k]}) > 1 for k in range(4))
        before = buf.filtered
        buf.add(b, r)
        assert buf.filtered - before == 2 * (4 - mixed)   # each zero-variance group of 2 dropped on arrival
        out = buf.release(r)
        if out is not None:
            released += len(out)
            assert len(out) == 8 and bool((out.advantage != 0).all())   # binary rewards: every row of a mixed group
    assert released == buf.released > 0
    assert buf.sampled == buf.released + buf.discarded + buf.filtered + len(buf)
    assert train.strategy_config("DS").dynamic_sampling and not train.strategy_config("DS").reward_balanced
    with pytest.raises(ValueError, match="choose one"):
        train.TrainConfig(reward_balanced=True, dynamic_sampling=True)


@pytest.mark.parametrize("name", ["random", "query_preserved", "sign_partitioned"])
def test_cross_sign_share_matches_a_loop_over_pairs(name):
    """The cross-sign mass kept in mini-batches: Σ |A_i A_j| over pairs with A_i A_j < 0 that share a
    mini-batch over the same sum over every pair (of the batch; of one group), by a loop over pairs.
    Sign-partitioned plans keep exactly 0, QB keeps every within-group pair."""
    checked = 0
    for group, _, adv in CASES:
        a, g = adv.tolist(), group.tolist()
        for n_mb in (2, 3):
            plan = batching.make_plan(name, group, adv, n_mb, seed=5)
            where = {i: b for b, rows in enumerate(plan) for i in rows.tolist()}
            tot = {"batch": [0.0, 0.0], "group": [0.0, 0.0]}
            for i in range(len(a)):
                for j in range(i + 1, len(a)):
                    if a[i] * a[j] < 0:
                        for k in ("batch", "group") if g[i] == g[j] else ("batch",):
                            tot[k][1] += abs(a[i] * a[j])
                            tot[k][0] += abs(a[i] * a[j]) * (where[i] == where[j])
            got = batching.cross_sign_share(group, adv, plan)
            for k, v in zip(("batch", "group"), got):
                if tot[k][1] == 0:
                    assert v != v  # NaN: no cross-sign pair
                    continue
                assert v == pytest.approx(tot[k][0] / tot[k][1], abs=1e-12)
                checked += 1
                if name == "sign_partitioned":
                    assert v == 0.0   # exactly: every mini-batch holds one sign
                if name == "query_preserved" and k == "group":
                    assert v == pytest.approx(1.0)
    assert checked > 10


def test_cross_sign_row_fails_on_a_plan_that_mixes_signs():
    """§4's sign-partitioning row holds by construction only while the plan keeps the signs apart:
    the same table with a mixed plan's share (random's) in the sign-partitioned rows reads 'not reproduced'."""
    import pandas as pd

    from cancellation import claims as C
    from cancellation import strategies
    from cancellation.figures import fig07_claims
    group, _, adv = _case(7, n_groups=8, G=8, p=0.5)
    rows = []
    for name, plan_name in strategies.local_imbalance_plans().items():
        for draw in range(3):
            xs, xg = batching.cross_sign_share(group, adv, batching.make_plan(plan_name, group, adv, 4, seed=draw))
            rows.append(dict(seed=0, strategy=name, draw=draw, cross_sign=xs, cross_sign_group=xg))
    m = pd.DataFrame(rows)
    (ok,) = fig07_claims.cross_sign_row(m, "Eq. 14")
    assert ok.measured == 0.0 and ok.verdict == C.BY_CONSTRUCTION and ok.n == 3
    mixed = m.copy()
    mixed.loc[mixed.strategy == "sign_partitioned", ["cross_sign", "cross_sign_group"]] = \
        m.loc[m.strategy == "random", ["cross_sign", "cross_sign_group"]].to_numpy()
    (bad,) = fig07_claims.cross_sign_row(mixed, "Eq. 14")
    assert bad.measured > 0.01 and bad.verdict == C.NOT_REPRODUCED
    assert fig07_claims.cross_sign_row(m.drop(columns=["cross_sign", "cross_sign_group"]), "Eq. 14") == []
