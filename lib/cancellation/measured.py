"""What the planner reads that was measured: the unit costs of each device kind (data/scale/<kind>.json, written by
`python -m cancellation.scale`: `load_units`, `known_kinds`, `kind_memory`) and the committed gpu-check dry runs
that measured a notebook above its plan (data/scale/measured/gpucheck-<kind>-<date>.json: `dry_runs`,
`measured_factor`). Standard library only, and `shapes` for this host's memory.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from .shapes import device_memory

ROOT = Path(__file__).resolve().parents[2]
SCALE_DIR = ROOT / "data" / "scale"


# ----------------------------------------------------------------------------- unit costs per device kind
def load_units(kind: str, scale_dir: Path | None = None) -> dict | None:
    f = Path(scale_dir or SCALE_DIR) / f"{kind}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def known_kinds(scale_dir: Path | None = None) -> list[str]:
    """The device kinds with measured unit costs (data/scale/<kind>.json): what --device-kind takes."""
    return sorted(p.stem for p in Path(scale_dir or SCALE_DIR).glob("*.json"))


def kind_memory(kind: str, units: dict | None) -> int | None:
    """Bytes a device of this kind has: its scale file's `total_memory` (a GPU's, recorded where it was
    measured), else for 'cpu' this host's RAM; None when nothing says."""
    if units and units.get("total_memory"):
        return int(units["total_memory"])
    return device_memory("cpu") if kind == "cpu" else None


# ----------------------------------------------------------------------------- measured above plan
MEASURED = "measured"   # under the scale directory: gpu-check's reports, gpucheck-<kind>-YYYY-MM-DD.json
REPORT = re.compile(r"gpucheck-(.+)-(\d{4}-\d{2}-\d{2})\.json")


def _tracked(where: Path) -> set | None:
    """The files git tracks under `where` (None: git cannot tell, e.g. not a checkout)."""
    try:
        p = subprocess.run(["git", "ls-files", "--", "."], cwd=where, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {(where / x).resolve() for x in p.stdout.split()} if p.returncode == 0 else None


def _records(doc) -> list[dict]:
    """The dry-run rows of a gpu-check report: its dry-run steps' `measured` (the runner's --dry-run record)."""
    steps = doc.get("steps") if isinstance(doc, dict) else None
    rows = [s.get("measured") for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("planned"), dict) and r.get("notebook")]


@functools.lru_cache(maxsize=8)
def dry_runs(where: Path) -> dict:
    """(device kind, notebook) -> the newest committed gpu-check dry run of it under `where` (the dry-run steps of
    data/scale/measured/gpucheck-<kind>-<date>.json, by the date in the name): its date, report, sizes and measured /
    planned time and (on a GPU) peak memory, both against the plan's closed forms the report recorded. A report
    git does not track there is left out (when git can tell): a factor lasts until a committed measurement replaces
    it (sampling_path.newest_report, which picks the sampler, reads an uncommitted report too, and says so)."""
    where = Path(where)
    if not where.is_dir():
        return {}
    tracked = _tracked(where)
    out = {}
    for f in sorted(where.glob("gpucheck-*.json")):
        name = REPORT.fullmatch(f.name)
        if name is None or (tracked is not None and f.resolve() not in tracked):
            continue
        try:
            rows = _records(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
        date = name.group(2)
        for r in rows:
            pl = r["planned"]
            kind = pl.get("device_kind")
            t, pt = r.get("measured_seconds"), pl.get("predicted_seconds")
            g, pg = r.get("peak_cuda_gib"), pl.get("peak_gib")
            rec = dict(date=date, report=str(f.relative_to(ROOT)) if f.resolve().is_relative_to(ROOT) else str(f),
                       sizes=r.get("overrides") or {},
                       seconds=t / pt if t and pt else None, memory=g / pg if g and pg else None)
            key = (kind, r["notebook"])
            if key not in out or (date, rec["report"]) >= (out[key]["date"], out[key]["report"]):
                out[key] = rec
    return out


def measured_factor(stem: str, kind: str, where: Path | None = None) -> dict | None:
    """The factors a plan of `stem` on `kind` carries: its newest committed dry run's measured / planned time and
    memory where above 1 (1.0 where at or below: the plan held), with the report and its date; None when no dry
    run of it on this kind was committed, or none measured above plan."""
    rec = dry_runs(Path(where) if where is not None else SCALE_DIR / MEASURED).get((kind, stem))
    if rec is None:
        return None
    f = dict(rec, memory=max(rec["memory"] or 1.0, 1.0), seconds=max(rec["seconds"] or 1.0, 1.0))
    return f if f["memory"] > 1 or f["seconds"] > 1 else None
