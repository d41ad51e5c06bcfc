"""Coupling kernel, first-order prediction and masked updates against independent computations
(autograd per-token gradients, dense brute force, re-running the whole SGD step) on the real tiny-m."""
import numpy as np
import pytest
import torch

from cancellation import coupling, grpo, measure, policy, rollout, sources, tasks
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify


@pytest.fixture(scope="module")
def tiny():
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float64")  # float64 norms included
    b = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=4, G=4, max_new_tokens=48, source=RAW),
                       problems=tasks.sample_problems(4, seed=11), seed=11)
    # real sampled tokens; rewards set so every group is mixed (independent of the policy's luck)
    b.reward = torch.tensor([1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    return model, b


@pytest.fixture(scope="module")
def feats(tiny):
    model, b = tiny
    return coupling.features(model, b, compute=KNOBS)


def test_features_reproduce_training_logp(feats):
    lp = (feats.h * feats.W[feats.o]).sum(-1) - feats.lse
    assert torch.allclose(lp, feats.logp, atol=1e-12)


def test_kernel_equals_autograd_lm_head_gradients(tiny, feats):
    """K_jk = ⟨h_j,h_k⟩φ_jk equals ⟨g_j, g_k⟩_F of autograd gradients d log π_j(o_j) / d W_lm."""
    model, b = tiny
    idx = torch.arange(0, len(feats), max(1, len(feats) // 40))[:40]
    W = grpo.lm_head_param(model)
    with grpo.only_grad_for(model, [W]):
        logp = measure.token_logp(measure.forward_logits(model, b), b.input_ids)
        grads = torch.stack([torch.autograd.grad(logp[feats.rows[j], feats.cols[j]], W, retain_graph=True)[0].flatten()
                             for j in idx.tolist()])
    ref = grads @ grads.T
    K = coupling.kernel(feats, idx, idx)
    assert torch.allclose(K, ref, rtol=1e-9, atol=1e-10 * float(ref.abs().max()))
    cos = coupling.kernel(feats, idx, idx, cosine=True)
    n = grads.norm(dim=1)
    assert torch.allclose(cos, ref / n[:, None] / n[None, :], atol=1e-9)


def test_chunked_equals_unchunked(feats):
    J, K = torch.arange(0, 90), torch.arange(30, 170)
    big = coupling.kernel(feats, J, K, chunk=10**6, vocab_chunk=10**6)
    small = coupling.kernel(feats, J, K, chunk=7, vocab_chunk=5)
    assert torch.allclose(big, small, rtol=1e-12, atol=1e-12 * float(big.abs().max()))
    # φ by its own dense definition (e_o − π)·(e_o − π), V-dim vectors materialised here only
    pi = torch.softmax(feats.h @ feats.W.T, -1)
    r = torch.nn.functional.one_hot(feats.o, pi.shape[1]).double() - pi
    dense = (feats.h @ feats.h.T) * (r @ r.T)
    assert torch.allclose(big, dense[J][:, K], rtol=1e-9, atol=1e-12 * float(big.abs().max()))
    # matrix-vector product, selected pairs and the diagonal against the dense kernel
    a = feats.A
    assert torch.allclose(coupling.kernel_matvec(feats, a, chunk=13, vocab_chunk=6), dense @ a, rtol=1e-9, atol=1e-9)
    j, k = torch.tensor([0, 5, 9, 40]), torch.tensor([3, 5, 100, 41])
    pt = coupling.pair_terms(feats, j, k, chunk=3, vocab_chunk=4)
    assert torch.allclose(pt["kernel"], dense[j, k], rtol=1e-9, atol=1e-12)
    assert torch.allclose(coupling.self_kernel(feats, chunk=11, vocab_chunk=9), dense.diagonal(), rtol=1e-9)


def test_entropy_bin_means_brute_force(feats):
    pi = torch.softmax(feats.h @ feats.W.T, -1)
    r = torch.nn.functional.one_hot(feats.o, pi.shape[1]).double() - pi
    C = ((feats.h @ feats.h.T) * (r @ r.T) * feats.A[None, :]).numpy()
    bins = (torch.arange(len(feats)) % 3).numpy()
    signed, absolute = coupling.entropy_bin_means(feats, torch.as_tensor(bins), 3, chunk=17, vocab_chunk=7)
    for x in range(3):
        for y in range(3):
            jj, kk = np.nonzero(bins == x)[0], np.nonzero(bins == y)[0]
            block = C[np.ix_(jj, kk)]
            keep = jj[:, None] != kk[None, :]
            assert signed[x, y].item() == pytest.approx(block[keep].mean(), rel=1e-9)
            assert absolute[x, y].item() == pytest.approx(np.abs(block[keep]).mean(), rel=1e-9)


def test_pair_kind_terms_brute_force(feats):
    """Own / same-token / different-token split of Σ_k A_k K_jk against a loop over every pair of the
    dense kernel, and the split's sum against kernel_matvec."""
    pi = torch.softmax(feats.h @ feats.W.T, -1)
    r = torch.nn.functional.one_hot(feats.o, pi.shape[1]).double() - pi
    K = ((feats.h @ feats.h.T) * (r @ r.T)).numpy()
    A, o = feats.A.numpy(), feats.o.numpy()
    t = coupling.pair_kind_terms(feats, chunk=19, vocab_chunk=11)
    for j in range(0, len(feats), 7):
        want = dict(own=0.0, same=0.0, different=0.0, abs_same=0.0, abs_different=0.0)
        for k in range(len(feats)):
            c = A[k] * K[j, k]
            kind = "own" if k == j else "same" if o[k] == o[j] else "different"
            want[kind] += c
            if kind != "own":
                want["abs_" + kind] += abs(c)
        for name, v in want.items():
            assert t[name][j].item() == pytest.approx(v, rel=1e-9, abs=1e-12), (j, name)
    total = t["own"] + t["same"] + t["different"]
    assert torch.allclose(total, coupling.kernel_matvec(feats, feats.A), rtol=1e-9, atol=1e-12)


def test_lm_head_grad_closed_form_equals_grpo_loss_grad(tiny, feats):
    """At ρ = 1 the clipped token-mean loss has the gradient −(1/N) Σ A_k g_k: compare with grpo's backward."""
    model, b = tiny
    W = grpo.lm_head_param(model)
    old = measure.token_stats(model, b, KNOBS).logp
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.1, scope="lm_head")
    model.zero_grad(set_to_none=True)
    with grpo.only_grad_for(model, [W]):
        grpo.accumulate_grad(model, b, torch.arange(len(b)), old, b.advantage, cfg)
    ref = W.grad.clone()
    model.zero_grad(set_to_none=True)
    ours = coupling.lm_head_grad(feats, vocab_chunk=7)
    assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-12 * float(ref.abs().max()))


def test_first_order_prediction_matches_tiny_sgd_step(tiny, feats):
    model, b = tiny
    lr = 1e-4
    snap = grpo.snapshot(model, "lm_head")
    old = measure.token_stats(model, b, KNOBS).logp
    grpo.grpo_step(model, b, grpo.UpdateConfig(optimizer="sgd", lr=lr, scope="lm_head"), old_logp=old)
    delta = (measure.token_stats(model, b, KNOBS).logp - old)[feats.rows, feats.cols]
    grpo.restore(model, snap)
    pred = coupling.first_order_delta(feats, lr, chunk=50, vocab_chunk=9)
    # the second-order remainder is O(lr²): relative error ~1e-4 here, a wrong N/sign/η would be O(1)
    assert float((delta - pred).abs().max()) < 1e-3 * float(pred.abs().max())
    assert float(pred.abs().max()) > 1e-9


@pytest.mark.parametrize("scope", ["lm_head", "full"])
def test_masked_shortcut_equals_rerunning_the_masked_step(tiny, feats, scope):
    model, b = tiny
    cands, sets = coupling.masking_sets(feats, 2, 3, low_quantile=0.6, seed=0)
    Ms = [sets["both"][0], sets["random"][1]]
    lr = 0.1
    before = [p.detach().clone() for p in model.parameters()]
    if scope == "lm_head":
        fast = coupling.masked_effects_lm_head(feats, cands, Ms, lr)
    else:
        fast = coupling.masked_effects_full(model, b, feats, cands, Ms, lr, compute=KNOBS)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # model left unchanged
    slow = torch.tensor([coupling.masked_effect_bruteforce(model, b, int(c), M, feats, lr, scope=scope,
                                                          compute=KNOBS)
                         for c, M in zip(cands, Ms)], dtype=torch.float64)
    assert torch.allclose(fast, slow, rtol=1e-7, atol=1e-13), (fast, slow)
    assert float(slow.abs().min()) > 1e-10   # the masks do move the candidates


def test_masking_sets_respect_their_definitions(feats):
    cands, sets = coupling.masking_sets(feats, 5, 3, low_quantile=0.6, seed=1)
    thr = torch.quantile(feats.p[feats.A != 0], 0.6)
    for i, c in enumerate(cands.tolist()):
        for kind, M in sets.items():
            M = M[i]
            assert len(M) == 3 and c not in M.tolist() and bool((feats.A[M] != 0).all())
            if kind in ("same", "both"):
                assert bool((feats.o[M] == feats.o[c]).all())
            if kind in ("lowconf", "both"):
                assert bool((feats.p[M] < thr).all())


def test_exact_norms_make_float64_gradients_linear_in_token_weights(tiny, feats):
    """The masked shortcut relies on ∇L(w) being linear in the token weights w. transformers'
    float32-only RMSNorm breaks that at ~1e-4 relative in a float64 model; exact_norms restores it."""
    model, b = tiny
    old = measure.token_stats(model, b, KNOBS).logp
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.1)
    params = list(model.parameters())

    def grad(tw):
        model.zero_grad(set_to_none=True)
        grpo.accumulate_grad(model, b, torch.arange(len(b)), old, b.advantage, cfg, token_weight=tw)
        return torch.cat([p.grad.flatten() for p in params])

    one = torch.ones(b.input_ids.shape, dtype=torch.float64)
    j = int(torch.argmax(feats.A.abs() * (1 - feats.p)))   # an uncertain token with a real weight
    k = coupling._token_weight(b, feats, torch.tensor([j]))
    full = grad(one)
    err = (full - grad(one - k) - grad(k)).abs().max() / full.abs().max()
    model.zero_grad(set_to_none=True)
    assert float(err) < 1e-12   # float32 norms: ~1e-8


def test_top_coupled_sets_take_ties_in_token_order(feats, monkeypatch):
    """Fig. 3(c)'s top-k: against a brute-force ranking (K rounded at TIE_RTOL, then token order) on real
    features, and on a kernel whose ties carry round-off: the same tokens whichever tied entry got the
    last bit (torch.topk left that to the round-off, and tied tokens' advantages can have opposite signs)."""
    cands = torch.arange(0, len(feats), max(1, len(feats) // 7))[:7]
    top = coupling.top_coupled_sets(feats, cands, 5)
    K = coupling.kernel(feats, cands, None)
    for row, c in enumerate(cands.tolist()):
        keep = [k for k in range(len(feats)) if k != c and float(feats.A[k]) != 0]
        scale = max(abs(float(K[row, k])) for k in keep)
        want = sorted(keep, key=lambda k: (-round(float(K[row, k]) / (scale * coupling.TIE_RTOL)), k))[:5]
        assert top[row].tolist() == want
    f = coupling.Features(**{**feats.__dict__, "A": torch.ones_like(feats.A)})
    n = len(f)
    for bump in (2, 3):   # which of the tied tokens 2, 3, 4 carries a round-off excess
        k = torch.full((1, n), -5.0, dtype=torch.float64)
        k[0, 2:5] = 100.0
        k[0, bump] = 100.0 * (1 + 4e-16)
        k[0, 7] = 100.0 * (1 - 1e-6)           # a distinct value just below the tie: ranked after it
        monkeypatch.setattr(coupling, "kernel", lambda *a, k=k, **kw: k.clone())
        assert coupling.top_coupled_sets(f, torch.tensor([0]), 4).tolist() == [[2, 3, 4, 7]]
