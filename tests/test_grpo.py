import copy

import pytest
import torch

from cancellation import eq14, grpo, measure
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def per_token_loss_scalar(logp, old, a, cl=0.2, ch=0.28, c=3.0):
    """verl's vanilla PG loss of one token, written out case by case."""
    ratio = torch.exp(logp - old)
    unclipped, clipped = -a * ratio, -a * torch.clamp(ratio, 1 - cl, 1 + ch)
    loss = torch.maximum(unclipped, clipped)
    if a < 0:
        loss = torch.minimum(loss, torch.tensor(-a * c, dtype=loss.dtype))
    return loss


def test_policy_loss_closed_form():
    # ratio 2 with A = -1: unclipped 2, clipped 1.28 -> max 2, dual clip caps at 3 -> 2
    # ratio 5 with A = -1: max(5, 1.28) = 5 -> capped at 3;  ratio 2 with A = +1: max(-2, -1.28) = -1.28
    lp = torch.log(torch.tensor([[2.0, 5.0, 2.0, 0.5]], dtype=torch.float64))
    old = torch.zeros_like(lp)
    a = torch.tensor([[-1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    m = torch.ones_like(lp, dtype=torch.bool)
    loss = grpo.policy_loss(lp, old, a, m)
    assert loss.item() == pytest.approx((2 + 3 - 1.28 - 0.5) / 4)


def test_loss_gradient_matches_brute_force_per_token(fresh, batch):
    """Batched token-mean loss gradient == sum over tokens of per-token autograd grads / N."""
    model, batch = fresh, batch.select([0, 1, 8, 9])  # two mixed groups, 4 rows: the brute force is slow
    old = measure.token_stats(model, batch, KNOBS).logp
    # perturb θ_old so ratios leave [0.8, 1.28] for some tokens (clipped: zero gradient)
    g = torch.Generator().manual_seed(0)
    old = old + 0.4 * torch.randn(old.shape, generator=g, dtype=old.dtype)
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.0)
    params = list(model.parameters())
    model.zero_grad()
    grpo.accumulate_grad(model, batch, torch.arange(len(batch)), old, batch.advantage, cfg)
    batched = [p.grad.clone() for p in params]

    N = batch.n_tokens
    brute = [torch.zeros_like(p) for p in params]
    for i in range(len(batch)):
        keep = batch.attention_mask[i].bool()
        ids = batch.input_ids[i, keep][None]
        cols = keep.nonzero().squeeze(1)
        for t in range(1, ids.shape[1]):
            if not batch.response_mask[i, cols[t]]:
                continue
            logp = torch.log_softmax(model(input_ids=ids[:, :t]).logits[0, -1], -1)[ids[0, t]]
            loss = per_token_loss_scalar(logp, old[i, cols[t]], batch.advantage[i].item()) / N
            for acc, gr in zip(brute, torch.autograd.grad(loss, params, allow_unused=True)):
                if gr is not None:
                    acc += gr
    # float64 throughout (policy.exact_norms): padded batch vs unpadded prefixes agree to round-off
    for b, r in zip(batched, brute):
        assert torch.allclose(b, r, rtol=1e-9, atol=1e-12 * float(r.abs().max()))
    assert any(b.abs().sum() > 0 for b in batched)


def test_delta_logp_equals_manual_sgd_recomputation(fresh, batch):
    """measure + grpo_step vs an independent manual SGD step and per-sequence forwards."""
    lr = 0.5
    ref = copy.deepcopy(fresh)
    before = measure.token_stats(fresh, batch, KNOBS)
    grpo.grpo_step(fresh, batch, grpo.UpdateConfig(optimizer="sgd", lr=lr), old_logp=before.logp)
    after = measure.token_stats(fresh, batch, KNOBS)
    delta = (after.logp - before.logp)[batch.response_mask]

    # independent: J = (1/N) Σ A_i log π(o_t) (ρ = 1, no clipping active), θ' = θ + lr ∇J, per-sequence forwards
    ref_before = measure.token_stats_per_sequence(ref, batch).logp
    N = batch.n_tokens
    J = 0
    for i in range(len(batch)):
        keep = batch.attention_mask[i].bool()
        ids = batch.input_ids[i, keep][None]
        lsm = torch.log_softmax(ref(input_ids=ids).logits[0, :-1], -1)
        lp = lsm.gather(-1, ids[0, 1:, None]).squeeze(-1)
        J = J + batch.advantage[i] * lp[batch.response_mask[i, keep][1:]].sum() / N
    grads = torch.autograd.grad(J, list(ref.parameters()))
    with torch.no_grad():
        for p, gr in zip(ref.parameters(), grads):
            p += lr * gr
    ref_after = measure.token_stats_per_sequence(ref, batch).logp
    ref_delta = (ref_after - ref_before)[batch.response_mask]
    assert delta.abs().max() > 1e-4
    assert torch.allclose(delta, ref_delta, atol=1e-10, rtol=1e-6)


def test_lm_head_scope_changes_only_the_lm_head(fresh, batch):
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    grpo.grpo_step(fresh, batch, grpo.UpdateConfig(optimizer="sgd", lr=1.0, scope="lm_head"))
    changed = {k for k, v in fresh.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"lm_head.weight"}
    assert all(p.requires_grad for p in fresh.parameters())  # freezing was temporary


def test_tied_lm_head_is_untied_before_an_lm_head_step(fresh, batch):
    fresh.lm_head.weight = fresh.model.embed_tokens.weight  # tie
    emb = fresh.model.embed_tokens.weight.detach().clone()
    grpo.grpo_step(fresh, batch, grpo.UpdateConfig(optimizer="sgd", lr=1.0, scope="lm_head"))
    assert torch.equal(fresh.model.embed_tokens.weight, emb)
    assert not torch.equal(fresh.lm_head.weight, emb)


def test_snapshot_restore_and_reweightings(fresh, batch):
    snap = grpo.snapshot(fresh)
    before = measure.token_stats(fresh, batch, KNOBS).logp
    grpo.grpo_step(fresh, batch, grpo.UpdateConfig(optimizer="adam", lr=1e-2, n_minibatches=2))
    assert not torch.equal(measure.token_stats(fresh, batch, KNOBS).logp, before)
    grpo.restore(fresh, snap)
    assert torch.equal(measure.token_stats(fresh, batch, KNOBS).logp, before)
    w = grpo.reweight_advantage(batch, "positive_only")
    assert torch.equal(w[batch.reward == 0], torch.zeros_like(w[batch.reward == 0]))
    assert torch.equal(w[batch.reward == 1], batch.advantage[batch.reward == 1])
    with pytest.raises(ValueError, match="reweight"):
        grpo.UpdateConfig(reweight="negative")


def test_zero_weight_update_and_repeat_forward_have_zero_noise(fresh, batch):
    zero = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    floor = measure.noise_floor(fresh, batch, KNOBS, step_fn=lambda m, b: grpo.grpo_step(
        m, b, grpo.UpdateConfig(optimizer="adam", lr=1e-2), token_weight=zero))
    assert floor == {"repeat": 0.0, "zero_update": 0.0}


def test_random_plan_partitions_rows():
    plan = grpo.random_plan(10, 3, seed=1)
    assert sorted(torch.cat(plan).tolist()) == list(range(10))
    assert [len(p) for p in plan] == [4, 3, 3]
    assert all(torch.equal(a, b) for a, b in zip(plan, grpo.random_plan(10, 3, seed=1)))


def test_clipfrac_counts_only_tokens_where_the_clip_binds():
    """verl's pg_clipfrac: A > 0 with ρ > 1 + ε_high, A < 0 with ρ < 1 − ε_low; never A = 0 or off-mask."""
    rho = torch.tensor([[1.5, 0.5, 1.0, 1.5], [0.5, 1.5, 0.7, 1.29]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    # by hand: (0,0) A>0 ρ>1.28 binds; (0,1) A>0 ρ<0.8 does not; (0,3) A=0 never; (1,0) A<0 ρ<0.8 binds;
    # (1,1) A<0 ρ>1.28 does not; (1,2) ρ=0.7 < 0.8 with A<0 binds; (1,3) would bind but is off-mask
    binds = grpo.clip_binds(rho, adv, 0.2, 0.28) & mask
    assert binds.tolist() == [[True, False, False, False], [True, False, True, False]]
    cfg = grpo.UpdateConfig()
    _, clipped, dev = grpo._loss_terms(torch.log(rho), torch.zeros_like(rho), adv, None, mask, cfg, mask.sum())
    assert clipped == 3
    # the old count (ρ outside [0.8, 1.28] whatever A) would have been 6 on-mask tokens
    assert int((((rho < 0.8) | (rho > 1.28)) & mask).sum()) == 6
    assert dev == pytest.approx(float(((rho - 1).abs() * mask).sum()))


def test_policy_loss_masks_with_where_no_nan_from_off_mask_overflow():
    logp = torch.tensor([[-1.0, 800.0]], dtype=torch.float64)   # exp(800) = inf off the mask
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    loss = grpo.policy_loss(logp, old, adv, mask)
    assert torch.isfinite(loss)
    # by hand, one on-mask token: ρ = e^-1 < 1.28, A = 1: loss = -ρ
    assert float(loss) == pytest.approx(-float(torch.exp(torch.tensor(-1.0, dtype=torch.float64))))
    # multiplying by the mask would give inf · 0 = NaN
    assert torch.isnan((-(adv * torch.exp(logp - old))) * mask).any()


def test_trial_delta_equals_a_step_on_a_copy_and_restores_theta(fresh, batch):
    """trial_delta (snapshot, step, measure, restore) vs the same step on an independent deep copy."""
    cfg = grpo.UpdateConfig(optimizer="adam", lr=1e-2, n_minibatches=2)
    theta = {k: v.clone() for k, v in fresh.state_dict().items()}
    before = measure.token_stats(fresh, batch, KNOBS).logp
    delta = grpo.trial_delta(fresh, batch, cfg, before)
    ref = copy.deepcopy(fresh)
    grpo.grpo_step(ref, batch, cfg, old_logp=before)
    assert delta[batch.response_mask].abs().max() > 1e-4
    assert torch.equal(delta, measure.token_stats(ref, batch, KNOBS).logp - before)
    assert all(torch.equal(v, theta[k]) for k, v in fresh.state_dict().items())
    assert all(p.grad is None for p in fresh.parameters())
    with pytest.raises(RuntimeError, match="boom"), grpo.trial(fresh):  # restored on error too
        grpo.grpo_step(fresh, batch, cfg)
        raise RuntimeError("boom")
    assert all(torch.equal(v, theta[k]) for k, v in fresh.state_dict().items())


def test_minibatch_grads_leave_theta_and_average_to_the_whole_batch(fresh, batch):
    """`minibatch_grads` takes every mini-batch's gradient at one θ (no step), its norms are the
    gradient vectors' norms, and at ρ = 1 the token-weighted mean of the mini-batch gradients is the
    whole batch's: the scatter identity notebook 07's Eq. 14 row uses holds for explicit vectors."""
    from cancellation import batching
    model = fresh
    cfg = grpo.UpdateConfig(optimizer="adam", lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    plan = batching.random(batch.group, 3, seed=0)
    infos = grpo.minibatch_grads(model, batch, plan, cfg)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    old = measure.token_stats(model, batch, KNOBS).logp
    params = list(model.parameters())

    def vec(rows):
        model.zero_grad(set_to_none=True)
        grpo.accumulate_grad(model, batch, rows, old, grpo.reweight_advantage(batch, cfg.reweight), cfg)
        return torch.cat([p.grad.flatten() for p in params if p.grad is not None])

    g_b = [vec(r) for r in plan]
    g = vec(torch.arange(len(batch)))
    w = torch.tensor([float(batch.response_mask[r].sum()) for r in plan], dtype=torch.float64)
    w = w / w.sum()
    assert [i["n_tokens"] for i in infos] == [int(batch.response_mask[r].sum()) for r in plan]
    for info, v in zip(infos, g_b):
        assert info["grad_norm"] == pytest.approx(float(v.norm()), rel=1e-10)
    assert torch.allclose(sum(wi * v for wi, v in zip(w, g_b)), g, rtol=1e-9, atol=1e-12 * float(g.abs().max()))
    scatter = float(sum(wi * (v - g).pow(2).sum() for wi, v in zip(w, g_b)))
    via_norms = float(w @ torch.tensor([i["grad_norm"] ** 2 for i in infos], dtype=torch.float64)) - float(g.norm()) ** 2
    assert via_norms == pytest.approx(scatter, rel=1e-8)
    assert scatter > 0


def test_shared_energy_matches_explicit_per_rollout_scores(fresh, batch):
    """Eq. 14's shared-direction noise against a brute-force computation: each rollout's score G_i =
    Σ_t ∇log π(y_{i,t}) by its own backward, c_g their mean over group g, s_B = −(1/T_B) Σ_g S_{B,g} c_g,
    and Σ_B (T_B/T)||s_B||², both ways (the groups' Gram matrix; one weighted backward per mini-batch). Also: −(1/T_B) Σ_{i∈B} A_i G_i is the mini-batch gradient grpo_step takes (the
    scores are the ones the update uses), and QB's mini-batches (whole groups) carry none of it."""
    from cancellation import batching
    model = fresh
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=1e-2)
    params = list(model.parameters())
    old = measure.token_stats(model, batch, KNOBS).logp

    def score(i):
        model.zero_grad(set_to_none=True)
        r = torch.tensor([i])
        logp = grpo.token_logp(grpo.forward_logits(model, batch, r), batch.input_ids[r])
        (logp * batch.response_mask[r]).sum().backward()
        return torch.cat([p.grad.flatten() for p in params])

    G = torch.stack([score(i) for i in range(len(batch))])
    model.zero_grad(set_to_none=True)
    A, grp = batch.advantage.double(), batch.group
    c = {g: G[grp == g].mean(0) for g in torch.unique(grp).tolist()}
    T = float(batch.response_mask.sum())
    groups, M = gram = eq14.group_score_gram(model, batch, cfg, old)    # the Gram of the c_g, from grpo's own loss
    C = torch.stack([c[g] for g in groups.tolist()])
    assert torch.allclose(M, C @ C.T, rtol=1e-8, atol=1e-12 * float(M.abs().max()))
    for plan in (batching.random(grp, 3, seed=1), batching.sign_partitioned(A, 2, seed=0)):
        energy = 0.0
        for rows in plan:
            TB = float(batch.response_mask[rows].sum())
            S = {g: float(A[rows][grp[rows] == g].sum()) for g in torch.unique(grp[rows]).tolist()}
            s_B = -sum(S[g] * c[g] for g in S) / TB
            energy += TB / T * float(s_B.pow(2).sum())
            model.zero_grad(set_to_none=True)
            grpo.accumulate_grad(model, batch, rows, old, A, cfg)
            g_B = torch.cat([p.grad.flatten() for p in params])
            assert torch.allclose(g_B, -(A[rows, None] * G[rows]).sum(0) / TB, rtol=1e-8, atol=1e-12)
        model.zero_grad(set_to_none=True)
        assert energy > 0
        assert eq14.shared_energy(model, batch, plan, cfg, old_logp=old) == pytest.approx(energy, rel=1e-8)
        assert eq14.shared_energy(model, batch, plan, cfg, gram=gram) == pytest.approx(energy, rel=1e-8)
    qb = batching.query_preserved(grp, 3, seed=0)
    assert eq14.shared_energy(model, batch, qb, cfg) == 0.0 == eq14.shared_energy(model, batch, qb, cfg, gram=gram)
    assert eq14.group_score_gram(model, batch, cfg, max_bytes=0) is None     # over its memory budget: the other way
    assert all(p.grad is None for p in model.parameters())
