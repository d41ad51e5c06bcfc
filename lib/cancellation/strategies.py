"""The batching strategies of Table 2, registered once: each name with its mini-batch plan, whether the
reward-balanced (RB) buffer is on, which engines run it and whether it is a default row of Table 2.

Everything else reads this table: `train.STRATEGIES` (the small trainer: name -> (plan, rb)),
`engine.STRATEGIES` (the TRL trainer: the strategies wired into it) and notebook 07's Params
(`fig07.STRATEGY_NAMES`, its default rows, and `STRATEGY_CHOICES`). A new strategy is one entry here.
Imports nothing of the package (bottom layer); plan names are `batching.PLANS` keys.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    plan: str                     # batching.PLANS: how a batch is split into mini-batches
    reward_balanced: bool         # the RB buffer: sample until it releases a batch of mixed groups
    trl: bool = True              # wired into engine.BatchingGRPOTrainer (else the small trainer only)
    table2: bool = True           # one of Table 2's default rows
    dynamic_sampling: bool = False  # DAPO's dynamic sampling buffer: sample until |B| rows of mixed groups

    @property
    def buffered(self) -> bool:
        """Sampling goes through the buffer (RB or DS): an iteration may sample several rounds."""
        return self.reward_balanced or self.dynamic_sampling
    doc: str = ""


STRATEGIES: dict[str, Strategy] = {
    "random": Strategy("random", False, doc="random mini-batches (the baseline)"),
    "QB": Strategy("query_preserved", False, doc="query-preserved mini-batches: a prompt's rollouts stay together"),
    "RB": Strategy("random", True, doc="random mini-batches of the reward-balanced buffer's batches"),
    "QB+RB": Strategy("query_preserved", True, doc="query-preserved mini-batches of the RB buffer's batches"),
    "sign_partitioned": Strategy("sign_partitioned", False, doc="mini-batches of one advantage sign each"),
    "random+filter": Strategy("random_filter", False, trl=False, table2=False,
                              doc="zero-variance groups dropped (DAPO's filter); the small trainer only"),
    "DS": Strategy("random", False, table2=False, dynamic_sampling=True,
                   doc="DAPO's dynamic sampling: keep sampling until the batch holds the baseline's count of groups, "
                   "every one mixed (zero-variance groups dropped), then random mini-batches; the small trainer only"),
}

TABLE2_ROWS = [name for name, s in STRATEGIES.items() if s.table2]   # notebook 07's default `strategies`


def small_only() -> list[str]:
    """The strategies that only the small trainer runs (not wired into TRL)."""
    return [name for name, s in STRATEGIES.items() if not s.trl]


def plans(engine: str = "small") -> dict[str, tuple[str, bool]]:
    """name -> (mini-batch plan, reward-balanced buffer) of the strategies `engine` ('small' or 'trl') runs."""
    if engine not in ("small", "trl"):
        raise ValueError(f"engine={engine!r}; allowed: small, trl")
    return {name: (s.plan, s.reward_balanced) for name, s in STRATEGIES.items() if engine == "small" or s.trl}
