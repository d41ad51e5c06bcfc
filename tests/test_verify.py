"""make verify: a results folder compared with the committed one, every table within its stated tolerance,
every verdict equal. Each test perturbs a copy of the committed tiny results by hand and checks what
verify says against what was done to it."""
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from cancellation import verify

SRC = verify.ROOT / "data" / "results" / "tiny"


@pytest.fixture
def copy(tmp_path):
    d = tmp_path / "tiny"
    shutil.copytree(SRC, d)
    return d


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cancellation.verify", *map(str, args)], capture_output=True, text=True)


def test_identical_folders_exit_0(copy):
    p = _run(copy, SRC)
    assert p.returncode == 0, p.stdout
    assert "moved" not in p.stdout.split("\n")[0] and "everything within the statement" in p.stdout


def test_a_flipped_verdict_and_a_moved_table_exit_1_naming_both(copy):
    c = pd.read_parquet(copy / "claims.parquet")
    i = c.index[(c.notebook == "02") & (c.verdict == "reproduced")][0]
    cid = c.loc[i, "claim"]
    c.loc[i, "verdict"] = "not reproduced"
    c.to_parquet(copy / "claims.parquet")
    t = pd.read_parquet(copy / "fig05_cell_means.parquet")
    col = next(k for k in t.columns if pd.api.types.is_float_dtype(t[k]) and t[k].abs().max() > 0)
    j = int(t[col].abs().idxmax())
    t.loc[j, col] *= 1.01                       # 1% : past the analysis tables' 0.1%
    t.to_parquet(copy / "fig05_cell_means.parquet")
    p = _run(copy, SRC)
    assert p.returncode == 1
    moved = [line for line in p.stdout.splitlines() if "  moved  " in line]
    assert len(moved) == 2, p.stdout
    assert any("fig05_cell_means.parquet" in m and col in m for m in moved)
    assert any(cid in m and "verdict reproduced -> not reproduced" in m for m in moved)
    assert "2 moved beyond the statement" in p.stdout


def test_round_off_is_within_and_a_forked_training_table_passes(copy):
    t = pd.read_parquet(copy / "fig02_pairs.parquet")
    for k in t.columns:
        if pd.api.types.is_float_dtype(t[k]):
            t[k] = t[k] * (1 + 1e-9)
    t.to_parquet(copy / "fig02_pairs.parquet")
    b = pd.read_csv(copy / "table2_batching.csv")
    k = next(k for k in b.columns if pd.api.types.is_float_dtype(b[k]) and b[k].notna().any())
    b[k] = b[k] * 1.2                          # a forked trajectory: no tolerance, not a failure
    b.to_csv(copy / "table2_batching.csv", index=False)
    rows = dict((w, (s, d)) for w, s, d in verify.compare_folders(copy, SRC))
    assert rows["fig02_pairs.parquet"][0] == "within"
    assert rows["table2_batching.csv"][0] == "forked"
    assert _run(copy, SRC).returncode == 0


def test_table_tolerance_is_the_stated_one():
    want = pd.DataFrame({"x": [1.0, 0.0, np.nan, np.inf], "s": list("abcd")})
    ok = want.assign(x=[1.0 + 0.9e-3, 0.9e-6, np.nan, np.inf])
    bad = want.assign(x=[1.0 + 1.2e-3, 0.0, np.nan, np.inf])
    assert verify.compare_table(ok, want, False)[0] == "within"
    assert verify.compare_table(bad, want, False)[0] == "moved"
    assert verify.compare_table(want.assign(s=list("abce")), want, False)[0] == "moved"
    assert verify.compare_table(want.iloc[:3], want, False)[0] == "moved"


def test_usage_errors_exit_2(tmp_path):
    assert _run(tmp_path).returncode == 2
    assert _run(tmp_path / "nope", SRC).returncode == 2
