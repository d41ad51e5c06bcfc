"""Issue 13: what a hostile-but-fair user does (bad parameters, bad files, kills, concurrent runs).

One test (or one parametrised row) per case of the issue's "Why" list:

| case                                             | behaviour now                                              |
|--------------------------------------------------|------------------------------------------------------------|
| problems file edited in place                    | new cache keys (notebooks, run_params, eval files, values)  |
| empty file / null answer / no answer / bad JSON  | ProblemFileError naming file and row (line)                 |
| run with overrides                               | own runs/<hash>/ directories; --replace for canonical ones  |
| interrupted / failing run                        | no output changes (staged, promoted on success); <name>.failed.ipynb; 1-line cause; Ctrl-C: 2 lines, exit 130 |
| killed run (SIGKILL)                             | its .run-staging/ folder is removed at the next start       |
| two runs at once (cache entry, checkpoint)       | the second waits for the first and reads its result         |
| bad parameters (null, 010, 0, -1, inf, lr∉lrs…)  | one line per error naming notebook/parameter/value, exit 2  |
| `run all -p stepz 1`                             | rejected before notebook 01 runs; `-p steps 1` goes to the notebooks declaring it |
| relative paths                                   | resolved against the caller's directory; missing = error   |
| weights differ from manifest / truncated files   | error naming the file                                       |
| corrupt cache entry / checkpoint                 | moved aside (.corrupt), warning with its path, recomputed   |
| cache and result file modes                      | 0644 (umask 022), not 0600                                  |
| tests share the user's cache                     | CANCELLATION_CACHE is a temporary directory                 |
| one prompt, two answers / answer 1e400 / latin-1 | ProblemFileError naming file and rows (line)                |
| NaN or inf reward                                | ValueError naming the rollout (row) and its group           |
| notebooks recording claims at once               | registry read-modify-write under a lock: no row lost (test_claims) |
| truncated claims registry, `claims readme`       | one line naming the file, exit 1, no traceback (test_claims) |
| relative CANCELLATION_CACHE / installed wheel    | caller's directory / user cache dir, never site-packages (test_packaging) |
"""
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import stat
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from cancellation import cache, execute, grader, policy, profiles, resolve, run, sources, tasks, train, value

ROOT = Path(__file__).resolve().parents[1]


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


# ------------------------------------------------------------------ stale results after editing a problems file
def _problems(path, answer="7"):
    path.write_text(json.dumps({"prompt": "What is 3+4?", "answer": answer}) + "\n")
    return path


def test_edited_problems_file_changes_every_cache_key(tmp_path):
    f = _problems(tmp_path / "p.jsonl")
    ev = _problems(tmp_path / "held.jsonl")
    cfg = train.TrainConfig(source=sources.ProblemSource(str(f)), eval_sets=["easy", str(ev)])
    before_src, before_run = cfg.source.params(), train.run_params(cfg)
    time.sleep(0.01)
    _problems(f, answer="8")  # same path, same size, new content
    _problems(ev, answer="9")
    assert sources.ProblemSource(str(f)).params() != before_src
    cfg2 = train.TrainConfig(source=sources.ProblemSource(str(f)), eval_sets=["easy", str(ev)])
    after = train.run_params(cfg2)
    assert after["source"] != before_run["source"]
    assert after["eval_fingerprints"] != before_run["eval_fingerprints"]  # held-out files by content too
    assert "eval_fingerprints" not in train.run_params(train.TrainConfig())  # generated sets keep their keys


def test_value_cache_key_holds_answer_verifier_stop_ids_and_device():
    r = value.Request(prompt=(1, 2), response=(3,), ban=None, group=0)
    cfg = value.ValueConfig(M=4)
    k = lambda **kw: cache.key("mc_rewards", value._cache_params("m", r, cfg, **kw))  # noqa: E731
    base = k(answer="7", verifier="exact", stops=[1])
    assert base != k(answer="8", verifier="exact", stops=[1])
    assert base != k(answer="7", verifier=value.verifier_id(grader.MathVerifier()), stops=[1])
    assert base != k(answer="7", verifier="exact", stops=[1, 5])
    assert base != k(answer="7", verifier="exact", stops=[1], device="cuda")
    assert value.verifier_id(tasks.verify) == "exact" and value.verifier_id(None) == "exact"


# ------------------------------------------------------------------ bad problem files (sources.ProblemSource)
@pytest.mark.parametrize("name, content, expected", [
    ("empty.jsonl", "", r"empty.jsonl: no rows"),
    ("null.jsonl", '{"prompt": "1+1?", "answer": null}\n', r"null.jsonl: line 1: expected a non-empty 'answer'"),
    ("noanswer.jsonl", '{"prompt": "1+1?"}\n', r"noanswer.jsonl: line 1: expected"),
    ("bad.jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"prompt": \n', r"bad.jsonl: line 2: expected one JSON object"),
    ("bad.json", '[{"prompt": "1+1?", "answer": "2"},\n {"prompt": }]', r"bad.json: line 2: expected a JSON list"),
    ("two.jsonl", '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n{"prompt": "1+1?", "answer": 3}\n',
     r"two.jsonl: line 1 and line 3: one prompt with two answers \('2' and '3'\)"),
    ("huge.jsonl", '{"prompt": "1+1?", "answer": 1e400}\n', r"huge.jsonl: line 1: expected a finite 'answer'; got inf"),
    ("latin1.jsonl", '{"prompt": "Caf\u00e9?", "answer": "2"}\n'.encode("latin-1"), r"latin1.jsonl: not UTF-8 text \(byte 15"),
])
def test_bad_problem_file_names_file_and_row(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(sources.ProblemFileError, match=expected):
        sources.ProblemSource(str(tmp_path / name)).load()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_reward_is_an_error_naming_rollout_and_group(bad):
    from cancellation import rollout
    reward = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, bad, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 0, 7, 7, 7, 7])
    with pytest.raises(ValueError, match=rf"reward of rollout 5 \(group 7\) is {bad}, not finite"):
        rollout.group_advantages(reward, group)
    reward[5] = 0.0  # finite again: the usual advantages
    assert torch.isfinite(rollout.group_advantages(reward, group)).all()


# ------------------------------------------------------------------ parameters: one line per error, exit 2
@pytest.mark.parametrize("nb, overrides, expected", [
    ("01", {"steps": "null"}, "01_token_flipping: parameter 'steps' must not be empty/null"),
    ("01", {"steps": ""}, "01_token_flipping: parameter 'steps' must not be empty/null"),
    ("01", {"steps": "0"}, "01_token_flipping: parameter 'steps' = 0: out of range; allowed: >= 1"),
    ("01", {"n_prompts": "-4"}, "parameter 'n_prompts' = -4: out of range; allowed: >= 1"),
    ("01", {"temperature": "-1"}, "parameter 'temperature' = -1.0: out of range; allowed: > 0"),
    ("01", {"lr": "inf"}, "parameter 'lr' = inf: not finite"),
    ("01", {"lr": ".nan"}, "parameter 'lr' = nan: not finite"),
    ("01", {"eps": "0"}, "parameter 'eps' = 0.0: out of range; allowed: > 0"),
    ("01", {"dtype": "float8"}, "parameter 'dtype' = 'float8': not allowed; allowed: 'float64'"),
    ("01", {"models": "[]"}, "parameter 'models' = []: must not be empty"),
    ("01", {"gradient_checkpointing": "yes"}, "parameter 'gradient_checkpointing' must be true/false"),
    ("02", {"lr": "0.3"}, "02_coupling_heatmaps: lr=0.3, lrs=[0.01, 0.1, 1.0, 10.0]: lr must be one of lrs"),
    ("05", {"p_max": "1"}, "parameter 'p_max' = 1.0: out of range; allowed: > 0 and < 1"),
    ("06", {"G_comp": "60"}, "G_comp=60, comp_G=96: comp_G must hold G_comp - 1 positive and G_comp - 1 negative"),
    ("07", {"workers": "2", "engine": "trl", "strategies": "[random, QB+RB]", "budget_strategies": "[]"},
     "workers > 1 parallelises the small trainer on the CPU only"),
    ("05", {"nonlinear_share": "1.5"}, "parameter 'nonlinear_share' = 1.5: out of range"),
    ("07", {"tau": "0.7"}, "parameter 'tau' = 0.7: out of range"),
    ("07", {"strategies": "[random, QQ]"}, "element 'QQ': not allowed"),
    ("07", {"eval_sets": "[easy, nope.jsonl]"}, "element 'nope.jsonl': no such file"),
    ("07", {"fig_dir": "x"}, "parameter 'fig_dir' is set by the runner"),
    ("01", {"device": "gpu"}, "parameter 'device' = 'gpu': not a device; allowed: cpu, cuda, cuda:N"),
    ("05", {"device": "cuda:x"}, "05_value_gap: parameter 'device' = 'cuda:x': not a device"),
    ("01", {"models": "[data/policies/tiny-m, data/policies/tiny-m]"},
     "parameter 'models' = ['data/policies/tiny-m', 'data/policies/tiny-m']: must not repeat an element"),
    # absurd numbers (tests/test_bad_inputs.py has the boundary values that still pass)
    ("01", {"seed": str(10**23)}, f"01_token_flipping: parameter 'seed' = {10**23}: out of range; allowed: an "
                                  f"integer seed >= 0 and <= 2147483647 (from -p)"),
    ("07", {"seeds": f"[0, {2**31}]"}, f"parameter 'seeds' = [0, {2**31}]: element {2**31}: out of range"),
    ("01", {"lr": "1e300"}, "01_token_flipping: parameter 'lr' = 1e+300: out of range; allowed: a learning rate "
                            "<= 1000 (larger ones diverge) (from -p)"),
    ("02", {"lrs": "[0.1, 1e5]", "lr": "0.1"}, "parameter 'lrs' = [0.1, 100000.0]: element 100000.0: out of range"),
])
def test_bad_parameter_is_one_line_naming_notebook_parameter_value_and_allowed(nb, overrides, expected, capsys):
    argv = [nb, "--check"] + [a for k, v in overrides.items() for a in ("-p", k, v)]
    with pytest.raises(SystemExit) as e:
        run.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_numbers_are_yaml_1_2():
    nb = profiles.find_notebook("01")
    p = resolve.resolve_params(nb, "tiny", {"steps": "010", "lr": "1e-3", "eps": "1E-7"})
    assert p["steps"] == 10 and p["lr"] == 1e-3 and p["eps"] == 1e-7  # not octal 8, not the string '1e-3'
    assert profiles.yaml_load("[0o17, 0x1f, yes]") == [15, 31, "yes"]


def test_run_all_rejects_a_name_before_any_notebook_runs(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(execute, "run_notebook", lambda *a, **k: ran.append(a))
    with pytest.raises(SystemExit) as e:
        run.main(["all", "-p", "stepz", "1", "-p", "steps", "1"])
    assert e.value.code == 2 and ran == []
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: unknown parameter 'stepz': no selected notebook declares it. Did you mean 'steps'?"]


def test_run_all_gives_each_value_to_the_notebooks_that_declare_it(monkeypatch):
    ran = {}
    monkeypatch.setattr(execute, "run_notebook", lambda ref, profile, ov, **k: ran.setdefault(Path(ref).stem, ov))
    run.main(["all", "-p", "steps", "1", "-p", "n_pairs", "50"])
    declares = {nb.stem: profiles.notebook_defaults(nb) for nb in profiles.all_notebooks()}
    assert set(ran) == set(declares)
    for stem, ov in ran.items():
        assert ov == {k: v for k, v in {"steps": "1", "n_pairs": "50"}.items() if k in declares[stem]}, stem
    assert ran["01_token_flipping"] == {"steps": "1"} and ran["02_coupling_heatmaps"] == {"n_pairs": "50"}


def test_relative_paths_resolve_against_the_callers_directory(tmp_path, monkeypatch, capsys):
    nb = profiles.find_notebook("01")
    (tmp_path / "mine").mkdir()
    shutil.copytree(ROOT / "data/policies/tiny-s", tmp_path / "mine/pol")
    _problems(tmp_path / "mine/p.jsonl")
    monkeypatch.chdir(tmp_path)
    p = resolve.resolve_params(nb, "tiny", {"model_path": "mine/pol", "problems_path": "mine/p.jsonl"}, check_paths=True)
    assert p["model_path"] == str(tmp_path / "mine/pol") and p["problems_path"] == str(tmp_path / "mine/p.jsonl")
    # a path that exists in the repository but not here is an error, not a hub name
    with pytest.raises(profiles.ParameterError, match=r"'model_path' = 'data/policies/tiny-s': no such file"):
        resolve.resolve_params(nb, "tiny", {"model_path": "data/policies/tiny-s"}, check_paths=True)
    with pytest.raises(profiles.ParameterError, match=r"'model_path' = 'mine/nope': no such file"):
        resolve.resolve_params(nb, "tiny", {"model_path": "mine/nope"}, check_paths=True)  # 'mine' exists here
    assert resolve.resolve_params(nb, "tiny", {"model_path": "Qwen/Qwen3-1.7B-Base"}, check_paths=True)["model_path"] \
        == "Qwen/Qwen3-1.7B-Base"  # a hub repo id stays one
    # profile and default paths stay repository-relative (the notebooks run there)
    assert resolve.resolve_params(nb, "tiny", check_paths=True)["model_path"] == "data/policies/tiny-m"


def test_load_policy_never_sends_a_missing_relative_path_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for missing in ("models/tiny-x", "a/b/c", "./tiny-x"):
        with pytest.raises(FileNotFoundError, match="no config.json"):
            policy.load_policy(missing)


# ------------------------------------------------------------------ integrity of loaded files
@pytest.fixture
def policy_copy(tmp_path):
    d = tmp_path / "pol"
    shutil.copytree(ROOT / "data/policies/tiny-s", d)
    return d


@pytest.mark.parametrize("damage, expected", [
    ("flip", r"model.safetensors: sha256 .* does not match manifest.json"),
    ("truncate", r"model.safetensors: truncated or padded safetensors file"),
    ("garble", r"model.safetensors: not a readable safetensors file"),
])
def test_damaged_weights_are_an_error_naming_the_file(policy_copy, damage, expected):
    f = policy_copy / "model.safetensors"
    b = bytearray(f.read_bytes())
    if damage == "flip":
        b[-3] ^= 1
    elif damage == "truncate":
        b = b[:-1000]
    else:
        b[:8] = b"\xff" * 8
    f.write_bytes(bytes(b))
    with pytest.raises(policy.PolicyLoadError, match=expected):
        policy.load_policy(policy_copy)


def test_committed_policies_pass_the_manifest_check():
    for size in ("tiny-m", "tiny-s"):
        assert policy.verify_manifest(ROOT / "data/policies" / size) == 1


@pytest.mark.parametrize("suffix, payload", [(".pkl", b"\x80\x04garbage"), (".parquet", b"PAR1 not really")])
def test_corrupt_cache_entry_is_a_miss_moved_aside_with_a_warning(tmp_path, suffix, payload):
    value0 = pd.DataFrame({"a": [1, 2]}) if suffix == ".parquet" else {"a": 1}
    k = cache.key("stage", {"x": 1})
    (tmp_path / f"{k}{suffix}").write_bytes(payload)
    with pytest.warns(cache.CacheWarning, match=rf"{k}{suffix}: unreadable .* moved to {k}{suffix}.corrupt"):
        got = cache.cached("stage", {"x": 1}, lambda: value0, tmp_path)
    assert (tmp_path / f"{k}{suffix}.corrupt").read_bytes() == payload
    assert cache.cached("stage", {"x": 1}, lambda: 1 / 0, tmp_path) is not None  # the recomputed entry is served
    assert str(got) == str(value0)


def test_corrupt_checkpoint_is_moved_aside_and_the_run_restarts(tmp_path):
    ck = tmp_path / "run.pt"
    train._save(ck, {"config": 1, "model": {}, "optimizer": {}, "torch_rng": torch.get_rng_state(), "state": {}})
    assert train._load_checkpoint(ck) is not None
    ck.write_bytes(ck.read_bytes()[:100])
    with pytest.warns(cache.CacheWarning, match=r"run.pt: unreadable"):
        assert train._load_checkpoint(ck) is None
    assert (tmp_path / "run.pt.corrupt").exists() and not ck.exists()


def test_cache_results_and_checkpoints_get_0644_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        cache.cached("s", {"y": 1}, lambda: {"v": 1}, tmp_path)
        cache.cached("s", {"y": 2}, lambda: pd.DataFrame({"a": [1]}), tmp_path)
        cache.write_table(pd.DataFrame({"a": [1]}), tmp_path / "t.csv")
        train._save(tmp_path / "c.pt", {"a": 1})
    finally:
        os.umask(old)
    for f in [*tmp_path.glob("s-*"), tmp_path / "t.csv", tmp_path / "c.pt"]:
        assert _mode(f) == 0o644, f


# ------------------------------------------------------------------ two runs at once
def _compute_once(d, log, barrier):
    barrier.wait()

    def compute():
        with open(log, "a") as f:
            f.write("x")
        time.sleep(0.5)
        return {"v": 42}
    assert cache.cached("slow", {"k": 1}, compute, d) == {"v": 42}


def _save_many(path, n):
    for i in range(n):
        train._save(path, {"i": i, "blob": torch.zeros(20_000)})


def test_two_runs_of_one_cache_entry_compute_once_and_both_succeed(tmp_path):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    ps = [ctx.Process(target=_compute_once, args=(tmp_path, tmp_path / "log", barrier)) for _ in range(2)]
    [p.start() for p in ps]
    [p.join(30) for p in ps]
    assert [p.exitcode for p in ps] == [0, 0]
    assert (tmp_path / "log").read_text() == "x"  # the second waited and read the first's entry


def test_two_runs_writing_one_checkpoint_never_crash(tmp_path):
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_save_many, args=(tmp_path / "c.pt", 20)) for _ in range(3)]
    [p.start() for p in ps]
    [p.join(60) for p in ps]
    assert [p.exitcode for p in ps] == [0, 0, 0]
    assert torch.load(tmp_path / "c.pt")["i"] == 19 and not list(tmp_path.glob("*.tmp"))


def _hold(path, seconds, started):
    with cache.lock(path):
        started.set()
        time.sleep(seconds)


def test_checkpoint_lock_makes_the_second_run_wait(tmp_path):
    ctx = mp.get_context("fork")
    started = ctx.Event()
    p = ctx.Process(target=_hold, args=(tmp_path / "c.pt", 0.6, started))
    p.start()
    started.wait(10)
    t = time.time()
    with cache.lock(tmp_path / "c.pt"):
        waited = time.time() - t
    p.join()
    assert waited > 0.3


# ------------------------------------------------------------------ outputs: own directory, atomic, short failure
NB = '''# %% tags=["parameters"]
profile = "tiny"
fig_dir = "figures/tiny"
results_dir = "data/results/tiny"
steps = 1
fail = False

# %%
from pathlib import Path
Path(fig_dir).mkdir(parents=True, exist_ok=True)
(Path(fig_dir) / "out.txt").write_text(str(steps))

# %%
x = 1
if fail:
    raise ValueError("steps must be even for this probe")
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    (d / "98_probe.py").write_text(NB)
    return d / "98_probe.py", d / "out"


@pytest.mark.slow
def test_override_run_writes_its_own_directory_and_records_it(probe):
    nb, out = probe
    canonical = execute.run_notebook(str(nb), "tiny", out_root=out, log_output=False)
    assert (out / "figures/tiny/out.txt").read_text() == "1"
    o = execute.run_notebook(str(nb), "tiny", {"steps": "3"}, out_root=out, log_output=False)
    h = resolve.overrides_hash({"steps": 3})
    assert o == out / f"notebooks/executed/tiny/runs/{h}/98_probe.ipynb"
    assert (out / f"figures/tiny/runs/{h}/out.txt").read_text() == "3"
    assert (out / "figures/tiny/out.txt").read_text() == "1"  # the canonical outputs are untouched
    meta = json.loads(o.read_text())["metadata"]["cancellation"]
    assert meta["overrides"] == {"steps": 3} and meta["fig_dir"].endswith(f"figures/tiny/runs/{h}")
    execute.run_notebook(str(nb), "tiny", {"steps": "3"}, out_root=out, log_output=False, replace=True)
    assert (out / "figures/tiny/out.txt").read_text() == "3" and canonical.exists()
    assert _mode(canonical) == cache.FILE_MODE  # not mkstemp's 0600


@pytest.mark.slow
def test_failed_run_keeps_the_executed_notebook_and_says_why_in_a_few_lines(probe, capsys, monkeypatch):
    nb, out = probe
    good = execute.run_notebook(str(nb), "tiny", out_root=out, log_output=False, replace=True)
    before = good.read_bytes()
    with pytest.raises(execute.NotebookFailed) as e:
        execute.run_notebook(str(nb), "tiny", {"fail": "true"}, out_root=out, log_output=False, replace=True)
    msg = str(e.value)
    assert "98_probe failed in cell" in msg and "ValueError: steps must be even for this probe" in msg
    assert "raise ValueError" in msg and len(msg.splitlines()) <= 12
    assert good.read_bytes() == before  # never a half-executed notebook in its place
    assert (good.parent / "98_probe.failed.ipynb").exists() and not list(good.parent.glob(".*tmp*"))
    # the CLI prints that summary and exits 1 (its outputs go under a stand-in repository root)
    monkeypatch.setattr(profiles, "HERE", dataclasses.replace(profiles.HERE, root=out))
    with pytest.raises(SystemExit) as ex:
        run.main([str(nb), "-p", "fail", "true", "--replace"])
    assert ex.value.code == 1 and "ValueError: steps must be even" in capsys.readouterr().err


def test_figures_are_written_atomically(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from cancellation import plots
    fig, ax = plots.figure()
    paths = plots.save(tmp_path, "f", fig)
    assert all(p.stat().st_size > 0 for p in paths) and sorted(os.listdir(tmp_path)) == ["f.pdf", "f.png"]


# ------------------------------------------------------------------ hermetic tests
def test_tests_use_their_own_cache_directory():
    assert Path(os.environ["CANCELLATION_CACHE"]) == cache.DEFAULT_DIR
    assert not cache.DEFAULT_DIR.resolve().is_relative_to(ROOT)


# ------------------------------------------------------------------ all-or-nothing outputs, Ctrl-C, killed runs
STAGED_NB = '''# %% tags=["parameters"]
profile = "tiny"
fig_dir = "figures/tiny"
results_dir = "data/results/tiny"
value = 1
fail_at = ""

# %%
from pathlib import Path
import pandas as pd
from cancellation import cache, claims as C
Path(results_dir).mkdir(parents=True, exist_ok=True)
cache.write_table(pd.DataFrame({"v": [value]}), Path(results_dir) / "t.parquet")
C.record(results_dir, "97", [C.Claim("probe_value", "Fig. 0", "a probe", "1", measured=value, estimator="point (no interval)", resampling="none", params={"point_ok": True})])
print("tables in", results_dir)

# %%
if fail_at == "figures":
    raise RuntimeError("failed between the tables and the figures")
if fail_at == "sleep":
    import time
    Path(fig_dir).mkdir(parents=True, exist_ok=True)
    (Path(fig_dir) / "sleeping").write_text("")
    time.sleep(60)
Path(fig_dir).mkdir(parents=True, exist_ok=True)
(Path(fig_dir) / "f.txt").write_text(str(value))
'''


def _staged_root(tmp_path):
    """A stand-in repository root: the probe notebook, the real params, a claims registry holding
    another notebook's row (which every promotion must keep)."""
    from cancellation import claims as C
    root = tmp_path / "repo"
    (root / "notebooks/params").mkdir(parents=True)
    (root / "notebooks/params/tiny.yaml").write_text("97_staged:\n  value: 1\n")
    (root / "notebooks" / "97_staged.py").write_text(STAGED_NB)
    C.record(root / "data/results/tiny", "01", [C.Claim("other_notebook", "Fig. 1", "kept", "1", measured=1.0, estimator="point (no interval)", resampling="none", params={"point_ok": True})])
    return root, root / "notebooks" / "97_staged.py", root / "data/results/tiny"


def _snapshot(root):
    """Every output file's bytes (not the staging area, lock files or a kept <name>.failed.ipynb)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".run-staging" not in p.parts and p.suffix != ".lock"
            and not p.name.endswith(".failed.ipynb")}


@pytest.mark.slow
def test_a_run_failing_part_way_leaves_every_output_as_it_was(tmp_path):
    root, nb, res = _staged_root(tmp_path)
    good = execute.run_notebook(str(nb), "tiny", out_root=root, log_output=False)
    assert pd.read_parquet(res / "t.parquet").v.tolist() == [1] and (root / "figures/tiny/f.txt").read_text() == "1"
    assert sorted(pd.read_parquet(res / "claims.parquet").notebook) == ["01", "97"]  # the other row survived
    text = good.read_text()
    assert ".run-staging" not in text and str(res) in text  # the record names the final directories
    before = _snapshot(root)
    with pytest.raises(execute.NotebookFailed, match="failed between the tables and the figures"):
        execute.run_notebook(str(nb), "tiny", {"value": "2", "fail_at": "figures"}, out_root=root, log_output=False,
                         replace=True)
    assert _snapshot(root) == before  # tables written before the failure were never promoted
    assert (good.parent / "97_staged.failed.ipynb").exists()
    assert [p.name for p in (root / ".run-staging").iterdir() if p.is_dir()] == []
    execute.run_notebook(str(nb), "tiny", out_root=root, log_output=False)  # a rerun: byte-identical notebook
    assert good.read_text() == text and not (good.parent / "97_staged.failed.ipynb").exists()


def _interrupting(*a, **k):
    """papermill.execute_notebook stand-in: writes into the staged directories, then Ctrl-C."""
    params = k["parameters"]
    Path(params["results_dir"]).mkdir(parents=True, exist_ok=True)
    (Path(k["cwd"]) / params["results_dir"] / "t.parquet").write_bytes(b"half")   # the kernel runs in the root
    Path(a[1]).write_text(Path(a[0]).read_text())
    raise KeyboardInterrupt


def test_ctrl_c_is_one_short_message_exit_130_and_no_temporaries(tmp_path, monkeypatch, capsys):
    import papermill
    root, nb, res = _staged_root(tmp_path)
    monkeypatch.chdir(root)
    before = _snapshot(root)
    monkeypatch.setattr(papermill, "execute_notebook", _interrupting)
    with pytest.raises(SystemExit) as e:
        run.main([str(nb), "--root", str(root)])
    assert e.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "error: 97_staged interrupted (Ctrl-C); its figures, tables and executed notebook are unchanged"
    assert len(err) == 2 and "Traceback" not in "".join(err) and "97_staged.failed.ipynb" in err[1]
    assert _snapshot(root) == before
    assert [p for p in (root / ".run-staging").iterdir() if p.is_dir()] == []


def test_sigterm_raises_so_that_cleanup_runs():
    from cancellation import staging
    with pytest.raises(staging.Terminated), staging.sigterm_raises():
        os.kill(os.getpid(), __import__("signal").SIGTERM)
        time.sleep(5)


def test_staging_left_by_killed_runs_is_cleared_at_the_next_start(tmp_path):
    import socket
    import subprocess
    import sys
    from cancellation import staging
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, pid in (("01.dead", dead.pid), ("02.alive", os.getpid())):
        d = tmp_path / staging.STAGING / name / "results"
        d.mkdir(parents=True)
        (d.parent / "owner.json").write_text(json.dumps({"host": socket.gethostname(), "pid": pid}))
    old = tmp_path / "notebooks/executed/tiny/.01_token_flipping.x1y2.tmp.ipynb"  # an older runner's temporary
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    staging.clear_stale(tmp_path)
    assert sorted(p.name for p in (tmp_path / staging.STAGING).iterdir()) == ["02.alive"] and not old.exists()


def _foreground_signals():
    """In the child, before exec: Ctrl-C's default action, as a terminal's foreground job has it. A shell
    without job control starts background commands (`make test &`, a CI step's `cmd &`) with SIGINT
    ignored, every child inherits that, and Python then leaves SIGINT ignored: the runner would sleep
    through the signal and this test would fail for a reason outside the runner."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig, rc, how", [("SIGINT", 130, "interrupted (Ctrl-C)"), ("SIGTERM", 143, "terminated (SIGTERM)")])
def test_ctrl_c_in_a_terminal_prints_two_lines_not_tracebacks(tmp_path, sig, rc, how):
    """The real thing: the runner in its own process group (a terminal's foreground job) gets the signal
    while its kernel runs a cell; no KeyboardInterrupt or ZMQ tracebacks, no temporaries."""
    import signal
    import subprocess
    import sys
    root, nb, res = _staged_root(tmp_path)
    before = _snapshot(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lib"), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen([sys.executable, "-m", "cancellation.run", str(nb), "--root", str(root), "-p", "fail_at",
                          "sleep", "--replace"], cwd=root, env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_foreground_signals)
    try:
        t = time.time()
        while not list(root.glob(".run-staging/*/figures/sleeping")) and time.time() - t < 120 and p.poll() is None:
            time.sleep(0.2)
        os.killpg(p.pid, getattr(signal, sig))
        out, err = p.communicate(timeout=180)  # generous: a loaded CI machine starts kernels slowly
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == rc, err
    assert err.splitlines() == [f"error: 97_staged {how}; its figures, tables and executed notebook are unchanged",
                                "  the notebook as far as it ran: notebooks/executed/tiny/97_staged.failed.ipynb"]
    assert _snapshot(root) == before and not [d for d in (root / ".run-staging").iterdir() if d.is_dir()]


def test_the_runner_leaves_nbclients_teardown_noise_out(caplog):
    """nbclient logs "Kernel died while waiting for execute reply." through papermill's logger before it
    raises, and asyncio reports "Task exception was never retrieved" when one of nbclient's tasks is
    collected. While a notebook runs the runner drops both (it reports the death or the interrupt
    itself) and nothing else; after a run that raised, asyncio's stays dropped; after one that did not,
    everything is as before."""
    import logging
    log, aio = logging.getLogger("papermill"), logging.getLogger("asyncio")
    aio.removeFilter(execute.TEARDOWN_NOISE)   # an earlier in-process run that failed on purpose installed it
    try:
        with caplog.at_level(logging.ERROR):
            with execute._quiet_teardown_noise():
                log.error("Kernel died while waiting for execute reply.")
                aio.error("Task exception was never retrieved")
                log.error("Executing cell 3 failed")
            log.error("Kernel died while waiting for execute reply.")   # after a run that went through
            aio.error("Task exception was never retrieved")
            with pytest.raises(KeyboardInterrupt), execute._quiet_teardown_noise():
                raise KeyboardInterrupt
            aio.error("Task exception was never retrieved")             # after an interrupted run: dropped
            aio.error("Unclosed event loop")
    finally:
        aio.removeFilter(execute.TEARDOWN_NOISE)
    assert [r.getMessage() for r in caplog.records] == [
        "Executing cell 3 failed", "Kernel died while waiting for execute reply.",
        "Task exception was never retrieved", "Unclosed event loop"]
