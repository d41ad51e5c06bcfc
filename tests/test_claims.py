"""The claims registry: verdict rules on synthetic numbers, record(), and README == committed registry."""
import math
from pathlib import Path

import pandas as pd
import pytest

from cancellation import claims as C
from cancellation import run

ROOT = Path(__file__).resolve().parents[1]
NAN = math.nan


@pytest.mark.parametrize("m, lo, hi, kw, want", [
    (0.2, 0.1, 0.3, {}, C.REPRODUCED),                          # CI excludes 0 in the paper's direction
    (-0.2, -0.3, -0.1, {}, C.NOT_REPRODUCED),                   # excludes 0 the other way
    (0.05, -0.1, 0.2, {}, C.INCONCLUSIVE),                      # covers 0
    (-0.05, -0.1, 0.02, dict(paper=0.24), C.NOT_REPRODUCED),    # wrong side, CI excludes the paper's value
    (-0.05, -0.1, 0.3, dict(paper=0.24), C.INCONCLUSIVE),       # wrong side but the paper's value is inside
    (-0.2, -0.3, -0.1, dict(sign=-1), C.REPRODUCED),            # the paper says "lower"
    (0.6, 0.55, 0.7, dict(ref=0.5), C.REPRODUCED),              # above a reference
    (0.4, 0.2, 0.6, dict(ref=0.5), C.INCONCLUSIVE),
    (0.99, NAN, NAN, dict(ref=0.9), C.INCONCLUSIVE),            # no interval, point not allowed
    (0.99, NAN, NAN, dict(ref=0.9, point_ok=True), C.REPRODUCED),
    (0.8, NAN, NAN, dict(ref=0.9, point_ok=True), C.NOT_REPRODUCED),
])
def test_direction_rule(m, lo, hi, kw, want):
    assert C.direction(m, lo, hi, **kw) == want


@pytest.mark.parametrize("m, lo, hi, kw, want", [
    (2.0, 1.0, 3.0, dict(tol=10), C.REPRODUCED),
    (10.2, 8.7, 11.8, dict(tol=10), C.INCONCLUSIVE),            # straddles the tolerance
    (0.53, 0.43, 0.63, dict(tol=0.3), C.NOT_REPRODUCED),        # entirely outside
    (0.72, 0.70, 0.74, dict(target=0.7, tol=0.1), C.REPRODUCED),
    (0.999, NAN, NAN, dict(target=1, tol=0.01, point_ok=True), C.REPRODUCED),
    (70, NAN, NAN, dict(target=40, tol=15), C.INCONCLUSIVE),    # a peak location without an interval
    (70, NAN, NAN, dict(target=40, tol=15, point_ok=True), C.NOT_REPRODUCED),
])
def test_similar_rule(m, lo, hi, kw, want):
    assert C.similar(m, lo, hi, **kw) == want


def test_record_replaces_a_notebooks_rows(tmp_path, capsys):
    a = C.Claim("x1", "Fig. X", "goes up", "yes", 0.2, 0.1, 0.3, n=5)
    b = C.Claim("y1", "Fig. Y", "similar", "similar", 1.0, -1, 2, n=3, rule="similar", params=dict(tol=5))
    C.record(tmp_path, "01", [a])
    C.record(tmp_path, "02", [b])
    out = C.record(tmp_path, "01", [C.Claim("x2", "Fig. X", "goes down", "yes", 0.2, 0.1, 0.3, n=5,
                                            params=dict(sign=-1))])
    reg = pd.read_parquet(tmp_path / "claims.parquet")
    assert list(reg.claim) == ["x2", "y1"] and list(reg.verdict) == [C.NOT_REPRODUCED, C.REPRODUCED]
    assert out.equals(reg)
    assert "NOT REPRODUCED" in capsys.readouterr().out
    with pytest.raises(ValueError, match="duplicate"):
        C.record(tmp_path, "03", [a, a])
    with pytest.raises(ValueError, match="unknown rule"):
        C.Claim("z", "F", "s", "p", 1.0, rule="bigger")


def test_update_readme_between_markers(tmp_path):
    reg = tmp_path / "r"
    C.record(reg, "01", [C.Claim("x1", "Fig. X", "goes up", "yes", 0.2, 0.1, 0.3, n=5)])
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{C.BEGIN}\nold\n{C.END}\nbottom\n")
    assert C.update_readme(readme, reg / "claims.parquet")
    text = readme.read_text()
    assert "old" not in text and "| Fig. X: goes up |" in text and text.startswith("top\n") and text.endswith("bottom\n")
    assert not C.update_readme(readme, reg / "claims.parquet")


def test_committed_readme_table_matches_committed_registry():
    reg = C.readme_registry(ROOT)
    assert C.readme_table(ROOT / "README.md") == C.table_markdown(reg).strip(), \
        "README's claims table is stale: run `make claims`"
    for _, r in reg.iterrows():  # every stored verdict follows from its rule and numbers
        assert C.verdict_of(r) == r.verdict, r.claim
    assert set(reg.verdict) <= set(C.VERDICTS)
    tiny = pd.read_parquet(ROOT / "data" / "results" / "tiny" / "claims.parquet")
    assert set(tiny.notebook) == {p.stem[:2] for p in run.all_notebooks()}  # every notebook records its claims
