"""`make gpu-check`: everything a lent or rented GPU can tell us, in one call, under a time budget.

    python -m cancellation.gpucheck                    # default budget 540 s (fits one 10-minute device call)
    python -m cancellation.gpucheck --budget-s 1800 --notebooks 03 05
    python -m cancellation.gpucheck --list             # the steps, their estimates, the dry runs' backends and sizes

Steps, in the order of what they are worth when time is short (each in its own process, so one that
fails or runs out of memory does not take the rest with it; a step is skipped, and the report says
so, when its estimate no longer fits in what is left of the budget):

1. `pytest -m gpu`: the CUDA-vs-CPU agreement tests (token stats, GRPO steps, coupling kernel, the
   sampler's captured-vs-eager paths, Monte Carlo continuations).
2. `sampler` (`sampler_step`): our sampler's tokens/s at Qwen3-1.7B's shape in bfloat16 (`bench sampler`, 64 x
   512 and 256 x 256 new tokens) beside transformers' dynamic-cache `generate` and the weight-read limit measured
   on the card; then ours beside transformers' static cache + torch.compile at the notebooks' own sampling
   shapes (`plan.sampling_calls` of paper-quick's sections, `measure_dims`, `sampler_at`: first call and steady
   tokens/s each), the hf-backend notebooks' first, while SAMPLER_NOTEBOOKS_S lasts.
3. `vllm`: vLLM's tokens/s at the same shape, dtype, prompts and sizes (`sampler_vllm`: dummy weights, token
   ids in), in the sampler table beside the others; where `import vllm` fails, the table says why.
4. Dry runs (`run NN --dry-run`): paper-quick's sections and backends (vLLM where the section samples with
   it and it imports here; else hf, and the report says why) at Qwen3-1.7B's shape, random weights and
   coin-flip rewards, at stated sizes scaled to about a minute each (DRY_SIZES and the manifest's `dry`);
   07 and the notebooks that sample with vLLM first (`dry_order`): wall time and peak GPU memory beside
   the planner's prediction.
5. A decode-step profile (`profile_decode`): kernels by CUDA time, beside the captured graph's pace.
6. Unit costs (`cancellation.scale`): the planner's per-token and per-call seconds of every block on
   this card, at Qwen3-1.7B's shape -> `<out>/<kind>.units.json`, and data/scale/<kind>.json when that
   kind has none yet (the planner's file). On such a card it runs before the dry runs, which are then
   planned with it.
7. `trim_padding` at Qwen3-1.7B's shape (`scale.trim_probe`): an analysis forward and a full-scope
   SGD step over every column vs each chunk's real columns only, responses of spread lengths.

The report ends with the steady-state sampling summary of this run's numbers (`choose_sampler`: ours only
where it measured at least 1.0x transformers' static cache + torch.compile in the same run; vLLM where it
imports and was fastest at every shape; else transformers'; `default_cuda_sampler(kind)`: the same from the
newest other report of a kind), and what `hf_sampler: auto` resolves to per notebook on this kind
(`sampling_path.choose`: end to end at the notebook's shapes and call counts, first calls included).

Writes one JSON and one markdown report (`gpureport`), `<out>/gpucheck-<kind>-<date>.{json,md}` (default out:
data/scale/measured/). Without a CUDA device it prints one line and exits 2.

On a bare GPU machine (its own torch, no .venv, no network): `make gpu-check PY=python3`, or from the
checkout's root `PYTHONPATH=lib python3 -m cancellation.gpucheck`. It puts lib/ on every step's path, sets
the hub offline, and writes only the stand-in data files the dry runs read (`standin_data`): no pip, no
download, no stand-in model training.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import gpureport, manifest, profiles
from .sampling_path import OURS, STATIC, default_cuda_sampler, shape_label
from .shapes import device_kind

# Only the standard library and stdlib-only modules of ours above (`profiles` imports pyyaml on its first read): on
# a bare GPU machine (its own python, maybe without pandas, yaml, transformers, ...) gpu-check's first act is to
# say which modules are missing and which steps that skips (`missing_modules`, NEEDS), then run the rest. torch
# and every module a step needs are imported inside the functions that use them.

ROOT = Path(__file__).resolve().parents[2]
SHAPE = "data/shapes/qwen3-1.7b-base"   # Qwen3-1.7B-Base's config.json: the dry runs' architecture
# The dry runs: paper-quick's sections (its dtypes, memory knobs and backends) on the stand-in problems, at
# Qwen3-1.7B's shape with random weights, at these sizes plus each notebook's (the manifest's `dry`): 128 new
# tokens (paper-quick: 1,024) and 4 prompts, so each is planned at about a minute on an H200.
DRY_PROFILE = "paper-quick"
DRY_SIZES = dict(model_path=SHAPE, device="cuda", token_chunk=2048, max_new_tokens=128, n_prompts=4,
                 problems_path="data/standins/dapo-math-17k.parquet")


def dry_per_notebook() -> dict:
    """Per notebook (the manifest's `dry`): what its dry run adds to DRY_SIZES to fit."""
    return {f.key: dict(f.dry) for f in manifest.FIGURES if f.dry}


def profile_section(nb: str, profile: str = DRY_PROFILE) -> dict:
    """A notebook's section of notebooks/params/<profile>.yaml over the profile's `common` ({} when absent), read
    as the runner reads it (`profiles.load_profile`: YAML 1.2 rules)."""
    f = manifest.find(nb)
    checkout = profiles.Checkout.of(ROOT)
    if f is None or not (checkout.params / f"{profile}.yaml").exists():
        return {}
    try:
        cfg = profiles.load_profile(profile, checkout)
    except ImportError:   # a bare machine without pyyaml: no profile to read (the dry runs are skipped there)
        return {}
    return {**(cfg.get("common") or {}), **(cfg.get(f.notebook) or {})}


def dry_order() -> list[str]:
    """The dry runs' order: the manifest's `dry_first` (07: paper-quick's least certain time), then the notebooks
    whose paper-quick section samples with vLLM, then the rest; manifest order within each."""
    first = [f.key for f in manifest.FIGURES if f.dry_first]
    vllm = [f.key for f in manifest.FIGURES if f.key not in first and profile_section(f.key).get("backend") == "vllm"]
    return first + vllm + [f.key for f in manifest.FIGURES if f.key not in first + vllm]


def dry_backend(nb: str, vllm: dict | None) -> tuple[str, str | None]:
    """(backend, why it is not the profile's) of a notebook's dry run. `vllm`: packages()'s record of vllm here.
    The profile's backend, except vllm -> hf when vllm does not import here, or when TRL builds the engine
    (engine trl: TRL's colocated vLLM loads weights and tokenizer from model_path, and the dry run's
    directory holds only config.json)."""
    sec = profile_section(nb)
    want = sec.get("backend", "hf")
    if want != "vllm":
        return want, None
    if not (vllm or {}).get("importable"):
        return "hf", f"falls back to hf: {vllm_unavailable(vllm)}"
    if sec.get("engine") == "trl":
        return "hf", (f"falls back to hf: TRL's colocated vLLM loads weights and tokenizer from model_path, and "
                      f"the dry run's {SHAPE} holds only config.json")
    return "vllm", None


def vllm_unavailable(rec: dict | None) -> str:
    """'vllm: not importable (<reason>)' from packages()'s record of vllm."""
    rec = rec or {}
    why = rec.get("error") or ("not installed" if not rec.get("version") else "import failed")
    return f"vllm: not importable ({why})"


# Estimated seconds per step on an H100/H200 (from the 2026-11-25/26 sessions; vllm and dry: guesses, vLLM's
# engine start and paper-quick's dry runs were never timed), used only to skip what will not fit.
EST = {"standins": 30, "pytest": 100, "sampler": 200, "vllm": 120, "profile": 45, "units": 120, "trim": 100,
       "dry": 90}
CAP = 2.5   # a step may take at most CAP x its estimate (+ 30 s): one slow step cannot eat the whole window

# The modules (import names) each step's process imports, checked before anything runs (`missing_modules`): a
# bare GPU machine's python may lack some, and a missing one then skips only the steps that need it.
# tests/test_gpucheck.py runs the pytest step's collection and the json steps' imports in an interpreter holding
# exactly these (and torch), so a module added to a step's imports without being added here fails there.
_LIB = ("numpy", "pandas", "pyarrow", "tqdm")   # what cancellation's measuring modules import at their top
NEEDS = {
    "standins": _LIB + ("scipy", "transformers"),   # a json step: bench and scale imported
    "pytest": _LIB + ("pytest", "scipy", "yaml", "transformers"),
    "sampler": _LIB + ("scipy", "transformers"),
    "vllm": _LIB + ("scipy", "transformers"),   # vllm itself: the package probe's record (vllm_unavailable)
    "profile": _LIB + ("scipy", "transformers"),
    "units": _LIB + ("scipy", "transformers"),
    "trim": _LIB + ("scipy", "transformers"),
    "dry": _LIB + ("scipy", "yaml", "transformers", "papermill", "jupytext", "nbformat", "ipykernel", "matplotlib",
                   "seaborn", "nltk", "math_verify"),
}
PIP_NAMES = {"yaml": "pyyaml", "math_verify": "math-verify[antlr4_13_2]"}   # where the package's name differs
NEEDS_DRY = {"07": ("trl", "accelerate", "datasets")}   # a notebook's dry run needs these besides NEEDS["dry"]


def step_needs(name: str) -> tuple[str, ...]:
    """The modules step `name` (pytest, sampler, ..., dry-NN) imports, torch besides."""
    base, _, nb = name.partition("-")
    return NEEDS.get(base, ()) + (NEEDS_DRY.get(nb, ()) if base == "dry" else ())


def missing_modules(names) -> list[str]:
    """Those of `names` that this interpreter cannot find (importlib's finder only: nothing is imported)."""
    import importlib.util
    out = []
    for n in dict.fromkeys(names):
        try:
            found = importlib.util.find_spec(n) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(n)
    return out


def missing_by_step(steps) -> dict[str, list[str]]:
    """{step: its missing modules} for the steps (names) that miss any."""
    gone = set(missing_modules({m for s in steps for m in step_needs(s)}))
    return {s: [m for m in step_needs(s) if m in gone] for s in steps if any(m in gone for m in step_needs(s))}


def missing_line(miss: dict[str, list[str]], steps) -> str:
    """One line: which modules are missing, which steps that skips and which still run."""
    mods = sorted({m for v in miss.values() for m in v})
    runs = [s for s in steps if s not in miss]
    return (f"gpu-check: this python ({sys.executable}) lacks {', '.join(mods)}: skips {', '.join(miss)}; runs "
            f"{', '.join(runs) or 'nothing'}. For every step, install them (`pip install "
            f"{' '.join(PIP_NAMES.get(m, m) for m in mods)}` where "
            f"there is an index) or pass PY= a python that has them.")


def est_dry(nb: str) -> int:
    """A dry run's estimated seconds: measured at its sizes, 10 s added (the manifest's `dry_seconds`), else
    EST["dry"]; a step is skipped when its estimate does not fit."""
    f = manifest.find(nb)
    return f.dry_seconds if f is not None and f.dry_seconds else EST["dry"]


# bench_sampling.sampler's part of the sampler step: transformers' dynamic-cache generate only at 256 x 256 (at 64 x 512 it
# takes 76 s of an H100's time); static cache + compile not at its 64 x 512 (it was timed there on the H200,
# 2026-11-26): `sampler_at` times it, and ours, at the notebooks' own shapes instead
SAMPLER_KW = dict(dynamic="256x256", compile=False)
SAMPLER_DIMS = ((64, 512), (256, 256))   # bench_sampling.sampler's shapes on a GPU: rows x new tokens after 64-token prompts
# The sampler step's seconds for the notebooks' shapes (`sampler_at`): it starts no new shape past them
# (the first is always timed); one shape of 32 x 1,024 is about 100 s on an H200 (both ways, compile included)
SAMPLER_NOTEBOOKS_S = 120
MEASURE_PROMPT = 512   # notebook shapes are timed after prompts of at least this many tokens (`measure_dims`)


def notebook_shapes(profile: str = DRY_PROFILE) -> dict:
    """{notebook key: {"backend", "calls": its HF sampler calls (`plan.sampling_calls`, as `hf_sampler: auto`
    counts them) at `profile`'s section, on CUDA}}, for every notebook whose section the profile holds ({} when it
    cannot be read: no pyyaml here)."""
    import dataclasses

    from . import plan   # torch and the library: not at this module's top (see the note on its imports)

    out = {}
    for f in manifest.FIGURES:
        sec = profile_section(f.key, profile)
        if not sec:
            continue
        mod = f.load()
        names = {x.name for x in dataclasses.fields(mod.Params)}
        P = mod.Params(**{k: v for k, v in {**sec, "device": "cuda"}.items() if k in names})
        out[f.key] = dict(backend=sec.get("backend", "hf"), calls=plan.sampling_calls(P))
    return out


def measure_dims(shapes: dict) -> list[tuple[int, int, int]]:
    """The (rows, new tokens, prompt tokens) to time for `notebook_shapes`: each distinct rows x new once, after
    the longest prompt any notebook samples it with, rounded up to decode_hf.HF_LEN_BUCKET and at least
    MEASURE_PROMPT (the planner's prompt is a default where the problems or tokenizer are not here; a longer
    measured prompt serves every shorter one: `sampling_path.shape_cost`). The shapes of notebooks whose
    section samples with the hf backend first (where the choice is made), then the rest; most calls first."""
    dims: dict = {}
    for nb in sorted(shapes, key=lambda k: shapes[k]["backend"] != "hf"):
        for c in shapes[nb]["calls"]:
            key = (c["rows"], c["new"])
            prompt = max(-(-c["prompt"] // 64) * 64, MEASURE_PROMPT)
            hf, n, p = dims.get(key, (False, 0, 0))
            dims[key] = (hf or shapes[nb]["backend"] == "hf", n + c["calls"], max(p, prompt))
    order = sorted(dims, key=lambda k: (not dims[k][0], -dims[k][1]))
    return [(r, new, dims[(r, new)][2]) for r, new in order]


def sampler_at(dims, device: str = "cuda", budget_s: float = SAMPLER_NOTEBOOKS_S) -> list:
    """Ours and transformers' static cache + torch.compile (`sampler.generate(path="transformers")`: the
    notebooks' own call, `decode_hf.generate_transformers`) at each (rows, new tokens, prompt tokens) of `dims`: Qwen3-1.7B's shape, bfloat16, random weights and
    prompts, no stop ids (every row to the cap). Each way's first call (capture or compile, and the call) and
    its second (steady tokens/s). Starts no new shape after `budget_s` (the first always runs). Returns
    bench_sampling.sampler's rows: [(shape 'rows x new, prompt P', way, tokens/s, first call s)]."""
    import torch

    from . import scale, sampler
    from .compute import Compute
    t0, out = time.time(), []
    model = scale.build("qwen3-1.7b", dtype=torch.bfloat16, device=device).eval()
    V, chunk = model.config.vocab_size, Compute().token_chunk
    last = None   # (seconds, tokens) of the shape timed last: the next one's time, scaled by its tokens
    for i, (rows, new, prompt) in enumerate(dims):
        guess = 0.0 if last is None else last[0] * rows * new / last[1]
        if i and time.time() - t0 + guess > budget_s:
            print(f"  sampler at the notebooks' shapes: {len(dims) - i} shape(s) not timed (past {budget_s:.0f} s "
                  f"with the next): " + ", ".join(shape_label(*d) for d in dims[i:]), flush=True)
            break
        t1 = time.time()
        g = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, V, (rows, prompt), generator=g, device=device)
        mask = torch.ones_like(ids)
        ways = {OURS + ", CUDA graph)": lambda: sampler.generate(model, ids, mask, new, 1.0, [-1], 0, generator=g,
                                                                 static=True, token_chunk=chunk),
                STATIC: lambda: sampler.generate(model, ids, mask, new, 1.0, [-1], 0, generator=g, path="transformers",
                                                 token_chunk=chunk)}
        for way, fn in ways.items():
            first = scale.timed(fn, device)[0]
            steady = scale.timed(fn, device)[0]
            out.append((shape_label(rows, new, prompt), way, rows * new / steady, first))
            print(f"  {shape_label(rows, new, prompt)}  {way}: {rows * new / steady:,.0f} tokens/s (first call "
                  f"{first:.1f} s)", flush=True)
        last = (time.time() - t1, rows * new)
    return out


def sampler_step() -> dict:
    """The sampler step: bench_sampling.sampler's table (SAMPLER_KW) and ours beside transformers' static cache + compile
    at the notebooks' own shapes (`notebook_shapes` of DRY_PROFILE, `measure_dims`, `sampler_at`). Returns
    {"rows": bench_sampling.sampler's rows and sampler_at's, "notebooks": notebook_shapes()} ("notebooks_error": why
    there are none)."""
    from . import bench_sampling
    rows = [tuple(r) for r in bench_sampling.sampler(**SAMPLER_KW)]
    try:
        shapes, err = notebook_shapes(), None
    except Exception as e:   # noqa: BLE001 - the table above still counts
        shapes, err = {}, f"{type(e).__name__}: {e}"
    if not shapes:
        err = err or f"notebooks/params/{DRY_PROFILE}.yaml not readable here (pyyaml?)"
        print(f"  sampler at the notebooks' shapes: none ({err})", flush=True)
    rows += sampler_at(measure_dims(shapes)) if shapes else []
    return dict(rows=rows, notebooks=shapes, **({"notebooks_error": err} if err else {}))


def _sampling_params(SamplingParams, **kw):
    """vllm.SamplingParams(**kw), leaving out the optional knobs (ignore_eos, detokenize) a version lacks."""
    try:
        return SamplingParams(**kw)
    except TypeError:
        return SamplingParams(**{k: v for k, v in kw.items() if k not in ("ignore_eos", "detokenize")})


# vLLM's share of the card in the sampler benchmark: its engine is alone there (no HF model beside it, unlike
# the notebooks' rollout.GPU_MEMORY_UTILIZATION), so it takes half for its KV cache at 256 x 256
BENCH_VLLM_SHARE = 0.5


def sampler_vllm(model: str = SHAPE, dims=SAMPLER_DIMS, dtype: str = "bfloat16", prompt: int = 64,
                 device: str = "cuda", share: float = BENCH_VLLM_SHARE) -> dict:
    """vLLM's tokens/s beside `bench_sampling.sampler`'s: the same random prompts (64 tokens, drawn as bench_sampling.sampler draws
    them), rows x new tokens, dtype and sampling law (temperature 1, no top-p / top-k, no stop ids, every row to
    the cap). The engine holds dummy (random) weights of `model`'s config.json and no tokenizer (token ids in).
    Returns {"rows": [(shape, way, tokens/s, first call s)], "engine_start_s"} as bench_sampling.sampler's rows (tokens/s
    over the tokens returned, the second call), or {"error": "<why vllm does not import>"}."""
    import torch

    from . import vllm_seam
    try:
        LLM, SamplingParams, TokensPrompt = vllm_seam.import_vllm()
    except ImportError as e:
        return dict(error=f"{type(e.__cause__ or e).__name__}: {e.__cause__ or e}")
    path = ROOT / model if (ROOT / model).exists() else Path(model)
    V = json.loads((path / "config.json").read_text())["vocab_size"]
    t = time.perf_counter()
    llm = LLM(str(path), dtype=dtype, seed=0, load_format="dummy", skip_tokenizer_init=True,
              enable_prefix_caching=False, gpu_memory_utilization=share)
    start = time.perf_counter() - t
    way = f"vLLM {getattr(sys.modules.get('vllm'), '__version__', '?')}"
    rows = []
    for n_rows, new in dims:
        g = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, V, (n_rows, prompt), generator=g, device=device).tolist()
        params = [_sampling_params(SamplingParams, n=1, temperature=1.0, top_p=1.0, max_tokens=new, seed=i,
                                   ignore_eos=True, detokenize=False) for i in range(n_rows)]

        def call():
            s = time.perf_counter()
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params, use_tqdm=False)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            return time.perf_counter() - s, sum(len(c.token_ids) for o in outs for c in o.outputs)
        first, _ = call()
        secs, tokens = call()
        rows.append((f"{n_rows} x {new}", way, tokens / secs, first))
        print(f"  {n_rows} x {new}  {way}: {tokens / secs:,.0f} tokens/s ({tokens} tokens; first call {first:.1f} s)",
              flush=True)
    return dict(rows=rows, engine_start_s=round(start, 1))


def profile_decode(rows: int = 64, prompt: int = 64, new: int = 32, top: int = 15, shape: str = "qwen3-1.7b",
                   device: str = "cuda") -> dict:
    """Where a decode step's time goes at Qwen3-1.7B's shape in bfloat16 on this card: the static-cache
    step run eagerly with the captured step's shapes (`graph_shapes`: same kernels, visible to the
    profiler, which sees a replayed graph as one launch), kernels ranked by their CUDA time, beside
    the replayed graph's wall time per step. For the sampler's suspects (repeat_kv under the
    additive mask, attention over the whole 256-rounded cache, the float64 softmax and cumulative
    sum over the vocabulary)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from . import decode_static, scale
    from .compute import Compute

    model = scale.build(shape, dtype=torch.bfloat16, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows, prompt), generator=g, device=device)
    mask = torch.ones_like(ids)

    def run(capture):
        return decode_static.generate_static(model, ids, mask, new, 1.0, [-1], 0, generator=g, capture=capture,
                                             draw="icdf", graph_shapes=True, token_chunk=Compute().token_chunk)
    cuda = device.startswith("cuda")
    if cuda:
        run(True)                        # capture once
    t = scale.best_time(lambda: run(cuda), device, reps=3)
    run(False)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        run(False)
        torch.cuda.synchronize() if cuda else None
    ev = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    ev.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in ev) or float("nan")
    kernels = [dict(name=e.key[:90], calls=e.count, ms=e.self_device_time_total / 1e3 / new,
                    share=e.self_device_time_total / total) for e in ev[:top]]
    out = dict(rows=rows, prompt=prompt, new=new, captured_ms_per_step=1e3 * t / new,
               eager_cuda_ms_per_step=total / 1e3 / new, tokens_per_s_captured=rows * new / t, kernels=kernels)
    print(json.dumps(out, indent=1))
    return out


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _step(name: str, cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run one step in its own process; its record (rc, seconds, output tail). rc 124: timed out."""
    print(f"[gpu-check] {name}: {' '.join(cmd)} (at most {timeout:.0f} s)", flush=True)
    t = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
              ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
    secs = time.time() - t
    print(_tail(out, 1500), flush=True)
    print(f"[gpu-check] {name}: rc {rc}, {secs:.0f} s", flush=True)
    return dict(step=name, cmd=cmd, rc=rc, seconds=round(secs, 1), output_tail=_tail(out))


def _json_step(name: str, expr: str, js: Path, timeout: float, env: dict | None = None) -> dict:
    """A step that evaluates `expr` (in a process of its own, with bench, gpucheck and scale imported) and
    returns what it evaluated to under "json" (absent when the process wrote nothing)."""
    code = (f"import json; from cancellation import bench, gpucheck, scale; "
            f"json.dump({expr}, open({str(js)!r}, 'w'))")
    r = _step(name, [sys.executable, "-c", code], timeout, env)
    if js.exists():
        r["json"] = json.loads(js.read_text())
        js.unlink()
    return r


# what the report says the machine has, first: installed (a distribution found) and importable (the import ran)
PACKAGES = ("vllm", "flash_attn", "triton", "transformers", "trl", "accelerate", "deepspeed", "math_verify")


def packages(names=PACKAGES) -> dict:
    """Per package: its installed version (None when absent) and whether importing it works here, each
    import in a subprocess of its own (a broken CUDA extension cannot take this process down), 60 s each."""
    from importlib import metadata
    out = {}
    for name in names:
        try:
            version = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            try:
                version = metadata.version(name)
            except metadata.PackageNotFoundError:
                version = None
        err = None
        if version is not None:
            try:
                p = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60)
                err = None if p.returncode == 0 else (_tail(p.stderr, 300).strip().splitlines() or ["failed"])[-1]
            except subprocess.TimeoutExpired:
                err = "import took over 60 s"
        out[name] = dict(version=version, importable=version is not None and err is None, error=err)
    return out


def _driver() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
        return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _device() -> dict:
    import torch
    p = torch.cuda.get_device_properties(0)
    return dict(kind=device_kind("cuda"), name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                multiprocessors=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                driver=_driver(), date=time.strftime("%Y-%m-%d"), python=sys.version.split()[0],
                packages=packages())


def _dry_overrides(nb: str, backend: str | None = None) -> list[str]:
    """The dry run's -p pairs: DRY_SIZES, the manifest's `dry` of the notebook, and `backend` when given (a
    fallback from the profile's); lists as JSON (YAML flow)."""
    kv = {**DRY_SIZES, **dry_per_notebook().get(nb, {}), **({"backend": backend} if backend else {})}
    return [x for k, v in kv.items() for x in ("-p", k, v if isinstance(v, str) else json.dumps(v))]


def plan_steps(notebooks: list[str], units_first: bool = False) -> list[tuple[str, int]]:
    """The steps in order: what the machine can sample with, then the dry runs, then the profile, the unit
    costs and the trim probe. `units_first`: the unit costs before the dry runs (a card with no planner file)."""
    head = [("standins", EST["standins"]), ("pytest", EST["pytest"]), ("sampler", EST["sampler"]),
            ("vllm", EST["vllm"])]
    units = [("units", EST["units"])]
    return head + (units if units_first else []) + [(f"dry-{nb}", est_dry(nb)) for nb in notebooks] + \
        [("profile", EST["profile"])] + ([] if units_first else units) + [("trim", EST["trim"])]


def gpu_test_files() -> list[str]:
    """The test files that hold `gpu` tests: the pytest step collects only these, so a bare machine needs only
    their imports (NEEDS["pytest"]), not the whole suite's (matplotlib, papermill, trl, ...)."""
    return [str(f.relative_to(ROOT)) for f in sorted((ROOT / "tests").glob("test_*.py"))
            if "pytest.mark.gpu" in f.read_text()]


def step_cap(est: float, left: float) -> float:
    """A step's seconds: at most CAP x its estimate + 30 s, and never more than what is left (at least 30 s)."""
    return max(min(left, CAP * est + 30), 30)


def run_check(budget: float, out: Path, notebooks: list[str], skip: set[str], t0: float | None = None) -> dict:
    """Every step that fits in `budget` seconds counted from `t0` (default now; main passes its own start, so the
    package probe and the module check count)."""
    py = sys.executable
    t0 = time.time() if t0 is None else t0
    dev = _device()
    out.mkdir(parents=True, exist_ok=True)
    kind = dev["kind"]
    stem = out / f"gpucheck-{kind}-{dev['date']}"
    steps = []

    def left():
        return budget - (time.time() - t0)

    data = None
    vllm_rec = dev["packages"].get("vllm")
    units_first = not (ROOT / "data" / "scale" / f"{kind}.json").exists()
    planned = plan_steps(notebooks, units_first)
    miss = missing_by_step([n for n, _ in planned])
    print(f"[gpu-check] window {budget:.0f} s ({time.time() - t0:.0f} s spent on the probe); plan: "
          + ", ".join(f"{n} ~{e} s" + (" (skipped: missing modules)" if n in miss else "") for n, e in planned),
          flush=True)
    for name, est in planned:
        base = name.split("-")[0]
        if name in miss:
            steps.append(dict(step=name, skipped=f"missing modules: {', '.join(miss[name])}"))
            continue
        if base == "dry" and data is None and name not in skip and "dry" not in skip:
            data = standin_data()   # the dry runs' problem files, when this clone has none (no model is built)
            print(f"[gpu-check] stand-in data: {'written' if data['written'] else 'present'} ({data['seconds']} s)",
                  flush=True)
        if name in skip or base in skip:
            steps.append(dict(step=name, skipped="--skip"))
            continue
        if name == "vllm" and not (vllm_rec or {}).get("importable"):
            steps.append(dict(step=name, skipped=vllm_unavailable(vllm_rec)))
            print(f"[gpu-check] vllm: skipped ({steps[-1]['skipped']})", flush=True)
            continue
        if left() < est:
            steps.append(dict(step=name, skipped=f"budget: {left():.0f} s left, estimated {est} s"))
            print(f"[gpu-check] {name}: skipped ({steps[-1]['skipped']})", flush=True)
            continue
        limit = step_cap(est, left())
        if name == "standins":   # the stand-in model two GPU tests load (no paper-vocab model: the slow part)
            r = _json_step(name, "gpucheck.standin_model()", out / f".{kind}.standins.json", limit)
        elif name == "pytest":
            r = _step(name, [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *gpu_test_files()],
                      limit)
        elif name == "sampler":
            r = _json_step(name, "gpucheck.sampler_step()", out / f".{kind}.sampler.json", limit)
            got = r.pop("json", None)
            if isinstance(got, dict):   # bench_sampling.sampler's rows and the notebooks' shapes (sampler_step)
                r["rows"] = gpureport.rows(got.get("rows") or [])
                r.update({k: got[k] for k in ("notebooks", "notebooks_error") if k in got})
            elif got is not None:
                r["rows"] = gpureport.rows(got)
        elif name == "vllm":
            r = _json_step(name, "gpucheck.sampler_vllm()", out / f".{kind}.vllm.json", limit)
            got = r.pop("json", None) or {}
            if got.get("rows"):
                r["rows"], r["engine_start_s"] = gpureport.rows(got["rows"]), got.get("engine_start_s")
            if got.get("error"):
                r["error"] = f"vllm: not importable ({got['error']})"
        elif name == "profile":
            r = _json_step(name, "gpucheck.profile_decode()", out / f".{kind}.profile.json", limit)
            if "json" in r:
                r["profile"] = r.pop("json")
        elif name == "units":
            units = out / f"{kind}.units.json"
            r = _step(name, [py, "-m", "cancellation.scale", "--device", "cuda", "--out", str(units)], limit)
            if units.exists():
                r["units"] = json.loads(units.read_text())["units"]
                r["file"] = str(units.relative_to(ROOT)) if units.is_relative_to(ROOT) else str(units)
                planner = ROOT / "data" / "scale" / f"{kind}.json"
                if not planner.exists():   # a kind never measured: the dry runs after this are planned with it
                    planner.write_text(units.read_text())
                    r["planner_file"] = str(planner.relative_to(ROOT))
        elif name == "trim":
            r = _json_step(name, "scale.trim_probe()", out / f".{kind}.trim.json", limit)
            if "json" in r:
                r["trim"] = r.pop("json")
        else:
            nb = name.split("-")[1]
            backend, why = dry_backend(nb, vllm_rec)
            rec = ROOT / "dry-run" / DRY_PROFILE / "measured.json"
            r = _step(name, [py, "-m", "cancellation.run", nb, "--profile", DRY_PROFILE, "--dry-run",
                             "--no-plan-check", *_dry_overrides(nb, backend if why else None)], limit)
            r.update(profile=DRY_PROFILE, backend=backend, **({"fallback": why} if why else {}))
            if rec.exists():
                rows = json.loads(rec.read_text())
                hit = [v for k, v in rows.items() if k.startswith(nb + "_")]
                if hit and r["rc"] == 0:
                    r["measured"] = hit[0]
        steps.append(r)
        _write(stem, dev, budget, time.time() - t0, steps)   # a report after every step: a cut-off call keeps it
    report = _write(stem, dev, budget, time.time() - t0, steps)
    print(f"[gpu-check] report: {stem}.json, {stem}.md ({time.time() - t0:.0f} s of {budget:.0f} s)", flush=True)
    return report


def _write(stem: Path, dev: dict, budget: float, spent: float, steps: list[dict]) -> dict:
    """The report so far (`gpureport.write`: <stem>.json and <stem>.md)."""
    return gpureport.write(stem, dict(device=dev, budget_s=budget, spent_s=round(spent, 1), dry_profile=DRY_PROFILE,
                                      dry_sizes=DRY_SIZES, dry_per_notebook=dry_per_notebook(), steps=steps))


def main(argv=None):
    t0 = time.time()   # the window starts here: the module check and the package probe count
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=540, help="seconds for all steps (default 540)")
    ap.add_argument("--out", default=str(ROOT / "data" / "scale" / "measured"))
    ap.add_argument("--notebooks", nargs="+", default=dry_order(), help="dry runs, in this order")
    ap.add_argument("--skip", nargs="*", default=[], help="steps to leave out: pytest sampler units dry dry-NN")
    ap.add_argument("--list", action="store_true", help="print the steps and their estimates, run nothing")
    a = ap.parse_args(argv)
    names = [n for n, _ in plan_steps(a.notebooks)]
    if missing_modules(["torch"]):
        print(f"gpu-check: this python ({sys.executable}) has no torch: nothing can run. Pass PY= a python with "
              "torch (the GPU image's own).", file=sys.stderr)
        return 2
    miss = missing_by_step(names)
    if miss:   # the first act: one line, then whatever can run does
        print(missing_line(miss, names), file=sys.stderr, flush=True)
    if a.list:
        vllm_rec = packages(("vllm",))["vllm"]
        for name, est in plan_steps(a.notebooks):
            what = ""
            if name == "vllm" and not vllm_rec["importable"]:
                what = f"  (skipped here: {vllm_unavailable(vllm_rec)})"
            elif name.startswith("dry-"):
                backend, why = dry_backend(name[4:], vllm_rec)
                o = _dry_overrides(name[4:])[3 * len(DRY_SIZES):]
                what = f"  {DRY_PROFILE}, backend {backend}" + (f" ({why})" if why else "") + \
                    "".join(f" {k}={v}" for k, v in zip(o[1::3], o[2::3]))
            print(f"{name:<8} ~{est} s{what}")
        print("(dry runs: every one with " + " ".join(f"{k}={v}" for k, v in DRY_SIZES.items()) + "; a card with "
              "no data/scale/<kind>.json runs units before them)")
        where = ROOT / "data" / "scale" / "measured"
        for kind in sorted({m.group(1) for f in where.glob("gpucheck-*.json")
                            if (m := re.fullmatch(r"gpucheck-(.+)-\d{4}-\d{2}-\d{2}\.json", f.name))}):
            c = default_cuda_sampler(kind, where)
            if c["report"]:
                print(f"(default CUDA sampling path on {kind}: {c['path']}, {c['why']}; from {c['report']})")
        return 0
    bare_machine_env()
    import torch
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}); nothing measured. "
              "Run it on a machine with an NVIDIA GPU.", file=sys.stderr)
        return 2
    run_check(a.budget_s, Path(a.out).resolve(), a.notebooks, set(a.skip), t0=t0)
    return 0


def bare_machine_env() -> None:
    """What gpu-check needs on a bare GPU machine (its own torch, no .venv, no network), set for this process
    and every step it starts: lib/ on the path (PYTHONPATH: the package need not be installed) and the hub
    offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE: a missing file fails at once, never after retries)."""
    lib = str(ROOT / "lib")
    parts = [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
    os.environ["PYTHONPATH"] = os.pathsep.join([lib] + [x for x in parts if x != lib])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def standin_model(out: Path = ROOT / "data" / "standins") -> dict:
    """data/standins/model, which two GPU tests load (`standins.ensure_model`). Returns {"seconds", "built"}."""
    from . import standins
    t, had = time.time(), (out / "model" / "config.json").exists()
    standins.ensure_model(out)
    return dict(seconds=round(time.time() - t, 2), built=not had)


def standin_data(out: Path = ROOT / "data" / "standins") -> dict:
    """The stand-in problem files the dry runs read (paper-vocab's problems_path and eval_sets), written when
    missing: the data files only (well under a second), not the stand-in models, which the dry runs replace
    with random weights at Qwen3-1.7B's shape. Returns {"seconds", "written"}."""
    from . import standins
    t = time.time()
    want = [out / "dapo-math-17k.parquet", out / "math500.jsonl"]
    if all(p.exists() for p in want):
        return dict(seconds=0.0, written=False)
    out.mkdir(parents=True, exist_ok=True)
    standins.write_data(out, seed=0)
    return dict(seconds=round(time.time() - t, 2), written=True)


if __name__ == "__main__":
    sys.exit(main())
