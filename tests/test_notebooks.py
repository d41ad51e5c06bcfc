"""Every notebook runs end to end through papermill on the smoke profile; assert on what it records."""
import json

import numpy as np
import pandas as pd
import pytest

from cancellation import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def out_root(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke")


def _run(ref, out_root):
    out = run.run_notebook(ref, "smoke", out_root=out_root, log_output=False)
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    return out_root / "data" / "results" / "smoke", out_root / "figures" / "smoke"


def test_01_token_flipping(out_root):
    res, figs = _run("01", out_root)
    for name in ("fig01_token_flipping", "fig09_flipping_across_models"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    frac = pd.read_parquet(res / "fig01_flip_fractions.parquet")
    sums = frac.groupby(["run", "step", "sign"]).fraction.sum()
    assert np.allclose(sums, 1.0) and set(frac.run) == {"grpo", "positive_only"}
    noise = pd.read_parquet(res / "fig01_noise_floor.parquet").set_index("measurement").max_abs_delta
    assert noise["repeat"] < 1e-6 and noise["zero_update"] < 1e-6
    assert noise["float32_roundoff"] > noise["repeat"]
    fig9 = pd.read_parquet(res / "fig09_flip_fractions.parquet")
    assert set(fig9.model) == {"tiny-m", "tiny-s"} and set(fig9.sign) == {"pos", "neg", "all"}
    deltas = pd.read_parquet(res / "fig01_token_deltas.parquet")
    assert (deltas.delta.abs() > 1e-6).mean() > 0.5  # an Adam step moves most tokens past ε
