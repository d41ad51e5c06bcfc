"""Golden tests: the committed tiny tables are pinned, and recomputing them gives the same numbers.

`tests/golden/tiny.json` holds an order-insensitive digest of every committed table under
data/results/tiny*/ (see tests/golden/digest.py) and every claim's numbers. Three layers:
- the committed files match their pins (fast: a regenerated table that moved fails here);
- notebook 02 is recomputed from scratch in every `make test` and must match to 1e-10;
- `pytest -m golden` (or GOLDEN=1) recomputes every notebook on the tiny profile (~17 min on
  2 cores) and compares every table and claim: run it before and after any refactor.
"""
import json
import os

import pytest
from golden import digest as D

from cancellation import execute, manifest

PINS = json.loads(D.PINS.read_text())


@pytest.mark.parametrize("profile", D.PROFILES)
def test_committed_tables_match_their_pins(profile):
    pins = PINS[profile]
    have = D.tables(profile)
    assert sorted(have) == sorted(k for k in pins if k != "claims"), "a table was added or removed: re-pin"
    bad = {name: d for name, p in have.items() if (d := D.differences(D.digest(D.read_table(p)), pins[name]))}
    assert not bad, f"committed tables moved from their pins: {bad}"
    claims = D.claim_numbers(D.read_table(D.ROOT / "data" / "results" / profile / "claims.parquet"))
    assert sorted(claims) == sorted(pins["claims"])
    bad = {cid: d for cid, got in claims.items() if (d := D.claim_differences(got, pins["claims"][cid]))}
    assert not bad, f"committed claims moved from their pins: {bad}"


def test_every_table_belongs_to_a_notebook():
    for name in PINS["tiny"]:
        if name not in ("claims", "claims.parquet"):
            assert manifest.owner(name) is not None, f"{name}: no notebook of the manifest writes it"


def test_digest_sees_a_moved_number_and_ignores_row_order():
    df = D.read_table(D.ROOT / "data" / "results" / "tiny" / "fig02_first_order.parquet")
    base = D.digest(df)
    assert not D.differences(D.digest(df.iloc[::-1].reset_index(drop=True)), base)
    moved = df.copy()
    moved.loc[0, "pearson"] += 1e-8 * abs(moved.loc[0, "pearson"])
    assert D.differences(D.digest(moved), base) == [f"pearson.{k}: {D.digest(moved)['numbers']['pearson'][k]!r} != "
                                                     f"{base['numbers']['pearson'][k]!r}" for k in ("sum", "abs", "sq")]


def _recompute_and_compare(nb: str, out_root):
    execute.run_notebook(nb, "tiny", out_root=out_root, log_output=False)
    res = out_root / "data" / "results" / "tiny"
    pins = PINS["tiny"]
    got = D.tables("tiny", out_root)
    fig = manifest.get(nb)   # the committed tables this notebook writes
    want = [n for n in pins if n != "claims" and fig.owns(n)]
    assert sorted(n for n in got if fig.owns(n)) == sorted(want)
    bad = {n: d for n in want if (d := D.differences(D.digest(D.read_table(got[n])), pins[n]))}
    assert not bad, f"notebook {nb} recomputed different numbers: {bad}"
    claims = D.claim_numbers(D.read_table(res / "claims.parquet"))
    assert claims, "the notebook recorded no claims"
    bad = {cid: d for cid, got in claims.items() if (d := D.claim_differences(got, pins["claims"][cid]))}
    assert not bad, f"notebook {nb} recomputed different claims: {bad}"


@pytest.mark.slow
def test_notebook_02_recomputes_its_committed_tables(tmp_path):
    _recompute_and_compare("02", tmp_path)


@pytest.mark.golden
@pytest.mark.parametrize("nb", [n for n in manifest.keys() if n != "02"])
def test_notebook_recomputes_its_committed_tables(nb, tmp_path_factory):
    if not os.environ.get("GOLDEN") and "golden" not in (os.environ.get("PYTEST_ADDOPTS") or ""):
        pytest.skip("recomputes a whole tiny notebook: run with GOLDEN=1 (or -m golden with GOLDEN=1)")
    # one out_root for all: 08 reads the cache of 01's training run, like `make figures`
    _recompute_and_compare(nb, tmp_path_factory.getbasetemp() / "golden")
