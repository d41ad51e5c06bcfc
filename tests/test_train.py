import pandas as pd
import pytest
import torch

from cancellation import grpo, measure, policy, train


def _run(seed):
    model, tok = policy.load_policy("data/policies/tiny-s", dtype="float64")
    cfg = train.RunConfig(steps=2, n_prompts=3, G=4, max_new_tokens=64, seed=seed,
                          update=grpo.UpdateConfig(optimizer="adam", lr=1e-3, n_minibatches=2))
    return train.delta_run(model, tok, cfg, progress=False)


def test_delta_run_is_bit_reproducible():
    a, b, c = _run(0), _run(0), _run(1)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert not a[["token_id"]].equals(c[["token_id"]])
    assert set(a.step) == {0, 1} and set(a.status) <= set(measure.STATUSES)


@pytest.mark.gpu
def test_token_stats_on_cuda_match_cpu():
    model, tok = policy.load_policy("data/policies/tiny-s", dtype="float64")
    from cancellation import rollout, sources, tasks
    batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=4, G=2, source=sources.ProblemSource(prompt_format="raw")),
                           problems=tasks.sample_problems(4, seed=0), seed=0)
    cpu = measure.token_stats(model, batch, KNOBS).logp
    gpu = measure.token_stats(model.to("cuda"), batch, KNOBS).logp
    assert torch.allclose(cpu[batch.response_mask], gpu[batch.response_mask], atol=1e-9)


# --------------------------------------------------------------------------- train_run (issue 7)
import copy  # noqa: E402
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

EPS_LOW, EPS_HIGH, C = 0.2, 0.28, 3.0


def response_logps(model, batch):
    """Per row: log π of each response token, from one unpadded forward per sequence (differentiable)."""
    out = []
    for i in range(len(batch)):
        keep = batch.attention_mask[i].bool()
        ids = batch.input_ids[i, keep][None]
        lsm = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
        lp = lsm.gather(-1, ids[0, 1:, None]).squeeze(-1)
        out.append(lp[batch.response_mask[i, keep][1:]])
    return out


def hand_loss(logps, olds, advs):
    """Token-mean clipped loss case by case: A >= 0: -A·min(ρ, 1+ε_h); A < 0: min(|A|·max(ρ, 1-ε_l), |A|·c)."""
    total, n, dev, clipped = 0.0, 0, 0.0, 0
    for lp, old, a in zip(logps, olds, advs):
        rho = torch.exp(lp - old)
        if a >= 0:
            per = -a * torch.minimum(rho, torch.full_like(rho, 1 + EPS_HIGH))
        else:
            per = torch.minimum(-a * torch.maximum(rho, torch.full_like(rho, 1 - EPS_LOW)), torch.full_like(rho, -a * C))
        total = total + per.sum()
        n += len(lp)
        r = rho.detach()
        dev += float((r - 1).abs().sum())
        clipped += int((r > 1 + EPS_HIGH).sum()) if a > 0 else int((r < 1 - EPS_LOW).sum()) if a < 0 else 0  # verl pg_clipfrac
    return total / n, dev / n, clipped / n


def adam(theta, grads, state, lr, t, b1=0.9, b2=0.999, eps=1e-8):
    """torch.optim.Adam's update written out (no weight decay, no amsgrad)."""
    out = []
    for k, (p, g) in enumerate(zip(theta, grads)):
        m, v = state.get(k, (torch.zeros_like(p), torch.zeros_like(p)))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        state[k] = (m, v)
        out.append(p - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps))
    return out


def test_two_step_iteration_matches_hand_computation(fresh, batch):
    """Mini-batch 1: ρ = 1, loss = -Σ A|o|/N; mini-batch 2: ρ from the Adam-updated θ, clipped loss by hand."""
    b = batch.select([0, 1, 8, 9, 2, 3])  # groups 0 and 2; rewards 1,0 | 0,1 | 0,1
    plan = [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])]
    lr = 3e-3
    cfg = grpo.UpdateConfig(optimizer="adam", lr=lr)
    ref = copy.deepcopy(fresh)
    old = measure.token_stats(fresh, b, KNOBS).logp
    opt = grpo.make_optimizer(fresh, cfg)
    infos = train.minibatch_update(fresh, b, plan, old, opt, cfg)

    params = list(ref.parameters())
    olds = [lp.detach() for lp in response_logps(ref, b)]
    adv = b.advantage.tolist()
    state, theta = {}, [p.detach().clone() for p in params]
    for t, rows in enumerate(plan, start=1):
        rows = rows.tolist()
        lps = response_logps(ref, b)
        loss, dev, clip = hand_loss([lps[i] for i in rows], [olds[i] for i in rows], [adv[i] for i in rows])
        info = infos[t - 1]
        assert info["loss"] == pytest.approx(float(loss.detach()), rel=1e-7, abs=1e-10)
        assert info["ratio_dev"] == pytest.approx(dev, rel=1e-5, abs=1e-10)
        assert info["clipfrac"] == pytest.approx(clip)
        if t == 1:  # ρ = 1: the loss is -Σ_i A_i |o_i| / N
            n_tok = [int(b.response_mask[i].sum()) for i in rows]
            assert float(loss.detach()) == pytest.approx(-sum(adv[i] * n for i, n in zip(rows, n_tok)) / sum(n_tok))
            assert dev < 1e-12
        else:
            assert dev > 1e-3  # ρ ≠ 1 after the first step
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        assert info["grad_norm"] == pytest.approx(float(torch.sqrt(sum((g ** 2).sum() for g in grads))), rel=1e-6)
        theta = adam(theta, grads, state, lr, t)
        with torch.no_grad():
            for p, new in zip(params, theta):
                p.copy_(new)
    for p, q in zip(fresh.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-8)


def _tcfg(**kw):
    base = dict(iterations=4, n_prompts=4, G=4, max_new_tokens=64, plan="query_preserved", reward_balanced=True,
                tau=0.25, max_age=1, eval_every=2, eval_n=8, seed=3,
                update=grpo.UpdateConfig(optimizer="adam", lr=1e-3, n_minibatches=2))
    base.update(kw)
    return train.TrainConfig(**base)


def _load_m():
    return policy.load_policy("data/policies/tiny-m", dtype="float32")


def _strip(out):
    return {k: df.drop(columns=[c for c in df.columns if c.startswith("t_") or c == "seconds"])
            for k, df in out.items()}


def test_resume_equals_uninterrupted(tmp_path):
    cfg = _tcfg()
    model_a, tok = _load_m()
    init = copy.deepcopy(model_a.state_dict())
    full = train.train_run(model_a, tok, cfg, progress=False)

    class Interrupt(Exception):
        pass

    def stop(it, model):
        if it == 1:
            raise Interrupt

    ck = tmp_path / "run.pt"
    with pytest.raises(Interrupt):
        train.train_run(_load_m()[0], tok, cfg, ckpt_path=ck, progress=False, on_iteration=stop)
    model_c = _load_m()[0]  # a fresh process starts from the saved policy again
    resumed = train.train_run(model_c, tok, cfg, ckpt_path=ck, progress=False)

    for k, v in model_a.state_dict().items():
        assert torch.equal(v, model_c.state_dict()[k])
    assert any(not torch.equal(v, init[k]) for k, v in model_a.state_dict().items())  # it did train
    a, c = _strip(full), _strip(resumed)
    for k in a:
        pd.testing.assert_frame_equal(a[k], c[k])
    assert full["iterations"].updated.sum() >= 3 and len(full["evals"]) == 3 * 3  # evaluations at 0, 2, 4
    assert (full["minibatches"].groupby("iteration").ratio_dev.first() < 1e-5).all()

    with pytest.raises(ValueError, match="another config"):
        train.train_run(_load_m()[0], tok, _tcfg(seed=4), ckpt_path=ck, progress=False)


def test_checkpoint_waits_for_ckpt_seconds(tmp_path):
    """With ckpt_seconds, an iteration saves only once that long has passed since the last save: a run
    interrupted after its first iteration within it leaves no checkpoint (it restarts); with 0, one."""
    tok = _load_m()[1]

    class Interrupt(Exception):
        pass

    def stop(it, model):
        if it == 0:
            raise Interrupt
    for seconds, kept in ((1e9, False), (0.0, True)):
        ck = tmp_path / f"run-{seconds:g}.pt"
        with pytest.raises(Interrupt):
            train.train_run(_load_m()[0], tok, _tcfg(eval_n=2, reward_balanced=False, plan="random"), ckpt_path=ck,
                            progress=False, on_iteration=stop, ckpt_seconds=seconds)
        assert ck.exists() == kept, seconds


def test_bad_plan_named():
    with pytest.raises(ValueError, match="plan"):
        train.TrainConfig(plan="by_length")


def test_run_rounds_gives_every_iteration_an_update_and_respects_the_budget():
    """RB with a run budget: iterations keep sampling until the buffer releases (equal optimizer
    steps), counted against the budget; a budget too small for that leaves later iterations idle."""
    tok = _load_m()[1]
    kw = dict(iterations=3, tau=0.5, max_rounds=1, max_age=3, eval_sets=["easy"], eval_every=3, eval_n=4)  # strict quota
    capped = train.train_run(_load_m()[0], tok, _tcfg(**kw), progress=False)["iterations"]
    assert not capped.updated.all() and (capped.rounds == 1).all()  # the per-iteration cap skips updates
    full = train.train_run(_load_m()[0], tok, _tcfg(run_rounds=40, **kw), progress=False)["iterations"]
    assert full.updated.all() and full.rounds.sum() <= 40 and full.rounds.max() > 1
    tight = train.train_run(_load_m()[0], tok, _tcfg(run_rounds=int(full.rounds.iloc[0]), **kw),
                            progress=False)["iterations"]
    assert tight.rounds.sum() == full.rounds.iloc[0] and tight.updated.tolist() == [True, False, False]
    assert "run_rounds" not in train.run_params(_tcfg())  # default: earlier cache keys unchanged
    assert train.run_params(_tcfg(run_rounds=40))["run_rounds"] == 40
    # without RB the budget is never read: the same run, so the same cache key
    plain = dict(kw, reward_balanced=False)
    a, b = (train.train_run(_load_m()[0], tok, _tcfg(run_rounds=r, **plain), progress=False)["iterations"]
            for r in (0, 40))
    timing = ["t_sample", "t_update"]
    pd.testing.assert_frame_equal(a.drop(columns=timing), b.drop(columns=timing))
    assert train.run_params(_tcfg(run_rounds=40, **plain)) == train.run_params(_tcfg(**plain))


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_cached_train_many_in_two_processes_equals_one(tmp_path, monkeypatch):
    from cancellation import cache
    monkeypatch.setattr(cache, "DEFAULT_DIR", tmp_path / "a")
    cfgs = [_tcfg(iterations=2, reward_balanced=False, plan=p, eval_sets=["easy"]) for p in ("random", "query_preserved")]
    one = train.cached_train_many("data/policies/tiny-m", cfgs, workers=1, progress=False)
    monkeypatch.setattr(cache, "DEFAULT_DIR", tmp_path / "b")
    monkeypatch.setenv("CANCELLATION_CACHE", str(tmp_path / "b"))  # the spawned workers' cache
    two = train.cached_train_many("data/policies/tiny-m", cfgs, workers=2)
    assert (tmp_path / "b").exists() and not list((tmp_path / "b" / "ckpt").glob("*.pt"))
    for a, b in zip(one, two):
        for k in a:
            pd.testing.assert_frame_equal(_strip(a)[k], _strip(b)[k])


def test_initial_eval_given_equals_evaluating_at_iteration_0():
    cfg = _tcfg(iterations=2, eval_sets=["easy"])
    m, tok = _load_m()
    ev0 = train.evaluate(m, tok, cfg.eval_sets, cfg.eval_n, cfg.eval_samples, cfg.eval_temperature, cfg.max_new_tokens,
                         token_chunk=KNOBS.token_chunk)
    a = train.train_run(m, tok, cfg, progress=False)
    b = train.train_run(_load_m()[0], tok, cfg, progress=False, initial_eval=ev0)
    for k in a:
        pd.testing.assert_frame_equal(_strip(a)[k], _strip(b)[k])
