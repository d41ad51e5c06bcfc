"""Every notebook with Qwen3's 151,936-wide LM head on CPU stand-ins (`paper-vocab`), under the memory guard.

Its own files, beside test_paper_smoke.py's (whose `_run` it uses): `make test` gives each pytest-xdist
worker whole files, and these notebook runs are the suite's longest (about 14 min in all on one core), so
in one file they kept one worker busy while the other idled at the end. They are split in two files
(measured 2026-11-27: 07 140 s, 01 95 s, 03 94 s, 08 90 s, 05 71 s, 06 66 s, 02 46 s; 04 245 s with 5
batches, 106 s with the 2 it runs since 2026-11-28): this one runs FIRST_HALF, test_paper_vocab_late.py
the rest, and make test starts the late file first (tests/conftest.py's LONG_FIRST)."""
import json

import pytest

from cancellation import profiles
from test_paper_smoke import _run

# ------------------------------------------------------------------ paper-vocab: Qwen's 151,936-wide head
# Where a notebook stays under 9k head positions at the sizes make test can afford (2 cores), the
# floor it does reach: 06's valued tokens and sub-batch steps are few (9.3k measured); 07's TRL runs
# at this vocabulary take ~4 min per strategy on CPU, so it trains one (QB+RB) for one iteration.
MIN_HEAD_POSITIONS = {"06": 8_000, "07": 6_000}


@pytest.fixture(scope="module")
def vocab_root(canonical_standins, tmp_path_factory):
    return tmp_path_factory.mktemp("paper-vocab")


FIRST_HALF = ("04", "05", "06", "02")   # about 290 s; the other four about 420 s


@pytest.mark.slow
@pytest.mark.parametrize("ref", [p.stem[:2] for p in profiles.all_notebooks() if p.stem[:2] in FIRST_HALF])
def test_paper_vocab(ref, vocab_root, tmp_path):
    """Every notebook with Qwen3's 151,936-wide LM head under the guard (`check_paper_vocab`)."""
    check_paper_vocab(ref, vocab_root, tmp_path)


def check_paper_vocab(ref, vocab_root, tmp_path):
    """Notebook `ref` with Qwen3's 151,936-wide LM head under the guard: no call computes logits for
    more than token_chunk (256) positions, sampling prefill and TRL's fused head included, while the
    notebook pushes ≥ 9k positions through the head (35× the bound; measured 9.5k–21k at 12 prompts,
    2026-11-26) and analyses a batch whose logits, built whole in float32, would take ≥ 5 GB (the tally
    is the guard's count, independent of the notebook).
    TRL's fused head counts its labelled positions against the bound, which is what it projects with
    Triton on a GPU; on a CPU it projects every position of its rows (`head_projected_max`, 890 for 07
    here), a CPU-only cost the tally reports and the planner counts."""
    log = tmp_path / "tally.json"
    with pytest.MonkeyPatch.context() as mp:   # a cache of its own: every position is computed here
        mp.setenv("CANCELLATION_CACHE", str(tmp_path / "cache"))
        _run(ref, vocab_root, "paper-vocab", log=log)
    t = json.loads(log.read_text())
    assert t["vocab"] == 151_936 and 0 < t["head_max"] <= 256
    assert t["head_positions"] >= MIN_HEAD_POSITIONS.get(ref, 9_000), t
    assert max(t["batch_max"], t["body_max"]) * t["vocab"] * 4 >= 5e9, t

