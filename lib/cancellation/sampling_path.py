"""Which path samples a HF-backend batch on CUDA: ours (the static-cache sampler) or transformers' own
`generate` (static cache, torch.compile'd by transformers on CUDA) -- issue 49, item 3.

The choice is measured, not assumed: `make gpu-check` times every sampling path side by side on the card
and writes a report under data/scale/measured/. `choose_sampler` reads one report: ours only where it ran
at least 1.0x transformers' static cache + compile at every shape both were timed in that run; vLLM where
it imports and was fastest; else transformers'. `default_cuda_sampler(kind)` makes that choice from the
newest committed report of a device kind.

A figure's `hf_sampler` parameter ('auto', 'ours', 'transformers') says which path its HF-backend batches
take; `resolve` turns 'auto' into a path for a device: ours on a CPU (the tiny tables' tokens, bit for bit),
the committed report's choice on a CUDA card (transformers' when the card has no report, or when the
report chose vLLM: vLLM is a backend of its own, `backend: vllm`). The resolved path is in the figure's
cache key whenever it is not ours, and `resolve` prints once per process which path a card samples with.
Monte Carlo continuations (value.py: one prefill shared by M continuations, per-row budgets, first-token
bans) stay on ours whatever the path: transformers' generate has no such call.
"""
from __future__ import annotations

import functools
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


def newest_report(kind: str, where: Path = ROOT / "data" / "scale" / "measured", exclude: Path | None = None
                  ) -> Path | None:
    """The newest gpu-check report of a device kind under `where` (by the date in its name), among the files git
    tracks there when git can tell (a report written but not committed is left out), else among all of them but
    `exclude` (the report a running gpu-check is writing)."""
    files = sorted(f for f in where.glob(f"gpucheck-{kind}-*.json") if exclude is None or f.resolve() != exclude.resolve())
    files = [f for f in files if re.fullmatch(rf"gpucheck-{re.escape(kind)}-\d{{4}}-\d{{2}}-\d{{2}}\.json", f.name)]
    try:
        p = subprocess.run(["git", "ls-files", "--", str(where)], cwd=where, capture_output=True, text=True, timeout=30)
        tracked = {(where / Path(x).name).resolve() for x in p.stdout.split()} if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        tracked = None
    if tracked is not None:
        files = [f for f in files if f.resolve() in tracked]
    return files[-1] if files else None


def default_cuda_sampler(kind: str, where: Path = ROOT / "data" / "scale" / "measured",
                         vllm_importable: bool | None = None, exclude: Path | None = None) -> dict:
    """`choose_sampler` over the newest committed gpu-check report of `kind` (+ "report": its path), or
    {"path": "transformers", "why": "no gpu-check report of <kind>"} when there is none."""
    f = newest_report(kind, where, exclude)
    if f is None:
        return dict(path="transformers", ratios={}, report=None, why=f"no committed gpu-check report of {kind}")
    out = choose_sampler(json.loads(f.read_text()), vllm_importable)
    return {**out, "report": str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)}


@functools.cache
def _card_choice(kind: str) -> dict:
    return default_cuda_sampler(kind)


_said: set = set()


def resolve(path: str, device: str) -> str:
    """The path ('ours' or 'transformers') that `path` ('auto', 'ours', 'transformers') means on `device`:
    'auto' is ours on a CPU and the committed gpu-check report's choice on a CUDA card (`default_cuda_sampler`;
    its 'vllm' reads as transformers', since vLLM is a backend of its own). 'auto' stays 'auto' for a CUDA device
    not visible here (planning on a CPU): the card is unknown until the run."""
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
    c = _card_choice(kind)
    out = "ours" if c["path"] == "ours" else "transformers"
    if kind not in _said:
        _said.add(kind)
        print(f"sampling path on {kind} (hf backend): {out}; {c['why']}"
              + (f" [{c['report']}]" if c.get("report") else ""), flush=True)
    return out
