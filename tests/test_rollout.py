import math

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cancellation import policy, rollout, tasks


def test_group_advantages_hand_made():
    r = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 4])
    a = rollout.group_advantages(r, g)
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    expect = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0, 0, 0, 0, 0, 0, 1.0]
    assert torch.allclose(a, torch.tensor(expect, dtype=torch.float64), atol=1e-12)


def test_sampling_reproducible(model64, tok):
    probs = tasks.sample_problems(4, seed=3)
    a = rollout.sample_batch(model64, tok, probs, G=3, max_new_tokens=16, seed=7)
    b = rollout.sample_batch(model64, tok, probs, G=3, max_new_tokens=16, seed=7)
    c = rollout.sample_batch(model64, tok, probs, G=3, max_new_tokens=16, seed=8)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    assert not torch.equal(a.input_ids, c.input_ids)
    # masks are consistent: responses start right after the prompt, prompt tokens are never response
    assert a.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert (a.response_mask <= a.attention_mask.bool()).all()


def test_greedy_sampling_is_argmax_of_forward(model64, tok):
    probs = tasks.sample_problems(2, seed=4)
    b = rollout.sample_batch(model64, tok, probs, G=1, max_new_tokens=8, temperature=0, seed=0)
    for i in range(len(b)):
        ids = b.input_ids[i, b.attention_mask[i].bool()][None]
        logits = model64(input_ids=ids).logits[0]
        start = int((~b.response_mask[i][b.attention_mask[i].bool()]).sum())
        pred = logits[start - 1:-1].argmax(-1)
        assert torch.equal(pred, ids[0, start:])


def test_saved_policy_reloads_through_plain_transformers(tmp_path, tok):
    m = policy.build_tiny_model("tiny-s", seed=1)
    m.save_pretrained(tmp_path)
    policy.save_tokenizer(tok, tmp_path)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    t2 = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q: 4 7 + 3 8 = ? A: First ones digit : 7 + 8 = 1 5 , write 5 carry 1 ."
    ids = t2(text, return_tensors="pt")["input_ids"]
    assert t2.decode(ids[0]) == text
    with torch.no_grad():
        assert torch.allclose(m(input_ids=ids).logits, m2(input_ids=ids).logits)


def test_missing_model_path_is_a_clear_error(tmp_path):
    import pytest
    with pytest.raises(FileNotFoundError, match="no config.json"):
        policy.load_policy(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="make policy"):
        policy.load_policy("data/policies/does-not-exist")
