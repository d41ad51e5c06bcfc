"""Which path samples a HF-backend batch on CUDA: ours (the static-cache sampler) or transformers' own
`generate` (static cache, torch.compile'd by transformers on CUDA) -- issue 49, item 3; issue 63, item 7.

The choice is measured, not assumed, and made per notebook, end to end (`choose`): `make gpu-check` times ours
and transformers' static cache + compile side by side on the card at the notebooks' own sampling shapes (rows x
new tokens after a prompt of a stated length: its sampler step, `gpucheck.sampler_at`), each way's first call
(capture or compile, and the call) and its steady tokens/s, and writes a report under data/scale/measured/. A
notebook's sampling calls (`plan.sampling_calls`: the `workload.sample` calls its figure's planner workload
counts at its Params, Monte Carlo continuations left out) cost on each path

    sum over its distinct (row bucket, new tokens) shapes of  first call s + (calls - 1) x rows x new / tokens/s

with the numbers of the smallest measured prompt at least the notebook's longest (`shape_cost`); the cheaper
path wins, ours on a tie, and ours wherever some shape the notebook samples at was not measured for both paths
on this device kind ("no measurement at <shape>"), or the kind has no report. `newest_report(kind)` is the
newest report of a kind by the date in its name, committed or not (a fresh gpu-check counts before anyone
commits it; `report_label` and the printed line say which report, and ', uncommitted').

`choose_sampler` is a report's steady-state summary (tokens/s only, at every shape both were timed; vLLM where
it imports and was fastest): gpu-check's report prints it beside the per-notebook end-to-end choices.

A figure's `hf_sampler` parameter ('auto', 'ours', 'transformers') says which path its HF-backend batches
take; `resolve` turns 'auto' into a path for a device: ours on a CPU (the tiny tables' tokens, bit for bit); on
a CUDA card the end-to-end choice for the notebook whose sampling calls it is given, printed once per notebook
in one line with its numbers (`notebook_choice`); ours when it is given none. A figure's Params give theirs
(`FigureParams.hf_path`: the notebook's manifest stem, and its `plan.sampling_calls` as a function, counted only
on a CUDA card and once per notebook and device kind in a process). The resolved path is in the
figure's cache key whenever it is not ours. Monte Carlo continuations (value.py: one prefill shared by M
continuations, per-row budgets, first-token bans) stay on ours whatever the path: transformers' generate has no
such call.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from .shapes import device_kind

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("auto", "ours", "transformers")   # a figure's / config's hf_sampler values
OURS, STATIC, DYNAMIC = "ours (static cache", "transformers generate, static cache + torch.compile", \
    "transformers generate, dynamic cache"


def sampler_rows(report: dict) -> list[dict]:
    """Every sampling row of a report (the sampler step's and the vllm step's), in the steps' order."""
    return [r for s in report.get("steps", []) if s.get("step") in ("sampler", "vllm") for r in s.get("rows") or []]


def choose_sampler(report: dict, vllm_importable: bool | None = None) -> dict:
    """The default CUDA sampling path a gpu-check report's numbers choose (issue 49, item 3): 'ours' only where
    ours measured at least 1.0x transformers' static cache + torch.compile at every shape both were measured in
    that run (and at one at least); 'vllm' where vLLM imports (`vllm_importable`; None: as the report recorded)
    and was the fastest way at every shape it was measured; else 'transformers' (static cache + compile).
    Returns {"path", "why", "ratios": {shape: ours / static+compile}}."""
    rows = sampler_rows(report)
    by = {}
    for r in rows:
        if r["way"] != "weight-read limit":
            by.setdefault(r["shape"], {})[r["way"]] = r["tokens_per_s"]
    ratios = {}
    for shape, ways in by.items():
        ours = next((t for w, t in ways.items() if w.startswith(OURS)), None)
        if ours is not None and STATIC in ways:
            ratios[shape] = ours / ways[STATIC]
    if vllm_importable is None:
        vllm_importable = bool(((report.get("device") or {}).get("packages") or {}).get("vllm", {}).get("importable"))
    v_shapes = [sh for sh, ways in by.items() if any(w.startswith("vLLM") for w in ways)]
    if vllm_importable and v_shapes and all(
            max(t for w, t in by[sh].items() if w.startswith("vLLM")) >= max(by[sh].values()) for sh in v_shapes):
        return dict(path="vllm", ratios=ratios, why="vLLM imports and was the fastest way at "
                    + ", ".join(v_shapes))
    said = ", ".join(f"{v:.2f}x at {sh}" for sh, v in ratios.items())
    if ratios and all(v >= 1.0 for v in ratios.values()):
        return dict(path="ours", ratios=ratios, why=f"ours / transformers static cache + compile: {said}")
    why = (f"ours / transformers static cache + compile: {said} (< 1.0x)" if ratios else
           "ours was never measured beside transformers' static cache + compile in one run")
    return dict(path="transformers", ratios=ratios, why=why)


MEASURED = ROOT / "data" / "scale" / "measured"   # where gpu-check writes its reports
REPORT = re.compile(r"gpucheck-(.+)-(\d{4}-\d{2}-\d{2})\.json")


def _tracked(where: Path) -> set | None:
    """The files git tracks under `where` (resolved paths), or None when git cannot tell."""
    try:
        p = subprocess.run(["git", "ls-files", "--", str(where)], cwd=where, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {(where / Path(x).name).resolve() for x in p.stdout.split()} if p.returncode == 0 else None


def newest_report(kind: str, where: Path | None = None, exclude: Path | None = None) -> Path | None:
    """The newest gpu-check report of a device kind under `where` (by the date in its name), committed or not (a
    fresh measurement counts before anyone commits it: `report_label` says which it is), leaving out `exclude`
    (the report a running gpu-check is writing). `where` defaults to MEASURED."""
    where = MEASURED if where is None else Path(where)
    files = sorted(f for f in where.glob(f"gpucheck-{kind}-*.json") if exclude is None or f.resolve() != exclude.resolve())
    files = [f for f in files if (m := REPORT.fullmatch(f.name)) and m.group(1) == kind]
    return files[-1] if files else None


def report_label(f: Path | None) -> str | None:
    """A report's path (relative to the repository when inside it), with ', uncommitted' when git tracks it not."""
    if f is None:
        return None
    tracked = _tracked(f.parent)
    name = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)
    return name + (", uncommitted" if tracked is not None and f.resolve() not in tracked else "")


def default_cuda_sampler(kind: str, where: Path | None = None,
                         vllm_importable: bool | None = None, exclude: Path | None = None) -> dict:
    """`choose_sampler` (the steady-state summary) over the newest gpu-check report of `kind` (+ "report": its
    path, ', uncommitted' when git tracks it not), or {"path": "transformers", "why": "no gpu-check report of
    <kind>"} when there is none."""
    f = newest_report(kind, where, exclude)
    if f is None:
        return dict(path="transformers", ratios={}, report=None, why=f"no gpu-check report of {kind}")
    out = choose_sampler(json.loads(f.read_text()), vllm_importable)
    return {**out, "report": report_label(f)}


# --------------------------------------------------------------------------- end to end, per notebook (issue 63, 7)
WAYS = {"ours": OURS, "transformers": STATIC}   # the hf backend's paths -> the report's way (ours: a prefix)
WHO = {"ours": "ours", "transformers": "transformers' static cache + compile"}
BENCH_PROMPT = 64   # the prompt of a report row whose shape names none ("64 x 512": bench_sampling.sampler's 64 tokens)


def shape_label(rows: int, new: int, prompt: int | None = None) -> str:
    """A sampling shape as a report row names it: 'rows x new' (bench_sampling.sampler's 64-token prompts) or
    'rows x new, prompt P'."""
    return f"{rows} x {new}" + ("" if prompt is None else f", prompt {prompt}")


def parse_shape(label: str) -> tuple[int, int, int] | None:
    """(rows, new tokens, prompt tokens) of a report row's shape ('64 x 512': prompt 64), None when unreadable."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*(?:,\s*prompt\s*(\d+)\s*)?", str(label))
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or BENCH_PROMPT))


def shape_cost(rows: list[dict], path: str, call: dict) -> dict | None:
    """What `call` ({"rows", "new", "prompt", "calls"}) costs on `path` ('ours', 'transformers') from a report's
    sampler rows: the row of `path`'s way at the same rows and new tokens and the smallest measured prompt at
    least call["prompt"], with a first-call time; None when there is none. Returns {"seconds", "first_s",
    "call_s", "tokens_per_s", "shape" (the measured one)}: seconds = first call + (calls - 1) x one steady call."""
    way, best = WAYS[path], None
    for r in rows:
        sh = parse_shape(r.get("shape", ""))
        ok = r.get("way", "").startswith(way) if path == "ours" else r.get("way") == way
        if not ok or sh is None or r.get("first_call_s") is None or not r.get("tokens_per_s"):
            continue
        if sh[0] == call["rows"] and sh[1] == call["new"] and sh[2] >= call["prompt"] and (best is None or sh[2] < best[0]):
            best = (sh[2], r)
    if best is None:
        return None
    r = best[1]
    one = call["rows"] * call["new"] / r["tokens_per_s"]
    return dict(seconds=r["first_call_s"] + (call["calls"] - 1) * one, first_s=r["first_call_s"], call_s=one,
                tokens_per_s=r["tokens_per_s"], shape=r["shape"])


def choose(report: dict | None, calls: list[dict]) -> dict:
    """The hf backend's path for one notebook on one card, end to end (issue 63, item 7): for each path the sum
    over the notebook's sampling shapes (`plan.sampling_calls`) of `shape_cost`; the cheaper path, ours on a tie; ours
    whenever some shape was not measured for both paths in `report` ("no measurement at <shape>"), or there is
    no report, or no call. Returns {"path", "why", "seconds": {path: s}}."""
    if not calls:
        return dict(path="ours", seconds={}, why="no HF sampler calls counted")
    if report is None:
        return dict(path="ours", seconds={}, why="no gpu-check report of this device kind")
    rows = sampler_rows(report)
    costs = {p: [shape_cost(rows, p, c) for c in calls] for p in WAYS}
    gone = {}   # shape -> the paths not measured there (at that prompt or a longer one)
    for p, cs in costs.items():
        for c, x in zip(calls, cs):
            if x is None:
                gone.setdefault(f"{c['rows']} x {c['new']}, prompt >= {c['prompt']}", []).append(WHO[p])
    if gone:
        return dict(path="ours", seconds={}, why="no measurement at " + "; ".join(
            f"{sh} ({', '.join(ps)})" for sh, ps in gone.items()))
    total = {p: sum(x["seconds"] for x in cs) for p, cs in costs.items()}
    path = "transformers" if total["transformers"] < total["ours"] else "ours"

    def said(p):
        return f"{WHO[p]} {total[p]:.0f} s (" + " + ".join(
            f"{x['first_s']:.1f} s first + {c['calls'] - 1} x {x['call_s']:.1f} s" for c, x in zip(calls, costs[p])) + ")"
    what = ", ".join(f"{c['calls']} x {shape_label(c['rows'], c['new'], c['prompt'])}" for c in calls)
    return dict(path=path, seconds=total, why=f"end to end, {what}: {said(path)} against "
                f"{said('transformers' if path == 'ours' else 'ours')}")


_chosen: dict = {}


def notebook_choice(kind: str, calls, notebook: str) -> dict:
    """`choose` for `notebook` on a card of `kind` from the newest report of that kind (`newest_report`, committed
    or not); `calls`: its sampling calls, or a function returning them (called only here, once). Cached per
    notebook and kind, and printed in one line the first time: the path, its numbers, the report used."""
    key = (kind, notebook)
    if key not in _chosen:
        f = newest_report(kind)
        try:
            calls = calls() if callable(calls) else list(calls or [])
        except Exception as e:   # noqa: BLE001 - a workload that cannot be counted here: no shapes, ours
            calls, c = [], dict(path="ours", seconds={}, why=f"its sampling calls not counted ({type(e).__name__}: {e})")
        else:
            c = choose(json.loads(f.read_text()) if f is not None else None, calls)
        c = {**c, "calls": calls, "report": report_label(f)}
        _chosen[key] = c
        print(f"hf_sampler auto, {notebook} on {kind}: {c['path']}; {c['why']}"
              + (f" [{c['report']}]" if c.get("report") else ""), flush=True)
    return _chosen[key]


def resolve(path: str, device: str, calls=None, notebook: str | None = None) -> str:
    """The path ('ours' or 'transformers') that `path` ('auto', 'ours', 'transformers') means on `device`:
    'auto' is ours on a CPU; on a CUDA card the end-to-end choice (`choose`) for `notebook` (its name) at its
    sampling `calls` (a list of {"rows", "new", "prompt", "calls"}, or a function returning it:
    `plan.sampling_calls` of the notebook's Params), from the newest gpu-check report of the card's kind,
    printed once per notebook (`notebook_choice`); ours when no calls are given (no shapes to decide at).
    'auto' stays 'auto' for a CUDA device not visible here (planning on a CPU): the card is unknown until the run."""
    if path not in PATHS:
        raise ValueError(f"hf_sampler={path!r}; allowed: {', '.join(PATHS)}")
    device = str(device)
    if path != "auto":
        return path
    if not device.startswith("cuda"):
        return "ours"
    kind = device_kind(device)
    if kind == "cuda":
        return "auto"
    if calls is None:
        return "ours"
    return notebook_choice(kind, calls, notebook or "a notebook")["path"]
