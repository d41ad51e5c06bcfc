"""The figure manifest is the one place a figure is declared: everything that lists notebooks agrees with
it, and a new figure reaches the runner, the planner, gpu-check, the golden tests and the docs through one
new module, its notebook and one manifest entry (a dummy figure is added that way below)."""
import re
import types
import sys
from pathlib import Path

import pandas as pd
import pytest

import test_figures
import test_gpucheck
import test_paper_smoke
import test_run
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
        assert profiles.figure_params(profiles.find_notebook(f.notebook)) is mod.Params


def _sibling(f, suffix):
    try:
        return manifest.importlib.import_module(f"{f.package}.{f.module}_{suffix}")
    except ModuleNotFoundError:
        return None


def _stages_in(src: str) -> set:
    by_const = {k: v for k, v in vars(stage).items() if isinstance(v, stage.Stage)}
    return {by_const[c].name for c in re.findall(r"\bstage\.([A-Z][A-Z0-9_]*)\b", src) if c in by_const}


def _reached(mod) -> str:
    """The source of the library modules and packages a figure module imports (a package: every file of it, as 07's
    TRL runs are cached in engine/runs.py)."""
    out = []
    for m in {id(v): v for v in vars(mod).values() if isinstance(v, types.ModuleType)}.values():
        if not m.__name__.startswith("cancellation.") or m is mod:
            continue
        files = Path(m.__file__).parent.glob("*.py") if hasattr(m, "__path__") else [Path(m.__file__)]
        out += [p.read_text() for p in files]
    return "".join(out)


def test_declared_stages_are_the_ones_the_module_uses():
    """Every stage a figure's files (`figNN.py`, `figNN_*.py`) name as `stage.X` is one of its manifest stages, and
    every manifest stage is named there or in a library module the figure imports (07's TRL runs: engine/runs.py)."""
    for f in manifest.FIGURES:
        mod = f.load()
        used = _stages_in("".join(p.read_text() for p in Path(mod.__file__).parent.glob(f"{f.module}*.py")))
        assert used <= set(f.stages), (f.notebook, used, f.stages)
        assert set(f.stages) <= used | _stages_in(_reached(mod)), (f.notebook, used, f.stages)


def outputs(root: Path) -> list[str]:
    """The names of the tables and figures under a checkout's data/results/<profile>/ and figures/<profile>/."""
    return [p.name for d in ("data/results", "figures") for p in (root / d).glob("*/*")
            if p.name not in ("claims.parquet", "timing", "replot")   # replot/: the snapshots of figures/replot.py
            and not p.name.endswith(".lock")]   # the registry's lock


def test_every_committed_output_has_exactly_one_notebook():
    """The naming scheme: a file starts with the paper number of what it shows; the manifest's `outputs`
    say which notebook made it. Every committed table and figure has one owner, every notebook owns some."""
    owners = {n: manifest.owner(n) for n in outputs(ROOT)}
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
DUMMY_MODULE = """
\"\"\"A dummy figure in a real one's shape: the squares of 0..n-1 (tests/test_manifest.py).\"\"\"
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cancellation import cache
from cancellation import claims as C
from cancellation import workload as W
from cancellation.figures import base, replot
from cancellation.figures.base import param

TABLE = "fig99_squares.parquet"


@dataclass
class Params(base.FigureParams):
    \"\"\"The dummy's parameters.\"\"\"
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    max_new_tokens: int = param(8, "tokens per response (the planner reads it)", min=1)
    n_prompts: int = param(4, "prompts (gpu-check's dry runs set it on every figure)", min=1)
    n: int = param(4, "how many squares", min=1, max=100)


@dataclass
class Result:
    squares: pd.DataFrame

    def write(self, results_dir, P: Params) -> None:
        cache.write_table(self.squares, Path(results_dir) / TABLE)
        replot.save(results_dir, P)   # the parameters the table was computed with (a replot checks them)


def load(results_dir, P: Params) -> Result:
    replot.restore(results_dir, P)
    return Result(squares=replot.table(results_dir, TABLE))


def compute(P: Params) -> Result:
    base.pin_threads(P)
    return Result(squares=pd.DataFrame({"x": range(P.n), "x2": [i * i for i in range(P.n)]}))


def summary(R: Result) -> str:
    return f"sum of squares {int(R.squares.x2.sum())}"


def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    w = W.Work()
    W.analysis(w, P.n, z, P.chunk_rows)
    return w


def claims(R: Result, P: Params) -> list:
    return [C.Claim("fig99_sum", "Fig. 99", "the squares sum to something positive", "yes", R.squares.x2.sum(),
                    n=P.n, unit="sum", rule="construction", params=dict(sign=1, point_ok=True, why="squares"),
                    estimator="point (every row)", resampling="none")]
"""

DUMMY_NOTEBOOK = """# %% tags=["parameters"]
profile = "tiny"
fig_dir = "figures/tiny"
results_dir = "data/results/tiny"
replot = ""
params = {}

# %%
from cancellation import claims, plots
from dummyfigs import fig99

P = fig99.Params(**params)
plots.use_profile(profile, P)
if replot:
    R = fig99.load(replot, P)
else:
    R = fig99.compute(P)
    R.write(results_dir, P)
print(fig99.summary(R))

# %%
fig, ax = plots.figure()
ax.plot(R.squares.x, R.squares.x2)
plots.save(fig_dir, "fig99_squares", fig)

# %%
claims.record(results_dir, "99", fig99.claims(R, P))
"""



# The dummy's one manifest entry, declared in its package: the test's process and the notebook's kernel both import
# it (a real figure's entry is in manifest.py, which both import too; the kernel's Params name their notebook by it).
DUMMY_PACKAGE = """from cancellation import manifest

ENTRY = manifest.Figure("99_dummy", "fig99", ("Fig. 99",), ("fig99",), (), "squares",
                        manifest.MappingProxyType({"n": 2}), 30, package="dummyfigs")
if not any(f.notebook == ENTRY.notebook for f in manifest.FIGURES):
    manifest.FIGURES = [*manifest.FIGURES, ENTRY]
"""

INPUTS = ("policies", "shapes", "standins", "categories")   # data/ the profiles and gpu-check's dry runs read


@pytest.fixture
def dummy(tmp_path, monkeypatch):
    """A checkout with one extra figure and nothing else edited: its module (on the path, outside the package),
    its notebook, one manifest entry. No profile section, no stage, no golden file: the checkout's other
    notebooks, the profiles and the input data are the repository's (links), and profiles.HERE points at it,
    so every figure-wide check below sees nine figures."""
    pkg = tmp_path / "pkgs" / "dummyfigs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(DUMMY_PACKAGE)   # the notebook's kernel sees the entry too (as manifest.py's)
    (pkg / "fig99.py").write_text(DUMMY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path / 'pkgs'}:{ROOT / 'lib'}")   # the notebook's kernel imports it
    monkeypatch.setattr(manifest, "FIGURES", list(manifest.FIGURES))   # the package adds its entry; undone after
    entry = manifest.importlib.import_module("dummyfigs").ENTRY
    checkout = tmp_path / "checkout"
    (checkout / "notebooks" / "params").mkdir(parents=True)
    (checkout / "data").mkdir()
    for nb in profiles.all_notebooks():
        (checkout / "notebooks" / nb.name).symlink_to(nb)
    for prof in profiles.HERE.params.glob("*.yaml"):
        (checkout / "notebooks" / "params" / prof.name).symlink_to(prof)
    for d in INPUTS:
        (checkout / "data" / d).symlink_to(ROOT / "data" / d)
    (checkout / "notebooks" / "99_dummy.py").write_text(DUMMY_NOTEBOOK)
    monkeypatch.setattr(profiles, "HERE", profiles.Checkout.of(checkout))
    yield entry, checkout
    sys.modules.pop("dummyfigs.fig99", None)
    sys.modules.pop("dummyfigs", None)


def test_a_new_figure_needs_only_its_module_notebook_and_manifest_entry(dummy, capsys):
    """The dummy goes through every figure-wide check (the same functions the suite runs on the eight), the
    runner, the planner, gpu-check's dry-run parameters, a run and a replot, from its three pieces alone."""
    entry, checkout = dummy
    # the runner validates the notebook's parameters against the module the manifest names
    nb = checkout / "notebooks" / "99_dummy.py"
    assert profiles.find_notebook("99") == nb and profiles.figure_params(nb).__module__ == "dummyfigs.fig99"
    with pytest.raises(profiles.ParameterError, match="'n' = 500: out of range"):
        resolve.resolve_params(nb, "tiny", {"n": 500})
    # the figure-wide checks, on all nine: the manifest's entry checks, every Result and module, every profile
    # (no section of its own in any: the defaults and `common` apply), gpu-check's dry-run parameters
    test_every_notebook_is_in_the_manifest_in_order()
    test_every_module_has_what_the_runner_and_planner_read()
    test_declared_stages_are_the_ones_the_module_uses()
    test_figures.test_results_hold_data_not_display_lines()
    test_figures.test_results_are_built_by_keyword()
    assert checkout.parent / "pkgs" / "dummyfigs" / "fig99.py" in test_figures.figure_files()
    test_run.test_every_profile_section_passes_the_schema()
    test_run.test_every_parameter_has_a_doc_and_a_rule_where_one_applies()
    for prof in (test_paper_smoke.SMOKE, test_paper_smoke.VOCAB):
        test_paper_smoke.test_stand_in_profiles_mirror_paper_key_for_key(prof)
    test_paper_smoke.test_every_paper_parameter_is_declared_by_a_notebook()
    gpucheck.standin_data()
    test_gpucheck.check_dry_run_params(entry)
    # the planner counts its workload: 5 rows through one analysis forward of 8 response tokens each
    params = resolve.resolve_params(nb, "tiny", {"n": 5})
    p = plan.make("99_dummy", params, root=ROOT)
    assert p.work.blocks["analysis"]["head"] == 5 * 8 and p.work.blocks["analysis"]["calls"] == 1
    # gpu-check dry-runs it (no paper-quick section, no dry_first: last), with its own sizes and estimate
    assert gpucheck.dry_order()[-1] == "99"
    assert gpucheck.est_dry("99") == 30 and ("n", "2") == tuple(gpucheck._dry_overrides("99")[-2:])
    # the docs list it
    assert "| `99_dummy.py` | Fig. 99 | `fig99_*` | squares |" in manifest.table_markdown()
    # the runner runs it end to end in that checkout (papermill, staging, outputs moved into place) ...
    argv = ["99", "--root", str(checkout), "--profile", "tiny", "--cores", "1", "-p", "n", "5", "--replace"]
    assert run.main(argv) in (0, None)
    res = checkout / "data" / "results" / "tiny"
    df = pd.read_parquet(res / "fig99_squares.parquet")
    assert df.x2.tolist() == [i * i for i in range(5)]   # -p n 5 reached the notebook
    assert (checkout / "figures" / "tiny" / "fig99_squares.png").stat().st_size > 0
    # ... its files are its own (the naming scheme; the golden tests read them this way), its claim is recorded
    assert outputs(checkout) and all(manifest.owner(n) is entry for n in outputs(checkout))
    rows = pd.read_parquet(res / "claims.parquet")
    assert rows.set_index("claim").loc["fig99_sum"].notebook == "99"
    # ... and `make plots` redraws it from its tables, computing nothing and recording the same claim rows
    table = (res / "fig99_squares.parquet").read_bytes()
    assert run.main([*argv, "--replot"]) in (0, None)
    assert (res / "fig99_squares.parquet").read_bytes() == table
    pd.testing.assert_frame_equal(pd.read_parquet(res / "claims.parquet"), rows)
