"""make gpu-check: refuses without a GPU (exit 2, one line), plans its steps under a budget, and renders
its report (the numbers in the markdown are the JSON's, rounded as stated)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cancellation import gpucheck, gpureport, manifest, profiles, resolve, sampling_path

ROOT = Path(__file__).resolve().parents[1]
FAKE_VLLM = Path(__file__).parent / "fake_vllm"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_refuses_without_gpu():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no CUDA device" in p.stderr
    assert p.stdout == ""


def test_list_names_every_step_in_order():
    p = subprocess.run([sys.executable, "-m", "cancellation.gpucheck", "--list", "--notebooks", "05", "01"],
                       capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in p.stdout.splitlines() if not line.startswith("(")]
    assert names == ["standins", "pytest", "sampler", "vllm", "dry-05", "dry-01", "profile", "units", "trim"]
    assert gpucheck.plan_steps(["05"], units_first=True)[4][0] == "units"   # a card the planner has no file for
    lines = dict(line.split(None, 1) for line in p.stdout.splitlines() if not line.startswith("("))
    assert "paper-quick, backend " in lines["dry-05"] and "M=4" in lines["dry-05"]   # the plan: profile, backend, sizes
    assert "(default CUDA sampling path on nvidia-h200: transformers, ours / transformers static cache + compile: " \
        "0.46x at 64 x 512 (< 1.0x); from data/scale/measured/gpucheck-nvidia-h200-2026-11-26.json)" in p.stdout
    if not gpucheck.packages(("vllm",))["vllm"]["importable"]:
        assert "skipped here: vllm: not importable (" in lines["vllm"]
        assert "backend hf (falls back to hf: vllm: not importable (" in lines["dry-05"]


def test_dry_overrides_per_notebook():
    o = gpucheck._dry_overrides("03")
    pairs = dict(zip(o[1::3], o[2::3]))
    assert o[0::3] == ["-p"] * len(pairs)
    assert pairs["mask_size"] == "1" and pairs["model_path"] == gpucheck.SHAPE and pairs["n_prompts"] == "4"
    assert pairs["topk_sizes"] == "[1, 2]" and "backend" not in pairs
    o6 = gpucheck._dry_overrides("06", "hf")
    assert dict(zip(o6[1::3], o6[2::3]))["n_prompts"] == "16" and o6.count("n_prompts") == 1
    assert dict(zip(o6[1::3], o6[2::3]))["backend"] == "hf"


def test_dry_runs_are_paper_quicks_sections_and_backends():
    """paper-quick's backends (vLLM where its section says so and vllm imports; else hf, with the reason), 07 and
    the vLLM notebooks first; every notebook's dry-run parameters pass the runner's validation."""
    assert gpucheck.DRY_PROFILE == "paper-quick"
    assert gpucheck.dry_order() == ["07", "01", "05", "06", "08", "02", "03", "04"]
    ok = dict(version="0.11", importable=True, error=None)
    assert gpucheck.dry_backend("01", ok) == ("vllm", None)
    assert gpucheck.dry_backend("02", ok) == ("hf", None)          # paper-quick samples 02 with hf
    b, why = gpucheck.dry_backend("07", ok)                         # TRL's own engine needs the weights on disk
    assert b == "hf" and "TRL" in why and gpucheck.SHAPE in why
    b, why = gpucheck.dry_backend("05", dict(version="0.11", importable=False, error="ImportError: libcudart.so"))
    assert (b, why) == ("hf", "falls back to hf: vllm: not importable (ImportError: libcudart.so)")
    assert gpucheck.dry_backend("05", dict(version=None, importable=False, error=None))[1].endswith("(not installed)")
    gpucheck.standin_data()   # the problem files the validation checks exist (as gpu-check writes them)
    for f in manifest.FIGURES:
        check_dry_run_params(f)


def check_dry_run_params(f):
    """A figure's dry-run parameters (paper-quick's section, none needed, at DRY_SIZES and the manifest's `dry`)
    pass the runner's validation in the checkout (profiles.HERE: tests/test_manifest.py's dummy figure's too)."""
    back, why = gpucheck.dry_backend(f.key, None)
    o = gpucheck._dry_overrides(f.key, back if why else None)
    P = resolve.resolve_params(profiles.find_notebook(f.notebook), "paper-quick", dict(zip(o[1::3], o[2::3])),
                               cwd=profiles.HERE.root, check_paths=True)
    assert P["model_path"] == gpucheck.SHAPE and P["max_new_tokens"] == 128 and P["dtype"] == "float32"
    assert P.get("backend", "hf") == "hf"                         # no vllm here: every one falls back


def test_markdown_from_a_report():
    rep = dict(device=dict(date="2026-11-26", name="NVIDIA H200", kind="nvidia-h200", memory_gib=139.8,
                           torch="2.11.0"), budget_s=540, spent_s=500.2,
               steps=[dict(step="pytest", rc=0, seconds=80.0, output_tail="...\n10 passed in 70.1s\n"),
                      dict(step="sampler", rc=0, seconds=150.0,
                           rows=[dict(shape="64 x 512", way="ours", tokens_per_s=12345.6, first_call_s=3.21),
                                 dict(shape="64 x 512", way="weight-read limit", tokens_per_s=99999.0,
                                      first_call_s=None)]),
                      dict(step="vllm", skipped="vllm: not importable (not installed)"),
                      dict(step="units", rc=124, seconds=150.0),
                      dict(step="trim", rc=0, seconds=90.0,
                           trim=[dict(block="analysis_forward", rows=16, columns=1280, chunk_rows=4,
                                      positions_share=0.6234, seconds_full=2.0, seconds_trim=1.25, speedup=1.6,
                                      max_abs_diff=3.1e-6)]),
                      dict(step="dry-03", rc=0, seconds=60.0, backend="hf",
                           measured=dict(notebook="03_masked_updates", measured_seconds=61.4, peak_cuda_gib=40.0,
                                         planned=dict(predicted_seconds=40.0, peak_gib=50.0))),
                      dict(step="dry-05", skipped="budget: 20 s left, estimated 75 s", backend="hf",
                           fallback="falls back to hf: vllm: not importable (not installed)")])
    md = gpureport.markdown(rep)
    assert "| pytest | ok | 80.0 |" in md and "10 passed in 70.1s" in md
    assert "| units | timed out |" in md
    assert "| analysis_forward | 16 x 1280 | 4 | 62% | 2.00 | 1.25 | 1.60x | 3.1e-06 |" in md
    assert "| 64 x 512 | ours | 12,346 | 3.2 | 12.3% |" in md                 # 12345.6 / 99999
    assert "| 64 x 512 | vllm: not importable (not installed) | | | |" in md
    assert "| 03_masked_updates | hf | 61 s, 40.0 GiB | 40 s, 50.0 GiB | 1.53x, 0.80x |" in md  # 61.4/40, 40/50
    assert ("| 05 | hf (falls back to hf: vllm: not importable (not installed)) | not measured (budget: 20 s left, "
            "estimated 75 s) | | |") in md


def _bare_interpreter(tmp_path, modules=None):
    """An interpreter without this package: a venv whose only path entry is a plain directory. With `modules`
    (import names), that directory holds links to exactly their distributions and what those require (torch and
    numpy alone: a bare GPU machine's python); without, it is this environment's site-packages (everything but
    the editable install's hook)."""
    import site
    import venv
    env = tmp_path / ("py" if modules is None else "py-" + "-".join(sorted(modules)))
    venv.EnvBuilder(with_pip=False).create(env)
    sp = next(env.glob("lib/python*/site-packages"))
    if modules is None:
        paths = [p for p in site.getsitepackages() if Path(p).exists()]
    else:
        paths = [str(_link_farm(env / "farm", modules))]
    (sp / "host.pth").write_text("\n".join(paths) + "\n")
    return env / "bin" / "python"


def _link_farm(farm: Path, modules) -> Path:
    """A directory of links to the installed files of the distributions that provide `modules` (import names)
    and, recursively, of every distribution they require (markers evaluated, no extras)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    by_module = metadata.packages_distributions()
    todo = [d for m in modules for d in by_module[m]]
    seen = set()
    farm.mkdir(parents=True)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            if top.endswith(".pth") or top.startswith("__editable__") or top == "..":
                continue
            src = Path(dist.locate_file(top))
            if src.exists() and not (farm / top).exists():
                (farm / top).symlink_to(src)
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return farm


@pytest.mark.skipif(torch.cuda.is_available(), reason="rehearses the refusal on a machine without a GPU")
@pytest.mark.parametrize("modules", [None, ("torch", "numpy")], ids=["all-but-the-package", "torch-numpy"])
def test_gpu_check_on_a_bare_offline_clone_reaches_the_no_cuda_line_fast(tmp_path, modules):
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
    py = _bare_interpreter(tmp_path, modules)
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
    if modules is not None:   # torch and numpy only: one line names what is missing and what that skips, first
        first = p.stderr.splitlines()[0]
        assert first.startswith("gpu-check: this python") and "lacks " in first and "pandas" in first, p.stderr
        assert "skips standins, pytest, sampler" in first and "pyyaml" in first
        assert [x for x in p.stderr.splitlines() if not x.startswith("make")][1:] == \
            [x for x in p.stderr.splitlines() if "no CUDA device here" in x]   # that line, then the no-CUDA one
    assert not (clone / ".venv").exists() and not (clone / "data" / "standins").exists()
    assert "pip" not in p.stdout and "Traceback" not in p.stderr


def test_standin_data_writes_only_the_problem_files_the_dry_runs_read(tmp_path):
    from cancellation import sources
    r = gpucheck.standin_data(tmp_path)
    assert r["written"] and sorted(p.name for p in tmp_path.iterdir()) == ["dapo-math-17k.parquet", "math500.jsonl",
                                                                          "plain.jsonl"]
    assert len(sources.ProblemSource(path=str(tmp_path / "dapo-math-17k.parquet")).load()) > 0
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


def test_an_uncached_hub_model_without_network_is_one_line_in_5_s(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE unset and no network (the hub endpoint refuses connections: a closed local port): one line
    naming the model and the endpoint within 5 s, not transformers' retries."""
    import socket

    from cancellation import policy
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now: connections are refused
    for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
              "ALL_PROXY"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    t = time.time()
    with pytest.raises(policy.PolicyLoadError) as e:
        policy.load_policy("Qwen/Qwen3-1.7B-Base")
    assert time.time() - t < 5 and "Qwen/Qwen3-1.7B-Base" in str(e.value) and f"127.0.0.1:{port}" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_report_says_what_the_machine_has_first():
    got = gpucheck.packages(("transformers", "no_such_package_here"))
    assert got["transformers"]["importable"] and got["transformers"]["version"]
    assert got["no_such_package_here"] == dict(version=None, importable=False, error=None)
    rep = dict(device=dict(date="2026-11-27", name="X", kind="x", memory_gib=1, torch="t", cuda="12", python="3",
                           driver="550", packages=got), budget_s=1, spent_s=1, steps=[])
    md = gpureport.markdown(rep)
    assert "**The machine:** driver 550, CUDA 12" in md and "no_such_package_here absent" in md
    assert md.index("**The machine:**") < md.index("| step | status |")


def _fake_env():
    return dict(PYTHONPATH=os.pathsep.join([str(FAKE_VLLM), str(ROOT / "lib")]))


def test_the_vllm_row_from_the_fake_vllm(tmp_path):
    """The vllm step's code path end to end against tests/fake_vllm (its speed means nothing): its own process,
    bench_sampling.sampler's row format, and the markdown's numbers are the JSON's. The fake takes a real tiny model
    (it loads weights; the real engine takes dummy ones at Qwen3-1.7B's shape)."""
    expr = ("gpucheck.sampler_vllm(model='data/policies/tiny-m', dims=((4, 6), (8, 3)), dtype='float32', "
            "device='cpu')")
    r = gpucheck._json_step("vllm", expr, tmp_path / "v.json", 120, env=_fake_env())
    assert r["rc"] == 0, r["output_tail"]
    got = r.pop("json")
    assert got["engine_start_s"] >= 0
    rows = gpureport.rows(got["rows"])
    assert [(x["shape"], x["way"]) for x in rows] == [("4 x 6", "vLLM 0.0-fake"), ("8 x 3", "vLLM 0.0-fake")]
    assert all(x["tokens_per_s"] > 0 and x["first_call_s"] > 0 for x in rows)
    sampler_rows = [dict(shape="4 x 6", way="ours (static cache, CUDA graph)", tokens_per_s=1000.0, first_call_s=2.0),
                    dict(shape="4 x 6", way="weight-read limit", tokens_per_s=50000.0, first_call_s=None)]
    rep = dict(device=dict(date="2026-11-28", name="X", kind="x", memory_gib=1, torch="t",
                           packages=dict(vllm=dict(version="0.0-fake", importable=True, error=None))),
               budget_s=1, spent_s=1, steps=[dict(step="sampler", rc=0, seconds=1.0, rows=sampler_rows),
                                             dict(step="vllm", rc=0, seconds=1.0, rows=rows)])
    md = gpureport.markdown(json.loads(json.dumps(rep)))   # as read back from the JSON file
    v = rows[0]
    assert (f"| 4 x 6 | vLLM 0.0-fake | {v['tokens_per_s']:,.0f} | {v['first_call_s']:.1f} | "
            f"{100 * v['tokens_per_s'] / 50000.0:.1f}% |") in md
    assert f"| 8 x 3 | vLLM 0.0-fake | {rows[1]['tokens_per_s']:,.0f} | {rows[1]['first_call_s']:.1f} |  |" in md
    assert md.index("| 4 x 6 | vLLM") < md.index("| 4 x 6 | weight-read limit")   # each shape's limit last
    assert "not importable" not in md


def test_without_vllm_the_step_says_why():
    rec = gpucheck.packages(("vllm",))["vllm"]
    if rec["importable"]:
        pytest.skip("vllm imports here")
    got = gpucheck.sampler_vllm()
    assert "No module named 'vllm'" in got["error"] and "rows" not in got
    assert gpucheck.vllm_unavailable(rec).startswith("vllm: not importable (")


def test_the_default_cuda_sampler_from_the_committed_h200_report():
    """Issue 49, item 3: ours only at >= 1.0x transformers' static cache + compile in the same run. The committed
    H200 report measured ours below it (its JSON, not a typed number), so transformers' path is chosen."""
    f = ROOT / "data" / "scale" / "measured" / "gpucheck-nvidia-h200-2026-11-26.json"
    rows = {r["way"]: r["tokens_per_s"] for s in json.loads(f.read_text())["steps"] for r in s.get("rows") or []
            if r["shape"] == "64 x 512"}
    want = rows["ours (static cache, CUDA graph)"] / rows["transformers generate, static cache + torch.compile"]
    c = sampling_path.default_cuda_sampler("nvidia-h200")
    assert c["report"] == "data/scale/measured/gpucheck-nvidia-h200-2026-11-26.json"
    assert c["path"] == "transformers" and c["ratios"] == {"64 x 512": want} and want < 1.0
    assert f"{want:.2f}x at 64 x 512 (< 1.0x)" in c["why"]
    assert sampling_path.default_cuda_sampler("no-such-card")["path"] == "transformers"


def _rep(ways: dict, vllm_ok=True):
    rows = [dict(shape=sh, way=w, tokens_per_s=t, first_call_s=None) for sh, d in ways.items() for w, t in d.items()]
    return dict(device=dict(packages=dict(vllm=dict(importable=vllm_ok))), steps=[dict(step="sampler", rows=rows)])


def test_choose_sampler_rules():
    ours, st, dyn = "ours (static cache, CUDA graph)", sampling_path.STATIC, sampling_path.DYNAMIC
    lim = "weight-read limit"
    assert sampling_path.choose_sampler(_rep({"64 x 512": {ours: 100.0, st: 100.0, lim: 1e6}}))["path"] == "ours"
    assert sampling_path.choose_sampler(_rep({"64 x 512": {ours: 99.0, st: 100.0}}))["path"] == "transformers"
    # never beside static + compile in one run: not ours, whatever the dynamic cache measured
    c = sampling_path.choose_sampler(_rep({"256 x 256": {ours: 500.0, dyn: 100.0}}))
    assert c["path"] == "transformers" and "never measured" in c["why"]
    fast = {"64 x 512": {ours: 100.0, st: 200.0, "vLLM 0.11": 300.0}, "256 x 256": {ours: 50.0, "vLLM 0.11": 90.0}}
    assert sampling_path.choose_sampler(_rep(fast))["path"] == "vllm"
    assert sampling_path.choose_sampler(_rep(fast, vllm_ok=False))["path"] == "transformers"   # measured, not here
    assert sampling_path.choose_sampler(_rep(fast), vllm_importable=False)["path"] == "transformers"
    slow = {"64 x 512": {ours: 100.0, st: 200.0, "vLLM 0.11": 150.0}}
    assert sampling_path.choose_sampler(_rep(slow))["path"] == "transformers"
    md = gpureport.markdown(dict(device=dict(date="d", name="n", kind="k", memory_gib=1, torch="t"), budget_s=1,
                                spent_s=1, steps=[], sampler_choice=sampling_path.choose_sampler(_rep(slow))))
    assert "**Default CUDA sampling path from this run's numbers:** transformers (ours / transformers static" in md


def test_make_sampler_under_a_dry_run_gives_vllm_dummy_weights_then_the_models(monkeypatch):
    """The seam the vLLM dry runs need (vllm_seam.vllm_dry_kw): data/shapes/ holds only config.json, so the engine
    starts on dummy weights without a tokenizer and make_sampler pushes the HF model's random weights into it.
    Outside a dry run nothing changes (tests/test_rollout.py pins the arguments)."""
    from cancellation import policy, sampler, vllm_seam
    from cancellation.dryrun import DRY_RUN_ENV
    monkeypatch.syspath_prepend(str(FAKE_VLLM))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "vllm" or k.startswith("vllm.")}
    try:
        assert vllm_seam.vllm_dry_kw() == {}
        monkeypatch.setenv(DRY_RUN_ENV, json.dumps({"seed": 0}))
        path = ROOT / "data" / "policies" / "tiny-m"
        model, _ = policy.load_policy(path, dtype="float32")
        llm = sampler.make_sampler(model, path, backend="vllm", dtype="float32")
        assert llm.init_kwargs["load_format"] == "dummy" and llm.init_kwargs["skip_tokenizer_init"] is True
        assert sorted(llm.handle.loaded) == sorted(model.state_dict())
        for k, v in model.state_dict().items():
            assert torch.equal(llm.model.state_dict()[k], v)
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.slow   # builds interpreters and collects tests in them: make test, not make test-fast
def test_each_steps_needs_are_enough_to_start_it(tmp_path):
    """An interpreter holding exactly a step's NEEDS (and torch) starts that step: the pytest step collects the gpu
    test files without an error, the json steps import what `_json_step` imports, the stand-in step its builder.
    So a module a step imports but NEEDS does not list fails here, not on the lent GPU."""
    env = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}, "PYTHONPATH": str(ROOT / "lib")}
    json_imports = "from cancellation import bench, gpucheck, scale"
    for step, cmd in [("pytest", ["-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                  *gpucheck.gpu_test_files()]),
                      ("sampler", ["-c", json_imports]),
                      ("units", ["-c", json_imports + "; import cancellation.scale as s; s.trim_probe"]),
                      ("standins", ["-c", json_imports + "; from cancellation import standins; "
                                    "from transformers import Qwen3Config"])]:
        py = _bare_interpreter(tmp_path / step, ("torch",) + gpucheck.step_needs(step))
        p = subprocess.run([str(py), *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "error" not in p.stdout.lower(), (step, p.stdout[-2000:], p.stderr[-2000:])
    assert len(gpucheck.gpu_test_files()) >= 5 and "tests/test_sampler.py" in gpucheck.gpu_test_files()


def test_step_caps_and_missing_modules():
    assert gpucheck.step_cap(100, 1000) == gpucheck.CAP * 100 + 30     # its own cap ...
    assert gpucheck.step_cap(100, 120) == 120                           # ... never past what is left
    assert gpucheck.step_cap(100, 5) == 30
    assert gpucheck.missing_modules(["json", "no_such_module_here", "json"]) == ["no_such_module_here"]
    miss = {"pytest": ["pandas"], "dry-07": ["trl"]}
    line = gpucheck.missing_line(miss, ["standins", "pytest", "dry-07", "profile"])
    assert "lacks pandas, trl: skips pytest, dry-07; runs standins, profile" in line
    assert gpucheck.step_needs("dry-07")[-3:] == ("trl", "accelerate", "datasets")


def test_the_sampler_step_measures_at_the_notebooks_shapes():
    """Issue 63, item 7: gpu-check times ours and transformers' static cache + compile at the shapes paper-quick's
    notebooks sample at (their planner workloads at their sections: 02 samples 64 rows in 2 calls of 32 x 1,024,
    03 in 10, 04 in 16: its 8 batches, the thesis rows' coverage), the hf-backend notebooks' shapes first, after prompts of at least MEASURE_PROMPT tokens;
    Monte Carlo continuations (05's rows_per_chunk calls) are not counted: they stay on ours."""
    shapes = gpucheck.notebook_shapes()
    got = {nb: [(c["rows"], c["new"], c["calls"]) for c in v["calls"]] for nb, v in shapes.items()}
    assert got["02"] == [(32, 1024, 2)] and got["03"] == [(32, 1024, 10)] and got["04"] == [(32, 1024, 16)]
    assert {shapes[nb]["backend"] for nb in ("02", "03", "04")} == {"hf"}
    assert got["05"] == [(32, 1024, 4)]          # its two batches of 64 rows; the continuations left out
    prompt = shapes["02"]["calls"][0]["prompt"]
    dims = gpucheck.measure_dims(shapes)
    assert dims[0] == (32, 1024, max(gpucheck.MEASURE_PROMPT, -(-prompt // 64) * 64))
    assert (128, 1024) in {d[:2] for d in dims[1:]}   # the vLLM notebooks' batch shapes after (an hf fallback's)
    assert gpucheck.SAMPLER_KW["compile"] is False    # bench's 64 x 512 compile gives way to the notebooks' shapes


def test_the_report_says_what_auto_picks_per_notebook(tmp_path, monkeypatch):
    """The sampler step's rows (old 'rows x new' labels beside new ', prompt P' ones) and its notebooks' calls:
    the report holds, and its markdown prints, the end-to-end choice per notebook -- ours for 02's 2 calls,
    transformers' for 03's 10 -- beside the steady-state summary."""
    ours, st = "ours (static cache, CUDA graph)", sampling_path.STATIC
    raw = [("64 x 512", ours, 2977.3, 12.4), ("64 x 512", st, 6435.3, 43.8),
           ("32 x 1024, prompt 512", ours, 1500.0, 25.0), ("32 x 1024, prompt 512", st, 3000.0, 60.0)]
    call = dict(rows=32, new=1024, prompt=300)
    nbs = {"02": dict(backend="hf", calls=[{**call, "calls": 2}]), "03": dict(backend="hf", calls=[{**call, "calls": 10}])}
    dev = dict(date="2026-12-01", name="NVIDIA H200", kind="fake-card", memory_gib=139.8, torch="2.11.0")
    rep = gpucheck._write(tmp_path / "gpucheck-fake-card-2026-12-01", dev, 540, 100,
                          [dict(step="sampler", rc=0, seconds=200.0, rows=gpureport.rows(raw), notebooks=nbs)])
    assert rep["sampler_choice"]["path"] == "transformers"          # the steady state
    assert rep["sampler_auto"]["02"]["path"] == "ours" and rep["sampler_auto"]["03"]["path"] == "transformers"
    md = (tmp_path / "gpucheck-fake-card-2026-12-01.md").read_text()
    assert "| 02 | hf | ours | end to end, 2 x 32 x 1024, prompt 300: ours 47 s" in md
    assert "| 03 | hf | transformers | end to end, 10 x 32 x 1024, prompt 300: transformers' static cache" in md
    assert "| 32 x 1024, prompt 512 | transformers generate, static cache + torch.compile | 3,000 | 60.0 |" in md


def test_sampler_at_gives_rows_choose_reads(monkeypatch):
    """sampler_at's rows (here on a CPU with the tiny policy for Qwen3-1.7B's shape) name their prompt and carry
    both ways' first call and steady tokens/s, so `choose` reads them; no new shape starts past its budget."""
    from cancellation import policy, scale
    model, _ = policy.load_policy(ROOT / "data" / "policies" / "tiny-m", dtype="float32")
    monkeypatch.setattr(scale, "build", lambda *a, **k: model)
    raw = gpucheck.sampler_at([(8, 8, 64), (16, 8, 64)], device="cpu", budget_s=0.0)
    assert [(r[0], r[1]) for r in raw] == [("8 x 8, prompt 64", "ours (static cache, CUDA graph)"),
                                           ("8 x 8, prompt 64", sampling_path.STATIC)]
    assert all(r[2] > 0 and r[3] > 0 for r in raw)
    c = sampling_path.choose(dict(steps=[dict(step="sampler", rows=gpureport.rows(raw))]),
                             [dict(rows=8, new=8, prompt=40, calls=3)])
    assert c["path"] in ("ours", "transformers") and set(c["seconds"]) == {"ours", "transformers"}
