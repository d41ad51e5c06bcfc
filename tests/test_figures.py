"""figures/: the library owns each notebook's cached stages, keyed on every argument they read."""
from pathlib import Path

import pytest

from cancellation import coupling, manifest
from cancellation.compute import Compute
from cancellation.figures import base, fig03


def figure_files() -> list[Path]:
    """The figures package's files and every manifest figure's (`figNN.py`, `figNN_*.py` beside its module)."""
    mine = {p for f in manifest.FIGURES for p in Path(f.load().__file__).parent.glob(f"{f.module}*.py")}
    return sorted(mine | set(Path(base.__file__).parent.glob("*.py")))


def _counting(monkeypatch):
    calls = []
    real = coupling.masked_effects_full

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(coupling, "masked_effects_full", spy)
    return calls


@pytest.mark.parametrize("changed", [dict(low_quantile=0.3), dict(lr=0.05), dict(compute=Compute(token_chunk=7))])
def test_fig03_topk_recomputes_when_any_argument_changes(model64, batch, monkeypatch, changed):
    """03's `masked_topk_full` key used to omit low_quantile (it picks the candidates): changing it
    returned the old result. Every argument is in the key now, the Compute config included."""
    f = coupling.features(model64, batch, compute=Compute())
    kw = dict(pools=["nonzero"], n_cands=3, low_quantile=0.5, topk_sizes=[1, 2], topk_full_sizes=[2],
              n_cands_topk_full=1, lr=0.1, n_boot=10, seed=0, inputs=dict(params={"test": f"topk-{sorted(changed)}"}, model="m", source="s"),
              compute=Compute())
    calls = _counting(monkeypatch)
    fig03.topk_table(model64, batch, f, **kw)
    fig03.topk_table(model64, batch, f, **kw)
    assert len(calls) == 1                                   # the same arguments: a cache hit
    fig03.topk_table(model64, batch, f, **{**kw, **changed})
    assert len(calls) == 2                                   # one changed argument: recomputed


def test_results_hold_data_not_display_lines():
    """A figure's Result holds tables and numbers; the lines a notebook prints are written by module functions
    (`fig02.summary(R)`, `fig07.table2_summary(R, P)`), so a wording change recomputes nothing."""
    import dataclasses

    mods = [f.load() for f in manifest.FIGURES]   # every figure (tests/test_manifest.py adds a dummy one)
    assert all(dataclasses.is_dataclass(getattr(m, "Result", None)) for m in mods), [m.__name__ for m in mods]
    found = [f"{m.__name__}.Result.{f.name}" for m in mods
             for f in dataclasses.fields(m.Result) if f.type in ("str", str)]
    assert not found, found


def test_grading_line_only_for_a_graded_file():
    from cancellation import extract
    from cancellation.figures import base
    assert base.with_grading("batch", {"grading": {}}) == "batch"   # the exact arithmetic check: no line
    g = {"mode": extract.FILE_MODE, "graded": 4, "unparsed_response": 1, "unparsed_gold": 0, "errors": 0, "as_words": 0}
    assert base.with_grading("batch", {"grading": g}) == (
        "batch\nmath-verify (answer_mode answer_line+boxed): 4 responses graded (75.0% had an answer); counted as wrong because unparseable: "
        "1 responses, 0 gold answers; 0 errors")


def test_results_are_built_by_keyword():
    """`Result(...)` calls name every field (12-25 positional arguments were unreadable and broke silently)."""
    import ast

    found = [f"{p.name}:{n.lineno}" for p in figure_files()
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Result" and n.args]
    assert not found, found


# ----------------------------------------------------------------------------- plots: the stamp, seaborn panels
def test_stamp_names_the_profile_the_policy_size_and_the_device(tmp_path):
    """Every saved figure carries '<profile> profile: <size>-parameter policy (<name>), <device>', once."""
    from pathlib import Path
    from types import SimpleNamespace

    import matplotlib
    import safetensors.torch as st

    from cancellation import plots
    matplotlib.use("Agg")
    root = Path(__file__).resolve().parents[1]
    n = sum(t.numel() for t in st.load_file(root / "data/policies/tiny-m/model.safetensors").values())
    P = SimpleNamespace(model_path=str(root / "data/policies/tiny-m"), device="cpu")
    assert plots.stamp_text("tiny", P) == f"tiny profile: {n / 1e6:.2f}M-parameter policy (tiny-m), CPU"
    # a paper model by name: its parameter count from the planner's closed form of its shape (no download)
    from cancellation import plan
    big = plan.shape_of("Qwen/Qwen3-1.7B-Base").params
    assert plots.stamp_text("paper", SimpleNamespace(model_path="Qwen/Qwen3-1.7B-Base", device="cuda:0")) == \
        f"paper profile: {plots.size_text(big)}-parameter policy (Qwen3-1.7B-Base), GPU"
    text = plots.use_profile("tiny", P)
    fig, ax = plots.figure()
    plots.save(tmp_path, "a", fig)
    plots.save(tmp_path, "b", fig)
    assert [t.get_text() for t in fig.texts] == [text]
    assert (tmp_path / "a.png").stat().st_size > 0
    plots.plt.close(fig)


def test_bars_draw_the_values_and_our_intervals_not_seaborn_s():
    import matplotlib
    import pandas as pd

    from cancellation import plots
    matplotlib.use("Agg")
    d = pd.DataFrame({"x": ["u", "u", "v", "v"], "h": ["p", "q", "p", "q"], "m": [1.0, 2.0, -1.0, 0.5],
                      "lo": [0.5, 1.0, -3.0, 0.0], "hi": [1.5, 4.0, 0.0, 0.6]})
    fig, ax = plots.figure()
    plots.bars(ax, d, "x", "m", hue="h", lo="lo", hi="hi", order=["u", "v"], hue_order=["p", "q"])
    heights = [[b.get_height() for b in c] for c in ax.containers if hasattr(c, "patches")]
    assert heights == [[1.0, -1.0], [2.0, 0.5]]   # hue p: (u, v); hue q: (u, v)
    ends = sorted(tuple(sorted(seg[:, 1])) for coll in ax.collections for seg in coll.get_segments())
    assert ends == sorted([(0.5, 1.5), (-3.0, 0.0), (1.0, 4.0), (0.0, 0.6)])
    plots.plt.close(fig)


def test_bars_put_each_interval_on_its_own_bar_when_a_level_has_no_bar():
    """A NaN value, a missing row or an empty hue level draws no bar: every interval still sits on the bar of
    its own (level, hue), found by hand from the data."""
    import matplotlib
    import numpy as np
    import pandas as pd

    from cancellation import plots
    matplotlib.use("Agg")
    d = pd.DataFrame({"x": ["u", "u", "v", "v", "w"], "h": ["p", "q", "p", "q", "p"],
                      "m": [1.0, 2.0, np.nan, 3.0, 4.0], "lo": [0.0, 1.0, np.nan, 2.5, 3.0],
                      "hi": [2.0, 2.5, np.nan, 3.5, 6.0]})
    fig, ax = plots.figure()
    plots.bars(ax, d, "x", "m", hue="h", lo="lo", hi="hi", order=["u", "v", "w"], hue_order=["p", "q", "all"])
    bars = {(round(b.get_x() + b.get_width() / 2), b.get_height()): b.get_x() + b.get_width() / 2
            for c in ax.containers if hasattr(c, "patches") for b in c}
    segs = {round(float(seg[0, 0]), 6): tuple(sorted(seg[:, 1])) for coll in ax.collections for seg in coll.get_segments()}
    want = {(0, 1.0): (0.0, 2.0), (0, 2.0): (1.0, 2.5), (1, 3.0): (2.5, 3.5), (2, 4.0): (3.0, 6.0)}
    assert set(bars) == set(want)
    assert {k: segs[round(bars[k], 6)] for k in want} == want
    plots.plt.close(fig)


def test_table2_shown_reads_as_a_table_and_the_prose_follows_the_numbers():
    """Table 2: ticks for QB / RB and whole optimizer steps ('64', not '64.000000'); 07's sentence on sign-pure
    mini-batches says 'smaller' when their gradient norm is below random's (0.169–0.222 vs 0.233)."""
    from types import SimpleNamespace

    import pandas as pd

    from cancellation.figures import fig07, fig07_claims
    t = pd.DataFrame({"strategy": ["random", "RB"], "QB": [False, False], "RB": [False, True],
                      "easy_mean": [50.0, 60.0], "easy_ci95": [1.0, 2.0], "rollouts_sampled": [1024.0, 3993.6],
                      "rollouts_discarded": [None, 10.0], "rollouts_delayed": [None, 5.0],
                      "optimizer_steps": [64.0, 51.5]})
    R = SimpleNamespace(table2=t, cols=["easy"])
    shown = fig07_claims.table2_shown(R)
    assert shown.QB.tolist() == ["", ""] and shown.RB.tolist() == ["", "✓"]
    assert shown["optimizer steps"].tolist() == ["64", "51.5"]
    assert fig07.rollout_ratio(R).round(2).tolist() == [1.0, 3.9]
    gn = pd.DataFrame({"mixed": [0.233, None, 0.3], "one sign": [0.306, 0.222, 0.169]},
                      index=["random", "sign_partitioned", "QB"])
    line = fig07_claims.sign_pure_reading(SimpleNamespace(grad_norm=gn))
    assert "sign_partitioned 0.222 (smaller than random's)" in line and "QB 0.169 (smaller" in line
    assert line.endswith("sign-pure is smaller, not what the cancellation reading expects")
    gn["one sign"] = [0.306, 0.5, 0.4]
    assert fig07_claims.sign_pure_reading(SimpleNamespace(grad_norm=gn)).endswith("larger, as the cancellation reading expects")


def test_fig07_figures_redraw_from_the_committed_tables():
    """fig07.load (make plots' path) rebuilds what Fig. 7(a) and Fig. 8 plot from the committed tables: Table 2's
    final accuracy per set equals the mean over seeds of the committed curves at the last iteration (it is computed
    from them, not read from the rounded CSV); the mini-batches get their composition."""
    from pathlib import Path

    import matplotlib
    import pandas as pd

    from cancellation import plots, profiles, resolve
    from cancellation.figures import fig07, fig07_plots
    matplotlib.use("Agg")
    d = Path(__file__).resolve().parents[1] / "data" / "results" / "tiny"
    curves = pd.read_parquet(d / "fig08_training_curves.parquet")
    params = resolve.resolve_params(profiles.find_notebook("07"), "tiny")   # the profile's P, as the runner's
    P = fig07.Params(**{k: v for k, v in params.items() if k in fig07.Params.defaults()})
    R = fig07.load(d, P)
    final = curves[curves.iteration == curves.iteration.max()].groupby(["strategy", "set"]).accuracy.mean()
    got = R.agg.set_index(["strategy", "set"])["mean"]
    assert (got - final.reindex(got.index)).abs().max() < 1e-12
    t2 = pd.read_csv(d / "table2_batching.csv")   # the committed Table 2: the same numbers, rounded to 3 decimals
    assert (R.table2.set_index("strategy").average_mean - t2.set_index("strategy").average_mean).abs().max() < 1e-3
    mb = R.minibatches
    assert ((mb.composition == "mixed") == ((mb.n_pos > 0) & (mb.n_neg > 0))).all()
    for fig in (fig07_plots.training_curves(R, P.strategies), fig07_plots.sign_partition(R, P.strategies)):
        plots.plt.close(fig)
