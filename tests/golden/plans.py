"""The planner's workloads, pinned before they moved beside each figure's compute() (issue 34).

`python -m tests.golden.plans --write` records every notebook's Work and memory terms on the tiny,
paper-quick and paper profiles (H100 unit costs for the paper profiles); test_plan
compares today's planner with the file, so a move of the workload code that changes a count fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cancellation import plan, profiles, resolve

FILE = Path(__file__).with_name("plans.json")
PROFILES = {"tiny": None, "paper-quick": "nvidia-h100-80gb-hbm3", "paper": "nvidia-h100-80gb-hbm3"}


def snapshot() -> dict:
    out = {}
    for profile, kind in PROFILES.items():
        for nb in profiles.all_notebooks():
            p = plan.make(nb.stem, resolve.resolve_params(nb, profile), kind=kind, procs=8)
            if p.work is None:
                out[f"{profile}/{nb.stem}"] = None
                continue
            w = p.work
            out[f"{profile}/{nb.stem}"] = dict(
                blocks=w.blocks, sampled_rows=w.sampled_rows, sampled_tokens=w.sampled_tokens, largest=list(w.largest),
                full_grads=w.full_grads, adam=w.adam, extra_bytes=w.extra_bytes, kv_rows=w.kv_rows, kv_len=w.kv_len,
                notes=w.notes, parts=w.parts, mem={k: int(v) for k, v in p.mem.items()})
    return json.loads(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        FILE.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {FILE}")
