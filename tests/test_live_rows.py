"""The lean sampler's live-rows lever (issue 52): once rows stop, every decode op runs on the live rows
(rounded up to a multiple of 4), at the row counts a probe on this machine showed to give the full batch's
floats; the tokens and the generator's state stay those of the sampler without the lever, bit for bit."""
import pytest
import torch

from cancellation import bench_sampling, decode_common, decode_lean, policy, rollout, sampler
from cancellation.compute import Compute

KNOBS = Compute()


@pytest.fixture(autouse=True)
def one_thread():
    """The lever runs on one thread only (the notebooks sample on one): on more, the guard keeps all rows."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["float64", "float32"])
def tiny(request):
    return policy.load_policy("data/policies/tiny-m", dtype=request.param)


def _count_calls(monkeypatch, name):
    """Count the calls of LeanStep.<name> (still calling it)."""
    calls = []
    orig = getattr(decode_lean.LeanStep, name)

    def spy(self, *a, **k):
        calls.append(len(a[0]))
        return orig(self, *a, **k)
    monkeypatch.setattr(decode_lean.LeanStep, name, spy)
    return calls


def _lean(model, ids, mask, T, stop, pad, seed, live_rows=True):
    g = torch.Generator().manual_seed(seed)
    out = decode_lean.generate_lean(model, ids, mask, T, 1.0, stop, pad, generator=g, token_chunk=KNOBS.token_chunk,
                                    live_rows=live_rows)
    return out, g.get_state()


@pytest.mark.parametrize("seed", [0, 3])
def test_live_rows_draw_todays_tokens_at_the_notebook_shapes(tiny, seed, monkeypatch):
    """tiny-m in float64 and float32, 64 rows of rendered prompts (8 problems x 8, left-padded, as
    bench_sampling.cpu_prompts builds them), up to 96 new tokens: the same tokens and generator state with the
    lever as without it; and the lever ran (rows narrowed) wherever the probe accepted a row count."""
    model, tok = tiny
    ids, mask = bench_sampling.cpu_prompts("tiny", model, tok, 64)
    stop = rollout.stop_ids(tok, model)
    narrowed = _count_calls(monkeypatch, "narrow")
    a, ga = _lean(model, ids, mask, 96, stop, tok.pad_token_id, seed, live_rows=False)
    assert not narrowed
    b, gb = _lean(model, ids, mask, 96, stop, tok.pad_token_id, seed)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    lengths = (b != tok.pad_token_id).sum(1)
    assert lengths.min() < lengths.max()   # rows stopped at different steps: there were rows to leave out
    assert narrowed or not any(decode_lean.rows_stable(model, 64, r) for r in range(4, 64, 4))


def test_live_rows_draw_the_dynamic_cache_loops_tokens(tiny):
    """The lever against the reference, the body's module forward over a DynamicCache (lean=False)."""
    model, tok = tiny
    ids, mask = bench_sampling.cpu_prompts("tiny", model, tok, 64)
    stop = rollout.stop_ids(tok, model)
    ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    a = sampler.generate(model, ids, mask, 96, 1.0, stop, tok.pad_token_id, generator=ga, lean=False,
                         token_chunk=KNOBS.token_chunk)
    b = sampler.generate(model, ids, mask, 96, 1.0, stop, tok.pad_token_id, generator=gb,
                         token_chunk=KNOBS.token_chunk)
    assert torch.equal(a, b) and torch.equal(ga.get_state(), gb.get_state())


def test_live_rows_on_the_stand_in_without_a_mask(monkeypatch, standin_model):
    """Qwen3 (q/k norms, grouped-query attention) in float32, unpadded prompts (no attention mask), a
    frequent token as a second stop so that rows stop early and at different steps."""
    model, tok = policy.load_policy(standin_model)
    ids = torch.randint(0, model.config.vocab_size, (16, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    free, _ = _lean(model, ids, mask, 40, [-1], 0, 2, live_rows=False)
    stop = [int(torch.mode(free.flatten()).values)]
    narrowed = _count_calls(monkeypatch, "narrow")
    a, ga = _lean(model, ids, mask, 40, stop, 0, 2, live_rows=False)
    b, gb = _lean(model, ids, mask, 40, stop, 0, 2)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert narrowed or not any(decode_lean.rows_stable(model, 16, r) for r in (4, 8, 12))


def test_guard_falls_back_when_the_probe_reports_a_mismatch(monkeypatch):
    """A probe that finds other floats on fewer rows: no row count is trusted, every op keeps all rows
    (only the attention leaves stopped rows out, as before the lever), the same tokens."""
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float64")
    ids, mask = bench_sampling.cpu_prompts("tiny", model, tok, 64)
    stop = rollout.stop_ids(tok, model)
    probed = []
    monkeypatch.setattr(decode_lean, "_STABLE_ROWS", {})
    monkeypatch.setattr(decode_lean, "rows_probe", lambda m, B, r: probed.append(r) or False)
    narrowed, dropped = _count_calls(monkeypatch, "narrow"), _count_calls(monkeypatch, "drop")
    rows_fed = []
    step = decode_lean.LeanStep.__call__
    monkeypatch.setattr(decode_lean.LeanStep, "__call__", lambda self, t, *a: rows_fed.append(len(t)) or step(self, t, *a))
    a, ga = _lean(model, ids, mask, 96, stop, tok.pad_token_id, 0, live_rows=False)
    n_steps, n_dropped = len(rows_fed), len(dropped)
    b, gb = _lean(model, ids, mask, 96, stop, tok.pad_token_id, 0)
    assert probed and not narrowed and len(dropped) == 2 * n_dropped > 0
    assert set(rows_fed) == {64} and len(rows_fed) == 2 * n_steps
    assert torch.equal(a, b) and torch.equal(ga, gb)


def test_rows_round_up_to_the_counts_the_probe_accepts(monkeypatch):
    """A CPU whose kernels keep rows only in blocks of 8 (say): the step narrows to multiples of 8 only,
    the same tokens."""
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float32")
    ids, mask = bench_sampling.cpu_prompts("tiny", model, tok, 64)
    stop = rollout.stop_ids(tok, model)
    monkeypatch.setattr(decode_lean, "_STABLE_ROWS", {})
    monkeypatch.setattr(decode_lean, "rows_probe", lambda m, B, r: r % 8 == 0)
    narrowed = _count_calls(monkeypatch, "narrow")
    a, ga = _lean(model, ids, mask, 96, stop, tok.pad_token_id, 0, live_rows=False)
    b, gb = _lean(model, ids, mask, 96, stop, tok.pad_token_id, 0)
    assert narrowed and all(r % 8 == 0 for r in narrowed)
    assert torch.equal(a, b) and torch.equal(ga, gb)


def test_no_live_rows_on_more_than_one_thread(monkeypatch):
    """On two threads the guard trusts no row count (CPU attention and matmuls split their work by the
    row count) and does not even probe."""
    model, _ = policy.load_policy("data/policies/tiny-m", dtype="float64")
    monkeypatch.setattr(decode_lean, "rows_probe", lambda *a: pytest.fail("probed on two threads"))
    torch.set_num_threads(2)
    assert not any(decode_lean.rows_stable(model, 64, r) for r in range(4, 64, 4))


def test_the_probe_runs_once_per_process_and_shapes(monkeypatch):
    """rows_stable caches the probe's verdict per (dtype, shapes, B, r)."""
    model, _ = policy.load_policy("data/policies/tiny-m", dtype="float64")
    calls = []
    monkeypatch.setattr(decode_lean, "_STABLE_ROWS", {})
    monkeypatch.setattr(decode_lean, "rows_probe", lambda m, B, r: calls.append((B, r)) or True)
    for _ in range(3):
        decode_lean.rows_stable(model, 64, 8)
    decode_lean.rows_stable(model, 64, 12)
    decode_lean.rows_stable(policy.load_policy("data/policies/tiny-m", dtype="float32")[0], 64, 8)   # another dtype
    assert calls == [(64, 8), (64, 12), (64, 8)]


def test_spread_rows_moves_the_first_and_last_rows():
    for B, r in [(64, 4), (64, 60), (50, 8), (8, 8), (13, 12)]:
        idx = decode_lean.spread_rows(B, r)
        assert len(idx) == r and idx[0] == 0 and idx[-1] == B - 1 and bool((idx.diff() > 0).all())


def test_narrowed_step_gives_the_probes_verdict(tiny):
    """A real lean step narrowed to 12 of 16 rows after three full steps (every live row and 3 stopped
    ones, all still fed tokens here): where the probe trusts 12 rows, their hidden states are the full
    step's bit for bit (rendered prompts, an attention mask)."""
    from transformers import DynamicCache
    model, tok = tiny
    ids, mask = bench_sampling.cpu_prompts("tiny", model, tok, 16)
    B, P = ids.shape
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    toks = torch.randint(3, 50, (B, 6), generator=torch.Generator().manual_seed(2))
    done = torch.zeros(B, dtype=torch.bool)
    done[[1, 2, 5, 8, 9, 10, 13]] = True                         # 9 rows live: 12 rows run
    keep = decode_lean._narrowed(torch.arange(B), done, 12)
    assert len(keep) == 12 and done[~torch.isin(torch.arange(B), keep)].all() and not done[keep].sum() > 3
    hs = {}
    with torch.inference_mode():
        for way in ("full", "narrow"):
            _, kv = decode_common.last_hidden(model, DynamicCache(), input_ids=ids, attention_mask=mask, position_ids=pos)
            step = decode_lean.LeanStep(model)
            step.fill(kv, P + 6)
            m = torch.ones(B, 1, 1, P + 6, dtype=torch.bool)
            m[:, 0, 0, :P] = mask.bool()
            nxt, rows = pos[:, -1:] + 1, torch.arange(B)
            for j in range(6):
                if j == 3 and way == "narrow":
                    m = step.narrow(keep, m)
                    rows = keep
                hs[way, j] = step(toks[rows, j], nxt[rows], P + j, m)
                nxt = nxt + 1
    stable = decode_lean.rows_stable(model, B, 12)
    for j in range(6):
        full = hs["full", j] if j < 3 else hs["full", j][keep]
        assert torch.equal(hs["narrow", j], full) or not stable
