"""The figure manifest is the one place a figure is declared: everything that lists notebooks agrees with
it, and a new figure reaches the runner, the planner, gpu-check, the golden tests and the docs through one
new module, its notebook and one manifest entry (a dummy figure is added that way below)."""
import re
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from cancellation import gpucheck, manifest, plan, profiles, resolve, run, stage

ROOT = Path(__file__).resolve().parents[1]


def test_every_notebook_is_in_the_manifest_in_order():
    assert [p.stem for p in profiles.all_notebooks()] == [f.notebook for f in manifest.FIGURES]
    assert len(set(manifest.keys())) == len(manifest.FIGURES)


def test_every_module_has_what_the_runner_and_planner_read():
    for f in manifest.FIGURES:
        mod = f.load()
        assert all(hasattr(mod, a) for a in ("Params", "compute", "workload")), f.module
        claims = [m for m in (mod, _sibling(f, "claims")) if m is not None and hasattr(m, "claims")]
        assert claims, f"{f.module}: no claims(R, P) in the module or its _claims sibling"
        assert profiles.figure_params(ROOT / "notebooks" / f"{f.notebook}.py") is mod.Params


def _sibling(f, suffix):
    try:
        return manifest.importlib.import_module(f"{f.package}.{f.module}_{suffix}")
    except ModuleNotFoundError:
        return None


def test_declared_stages_are_the_ones_the_module_uses():
    """The stage names a figure's files (`figNN.py`, `figNN_*.py`) reach as `stage.X` are its manifest
    stages, and each is declared once in stage.py."""
    by_const = {k: v for k, v in vars(stage).items() if isinstance(v, stage.Stage)}
    for f in manifest.FIGURES:
        src = "".join(p.read_text() for p in (ROOT / "lib" / "cancellation" / "figures").glob(f"{f.module}*.py"))
        used = {by_const[c].name for c in re.findall(r"\bstage\.([A-Z][A-Z0-9_]*)\b", src) if c in by_const}
        assert used == set(f.stages), (f.notebook, used, f.stages)


def test_every_committed_output_has_exactly_one_notebook():
    """The naming scheme: a file starts with the paper number of what it shows; the manifest's `outputs`
    say which notebook made it. Every committed table and figure has one owner, every notebook owns some."""
    names = [p.name for d in ("data/results", "figures") for p in (ROOT / d).glob("*/*")
             if p.name not in ("claims.parquet", "timing", "replot")   # replot/: the snapshots of figures/replot.py
             and not p.name.endswith(".lock")]   # the registry's lock
    owners = {n: manifest.owner(n) for n in names}
    assert not [n for n, o in owners.items() if o is None]
    for f in manifest.FIGURES:
        assert any(o is f for o in owners.values()), f.notebook
    # the scheme by hand: Fig. 7(b) is notebook 06's, Fig. 7(a) notebook 07's, Fig. 14 (beyond the paper) notebook 05's
    assert manifest.owner("fig07b_group_trend.parquet").key == "06"
    assert manifest.owner("fig07a_minibatches.parquet").key == "07"
    assert manifest.owner("fig14_value_gap_strata.png").key == "05"
    assert manifest.owner("fig0_x") is None and manifest.owner("fig051_x") is None


def test_docs_show_the_manifest_table():
    for rel in manifest.DOCS:
        text = (ROOT / rel).read_text()
        assert manifest.with_table(text) == text, f"{rel}: run `python -m cancellation.manifest docs`"
        for f in manifest.FIGURES:
            assert f"| `{f.notebook}.py` | {', '.join(f.panels)} |" in text


def test_gpucheck_reads_its_dry_runs_from_the_manifest():
    # 07 first (the manifest's dry_first), then paper-quick's vLLM notebooks, then the rest (issue 49, item 2)
    assert gpucheck.dry_order() == ["07", "01", "05", "06", "08", "02", "03", "04"]
    assert gpucheck.dry_per_notebook()["06"]["n_prompts"] == 16
    # none measured at paper-quick's dry sizes yet: the stated guess
    assert gpucheck.est_dry("05") == gpucheck.EST["dry"] and gpucheck.est_dry("07") == gpucheck.EST["dry"]


# ----------------------------------------------------------------------------- a new figure: module, notebook, entry
DUMMY_MODULE = '''
"""A dummy figure: the squares of 0..n-1 (tests/test_manifest.py)."""
from dataclasses import dataclass

import pandas as pd

from cancellation import workload as W
from cancellation.figures import base
from cancellation.figures.base import param


@dataclass
class Params(base.FigureParams):
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    max_new_tokens: int = param(8, "tokens per response (the planner reads it)", min=1)
    n: int = param(4, "how many squares", min=1, max=100)


def compute(P: Params) -> pd.DataFrame:
    return pd.DataFrame({"x": range(P.n), "x2": [i * i for i in range(P.n)]})


def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    w = W.Work()
    W.analysis(w, P.n, z, P.chunk_rows)
    return w


def claims(R, P):
    return []
'''

DUMMY_NOTEBOOK = '''# %% tags=["parameters"]
profile = "tiny"
fig_dir = "figures/tiny"
results_dir = "data/results/tiny"
params = {}

# %%
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from dummyfigs import fig99

P = fig99.Params(**params)
df = fig99.compute(P)
Path(results_dir).mkdir(parents=True, exist_ok=True)
df.to_parquet(Path(results_dir) / "fig99_squares.parquet")
fig, ax = plt.subplots()
ax.plot(df.x, df.x2)
Path(fig_dir).mkdir(parents=True, exist_ok=True)
fig.savefig(Path(fig_dir) / "fig99_squares.png")
print("sum of squares", int(df.x2.sum()))
'''


@pytest.fixture
def dummy(tmp_path, monkeypatch):
    """A checkout with one extra figure: its module on the path, its notebook, and one manifest entry."""
    pkg = tmp_path / "pkgs" / "dummyfigs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fig99.py").write_text(textwrap.dedent(DUMMY_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'pkgs'}:{ROOT / 'lib'}")   # the notebook's kernel imports it
    entry = manifest.Figure("99_dummy", "fig99", ("Fig. 99",), ("fig99",), (), "squares",
                            manifest.MappingProxyType({"n": 2}), 30, package="dummyfigs")
    monkeypatch.setattr(manifest, "FIGURES", [*manifest.FIGURES, entry])
    checkout = tmp_path / "checkout"
    (checkout / "notebooks" / "params").mkdir(parents=True)
    (checkout / "notebooks" / "99_dummy.py").write_text(DUMMY_NOTEBOOK)
    (checkout / "notebooks" / "params" / "tiny.yaml").write_text(
        f"99_dummy:\n  n: 5\n  model_path: {ROOT / 'data' / 'policies' / 'tiny-m'}\n")
    yield entry, checkout
    sys.modules.pop("dummyfigs.fig99", None)
    sys.modules.pop("dummyfigs", None)


def test_a_new_figure_needs_only_its_module_notebook_and_manifest_entry(dummy, monkeypatch, capsys):
    entry, checkout = dummy
    # the runner validates the notebook's parameters against the module the manifest names
    nb = checkout / "notebooks" / "99_dummy.py"
    assert profiles.figure_params(nb).__module__ == "dummyfigs.fig99"
    with pytest.raises(profiles.ParameterError, match="'n' = 500: out of range"):
        resolve.resolve_params(nb, "tiny", {"n": 500})
    # the planner counts its workload: 5 rows (the profile's n) through one analysis forward of 8 response tokens each
    params = resolve.resolve_params(nb, "tiny", {"n": 5})
    p = plan.make("99_dummy", params, root=ROOT)
    assert p.work.blocks["analysis"]["head"] == 5 * 8 and p.work.blocks["analysis"]["calls"] == 1
    # gpu-check dry-runs it (no paper-quick section, no dry_first: last), with its own sizes and estimate
    assert gpucheck.dry_order()[-1] == "99"
    assert gpucheck.est_dry("99") == 30 and ("n", "2") == tuple(gpucheck._dry_overrides("99")[-2:])
    # the golden tests know its outputs; the docs list it
    assert manifest.owner("fig99_squares.parquet") is entry
    assert "| `99_dummy.py` | Fig. 99 | `fig99_*` | squares |" in manifest.table_markdown()
    # and the runner runs it end to end in that checkout (papermill, staging, outputs moved into place)
    assert run.main(["99", "--root", str(checkout), "--profile", "tiny", "--cores", "1"]) in (0, None)
    df = pd.read_parquet(checkout / "data" / "results" / "tiny" / "fig99_squares.parquet")
    assert df.x2.tolist() == [i * i for i in range(5)]   # the profile's n = 5 reached the notebook
    assert (checkout / "figures" / "tiny" / "fig99_squares.png").stat().st_size > 0
