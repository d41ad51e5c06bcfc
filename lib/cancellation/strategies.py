"""The batching strategies of Table 2, registered once: a strategy is one entry of `STRATEGIES`.

An entry says everything the rest of the package asks of a strategy: its mini-batch plan, its sampling
release rule (the reward-balanced buffer, DAPO's dynamic sampling, or none), which engines run it, whether
it is a default row of Table 2 or one of Eq. 14's plans, and its colour in notebook 07's figures. The
flags a reader needs (`query_preserved`, `filtered`, `buffered`) are read off the entry, never off the
strategy's or the plan's name.

Readers, each reading this table at the time it asks (a strategy registered later, or patched in by a
test, is seen by all of them):
- the small trainer: `train.strategy_config(name, ...)` (plan, RB, DS), `TrainConfig.query_preserved`
  (the buffer of a whole-query plan releases whole groups);
- TRL: `engine.BatchingGRPOTrainer(strategy=name)` and `engine.STRATEGIES` (`plans("trl")`);
- notebook 07 (`figures.fig07`): Params' default rows and choices (`TABLE2_ROWS`, `STRATEGIES`),
  the strategies TRL does not run (`small_only()`), the colours (`COLORS`), Table 2's QB / RB columns,
  Eq. 14's plans (`local_imbalance_plans()`), the planner's RB estimate; `fig07_claims` (`filtered`).

Imports nothing of the package (bottom layer); plan names are `batching.PLANS` keys (tests check them).
How to add a strategy: docs/architecture.md ("Adding a batching strategy").
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

# What a reader needs to know of a mini-batch plan (a `batching.PLANS` key) beyond its name.
WHOLE_QUERY_PLANS = frozenset({"query_preserved"})   # every query's rollouts share one mini-batch (QB)
FILTERING_PLANS = frozenset({"random_filter"})        # rows of zero-variance groups (A = 0) are left out


def keeps_queries_whole(plan: str) -> bool:
    """Whether mini-batch plan `plan` keeps each query's rollouts in one mini-batch, so a buffer in front
    of it must release whole groups (RB's `query_preserved`: QB+RB)."""
    return plan in WHOLE_QUERY_PLANS


@dataclass(frozen=True)
class Strategy:
    """One batching strategy: how a released batch is split, how sampling releases it, where it runs."""
    plan: str                       # batching.PLANS: how a batch is split into mini-batches
    color: str                      # its line / bar colour in notebook 07's figures
    doc: str                        # one line: what the strategy is
    reward_balanced: bool = False   # the RB buffer: sample until it releases a τ-balanced batch
    dynamic_sampling: bool = False  # DAPO's dynamic sampling buffer: sample until |B| rows of mixed groups
    trl: bool = True                # wired into engine.BatchingGRPOTrainer (else the small trainer only)
    table2: bool = True             # one of Table 2's default rows (notebook 07's default `strategies`)
    local_imbalance: bool = False   # one of the plans Eq. 14's table compares (fig07.local_imbalance)

    def __post_init__(self):
        if self.reward_balanced and self.dynamic_sampling:
            raise ValueError("Strategy: reward_balanced and dynamic_sampling are two release rules of one buffer; "
                             "choose one")

    @property
    def query_preserved(self) -> bool:
        """QB: a query's rollouts share one mini-batch (Table 2's QB column)."""
        return keeps_queries_whole(self.plan)

    @property
    def filtered(self) -> bool:
        """The plan leaves zero-variance groups out of the update (DAPO's filter)."""
        return self.plan in FILTERING_PLANS

    @property
    def buffered(self) -> bool:
        """Sampling goes through the buffer (RB or DS): an iteration may sample several rounds."""
        return self.reward_balanced or self.dynamic_sampling


# Colours: the Okabe–Ito palette (plots.PALETTE), one per strategy.
STRATEGIES: dict[str, Strategy] = {
    "random": Strategy("random", "#000000", "random mini-batches (the baseline)", local_imbalance=True),
    "QB": Strategy("query_preserved", "#0072B2", "query-preserved mini-batches: a prompt's rollouts stay together",
                   local_imbalance=True),
    "RB": Strategy("random", "#E69F00", "random mini-batches of the reward-balanced buffer's batches",
                   reward_balanced=True),
    "QB+RB": Strategy("query_preserved", "#009E73", "query-preserved mini-batches of the RB buffer's batches",
                      reward_balanced=True),
    "sign_partitioned": Strategy("sign_partitioned", "#D55E00", "mini-batches of one advantage sign each",
                                 local_imbalance=True),
    "random+filter": Strategy("random_filter", "#56B4E9", "zero-variance groups dropped (DAPO's filter); "
                              "the small trainer only", trl=False, table2=False),
    "DS": Strategy("random", "#CC79A7", "DAPO's dynamic sampling: keep sampling until the batch holds the "
                   "baseline's count of groups, every one mixed (zero-variance groups dropped), then random "
                   "mini-batches", dynamic_sampling=True, table2=False),
}

ENGINES = ("small", "trl")


def runs_on(strategy: Strategy, engine: str) -> bool:
    """Whether `engine` ('small': every strategy; 'trl': those wired into TRL) runs `strategy`."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; allowed: {', '.join(ENGINES)}")
    return engine == "small" or strategy.trl


def lookup(name: str, engine: str = "small") -> Strategy:
    """The registered strategy `name`, checked to be one `engine` runs (ValueError naming those it runs)."""
    s = STRATEGIES.get(name)
    if s is None or not runs_on(s, engine):
        allowed = [n for n, t in STRATEGIES.items() if runs_on(t, engine)]
        raise ValueError(f"unknown batching strategy {name!r} for engine {engine!r}; allowed: {', '.join(allowed)}")
    return s


class RegistryView(Mapping):
    """name -> `read(strategy)` for every registered strategy `keep` admits, in registry order, read from
    STRATEGIES at each access (never a copy taken at import)."""

    def __init__(self, read: Callable[[Strategy], object], keep: Callable[[Strategy], bool] = lambda s: True):
        self._read, self._keep = read, keep

    def _names(self) -> list[str]:
        return [n for n, s in STRATEGIES.items() if self._keep(s)]

    def __getitem__(self, name: str):
        s = STRATEGIES.get(name)
        if s is None or not self._keep(s):
            raise KeyError(name)
        return self._read(s)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(dict(self))


COLORS = RegistryView(lambda s: s.color)   # name -> colour (notebook 07's figures: fig07.COLORS)
TABLE2_ROWS = [name for name, s in STRATEGIES.items() if s.table2]   # notebook 07's default `strategies`


def small_only() -> list[str]:
    """The strategies that only the small trainer runs (not wired into TRL)."""
    return [name for name, s in STRATEGIES.items() if not s.trl]


def plans(engine: str = "small") -> RegistryView:
    """name -> (mini-batch plan, reward-balanced buffer) of the strategies `engine` ('small' or 'trl') runs."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; allowed: {', '.join(ENGINES)}")
    return RegistryView(lambda s: (s.plan, s.reward_balanced), lambda s: runs_on(s, engine))


def local_imbalance_plans() -> dict[str, str]:
    """name -> mini-batch plan of the strategies Eq. 14's table compares (part of its cache key: a plain dict)."""
    return {name: s.plan for name, s in STRATEGIES.items() if s.local_imbalance}
