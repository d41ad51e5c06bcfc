"""make gpu-check: refuses without a GPU (exit 2, one line), plans its steps under a budget, and renders
its report (the numbers in the markdown are the JSON's, rounded as stated)."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cancellation import gpucheck

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_gpu():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no CUDA device" in p.stderr
    assert p.stdout == ""


def test_list_names_every_step_in_order():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck", "--list", "--notebooks", "05", "01"],
                       capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in p.stdout.splitlines()]
    assert names == ["pytest", "sampler", "profile", "units", "trim", "dry-05", "dry-01"]


def test_dry_overrides_per_notebook():
    o = gpucheck._dry_overrides("03")
    pairs = dict(zip(o[1::3], o[2::3]))
    assert o[0::3] == ["-p"] * len(pairs)
    assert pairs["mask_size"] == "1" and pairs["model_path"] == gpucheck.SHAPE and pairs["n_prompts"] == "4"
    o6 = gpucheck._dry_overrides("06")
    assert dict(zip(o6[1::3], o6[2::3]))["n_prompts"] == "16" and o6.count("n_prompts") == 1


def test_markdown_from_a_report():
    rep = dict(device=dict(date="2026-11-26", name="NVIDIA H200", kind="nvidia-h200", memory_gib=139.8,
                           torch="2.11.0"), budget_s=540, spent_s=500.2,
               steps=[dict(step="pytest", rc=0, seconds=80.0, output_tail="...\n10 passed in 70.1s\n"),
                      dict(step="sampler", rc=0, seconds=150.0,
                           rows=[dict(shape="64 x 512", way="ours", tokens_per_s=12345.6, first_call_s=3.21),
                                 dict(shape="64 x 512", way="weight-read limit", tokens_per_s=99999.0,
                                      first_call_s=None)]),
                      dict(step="units", rc=124, seconds=150.0),
                      dict(step="trim", rc=0, seconds=90.0,
                           trim=[dict(block="analysis_forward", rows=16, columns=1280, chunk_rows=4,
                                      positions_share=0.6234, seconds_full=2.0, seconds_trim=1.25, speedup=1.6,
                                      max_abs_diff=3.1e-6)]),
                      dict(step="dry-03", rc=0, seconds=60.0,
                           measured=dict(notebook="03_masked_updates", measured_seconds=61.4, peak_cuda_gib=40.0,
                                         planned=dict(predicted_seconds=40.0, peak_gib=50.0))),
                      dict(step="dry-05", skipped="budget: 20 s left, estimated 75 s")])
    md = gpucheck.markdown(rep)
    assert "| pytest | ok | 80.0 |" in md and "10 passed in 70.1s" in md
    assert "| units | timed out |" in md
    assert "| analysis_forward | 16 x 1280 | 4 | 62% | 2.00 | 1.25 | 1.60x | 3.1e-06 |" in md
    assert "| 64 x 512 | ours | 12,346 | 3.2 |" in md
    assert "| 03_masked_updates | 61 s, 40.0 GiB | 40 s, 50.0 GiB | 1.53x, 0.80x |" in md  # 61.4/40, 40/50
    assert "| 05 | not measured (budget: 20 s left, estimated 75 s) | | |" in md


def _bare_interpreter(tmp_path):
    """An interpreter with torch (and the rest of this environment's packages) but without this package:
    a venv whose only path entry is this environment's site-packages as a plain directory, so the
    editable install's hook there is never run."""
    import site
    import venv
    env = tmp_path / "py"
    venv.EnvBuilder(with_pip=False).create(env)
    sp = next(env.glob("lib/python*/site-packages"))
    (sp / "host.pth").write_text("\n".join(p for p in site.getsitepackages() if Path(p).exists()) + "\n")
    return env / "bin" / "python"


@pytest.mark.skipif(torch.cuda.is_available(), reason="rehearses the refusal on a machine without a GPU")
def test_gpu_check_on_a_bare_offline_clone_reaches_the_no_cuda_line_fast(tmp_path):
    """The CPU rehearsal of a bare GPU machine (issue: the first GPU hour cannot fail): the checkout's files as a
    fresh clone has them (no .venv, no data/standins), an interpreter that has torch but not this package,
    no network. `make gpu-check PY=<it>` installs nothing, builds no stand-in, and reaches the 'no CUDA
    device' line (exit 2) in under a minute; the interpreter alone cannot import the package."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    clone = tmp_path / "clone"
    for f in files:
        if (ROOT / f).is_file() and not f.startswith(("notebooks/executed/", "figures/", "data/results/")):
            (clone / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, clone / f)
    py = _bare_interpreter(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", HF_HUB_OFFLINE="1", PATH=f"{py.parent}{os.pathsep}{env.get('PATH', '')}")
    alone = subprocess.run([str(py), "-c", "import torch, cancellation"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert "No module named 'cancellation'" in alone.stderr   # the rehearsal's interpreter: torch, not the package
    t = time.time()
    p = subprocess.run(["make", "-s", "gpu-check", f"PY={py}"], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=120)
    secs = time.time() - t
    assert p.returncode != 0 and "no CUDA device here" in p.stderr, p.stdout + p.stderr
    assert secs < 60, secs
    assert not (clone / ".venv").exists() and not (clone / "data" / "standins").exists()
    assert "pip" not in p.stdout and "Traceback" not in p.stderr


def test_standin_data_writes_only_the_problem_files_the_dry_runs_read(tmp_path):
    from cancellation import tasks
    r = gpucheck.standin_data(tmp_path)
    assert r["written"] and sorted(p.name for p in tmp_path.iterdir()) == ["dapo-math-17k.parquet", "math500.jsonl",
                                                                          "plain.jsonl"]
    assert len(tasks.ProblemSource(path=str(tmp_path / "dapo-math-17k.parquet")).load()) > 0
    assert gpucheck.standin_data(tmp_path)["written"] is False   # present: left alone


def test_an_uncached_hub_model_offline_is_one_line_naming_it(monkeypatch, tmp_path):
    from cancellation import policy
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    t = time.time()
    with pytest.raises(policy.PolicyLoadError) as e:
        policy.load_policy("Qwen/Qwen3-1.7B-Base")
    assert time.time() - t < 10 and "Qwen/Qwen3-1.7B-Base" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_report_says_what_the_machine_has_first():
    got = gpucheck.packages(("transformers", "no_such_package_here"))
    assert got["transformers"]["importable"] and got["transformers"]["version"]
    assert got["no_such_package_here"] == dict(version=None, importable=False, error=None)
    rep = dict(device=dict(date="2026-11-27", name="X", kind="x", memory_gib=1, torch="t", cuda="12", python="3",
                           driver="550", packages=got), budget_s=1, spent_s=1, steps=[])
    md = gpucheck.markdown(rep)
    assert "**The machine:** driver 550, CUDA 12" in md and "no_such_package_here absent" in md
    assert md.index("**The machine:**") < md.index("| step | status |")
