"""make plots: every notebook redrawn from its committed tables, computing nothing, records the claim rows the
committed run recorded (the claims are recomputed from the tables, so this checks `figNN.load` against
`figNN.compute` through every number the notebook reads) and writes every figure the manifest gives it."""
import shutil
import time

import pandas as pd
import pytest

from cancellation import execute, manifest, profiles, run
from cancellation.figures import replot

ROOT = profiles.ROOT
COMPARED = ["claim", "figure", "statement", "paper", "measured", "lo", "hi", "n", "unit", "rule", "verdict", "detail"]
CASES = [("tiny", f.key) for f in manifest.FIGURES] + [("tiny-table2", "07")]


def _rows(path, key) -> pd.DataFrame:
    d = pd.read_parquet(path)
    return d[d.notebook == key].sort_values("claim").reset_index(drop=True)[COMPARED]


@pytest.mark.slow
@pytest.mark.parametrize("profile, key", CASES, ids=[f"{p}-{k}" for p, k in CASES])
def test_replot_records_the_committed_claims(tmp_path, profile, key):
    committed = ROOT / "data" / "results" / profile
    shutil.copytree(committed, tmp_path / "data" / "results" / profile)
    t0 = time.time()
    execute.run_notebook(key, profile, out_root=tmp_path, log_output=False, replot=True)
    seconds = time.time() - t0
    want = _rows(committed / "claims.parquet", key)
    got = _rows(tmp_path / "data" / "results" / profile / "claims.parquet", key)
    assert len(want) and len(got) == len(want), (len(got), len(want))
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    # nothing recomputed: the committed tables are the ones read (a recompute would rewrite them in the copy)
    for p in committed.glob("*.parquet"):
        if manifest.get(key).owns(p.name):
            assert (tmp_path / "data" / "results" / profile / p.name).read_bytes() == p.read_bytes(), p.name
    figs = {p.name for p in (tmp_path / "figures" / profile).glob("*.png")}
    made = {p.name for p in (ROOT / "figures" / profile).glob("*.png") if manifest.get(key).owns(p.name)}
    assert made and made <= figs, sorted(made - figs)
    assert seconds < 300, f"a replot took {seconds:.0f} s: it should compute nothing"


def test_replot_refuses_tables_of_other_parameters(tmp_path):
    from cancellation.figures import fig02
    P = fig02.Params(model_path=str(ROOT / "data" / "policies" / "tiny-s"))
    replot.save(tmp_path, P, edges=[0.0, 1.0])
    assert replot.restore(tmp_path, P)["edges"] == [0.0, 1.0]
    Q = fig02.Params(model_path=str(ROOT / "data" / "policies" / "tiny-s"), lr=P.lr * 2)
    with pytest.raises(replot.ReplotError, match="other parameters.*lr"):
        replot.restore(tmp_path, Q)
    with pytest.raises(replot.ReplotError, match="nothing to replot"):
        replot.restore(tmp_path / "elsewhere", P)


def test_replot_keeps_frames_series_and_arrays(tmp_path):
    import numpy as np
    from cancellation.figures import fig02
    P = fig02.Params(model_path=str(ROOT / "data" / "policies" / "tiny-s"))
    df = pd.DataFrame({1: [0.5, 1.5], ("a", "b"): [1, 2]}, index=pd.Index(["x", "y"], name="k"))
    s = pd.Series([1.0, 2.0], index=["u", "v"], name="share")
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    replot.save(tmp_path, P, df=df, s=s, arr=arr, facts={"n": np.int64(3), "xs": (1, 2)})
    got = replot.restore(tmp_path, P)
    pd.testing.assert_frame_equal(got["df"], df)
    pd.testing.assert_series_equal(got["s"], s)
    assert got["arr"].dtype == arr.dtype and (got["arr"] == arr).all()
    assert got["facts"] == {"n": 3, "xs": [1, 2]}


def test_replot_of_a_run_that_never_wrote_tables_stops_in_one_line(capsys):
    """--replot with overrides reads runs/<hash>/: a folder no run wrote stops before any kernel starts (exit 2)."""
    with pytest.raises(SystemExit) as e:
        run.main(["02", "--profile", "tiny", "--replot", "-p", "n_pairs", "123"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "nothing to replot" in err and "runs/" in err and "make fig02" in err
