"""The vLLM seam after a weight push and inside `--procs` ranks (issue 63, items 3 and 4), against tests/fake_vllm.

Item 3: `sync_weights` resets the engine's prefix cache, so the GRPO loop's next round samples from the weights
it just pushed; the fake models vLLM's prefix cache (whole blocks' keys and values, stale until reset), and what
it samples is checked against the HF model's own forward with the new weights.
Item 4: an engine built inside a torch.distributed group of several ranks uses vLLM's external launcher (TRL's
colocate mode); `--procs N` on CUDA is refused before any work when N exceeds the visible GPUs.
"""
import copy
import os
from pathlib import Path

import pytest
import torch

from cancellation import execute, procs, run, sampler, tasks, train, vllm_seam

FAKE_VLLM = Path(__file__).parent / "fake_vllm"
DOT = tasks.VOCAB.index(".")   # a second stop id, as <|im_end|> beside <|endoftext|>
# A worked example before every problem: all prompts share their first 16-token block (vLLM's block size), as the
# paper profile's prompts share the chat template and the instruction.
INSTRUCTION = "Q: 9 9 + 1 1 = ? A: First ones digit : 9 + 1 = 1 0 , write 0 carry 1 . "


class Instructed:
    """Generated arithmetic rendered behind INSTRUCTION (the ProblemSource methods the loop uses)."""

    def draw(self, n, seed):
        return tasks.sample_problems(n, seed=seed)

    def render(self, problem, tokenizer):
        return INSTRUCTION + problem.prompt

    def verifier(self):
        return tasks.verify


# The fake's model is plain transformers (float32 RMSNorm inside) and the training model has exact float64 norms
# (policy.exact_norms): they agree to ~1e-6 in log-probs; keys and values of other weights move them by ~0.1.
TOL = 1e-5


def perturb(model, seed: int, scale: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


@torch.no_grad()
def hf_logprobs(model, prompt: list, seq: list) -> torch.Tensor:
    """log p(seq | prompt) token by token from the HF model's own forward (no cache)."""
    logits = model(input_ids=torch.tensor([prompt + seq])).logits[0, len(prompt) - 1:-1].double()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq)[:, None])[:, 0]


def worst_gap(model, outs) -> float:
    """Largest |log p| gap between what the engine sampled from and the HF model's forward, over `outs`."""
    return max(float((torch.tensor(c.sampled_logprobs, dtype=torch.float64)
                      - hf_logprobs(model, o.prompt_token_ids, list(c.token_ids))).abs().max())
               for o in outs for c in o.outputs)


# ----------------------------------------------------------------------------- item 3: the prefix cache
def test_the_fake_prefix_cache_is_stale_until_reset(fake_vllm, saved_model, tok):
    """The fake is faithful where the test below needs it: a prompt whose first block was cached before a weight
    push is sampled from the old keys and values (its log-probs are not the new weights'), until
    reset_prefix_cache(); without prefix caching nothing is reused."""
    m, path = saved_model
    prompt = tok(INSTRUCTION + "Q: 1 2 + 3 4 = ? A:", add_special_tokens=False)["input_ids"]
    whole = (len(prompt) - 1) // 16 * 16     # its whole blocks short of the last token: what a second request reuses
    assert whole >= 16
    sp = fake_vllm.SamplingParams(n=2, max_tokens=6, seed=1, stop_token_ids=[tok.eos_token_id, DOT])
    llm = fake_vllm.LLM(str(path), dtype="float64", enable_prefix_caching=True)
    first = llm.generate([{"prompt_token_ids": prompt}], sp)
    assert first[0].num_cached_tokens == 0 and worst_gap(m, first) < TOL
    new = copy.deepcopy(m)
    perturb(new, seed=1)
    llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights(new.state_dict().items())
    stale = llm.generate([{"prompt_token_ids": prompt}], sp)
    assert stale[0].num_cached_tokens == whole and worst_gap(new, stale) > 100 * TOL
    assert llm.reset_prefix_cache() is True
    fresh = llm.generate([{"prompt_token_ids": prompt}], sp)
    assert fresh[0].num_cached_tokens == 0 and worst_gap(new, fresh) < TOL
    again = llm.generate([{"prompt_token_ids": prompt}], sp)          # cached now, with the new weights
    assert again[0].num_cached_tokens == whole and worst_gap(new, again) < TOL
    off = fake_vllm.LLM(str(path), dtype="float64")
    off.generate([{"prompt_token_ids": prompt}] * 2, sp)
    assert not off.blocks and off.outputs[-1].num_cached_tokens == 0


def test_the_training_loop_samples_the_weights_it_pushed(fake_vllm, saved_model, tok, monkeypatch):
    """01's and 08's loop (train.grpo_loop with a vLLM PolicySampler): after each update `Step.update` pushes the
    weights (PolicySampler.sync -> vllm_seam.sync_weights), and the next round's prompts share a cached block with
    the last round's. What the engine samples after the push must come from the new weights: its log-probs equal
    the HF model's forward with them. The update is a known large change (the GRPO step on a random model moves
    little); the rest is the library's loop."""
    m, path = saved_model

    def update(model, *args, **kw):   # stands in for train.minibatch_update: new weights, nothing else
        perturb(model, seed=100 + len(pushed))
        pushed.append(True)
        return []
    pushed = []
    monkeypatch.setattr(train, "minibatch_update", update)
    cfg = train.RunConfig(steps=3, n_prompts=2, G=3, max_new_tokens=6, backend="vllm", sample_dtype="float64",
                          source=Instructed(), seed=0)
    policy_sampler = train.PolicySampler(m, path, cfg.sample_config(m))
    llm = policy_sampler.engine
    assert llm.init_kwargs["enable_prefix_caching"] is True
    for step in train.grpo_loop(m, tok, cfg, None, policy_sampler, dict(iteration=0, round=0), cfg.steps,
                                progress=False):
        outs = llm.outputs[-cfg.n_prompts:]           # this round's requests, in the batch's row order
        rows = [list(c.token_ids) for o in outs for c in o.outputs]
        b = step.batch
        assert rows == [b.input_ids[r, b.response_mask[r]].tolist() for r in range(len(b))]
        gap = worst_gap(m, outs)
        assert gap < TOL, (f"step {step.it} (after {len(pushed)} pushes): the engine sampled from log-probs "
                            f"{gap:.3g} away from the current weights' (a stale prefix cache?)")
        assert any(o.num_cached_tokens for o in outs)  # the shared block came from the prefix cache
        step.update()
    assert len(pushed) == cfg.steps and llm.resets == cfg.steps


def test_sync_weights_resets_the_prefix_cache(fake_vllm, saved_model):
    m, path = saved_model
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64")
    llm.blocks[(1,) * 16] = []
    assert vllm_seam.sync_weights(llm, m) == len(m.state_dict()) and llm.resets == 1 and not llm.blocks
    llm.reset_prefix_cache = lambda device=None: False    # a version that could not free its blocks
    with pytest.raises(RuntimeError, match="could not reset its prefix cache"):
        vllm_seam.sync_weights(llm, m)


# ----------------------------------------------------------------------------- item 4: vLLM in --procs ranks
def in_group(monkeypatch, world: int, rank: int = 0):
    """This process as rank `rank` of an initialised torch.distributed group of `world` (what procs._worker's
    PartialState leaves), without starting one."""
    import torch.distributed as dist
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)


def test_an_engine_in_a_rank_uses_the_external_launcher(fake_vllm, saved_model, monkeypatch):
    """In a group of several ranks the engine joins it (distributed_executor_backend="external_launcher", TRL's
    colocate mode) with the run's own seed; outside one (or in a group of one) the arguments are as before."""
    m, path = saved_model
    plain = dict(model=str(path), dtype="float64", seed=3, enable_prefix_caching=True, gpu_memory_utilization=0.25)
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64", seed=3, gpu_memory_utilization=0.25)
    assert llm.init_kwargs == plain
    in_group(monkeypatch, world=1)
    assert sampler.make_sampler(m, path, backend="vllm", dtype="float64", seed=3,
                                gpu_memory_utilization=0.25).init_kwargs == plain
    in_group(monkeypatch, world=4, rank=2)
    llm = sampler.make_sampler(m, path, backend="vllm", dtype="float64", seed=3, gpu_memory_utilization=0.25)
    assert llm.init_kwargs == {**plain, "distributed_executor_backend": "external_launcher"}


def cuda_host(monkeypatch, gpus: int):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)


def test_procs_against_the_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cuda_host(monkeypatch, 1)
    line = procs.device_problem(8, {"05_value_gap": "cuda", "06_sampling_budget": "cuda:0"})
    assert "\n" not in line and "--procs 8" in line and "1 visible GPU" in line and "--procs 1" in line
    assert "05_value_gap" in line and "CUDA_VISIBLE_DEVICES=0" in line
    assert procs.device_problem(1, {"05_value_gap": "cuda"}) is None
    assert procs.device_problem(8, {"05_value_gap": "cpu"}) is None       # CPU ranks: processes on this host
    assert procs.device_problem(8, {}) is None                            # nothing split over processes
    cuda_host(monkeypatch, 8)
    assert procs.device_problem(8, {"05_value_gap": "cuda"}) is None
    cuda_host(monkeypatch, 0)
    assert "0 visible GPUs" in procs.device_problem(2, {"05_value_gap": "cuda"})
    with pytest.raises(procs.RankFailed, match="--procs 2"):   # fan_out itself refuses before it launches
        procs.fan_out("cancellation.procs:_probe", {}, [1, 2, 3], n=2, cuda=True)


def test_the_runner_refuses_too_many_procs_before_any_work(monkeypatch, capsys):
    """`--procs 8` for a CUDA notebook on a 1-GPU host: one line naming both numbers and the fix, and no
    notebook starts; on the CPU (the same host, a CPU profile) --procs 8 runs as before."""
    cuda_host(monkeypatch, 1)
    ran = []
    monkeypatch.setattr(execute, "run_notebook", lambda nb, *a, **kw: ran.append(Path(nb).stem))
    with pytest.raises(SystemExit) as e:
        run.main(["05", "--profile", "smoke", "-p", "device", "cuda", "--procs", "8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and not ran
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "--procs 8" in lines[0] and "1 visible GPU" in lines[0] and "pass --procs 1" in lines[0], err
    assert procs.PROCS_ENV not in os.environ
    run.main(["05", "--profile", "smoke", "--procs", "8"])     # device cpu: CPU ranks, as today
    assert ran == ["05_value_gap"]


def test_01s_vllm_runs_in_a_rank_build_their_engines_outside_the_group(fake_vllm, saved_model, tmp_path,
                                                                        monkeypatch):
    """01's Δlog p runs under `--procs N` (train._rank_delta_runs): building an engine inside the group is a
    collective (the external launcher), and a rank builds one per run of its share, so 3 runs on 2 ranks would
    leave rank 0 waiting forever in its second engine. Each vLLM run of a rank therefore trains in a child
    outside the group (procs.isolated): no engine is built in the rank's own process, the child's engine has no
    external launcher, and the cached table is the one-process run's, bit for bit. An HF run (no engine) still
    trains in the rank. On the old code rank 0 built both engines in the group (external_launcher)."""
    from cancellation import cache, policy, stage
    m, path = saved_model
    monkeypatch.setattr(cache, "DEFAULT_DIR", tmp_path / "cache")      # this process's cache and the child's
    monkeypatch.setenv("CANCELLATION_CACHE", str(tmp_path / "cache"))
    lib = Path(__file__).parents[1] / "lib"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE_VLLM), str(lib)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))   # the child imports the fake too
    built = []                                                         # engines built in this process
    init = fake_vllm.LLM.__init__

    def record(self, *a, **kw):
        built.append(kw)
        init(self, *a, **kw)
    monkeypatch.setattr(fake_vllm.LLM, "__init__", record)
    calls = []
    isolated = procs.isolated
    monkeypatch.setattr(procs, "isolated", lambda fn, *a: calls.append(fn) or isolated(fn, *a))

    small = dict(steps=2, n_prompts=2, G=3, max_new_tokens=6)
    runs = [(path, train.RunConfig(**small, backend="vllm", seed=0)),
            (path, train.RunConfig(**small, backend="vllm", seed=1)),
            (path, train.RunConfig(**small, backend="hf", seed=2))]
    model, tok = policy.load_policy(path, dtype="float64")           # run 0 on one process: the reference
    ref = train.delta_run(model, tok, runs[0][1], progress=False, model_path=path)
    assert len(built) == 1 and "distributed_executor_backend" not in built[0]
    built.clear()
    shared = dict(dtype="float64", device="cpu", threads=torch.get_num_threads())   # as cached_delta_runs
    in_group(monkeypatch, world=2, rank=0)                            # rank 0's share of 3 runs on 2 ranks
    assert train._rank_delta_runs(shared, runs[:2], None) == [True, True]
    in_group(monkeypatch, world=2, rank=1)
    assert train._rank_delta_runs(shared, runs[2:], None) == [True]
    assert built == [], f"engines built inside the group: {built}"
    assert calls == ["cancellation.train:_isolated_delta_run"] * 2    # the HF run stayed in the rank
    key = lambda c: dict(model=policy.fingerprint(path), dtype="float64", device="cpu", run=c)  # noqa: E731
    assert all(stage.DELTA_RUN.is_cached(**key(c)) for _, c in runs)
    pd_ref = train.cached_delta_run(path, runs[0][1], "float64", "cpu")   # read back: nothing trained here
    assert built == [] and pd_ref.equals(ref)
