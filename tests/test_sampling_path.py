"""The hf backend's two sampling paths (issue 49, item 3): transformers' own generate against ours (greedy:
the same tokens from two implementations; sampled: the law of a full softmax, whatever a checkpoint's
generation_config says), its seeding, and which path `hf_sampler='auto'` resolves to and keys."""
import dataclasses

import pytest
import torch

from cancellation import policy, rollout, sampler, sampling_path, tasks
from cancellation.figures import fig02

TOKEN_CHUNK = 2048


@pytest.fixture(scope="module")
def tiny():
    model, tok = policy.load_policy("data/policies/tiny-m")
    return model.double(), tok


def _prompts(tok, n=6, G=2):
    """Rendered arithmetic prompts of unequal lengths (left-padded), G rollouts each."""
    source = tasks.ProblemSource()
    seqs = rollout.encode_prompts(tok, [source.render(p, tok) for p in source.draw(n, 0)])
    ids, mask = rollout._left_pad(seqs, tok.pad_token_id)
    assert n == 1 or (mask == 0).any()   # some rows are padded: the transformers path must read the mask
    return ids.repeat_interleave(G, 0), mask.repeat_interleave(G, 0)


def test_greedy_transformers_path_gives_ours_tokens(tiny):
    """Temperature 0 in float64: transformers' generate and our sampler are two implementations of one
    argmax decode with the same stop ids and padding; they must return the same (B, T) tokens."""
    model, tok = tiny
    ids, mask = _prompts(tok)
    stop = rollout.stop_ids(tok, model)
    ours = sampler.generate(model, ids, mask, 96, 0.0, stop, tok.pad_token_id, token_chunk=TOKEN_CHUNK)
    theirs = sampler.generate(model, ids, mask, 96, 0.0, stop, tok.pad_token_id, token_chunk=TOKEN_CHUNK,
                              path="transformers")
    assert theirs.shape == ours.shape and torch.equal(theirs, ours)
    assert torch.isin(ours, torch.tensor(stop)).any()      # some row stopped: the padding after it is compared too


def test_transformers_path_samples_the_full_softmax_law(tiny):
    """First tokens of 1,500 rows of one prompt at temperature 1 against the softmax of a forward pass: total
    variation within 3x its expected sampling noise, even with a checkpoint's generation_config asking for
    top-k 2 and a repetition penalty (the path sets every logits processor off itself; a top-2 law would be
    off by the mass outside the top two, checked to be beyond the bound)."""
    model, tok = tiny
    ids, mask = _prompts(tok, n=1, G=1)
    with torch.no_grad():
        p = torch.softmax(model(input_ids=ids, attention_mask=mask).logits[0, -1].double(), -1)
    rows = 1500
    bound = 3 * 0.5 * float(torch.sqrt(2 * p * (1 - p) / (torch.pi * rows)).sum())   # 3x E[TV] of n draws
    assert 1 - float(p.topk(2).values.sum()) > bound
    gc = model.generation_config
    old = (gc.top_k, gc.repetition_penalty)
    gc.top_k, gc.repetition_penalty = 2, 1.5
    try:
        out = sampler.generate(model, ids.expand(rows, -1), mask.expand(rows, -1), 1, 1.0, [-1], tok.pad_token_id,
                               generator=torch.Generator().manual_seed(0), token_chunk=TOKEN_CHUNK,
                               path="transformers")
    finally:
        gc.top_k, gc.repetition_penalty = old
    freq = torch.bincount(out[:, 0], minlength=len(p)).double() / rows
    assert 0.5 * float((freq - p).abs().sum()) < bound


def test_transformers_path_reproduces_per_seed_and_leaves_global_rng(tiny):
    """The same generator seed gives the same tokens; another seed other tokens; torch's global generator,
    which transformers draws from, is forked and left as it was."""
    model, tok = tiny
    ids, mask = _prompts(tok)
    stop = rollout.stop_ids(tok, model)

    def run(seed):
        return sampler.generate(model, ids, mask, 30, 1.0, stop, tok.pad_token_id, path="transformers",
                                generator=torch.Generator().manual_seed(seed), token_chunk=TOKEN_CHUNK)
    state = torch.get_rng_state()
    a, b, c = run(1), run(1), run(2)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, c)
    for row in a:                                           # nothing but pad after a row's first stop id
        hit = torch.isin(row, torch.tensor(stop)).nonzero()
        if len(hit):
            assert (row[int(hit[0]) + 1:] == tok.pad_token_id).all()


def test_sample_config_carries_the_path_into_sample(tiny):
    """rollout.sample with hf_sampler='transformers' samples through that path (greedy: ours' tokens); a
    SampleConfig refuses an unknown path."""
    model, tok = tiny
    cfg = rollout.SampleConfig(n_prompts=3, G=2, temperature=0.0, max_new_tokens=24, dtype="float64")
    a = rollout.sample(model, tok, cfg, seed=5)
    b = rollout.sample(model, tok, dataclasses.replace(cfg, hf_sampler="transformers"), seed=5)
    assert torch.equal(a.input_ids, b.input_ids)
    with pytest.raises(ValueError, match="hf_sampler"):
        rollout.SampleConfig(hf_sampler="vllm")


def test_auto_resolves_per_device_and_enters_keys_only_when_not_ours(monkeypatch):
    """'auto' is ours on a CPU (the tiny keys do not move: the field is keyless at ours), the committed report's
    choice on a CUDA card (the H200 report measured ours at 0.46x: transformers'), transformers' on a card with
    no report, and stays 'auto' when no CUDA device is visible. A figure sampled by transformers' path has
    another key."""
    assert sampling_path.resolve("auto", "cpu") == "ours"
    assert sampling_path.resolve("ours", "cuda") == "ours"
    with pytest.raises(ValueError, match="hf_sampler"):
        sampling_path.resolve("fast", "cpu")
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "cuda")
    assert sampling_path.resolve("auto", "cuda") == "auto"
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "nvidia-h200")
    assert sampling_path.resolve("auto", "cuda:0") == "transformers"
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "no-such-card")
    assert sampling_path.resolve("auto", "cuda") == "transformers"
    P = fig02.Params()
    assert P.hf_sampler == "auto" and "hf_sampler" not in P.cache_params()
    assert fig02.Params(hf_sampler="transformers").cache_params()["hf_sampler"] == "transformers"
    assert "hf_sampler" not in rollout.config_params(rollout.SampleConfig())
