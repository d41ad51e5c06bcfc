import dataclasses
import json
from pathlib import Path

import pytest

from cancellation import execute, manifest, pool, profiles, resolve, run


def test_profile_parameters_resolve_and_overrides_are_typed():
    nb = profiles.find_notebook("01")
    p = resolve.resolve_params(nb, "tiny", {"steps": "5", "lr": "1e-3", "models": "[data/policies/tiny-m]"})
    assert p["steps"] == 5 and p["lr"] == 1e-3 and p["models"] == ["data/policies/tiny-m"]
    assert p["fig_dir"].startswith("figures/tiny/runs/") and p["profile"] == "tiny"  # overrides: own directory
    assert resolve.resolve_params(nb, "tiny", {"steps": "5"}, replace=True)["fig_dir"] == "figures/tiny"
    assert resolve.resolve_params(nb, "tiny")["fig_dir"] == "figures/tiny"  # repository-relative: machine-independent
    assert resolve.resolve_params(nb, "tiny", {"lr": 1})["lr"] == 1.0  # int accepted for a float


def test_unknown_parameter_is_rejected_with_a_suggestion():
    nb = profiles.find_notebook("01")
    with pytest.raises(profiles.ParameterError, match="unknown parameter 'step'. Did you mean 'steps'"):
        resolve.resolve_params(nb, "tiny", {"step": "5"})


def test_wrong_type_is_rejected():
    nb = profiles.find_notebook("01")
    with pytest.raises(profiles.ParameterError, match="'steps' must be of type int"):
        resolve.resolve_params(nb, "tiny", {"steps": "five"})
    with pytest.raises(profiles.ParameterError, match="'steps' must be of type int"):
        resolve.resolve_params(nb, "tiny", {"steps": "2.5"})


def test_unknown_notebook_and_profile():
    with pytest.raises(profiles.ParameterError, match="known notebooks"):
        profiles.find_notebook("99")
    with pytest.raises(profiles.ParameterError, match="unknown profile"):
        resolve.resolve_params(profiles.find_notebook("01"), "huge")


def test_cli_exits_with_a_clear_message(capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["01", "-p", "sttps", "3", "--check"])
    assert e.value.code == 2
    assert "Did you mean 'steps'" in capsys.readouterr().err


def figure_notebooks() -> list:
    """Every manifest figure's notebook in the checkout (profiles.HERE: tests/test_manifest.py adds a dummy one)."""
    return [profiles.find_notebook(f.notebook) for f in manifest.FIGURES]


def test_every_profile_section_passes_the_schema():
    """Every figure resolves under every profile, with or without a section of its own there."""
    for profile in ("tiny", "smoke", "paper", "paper-smoke", "paper-quick"):
        for nb in figure_notebooks():
            resolve.resolve_params(nb, profile)  # types, ranges, choices, constraints (paths not required to exist)


def test_every_parameter_has_a_doc_and_a_rule_where_one_applies():
    """Params is the single source: every declared parameter of every notebook has a one-line doc,
    and the knobs every notebook shares are validated (a rule each)."""
    for nb in figure_notebooks():
        P = profiles.figure_params(nb)
        assert P is not None, f"{nb.name} has no figure module"
        docs, rules = P.docs(), P.rules()
        assert all(docs.get(k) for k in P.defaults()), [k for k in P.defaults() if not docs.get(k)]
        for k in ("model_path", "dtype", "device", "seed", "chunk_rows", "token_chunk"):
            if k in P.defaults():
                assert k in rules or k == "seed", (nb.name, k)


def test_executed_notebooks_keep_results_not_progress_bars(tmp_path):
    import json
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [
        {"output_type": "stream", "name": "stderr", "text": ["\r", "train:  50%|█████     | 8/16 [00:17<00:19,  2.42s/it]"]},
        {"output_type": "stream", "name": "stderr", "text": ["/x/tqdm/auto.py:21: TqdmWarning: IProgress not found."]},
        {"output_type": "stream", "name": "stderr", "text": ["\n"]},   # what a closed bar leaves behind
        {"output_type": "stream", "name": "stderr", "text": ["UserWarning: something real\n"]},
        {"output_type": "stream", "name": "stdout", "text": ["accuracy 0.50\n"]}]}], "metadata": {}}
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    execute._strip_volatile(p)
    kept = json.loads(p.read_text())["cells"][0]["outputs"]
    assert [o["text"] for o in kept] == [["UserWarning: something real\n"], ["accuracy 0.50\n"]]


def test_device_is_checked_before_anything_runs():
    nb = profiles.find_notebook("01")
    for ok in ("cpu", "cuda", "cuda:0", "cuda:12", "mps"):
        assert resolve.resolve_params(nb, "tiny", {"device": ok})["device"] == ok  # syntax only: no GPU needed here
    for bad in ("gpu", "CUDA", "cuda:", "cuda:-1", "cuda0", "cpu "):
        with pytest.raises(profiles.ParameterError, match=rf"'device' = '{bad}': not a device; allowed: cpu, cuda"):
            resolve.resolve_params(nb, "tiny", {"device": bad})


@pytest.mark.parametrize("name", ["../params/tiny", "notebooks/params/tiny", "tiny.yaml", "/tmp/tiny", "schema",
                                  "", "./tiny", "~/tiny"])
def test_profile_is_the_plain_name_of_a_file_under_notebooks_params(name, capsys):
    with pytest.raises(profiles.ParameterError, match="--profile takes the name of a profile in notebooks/params/"):
        profiles.load_profile(name)
    with pytest.raises(SystemExit) as e:
        run.main(["01", "--profile", name, "--check"])
    assert e.value.code == 2 and "known profiles: " in capsys.readouterr().err


def _profile(tmp_path, monkeypatch, text):
    """A profile named `mine` beside copies of the real ones (profiles.HERE.params points there)."""
    import shutil
    d = tmp_path / "params"
    shutil.copytree(profiles.HERE.params, d)
    (d / "mine.yaml").write_text(text)
    monkeypatch.setattr(profiles, "HERE", dataclasses.replace(profiles.HERE, params=d))
    return d / "mine.yaml"


def test_misspelled_profile_keys_and_sections_are_errors_with_a_suggestion(tmp_path, monkeypatch, capsys):
    _profile(tmp_path, monkeypatch, "common:\n  seed: 1\n  sede: 3\n01_token_fliping:\n  steps: 2\n"
                                    "02_coupling_heatmaps:\n  n_pair: 5\n")
    with pytest.raises(SystemExit) as e:
        run.main(["01", "--profile", "mine", "--check"])
    assert e.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert any("mine.yaml, common: unknown parameter 'sede': no notebook declares it. Did you mean 'seed'?" in ln
               for ln in err), err
    assert any("mine.yaml: unknown section '01_token_fliping'. Did you mean '01_token_flipping'?" in ln
               for ln in err), err
    with pytest.raises(SystemExit):  # each error once, however many notebooks are selected
        run.main(["all", "--profile", "mine", "--check"])
    err = capsys.readouterr().err.splitlines()
    assert sum("'sede'" in ln for ln in err) == 1 and any("unknown parameter 'n_pair'" in ln for ln in err), err


def test_a_common_key_applies_to_the_notebooks_that_declare_it(tmp_path, monkeypatch):
    _profile(tmp_path, monkeypatch, "common:\n  n_pairs: 7\n  seed: 2\n")  # n_pairs: notebook 02 only
    assert "n_pairs" not in resolve.resolve_params(profiles.find_notebook("01"), "mine")
    assert resolve.resolve_params(profiles.find_notebook("02"), "mine")["n_pairs"] == 7
    _profile(tmp_path / "b", monkeypatch, "common:\n  fig_dir: x\n")
    with pytest.raises(profiles.ParameterError, match="common: parameter 'fig_dir' is set by the runner"):
        resolve.resolve_params(profiles.find_notebook("01"), "mine")


# ------------------------------------------------------------------ README's paper command, verbatim
README = profiles.ROOT / "README.md"


def _readme_command(start: str) -> str:
    """The shell command of README.md that begins with `start` (a whole word: `--profile paper` is not
    `--profile paper-quick`), its `\\` continuations joined."""
    import re
    m = re.search(re.escape(start) + r"(?![\w-])(?:[^\n]*\\\n)*[^\n]*", README.read_text())  # 'paper' is not 'paper-quick'
    assert m, f"README.md no longer shows {start!r}"
    return re.sub(r"\\\n\s*", " ", m.group(0))


@pytest.fixture(scope="module")
def standin_paths(tmp_path_factory):
    """CPU stand-ins of the paper's inputs (cancellation.standins: the model untrained, which --check
    does not need): a Qwen3-shaped model directory, DAPO-Math-17k- and MATH-500-shaped files."""
    from cancellation import standins
    out = tmp_path_factory.mktemp("standins")
    tok = standins.build_tokenizer()
    standins.build_model(tok, 0).save_pretrained(out / "model")
    standins.save_tokenizer(tok, out / "model")
    return {"model": str(out / "model"), **{k: str(v) for k, v in standins.write_data(out, 0).items()}}


def test_readmes_paper_command_passes_check(standin_paths, capsys):
    import shlex
    cmd = _readme_command("python3 -m cancellation.run all --profile paper")
    subs = {"/models/Qwen3-1.7B-Base": standin_paths["model"], "/data/dapo-math-17k.parquet": standin_paths["dapo"],
            "/data/math500.jsonl": standin_paths["math500"]}
    for path, standin in subs.items():  # only the paths change; the README must still name them
        assert path in cmd, (path, cmd)
        cmd = cmd.replace(path, standin)
    argv = shlex.split(cmd)
    assert argv[:3] == ["python3", "-m", "cancellation.run"]
    run.main(argv[3:] + ["--check"])  # exit 0: no SystemExit
    out, dec, params = capsys.readouterr().out, json.JSONDecoder(), []
    i = 0
    while i < len(out):
        obj, i = dec.raw_decode(out, i)
        params.append(obj)
        while i < len(out) and out[i].isspace():
            i += 1
    assert len(params) == len(manifest.FIGURES) and all(p["profile"] == "paper" for p in params)
    assert all(p["model_path"] == standin_paths["model"] for p in params if "model_path" in p)
    assert [p["eval_sets"] for p in params if "eval_sets" in p] == [[standin_paths["math500"]]]
    assert all(p["models"] == [standin_paths["model"]] for p in params if "models" in p)


def test_readmes_paper_quick_block_runs_as_pasted_without_the_install(standin_paths, tmp_path):
    """README's paper-quick lines, pasted into bash from the checkout's root, with a `python3` that has the
    dependencies but not this package (PYTHONPATH=lib is the whole set-up), the data paths pointing at the
    stand-ins and `--check` appended (validate, run nothing): both lines exit 0, every notebook resolved."""
    import os
    import subprocess
    import sys
    sys.path.insert(0, str(profiles.ROOT / "tests"))
    from test_gpucheck import _bare_interpreter
    py = _bare_interpreter(tmp_path)   # this environment's packages, not the editable install of cancellation
    assert (py.parent / "python3").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{py.parent}{os.pathsep}{env['PATH']}", HF_HUB_OFFLINE="1")
    lone = subprocess.run(["python3", "-c", "import cancellation"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'cancellation'" in lone.stderr   # the rehearsal's python: not installed
    plan = _readme_command("PYTHONPATH=lib python3 -m cancellation.run all --profile paper-quick --plan")
    import re
    m = re.search(r"PYTHONPATH=lib python3 -m cancellation\.run all --profile paper-quick \\\n(?:[^\n]*\\\n)*[^\n]*",
                  README.read_text())   # the run line: the one continued over several lines
    assert m, "README.md no longer shows the paper-quick run line"
    go = re.sub(r"\\\n\s*", " ", m.group(0))
    go = go.replace("/data/dapo-math-17k.parquet", standin_paths["dapo"]).replace("/data/math500.jsonl",
                                                                                 standin_paths["math500"])
    assert "/data/" not in go and "PYTHONPATH=lib" in go
    for cmd in (plan, go + " --check"):
        p = subprocess.run(["bash", "-c", cmd], env=env, cwd=profiles.ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    assert p.stdout.count('"profile": "paper-quick"') == len(manifest.FIGURES)


# ------------------------------------------------------------------ make P='...' / --set, make help
@pytest.mark.parametrize("text, pairs", [
    ("eval_sets=[easy, medium]; problems_path=a=b.jsonl", [("eval_sets", "[easy, medium]"), ("problems_path", "a=b.jsonl")]),
    ("steps=5; lr=3e-4;", [("steps", "5"), ("lr", "3e-4")]),
    ("steps=5 lr=3e-4", [("steps", "5"), ("lr", "3e-4")]),  # the old space-separated form still works
    ("problems_path=my data/x=1 y.jsonl", [("problems_path", "my data/x=1 y.jsonl")]),
    ("eval_sets=['a;b.jsonl', \"c d=e.jsonl\"]; seed=1", [("eval_sets", "['a;b.jsonl', \"c d=e.jsonl\"]"), ("seed", "1")]),
    ("control_model_path=", [("control_model_path", "")]),
    ("  ", []),
])
def test_set_splits_pairs_on_semicolons_and_each_pair_on_its_first_equals(text, pairs):
    assert run.parse_set(text) == pairs


@pytest.mark.parametrize("text", ["steps", "=5", "steps=5; lr"])
def test_set_without_name_equals_value_is_an_error(text):
    with pytest.raises(profiles.ParameterError, match="expected NAME=VALUE"):
        run.parse_set(text)


def _make(*args) -> str:
    import subprocess
    r = subprocess.run(["make", "--no-print-directory", "-C", str(profiles.ROOT), *args], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_P_reaches_the_runner_whole(tmp_path, capsys):
    import shlex
    problems = tmp_path / "a=b c.jsonl"  # '=' and a space in a path
    problems.write_text(json.dumps({"prompt": "What is 3+4?", "answer": "7"}) + "\n")
    P = f"eval_sets=[easy, medium]; problems_path={problems}; eval_n=8; tau=0.25"
    line = [ln for ln in _make("-n", "fig07", f"P={P}").splitlines() if "cancellation.run 07" in ln]
    assert len(line) == 1, line
    argv = shlex.split(line[0])
    argv = argv[argv.index("cancellation.run") + 1:]
    assert argv == ["07", "--profile", "tiny", "--set", P]
    run.main(argv + ["--check"])
    p = json.loads(capsys.readouterr().out)
    assert p["eval_sets"] == ["easy", "medium"] and p["problems_path"] == str(problems) and p["tau"] == 0.25
    q = "name='it''s'"  # a single quote survives the shell
    assert shlex.split([ln for ln in _make("-n", "fig01", f"P={q}", "REPLACE=1").splitlines()
                        if "cancellation.run 01" in ln][0])[-2:] == [q, "--replace"]


def test_make_help_lists_every_target_and_variable():
    import re
    text = _make("help")
    phony = re.search(r"^\.PHONY:(.*)$", (profiles.ROOT / "Makefile").read_text(), re.M).group(1).split()
    for target in [t for t in phony] + ["figNN"]:
        assert re.search(rf"^\s*make {re.escape(target)}\b", text, re.M), target
    for var in ("PROFILE=", "P=", "REPLACE=", "B=", "TORCH_SPEC="):
        assert var in text, var
    for t in ("env", "standins", "clean", "table2", "bench", "claims"):
        assert t in phony


# ------------------------------------------------------------------ deterministic executed notebooks
TINY_NB = '''# %% [markdown]
# A probe.

# %% tags=["parameters"]
fig_dir = "figures/tiny"
steps = 1

# %%
print(steps)
'''


def _converted_and_parameterized(tmp_path, name):
    """What papermill writes before a kernel runs: the runner's conversion plus papermill's injected cell."""
    import nbformat
    from papermill.parameterize import parameterize_notebook
    src = tmp_path / "97_tiny.py"
    src.write_text(TINY_NB)
    out = tmp_path / name
    execute._prepare(src, out, {"profile": "tiny"})
    from papermill.iorw import load_notebook_node
    nb = parameterize_notebook(load_notebook_node(str(out)), {"steps": 2, "fig_dir": "/tmp/.run-staging/x.1/f"})
    nbformat.write(nb, out)
    execute._strip_volatile(out, {"/tmp/.run-staging/x.1/f": "figures/tiny"})
    return out


def test_cell_ids_are_deterministic_so_a_rerun_leaves_git_clean(tmp_path):
    a, b = _converted_and_parameterized(tmp_path, "a.ipynb"), _converted_and_parameterized(tmp_path, "b.ipynb")
    assert a.read_bytes() == b.read_bytes()  # papermill's injected cell gets a random id; the runner renumbers
    cells = json.loads(a.read_text())["cells"]
    assert [c["id"] for c in cells] == [f"cell-{i:03d}" for i in range(len(cells))] and len(cells) == 4
    injected = [c for c in cells if "injected-parameters" in c["metadata"].get("tags", [])]
    assert len(injected) == 1 and 'fig_dir = "figures/tiny"' in "".join(injected[0]["source"])  # not the staging path


# ------------------------------------------------------------------ a runner installed outside a checkout
def test_runner_outside_a_checkout_says_so_and_names_root(tmp_path, monkeypatch, capsys):
    root = profiles.ROOT
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(profiles, "HERE", profiles.Checkout.of(site.parent))  # as if installed: no notebooks/ here
    with pytest.raises(SystemExit) as e:
        run.main(["01", "--check"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "no notebooks/ directory under" in err[0] and "--root DIR" in err[0]
    run.main(["01", "--check", "--root", str(root)])
    assert json.loads(capsys.readouterr().out)["model_path"] == "data/policies/tiny-m"
    assert profiles.HERE == profiles.Checkout.of(site.parent)  # --root applied to that call only
    with pytest.raises(SystemExit):
        run.main(["01", "--check", "--root", str(tmp_path / "nope")])
    assert "no notebooks/ directory under --root" in capsys.readouterr().err


def test_cores_pool_the_cpu_notebooks_and_leave_accelerator_ones_alone():
    """`--cores N`: every run of consecutive CPU notebooks is one pool (each notebook's threads pinned:
    one, 07's two workers x one); with N = 1, or on an accelerator, every notebook is a segment of its own."""
    paths = figure_notebooks()
    tiny = [(nb, resolve.resolve_params(nb, "tiny")) for nb in paths]
    stems = lambda groups: [[nb.stem[:2] for nb, _ in g] for g in groups]  # noqa: E731
    assert [pool.cpu_threads(p) for _, p in tiny] == [1, 1, 1, 1, 1, 1, 2, 1]  # 07: 2 workers x 1
    every = manifest.keys()
    assert stems(pool.segments(tiny, 1)) == [[s] for s in every]
    assert stems(pool.segments(tiny, 2)) == [every]
    gpu = [(nb, dict(p, device="cuda")) for nb, p in tiny]
    assert stems(pool.segments(gpu, 64)) == [[s] for s in every]
    mixed = tiny[:3] + [gpu[3]] + tiny[4:]
    assert stems(pool.segments(mixed, 2)) == [["01", "02", "03"], ["04"], ["05", "06", "07", "08"]]
    trl = dict(tiny[6][1], engine="trl")   # TRL's trainer is one process whatever `workers` says
    assert pool.cpu_threads(trl) == 1
    assert pool.cpu_threads({"device": "cpu"}) is None   # a notebook that does not pin its threads runs alone


def test_the_pool_starts_notebooks_while_their_threads_fit_and_none_after_a_failure(tmp_path, monkeypatch, capsys):
    """_run_pool with fake children: at most `cores` threads run at once, the widest notebook (07's two
    workers) first, then in order; after a failure nothing more starts and its exit status returns."""
    import types
    starts, live, peak = [], [], [0]

    class Child:
        def __init__(self, cmd, stdout, **kw):
            self.stem, self.returncode, self.polls = cmd[3], None, 0
            stdout.write(f"[run] {self.stem}.py done in 1 s\n")
            starts.append(self.stem)
            live.append(self)
            peak[0] = max(peak[0], sum(2 if c.stem.startswith("07") else 1 for c in live))

        def poll(self):
            self.polls += 1
            if self.polls >= 2 + len(self.stem) % 3 and self.returncode is None:
                self.returncode = 1 if self.stem == FAIL[0] else 0
                live.remove(self)
            return self.returncode

    FAIL = [""]
    monkeypatch.setattr(pool.subprocess, "Popen", Child)
    monkeypatch.setattr(pool.time, "sleep", lambda s: None)
    monkeypatch.setattr(profiles, "HERE", dataclasses.replace(profiles.HERE, root=tmp_path))
    group = [(Path(f"{s}.py"), {"threads": 1, "workers": 2 if s.startswith("07") else 1})
             for s in ("01_a", "02_b", "03_c", "07_d", "08_e")]
    a = types.SimpleNamespace(cores=2, profile="tiny", replace=False)
    assert pool.run_pool(group, a, {nb: {} for nb, _ in group}) == 0
    assert starts == ["07_d", "01_a", "02_b", "03_c", "08_e"] and peak[0] == 2   # the widest first
    starts.clear()
    # with the plans' seconds: the widest, then the longest first; no estimate: notebook order, after them
    assert pool.run_pool(group, a, {nb: {} for nb, _ in group}, {"02_b": 30.0, "03_c": 240.0, "07_d": 1.0}) == 0
    assert starts == ["07_d", "03_c", "02_b", "01_a", "08_e"]
    starts.clear()
    FAIL[0] = "02_b"
    assert pool.run_pool(group, a, {nb: {} for nb, _ in group}) == 1
    assert starts[:3] == ["07_d", "01_a", "02_b"] and "08_e" not in starts
    err = capsys.readouterr().err
    assert "02_b FAILED (exit 1)" in err and "not started after the failure" in err


def test_a_kernel_whose_port_was_taken_is_started_again(tmp_path, monkeypatch, capsys):
    """Two runners starting kernels at once (05 and 06 side by side) can race for a port: the kernel
    dies binding it before any cell ran. run_notebook starts it again (up to PORT_RETRIES times); any
    other kernel death is a failure at once."""
    import shutil

    import papermill
    calls = []

    def fake_execute(src, out, **kw):
        calls.append(out)
        if len(calls) == 1:
            raise RuntimeError("Kernel died before replying to kernel_info")
        shutil.copy(src, out)   # the second start runs through (a copy of the prepared notebook)

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    monkeypatch.setattr(execute, "_port_taken", lambda klog: True)
    out = execute.run_notebook("02", "smoke", out_root=tmp_path, log_output=False)
    assert out.exists() and len(calls) == 2
    assert "another process took the kernel's port as it started; starting it again (1/3)" in capsys.readouterr().out
    calls.clear()
    monkeypatch.setattr(execute, "_port_taken", lambda klog: False)   # a kernel that died of something else
    with pytest.raises(execute.NotebookFailed, match="Kernel died before replying"):
        execute.run_notebook("02", "smoke", out_root=tmp_path / "again", log_output=False)
    assert len(calls) == 1


ENV_NB = '''# %% tags=["parameters"]
profile = "tiny"
fig_dir = "figures/tiny"
results_dir = "data/results/tiny"

# %%
import os
from pathlib import Path
Path(results_dir).mkdir(parents=True, exist_ok=True)
(Path(results_dir) / "env.txt").write_text(os.environ.get("MALLOC_MMAP_THRESHOLD_", "") + " "
                                           + os.environ.get("MALLOC_TRIM_THRESHOLD_", ""))
'''


@pytest.mark.slow
def test_kernel_starts_with_the_malloc_thresholds_unless_the_user_set_them(tmp_path, monkeypatch):
    """The notebook's own process (the kernel) reads the glibc tunables; a value in the caller's
    environment is passed through unchanged."""
    root = tmp_path / "repo"
    (root / "notebooks/params").mkdir(parents=True)
    (root / "notebooks/params/tiny.yaml").write_text("96_env: {}\n")
    nb = root / "notebooks" / "96_env.py"
    nb.write_text(ENV_NB)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")
    execute.run_notebook(str(nb), "tiny", out_root=root, log_output=False)
    assert (root / "data/results/tiny/env.txt").read_text() == f"{1 << 30} 12345"


def test_bench_sampler_builds_the_stand_in_model_first(monkeypatch, tmp_path):
    """`make bench B=sampler` on a fresh clone: the CPU bench builds data/standins/ (without the slow
    paper-vocab model) instead of failing on a missing directory; a built one is reused (build is idempotent)."""
    from cancellation import bench_sampling, standins
    calls = []
    monkeypatch.setattr(standins, "build", lambda out, **kw: calls.append((out, kw)) or {"model": str(tmp_path)})
    assert bench_sampling.standin_model() == str(tmp_path)
    (out, kw), = calls
    assert out == profiles.ROOT / "data" / "standins" and kw == {"paper_vocab": False}


# ------------------------------------------------------------------ side by side: a signal to the runner's PID
SIDE_BY_SIDE_RUNNER = r'''
import subprocess, sys, types
from pathlib import Path
from cancellation import pool, profiles
out = Path(sys.argv[1])
CHILD = """
import pathlib, signal, sys, time
name, out = sys.argv[1], pathlib.Path(sys.argv[2])
def stop(sig, frame):
    (out / (name + ".sig")).write_text(str(sig))
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
(out / (name + ".up")).write_text("up")
time.sleep(120)
"""
real = subprocess.Popen
pool.subprocess.Popen = lambda cmd, **kw: real([sys.executable, "-c", CHILD, cmd[3], str(out)], **kw)  # cmd[3]: the stem
pool.STAGGER_S = 0.1
group = [(Path("05_value_gap.py"), {"threads": 1}), (Path("06_sampling_budget.py"), {"threads": 1})]
try:
    pool.run_pool(group, types.SimpleNamespace(cores=2, profile="tiny", replace=False), {nb: {} for nb, _ in group},
                  checkout=profiles.Checkout.of(out))
except KeyboardInterrupt:
    sys.exit(130)
'''


def test_a_signal_to_the_runners_pid_reaches_every_side_by_side_child_once(tmp_path):
    """`kill -INT <runner pid>` (not the terminal's process group): the runner passes SIGINT to each child
    (each in a session of its own, so exactly once), waits for them and exits 130; no child is left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    env = dict(os.environ, PYTHONPATH=str(profiles.ROOT / "lib"))
    # the runner as a terminal starts it, with SIGINT's default disposition: a test process that ran kernels
    # (papermill, jupyter_client) may hold SIGINT ignored, which a child would inherit and keep
    p = subprocess.Popen([sys.executable, "-c", SIDE_BY_SIDE_RUNNER, str(tmp_path)], env=env, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while not all((tmp_path / f"{s}.up").exists() for s in ("05_value_gap", "06_sampling_budget")):
        assert time.time() < deadline and p.poll() is None, "the children did not start"
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGINT)   # the runner alone, as a kill from another terminal sends it
    assert p.wait(timeout=60) == 130
    for s in ("05_value_gap", "06_sampling_budget"):
        assert (tmp_path / f"{s}.sig").read_text() == str(int(signal.SIGINT)), s   # each child got SIGINT
