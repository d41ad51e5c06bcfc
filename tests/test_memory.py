"""Memory-bounded statistics and updates (issue 10, points 3–4): chunked == unchunked, tied heads, devices."""
import copy

import numpy as np
import pytest
import torch

from cancellation import coupling, grpo, measure, policy
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def _grads(model):
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("scope", ["full", "lm_head"])
def test_chunked_loss_gradient_equals_unchunked_autograd(fresh, batch, scope):
    """Per-token-chunk loss backward through detached hidden states == one autograd of the full loss."""
    g = torch.Generator().manual_seed(0)
    old = measure.token_stats(fresh, batch, KNOBS).logp
    old = old + 0.4 * torch.randn(old.shape, generator=g, dtype=old.dtype)   # some ratios clipped
    tw = torch.rand(batch.input_ids.shape, generator=g, dtype=torch.float64)
    w = grpo.reweight_advantage(batch, "grpo")
    rows = torch.arange(len(batch))
    out = {}
    for name, fn, cfg in [("chunked", grpo.accumulate_grad, grpo.UpdateConfig(chunk_rows=5, token_chunk=7)),
                          ("unchunked", grpo.accumulate_grad_unchunked, grpo.UpdateConfig(chunk_rows=64))]:
        m = copy.deepcopy(fresh)
        with grpo.only_grad_for(m, grpo.scope_params(m, scope)):
            m.zero_grad(set_to_none=True)
            info = fn(m, batch, rows, old, w, cfg, tw)
        out[name] = (_grads(m), info)
    (gc, ic), (gu, iu) = out["chunked"], out["unchunked"]
    assert any(x is not None and x.abs().sum() > 0 for x in gc)
    for a, b in zip(gc, gu):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max() <= 1e-12 * max(1.0, float(b.abs().max()))
    assert ic["loss"] == pytest.approx(iu["loss"], abs=1e-12)
    assert ic["clipfrac"] == iu["clipfrac"] > 0 and ic["n_tokens"] == iu["n_tokens"]
    assert ic["ratio_dev"] == pytest.approx(iu["ratio_dev"], abs=1e-12)


def test_token_stats_small_token_chunks_equal_naive_reference(model64, batch):
    fast = measure.token_stats(model64, batch, Compute(chunk_rows=5, token_chunk=7), hidden=True)
    slow = measure.token_stats_per_sequence(model64, batch)
    old = measure.token_stats_unchunked(model64, batch, Compute(chunk_rows=5), hidden=True)
    m = batch.response_mask
    assert (fast.logp[m] - slow.logp[m]).abs().max() <= 1e-10
    assert (fast.entropy[m] - slow.entropy[m]).abs().max() <= 1e-10
    assert (fast.logp[m] - old.logp[m]).abs().max() <= 1e-12
    assert (fast.entropy[m] - old.entropy[m]).abs().max() <= 1e-12
    assert torch.equal(fast.hidden, old.hidden)
    assert (fast.logp[~m] == 0).all() and (fast.entropy[~m] == 0).all()   # only response tokens are computed
    again = measure.token_stats(model64, batch, Compute(chunk_rows=5, token_chunk=7))
    assert torch.equal(again.logp, fast.logp)                             # deterministic: noise floor 0


def test_grpo_step_chunked_matches_unchunked_delta_logp(fresh, batch):
    cfg = grpo.UpdateConfig(optimizer="adam", lr=1e-2, n_minibatches=2, chunk_rows=5, token_chunk=11)
    a, b = copy.deepcopy(fresh), copy.deepcopy(fresh)
    grpo.grpo_step(a, batch, cfg, seed=3)
    grpo.grpo_step(b, batch, cfg, seed=3, unchunked=True)
    m = batch.response_mask
    la, lb = measure.token_stats(a, batch, KNOBS).logp, measure.token_stats(b, batch, KNOBS).logp
    assert (la - lb)[m].abs().max() <= 1e-10


def test_gradient_checkpointing_same_step_and_state_restored(fresh, batch):
    a, b = copy.deepcopy(fresh), copy.deepcopy(fresh)
    grpo.grpo_step(a, batch, grpo.UpdateConfig(optimizer="sgd", lr=0.5))
    calls = []
    attn = [mod for name, mod in b.named_modules() if name.endswith("self_attn")][0]
    hook = attn.register_forward_hook(lambda *_: calls.append(1))
    grpo.grpo_step(b, batch, grpo.UpdateConfig(optimizer="sgd", lr=0.5, gradient_checkpointing=True))
    hook.remove()
    n_fwd = -(-len(batch) // 64) * 2          # old_logp forward + loss forward per row chunk
    assert len(calls) == n_fwd + 1             # + the recompute in the backward: checkpointing was on
    assert not any(getattr(mod, "gradient_checkpointing", False) for mod in b.modules())
    assert not any(mod.training for mod in b.modules())
    m = batch.response_mask
    d = (measure.token_stats(a, batch, KNOBS).logp - measure.token_stats(b, batch, KNOBS).logp)[m].abs().max()
    assert d <= 1e-12


def test_lm_head_step_never_backpropagates_through_the_body(fresh, batch):
    """transformers' checkpointing leaves a hook making the embeddings' output require grad; an lm_head
    step (checkpointed or after a checkpointed step) must still not run the body's backward, and must
    move log p exactly as a step on a model that was never checkpointed."""
    ref, b = copy.deepcopy(fresh), copy.deepcopy(fresh)
    lm = dict(optimizer="sgd", lr=0.5, scope="lm_head")
    grpo.grpo_step(ref, batch, grpo.UpdateConfig(**lm))
    with grpo.trial(b, "full"):                                   # a checkpointed full step, then undone
        grpo.grpo_step(b, batch, grpo.UpdateConfig(optimizer="sgd", lr=0.5, gradient_checkpointing=True))
    assert not getattr(b, "_require_grads_hooks", None)          # the hook it added is gone
    backward_calls = []
    mlp = [mod for name, mod in b.named_modules() if name.endswith("mlp")][0]
    hook = mlp.register_full_backward_hook(lambda *_: backward_calls.append(1))
    grpo.grpo_step(b, batch, grpo.UpdateConfig(**lm, gradient_checkpointing=True))
    hook.remove()
    assert backward_calls == []
    m = batch.response_mask
    d = measure.token_stats(ref, batch, KNOBS).logp - measure.token_stats(b, batch, KNOBS).logp
    assert d[m].abs().max() <= 1e-12


# ----------------------------------------------------------------------------- tied embeddings, padded vocab
def tied_qwen3(seed=0, vocab=70):
    """A tiny Qwen3ForCausalLM with tied embeddings and a vocabulary padded past the tokenizer's 53."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=True)
    m = policy.exact_norms(Qwen3ForCausalLM(cfg).to(torch.float64))
    m.eval()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    return m


def padded_batch(batch, tok, vocab=70):
    """The shared batch with every 5th response token replaced by an id past the tokenizer."""
    b = copy.deepcopy(batch)
    r, c = b.response_mask.nonzero(as_tuple=True)
    pick = torch.arange(0, len(r), 5)
    b.input_ids[r[pick], c[pick]] = len(tok) + pick % (vocab - len(tok))
    return b


@pytest.mark.parametrize("snap_scope", ["lm_head", "full"])
def test_tied_model_is_tied_again_after_lm_head_step_and_restore(batch, tok, snap_scope):
    b = padded_batch(batch, tok)
    model, never = tied_qwen3(), tied_qwen3()
    full = grpo.UpdateConfig(optimizer="adam", lr=1e-2)
    opt = grpo.make_optimizer(model, full)                  # built before any lm_head step
    opt_never = grpo.make_optimizer(never, full)
    emb = model.model.embed_tokens.weight
    before = measure.token_stats(model, b, KNOBS).logp

    snap = grpo.snapshot(model, snap_scope)
    grpo.grpo_step(model, b, grpo.UpdateConfig(optimizer="sgd", lr=1.0, scope="lm_head"), old_logp=before)
    assert model.lm_head.weight is not emb and model.model.embed_tokens.weight is emb
    assert not torch.equal(model.lm_head.weight, emb)     # a separate copy moved; the embedding did not
    assert not torch.equal(measure.token_stats(model, b, KNOBS).logp, before)
    grpo.restore(model, snap)
    assert model.lm_head.weight is emb and model.model.embed_tokens.weight is emb
    assert model.config.tie_word_embeddings is True
    assert torch.equal(measure.token_stats(model, b, KNOBS).logp, before)

    # a later full step with the optimizer made before == the same step on a model that never had one
    grpo.grpo_step(model, b, full, optimizer=opt)
    grpo.grpo_step(never, b, full, optimizer=opt_never)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    after, after_never = measure.token_stats(model, b, KNOBS).logp, measure.token_stats(never, b, KNOBS).logp
    assert not torch.equal(after, before)
    assert torch.equal(after - before, after_never - before)


def test_padded_token_ids_get_placeholder_strings(batch, tok):
    b = padded_batch(batch, tok)
    model = tied_qwen3()
    s = measure.token_stats(model, b, KNOBS)
    df = measure.token_table(b, s, s, tokenizer=tok)
    pad = df.token_id >= len(tok)
    assert pad.any() and (~pad).any()
    assert list(df.token[pad]) == [f"<pad:{i}>" for i in df.token_id[pad]]
    assert list(df.token[~pad]) == tok.convert_ids_to_tokens(df.token_id[~pad].tolist())
    assert list(measure.token_strings(tok, [0, len(tok), 69])[1:]) == [f"<pad:{len(tok)}>", "<pad:69>"]


def test_token_table_accepts_device_stats_and_coupling_indices_follow_features(model64, batch):
    """On CPU this checks the plumbing (.cpu() before numpy, index devices); the gpu tests run it on CUDA."""
    s = measure.token_stats(model64, batch, KNOBS, hidden=True)
    f = coupling.features(model64, batch, s)
    cands, sets = coupling.masking_sets(f, 3, 2, seed=0)
    assert cands.device == f.h.device and all(v.device == f.h.device for v in sets.values())
    st = coupling.boost_stats(torch.tensor([0.1, -0.2, 0.3]), n_boot=10)
    assert st["n"] == 3


# ----------------------------------------------------------------------------- CUDA against CPU
gpu = pytest.mark.gpu


def _exact(model):
    """A copy with float64 rotary tables: transformers' float32 tables differ by an ulp between CPU and CUDA."""
    return policy.exact_rope(copy.deepcopy(model))


def _cuda(model):
    return _exact(model).to("cuda")


@gpu
def test_gpu_token_stats_and_table_match_cpu(model64, batch, tok):
    cpu = measure.token_stats(_exact(model64), batch, Compute(chunk_rows=5, token_chunk=7), hidden=True)
    gpu_ = measure.token_stats(_cuda(model64), batch, Compute(chunk_rows=5, token_chunk=7), hidden=True)
    m = batch.response_mask
    assert (cpu.logp[m] - gpu_.logp[m]).abs().max() <= 1e-10
    assert (cpu.entropy[m] - gpu_.entropy[m]).abs().max() <= 1e-10
    dev = measure.TokenStats(gpu_.logp.cuda(), gpu_.entropy.cuda())
    df = measure.token_table(batch, dev, dev, tokenizer=tok)
    assert len(df) == batch.n_tokens


@gpu
@pytest.mark.parametrize("scope", ["full", "lm_head"])
def test_gpu_grpo_step_matches_cpu(fresh, batch, scope):
    cfg = grpo.UpdateConfig(optimizer="sgd", lr=0.5, scope=scope, chunk_rows=5, token_chunk=7)
    fresh = policy.exact_rope(fresh)
    g = _cuda(fresh)
    before = measure.token_stats(fresh, batch, KNOBS).logp
    grpo.grpo_step(fresh, batch, cfg, old_logp=before)
    grpo.grpo_step(g, batch, cfg, old_logp=before)
    m = batch.response_mask
    d_cpu = measure.token_stats(fresh, batch, KNOBS).logp - before
    d_gpu = measure.token_stats(g, batch, KNOBS).logp - before
    assert d_cpu[m].abs().max() > 1e-4
    assert (d_cpu - d_gpu)[m].abs().max() <= 1e-10


@gpu
def test_gpu_coupling_kernel_and_masked_effects_match_cpu(model64, batch):
    model64 = _exact(model64)
    fc = coupling.features(model64, batch, compute=KNOBS)
    g = _cuda(model64)
    fg = coupling.features(g, batch, compute=KNOBS)
    J = torch.arange(min(40, len(fc)))
    kc, kg = coupling.kernel(fc, J, J, chunk=16, vocab_chunk=16), coupling.kernel(fg, J, J, chunk=16, vocab_chunk=16)
    assert kg.device.type == "cuda"
    assert (kc - kg.cpu()).abs().max() <= 1e-10 * kc.abs().max()
    assert (coupling.first_order_delta(fc, 0.1) - coupling.first_order_delta(fg, 0.1).cpu()).abs().max() <= 1e-12
    cc, sc = coupling.masking_sets(fc, 3, 2, seed=0)
    cg, sg = coupling.masking_sets(fg, 3, 2, seed=0)
    assert torch.equal(cc, cg.cpu()) and all(torch.equal(sc[k], sg[k].cpu()) for k in sc)
    ec = coupling.masked_effects_lm_head(fc, cc, sc["both"], 0.1)
    eg = coupling.masked_effects_lm_head(fg, cg, sg["both"], 0.1)
    assert (ec - eg.cpu()).abs().max() <= 1e-10
    assert np.isfinite(coupling.boost_stats(eg, n_boot=10)["mean_boost"])
    top = coupling.top_coupled_sets(fg, cg, 2)
    assert torch.equal(top.cpu(), coupling.top_coupled_sets(fc, cc, 2))
    fe = coupling.masked_effects_full(g, batch, fg, cg[:1], sg["both"][:1], 0.1, compute=KNOBS)
    fe_cpu = coupling.masked_effects_full(copy.deepcopy(model64), batch, fc, cc[:1], sc["both"][:1], 0.1,
                                         compute=KNOBS)
    assert (fe - fe_cpu).abs().max() <= 1e-9


def test_exact_rope_tables_are_float64_closed_form(model64):
    """policy.exact_rope: cos/sin equal cos(pos·inv_freq) in float64; the stock tables are float32-rounded."""
    m = copy.deepcopy(model64)
    rot = next(x for x in m.modules() if type(x).__name__.endswith("RotaryEmbedding"))
    x, pos = torch.zeros(1, dtype=torch.float64), torch.arange(200)[None]
    inv = rot.inv_freq.double()
    want = torch.cat([pos[0, :, None] * inv, pos[0, :, None] * inv], -1)
    stock_cos, _ = rot(x, pos)
    policy.exact_rope(m)
    cos, sin = rot(x, pos)
    assert (cos[0] - torch.cos(want)).abs().max() <= 1e-15 and (sin[0] - torch.sin(want)).abs().max() <= 1e-15
    assert (stock_cos[0] - torch.cos(want)).abs().max() > 1e-9      # float32 tables: the gap exact_rope closes
    assert rot(x.float(), pos)[0].dtype == torch.float32            # other dtypes keep the stock path
