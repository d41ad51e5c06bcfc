"""Monte Carlo token value: the estimator against exact enumeration, shared-prefix sampling
against independent sampling, and the cache."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch

from cancellation import measure, rollout, sampler, sources, stats, tasks, value
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify

S_WORDS = {w for i, w in enumerate(tasks.VOCAB) if i % 2 == 0}  # the verifier rewards these final words
HORIZON = 3                                     # tokens left to the response cap at the valued state


def last_word_verifier(problem, text):
    """Reward 1 iff the response's last word (ignoring <eos>) is in S_WORDS."""
    words = [w for w in text.split() if w != tasks.EOS]
    return float(bool(words) and words[-1] in S_WORDS)


class LastWord(sources.ProblemSource):
    """Raw prompts rewarded by `last_word_verifier`."""

    def verifier(self):
        return last_word_verifier


@pytest.fixture(scope="module")
def peaky(model64):
    """The random tiny-s policy with a sharpened LM head: peaked, context-dependent next-token distributions."""
    m = copy.deepcopy(model64)
    with torch.no_grad():
        m.lm_head.weight.mul_(25.0)
    return m


@pytest.fixture(scope="module")
def setup(peaky, tok):
    """One rollout sampled from the peaky policy (seed 3: its tokens 2 and 3 have 0.1 < p < 0.8
    and |Δ| > 0.25, found by exact enumeration), with the per-token table of the training forward."""
    prob = tasks.Problem(prompt="Q: 1 2 + 3 4 = ? A:", answer="46", kind="add2")
    batch = rollout.sample(peaky, tok, rollout.SampleConfig(n_prompts=1, G=1, max_new_tokens=12, source=LastWord(prompt_format="raw")),
                           problems=[prob], seed=3)
    table = measure.token_table(batch, measure.token_stats(peaky, batch, KNOBS), tokenizer=tok)
    return batch, table


def exact_value(model, tok, ids: list, budget: int) -> float:
    """V of a prefix by enumerating every continuation of at most `budget` tokens (batched forwards)."""
    eos = tok.eos_token_id
    rewarded = torch.tensor([tok.convert_ids_to_tokens(i) in S_WORDS for i in range(len(tok))], dtype=torch.float64)
    base_last = float(rewarded[ids[-1]])           # reward if the continuation is only <eos>
    # frontier: (paths, prob); a path ends on <eos> (reward = its last non-eos token) or at the cap
    paths, probs, total = torch.tensor([ids]), torch.ones(1, dtype=torch.float64), 0.0
    for step in range(budget):
        with torch.no_grad():
            pi = torch.softmax(model(input_ids=paths).logits[:, -1].double(), -1)   # (n, V)
        joint = probs[:, None] * pi
        prev_reward = rewarded[paths[:, -1]] if step > 0 else torch.full((len(paths),), base_last, dtype=torch.float64)
        total += float((joint[:, eos] * prev_reward).sum())                  # stop now on <eos>
        joint[:, eos] = 0
        if step == budget - 1:                                               # the cap: last token decides
            total += float((joint * rewarded[None]).sum())
            break
        keep = joint > 1e-12                                                 # prune negligible mass (< 1e-9 in all)
        r, c = keep.nonzero(as_tuple=True)
        paths = torch.cat([paths[r], c[:, None]], 1)
        probs = joint[r, c]
    return total


@pytest.mark.parametrize("estimator", ["paper", "exclude"])
def test_estimator_matches_exact_enumeration(peaky, tok, setup, estimator, tmp_path):
    """Δ̂ and its SE against Q, V computed exactly by enumerating every continuation (horizon 3)."""
    batch, table = setup
    prompt, resp = value.split_rollout(batch, 0)
    for t in (2, 3):
        r = table[table.position == t]
        cfg = value.ValueConfig(M=3000, seed=1, max_new_tokens=t + HORIZON, estimator=estimator, rows_per_chunk=12000)
        got = value.token_values(peaky, tok, batch, r, cfg, mid="peaky", verifier=last_word_verifier,
                                 cache_dir=tmp_path, progress=False).iloc[0]
        p = float(got.prob)
        s = list(prompt + resp[:t])
        V = exact_value(peaky, tok, s, HORIZON)
        Q = exact_value(peaky, tok, s + [resp[t]], HORIZON - 1)
        Qx = (V - p * Q) / (1 - p)                               # the alternatives' value
        delta = (Q - V) / (1 - p)
        assert 0.05 < p < 0.95 and abs(delta) > 0.2, "the case must be informative"
        other = V if estimator == "paper" else Qx
        se = np.sqrt(Q * (1 - Q) / cfg.M + other * (1 - other) / cfg.M) / ((1 - p) if estimator == "paper" else 1)
        assert abs(got.delta_hat - delta) < 4.5 * se, (got.delta_hat, delta, se)
        assert got.delta_se == pytest.approx(se, rel=0.25)     # the reported SE is the sampling SE
        assert abs(got.avg0 - Q) < 4.5 * np.sqrt(Q * (1 - Q) / cfg.M)


def test_shared_prefix_sampling_equals_independent(peaky, tok, setup):
    """Batched shared-prefill sampling gives, per prefix, exactly the samples of sampling it alone
    with M separately prefilled copies (per-prefix generators; float64 so logits agree to ~1e-15)."""
    batch, _ = setup
    prompt, resp = value.split_rollout(batch, 0)
    prefixes = [list(prompt + resp[:k]) for k in (0, 3, 7)]
    budgets, bans, M = [6, 4, 5], [None, resp[3], None], 16
    seeds = [value.prefix_seed(0, p, b) for p, b in zip(prefixes, bans)]
    eos, pad = tok.eos_token_id, tok.pad_token_id
    together = value.sample_continuations(peaky, prefixes, M, budgets, eos, pad, seeds, bans=bans,
                                          token_chunk=KNOBS.token_chunk)
    for i, p in enumerate(prefixes):
        alone = value.sample_continuations(peaky, [p], M, [budgets[i]], eos, pad, [seeds[i]], bans=[bans[i]],
                                           share_prefill=False, token_chunk=KNOBS.token_chunk)[0]
        assert torch.equal(together[i][:, :alone.shape[1]], alone)
        assert (together[i][:, alone.shape[1]:] == pad).all()
    assert not (together[1][:, 0] == resp[3]).any()             # the banned first token never appears
    assert len({tuple(r) for r in together[0].tolist()}) > 1      # and the M continuations differ


def test_sampler_distribution_matches_generate(peaky, tok, setup):
    """Statistical check against the independent sampler sampler.generate (torch.multinomial):
    the first-token frequencies of both match the exact π within 5 binomial SE (fixed seeds, so
    deterministic; 5 SE over ~10 non-negligible tokens fails by chance with prob ~1e-5)."""
    batch, _ = setup
    prompt, resp = value.split_rollout(batch, 0)
    s, M = list(prompt + resp[:5]), 4000
    ours = value.sample_continuations(peaky, [s], M, [1], tok.eos_token_id, tok.pad_token_id, [7],
                                      token_chunk=KNOBS.token_chunk)[0][:, 0]
    ids = torch.tensor([s] * M)
    theirs = sampler.generate(peaky, ids, torch.ones_like(ids), 1, 1.0, tok.eos_token_id, tok.pad_token_id,
                              generator=torch.Generator().manual_seed(7), token_chunk=KNOBS.token_chunk)[:, 0]
    with torch.no_grad():
        pi = torch.softmax(peaky(input_ids=torch.tensor([s])).logits[0, -1].double(), -1)
    se = torch.sqrt(pi * (1 - pi) / M) + 1e-3
    for draws in (ours, theirs):
        freq = torch.bincount(draws, minlength=len(pi)).double() / M
        assert ((freq - pi).abs() < 5 * se).all()


def test_cache_hit_returns_identical_values(peaky, tok, setup, tmp_path, monkeypatch):
    batch, table = setup
    cfg = value.ValueConfig(M=8, seed=3, max_new_tokens=len(table) + 4, estimator="paper")
    rows = table.iloc[2:8]
    s1, s2 = {}, {}
    first = value.token_values(peaky, tok, batch, rows, cfg, mid="m", verifier=last_word_verifier,
                               cache_dir=tmp_path, progress=False, stats=s1)
    monkeypatch.setattr(value, "_rewards", lambda *a, **k: pytest.fail("cache miss on a rerun"))
    second = value.token_values(peaky, tok, batch, rows, cfg, mid="m", verifier=last_word_verifier,
                                cache_dir=tmp_path, progress=False, stats=s2)
    cols = ["avg0", "avg1", "delta_hat", "delta_se"]
    assert np.array_equal(first[cols].to_numpy(), second[cols].to_numpy(), equal_nan=True)
    assert s1["cache_hits"] == 0 and s2["cache_hits"] == s2["requests"] == s1["requests"]
    # the s⊕o branch is shared: the 'exclude' estimator on the same tokens only samples the new branch
    monkeypatch.undo()
    s3 = {}
    value.token_values(peaky, tok, batch, rows, value.ValueConfig(M=8, seed=3, max_new_tokens=len(table) + 4,
                       estimator="exclude"), mid="m", verifier=last_word_verifier, cache_dir=tmp_path,
                       progress=False, stats=s3)
    assert s3["cache_hits"] >= 1 and s3["continuations"] > 0


def test_skips_confident_tokens(peaky, tok, setup, tmp_path):
    batch, table = setup
    rows = table.copy()
    rows["prob"] = np.where(np.arange(len(rows)) % 2 == 0, 0.9995, 0.5)  # every other token above p_max
    cfg = value.ValueConfig(M=2, max_new_tokens=len(table) + 2)
    got = value.token_values(peaky, tok, batch, rows.iloc[:6], cfg, mid="m", verifier=last_word_verifier,
                             cache_dir=tmp_path, progress=False)
    assert got.skipped.tolist() == [True, False] * 3
    assert got[got.skipped].delta_hat.isna().all() and got[~got.skipped].delta_hat.notna().all()


def test_bootstrap_and_balance():
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 1.0, 400)
    m, lo, hi = value.bootstrap_mean(x, 4000, 0)
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))                 # the normal-theory interval
    assert m == pytest.approx(x.mean()) and lo == pytest.approx(m - half, abs=0.03) and hi == pytest.approx(m + half, abs=0.03)
    import pandas as pd
    df = pd.DataFrame({"sign": ["pos"] * 10 + ["neg"] * 4, "status": ["boosted", "suppressed"] * 7})
    assert value.balanced_sample(df).groupby(["sign", "status"]).size().tolist() == [2, 2, 2, 2]


@pytest.mark.gpu
def test_cuda_continuations_match_cpu_when_greedy_and_are_seeded(model64, tok):
    """MC continuations on CUDA: near-greedy draws equal CPU's; sampled draws reproduce per device."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prefixes = [tok("Q: 4 7 + 3 8 = ? A:", add_special_tokens=False)["input_ids"],
                tok("Q: 9 1 - 2 5 = ? A: First", add_special_tokens=False)["input_ids"]]
    args = dict(M=3, budgets=[12, 12], eos_id=eos, pad_id=pad, seeds=[1, 2])
    cuda = copy.deepcopy(model64).cuda()
    cpu_g = value.sample_continuations(model64, prefixes, temperature=1e-6, **args)
    gpu_g = value.sample_continuations(cuda, prefixes, temperature=1e-6, **args)
    assert all(torch.equal(a, b) for a, b in zip(cpu_g, gpu_g))
    a = value.sample_continuations(cuda, prefixes, temperature=1.0, **args)
    b = value.sample_continuations(cuda, prefixes, temperature=1.0, **args)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and all(x.device.type == "cpu" for x in a)


def _loop_gaps(vals, sign, status):
    """Brute force: per sign, mean of boosted minus mean of suppressed values; 'all' = their average."""
    g = {}
    for s in ("pos", "neg"):
        b = [v for v, sg, st in zip(vals, sign, status) if sg == s and st == "boosted"]
        m = [v for v, sg, st in zip(vals, sign, status) if sg == s and st == "suppressed"]
        g[s] = sum(b) / len(b) - sum(m) / len(m)
    g["all"] = (g["pos"] + g["neg"]) / 2
    return g


def test_sign_gaps_against_a_loop_and_the_stats_intervals():
    rng = np.random.default_rng(4)
    n = 300
    df = pd.DataFrame(dict(sign=rng.choice(["pos", "neg"], n), status=rng.choice(["boosted", "suppressed", "stable"], n),
                           delta_hat=rng.normal(size=n)))
    rows = {r["sign"]: r for r in value.sign_gaps(df, n_boot=300, seed=7)}
    want = _loop_gaps(df.delta_hat, df.sign, df.status)
    for s in ("pos", "neg", "all"):
        assert rows[s]["gap"] == pytest.approx(want[s], abs=1e-12) and rows[s]["lo"] <= rows[s]["gap"] <= rows[s]["hi"]
    b = df[(df.sign == "pos") & (df.status == "boosted")].delta_hat
    assert rows["pos"]["n_boosted"] == len(b) and rows["pos"]["hi"] == stats.bootstrap_gap(
        b, df[(df.sign == "pos") & (df.status == "suppressed")].delta_hat, 300, 7)[2]
    empty = value.sign_gaps(df[df.status != "suppressed"], n_boot=10)
    assert all(np.isnan(r["gap"]) for r in empty)


def test_repeated_gap_matches_a_brute_force_loop():
    """value.repeated_gap vs explicit loops: gap per step, changed share, paired change."""
    rng = np.random.default_rng(0)
    n, K, eps = 60, 3, 1e-6
    vals, sign = rng.normal(size=n), np.array(["pos", "neg"] * (n // 2))
    deltas = rng.normal(scale=1e-5, size=(K, n))
    out = value.repeated_gap(vals, sign, deltas, eps, n_boot=200, seed=1)

    def gap(status):
        return _loop_gaps(vals, sign, status)["all"]

    status = [["boosted" if d > eps else "suppressed" if d < -eps else "stable" for d in row] for row in deltas]
    for k in range(K):
        r = out.iloc[k]
        assert r.step == k + 1 and r.gap == pytest.approx(gap(status[k]), abs=1e-12)
        assert r.change == pytest.approx(gap(status[k]) - gap(status[0]), abs=1e-12)
        assert r.changed_status == pytest.approx(np.mean([a != b for a, b in zip(status[k], status[0])]))
        assert r.lo <= r.gap <= r.hi
    assert value.nonlinear_choice({0.1: 0.05, 1.0: 0.3, 10.0: 0.5}, 0.2) == 1.0
    assert value.nonlinear_choice({0.1: 0.05}, 0.2) is None


def _loop_group_rows(group, n_boot, seed):
    """The engine's draw of the query groups (sorted labels, `default_rng(seed).integers(0, n, n)` per
    replicate), each drawn group's rows copied in by a loop."""
    units = sorted(set(group.tolist()))
    rng = np.random.default_rng(seed)
    return [[t for c in rng.integers(0, len(units), len(units)) for t in range(len(group)) if group[t] == units[c]]
            for _ in range(n_boot)]


def _loop_all(vals, sign, status, rows):
    g = {}
    for s in ("pos", "neg"):
        b = [vals[t] for t in rows if sign[t] == s and status[t] == "boosted"]
        m = [vals[t] for t in rows if sign[t] == s and status[t] == "suppressed"]
        g[s] = sum(b) / len(b) - sum(m) / len(m) if b and m else float("nan")
    g["all"] = (g["pos"] + g["neg"]) / 2
    return g


def _q(reps):
    reps = np.array(reps, float)
    return tuple(np.quantile(reps[np.isfinite(reps)], [0.025, 0.975]))


def test_sign_gaps_with_clusters_resample_the_query_groups_like_a_loop():
    """Per sign: the groups drawn once, every drawn group's boosted and suppressed tokens of that sign
    copied in (seed); the balanced row: one draw for both signs (seed + 1); n_groups counted by hand."""
    rng = np.random.default_rng(6)
    n = 180
    df = pd.DataFrame(dict(sign=rng.choice(["pos", "neg"], n),
                           status=rng.choice(["boosted", "suppressed", "stable"], n),
                           delta_hat=rng.normal(size=n), group=rng.integers(0, 8, n) * 3))
    rows = {r["sign"]: r for r in value.sign_gaps(df, n_boot=200, seed=5, clusters=df.group)}
    v, sg, st, grp = df.delta_hat.to_numpy(), df.sign.to_numpy(), df.status.to_numpy(), df.group.to_numpy()
    want = _loop_gaps(v, sg, st)
    for s in ("pos", "neg"):
        keep = [t for t in range(n) if sg[t] == s and st[t] != "stable"]
        order = [t for t in keep if st[t] == "boosted"] + [t for t in keep if st[t] == "suppressed"]
        reps = [_loop_all(v[order], sg[order], st[order], r)[s] for r in _loop_group_rows(grp[order], 200, 5)]
        assert (rows[s]["gap"], rows[s]["lo"], rows[s]["hi"]) == pytest.approx((want[s], *_q(reps)), abs=1e-12)
        assert rows[s]["n_groups"] == len({grp[t] for t in keep})
    order = [t for s in ("pos", "neg") for w in ("boosted", "suppressed") for t in range(n)
             if sg[t] == s and st[t] == w]
    reps = [_loop_all(v[order], sg[order], st[order], r)["all"] for r in _loop_group_rows(grp[order], 200, 6)]
    assert (rows["all"]["gap"], rows["all"]["lo"], rows["all"]["hi"]) == pytest.approx((want["all"], *_q(reps)),
                                                                                       abs=1e-12)
    tok = {r["sign"]: r for r in value.sign_gaps(df, n_boot=200, seed=5)}   # without clusters: tokens, as before
    assert "n_groups" not in tok["pos"] and tok["pos"]["hi"] == stats.bootstrap_gap(
        v[(sg == "pos") & (st == "boosted")], v[(sg == "pos") & (st == "suppressed")], 200, 5)[2]


def test_repeated_gap_with_clusters_resamples_the_pool_groups_like_a_loop():
    rng = np.random.default_rng(2)
    n, K, eps = 80, 3, 1e-6
    vals, sign = rng.normal(size=n), np.array(["pos", "neg"] * (n // 2))
    group = rng.integers(0, 7, n)
    deltas = rng.normal(scale=1e-5, size=(K, n))
    out = value.repeated_gap(vals, sign, deltas, eps, n_boot=150, seed=3, clusters=group)
    status = [np.array(["boosted" if d > eps else "suppressed" if d < -eps else "stable" for d in row])
              for row in deltas]
    draws = _loop_group_rows(group, 150, 3)
    for k in range(K):
        r = out.iloc[k]
        reps = [_loop_all(vals, sign, status[k], rows)["all"] for rows in draws]
        assert (r.gap, r.lo, r.hi) == pytest.approx((_loop_all(vals, sign, status[k], range(n))["all"], *_q(reps)),
                                                    abs=1e-12)
        if k:
            reps = [_loop_all(vals, sign, status[k], rows)["all"] - _loop_all(vals, sign, status[0], rows)["all"]
                    for rows in draws]
            assert (r.change_lo, r.change_hi) == pytest.approx(_q(reps), abs=1e-12)


def test_repeated_deltas_are_cumulative_steps_with_one_optimizer_and_restore_theta(model64, tok):
    from cancellation import grpo
    m = copy.deepcopy(model64)
    b = rollout.sample(m, tok, rollout.SampleConfig(n_prompts=3, G=4, max_new_tokens=24, source=RAW),
                       problems=tasks.sample_problems(3, seed=1), seed=0)
    b.reward = torch.tensor([1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    cfg = grpo.UpdateConfig(optimizer="adam", lr=1e-2, n_minibatches=1)
    theta = {k: v.clone() for k, v in m.state_dict().items()}
    D = value.repeated_deltas(m, b, cfg, K=2)
    assert all(torch.equal(v, theta[k]) for k, v in m.state_dict().items())
    ref = copy.deepcopy(model64)  # independent: two steps of one Adam on a copy, θ_old fixed at θ0
    before = measure.token_stats(ref, b, KNOBS).logp
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for k in range(2):
        grpo.grpo_step(ref, b, cfg, optimizer=opt, old_logp=before)
        want = (measure.token_stats(ref, b, KNOBS).logp - before)[b.response_mask].numpy()
        assert np.allclose(D[k], want, rtol=0, atol=1e-12)
    assert np.abs(D[1] - D[0]).max() > 1e-4


def test_heldout_deltas_are_one_step_on_the_first_batch_read_on_the_second(model64, tok):
    """Δlog p on another batch's tokens after one SGD step on the first: against a step on a copy."""
    from cancellation import grpo
    m = copy.deepcopy(model64)
    b = rollout.sample(m, tok, rollout.SampleConfig(n_prompts=3, G=4, max_new_tokens=24, source=RAW),
                       problems=tasks.sample_problems(3, seed=1), seed=0)
    b.reward = torch.tensor([1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    other = rollout.sample(m, tok, rollout.SampleConfig(n_prompts=2, G=3, max_new_tokens=20, source=RAW),
                           problems=tasks.sample_problems(2, seed=9), seed=5)
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.1, n_minibatches=1)
    theta = {k: v.clone() for k, v in m.state_dict().items()}
    D = value.heldout_deltas(m, b, other, cfg)
    assert all(torch.equal(v, theta[k]) for k, v in m.state_dict().items())
    ref = copy.deepcopy(model64)  # independent: a plain SGD step on a copy, read on the other batch
    before = measure.token_stats(ref, other, KNOBS).logp
    grpo.grpo_step(ref, b, cfg, optimizer=torch.optim.SGD(ref.parameters(), lr=0.1))
    want = (measure.token_stats(ref, other, KNOBS).logp - before)[other.response_mask].numpy()
    assert D.shape == (int(other.response_mask.sum()),) and np.allclose(D, want, rtol=0, atol=1e-12)
    assert np.abs(D).max() > 1e-6
