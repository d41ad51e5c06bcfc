"""The runner's dry run (`run --dry-run`), read from the environment: random weights in
`policy.load_policy` and a labelled coin-flip reward in `sources.ProblemSource`. Bottom layer: it imports
nothing of ours."""
from __future__ import annotations

import json
import os

DRY_RUN_ENV = "CANCELLATION_DRY_RUN"  # set by `run --dry-run` for the notebook's kernel: {"seed": n}


def dry_run() -> dict | None:
    """{"seed": n} while the runner's --dry-run is on ($CANCELLATION_DRY_RUN), else None."""
    raw = os.environ.get(DRY_RUN_ENV)
    if not raw:
        return None
    return {"seed": 0, **json.loads(raw)} if raw.strip().startswith("{") else {"seed": 0}
