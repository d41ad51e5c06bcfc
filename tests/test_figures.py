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
    f = coupling.features(model64, batch)
    kw = dict(pools=["nonzero"], n_cands=3, low_quantile=0.5, topk_sizes=[1, 2], topk_full_sizes=[2],
              n_cands_topk_full=1, lr=0.1, n_boot=10, seed=0, inputs=dict(params={"test": f"topk-{sorted(changed)}"}, model="m", source="s"),
              compute=Compute())
    calls = _counting(monkeypatch)
    fig03.topk_table(model64, batch, f, **kw)
    fig03.topk_table(model64, batch, f, **kw)
    assert len(calls) == 1                                   # the same arguments: a cache hit
    fig03.topk_table(model64, batch, f, **{**kw, **changed})
    assert len(calls) == 2                                   # one changed argument: recomputed
