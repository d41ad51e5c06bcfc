"""trim_padding: each body forward over its rows' real columns only (measure.chunks), the same numbers
up to round-off as the full-width forwards, checked against them in float64, with less work."""
import copy
import dataclasses

import torch

from cancellation import grpo, measure
from cancellation.compute import Compute
from cancellation.figures import fig04

FULL = Compute(chunk_rows=5, token_chunk=7)
TRIM = dataclasses.replace(FULL, trim_padding=True)


def _ragged(batch):
    """`batch` with its responses cut to lengths 2..20 (a real batch's spread; a random policy never
    stops early): the tail becomes padding, as the sampler leaves it after a stop."""
    b = copy.deepcopy(batch)
    for i in range(len(b)):
        cols = b.response_mask[i].nonzero().squeeze(1)
        cut = cols[2 + (7 * i) % 19:]
        b.response_mask[i, cut] = 0
        b.attention_mask[i, cut] = 0
        b.input_ids[i, cut] = 0
    return b


def _widths(monkeypatch):
    """Record the positions of every body forward (rows x columns)."""
    seen = []
    inner = measure.forward_hidden

    def spy(model, batch, rows=None, cols=None):
        h = inner(model, batch, rows, cols)
        seen.append(h.shape[0] * h.shape[1])
        return h
    monkeypatch.setattr(measure, "forward_hidden", spy)
    return seen


def test_chunks_cover_every_real_token(batch):
    b = _ragged(batch)
    am = b.attention_mask.bool()
    got = list(measure.chunks(b.attention_mask, torch.arange(len(b)), TRIM))
    rows = torch.cat([r for r, _ in got])
    assert sorted(rows.tolist()) == list(range(len(b)))                      # every row once
    last = [int(am[i].nonzero().max()) for i in rows.tolist()]
    assert last == sorted(last)                                               # shortest first
    for r, cols in got:
        assert len(r) <= TRIM.chunk_rows
        outside = am[r].clone()
        outside[:, cols] = False
        assert not outside.any()                                              # nothing real is cut
        assert am[r][:, cols.start].any() and am[r][:, cols.stop - 1].any()  # and nothing more is kept
    full = list(measure.chunks(b.attention_mask, torch.arange(len(b)), FULL))
    assert [r.tolist() for r, _ in full] == [list(range(s, min(s + 5, len(b)))) for s in range(0, len(b), 5)]
    assert all(c == slice(0, b.input_ids.shape[1]) for _, c in full)


def test_trimmed_statistics_equal_the_full_width_ones(model64, batch, monkeypatch):
    b = _ragged(batch)
    seen = _widths(monkeypatch)
    full = measure.token_stats(model64, b, FULL, hidden=True)
    n_full = sum(seen)
    seen.clear()
    trim = measure.token_stats(model64, b, TRIM, hidden=True)
    m = b.response_mask.bool()
    assert m.sum() > 40
    for a, c in ((full.logp, trim.logp), (full.entropy, trim.entropy), (full.hidden[m], trim.hidden[m])):
        assert (a - c).abs().max() <= 1e-12
    assert torch.equal(trim.logp[~m], torch.zeros_like(trim.logp[~m]))
    assert sum(seen) < 0.8 * n_full, (sum(seen), n_full)   # the work it saves on this batch


def test_trimmed_step_gradient_equals_the_full_width_one(fresh, batch):
    b = _ragged(batch)
    old = measure.token_stats(fresh, b, FULL).logp
    old = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1), dtype=old.dtype)
    w = grpo.reweight_advantage(b, "grpo")
    tw = torch.rand(b.input_ids.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rows = torch.tensor([11, 0, 3, 7, 5, 2, 9, 1])   # a mini-batch in a plan's order
    out = {}
    for name, knobs in (("full", FULL), ("trim", TRIM)):
        m = copy.deepcopy(fresh)
        m.zero_grad(set_to_none=True)
        info = grpo.accumulate_grad(m, b, rows, old, w, knobs.update(), tw)
        out[name] = ([p.grad.clone() for p in m.parameters()], info)
    (gf, inf), (gt, it) = out["full"], out["trim"]
    assert any(g.abs().sum() > 0 for g in gf)
    for a, c in zip(gf, gt):
        assert (a - c).abs().max() <= 1e-12 * max(1.0, float(a.abs().max()))
    for k in ("loss", "clipfrac", "ratio_dev"):
        assert abs(inf[k] - it[k]) <= 1e-12, k
    assert inf["n_tokens"] == it["n_tokens"]


def test_the_knob_reaches_every_forward_of_a_figure():
    P = fig04.Params(trim_padding=True)
    assert P.compute().trim_padding and P.compute().update(lr=0.1).trim_padding
    assert Compute.of_update(P.compute().update(lr=0.1)).trim_padding
    assert not fig04.Params().compute().update(lr=0.1).trim_padding
