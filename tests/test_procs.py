"""`run --procs N` (issue 36, item 3; issue 49: on accelerate's launcher): the fan-out (cancellation.procs),
and notebooks 01, 04, 05 and 06 on two CPU processes writing the same tables as on one, byte for byte; a rank that
dies stops the notebook with one line and promotes nothing."""
import os
from pathlib import Path

import pytest

from cancellation import cache, execute, manifest, procs, profiles, resolve, run


# ----------------------------------------------------------------------------- fast: no ranks started
def test_count_reads_the_environment(monkeypatch):
    monkeypatch.delenv(procs.PROCS_ENV, raising=False)
    monkeypatch.delenv(procs.RANK_ENV, raising=False)
    assert procs.count() == 1
    monkeypatch.setenv(procs.PROCS_ENV, "4")
    assert procs.count() == 4
    monkeypatch.setenv(procs.RANK_ENV, "1")   # inside a rank: never fan out again
    assert procs.count() == 1
    monkeypatch.delenv(procs.RANK_ENV)
    for bad in ("0", "two"):
        monkeypatch.setenv(procs.PROCS_ENV, bad)
        with pytest.raises(ValueError, match=procs.PROCS_ENV):
            procs.count()


def test_one_process_or_one_unit_runs_here(monkeypatch):
    """N = 1, or a single unit, never starts the launcher: the units run in this process, in order."""
    monkeypatch.setenv(procs.PROCS_ENV, "3")
    assert procs.fan_out("cancellation.procs:_probe", {}, [4]) == [(16, 0)]
    assert procs.fan_out("cancellation.procs:_probe", {}, [1, 2, 3], n=1) == [(1, 0), (4, 0), (9, 0)]


def test_failure_line_from_the_launcher_log(tmp_path):
    """The launcher's failure report (torch elastic's, under `accelerate launch --multi_gpu`) becomes one
    line: the rank, its exit code and signal."""
    (tmp_path / "log.txt").write_text("noise\nRoot Cause (first observed failure):\n[0]:\n  time      : x\n"
                                      "  host      : h\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n")
    line = procs._failure_line(tmp_path, 2, 1, "MC continuations (M=4)")
    assert line == "MC continuations (M=4): rank 1 of 2 died (exit code -9 (SIGKILL)); no outputs were written"
    (tmp_path / "rank0.error").write_text("ValueError: bad unit\n")
    assert procs._failure_line(tmp_path, 2, 1, "x") == "x: rank 0 of 2 failed: ValueError: bad unit; no outputs were written"


def test_procs_and_cores_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["05", "--profile", "smoke", "--procs", "2", "--cores", "2"])
    assert e.value.code == 2 and "--procs" in capsys.readouterr().err
    assert procs.PROCS_ENV not in os.environ   # main() leaves the environment as it found it


def test_the_launcher_is_accelerates():
    cmd = procs.launch_command(3)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[cmd.index("--num_processes") + 1] == "3"
    assert cmd[cmd.index("--main_process_port") + 1] == "0"   # a free port per launch: launches may overlap


def test_an_isolated_unit_runs_without_the_launchers_variables(monkeypatch):
    """procs.isolated: the call in a child process that does not see the rank's RANK/WORLD_SIZE (so TRL's
    Accelerator there is one process); the child's exception comes back as one line."""
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert procs.isolated("cancellation.procs:_probe", {}, [3], None) == [(9, 0)]   # $RANK unset in the child
    with pytest.raises(RuntimeError, match=r"^ValueError: probe refused unit 2$"):
        procs.isolated("cancellation.procs:_probe", {"raise_on": 2}, [2], None)


def test_the_plan_counts_rank_0_beside_the_kernel():
    """--procs N on CUDA: rank 0 shares the first GPU with the notebook's kernel, so the planned peak is the
    kernel's plus one sampler copy (vLLM: one more engine share of the device; HF: the weights in the sampling
    dtype and the KV cache); on the CPU all N ranks share the host. Only a notebook with a built split starts
    ranks: 03's peak does not move."""
    from cancellation import plan
    kind, gib = "nvidia-h100-80gb-hbm3", 2 ** 30
    for stem, profile in (("05_value_gap", "paper-quick"), ("06_sampling_budget", "paper"), ("05_value_gap", "tiny")):
        params = resolve.resolve_params(profiles.find_notebook(stem[:2]), profile)
        one = plan.make(stem, params, kind=kind if profile != "tiny" else None)
        eight = plan.make(stem, params, kind=kind if profile != "tiny" else None, procs=8)
        if params["backend"] == "vllm":   # the device's share per engine: 0.3 x 79.2 GiB on the H100
            copy = int(params["gpu_memory_utilization"] * one.total_memory)
        else:                             # tiny: float32 weights (4 bytes a parameter) and the same KV cache
            copy = one.shape.params * 4 + one.mem["kv_cache"]
        copies = 1 if params["device"].startswith("cuda") else 8
        # on CUDA GPU 0 also holds rank 0's CUDA context and its float policy beside the sampler (issue 63, item 5;
        # tests/test_plan_gpu0.py)
        gpu0 = sum(eight.card.values()) - sum(one.card.values())
        assert eight.peak - one.peak == copies * copy + gpu0, (stem, profile, (eight.peak - one.peak) / gib, copy / gib)
    p03 = resolve.resolve_params(profiles.find_notebook("03"), "paper-quick")
    assert plan.make("03_masked_updates", p03, kind=kind, procs=8).peak == plan.make("03_masked_updates", p03, kind=kind).peak


# ----------------------------------------------------------------------------- two ranks (accelerate, gloo)
@pytest.mark.slow
def test_fan_out_on_two_ranks(monkeypatch):
    """accelerate's split_between_processes: 5 units on 2 ranks are units 0-2 on rank 0 and 3-4 on rank 1;
    results in unit order; a raising rank gives one line."""
    monkeypatch.delenv(procs.KILL_ENV, raising=False)
    assert procs.fan_out("cancellation.procs:_probe", {}, list(range(5)), n=2) == \
        [(0, 0), (1, 0), (4, 0), (9, 1), (16, 1)]
    with pytest.raises(procs.RankFailed) as e:
        procs.fan_out("cancellation.procs:_probe", {"raise_on": 3}, list(range(5)), n=2, what="probe")
    assert str(e.value) == "probe: rank 1 of 2 failed: ValueError: probe refused unit 3; no outputs were written"


# Every sampler batch holds rows_per_chunk // M = 4 prefixes, so each notebook's Monte Carlo calls hold
# several batches (6 to 12) to split: the smoke profile's default (1024 rows) makes one batch per call,
# which --procs leaves on one process. 06 takes a real GRPO step per setting (step_mode grpo), whose
# seeds are split too. 04 splits its batches (test_compute_on_...): 2 of each policy here, so each rank holds a
# main and a control one; 01 its six Δlog p runs (main, control, Fig. 9's second model).
SPLIT = {"01": {"steps": 2}, "04": {"n_batches": 2, "null_shuffles": 3}, "05": {"rows_per_chunk": 16}, "06": {"rows_per_chunk": 16, "step_mode": "grpo"}}
SHOWN = {"01": ["[procs] Δlog p runs: 6 units on 2 processes"],
         "04": ["[procs] 04 batches (2 policies): 4 units on 2 processes"],
         "05": ["MC continuations (M=4): 12 units on 2 processes"],
         "06": ["MC continuations (M=4): 12 units on 2 processes", "settings x seeds (grpo steps): 12 units on 2",
                "settings x seeds (grpo steps): 6 units on 2"]}
TABLES = {"05": ("fig05_token_values", "fig05_cell_means", "fig05_entropy_gap", "fig05_strata_gap",
                 "fig11_repeated_gap", "fig05_heldout_values"),
          "06": ("fig06_valued_deltas", "fig06_value_gap", "fig07b_reward_composition", "fig06_trends",
                 "fig07b_group_trend")}


def _run(ref, root: Path, monkeypatch, n: int):
    monkeypatch.setenv("CANCELLATION_CACHE", str(root / "cache"))   # nothing computed before: every value sampled
    monkeypatch.setenv(procs.PROCS_ENV, str(n))
    out = execute.run_notebook(ref, "smoke", dict(SPLIT[ref]), out_root=root, log_output=False)
    return out, next((root / "data" / "results" / "smoke" / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["05", "06"])
def test_two_processes_write_the_same_tables(ref, tmp_path, monkeypatch):
    """Whole notebooks on the smoke profile (fresh caches): 1 process, then 2 ranks; every table and the
    claims registry equal byte for byte, and the executed notebook shows the splits happened."""
    _, one = _run(ref, tmp_path / "one", monkeypatch, 1)
    nb, two = _run(ref, tmp_path / "two", monkeypatch, 2)
    for name in TABLES[ref] + ("claims",):
        a, b = (one / f"{name}.parquet").read_bytes(), (two / f"{name}.parquet").read_bytes()
        assert a == b, f"{ref}: {name}.parquet differs between 1 and 2 processes"
    text = nb.read_text()
    assert all(line in text for line in SHOWN[ref]), [ln for ln in text.split("\\n") if "[procs]" in ln]


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["01", "04"])
def test_compute_on_two_processes_gives_the_same_tables(ref, tmp_path, monkeypatch, capsys):
    """01's Δlog p runs and 04's batches (smoke profile, fresh caches): the figure's compute() on 1 process,
    then on 2 ranks, which train and cache the runs or batches the kernel then reads back; every table the
    notebook writes equal byte for byte. (05 and 06 above go through the runner and the kernel.)"""
    nb = profiles.find_notebook(ref)
    params = resolve.resolve_params(nb, "smoke", dict(SPLIT[ref]))
    mod = manifest.get(nb.stem).load()
    P = mod.Params(**{k: v for k, v in params.items() if k not in profiles.INJECTED})
    for n in (1, 2):
        d = tmp_path / str(n)
        monkeypatch.setattr(cache, "DEFAULT_DIR", d / "cache")   # this process's cache and the ranks'
        monkeypatch.setenv("CANCELLATION_CACHE", str(d / "cache"))
        monkeypatch.setenv(procs.PROCS_ENV, str(n))
        mod.compute(P).write(d / "tables", P)
    assert all(line in capsys.readouterr().out for line in SHOWN[ref])
    one = sorted((tmp_path / "1" / "tables").glob("*.parquet"))
    assert len(one) >= 6
    for f in one:
        assert f.read_bytes() == (tmp_path / "2" / "tables" / f.name).read_bytes(), f"{ref}: {f.name} differs"


@pytest.mark.slow
def test_a_killed_rank_stops_the_notebook_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(procs.KILL_ENV, "1")
    with pytest.raises(execute.NotebookFailed) as e:
        _run("05", tmp_path, monkeypatch, 2)
    msg = str(e.value)
    assert msg == ("05_value_gap stopped: MC continuations (M=4): rank 1 of 2 died (exit code -9 (SIGKILL)); "
                   "no outputs were written"), msg
    results = tmp_path / "data" / "results" / "smoke"
    assert not list(results.rglob("*.parquet")) and not list((tmp_path / "figures").rglob("*.png"))


# ----------------------------------------------------------------------------- 07: whole TRL runs over the ranks
TRL07 = dict(engine="trl", strategies=["random", "QB"], seeds=[0], iterations=2, n_prompts=4, G=4, n_minibatches=2,
             max_new_tokens=48, eval_every=1, eval_n=8, eval_sets=["easy"], probe_lrs=[], probe_strategies=[],
             imbalance_plans=0, trl_strategies=[], trl_checkpoint_every=0)


@pytest.mark.slow
def test_07_trl_runs_on_two_processes_give_the_same_tables(tmp_path, monkeypatch, capsys):
    """Notebook 07 on engine trl (a small parameter set, fresh caches): 1 process, then 2 ranks, each TRL run
    trained whole by one rank in a child outside the ranks' group (procs.isolated); Table 2, the curves, the
    iteration and mini-batch records and the cancellation monitor equal bit for bit (wall-clock columns aside)."""
    from cancellation.figures import fig07
    out = {}
    for n in (1, 2):
        monkeypatch.setenv("CANCELLATION_CACHE", str(tmp_path / str(n)))
        monkeypatch.setenv(procs.PROCS_ENV, str(n))
        R = fig07.compute(fig07.Params(**TRL07))
        out[n] = {k: getattr(R, k) for k in ("table2", "curves", "iters", "minibatches", "trl_monitor")}
    assert "[procs] TRL runs (strategy x seed): 2 units on 2 processes" in capsys.readouterr().out
    mb = out[1]["minibatches"]
    assert (mb.n_pos > 0).any() and (mb.n_neg > 0).any() and len(out[1]["trl_monitor"])   # trained on signal
    for k, x in out[1].items():
        secs = [c for c in ("t_sample", "t_update", "seconds") if c in x.columns]
        assert x.drop(columns=secs).equals(out[2][k].drop(columns=secs)), k
