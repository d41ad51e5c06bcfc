"""One strategy registry (cancellation.strategies): every reader (the small trainer, TRL, notebook 07's tables,
figures, Eq. 14 and planner) reads it, holds exactly the values it held when each kept its own copy, and a
strategy added to the registry alone reaches all of them."""
import dataclasses
import re
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from cancellation import batching, engine, grpo, plots, rollout, sources, strategies, train
from cancellation.compute import Compute
from cancellation.engine import data
from cancellation.figures import base, fig07, fig07_claims
from cancellation.plan import shape_of
from cancellation.workload import Sizes

LIB = Path(strategies.__file__).parent
OLD_SMALL = {"random": ("random", False), "QB": ("query_preserved", False), "RB": ("random", True),
             "QB+RB": ("query_preserved", True), "sign_partitioned": ("sign_partitioned", False),
             "random+filter": ("random_filter", False), "DS": ("random", False)}
# fig07.COLORS before the registry carried colours: plots.PALETTE zipped by position
OLD_COLORS = dict(zip(OLD_SMALL, [plots.PALETTE[i] for i in (7, 0, 4, 2, 1, 5, 3)]))
OLD_IMBALANCE_PLANS = {"random": "random", "QB": "query_preserved", "sign_partitioned": "sign_partitioned"}

# the 8th strategy of these tests: QB's plan behind DAPO's dynamic-sampling buffer, entered in the registry only
NEW = "QB+DS"
NEW_ENTRY = strategies.Strategy("query_preserved", "#999999", "query-preserved mini-batches of the DS buffer's "
                                "batches (a test entry)", dynamic_sampling=True, table2=False)


@pytest.fixture
def eighth(monkeypatch):
    monkeypatch.setitem(strategies.STRATEGIES, NEW, NEW_ENTRY)
    return NEW


def test_every_view_reads_the_registry_and_holds_the_old_values():
    assert dict(strategies.plans("small")) == OLD_SMALL and list(strategies.plans("small")) == list(OLD_SMALL)
    assert data.STRATEGIES == {k: v for k, v in OLD_SMALL.items() if k != "random+filter"}
    assert fig07.STRATEGY_NAMES == ["random", "QB", "RB", "QB+RB", "sign_partitioned"]
    assert fig07.STRATEGY_CHOICES == fig07.STRATEGY_NAMES + ["random+filter", "DS"]
    assert fig07.SMALL_ONLY == ["random+filter"] and strategies.STRATEGIES["DS"].dynamic_sampling
    assert fig07.Params().strategies == fig07.STRATEGY_NAMES   # the cache key's default rows
    assert dict(fig07.COLORS) == OLD_COLORS                     # the figures keep their colours
    assert strategies.local_imbalance_plans() == OLD_IMBALANCE_PLANS   # Eq. 14's cache key
    assert list(strategies.local_imbalance_plans()) == list(OLD_IMBALANCE_PLANS)
    for name, s in strategies.STRATEGIES.items():   # the flags say what the plan names said
        assert s.query_preserved == (s.plan == "query_preserved") and s.filtered == (s.plan == "random_filter")
        assert s.buffered == (s.reward_balanced or s.dynamic_sampling) and ("RB" in name) == s.reward_balanced


def test_every_plan_is_a_batching_plan():
    assert all(s.plan in batching.PLANS and s.doc and matplotlib.colors.is_color_like(s.color)
               for s in strategies.STRATEGIES.values())
    assert strategies.WHOLE_QUERY_PLANS | strategies.FILTERING_PLANS <= set(batching.PLANS)
    assert len(set(fig07.COLORS.values())) == len(strategies.STRATEGIES)   # one colour each


def test_lookup_names_what_an_engine_runs():
    assert strategies.lookup("QB+RB", "trl") is strategies.STRATEGIES["QB+RB"]
    with pytest.raises(ValueError, match="'random\\+filter' for engine 'trl'; allowed: random, QB"):
        strategies.lookup("random+filter", "trl")
    with pytest.raises(ValueError, match="unknown batching strategy 'QB-RB'"):
        train.strategy_config("QB-RB")
    with pytest.raises(ValueError, match="engine='vllm'"):
        strategies.plans("vllm")
    with pytest.raises(ValueError, match="choose one"):
        strategies.Strategy("random", "#000000", "both release rules", reward_balanced=True, dynamic_sampling=True)


def test_no_reader_special_cases_a_strategy_or_plan_by_name():
    """The strings that name a plan's traits are compared in the registry only: nowhere else does a module ask
    `plan == "query_preserved"` / `"random_filter"` or `"RB" in name`, nor zip colours by position."""
    pattern = re.compile(r'[=!]=\s*"(query_preserved|random_filter)"|"RB" in (s|name)\b|PALETTE\[i\] for i in')
    hits = [f"{p.relative_to(LIB)}:{i}" for p in LIB.rglob("*.py") if p.name != "strategies.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_one_declared_default_for_gpu_memory_utilization():
    want = rollout.GPU_MEMORY_UTILIZATION
    assert want == 0.3 == Compute().gpu_memory_utilization
    assert rollout.SampleConfig().gpu_memory_utilization == train.TrainConfig().gpu_memory_utilization == want
    assert train.RunConfig().gpu_memory_utilization == fig07.Params().gpu_memory_utilization == want
    assert base.gpu_memory_utilization().default == want
    literal = re.compile(r"gpu_memory_utilization\w*\s*[:=].*\b0\.\d", re.I)   # a default written as a number
    declared = {str(p.relative_to(LIB)) for p in LIB.rglob("*.py") if literal.search(p.read_text())}
    # rollout: the declaration; Compute's field and sampler.make_sampler's fallback are outside this change
    assert "rollout.py" in declared and declared <= {"rollout.py", "compute.py", "sampler.py"}


def _old_config(P, source, name, seed, lr, run_rounds=None):
    """fig07._config before it passed Params whole: every field copied by hand."""
    return train.strategy_config(
        name, iterations=P.iterations, n_prompts=P.n_prompts, G=P.G, temperature=P.temperature,
        max_new_tokens=P.max_new_tokens, tau=P.tau, max_rounds=P.max_rounds, max_age=P.max_age,
        run_rounds=P.run_rounds if run_rounds is None else run_rounds, eval_every=P.eval_every,
        eval_sets=list(P.eval_sets), eval_n=P.eval_n, eval_samples=P.eval_samples, eval_temperature=P.eval_temperature,
        seed=seed, source=source, backend=P.backend, sample_dtype=P.sample_dtype,
        gpu_memory_utilization=P.gpu_memory_utilization,
        update=P.compute().update(optimizer="adam", lr=lr, n_minibatches=P.n_minibatches))


@pytest.mark.parametrize("over", [{}, dict(iterations=2, n_prompts=2, G=4, n_minibatches=2, tau=0.25, max_rounds=2,
                                           run_rounds=8, eval_every=1, eval_n=8, max_new_tokens=80,
                                           eval_sets=["easy", "hard"], sample_dtype="bfloat16", backend="vllm")])
def test_params_passed_whole_give_the_hand_copied_config(over):
    P, source = fig07.Params(**over), sources.ProblemSource()
    for name in strategies.STRATEGIES:
        for extra in ((), (P.iterations,)):
            new, old = fig07._config(P, source, name, 1, 2e-4, *extra), _old_config(P, source, name, 1, 2e-4, *extra)
            assert new == old and train.run_params(new) == train.run_params(old)
            assert new.eval_sets is not P.eval_sets   # a copy: the run never aliases the notebook's list
    run = fig07._config(P, source, "QB+RB", 1, 2e-4)
    assert engine.trl_arguments(run) == dict(
        iterations=P.iterations, n_prompts=P.n_prompts, G=P.G, n_minibatches=P.n_minibatches, lr=2e-4,
        max_new_tokens=P.max_new_tokens, temperature=P.temperature, tau=P.tau, max_rounds=P.max_rounds,
        max_age=P.max_age, seed=1, use_vllm=P.backend == "vllm", eval_every=P.eval_every)


def test_run_sample_config_equals_the_hand_built_one():
    upd = grpo.UpdateConfig(token_chunk=512)
    for cfg in (train.TrainConfig(n_prompts=3, G=5, temperature=0.7, max_new_tokens=40, seed=9, backend="vllm",
                                  gpu_memory_utilization=0.5, update=upd),
                train.RunConfig(n_prompts=2, G=3, seed=4, sample_rows=64, update=upd)):
        old = rollout.SampleConfig(n_prompts=cfg.n_prompts, G=cfg.G, temperature=cfg.temperature,
                                   max_new_tokens=cfg.max_new_tokens, backend=cfg.backend, device="cpu",
                                   dtype="float64", seed=cfg.seed, source=cfg.source,
                                   gpu_memory_utilization=cfg.gpu_memory_utilization,
                                   token_chunk=cfg.update.token_chunk, chunk_size=getattr(cfg, "sample_rows", 256))
        new = dataclasses.replace(cfg, sample_dtype="float64").sample_config()
        assert new == old


# --------------------------------------------------------------------------- an 8th strategy, registered only
def test_an_eighth_strategy_reaches_every_view(eighth):
    assert fig07.COLORS[eighth] == "#999999" and list(fig07.COLORS)[-1] == eighth
    assert strategies.plans("small")[eighth] == ("query_preserved", False)
    assert data.STRATEGIES[eighth] == ("query_preserved", False)          # TRL's view (trl=True)
    assert strategies.lookup(eighth, "trl") is NEW_ENTRY                  # BatchingGRPOTrainer's plan choice
    cfg = train.strategy_config(eighth)                                   # the small trainer's plan choice
    assert (cfg.plan, cfg.reward_balanced, cfg.dynamic_sampling, cfg.query_preserved) == \
        ("query_preserved", False, True, True)
    assert cfg.label == "query_preserved+DS"
    assert strategies.local_imbalance_plans() == OLD_IMBALANCE_PLANS      # not one of Eq. 14's plans
    P = fig07.Params(strategies=["random", eighth], trl_strategies=[eighth])
    assert all(check(**{k: getattr(P, k) for k in check.__code__.co_varnames[:check.__code__.co_argcount]})
               for check, _ in fig07.Params.CONSTRAINTS)
    w = fig07.workload(P, shape_of(P.model_path), Sizes(30, 40, P.max_new_tokens))   # the planner reads its flags:
    assert "RB: about two sampling rounds per iteration" not in w.notes                # not RB
    assert "1 TRL cross-check runs (workload.trl_run)" in w.notes


def test_an_eighth_strategy_trains_and_fills_notebook_07s_tables_and_figures(eighth, monkeypatch):
    """fig07.compute on a one-seed, two-iteration micro profile with the 8th strategy beside random (the small
    trainer in this process, no sweep, no TRL, no Eq. 14): its run takes QB's plan behind the DS buffer, releasing
    whole groups, and Table 2, its displayed form, the summaries, the claims' helpers and the figures' colours
    take it. Notebook 07 itself is not run."""
    made, init = [], batching.RewardBalancedBuffer.__init__

    def recording(self, *a, **kw):   # the class stays the one a checkpoint pickles by name
        init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(batching.RewardBalancedBuffer, "__init__", recording)
    P = fig07.Params(strategies=["random", eighth], seeds=[0], iterations=2, n_prompts=2, G=4, n_minibatches=2,
                     max_new_tokens=80, eval_sets=["easy"], eval_n=8, eval_every=1, probe_strategies=[],
                     trl_strategies=[], imbalance_plans=0, max_rounds=2, run_rounds=8)
    R = fig07.compute(P)
    assert [(b.query_preserved, b.mixed_groups) for b in made] == [(True, True)]   # the 8th run's buffer only
    t2 = R.table2.set_index("strategy")
    assert list(t2.index) == ["random", eighth]
    assert t2.loc[eighth, ["QB", "RB"]].tolist() == [True, False]
    shown = fig07_claims.table2_shown(R).set_index("strategy")
    assert shown.loc[eighth, "rollouts (sampled / discarded / delayed)"].count("/") == 2   # a buffered row
    assert eighth in fig07_claims.versus_random(R, P) and fig07_claims.table2_summary(R, P)
    assert fig07_claims._fewer_steps_cause(eighth, P).startswith("the whole-run sampling budget")
    assert eighth in fig07_claims.nonzero_share(R.iters).index
    matplotlib.use("Agg")
    fig, ax = plots.figure()
    for name in P.strategies:   # as notebook 07's plot helpers colour a strategy's line and band
        c = R.curves[(R.curves.strategy == name) & (R.curves.set == "average")].groupby("iteration").accuracy.mean()
        ax.plot(c.index, c.values, color=fig07.COLORS[name], label=name)
        ax.fill_between(c.index, c - 0.01, c + 0.01, color=fig07.COLORS[name], alpha=0.15)
    assert [line.get_color() for line in ax.get_lines()] == [fig07.COLORS["random"], "#999999"]
    assert isinstance(R.final_avg, pd.DataFrame) and eighth in R.final_avg
    plots.plt.close(fig)
