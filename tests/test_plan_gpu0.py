"""The planner's first GPU and fan-outs (issue 63, item 5): every process's CUDA context and rank 0's float policy
beside its sampler on GPU 0, each fan-out's launch, model load and vLLM engine start in the time per process, and a
notebook measured above plan by a committed gpu-check dry run carries that factor. Each term against its closed
form, written here."""
import json

import pytest

from cancellation import measured, plan, profiles, resolve, run

H100, H200 = "nvidia-h100-80gb-hbm3", "nvidia-h200"
GiB = 2 ** 30


def _params(ref: str, profile: str = "paper-quick", **over) -> dict:
    return {**resolve.resolve_params(profiles.find_notebook(ref), profile), **over}


def _plan(stem: str, profile: str = "paper-quick", kind: str = H100, procs: int = 1, measured_dir=None, **over):
    return plan.make(stem, _params(stem[:2], profile, **over), kind=kind, procs=procs, measured_dir=measured_dir)


def test_05_on_8_processes_no_longer_passes_at_over_100_percent(capsys):
    """The plan that passed 05 at 78.69 of 79 GiB with --procs 8 on an H100 now counts GPU 0's two CUDA contexts
    (the kernel's, rank 0's) and rank 0's float32 policy, which its vLLM engine keeps as hf_model: refused in one
    line naming the knob."""
    p = _plan("05_value_gap", procs=8)
    n = p.shape.params
    assert p.card == {"cuda_contexts": 2 * plan.CUDA_CONTEXT, "rank0_policy": 4 * n}
    assert p.peak == sum(p.mem.values()) + 2 * plan.CUDA_CONTEXT + 4 * n
    assert sum(p.mem.values()) / GiB == pytest.approx(78.69, abs=0.01)   # the closed forms as before
    assert p.peak > p.total_memory
    err = plan.check(p)
    assert err is not None and "\n" not in err
    assert err.startswith("05_value_gap: planned peak memory ") and "2 CUDA contexts included" in err
    assert "turn gpu_memory_utilization" in err and "(or pass --no-plan-check)" in err
    with pytest.raises(SystemExit) as e:    # the runner: exit 2 on it, one error line
        raise SystemExit(run.main(["05", "--profile", "paper-quick", "--plan", "--device-kind", H100, "--procs", "8"]))
    assert e.value.code == 2
    assert capsys.readouterr().err.count("error: 05_value_gap: planned peak memory") == 1


def test_cuda_contexts_per_process_on_gpu_0():
    """One context per process on the first GPU: the kernel's alone on one process or without a built split; rank
    0's beside it; 07's TRL runs (isolated) one more, in rank 0's child. None on the CPU."""
    c = plan.CUDA_CONTEXT
    assert c == GiB // 2
    assert _plan("05_value_gap").card == {"cuda_contexts": c}
    assert _plan("08_referee_controls", procs=8).card == {"cuda_contexts": c}        # nothing split: no ranks
    assert _plan("04_category_shift", procs=8).card == {"cuda_contexts": 2 * c}      # whole batches: no extra copy
    seven = _plan("07_batching", procs=8)
    assert seven.card == {"cuda_contexts": 3 * c} and "(the kernel, rank 0, its isolated child)" in "\n".join(seven.lines())
    assert _plan("05_value_gap", profile="tiny", kind=None, procs=8).card == {}      # CPU ranks
    # a measured context (a scale file's cuda_context_bytes) replaces the estimate
    units = dict(measured.load_units(H100), cuda_context_bytes=3 * 2 ** 28)
    p = plan.make("05_value_gap", _params("05"), kind=H100, units=units, procs=8)
    assert p.card["cuda_contexts"] == 2 * 3 * 2 ** 28 and f"measured on {H100}" in "\n".join(p.lines())


def test_rank_0_policy_beside_its_sampler():
    """HF sampler: the float32 policy until its sample_dtype copy is made, before the KV cache: max(4n - KV, 0) more
    than rank_memory's copy. 06: its settings x seeds ranks hold the policy, gradients, activations and logits
    (an SGD step) instead of the sampler; rank 0's larger stage counts."""
    hf = _plan("05_value_gap", procs=8, backend="hf")
    n = hf.shape.params
    assert "vllm" not in hf.mem and hf.mem["ranks"] == 2 * n + hf.mem["kv_cache"]
    assert hf.card.get("rank0_policy", 0) == max(4 * n - hf.mem["kv_cache"], 0)   # 05: its KV cache outweighs it
    six = _plan("06_sampling_budget", procs=8)
    m = six.mem
    sweep = 4 * n + 4 * n + m["activations"] + m["logits"] - m["ranks"]
    assert six.card["rank0_policy"] == max(4 * n, sweep)


def test_fan_outs_launch_load_and_engine_per_process():
    """05 on 8 processes: one fan-out per estimator, the pool of 11 and the held-out tokens (procs.FAN_OUTS), each
    paying the launch (the kind's measured notebook start), the float32 policy's load (a stated 1 GB/s) and a
    vLLM engine start (a stated 60 s); measured units replace each; one process pays none."""
    P = _params("05")
    one, eight = _plan("05_value_gap"), _plan("05_value_gap", procs=8)
    u = measured.load_units(H100)
    calls = len(P["estimators"]) + 1 + (1 if P["heldout_per_cell"] else 0)
    each = u["units"]["start"]["seconds"] + eight.shape.params * 4 / 1e9 + 60.0
    closed = plan.seconds_per_process(eight.work, eight.shape, u, 8, eight.stem)
    assert eight.fan_out["fan_outs"] == calls == 4 and eight.fan_out["engines"] == calls
    assert eight.proc_seconds == pytest.approx(closed + calls * each, rel=1e-12)
    assert one.proc_seconds == pytest.approx(one.seconds) and not one.fan_out
    text = "\n".join(eight.lines())
    assert "each process starts 4 fan-outs: launch 26 s (measured notebook start)" in text
    assert "(estimate: 6.9 GB at 1 GB/s)" in text and "vLLM engine start 60 s (estimate) in 4" in text
    units = json.loads(json.dumps(u))
    units["units"].update(launch={"seconds": 5.0}, load={"s_per_byte": 1e-9}, vllm_engine={"seconds": 40.0})
    m = plan.make("05_value_gap", P, kind=H100, units=units, procs=8)
    assert m.proc_seconds == pytest.approx(closed + calls * (5.0 + m.shape.params * 4 * 1e-9 + 40.0), rel=1e-12)
    assert "vLLM engine start 40 s (measured)" in "\n".join(m.lines())
    # 06: the settings x seeds ranks rebuild the policy only (no engine); the valued tokens' once per batch (2)
    six = _plan("06_sampling_budget", procs=8)
    assert (six.fan_out["fan_outs"], six.fan_out["engines"]) == (3, 2)
    # 01 trains the grid's and Fig. 9's runs in one fan_out
    assert _plan("01_token_flipping", procs=8).fan_out["fan_outs"] == 1


def _report(d, kind: str, date: str, stem: str, seconds: float, gib: float, planned_s: float = 100.0,
            planned_gib: float = 10.0):
    """A gpu-check report with one dry-run step of `stem` (the runner's record: measured beside planned)."""
    row = dict(notebook=stem, overrides={"max_new_tokens": "16"}, measured_seconds=seconds, peak_cuda_gib=gib,
               planned=dict(notebook=stem, device_kind=kind, peak_gib=planned_gib, predicted_seconds=planned_s))
    f = d / f"gpucheck-{kind}-{date}.json"
    f.write_text(json.dumps({"device": {"kind": kind}, "steps": [{"step": "pytest", "rc": 0},
                                                                {"step": f"dry-{stem[:2]}", "measured": row}]}))
    measured.dry_runs.cache_clear()
    return f


def test_a_measured_factor_moves_the_plan_by_exactly_that_factor(tmp_path):
    """A dry run measured at 1.76x its plan (time and memory): the plan's time and its one-process memory terms
    x1.76 exactly (vLLM's share, rank 0's copy and GPU 0's contexts as they are), said with the report; a
    newer dry run at or below plan replaces it; another kind's report does not apply."""
    base = _plan("03_masked_updates", measured_dir=tmp_path)
    assert base.factor is None
    f = _report(tmp_path, H100, "2030-01-01", "03_masked_updates", 176.0, 17.6)
    got = _plan("03_masked_updates", measured_dir=tmp_path)
    assert got.factor["memory"] == pytest.approx(1.76) and got.factor["seconds"] == pytest.approx(1.76)
    assert got.seconds == pytest.approx(1.76 * base.seconds, rel=1e-12)
    assert got.proc_seconds == pytest.approx(1.76 * base.proc_seconds, rel=1e-12)
    scaled = lambda p: sum(v for k, v in p.terms.items() if k in p.mem and k not in plan.UNSCALED)  # noqa: E731
    assert scaled(got) == pytest.approx(1.76 * scaled(base), rel=1e-12)
    assert got.peak - scaled(got) == pytest.approx(base.peak - scaled(base), abs=1)   # contexts (any vLLM share) unscaled
    assert got.closed_peak == base.closed_peak and got.as_dict()["peak_gib"] == base.as_dict()["peak_gib"]
    assert got.as_dict()["predicted_seconds"] == pytest.approx(base.seconds)   # a new dry run compares with these
    text = "\n".join(got.lines())
    assert "measured above plan: memory x1.76 and time x1.76" in text and str(f) in text and "2030-01-01" in text
    # with vLLM: its share stays
    v = _plan("05_value_gap", measured_dir=tmp_path)
    _report(tmp_path, H100, "2030-01-02", "05_value_gap", 176.0, 17.6)
    vf = _plan("05_value_gap", measured_dir=tmp_path)
    assert vf.terms["vllm"] == v.terms["vllm"] and vf.terms["weights"] == pytest.approx(1.76 * v.terms["weights"])
    # a newer dry run within its plan replaces the factor; one of another kind does not apply
    _report(tmp_path, H100, "2030-02-01", "03_masked_updates", 90.0, 9.0)
    assert _plan("03_masked_updates", measured_dir=tmp_path).factor is None
    _report(tmp_path, H200, "2030-03-01", "03_masked_updates", 300.0, 30.0)
    assert _plan("03_masked_updates", measured_dir=tmp_path).factor is None
    # only memory above plan: the time stays
    _report(tmp_path, H100, "2030-04-01", "03_masked_updates", 50.0, 15.0)
    half = _plan("03_masked_updates", measured_dir=tmp_path)
    assert half.factor["memory"] == pytest.approx(1.5) and half.factor["seconds"] == 1.0
    assert half.seconds == pytest.approx(base.seconds) and "measured above plan: memory x1.50, carried" in \
        "\n".join(half.lines())
    measured.dry_runs.cache_clear()


def test_the_committed_h200_dry_runs_carry_their_factors():
    """data/scale/measured/gpucheck-nvidia-h200-2026-11-26.json measured 06 at 59.24 GiB against 33.63 planned
    (1.76x) and 47.66 s against 30.97 s for 05 (1.54x): plans on the H200 carry them; 08 measured within its
    memory plan (0.95x), so only its time factor."""
    six = _plan("06_sampling_budget", kind=H200)
    assert six.factor["memory"] == pytest.approx(59.23529624938965 / 33.625744104385376)
    assert six.factor["report"] == "data/scale/measured/gpucheck-nvidia-h200-2026-11-26.json"
    five = _plan("05_value_gap", kind=H200)
    assert five.factor["seconds"] == pytest.approx(47.66 / 30.969789575825658)
    eight = _plan("08_referee_controls", kind=H200)
    assert eight.factor["memory"] == 1.0 and eight.factor["seconds"] > 1
    assert _plan("06_sampling_budget", kind=H100).factor is None     # no gpu-check dry run on the H100
