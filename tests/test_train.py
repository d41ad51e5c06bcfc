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
    from cancellation import rollout, tasks
    batch = rollout.sample_batch(model, tok, tasks.sample_problems(4, seed=0), G=2, seed=0)
    cpu = measure.token_stats(model, batch).logp
    gpu = measure.token_stats(model.to("cuda"), batch).logp
    assert torch.allclose(cpu[batch.response_mask], gpu[batch.response_mask], atol=1e-9)
