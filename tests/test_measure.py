import numpy as np
import torch

from cancellation import measure
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call


def test_batched_token_stats_equal_per_sequence_loop(model64, batch):
    fast = measure.token_stats(model64, batch, Compute(chunk_rows=5))
    slow = measure.token_stats_per_sequence(model64, batch)
    m = batch.response_mask
    assert torch.allclose(fast.logp[m], slow.logp[m], atol=1e-10)
    assert torch.allclose(fast.entropy[m], slow.entropy[m], atol=1e-10)
    assert (fast.entropy[m] >= 0).all() and (fast.logp[m] <= 0).all()


def test_hidden_states_are_lm_head_inputs(model64, batch):
    s = measure.token_stats(model64, batch, KNOBS, hidden=True)
    m = batch.response_mask
    logits = model64.lm_head(s.hidden[m])
    lp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[m][:, None]).squeeze(-1)
    assert torch.allclose(lp, s.logp[m], atol=1e-10)


def test_token_table_and_fractions(model64, batch, tok):
    s = measure.token_stats(model64, batch, KNOBS)
    after = measure.TokenStats(s.logp + torch.where(batch.advantage[:, None] > 0, 1e-3, -1e-9), s.entropy)
    df = measure.token_table(batch, s, after, tokenizer=tok, eps=1e-6, step=3)
    assert len(df) == batch.n_tokens and (df.step == 3).all()
    assert set(df.status[df.sign == "pos"]) == {"boosted"}
    assert set(df.status[df.sign != "pos"]) == {"stable"}
    f = measure.flip_fractions(df, by=("sign",))
    assert np.allclose(f.groupby("sign").fraction.sum(), 1.0)
    first = df[df.position == 0]
    assert len(first) == len(batch)  # one first response token per rollout
    assert list(measure.classify([2e-6, -2e-6, 5e-7], 1e-6)) == ["boosted", "suppressed", "stable"]
