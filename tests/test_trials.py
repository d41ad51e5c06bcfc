"""grpo.Trials: notebook 04's single updates from θ₀ sharing one forward (issue 52, lever 1) give bit for bit
the Δlog p of an independent per-update loop (a fresh copy of θ₀, `grpo_step`, `token_stats`), and fig04's
token table is the same bits with the shared forward as the old way."""
import copy

import pandas as pd
import pytest
import torch

from cancellation import grpo, measure, seeds, thesis
from cancellation.compute import Compute
from cancellation.figures import fig04

CC = Compute()   # the tiny profile's knobs: one chunk of rows for these batches


def _independent(model, batch, cfg, before_logp, token_weight=None):
    """Δlog p the plain way: a fresh copy of θ₀, one `grpo_step` (its own forward), the after forward."""
    m = copy.deepcopy(model)
    grpo.grpo_step(m, batch, cfg, old_logp=before_logp, token_weight=token_weight)
    return measure.token_stats(m, batch, cfg).logp - before_logp


def _updates(batch, scope):
    w = thesis.copies_mask(batch)
    shuffled = thesis.permuted(batch, 7)
    return [(CC.update(optimizer="sgd", lr=0.1, scope=scope, reweight=rw), b, tw) for rw, b, tw in (
        ("positive_only", batch, None), ("grpo", batch, None), ("negative_only", batch, None),
        ("grpo", batch, w), ("grpo", shuffled, None), ("positive_only", shuffled, None))]


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("scope", ["full", "lm_head"])
def test_shared_forward_matches_an_independent_loop(tiny_m, real_batch, scope):
    model = tiny_m[0]
    theta0 = _params(model)
    ref_before = measure.token_stats(model, real_batch, CC, hidden=True)
    trials = grpo.Trials(model, real_batch, CC, scope=scope, hidden=True)
    assert trials.shared
    for k in ("logp", "entropy", "hidden"):           # "before", read off the forward with a graph
        assert torch.equal(getattr(trials.before, k), getattr(ref_before, k)), k
    moved = 0
    for cfg, b, tw in _updates(real_batch, scope)[:6 if scope == "full" else 3]:
        got = trials.delta(cfg, b, token_weight=tw)
        want = _independent(model, b, cfg, ref_before.logp, tw)
        assert torch.equal(got, want), (cfg.reweight, float((got - want).abs().max()))
        moved += int((want[real_batch.response_mask] != 0).sum())
    assert moved > 0                                   # the updates did move the log-probs
    assert trials.restore_error() == 0.0
    assert all(torch.equal(a, b) for a, b in zip(_params(model), theta0))


@pytest.mark.parametrize("scope", ["full", "lm_head"])
def test_tied_head(model64, batch, scope):
    """A tied model (the paper's Qwen3 stand-ins): full scope steps the shared matrix through both uses; the
    lm_head scope's untied copy is the step's, and the model is tied again afterwards, as `grpo.trial` leaves it."""
    model = copy.deepcopy(model64)
    model.lm_head.weight = model.model.embed_tokens.weight
    model.config.tie_word_embeddings = True
    before = measure.token_stats(model, batch, CC).logp
    trials = grpo.Trials(model, batch, CC, scope=scope)
    for cfg, b, tw in _updates(batch, scope)[:3]:
        assert torch.equal(trials.delta(cfg, b, token_weight=tw), _independent(model, b, cfg, before, tw))
    assert trials.restore_error() == 0.0
    assert grpo.is_tied(model) and model.lm_head.weight is model.model.embed_tokens.weight


def test_several_row_chunks_fall_back_to_the_old_way(model64, batch):
    knobs = Compute(chunk_rows=5)
    before = measure.token_stats(model64, batch, knobs).logp
    trials = grpo.Trials(model64, batch, knobs)
    assert not trials.shared
    cfg = knobs.update(optimizer="sgd", lr=0.1, scope="full")
    assert torch.equal(trials.delta(cfg), _independent(model64, batch, cfg, before))
    assert trials.restore_error() == 0.0


def test_restore_check_and_refusals(model64, batch):
    model = copy.deepcopy(model64)
    trials = grpo.Trials(model, batch, CC)
    with pytest.raises(ValueError, match="scope"):
        trials.delta(CC.update(optimizer="sgd", lr=0.1, scope="lm_head"))
    with pytest.raises(ValueError, match="knobs"):
        trials.delta(Compute(token_chunk=8).update(optimizer="sgd", lr=0.1))
    other = copy.deepcopy(batch)
    other.input_ids[0, -1] = (other.input_ids[0, -1] + 1) % 10
    with pytest.raises(ValueError, match="tokens"):
        trials.delta(CC.update(optimizer="sgd", lr=0.1), other)
    trials.delta(CC.update(optimizer="sgd", lr=0.1))
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3            # θ₀ not back: the parameter check says by how much
    assert trials.restore_error() == pytest.approx(1e-3)


def test_fig04_table_is_the_old_ways_bit_for_bit(tiny_m, real_batch):
    """The whole per-batch table of notebook 04 (the two updates, the thesis rows' four, the sign-shuffle null at 2
    shuffles, the restore) on a real batch of the tiny policy: shared forward vs one forward per update."""
    model, tok = tiny_m
    P = fig04.Params(n_batches=1, n_prompts=3, G=4, max_new_tokens=40, n_random_masks=2, fo_tokens=16, null_shuffles=2)
    bseed = seeds.derive(P.seed, "category_batch", 0)
    old = fig04.batch_table(P, model, tok, real_batch, 0, bseed, True, shared_forward=False)
    new = fig04.batch_table(P, model, tok, real_batch, 0, bseed, True, shared_forward=True)
    pd.testing.assert_frame_equal(new, old, check_exact=True)
    deltas = [c for c in old if c.startswith("delta_")]
    assert len(deltas) == 5 and all((old[c] != 0).any() for c in deltas)   # six updates (two random masks, one column)
    assert {f"null_{u}_{s}" for u in ("positive_only", "negative_only", "grpo") for s in (1, 2)} <= set(old)
    assert (old.restore_error == 0).all()
