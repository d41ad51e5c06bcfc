"""cancellation.scale: the paper's model shapes and the probe's plumbing (the timings themselves need a GPU)."""
import pytest
import torch

from cancellation import policy, rollout, scale
from cancellation.compute import Compute

# Parameter counts published on the models' hub cards (total, non-embedding), in billions.
CARDS = {"qwen3-1.7b": (1.7, 1.4), "qwen3-4b": (4.0, 3.6), "qwen2.5-math-7b": (7.61, 6.53)}


@pytest.mark.parametrize("shape", sorted(CARDS))
def test_shapes_match_the_model_cards(shape):
    m = scale.build(shape, device="meta")                     # no memory: parameter shapes only
    emb = m.get_input_embeddings().weight.numel()
    head = 0 if m.config.tie_word_embeddings else m.get_output_embeddings().weight.numel()
    total, body = policy.n_params(m) / 1e9, (policy.n_params(m) - emb - head) / 1e9
    want_total, want_body = CARDS[shape]
    assert total == pytest.approx(want_total, abs=0.05) and body == pytest.approx(want_body, abs=0.05)


def test_synthetic_batch_has_fixed_lengths_and_mixed_groups():
    b = scale.synthetic_batch(n_prompts=3, G=4, prompt=5, response=7, vocab=50)
    assert b.input_ids.shape == (12, 12) and b.n_tokens == 12 * 7 and b.mixed_groups() == 3
    assert torch.equal(b.advantage, rollout.group_advantages(b.reward, b.group))


def test_probe_runs_every_block_on_cpu(monkeypatch):
    monkeypatch.setitem(scale.SHAPES, "toy", dict(arch="qwen3", vocab_size=300, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  head_dim=8, tie_word_embeddings=True))
    rows = scale.probe("toy", device="cpu", n_prompts=1, G=4, prompt=8, response=16, sample_rows=2, sample_tokens=5)
    assert [r["block"] for r in rows] == ["analysis_forward", "grpo_step_adam_full", "grpo_step_sgd_lm_head",
                                          "hf_sample_bf16"]
    assert rows[0]["tokens"] == 4 * 16 and rows[-1]["tokens"] == 2 * 5 and all(r["seconds"] > 0 for r in rows)


def test_trim_probe_on_cpu(monkeypatch):
    """gpu-check's trim step at a toy shape in float32: both blocks, the positions it runs over (responses
    stopping from 1/8 of the cap to the cap), and the two ways agreeing to float32 round-off."""
    monkeypatch.setitem(scale.SHAPES, "toy", dict(arch="qwen3", vocab_size=300, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  head_dim=8, tie_word_embeddings=True))
    rows = scale.trim_probe("toy", device="cpu", n_prompts=2, G=4, prompt=8, response=64,
                            compute=Compute(chunk_rows=2, token_chunk=64))
    assert [r["block"] for r in rows] == ["analysis_forward", "grpo_step_sgd_full"]
    for r in rows:
        assert 0.4 < r["positions_share"] < 0.75 and r["seconds_full"] > 0 and r["seconds_trim"] > 0
        assert r["max_abs_diff"] < 1e-4, r
