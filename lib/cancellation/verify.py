"""`make verify`: how close a run came to the committed results, without rerunning anything.

    python -m cancellation.verify                      # committed (git HEAD) vs this checkout, every profile HEAD has
    python -m cancellation.verify --profile tiny
    python -m cancellation.verify A B                  # any two results folders (each a data/results/<profile>)

Compares every table of the two folders column by column and every claim of their registries, and
prints one table: per result table its status and largest difference, per claim whose numbers are
not identical its verdicts, numbers and intervals. Exit 0 when everything is within the statement
below, 1 otherwise (naming what moved), 2 on a usage error.

The statement (what a rerun on another x86 machine should match; README says the same):
- Tables of the analysis notebooks (01-06, 08): every number within |a - b| <= 1e-6 + 1e-3 |b|
  (float64 round-off from another BLAS code path grows through a few optimizer steps to ~1e-4
  relative, measured on a second machine of the same kind), text columns equal, same rows and columns.
- Tables of notebook 07 (fig07a_, fig08_, table2_): training runs that sample their own batches fork
  once one sampled token flips, so their numbers carry no tolerance: same rows and columns only.
- Claims: every verdict equal, and where both have an interval, the intervals overlap; the point
  estimate within the tolerance of its notebook's tables (none for 07).
- Wall-clock seconds are not results: notebook 07 writes them under <results>/timing/ (the runs' t_sample,
  t_update and evaluation seconds, table2_timing.csv), which is not compared; the same columns in a
  results folder written before they moved there are left out too.
On one machine a rerun is bit for bit (the golden tests check that); this is the statement across
machines.
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from . import cache

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "data/results"
VOLATILE_COLUMNS = {"t_sample", "t_update", "seconds"}   # wall-clock, in results folders from before timing/
VOLATILE_TABLES = {"table2_timing.csv"}                 # (the same: its place before timing/)
RTOL, ATOL = 1e-3, 1e-6
TRAJECTORY_PREFIXES = ("fig07a_", "fig08_", "table2_")    # notebook 07's training runs
TRAJECTORY_NOTEBOOKS = {"07"}
# claim columns that are text rendered from numbers (they move with the numbers they print)
CLAIM_TEXT = {"detail", "rule_text", "params"}


read_table = cache.read_table   # what verify compares is what the notebooks wrote


def _close(a: float, b: float) -> bool:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        return (a is None or a != a) and (b is None or b != b)
    return abs(a - b) <= ATOL + RTOL * abs(b)


def compare_table(got: pd.DataFrame, want: pd.DataFrame, trajectory: bool) -> tuple[str, str]:
    """(status, detail): 'identical', 'within' (numbers within the tolerance), or 'moved'."""
    gc = [c for c in got.columns if str(c) not in VOLATILE_COLUMNS]
    wc = [c for c in want.columns if str(c) not in VOLATILE_COLUMNS]
    if sorted(map(str, gc)) != sorted(map(str, wc)):
        return "moved", f"columns differ: {sorted(set(map(str, gc)) ^ set(map(str, wc)))}"
    if len(got) != len(want):
        return "moved", f"rows {len(got)} vs {len(want)}"
    worst, where, text_diff = 0.0, "", []
    for c in wc:
        a, b = got[c], want[c]
        num = (pd.api.types.is_numeric_dtype(a) or pd.api.types.is_bool_dtype(a)) and \
              (pd.api.types.is_numeric_dtype(b) or pd.api.types.is_bool_dtype(b))
        if num:
            x = a.to_numpy(dtype=np.float64, na_value=np.nan)
            y = b.to_numpy(dtype=np.float64, na_value=np.nan)
            nan = np.isnan(x) | np.isnan(y)
            if (np.isnan(x) != np.isnan(y)).any():
                return "moved", f"{c}: NaN in {int((np.isnan(x) != np.isnan(y)).sum())} rows of one side only"
            inf = np.isinf(x) | np.isinf(y)
            if (x[inf] != y[inf]).any():
                return "moved", f"{c}: infinite values differ in {int((x[inf] != y[inf]).sum())} rows"
            nan |= inf   # equal infinities: compared above, left out of the differences below
            d = np.abs(x[~nan] - y[~nan])
            if len(d) and not np.array_equal(x[~nan], y[~nan]):
                # the excess over the tolerance, scaled: > 1 means outside it
                excess = d / (ATOL + RTOL * np.abs(y[~nan]))
                i = int(np.argmax(excess))
                if excess[i] > worst:
                    worst = float(excess[i])
                    rel = d[i] / abs(y[~nan][i]) if y[~nan][i] != 0 else float("inf")
                    where = f"{c}: {x[~nan][i]:.6g} vs {y[~nan][i]:.6g} (relative {rel:.2g})"
        elif not a.astype(str).equals(b.astype(str)):
            text_diff.append(str(c))
    if trajectory:
        if worst == 0 and not text_diff:
            return "identical", ""
        return "forked", (f"largest difference {where}" if where else f"text differs: {', '.join(text_diff)}") + \
            " (a sampled trajectory: no tolerance)"
    if text_diff:
        return "moved", f"text differs in {', '.join(text_diff)}"
    if worst == 0:
        return "identical", ""
    return ("within" if worst <= 1 else "moved"), f"largest difference {where}"


def compare_claims(got: pd.DataFrame, want: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(claim, status, detail) for every claim: 'identical', 'within', 'forked' (07: numbers moved,
    verdict equal, intervals overlap) or 'moved' (a verdict changed, intervals apart, a claim missing)."""
    g = got.set_index("claim")
    w = want.set_index("claim")
    rows = []
    for cid in sorted(set(g.index) | set(w.index)):
        if cid not in g.index or cid not in w.index:
            rows.append((cid, "moved", "only in " + ("the committed results" if cid in w.index else "this run")))
            continue
        a, b = g.loc[cid], w.loc[cid]
        nums = [(k, a[k], b[k]) for k in ("measured", "lo", "hi")]
        same = all((pd.isna(x) and pd.isna(y)) or x == y for _, x, y in nums) and int(a["n"]) == int(b["n"])
        verdict = f"{b['verdict']} -> {a['verdict']}" if a["verdict"] != b["verdict"] else a["verdict"]
        if a["verdict"] != b["verdict"]:
            rows.append((cid, "moved", f"verdict {verdict}; measured {a['measured']:.4g} vs {b['measured']:.4g}"))
            continue
        if same:
            rows.append((cid, "identical", verdict))
            continue
        overlap = True
        if not any(pd.isna(v) for v in (a["lo"], a["hi"], b["lo"], b["hi"])):
            overlap = a["lo"] <= b["hi"] and b["lo"] <= a["hi"]
        msg = (f"{verdict}; measured {a['measured']:.6g} vs {b['measured']:.6g}, "
               f"interval [{a['lo']:.4g}, {a['hi']:.4g}] vs [{b['lo']:.4g}, {b['hi']:.4g}], n {int(a['n'])} vs {int(b['n'])}")
        if not overlap:
            rows.append((cid, "moved", "intervals do not overlap: " + msg))
        elif str(a["notebook"]) in TRAJECTORY_NOTEBOOKS:
            rows.append((cid, "forked", msg))
        elif all(_close(x, y) for _, x, y in nums if not (pd.isna(x) and pd.isna(y))) and int(a["n"]) == int(b["n"]):
            rows.append((cid, "within", msg))
        else:
            rows.append((cid, "moved", msg))
    return rows


def compare_folders(got: Path, want: Path) -> list[tuple[str, str, str]]:
    """(what, status, detail) for every table and claim of two results folders."""
    def tables(d):
        return {p.name: p for p in sorted(d.glob("*")) if p.suffix in (".parquet", ".csv")
                and p.name not in VOLATILE_TABLES and p.name != "claims.parquet"}
    tg, tw = tables(got), tables(want)
    rows = []
    for name in sorted(set(tg) | set(tw)):
        if name not in tg or name not in tw:
            rows.append((name, "moved", "only in " + ("the reference" if name in tw else "the compared folder")))
            continue
        st, det = compare_table(read_table(tg[name]), read_table(tw[name]), name.startswith(TRAJECTORY_PREFIXES))
        rows.append((name, st, det))
    cg, cw = got / "claims.parquet", want / "claims.parquet"
    if cg.exists() and cw.exists():
        rows += [(f"claim {c}", s, d) for c, s, d in compare_claims(read_table(cg), read_table(cw))]
    elif cg.exists() != cw.exists():
        rows.append(("claims.parquet", "moved", "only in one folder"))
    return rows


def committed(profile: str, dest: Path) -> Path | None:
    """The results folder of `profile` as committed at git HEAD, written under dest; None if HEAD has none."""
    rel = f"{RESULTS}/{profile}"
    ls = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", "HEAD", rel],
                        capture_output=True, text=True)
    if ls.returncode != 0:
        raise SystemExit(f"verify: cannot read the committed results from git ({ls.stderr.strip()}); "
                         "pass two folders: python -m cancellation.verify A B")
    names = [n for n in ls.stdout.splitlines() if n.count("/") == rel.count("/") + 1]
    if not names:
        return None
    out = dest / profile
    out.mkdir(parents=True)
    for n in names:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{n}"], capture_output=True, check=True).stdout
        (out / Path(n).name).write_bytes(blob)
    return out


def report(rows: list[tuple[str, str, str]], title: str) -> int:
    """Print the table (every table row; claims only where not identical) and return the number moved."""
    counts = {}
    for _, s, _ in rows:
        counts[s] = counts.get(s, 0) + 1
    shown = [r for r in rows if not (r[0].startswith("claim ") and r[1] == "identical")]
    print(f"{title}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    w = max((len(r[0]) for r in shown), default=10)
    for what, s, det in shown:
        print(f"  {what:<{w}}  {s:<9}  {det}")
    n_claims = sum(1 for r in rows if r[0].startswith("claim ") and r[1] == "identical")
    if n_claims:
        print(f"  ({n_claims} claims identical, not listed)")
    return counts.get("moved", 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", help="two results folders: the compared one, then the reference")
    ap.add_argument("--profile", nargs="+", default=None, help="profiles to compare with the committed results "
                    "(default: every profile HEAD has under data/results/)")
    a = ap.parse_args(argv)
    if a.folders and len(a.folders) != 2:
        print("verify: give two results folders (compared, reference), or none", file=sys.stderr)
        return 2
    moved = 0
    if a.folders:
        got, want = map(Path, a.folders)
        for d in (got, want):
            if not d.is_dir():
                print(f"verify: {d} is not a folder", file=sys.stderr)
                return 2
        moved += report(compare_folders(got, want), f"{got} vs {want}")
    else:
        profiles = a.profile or sorted({p.name for p in (ROOT / RESULTS).iterdir() if p.is_dir()})
        with tempfile.TemporaryDirectory() as tmp:
            for prof in profiles:
                ref = committed(prof, Path(tmp))
                if ref is None:
                    print(f"{prof}: nothing committed under {RESULTS}/{prof} (skipped)")
                    continue
                moved += report(compare_folders(ROOT / RESULTS / prof, ref), f"{RESULTS}/{prof} vs git HEAD")
    print("verify: everything within the statement (python -m cancellation.verify --help says what it is)"
          if not moved else f"verify: {moved} moved beyond the statement")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
