import math
from dataclasses import replace

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cancellation import policy, rollout, sampler, sources, tasks, tiny, vllm_seam

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify


def test_group_advantages_hand_made():
    r = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2, 3, 4])
    a = rollout.group_advantages(r, g)
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    expect = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 0, 0, 0, 0, 0, 0, 1.0]
    assert torch.allclose(a, torch.tensor(expect, dtype=torch.float64), atol=1e-12)


def test_sampling_reproducible(model64, tok):
    probs = tasks.sample_problems(4, seed=3)
    a = rollout.sample(model64, tok, rollout.SampleConfig(n_prompts=len(probs), G=3, max_new_tokens=16, source=RAW),
                       problems=probs, seed=7)
    b = rollout.sample(model64, tok, rollout.SampleConfig(n_prompts=len(probs), G=3, max_new_tokens=16, source=RAW),
                       problems=probs, seed=7)
    c = rollout.sample(model64, tok, rollout.SampleConfig(n_prompts=len(probs), G=3, max_new_tokens=16, source=RAW),
                       problems=probs, seed=8)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    assert not torch.equal(a.input_ids, c.input_ids)
    # masks are consistent: responses start right after the prompt, prompt tokens are never response
    assert a.group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert (a.response_mask <= a.attention_mask.bool()).all()


def test_greedy_sampling_is_argmax_of_forward(model64, tok):
    probs = tasks.sample_problems(2, seed=4)
    b = rollout.sample(model64, tok, rollout.SampleConfig(n_prompts=len(probs), G=1, temperature=0, max_new_tokens=8,
                                                          source=RAW),
                       problems=probs, seed=0)
    for i in range(len(b)):
        ids = b.input_ids[i, b.attention_mask[i].bool()][None]
        logits = model64(input_ids=ids).logits[0]
        start = int((~b.response_mask[i][b.attention_mask[i].bool()]).sum())
        pred = logits[start - 1:-1].argmax(-1)
        assert torch.equal(pred, ids[0, start:])


def test_saved_policy_reloads_through_plain_transformers(tmp_path, tok):
    m = tiny.build_tiny_model("tiny-s", seed=1)
    m.save_pretrained(tmp_path)
    tiny.save_tokenizer(tok, tmp_path)
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


# --------------------------------------------------------------------------- SampleConfig / sample / stop ids
import copy

import pytest

from cancellation import value
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

DOT = tasks.VOCAB.index(".")        # a second stop id, as <|im_end|> beside <|endoftext|>


class Source:
    """Stand-in with the ProblemSource methods `sample` uses (generated arithmetic, a rendering
    that adds a word, so rendered prompts differ from problem.prompt)."""

    def draw(self, n, seed):
        return tasks.sample_problems(n, seed=seed)

    def render(self, problem, tokenizer):
        return "A: " + problem.prompt

    def verifier(self):
        return tasks.verify


def with_stops(model, *ids):
    m = copy.deepcopy(model)
    m.generation_config.eos_token_id = list(ids)
    return m


def biased(model, token: int, bias: float):
    """`model` with an LM-head bias on `token` (the tiny Qwen2 head has none): makes it likely or certain."""
    m = copy.deepcopy(model)
    head = m.lm_head
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        new.bias[token] = bias
    m.lm_head = new
    return m


def test_round_seeds_and_stop_ids(tok, model64):
    assert rollout.round_seeds(3, 7) == (1_000_003 * 4 + 7, 3 * 7919 + 7)
    assert rollout.stop_ids(tok) == [tok.eos_token_id]
    assert rollout.stop_ids(tok, model64) == [tok.eos_token_id]                 # int eos, deduplicated
    assert rollout.stop_ids(tok, with_stops(model64, DOT, tok.eos_token_id, DOT)) == [tok.eos_token_id, DOT]
    with pytest.raises(ValueError, match="backend"):
        rollout.SampleConfig(backend="tgi", source=Source())


@pytest.mark.parametrize("stop", [1, DOT])
def test_sampler_stops_at_every_stop_id(tok, model64, stop):
    """A model whose generation_config lists two stop ids ends each response at the first of
    either, included; with the stop id certain, every response is that one token."""
    assert stop == tok.eos_token_id or stop == DOT
    probs = tasks.sample_problems(3, seed=2)
    cfg = rollout.SampleConfig(G=4, max_new_tokens=16, source=Source())
    stops = {tok.eos_token_id, DOT}
    for bias, certain in ((60.0, True), (3.0, False)):
        m = biased(with_stops(model64, tok.eos_token_id, DOT), stop, bias)
        b = rollout.sample(m, tok, cfg, problems=probs, seed=1)
        ends = 0
        for i in range(len(b)):
            resp = b.input_ids[i, b.response_mask[i]].tolist()
            assert not stops & set(resp[:-1])                  # no stop id before the end
            ends += resp[-1] == stop
            if certain:
                assert resp == [stop]
            else:
                assert resp[-1] in stops or len(resp) == cfg.max_new_tokens
        assert ends >= len(b) // 2
        if certain:  # the sampler itself stops (it does not just get cut afterwards)
            ids = b.input_ids[:2, :b.response_mask.int().argmax(1).min()]
            new = sampler.generate(m, ids, (ids != tok.pad_token_id).long(), 16, 1.0, sorted(stops), tok.pad_token_id,
                                   token_chunk=KNOBS.token_chunk)
            assert new.tolist() == [[stop], [stop]]
        # the MC sampler stops there too
        conts = value.sample_continuations(m, [b.input_ids[0, b.attention_mask[0].bool()].tolist()[:4]], 8, [16],
                                           sorted(stops), tok.pad_token_id, [5], token_chunk=KNOBS.token_chunk)[0]
        for row in conts.tolist():
            end = next(j for j, t in enumerate(row + [tok.pad_token_id]) if t in stops or t == tok.pad_token_id)
            assert row[end] == stop or (certain is False and row[end] in stops)
            assert all(t == tok.pad_token_id for t in row[end + 1:])


def test_prefill_computes_last_position_logits_only(tok, model64):
    m = copy.deepcopy(model64)
    shapes = []
    m.lm_head.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(out.shape)))
    probs = tasks.sample_problems(2, seed=0)
    rollout.sample(m, tok, rollout.SampleConfig(G=2, max_new_tokens=4, source=Source()), problems=probs)
    assert shapes[0] == (4, len(tok)) and all(s[0] <= 4 for s in shapes)   # rows x V, never rows x L x V
    shapes.clear()
    value.sample_continuations(m, [[3, 5, 6, 7, 8]], 4, [3], tok.eos_token_id, tok.pad_token_id, [0],
                               token_chunk=KNOBS.token_chunk)
    assert shapes[0] == (4, len(tok)) and all(s[0] <= 4 for s in shapes)


def test_decode_logits_in_token_chunks_draw_the_same_tokens(tok, model64):
    """token_chunk bounds the rows of every LM-head call of a decode step; the draws do not change."""
    m = copy.deepcopy(model64)
    rows = []
    m.lm_head.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
    probs = tasks.sample_problems(3, seed=0)
    cfg = rollout.SampleConfig(G=4, max_new_tokens=12, source=Source())
    whole = rollout.sample(m, tok, cfg, problems=probs, seed=3)
    assert max(rows) == 12
    rows.clear()
    chunked = rollout.sample(m, tok, replace(cfg, token_chunk=5), problems=probs, seed=3)
    assert max(rows) == 5 and torch.equal(whole.input_ids, chunked.input_ids)
    prefixes = [[3, 5, 6, 7, 8], [3, 5, 9]]
    a = value.sample_continuations(m, prefixes, 6, [8, 5], tok.eos_token_id, tok.pad_token_id, [0, 1], bans=[5, None],
                                   token_chunk=KNOBS.token_chunk)
    rows.clear()
    b = value.sample_continuations(m, prefixes, 6, [8, 5], tok.eos_token_id, tok.pad_token_id, [0, 1], bans=[5, None],
                                   token_chunk=5)
    assert max(rows) == 5 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_sample_same_seed_same_batch(tok, model64):
    cfg = rollout.SampleConfig(n_prompts=3, G=3, max_new_tokens=12, seed=4, source=Source())
    a, b = rollout.sample(model64, tok, cfg), rollout.sample(model64, tok, cfg)
    c = rollout.sample(model64, tok, cfg, seed=5)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts and a.problems == b.problems
    assert a.problems == tasks.sample_problems(3, seed=4) and c.problems == tasks.sample_problems(3, seed=5)
    assert not torch.equal(a.input_ids, c.input_ids)
    # the prompt rows are the rendered prompts
    real = a.input_ids[0, a.attention_mask[0].bool() & ~a.response_mask[0]].tolist()
    assert real == tok("A: " + a.problems[0].prompt, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="device"):
        rollout.sample(model64, tok, rollout.SampleConfig(device="cuda", source=Source()))


def _old_sample_batch(model, tok, problems, G, max_new_tokens, seed):
    """The sampler as it was before SampleConfig (verbatim logic): the tiny tables depend on it."""
    from transformers import DynamicCache

    enc = tok([p.prompt for p in problems for _ in range(G)], return_tensors="pt", padding=True,
              padding_side="left", add_special_tokens=False)
    ids, am = enc["input_ids"], enc["attention_mask"]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    import inspect
    kv = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=True, **{kv: DynamicCache()})
        logits, next_pos = out.logits[:, -1], pos[:, -1] + 1
        done, new = torch.zeros(len(ids), dtype=torch.bool), []
        for _ in range(max_new_tokens):
            t = torch.multinomial(torch.softmax(logits.double(), -1), 1, generator=gen).squeeze(1)
            t = torch.where(done, torch.full_like(t, tok.pad_token_id), t)
            new.append(t)
            done = done | (t == tok.eos_token_id)
            if bool(done.all()):
                break
            am = torch.cat([am, torch.ones_like(am[:, :1])], 1)
            out = model(input_ids=t[:, None], attention_mask=am, position_ids=next_pos[:, None], use_cache=True,
                        **{kv: getattr(out, kv)})
            logits, next_pos = out.logits[:, -1], next_pos + 1
    return enc["input_ids"], torch.stack(new, 1)


def test_cpu_batch_equals_the_old_sampler_on_the_tiny_policy():
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float64")
    probs = tasks.sample_problems(3, seed=5)
    prompt_ids, new = _old_sample_batch(model, tok, probs, G=4, max_new_tokens=96, seed=5)
    b = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=len(probs), G=4, max_new_tokens=96, source=RAW),
                       problems=probs, seed=5)
    P = prompt_ids.shape[1]
    assert torch.equal(b.input_ids[:, :P], prompt_ids)
    resp = b.response_mask[:, P:]
    assert torch.equal(b.input_ids[:, P:][resp], new[resp]) and resp.sum() > 0
    assert b.reward.sum() > 0                                  # the trained policy solves some
    assert b.texts == [tok.decode(new[i][resp[i]].tolist(), skip_special_tokens=True) for i in range(len(b))]


# --------------------------------------------------------------------------- the vLLM seam, against a fake vllm
def test_vllm_sample_calls_and_rows(fake_vllm, saved_model, tok):
    m, path = saved_model
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64", seed=3, gpu_memory_utilization=0.25)
    assert llm.init_kwargs == dict(model=str(path), dtype="float64", seed=3, enable_prefix_caching=True,
                                   gpu_memory_utilization=0.25)
    assert llm.hf_model is m
    cfg = rollout.SampleConfig(n_prompts=3, G=4, max_new_tokens=12, backend="vllm", seed=5, source=Source())
    b = rollout.sample(llm, tok, cfg)
    calls = list(llm.calls)
    assert len(calls) == 3
    for g, (c, p) in enumerate(zip(calls, b.problems)):
        rendered = tok("A: " + p.prompt, add_special_tokens=False)["input_ids"]
        assert c["prompt_token_ids"] == rendered                     # vLLM sees the tokens HF sees
        assert (c["n"], c["max_tokens"], c["temperature"]) == (4, 12, 1.0)
        assert c["stop_token_ids"] == [tok.eos_token_id, DOT]
        assert c["seed"] == vllm_seam.request_seed(5, g)
        for r in range(4):
            row = g * 4 + r
            assert b.input_ids[row, b.attention_mask[row].bool() & ~b.response_mask[row]].tolist() == rendered
    assert len({c["seed"] for c in calls}) == 3                        # distinct streams per prompt
    outs = llm.generate([{"prompt_token_ids": c["prompt_token_ids"]} for c in calls],
                        [fake_vllm.SamplingParams(n=4, max_tokens=12, seed=c["seed"],
                                                  stop_token_ids=c["stop_token_ids"]) for c in calls])
    seqs = [list(o.token_ids) for out in outs for o in out.outputs]
    for row, s in enumerate(seqs):                                     # rows are vLLM's G outputs, in order
        assert b.input_ids[row, b.response_mask[row]].tolist() == s
        assert b.reward[row] == tasks.verify(b.problems[row // 4], tok.decode(s))
    assert any(s[-1] == DOT for s in seqs) and any(len(s) < 12 for s in seqs)
    again = rollout.sample(llm, tok, cfg)
    assert torch.equal(again.input_ids, b.input_ids)
    other = rollout.sample(llm, tok, cfg, seed=6)
    assert [c["seed"] for c in llm.calls[-3:]] == [vllm_seam.request_seed(6, g) for g in range(3)]
    assert not torch.equal(other.input_ids, b.input_ids)


def test_sync_weights_pushes_the_hf_weights(fake_vllm, saved_model, tok):
    m, path = saved_model
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64")
    updated = copy.deepcopy(m)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(0.01 * torch.randn_like(p))
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(llm.model.state_dict()[key], updated.state_dict()[key])
    n = vllm_seam.sync_weights(llm, updated)
    assert n == len(updated.state_dict()) and llm.handle.loaded == list(updated.state_dict())
    for k, v in updated.state_dict().items():
        assert torch.equal(llm.model.state_dict()[k], v), k
    vllm_seam.sync_weights(llm)                                        # default: the attached HF model
    assert torch.equal(llm.model.state_dict()[key], m.state_dict()[key])
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        vllm_seam.sync_weights(object(), m)


def test_vllm_exclude_bans_the_first_token(fake_vllm, saved_model, tok):
    m, path = saved_model
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64")
    prefix = tok("Q: 1 2 + 3 4 = ? A: First", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        top = int(m(input_ids=torch.tensor([prefix])).logits[0, -1].argmax())
    stops = [tok.eos_token_id, DOT]
    M, budgets, bans = 16, [5, 6], [top, None]
    seeds = [value.prefix_seed(0, prefix, b) for b in bans]
    got = vllm_seam.sample_vllm_continuations(llm, [prefix, prefix], M, budgets, seeds, 1.0, bans, stops)
    assert got[0].shape == (M, 5) and got[1].shape == (M, 6)
    assert not (got[0][:, 0] == top).any()                             # the banned first token never comes
    assert (got[1][:, 0] == top).sum() > M // 4                          # (it is the likely one)
    # the first tokens are those the HF sampler draws for the same request
    hf = value.sample_continuations(m, [prefix], M, [5], stops, tok.pad_token_id, [seeds[0]], bans=[top],
                                    token_chunk=KNOBS.token_chunk)[0]
    assert torch.equal(got[0][:, 0], hf[:, 0])
    # vLLM continues each prefix ⊕ a with the rest of the budget and the stop ids
    cont = [c for c in llm.calls if len(c["prompt_token_ids"]) == len(prefix) + 1]
    assert cont and all(c["max_tokens"] == 4 and c["stop_token_ids"] == stops for c in cont)
    assert sum(c["n"] for c in cont) == sum(int(t) not in stops for t in got[0][:, 0])
    for row in got[0].tolist():                                        # -1 only after the end
        real = [t for t in row if t >= 0]
        assert row[:len(real)] == real and not set(stops) & set(real[:-1])


def test_token_values_through_vllm_exclude(fake_vllm, saved_model, tok, tmp_path):
    from cancellation import measure

    m, path = saved_model
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64")
    b = rollout.sample(m, tok, rollout.SampleConfig(n_prompts=1, G=1, max_new_tokens=8, source=RAW),
                       problems=tasks.sample_problems(1, seed=0), seed=0)
    table = measure.token_table(b, measure.token_stats(m, b, KNOBS), tokenizer=tok).iloc[:2]
    table = table.assign(prob=0.5)
    cfg = value.ValueConfig(M=4, max_new_tokens=10, estimator="exclude", backend="vllm")
    got = value.token_values(llm, tok, b, table, cfg, mid="fake", cache_dir=tmp_path, progress=False)
    assert got.delta_hat.notna().all() and len(llm.calls) > 0


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_cuda_sampling_matches_cpu(tok, model64):
    """Same code on CUDA: greedy batches equal CPU's (float64), sampling reproducible per device."""
    cuda = copy.deepcopy(model64).to("cuda")
    probs = tasks.sample_problems(3, seed=1)
    cpu_cfg = rollout.SampleConfig(G=2, max_new_tokens=16, temperature=0, source=Source())
    gpu_cfg = rollout.SampleConfig(G=2, max_new_tokens=16, temperature=0, device="cuda", source=Source())
    a = rollout.sample(model64, tok, cpu_cfg, problems=probs)
    g = rollout.sample(cuda, tok, gpu_cfg, problems=probs)
    assert torch.equal(a.input_ids, g.input_ids) and torch.equal(a.reward, g.reward)
    gpu_cfg.temperature = 1.0
    s1, s2 = (rollout.sample(cuda, tok, gpu_cfg, problems=probs, seed=4) for _ in range(2))
    assert torch.equal(s1.input_ids, s2.input_ids) and s1.input_ids.device.type == "cpu"
    assert s1.reward.shape == (6,) and s1.group.tolist() == [0, 0, 1, 1, 2, 2]
    c1, c2 = (value.sample_continuations(cuda, [[3, 5, 6]], 8, [6], [1, DOT], 0, [9],
                                         token_chunk=KNOBS.token_chunk) for _ in range(2))
    assert torch.equal(c1[0], c2[0]) and c1[0].device.type == "cpu"


def test_rewards_see_responses_without_special_tokens(canonical_standins):
    """A chat model's response ends in <|im_end|>; DAPO's "Answer:" line must not read "12<|im_end|>".
    The stand-ins of data/standins (built once per session, as the paper-smoke tests build them; a no-op
    once there), not a build of their own: the same seed-0 build, a ~30 s build fewer."""
    paths = canonical_standins
    model, tok = policy.load_policy(paths["model"])
    src = sources.ProblemSource(path=paths["dapo"])
    b = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=4, G=4, max_new_tokens=24, source=src), seed=1)
    assert not any("<|im_end|>" in t or "<|endoftext|>" in t for t in b.texts)
    assert src.verifier().stats["unparsed_response"] == 0 and b.reward.sum() > 0
