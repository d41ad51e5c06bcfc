"""The static-cache sampler (cancellation.decode_static): same draws as the eager DynamicCache loop on CPU,
stop handling, padding rows that never leak; on CUDA the captured decode step against the eager static
step and against teacher-forced log-probs."""
import pytest
import torch

from cancellation import decode_common, decode_lean, decode_static, measure, policy, rollout, sampler
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def _batch(V, rows=12, P=9, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, min(V, 60), (rows, P), generator=g)
    mask = torch.ones_like(ids)
    mask[3:6, :4] = 0          # left padding on some rows
    ids[3:6, :4] = 0
    return ids.to(device), mask.to(device)


@pytest.fixture(scope="module")
def tiny():
    model, tok = policy.load_policy("data/policies/tiny-m")
    return model.double(), tok


@pytest.mark.parametrize("T", [1, 7, 60])
def test_static_eager_draws_the_eager_paths_tokens(tiny, T):
    """One seed, float64: the static cache run eagerly with the multinomial draw gives exactly the
    tokens of sampler.generate's DynamicCache loop, and leaves the generator in the same state."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size)
    stop = rollout.stop_ids(tok, model)
    ga, gb = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = sampler.generate(model, ids, mask, T, 1.0, stop, tok.pad_token_id, generator=ga, static=False,
                         token_chunk=KNOBS.token_chunk)
    b = decode_static.generate_static(model, ids, mask, T, 1.0, stop, tok.pad_token_id, generator=gb,
                                      token_chunk=KNOBS.token_chunk)
    assert a.shape == b.shape and torch.equal(a, b)
    assert torch.equal(ga.get_state(), gb.get_state())     # the next chunk's draws are unchanged too


def test_stops_at_any_stop_id_and_pads_after(tiny):
    """Each row ends at the first of the stop ids (here a frequent token added as a second stop):
    nothing but pad after it, the run ends when every row has stopped, and the stop token is kept."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size)
    free = sampler.generate(model, ids, mask, 40, 1.0, [-1], tok.pad_token_id, generator=torch.Generator().manual_seed(1),
                            static=False, token_chunk=KNOBS.token_chunk)
    common = int(torch.mode(free.flatten()).values)          # a token most rows draw early
    stop = [tok.eos_token_id, common]
    out, lp = decode_static.generate_static(model, ids, mask, 40, 1.0, stop, tok.pad_token_id,
                                            generator=torch.Generator().manual_seed(1), draw="icdf", return_logprobs=True,
                                            token_chunk=KNOBS.token_chunk)
    is_stop = torch.isin(out, torch.tensor(stop))
    assert is_stop.any(1).all() or out.shape[1] == 40
    for r in range(len(out)):
        hit = is_stop[r].nonzero()
        if len(hit):
            k = int(hit[0])
            assert (out[r, k + 1:] == tok.pad_token_id).all() and (lp[r, k + 1:] == 0).all()
    if is_stop.any(1).all():  # stopped early: the last column holds some row's stop token
        last = torch.stack([is_stop[r].nonzero()[0, 0] for r in range(len(out))]).max()
        assert out.shape[1] == int(last) + 1


def test_padding_rows_never_leak(tiny):
    """Bucket padding (extra rows copied from row 0) changes nothing for the real rows: the same
    tokens and log-probs as without padding, and only the real rows come back."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size, rows=5)
    stop = rollout.stop_ids(tok, model)
    kw = dict(generator=None, draw="icdf", return_logprobs=True, token_chunk=KNOBS.token_chunk)
    a, la = decode_static.generate_static(model, ids, mask, 30, 1.0, stop, tok.pad_token_id, **kw)
    b, lb = decode_static.generate_static(model, ids, mask, 30, 1.0, stop, tok.pad_token_id, pad_rows=8, **kw)
    assert b.shape[0] == 5 and torch.equal(a, b) and torch.allclose(la, lb, atol=1e-12, rtol=0)


def test_graph_shapes_run_eagerly_draw_the_same_tokens(tiny):
    """What the CUDA graph computes (row and length buckets, the whole 256-rounded cache attended,
    no compaction), run eagerly on the CPU in float64: the same tokens and log-probs as the eager
    path's live-columns attention with compaction."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size, rows=6)
    stop = rollout.stop_ids(tok, model)
    kw = dict(generator=None, draw="icdf", return_logprobs=True, token_chunk=KNOBS.token_chunk)
    a, la = decode_static.generate_static(model, ids, mask, 40, 1.0, stop, tok.pad_token_id, **kw)
    b, lb = decode_static.generate_static(model, ids, mask, 40, 1.0, stop, tok.pad_token_id, graph_shapes=True, **kw)
    assert torch.equal(a, b) and torch.allclose(la, lb, atol=1e-12, rtol=0)


def test_icdf_logprobs_are_teacher_forced_logprobs(tiny):
    """The recorded log π of each drawn token equals a teacher-forced forward of prompt + response
    (measure.token_stats, float64), an independent computation."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size, rows=6)
    stop = rollout.stop_ids(tok, model)
    out, lp = decode_static.generate_static(model, ids, mask, 20, 1.0, stop, tok.pad_token_id,
                                            generator=torch.Generator().manual_seed(5), draw="icdf", return_logprobs=True,
                                            token_chunk=KNOBS.token_chunk)
    batch = rollout.assemble(tok, [None] * 6, ids, mask, out, 1, verifier=lambda p, t: 0.0, stop=stop)
    st = measure.token_stats(model, batch, KNOBS)
    resp = batch.response_mask
    got = lp[resp[:, ids.shape[1]:]]
    want = st.logp[resp]
    assert torch.allclose(got.double(), want.double(), atol=2e-6), (got - want).abs().max()


def test_icdf_law_matches_softmax():
    """The inverse-CDF draw is exact in law: 200k draws from a fixed 5-token distribution match its
    probabilities (chi-square well inside its 1e-4 tail)."""
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0]]).expand(200_000, 5)
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tok = decode_common.draw_icdf(logits, 1.0, u)
    p = torch.softmax(logits[0].double(), 0)
    n = torch.bincount(tok, minlength=5).double()
    chi2 = float(((n - 200_000 * p) ** 2 / (200_000 * p)).sum())
    assert chi2 < 23.5    # chi-square, 4 degrees of freedom: P(> 23.5) ≈ 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_captured_equals_static_eager_on_cuda(dtype, standin_model):
    """One seed: the CUDA-graph decode step draws the same tokens (and log-probs) as the same static
    step run eagerly, also on a second call that reuses the captured graph with another prompt length."""
    from cancellation import scale
    model = scale.build("qwen3-1.7b", dtype=dtype, device="cuda") if dtype == torch.bfloat16 else \
        policy.load_policy(standin_model)[0].to("cuda")
    V = model.config.vocab_size
    for P in (9, 14):
        ids, mask = _batch(V, rows=12, P=P, device="cuda")
        # eager with the graph's shapes: the same 16 rows and whole cache (bf16 attention rounds
        # differently over other lengths)
        kw = dict(draw="icdf", return_logprobs=True, pad_rows=16)
        a, la = decode_static.generate_static(model, ids, mask, 48, 1.0, [-1], 0, torch.Generator("cuda").manual_seed(2),
                                              capture=False, graph_shapes=True, **kw)
        b, lb = decode_static.generate_static(model, ids, mask, 48, 1.0, [-1], 0, torch.Generator("cuda").manual_seed(2),
                                              capture=True, **kw)
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_logprobs_are_teacher_forced_on_cuda(standin_model):
    """float32 on CUDA: the captured sampler's recorded log-probs equal a teacher-forced forward."""
    model, tok = policy.load_policy(standin_model)
    model = model.to("cuda")
    ids, mask = _batch(model.config.vocab_size, rows=10, device="cuda")
    stop = rollout.stop_ids(tok, model)
    out, lp = decode_static.generate_static(model, ids, mask, 24, 1.0, stop, tok.pad_token_id,
                                            torch.Generator("cuda").manual_seed(4), capture=True, return_logprobs=True,
                                            token_chunk=KNOBS.token_chunk)
    batch = rollout.assemble(tok, [None] * 10, ids.cpu(), mask.cpu(), out.cpu(), 1, verifier=lambda p, t: 0.0, stop=stop)
    st = measure.token_stats(model, batch.to("cuda"), KNOBS)
    resp = batch.response_mask
    got, want = lp.cpu()[resp[:, ids.shape[1]:]], st.logp.cpu()[resp]
    assert torch.allclose(got.double(), want.double(), atol=1e-3), (got - want).abs().max()


# --------------------------------------------------------------------------- the lean CPU decode step
def _body_steps(model, ids, mask, toks):
    """The hidden states the DynamicCache loop feeds the LM head: prefill, then one body forward per
    token column of `toks` (rows, n), the 2-D mask grown by a column of ones each step."""
    from transformers import DynamicCache
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    h, kv = decode_common.last_hidden(model, DynamicCache(), input_ids=ids, attention_mask=mask, position_ids=pos)
    next_pos, hs = pos[:, -1] + 1, []
    for j in range(toks.shape[1]):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        h, kv = decode_common.last_hidden(model, kv, input_ids=toks[:, j:j + 1], attention_mask=mask,
                                          position_ids=next_pos[:, None])
        next_pos = next_pos + 1
        hs.append(h)
    return hs


def _lean_steps(model, ids, mask, toks, drop_after=None, done=None):
    """The same hidden states from decode_lean.LeanStep (optionally dropping the rows `done` from the
    cache and the attention after step `drop_after`)."""
    from transformers import DynamicCache
    B, P = ids.shape
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    _, kv = decode_common.last_hidden(model, DynamicCache(), input_ids=ids, attention_mask=mask, position_ids=pos)
    step = decode_lean.LeanStep(model)
    step.fill(kv, P + toks.shape[1])
    m = None
    if not bool(mask.bool().all()):
        m = torch.ones(B, 1, 1, P + toks.shape[1], dtype=torch.bool)
        m[:, 0, 0, :P] = mask.bool()
    next_pos, hs = pos[:, -1:] + 1, []
    for j in range(toks.shape[1]):
        if j == drop_after:
            m = step.drop(done, m)
        hs.append(step(toks[:, j], next_pos, P + j, m))
        next_pos = next_pos + 1
    return hs


@pytest.fixture(scope="module")
def standin(standin_model):
    return policy.load_policy(standin_model)


@pytest.mark.parametrize("which", ["tiny-m float64", "stand-in float32"])
@pytest.mark.parametrize("padded", [True, False])
def test_lean_step_is_the_body_forward_bit_for_bit(tiny, standin, which, padded):
    """The lean step's hidden states equal the body forward's over a DynamicCache exactly (Qwen2 in
    float64; Qwen3 with its q/k norms and grouped-query attention in float32), with and without a
    padding mask (no mask: SDPA's grouped-query path, as transformers takes it)."""
    model = tiny[0] if which.startswith("tiny") else standin[0]
    ids, mask = _batch(model.config.vocab_size, rows=7)
    if not padded:
        mask = torch.ones_like(mask)
    toks = torch.randint(3, 50, (7, 9), generator=torch.Generator().manual_seed(1))
    for a, b in zip(_body_steps(model, ids, mask, toks), _lean_steps(model, ids, mask, toks)):
        assert torch.equal(a, b)


def test_lean_drop_keeps_the_live_rows_bit_for_bit(tiny):
    """Rows leaving the cache and the attention (LeanStep.drop) change nothing for the rows that stay, on one
    thread (the notebooks'; on two, CPU attention rounds a row by the batch's size, so `_lean_loop` drops rows
    on one thread only)."""
    model, _ = tiny
    ids, mask = _batch(model.config.vocab_size, rows=8)
    toks = torch.randint(3, 50, (8, 8), generator=torch.Generator().manual_seed(2))
    done = torch.tensor([0, 1, 1, 0, 0, 1, 0, 0], dtype=torch.bool)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        full = _lean_steps(model, ids, mask, toks)
        dropped = _lean_steps(model, ids, mask, toks, drop_after=3, done=done)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(full, dropped):
        assert torch.equal(a[~done], b[~done]) and torch.isfinite(b).all()


@pytest.mark.parametrize("T", [1, 7, 60])
def test_lean_generate_draws_the_loops_tokens(tiny, T):
    """sampler.generate on a CPU (the lean step) against its DynamicCache loop (lean=False): the same
    tokens with stops, and the generator left in the same state."""
    model, tok = tiny
    ids, mask = _batch(model.config.vocab_size, rows=12)
    stop = rollout.stop_ids(tok, model)
    ga, gb = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = sampler.generate(model, ids, mask, T, 1.0, stop, tok.pad_token_id, generator=ga, lean=False,
                         token_chunk=KNOBS.token_chunk)
    b = sampler.generate(model, ids, mask, T, 1.0, stop, tok.pad_token_id, generator=gb, token_chunk=KNOBS.token_chunk)
    assert decode_lean.lean_supported(model)
    assert a.shape == b.shape and torch.equal(a, b) and not b.is_inference()
    assert torch.equal(ga.get_state(), gb.get_state())


@pytest.mark.parametrize("which", ["tiny-m float64", "stand-in float32"])
def test_static_eager_lean_step_is_the_body_forward(tiny, standin, which):
    """generate_static's eager step (Monte Carlo continuations: inverse-CDF draws from per-row uniforms,
    a prefill shared by `repeats` rows, budgets, first-token bans, compaction of stopped rows) through the
    lean step (the CPU default) draws the tokens and log-probs of the body's module forward (lean=False)
    bit for bit, on Qwen2 in float64 and Qwen3 (q/k norms, grouped-query attention) in float32; and
    rows do stop and leave (compaction ran)."""
    model, tok = tiny if which.startswith("tiny") else standin
    ids, mask = _batch(model.config.vocab_size, rows=6)
    M, T = 5, 40
    stop = rollout.stop_ids(tok, model)
    U = torch.rand(T, 6 * M, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    budgets = torch.tensor([40, 3, 25, 40, 1, 12]).repeat_interleave(M)
    bans = torch.tensor([-1, 7, -1, 5, -1, -1]).repeat_interleave(M)
    kw = dict(token_chunk=KNOBS.token_chunk, draw="icdf", repeats=M, uniforms=U, budgets=budgets, bans=bans,
              return_logprobs=True)
    a, la = decode_static.generate_static(model, ids, mask, T, 1.0, stop, tok.pad_token_id, lean=False, **kw)
    b, lb = decode_static.generate_static(model, ids, mask, T, 1.0, stop, tok.pad_token_id, **kw)
    assert decode_lean.lean_supported(model)
    assert torch.equal(a, b) and torch.equal(la, lb)
    lengths = (b != tok.pad_token_id).sum(1)
    assert lengths.min() <= 3 and lengths.max() > 12   # budgets stopped rows early, others ran on
