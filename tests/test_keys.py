"""stage.py: one key builder, the keys of today's cache kept, and a new knob reaching key, validation and plan.

tests/golden/keys.json pins every (stage, key) the tiny notebooks look up (recorded by `python -m
tests.golden.keys --write` on a warm cache, before the builder moved; `python -m tests.golden.keys`
compares them all, the inner stages included). Here the keys that follow from the profile alone
(each notebook's figure-level stage, 07's runs) are rebuilt from the declarations and must be among them.
"""
import dataclasses
import json
from dataclasses import make_dataclass

import pytest

from cancellation import cache, engine, plan, profiles, resolve, stage, train
from cancellation.figures import base, fig02, fig05, fig07
from cancellation.figures.base import param
from tests.golden import keys as golden

PINNED = json.loads(golden.FILE.read_text())
FIGURE_STAGES = {"01": stage.FIG01_NOISE_FLOOR, "02": stage.FIG02, "03": stage.FIG03, "05": stage.FIG05,
                 "06": stage.FIG06, "08": stage.FIG12}


def _params(stem: str, profile: str = "tiny", overrides=None):
    nb = next(p for p in profiles.all_notebooks() if p.stem.startswith(stem))
    mod = golden.importlib.import_module(f"cancellation.figures.fig{stem}")
    values = resolve.resolve_params(nb, profile, overrides)
    return mod, mod.Params(**{k: v for k, v in values.items() if k not in profiles.INJECTED})


def _pinned(stem: str, st: stage.Stage) -> list:
    return PINNED[f"{stem}/warm"][st.name]["keys"]


@pytest.mark.parametrize("stem", sorted(FIGURE_STAGES))
def test_figure_stage_keys_as_pinned(stem):
    mod, P = _params(stem)
    source = base.problem_source(P)
    st = FIGURE_STAGES[stem]
    extra = {}
    if st is stage.FIG05:
        extra = dict(categories=fig05.category_fingerprint(P.category_map),
                     tagger_used=fig05.categories.Categorizer(P.category_map or None, tagger=P.tagger).tagger)
    assert st.key(**base.inputs(P, source), **extra) in _pinned(stem, st)


def test_batching_run_keys_as_pinned():
    """07's small-trainer runs, TRL runs and Eq. 14: every key the notebook asks for, rebuilt from the profile."""
    _, P = _params("07")
    source = base.problem_source(P)
    jobs = ([(n, s, P.lr) for n in P.strategies for s in P.seeds]
            + [(n, s, r) for r in P.probe_lrs for n in P.probe_strategies for s in P.probe_seeds]
            + [(n, s, P.lr, P.iterations) for n in P.budget_strategies for s in P.seeds])
    want = {stage.TRAIN_RUN.key(**train._train_inputs(P.model_path, fig07._config(P, source, *j), P.dtype, P.device,
                                                       P.threads)) for j in jobs}
    assert golden.summary({"train_run": sorted(want)})["train_run"] == PINNED["07/warm"]["train_run"]
    if P.trl_strategies:
        trl = {stage.TRAIN_TRL.key(**engine.run_inputs(fig07.trl_setup(P), *fig07._trl_job(P, source, n, s, P.lr)))
               for n in P.trl_strategies for s in P.trl_seeds}
        assert trl <= set(_pinned("07", stage.TRAIN_TRL))
    if P.imbalance_plans:
        assert stage.LOCAL_IMBALANCE.key(**fig07._imbalance_inputs(P, source)[0]) in _pinned("07", stage.LOCAL_IMBALANCE)


def test_one_registry():
    """Every stage is declared once, in stage.py; the versions are the ones the cache's keys hold."""
    assert len(stage.STAGES) == len({s.name for s in stage.STAGES.values()})
    assert {n: (s.version_field, s.version) for n, s in stage.STAGES.items() if s.version} == {
        "fig01_noise_floor": ("revision", 1), "fig02": ("revision", 3), "fig03": ("effects_columns", 5),
        "fig05": ("revision", 4), "fig06": ("revision", 3), "category_shift": ("revision", 1), "fig12": ("revision", 4), "train_trl": ("record", "steps"), "local_imbalance": ("shared", 2),
        "masked_topk_full": ("revision", 2)}


def test_stage_checks_its_inputs_and_versions():
    st = stage.Stage("demo", ("**params", "model", "extra?"), version=2)
    p = st.params(params={"a": 1}, model="m")
    assert p == {"a": 1, "model": "m", "revision": 2}
    assert st.params(params={"a": 1}, model="m", extra=None) == p            # an optional input at None: left out
    assert st.params(params={"a": 1}, model="m", extra=3)["extra"] == 3
    assert st.key(params={"a": 1}, model="m") == cache.key("demo", p)
    with pytest.raises(TypeError, match="undeclared: other"):
        st.params(params={}, model="m", other=1)
    with pytest.raises(TypeError, match="missing: model"):
        st.params(params={})
    assert st.params(params={"model": 1}, model="m")["model"] == "m"     # a named input overrides a merged field
    with pytest.raises(ValueError, match="'revision' comes from two inputs"):
        st.params(params={"revision": 1}, model="m")
    bumped = dataclasses.replace(st, version=3)
    assert bumped.key(params={"a": 1}, model="m") != st.key(params={"a": 1}, model="m")
    with pytest.raises(TypeError, match="without cache_params"):
        stage.canonical(make_dataclass("Bare", [("x", int)])(1))


def test_a_new_knob_reaches_key_validation_and_plan(monkeypatch):
    """Issue 34's 'Done when': a knob is one field on a Params; the cache key, the runner's validation and the
    planner follow without another edit."""
    Knob = make_dataclass("Params", [("knob", int, param(3, "a new knob", min=1))], bases=(fig02.Params,))
    Knob.__module__ = fig02.__name__
    stem = "02_coupling_heatmaps"
    _, P0 = _params("02")
    source = base.problem_source(P0)
    old = stage.FIG02.key(**base.inputs(P0, source))
    original = fig02.Params

    monkeypatch.setattr(fig02, "Params", Knob)
    monkeypatch.setattr(profiles, "_DEFAULTS", {})      # the runner's defaults are read from the (new) Params
    # the key: every field, the new one included
    P3, P4 = Knob(**dataclasses.asdict(P0)), Knob(**dataclasses.asdict(P0), knob=4)
    k3, k4 = (stage.FIG02.key(**base.inputs(P, source)) for P in (P3, P4))
    assert len({old, k3, k4}) == 3
    assert stage.FIG02.params(**base.inputs(P4, source))["knob"] == 4
    # validation: the rule declared beside the field, for profiles and -p alike
    assert resolve.resolve_params(profiles.find_notebook("02"), "tiny", {"knob": 5})["knob"] == 5
    with pytest.raises(profiles.ParameterError, match=r"'knob' = 0.*1"):
        resolve.resolve_params(profiles.find_notebook("02"), "tiny", {"knob": 0})
    assert "a new knob" in Knob.docs()["knob"]
    # the planner: plans the new Params as it is (the workload reads what it needs)
    values = resolve.resolve_params(profiles.find_notebook("02"), "tiny", {"knob": 7})
    p_new = plan.make(stem, values)
    monkeypatch.setattr(fig02, "Params", original)
    assert p_new.work is not None and p_new.work.blocks == plan.make(stem, {k: v for k, v in values.items()
                                                                              if k != "knob"}).work.blocks


def test_stages_tiny_never_looks_up_hold_the_keys_they_had():
    """initial_eval, gold_check, train_trl with token_chunk binding, and the canonical forms, against the dicts
    the code built by hand before stage.py (the tiny profile's warm and deep runs never reach these)."""
    from cancellation import rollout, sources, value
    cfg = train.TrainConfig(eval_sets=["easy"], seed=3)
    assert stage.DELTA_RUN.params(model="m", dtype="float64", device="cpu", run=cfg) == dict(
        model="m", dtype="float64", device="cpu", **train.run_params(cfg))
    assert stage.TRAIN_RUN.params(model="m", dtype="float32", device="cpu", threads=1, run=cfg) == dict(
        model="m", dtype="float32", device="cpu", threads=1, **train.run_params(cfg))
    src = sources.ProblemSource()
    ev = dict(model="m", dtype="float32", device="cpu", threads=1, sets=["easy"], n=64, samples=1, temperature=1.0,
              max_new_tokens=96, files=None)
    assert stage.INITIAL_EVAL.params(**ev, source=src) == dict(ev, source=src.params())
    assert stage.GOLD_CHECK.params(fingerprint="f", grader="g") == dict(fingerprint="f", grader="g")
    trl = dict(model="m", dtype="float32", device="cpu", engine="trl", strategy="QB",
               **{k: v for k, v in train.run_params(cfg).items() if k != "plan"})
    assert stage.TRAIN_TRL.params(model="m", dtype="float32", device="cpu", strategy="QB", run=cfg,
                                  trl_micro_rows=None) == dict(trl, record="steps")
    assert stage.TRAIN_TRL.params(model="m", dtype="float32", device="cpu", strategy="QB", run=cfg,
                                  trl_micro_rows=5) == dict(trl, trl_micro_rows=5, record="steps")
    r, vc = value.Request(prompt=(1, 2), response=(3,), ban=None, group=0), value.ValueConfig(M=4)
    assert value._cache_params("m", r, vc, "7", "exact", [1], "cpu") == dict(
        model="m", prompt=[1, 2], response=[3], ban=None, M=4, seed=0, temperature=1.0, max_new_tokens=96,
        backend=vc.backend, answer="7", verifier="exact", stops=[1], device="cpu")
    scfg = rollout.SampleConfig(n_prompts=2, G=2)
    assert stage.canonical(scfg) == rollout.config_params(scfg)
    before = {k: v for k, v in dataclasses.asdict(fig07.Params().compute()).items() if k != "trim_padding"}
    assert stage.canonical(fig07.Params().compute()) == before   # a knob added later: keyless at its default


def test_trim_padding_enters_a_key_only_when_on():
    """trim_padding (added after every cache entry was written) leaves each key as it was while off, and
    moves the keys of a figure, a Compute input and a run when on (other round-off: another entry)."""
    from cancellation.figures import fig01
    off, on = fig01.Params(), fig01.Params(trim_padding=True)
    assert "trim_padding" not in off.cache_params() and on.cache_params()["trim_padding"] is True
    assert "trim_padding" not in stage.canonical(off.compute()) and stage.canonical(on.compute())["trim_padding"]
    run_off = train.TrainConfig(update=off.compute().update(lr=1e-3))
    run_on = train.TrainConfig(update=on.compute().update(lr=1e-3))
    assert "trim_padding" not in train.run_params(run_off)["update"]
    assert train.run_params(run_on)["update"]["trim_padding"] is True
    kw = dict(model="m", dtype="float32", device="cpu", threads=1)
    assert stage.TRAIN_RUN.key(**kw, run=run_off) != stage.TRAIN_RUN.key(**kw, run=run_on)
