"""One strategy registry (cancellation.strategies): the small trainer's, TRL's and notebook 07's views of it
hold exactly the values they held when each kept its own copy."""
from cancellation import batching, strategies, train
from cancellation.engine import data
from cancellation.figures import fig07

OLD_SMALL = {"random": ("random", False), "QB": ("query_preserved", False), "RB": ("random", True),
             "QB+RB": ("query_preserved", True), "sign_partitioned": ("sign_partitioned", False),
             "random+filter": ("random_filter", False), "DS": ("random", False)}


def test_every_view_reads_the_registry_and_holds_the_old_values():
    assert train.STRATEGIES == OLD_SMALL and list(train.STRATEGIES) == list(OLD_SMALL)
    assert data.STRATEGIES == {k: v for k, v in OLD_SMALL.items() if k != "random+filter"}
    assert fig07.STRATEGY_NAMES == ["random", "QB", "RB", "QB+RB", "sign_partitioned"]
    assert fig07.STRATEGY_CHOICES == fig07.STRATEGY_NAMES + ["random+filter", "DS"]
    assert fig07.SMALL_ONLY == ["random+filter"] and strategies.STRATEGIES["DS"].dynamic_sampling
    assert fig07.Params().strategies == fig07.STRATEGY_NAMES   # the cache key's default rows


def test_every_plan_is_a_batching_plan():
    assert all(s.plan in batching.PLANS and s.doc for s in strategies.STRATEGIES.values())
