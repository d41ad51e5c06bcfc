"""`make gpu-check`: everything a lent or rented GPU can tell us, in one call, under a time budget.

    python -m cancellation.gpucheck                    # default budget 540 s (fits one 10-minute device call)
    python -m cancellation.gpucheck --budget-s 1800 --notebooks 03 05
    python -m cancellation.gpucheck --list             # the steps, their estimated seconds, and what each records

Steps, in the order of what they are worth when time is short (each in its own process, so one that
fails or runs out of memory does not take the rest with it; a step is skipped, and the report says
so, when its estimate no longer fits in what is left of the budget):

1. `pytest -m gpu`: the CUDA-vs-CPU agreement tests (token stats, GRPO steps, coupling kernel, the
   sampler's captured-vs-eager paths, Monte Carlo continuations).
2. `bench sampler`: our sampler's tokens/s at Qwen3-1.7B's shape in bfloat16 (64 x 512 and 256 x 256
   new tokens) beside transformers' `generate` (dynamic cache; static cache + torch.compile at the
   first shape) and the weight-read limit measured on the card.
3. A decode-step profile (`profile_decode`): kernels by CUDA time, beside the captured graph's pace.
4. Unit costs (`cancellation.scale`): the planner's per-token and per-call seconds of every block on
   this card, at Qwen3-1.7B's shape -> `<out>/<kind>.units.json`, and data/scale/<kind>.json when that
   kind has none yet (the planner's file: the dry runs after it are planned with it).
5. `trim_padding` at Qwen3-1.7B's shape (`scale.trim_probe`): an analysis forward and a full-scope
   SGD step over every column vs each chunk's real columns only, responses of spread lengths.
6. Dry runs (`run NN --dry-run`) at Qwen3-1.7B's shape, random weights and coin-flip rewards, at small
   stated sizes (DRY_SIZES), notebooks in the order given by --notebooks (default: the ones never
   measured on a GPU first): wall time and peak GPU memory beside the planner's prediction.

Writes one JSON and one markdown report, `<out>/gpucheck-<kind>-<date>.{json,md}` (default out:
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
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import manifest, sampler, scale, standins
from .compute import Compute
from .plan import device_kind

ROOT = Path(__file__).resolve().parents[2]
SHAPE = "data/shapes/qwen3-1.7b-base"   # Qwen3-1.7B-Base's config.json: the dry runs' architecture
# The dry runs' sizes: paper-vocab's sections (stand-in data, the real 151,936-entry vocabulary) at a stated
# fraction of the paper's sizes, the same as the first H100 record (data/scale/measured/), so the two compare.
DRY_SIZES = dict(model_path=SHAPE, device="cuda", token_chunk=2048, max_new_tokens=16, n_prompts=4)


def dry_per_notebook() -> dict:
    """Per notebook (the manifest's `dry`): what its dry run adds to DRY_SIZES to fit."""
    return {f.key: dict(f.dry) for f in manifest.FIGURES if f.dry}


def dry_order() -> list[str]:
    """The notebooks whose dry run was measured on an H200 first (their estimates are known), then the rest."""
    return [f.key for f in manifest.FIGURES if f.dry_seconds] + [f.key for f in manifest.FIGURES if not f.dry_seconds]


# Estimated seconds per step on an H100/H200 (from the 2026-11-25 session), used only to skip what will not fit.
EST = {"pytest": 100, "sampler": 150, "profile": 45, "units": 120, "trim": 100, "dry": 75}


def est_dry(nb: str) -> int:
    """A dry run's estimated seconds: measured on an H200 (2026-11-26), 10 s added (the manifest's
    `dry_seconds`), else EST["dry"]; a step is skipped when its estimate does not fit."""
    f = manifest.find(nb)
    return f.dry_seconds if f is not None and f.dry_seconds else EST["dry"]


# transformers' dynamic-cache generate only at 256 x 256 (at 64 x 512 it takes 76 s of an H100's time)
SAMPLER_KW = "dynamic='256x256'"


def profile_decode(rows: int = 64, prompt: int = 64, new: int = 32, top: int = 15, shape: str = "qwen3-1.7b",
                   device: str = "cuda") -> dict:
    """Where a decode step's time goes at Qwen3-1.7B's shape in bfloat16 on this card: the static-cache
    step run eagerly with the captured step's shapes (`graph_shapes`: same kernels, visible to the
    profiler, which sees a replayed graph as one launch), kernels ranked by their CUDA time, beside
    the replayed graph's wall time per step. For the sampler's suspects (repeat_kv under the
    additive mask, attention over the whole 256-rounded cache, the float64 softmax and cumulative
    sum over the vocabulary)."""
    from torch.profiler import ProfilerActivity, profile

    model = scale.build(shape, dtype=torch.bfloat16, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows, prompt), generator=g, device=device)
    mask = torch.ones_like(ids)

    def run(capture):
        return sampler.generate_static(model, ids, mask, new, 1.0, [-1], 0, generator=g, capture=capture,
                                       draw="icdf", graph_shapes=True, token_chunk=Compute().token_chunk)
    cuda = device.startswith("cuda")
    if cuda:
        run(True)                        # capture once
    t = scale._best(lambda: run(cuda), device, reps=3)
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


def _json_step(name: str, expr: str, js: Path, timeout: float) -> dict:
    """A step that evaluates `expr` (in a process of its own, with bench, gpucheck and scale imported) and
    returns what it evaluated to under "json" (absent when the process wrote nothing)."""
    code = (f"import json; from cancellation import bench, gpucheck, scale; "
            f"json.dump({expr}, open({str(js)!r}, 'w'))")
    r = _step(name, [sys.executable, "-c", code], timeout)
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
    p = torch.cuda.get_device_properties(0)
    return dict(kind=device_kind("cuda"), name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                multiprocessors=p.multi_processor_count, torch=torch.__version__, cuda=torch.version.cuda,
                driver=_driver(), date=time.strftime("%Y-%m-%d"), python=sys.version.split()[0],
                packages=packages())


def _dry_overrides(nb: str) -> list[str]:
    kv = {**DRY_SIZES, **dry_per_notebook().get(nb, {})}
    return [x for k, v in kv.items() for x in ("-p", k, str(v))]


def plan_steps(notebooks: list[str]) -> list[tuple[str, int]]:
    return [("pytest", EST["pytest"]), ("sampler", EST["sampler"]), ("profile", EST["profile"]),
            ("units", EST["units"]), ("trim", EST["trim"])] + \
        [(f"dry-{nb}", est_dry(nb)) for nb in notebooks]


def run_check(budget: float, out: Path, notebooks: list[str], skip: set[str]) -> dict:
    py = sys.executable
    dev = _device()
    out.mkdir(parents=True, exist_ok=True)
    kind = dev["kind"]
    stem = out / f"gpucheck-{kind}-{dev['date']}"
    t0 = time.time()
    steps = []

    def left():
        return budget - (time.time() - t0)

    data = None
    for name, est in plan_steps(notebooks):
        base = name.split("-")[0]
        if base == "dry" and data is None and name not in skip and "dry" not in skip:
            data = standin_data()   # the dry runs' problem files, when this clone has none (no model is built)
            print(f"[gpu-check] stand-in data: {'written' if data['written'] else 'present'} ({data['seconds']} s)",
                  flush=True)
        if name in skip or base in skip:
            steps.append(dict(step=name, skipped="--skip"))
            continue
        if left() < est:
            steps.append(dict(step=name, skipped=f"budget: {left():.0f} s left, estimated {est} s"))
            print(f"[gpu-check] {name}: skipped ({steps[-1]['skipped']})", flush=True)
            continue
        limit = max(left(), 30)
        if name == "pytest":
            r = _step(name, [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"], limit)
        elif name == "sampler":
            r = _json_step(name, f"bench.sampler({SAMPLER_KW})", out / f".{kind}.sampler.json", limit)
            if "json" in r:
                r["rows"] = [dict(shape=d, way=w, tokens_per_s=t, first_call_s=None if f != f else f)
                             for d, w, t, f in r.pop("json")]
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
            r = _step(name, [py, "-m", "cancellation.run", nb, "--profile", "paper-vocab", "--dry-run",
                             "--no-plan-check", *_dry_overrides(nb)], limit)
            rec = ROOT / "dry-run" / "paper-vocab" / "measured.json"
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
    report = dict(device=dev, budget_s=budget, spent_s=round(spent, 1), dry_sizes=DRY_SIZES,
                  dry_per_notebook=dry_per_notebook(), steps=steps)
    tmp = stem.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(stem.with_suffix(".json"))
    stem.with_suffix(".md").write_text(markdown(report))
    return report


def markdown(report: dict) -> str:
    """The report as markdown: one status table, then each step's numbers."""
    d = report["device"]
    lines = [f"# gpu-check, {d['date']}: {d['name']} ({d['kind']}, {d['memory_gib']} GiB), torch {d['torch']}",
             "", f"Budget {report['budget_s']:.0f} s, spent {report['spent_s']:.0f} s. "
             "Written by `python -m cancellation.gpucheck` (`make gpu-check`).", "",
             *([f"Calls: {'; '.join(report['calls'])}.", ""] if report.get("calls") else []),
             *(["**The machine:** driver " + str(d.get("driver")) + f", CUDA {d.get('cuda')}, Python {d.get('python')}; "
                + ", ".join(f"{k} {v['version'] or 'absent'}" + ("" if v["importable"] or not v["version"] else
                                                                 " (does not import)")
                            for k, v in d["packages"].items()), ""] if d.get("packages") else []),
             "| step | status | seconds |", "|---|---|---|"]
    for s in report["steps"]:
        status = f"skipped ({s['skipped']})" if "skipped" in s else ("ok" if s["rc"] == 0 else
                                                                     "timed out" if s["rc"] == 124 else f"failed (rc {s['rc']})")
        lines.append(f"| {s['step']} | {status} | {s.get('seconds', '')} |")
    for s in report["steps"]:
        if s.get("step") == "pytest" and "output_tail" in s:
            last = [x for x in s["output_tail"].splitlines() if x.strip()][-1:] or [""]
            lines += ["", f"**pytest -m gpu:** {last[0]}"]
        if s.get("rows"):
            lines += ["", "**Sampler, Qwen3-1.7B shape, bfloat16, random weights, no stop ids** (`bench sampler`):", "",
                      "| rows x new | way | tokens/s | first call (s) |", "|---|---|---|---|"]
            for r in s["rows"]:
                f = "" if r["first_call_s"] is None else f"{r['first_call_s']:.1f}"
                lines.append(f"| {r['shape']} | {r['way']} | {r['tokens_per_s']:,.0f} | {f} |")
        if s.get("profile"):
            pr = s["profile"]
            lines += ["", f"**One decode step, {pr['rows']} rows, prompt {pr['prompt']}, {pr['new']} new tokens** "
                      f"(captured graph {pr['captured_ms_per_step']:.2f} ms/step = {pr['tokens_per_s_captured']:,.0f} "
                      f"tokens/s; the same step eagerly: {pr['eager_cuda_ms_per_step']:.2f} ms of kernels/step):", "",
                      "| kernel | calls | ms per step | share |", "|---|---|---|---|"]
            for k in pr["kernels"]:
                lines.append(f"| `{k['name']}` | {k['calls']} | {k['ms']:.3f} | {100 * k['share']:.1f}% |")
        if s.get("units"):
            u = s["units"]
            lines += ["", f"**Unit costs at Qwen3-1.7B's shape** (`{s.get('file', '')}`):", "",
                      "| block | s per 1k parameter-tokens x 1e9 params | s per call |", "|---|---|---|"]
            for k, v in u.items():
                if "s_per_param_token" in v:
                    lines.append(f"| {k} | {v['s_per_param_token'] * 1e12:.3g} | {v['s_per_call']:.3g} |")
            if "start" in u:
                lines.append(f"| notebook start | | {u['start']['seconds']:.1f} |")
        if s.get("trim"):
            lines += ["", "**trim_padding at Qwen3-1.7B's shape**, float32, random weights, responses stopping at lengths "
                      "spread from 1/8 of the cap to the cap (`scale.trim_probe`):", "",
                      "| block | rows x columns | chunk_rows | positions run | full (s) | trimmed (s) | speed-up | max abs diff |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in s["trim"]:
                lines.append(f"| {r['block']} | {r['rows']} x {r['columns']} | {r['chunk_rows']} | "
                             f"{r['positions_share']:.0%} | {r['seconds_full']:.2f} | {r['seconds_trim']:.2f} | "
                             f"{r['speedup']:.2f}x | {r['max_abs_diff']:.1e} |")
    dry = [s for s in report["steps"] if s.get("step", "").startswith("dry-")]
    if dry:
        sizes = ", ".join(f"{k} {v}" for k, v in DRY_SIZES.items() if k not in ("model_path", "device"))
        extra = "; ".join(f"{nb}: " + ", ".join(f"{k} {v}" for k, v in kv.items())
                          for nb, kv in dry_per_notebook().items())
        lines += ["", f"**Dry runs at Qwen3-1.7B's shape** (`--dry-run`, profile paper-vocab, {sizes}; {extra}):", "",
                  "| notebook | measured: time, peak GPU | planned: time, peak | measured / planned |", "|---|---|---|---|"]
        for s in dry:
            m = s.get("measured")
            if not m:
                why = s.get("skipped") or f"rc {s.get('rc')}"
                lines.append(f"| {s['step'][4:]} | not measured ({why}) | | |")
                continue
            p = m.get("planned") or {}
            t, g = m["measured_seconds"], m.get("peak_cuda_gib") or float("nan")
            pt, pg = p.get("predicted_seconds"), p.get("peak_gib")
            ratio = f"{t / pt:.2f}x, {g / pg:.2f}x" if pt and pg else ""
            lines.append(f"| {m['notebook']} | {t:.0f} s, {g:.1f} GiB | "
                         + (f"{pt:.0f} s, {pg:.1f} GiB" if pt and pg else "no plan") + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=540, help="seconds for all steps (default 540)")
    ap.add_argument("--out", default=str(ROOT / "data" / "scale" / "measured"))
    ap.add_argument("--notebooks", nargs="+", default=dry_order(), help="dry runs, in this order")
    ap.add_argument("--skip", nargs="*", default=[], help="steps to leave out: pytest sampler units dry dry-NN")
    ap.add_argument("--list", action="store_true", help="print the steps and their estimates, run nothing")
    a = ap.parse_args(argv)
    if a.list:
        for name, est in plan_steps(a.notebooks):
            print(f"{name:<8} ~{est} s")
        return 0
    bare_machine_env()
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}); nothing measured. "
              "Run it on a machine with an NVIDIA GPU.", file=sys.stderr)
        return 2
    run_check(a.budget_s, Path(a.out).resolve(), a.notebooks, set(a.skip))
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


def standin_data(out: Path = ROOT / "data" / "standins") -> dict:
    """The stand-in problem files the dry runs read (paper-vocab's problems_path and eval_sets), written when
    missing: the data files only (well under a second), not the stand-in models, which the dry runs replace
    with random weights at Qwen3-1.7B's shape. Returns {"seconds", "written"}."""
    t = time.time()
    want = [out / "dapo-math-17k.parquet", out / "math500.jsonl"]
    if all(p.exists() for p in want):
        return dict(seconds=0.0, written=False)
    out.mkdir(parents=True, exist_ok=True)
    standins.write_data(out, seed=0)
    return dict(seconds=round(time.time() - t, 2), written=True)


if __name__ == "__main__":
    sys.exit(main())
