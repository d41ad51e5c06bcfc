"""The Compute config: knobs reach update configs and forwards; the guard catches what bypasses them."""
import copy
import json

import pytest
import torch

from cancellation import coupling, grpo, guard, measure
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def test_update_and_stats_carry_the_knobs(model64, batch):
    c = Compute(chunk_rows=3, token_chunk=5, gradient_checkpointing=True)
    cfg = c.update(optimizer="sgd", lr=0.1)
    assert (cfg.chunk_rows, cfg.token_chunk, cfg.gradient_checkpointing, cfg.lr) == (3, 5, True, 0.1)
    assert Compute.of_update(cfg) == Compute(chunk_rows=3, token_chunk=5, gradient_checkpointing=True)
    # chunking never changes a number beyond round-off (float64 model)
    ref = measure.token_stats(model64, batch, Compute(chunk_rows=64, token_chunk=4096)).logp
    assert torch.allclose(c.stats(model64, batch).logp, ref, rtol=0, atol=1e-12)


def test_from_params_takes_only_declared_names():
    c = Compute.from_params({"device": "cpu", "token_chunk": 7, "lr": 0.1, "n_prompts": 3})
    assert c.token_chunk == 7 and c.chunk_rows == Compute().chunk_rows
    with pytest.raises(ValueError, match="token_chunk"):
        Compute(token_chunk=0)


def test_guard_bounds_every_lm_head_call(model64, batch, monkeypatch):
    m = guard.guard_lm_head(copy.deepcopy(model64), token_chunk=16)
    n = int(batch.response_mask.sum())
    assert n > 16
    measure.token_stats(m, batch, Compute(chunk_rows=64, token_chunk=16))          # chunked: every call ≤ 16 positions
    with pytest.raises(guard.MemoryBoundError, match="token_chunk is 16"):
        measure.token_stats(m, batch, Compute(chunk_rows=64, token_chunk=17))
    with pytest.raises(guard.MemoryBoundError):
        measure.token_stats_unchunked(m, batch, KNOBS)                 # the full-logits reference is caught too


def test_guard_rejects_an_update_config_with_other_knobs(monkeypatch):
    monkeypatch.setenv(guard.GUARD_ENV, json.dumps({"chunk_rows": 4, "token_chunk": 64}))
    Compute(chunk_rows=4, token_chunk=64).update(lr=0.1)       # the profile's knobs: fine
    with pytest.raises(guard.KnobError, match="token_chunk=4096"):
        grpo.UpdateConfig(chunk_rows=4)                         # a library default slipped through
    monkeypatch.delenv(guard.GUARD_ENV)
    grpo.UpdateConfig()                                         # guard off: anything goes


def test_masked_effects_full_restores_the_model_when_it_raises(fresh, batch, monkeypatch):
    f = coupling.features(fresh, batch, compute=KNOBS)
    cands, sets = coupling.masking_sets(f, 2, 1, 0.5, seed=0)
    theta = {k: v.clone() for k, v in fresh.state_dict().items()}

    def step_then_raise(model, *a, **k):   # the full step moves θ, then something fails
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        raise RuntimeError("boom")

    monkeypatch.setattr(grpo, "grpo_step", step_then_raise)
    with pytest.raises(RuntimeError, match="boom"):
        coupling.masked_effects_full(fresh, batch, f, cands, sets["same"], 0.1, compute=KNOBS)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, theta[k]), k
