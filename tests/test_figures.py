"""figures/: the library owns each notebook's cached stages, keyed on every argument they read."""
import pytest

from cancellation import coupling
from cancellation.compute import Compute
from cancellation.figures import fig03


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

    from cancellation.figures import fig01, fig02, fig04, fig05, fig06, fig07, fig08
    found = [f"{m.__name__}.Result.{f.name}" for m in (fig01, fig02, fig03, fig04, fig05, fig06, fig07, fig08)
             for f in dataclasses.fields(m.Result) if f.type in ("str", str)]
    assert not found, found


def test_grading_line_only_for_a_graded_file():
    from cancellation import tasks
    from cancellation.figures import base
    assert base.with_grading("batch", {"grading": {}}) == "batch"   # the exact arithmetic check: no line
    g = {"mode": tasks.FILE_MODE, "graded": 4, "unparsed_response": 1, "unparsed_gold": 0, "errors": 0, "as_words": 0}
    assert base.with_grading("batch", {"grading": g}) == (
        "batch\nmath-verify (answer_mode answer_line+boxed): 4 responses graded (75.0% had an answer); counted as wrong because unparseable: "
        "1 responses, 0 gold answers; 0 errors")


def test_results_are_built_by_keyword():
    """`Result(...)` calls name every field (12-25 positional arguments were unreadable and broke silently)."""
    import ast
    from pathlib import Path

    import cancellation
    found = [f"{p.name}:{n.lineno}" for p in sorted((Path(cancellation.__file__).parent / "figures").glob("*.py"))
             for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Result" and n.args]
    assert not found, found
