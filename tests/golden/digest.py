"""Order-insensitive digests of the committed result tables, so a refactor cannot move a number silently.

A digest of a table holds its row count and columns, and per column: for numbers the count of
NaNs, the sum, the sum of absolute values and the sum of squares (float64); for anything else a
hash of the sorted values. Two tables with the same digest (to rtol 1e-10) hold the same
numbers up to row order and float round-off. Wall-clock columns are left out (they change with
every run). `python -m tests.golden.digest --write` re-pins every table under data/results/tiny*/
into tests/golden/tiny.json: do that only in a commit that says which numbers moved and why.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from cancellation import cache

ROOT = Path(__file__).resolve().parents[2]
PINS = Path(__file__).with_name("tiny.json")
PROFILES = ("tiny", "tiny-table2")
# wall-clock seconds live under <results>/timing/ (not pinned: they change with every cold run); these
# names only matter for a results folder written before they moved there
VOLATILE_COLUMNS = {"t_sample", "t_update", "seconds"}
VOLATILE_TABLES = {"table2_timing.csv"}
RTOL, ATOL = 1e-10, 1e-12


read_table = cache.read_table


def digest(df: pd.DataFrame) -> dict:
    out = {"rows": len(df), "columns": sorted(map(str, df.columns)), "numbers": {}, "hashes": {}}
    for c in df.columns:
        if str(c) in VOLATILE_COLUMNS:
            continue
        s = df[c]
        if pd.api.types.is_bool_dtype(s) or pd.api.types.is_numeric_dtype(s):
            x = s.to_numpy(dtype=np.float64, na_value=np.nan)
            fin = x[np.isfinite(x)]
            out["numbers"][str(c)] = {"nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum()),
                                      "sum": float(fin.sum()), "abs": float(np.abs(fin).sum()),
                                      "sq": float((fin ** 2).sum())}
        else:
            vals = sorted(json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v
                          for v in s.tolist())
            out["hashes"][str(c)] = hashlib.sha256("\x1f".join(vals).encode()).hexdigest()[:16]
    return out


def tables(profile: str, root: Path = ROOT) -> dict[str, Path]:
    d = root / "data" / "results" / profile
    return {p.name: p for p in sorted(d.glob("*")) if p.suffix in (".parquet", ".csv") and p.name not in VOLATILE_TABLES}


def differences(got: dict, want: dict, skip_hashes: tuple[str, ...] = ()) -> list[str]:
    """What differs between two digests (empty when they agree to RTOL/ATOL)."""
    diffs = []
    if got["rows"] != want["rows"]:
        diffs.append(f"rows {got['rows']} != {want['rows']}")
    if got["columns"] != want["columns"]:
        diffs.append(f"columns {got['columns']} != {want['columns']}")
    for c, w in want["numbers"].items():
        g = got["numbers"].get(c)
        if g is None:
            continue
        for k, v in w.items():
            if not math.isclose(g[k], v, rel_tol=RTOL, abs_tol=ATOL):
                diffs.append(f"{c}.{k}: {g[k]!r} != {v!r}")
    for c, w in want["hashes"].items():
        if c in skip_hashes:
            continue
        if got["hashes"].get(c, w) != w:
            diffs.append(f"{c}: text values differ")
    return diffs


def claim_numbers(df: pd.DataFrame) -> dict:
    """claim id -> (measured, lo, hi, n, verdict): the registry's numbers, row order aside."""
    return {r.claim: [None if pd.isna(r.measured) else float(r.measured), None if pd.isna(r.lo) else float(r.lo),
                      None if pd.isna(r.hi) else float(r.hi), int(r.n), r.verdict]
            for r in df.itertuples()}


def claim_differences(got: list, want: list) -> list[str]:
    """What differs between two claims' (measured, lo, hi, n, verdict), numbers to RTOL/ATOL."""
    diffs = []
    for name, a, b in zip(("measured", "lo", "hi"), got[:3], want[:3]):
        if (a is None) != (b is None) or (a is not None and not math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)):
            diffs.append(f"{name}: {a!r} != {b!r}")
    if got[3:] != want[3:]:
        diffs.append(f"(n, verdict): {got[3:]} != {want[3:]}")
    return diffs


def pin_all(root: Path = ROOT) -> dict:
    pins = {}
    for profile in PROFILES:
        pins[profile] = {name: digest(read_table(p)) for name, p in tables(profile, root).items()}
        pins[profile]["claims"] = claim_numbers(read_table(root / "data" / "results" / profile / "claims.parquet"))
    return pins


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python -m tests.golden.digest --write   (re-pins tests/golden/tiny.json)")
    PINS.write_text(json.dumps(pin_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS}")
