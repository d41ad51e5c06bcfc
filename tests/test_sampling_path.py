"""The hf backend's two sampling paths (issue 49, item 3): transformers' own generate against ours (greedy:
the same tokens from two implementations; sampled: the law of a full softmax, whatever a checkpoint's
generation_config says), its seeding, and which path `hf_sampler='auto'` resolves to and keys."""
import dataclasses
import json

import pytest
import torch

from cancellation import gpucheck, manifest, plan, policy, rollout, sampler, sampling_path, sources, workload
from cancellation.figures import fig02, fig03

TOKEN_CHUNK = 2048


@pytest.fixture(scope="module")
def tiny():
    model, tok = policy.load_policy("data/policies/tiny-m")
    return model.double(), tok


def _prompts(tok, n=6, G=2):
    """Rendered arithmetic prompts of unequal lengths (left-padded), G rollouts each."""
    source = sources.ProblemSource()
    seqs = rollout.encode_prompts(tok, [source.render(p, tok) for p in source.draw(n, 0)])
    ids, mask = rollout.left_pad(seqs, tok.pad_token_id)
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
    """'auto' is ours on a CPU (the tiny keys do not move: the field is keyless at ours), ours on a CUDA card when
    no notebook's sampling calls are given (issue 63, item 7: nothing to decide at; the H200 report's steady
    state alone no longer picks transformers'), ours on a card with no report, and stays 'auto' when no CUDA
    device is visible. A figure sampled by transformers' path has another key."""
    assert sampling_path.resolve("auto", "cpu") == "ours"
    assert sampling_path.resolve("ours", "cuda") == "ours"
    with pytest.raises(ValueError, match="hf_sampler"):
        sampling_path.resolve("fast", "cpu")
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "cuda")
    assert sampling_path.resolve("auto", "cuda") == "auto"
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "nvidia-h200")
    assert sampling_path.resolve("auto", "cuda:0") == "ours"
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "no-such-card")
    assert sampling_path.resolve("auto", "cuda") == "ours"
    P = fig02.Params()
    assert P.hf_sampler == "auto" and "hf_sampler" not in P.cache_params()
    assert fig02.Params(hf_sampler="transformers").cache_params()["hf_sampler"] == "transformers"
    assert "hf_sampler" not in rollout.config_params(rollout.SampleConfig())


# --------------------------------------------------------------------------- issue 63, item 7: auto, end to end
OURS_WAY = "ours (static cache, CUDA graph)"
# the steady state as the H200 measured it at 64 x 512 (transformers' 2.2x ours), and a notebook shape where
# transformers' static cache + compile is again 2x ours steady but its first call (the compile) costs 35 s more
H200_LIKE = {"64 x 512": {OURS_WAY: (2977.3, 12.4), sampling_path.STATIC: (6435.3, 43.8)},
             "32 x 1024, prompt 512": {OURS_WAY: (1500.0, 25.0), sampling_path.STATIC: (3000.0, 60.0)}}


def _report(ways: dict) -> dict:
    rows = [dict(shape=sh, way=w, tokens_per_s=t, first_call_s=f) for sh, d in ways.items() for w, (t, f) in d.items()]
    return dict(device=dict(kind="fake-card", packages={}), steps=[dict(step="sampler", rc=0, rows=rows)])


def _calls(n_prompts: int, prompt: int = 250) -> list[dict]:
    """Notebook 02's sampling calls at paper-quick's sizes (sample_rows 32, 1,024 new tokens), n_prompts x 8 rows."""
    P = fig02.Params(n_prompts=n_prompts, G=8, sample_rows=32, max_new_tokens=1024, device="cuda")
    return plan.sampling_calls(P, prompt=prompt)


@pytest.fixture
def card(tmp_path, monkeypatch):
    """A CUDA card of kind 'fake-card' whose reports live in tmp_path (nothing chosen yet in this process)."""
    monkeypatch.setattr(sampling_path, "MEASURED", tmp_path)
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "fake-card")
    monkeypatch.setattr(sampling_path, "_chosen", {})
    return tmp_path


def _write(where, date, ways):
    f = where / f"gpucheck-fake-card-{date}.json"
    f.write_text(json.dumps(_report(ways)))
    return f


def test_auto_picks_ours_end_to_end_when_few_calls_pay_transformers_compile(card, capsys):
    """Transformers' static cache + compile wins the steady state (the report's summary picks it), but notebook
    02 at paper-quick's sizes samples 2 calls of 32 x 1,024: ours 25.0 + 21.8 s against 60.0 + 10.9 s. Auto picks
    ours, and says so once per notebook, with its numbers and the report."""
    f = _write(card, "2026-12-01", H200_LIKE)
    assert sampling_path.choose_sampler(_report(H200_LIKE))["path"] == "transformers"
    calls = _calls(8)
    assert calls == [dict(rows=32, new=1024, prompt=250, calls=2)]
    assert sampling_path.resolve("auto", "cuda:0", calls=calls, notebook="02_coupling_heatmaps") == "ours"
    assert sampling_path.resolve("auto", "cuda:0", calls=lambda: _calls(8), notebook="02_coupling_heatmaps") == "ours"
    out = capsys.readouterr().out
    assert out.count("hf_sampler auto") == 1, out
    assert ("hf_sampler auto, 02_coupling_heatmaps on fake-card: ours; end to end, 2 x 32 x 1024, prompt 250: "
            "ours 47 s (25.0 s first + 1 x 21.8 s) against transformers' static cache + compile 71 s (60.0 s first "
            f"+ 1 x 10.9 s) [{f}") in out


def test_auto_picks_transformers_where_it_wins_end_to_end(card):
    """320 rows (02 at n_prompts 40): 10 calls of 32 x 1,024 -- ours 25 + 9 x 21.8 = 222 s, transformers' 60 +
    9 x 10.9 = 158 s: the compile pays for itself."""
    _write(card, "2026-12-01", H200_LIKE)
    calls = _calls(40)
    assert calls == [dict(rows=32, new=1024, prompt=250, calls=10)]
    c = sampling_path.choose(_report(H200_LIKE), calls)
    assert c["path"] == "transformers" and round(c["seconds"]["ours"]) == 222 and round(c["seconds"]["transformers"]) == 158
    assert sampling_path.resolve("auto", "cuda", calls=calls, notebook="02") == "transformers"


def test_auto_is_ours_where_a_shape_was_not_measured(card, capsys):
    """Static cache + compile timed only at bench's 64 x 512 (the committed H200 report: 2.2x ours there), never at
    the notebook's 32 x 1,024: ours, naming the shape. A prompt longer than any measured one is no measurement
    either; the committed H200 report measured neither path at 32 x 1,024."""
    only_ours = {"64 x 512": H200_LIKE["64 x 512"], "32 x 1024, prompt 512": {OURS_WAY: (1500.0, 25.0)}}
    _write(card, "2026-12-01", only_ours)
    assert sampling_path.resolve("auto", "cuda:0", calls=_calls(40), notebook="02") == "ours"
    assert ("no measurement at 32 x 1024, prompt >= 250 (transformers' static cache + compile)"
            in capsys.readouterr().out)
    c = sampling_path.choose(_report(H200_LIKE), _calls(40, prompt=600))
    assert c["path"] == "ours" and c["why"] == ("no measurement at 32 x 1024, prompt >= 600 (ours, transformers' "
                                                "static cache + compile)")
    h200 = json.loads((sampling_path.ROOT / "data/scale/measured/gpucheck-nvidia-h200-2026-11-26.json").read_text())
    assert sampling_path.choose(h200, _calls(40))["path"] == "ours"
    assert sampling_path.choose(None, _calls(40))["why"] == "no gpu-check report of this device kind"
    assert sampling_path.parse_shape("64 x 512") == (64, 512, 64)      # the old rows: bench_sampling.sampler's 64-token prompts
    assert sampling_path.parse_shape("32 x 1024, prompt 512") == (32, 1024, 512)


def test_an_uncommitted_newer_report_is_used_and_named(card, capsys):
    """A fresh gpu-check report counts before anyone commits it: the newest by date, committed or not, and the
    line says which (', uncommitted')."""
    import subprocess
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q", str(card)], check=True)
    old = _write(card, "2026-11-26", {"64 x 512": H200_LIKE["64 x 512"]})    # committed: no notebook shape
    subprocess.run(git + ["add", old.name], cwd=card, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "r"], cwd=card, check=True)
    new = _write(card, "2026-12-01", H200_LIKE)                              # written, not committed
    assert sampling_path.newest_report("fake-card") == new
    assert sampling_path.report_label(new) == f"{new}, uncommitted" and sampling_path.report_label(old) == str(old)
    assert sampling_path.resolve("auto", "cuda:0", calls=_calls(40), notebook="02") == "transformers"
    assert f"[{new}, uncommitted]" in capsys.readouterr().out
    assert sampling_path.default_cuda_sampler("fake-card")["report"] == f"{new}, uncommitted"


# ------------------------------------------------- issue 63, item 7: the notebooks' own Params give their calls
def _paper_quick(mod, **over):
    """A figure's Params at its section of paper-quick (notebooks/params/paper-quick.yaml), on CUDA."""
    names = {f.name for f in dataclasses.fields(mod.Params)}
    nb = next(f.key for f in manifest.FIGURES if f.module == mod.__name__.rsplit(".", 1)[-1])
    sec = {**gpucheck.profile_section(nb, "paper-quick"), "device": "cuda:0", **over}
    return mod.Params(**{k: v for k, v in sec.items() if k in names})


@pytest.fixture
def counted(monkeypatch):
    """plan.sampling_calls, counted per notebook; prompts of 250 tokens (the hub tokenizer and DAPO's file need
    not be here: the planner's own lengths are what the notebook would count on the card)."""
    monkeypatch.setattr(plan, "prompt_lengths", lambda P, root=None: (200, 250, "test"))
    n, real = {}, plan.sampling_calls

    def spy(P, prompt=None):
        n[P.notebook()] = n.get(P.notebook(), 0) + 1
        return real(P, prompt)
    monkeypatch.setattr(plan, "sampling_calls", spy)
    return n


def test_hf_path_resolves_auto_from_the_notebooks_own_calls_once(card, counted, capsys):
    """On a CUDA card, a figure's Params resolve 'auto' from their own notebook's sampling calls (plan.sampling_calls
    of its planner workload), not 'ours for want of calls': paper-quick's 02 samples 2 x 32 x 1,024 (ours: the
    compile does not pay), its 03 10 x 32 x 1,024 (transformers'). Each notebook's line is printed once and its calls
    counted once, however often hf_path and cache_params ask and from however many Params instances; the resolved
    path is in 03's cache key."""
    f = _write(card, "2026-12-01", H200_LIKE)
    P2, P3 = _paper_quick(fig02), _paper_quick(fig03)
    assert P2.notebook() == "02_coupling_heatmaps" and P3.notebook() == "03_masked_updates"
    assert [P2.hf_path() for _ in range(3)] == ["ours"] * 3
    assert [P3.hf_path() for _ in range(3)] == ["transformers"] * 3
    assert P3.cache_params()["hf_sampler"] == "transformers" and "hf_sampler" not in P2.cache_params()
    assert _paper_quick(fig03).hf_path() == "transformers" and _paper_quick(fig02).cache_params() == P2.cache_params()
    assert counted == {"02_coupling_heatmaps": 1, "03_masked_updates": 1}
    out = capsys.readouterr().out
    assert out.count("hf_sampler auto, 02_coupling_heatmaps on fake-card: ours; end to end, 2 x 32 x 1024, "
                     f"prompt 250: ours 47 s (25.0 s first + 1 x 21.8 s) against transformers' static cache + compile "
                     f"71 s (60.0 s first + 1 x 10.9 s) [{f}") == 1, out
    assert out.count("hf_sampler auto, 03_masked_updates on fake-card: transformers; end to end, 10 x 32 x 1024, "
                     "prompt 250: transformers' static cache + compile 158 s") == 1, out
    assert out.count("hf_sampler auto") == 2, out
    assert _paper_quick(fig02, hf_sampler="ours").hf_path() == "ours" and counted["02_coupling_heatmaps"] == 1


def test_hf_path_on_a_cpu_is_ours_and_counts_nothing(monkeypatch, capsys):
    """On a CPU (and for a CUDA device not visible here: planning) 'auto' resolves without the notebook's calls:
    a counter that raises is never called, nothing is printed, and no cache key moves (tests/golden/keys.json)."""
    def boom(P, prompt=None):
        raise AssertionError("sampling calls counted")
    monkeypatch.setattr(plan, "sampling_calls", boom)
    monkeypatch.setattr(sampling_path, "_chosen", {})
    for f in manifest.FIGURES:
        P = f.load().Params()
        assert P.device == "cpu" and P.notebook() == f.notebook
        assert P.hf_path() == "ours" and "hf_sampler" not in P.cache_params()
    P = _paper_quick(fig03, device="cpu")
    assert P.hf_path() == "ours" and "hf_sampler" not in P.cache_params()
    monkeypatch.setattr(sampling_path, "device_kind", lambda d: "cuda")     # no CUDA device visible: the card unknown
    assert _paper_quick(fig03).hf_path() == "auto"
    assert capsys.readouterr().out == "" and sampling_path._chosen == {}


def test_recorded_samples_leaves_workload_sample_as_it_was():
    """The counter sees workload.sample's calls by wrapping it for its `with` block only: the real function is back
    after a workload that raises, the planner's counts are unchanged inside, and another thread's calls are passed
    through, never recorded."""
    import threading
    real, z = workload.sample, workload.Sizes(10, 12, 5)
    with pytest.raises(RuntimeError), plan.recorded_samples() as seen:
        w = workload.Work()
        workload.sample(w, 7, z, chunk_rows_decode=4, times=2)
        other = workload.Work()
        t = threading.Thread(target=workload.sample, args=(other, 3, z))
        t.start()
        t.join()
        raise RuntimeError("a workload that cannot be counted")
    assert workload.sample is real
    assert [(r, c, n) for r, c, n, _ in seen] == [(7, 4, 2)]
    ref, ref_other = workload.Work(), workload.Work()
    workload.sample(ref, 7, z, chunk_rows_decode=4, times=2)
    workload.sample(ref_other, 3, z)
    assert (w.blocks, w.kv_rows, other.blocks) == (ref.blocks, ref.kv_rows, ref_other.blocks)
    assert plan.sampling_calls(_paper_quick(fig02), prompt=250) == [dict(rows=32, new=1024, prompt=250, calls=2)]
    assert workload.sample is real
