"""Mini-batch plans for one GRPO iteration, and the reward-balanced (RB) buffer.

A plan turns one rollout batch into a list of row-index tensors, one per optimizer step
(paper §4; docs/methods.md, "Batching interventions"). Plans are pure functions of group ids,
advantages and a seed, so they are easy to test and to port to another trainer:

- `random`            shuffle rows, split: the common default, scatters a query's rollouts
- `query_preserved`   (QB) shuffle whole groups, split: a query's rollouts share one optimizer step
- `sign_partitioned`  positive and negative rollouts in separate mini-batches (breaks
                      cancellation on purpose)
- `random_filter`     the rollouts of zero-variance groups (all rewards equal, A = 0) dropped, as
                      DAPO's dynamic sampling filter does, then `random`: the baseline that separates
                      RB's filtering of A = 0 rows from its balancing (Table 2's `random+filter`)

`reward_balanced` (RB) is a selection, not a split: from a buffer of rollouts it picks an
update batch B of a fixed size with min(N+, N-) >= τ|B|, or nothing (then the trainer keeps
sampling). With `query_preserved=True` it picks whole groups, so RB composes with QB.
N+ / N- count rollouts with A > 0 / A < 0: with binary rewards these are the correct / wrong
rollouts of mixed groups; rollouts of all-equal groups (A = 0) carry no gradient and count
only towards |B|.

`dynamic_sampling` (DS, DAPO's dynamic sampling, Yu et al. 2025) is the other selection the buffer
can make: whole groups with mixed rewards (A ≠ 0) only, until the batch holds as many groups as the
baseline's batch (|B| rows, every group mixed); zero-variance groups are dropped as they arrive. It
is the fair control of RB's win: the same buffer, the same sampling loop, a batch of the same size,
balanced on nothing but "no group is all right or all wrong". DAPO's recipe drops the surplus
mixed groups of the last round; here they wait in the buffer like RB's (max_age), so RB and DS
differ in their release rule alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType

import torch

from .grpo import random_plan
from .rollout import RolloutBatch

def _perm(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def sign(advantage: torch.Tensor) -> torch.Tensor:
    """+1 / -1 / 0 per rollout (exact zero: all-equal groups)."""
    return torch.sign(torch.as_tensor(advantage, dtype=torch.float64)).long()


def random(group: torch.Tensor, n_minibatches: int, seed: int = 0) -> list[torch.Tensor]:
    """Shuffle rows, split into near-equal parts (== grpo.random_plan, the default of grpo_step)."""
    return random_plan(len(group), n_minibatches, seed)


def query_preserved(group: torch.Tensor, n_minibatches: int, seed: int = 0) -> list[torch.Tensor]:
    """QB: shuffle the groups, split the group list into near-equal parts; a group is never split.

    With fewer groups than `n_minibatches` there are fewer (never empty) mini-batches.
    """
    group = torch.as_tensor(group)
    ids = torch.unique(group)  # sorted
    ids = ids[_perm(len(ids), seed)]
    plan = []
    for chunk in torch.tensor_split(ids, n_minibatches):
        if len(chunk):
            plan.append(torch.cat([(group == g).nonzero().squeeze(1) for g in chunk.tolist()]))
    return plan


def sign_partitioned(advantage: torch.Tensor, n_minibatches: int, seed: int = 0) -> list[torch.Tensor]:
    """Positives and negatives in separate mini-batches; no mini-batch holds both signs.

    Mini-batches are shared between the signs in proportion to their counts (at least one
    each); zero-advantage rows (no gradient, but they count in the token-mean denominator, as
    in the other plans) are dealt round-robin over all mini-batches; the order of the
    mini-batches is shuffled.
    """
    if n_minibatches < 2:
        raise ValueError("sign_partitioned needs n_minibatches >= 2 (one batch cannot separate signs)")
    s = sign(advantage)
    g = torch.Generator().manual_seed(seed)
    pos, neg, zero = [(s == v).nonzero().squeeze(1) for v in (1, -1, 0)]
    pos, neg, zero = [x[torch.randperm(len(x), generator=g)] for x in (pos, neg, zero)]
    P, N = len(pos), len(neg)
    if P and N:
        k_pos = min(n_minibatches - 1, max(1, round(n_minibatches * P / (P + N))))
    else:
        k_pos = n_minibatches if P else 0
    parts = list(torch.tensor_split(pos, k_pos)) if k_pos else []
    parts += list(torch.tensor_split(neg, n_minibatches - k_pos)) if n_minibatches - k_pos else []
    parts = [p for p in parts if len(p)] or [torch.zeros(0, dtype=torch.long)]
    parts = [torch.cat([p, zero[i::len(parts)]]) for i, p in enumerate(parts)]
    order = torch.randperm(len(parts), generator=g).tolist()
    return [parts[i] for i in order if len(parts[i])]


def nonzero_variance_rows(group: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Row indices of the groups whose advantages are not all zero (zero-variance groups dropped)."""
    group, adv = torch.as_tensor(group), torch.as_tensor(advantage)
    live = torch.unique(group[adv != 0])
    return torch.isin(group, live).nonzero().squeeze(1)


def random_filter(group: torch.Tensor, advantage: torch.Tensor, n_minibatches: int,
                  seed: int = 0) -> list[torch.Tensor]:
    """Zero-variance groups dropped, the rest shuffled and split like `random` (fewer, never empty,
    mini-batches when few rows are left; [] when every group has equal rewards: no update)."""
    keep = nonzero_variance_rows(group, advantage)
    return [keep[p] for p in random_plan(len(keep), n_minibatches, seed)] if len(keep) else []


# The mini-batch plans: name -> plan(group, advantage, n_minibatches, seed), each reading what it needs.
# A new plan is one entry here (TrainConfig, the strategies and the TRL trainer validate against these keys).
PLANS = MappingProxyType({
    "random": lambda group, advantage, n, seed: random(group, n, seed),
    "query_preserved": lambda group, advantage, n, seed: query_preserved(group, n, seed),
    "sign_partitioned": lambda group, advantage, n, seed: sign_partitioned(advantage, n, seed),
    "random_filter": lambda group, advantage, n, seed: random_filter(group, advantage, n, seed),
})


def make_plan(name: str, group: torch.Tensor, advantage: torch.Tensor, n_minibatches: int,
              seed: int = 0) -> list[torch.Tensor]:
    """The mini-batches of plan `name` (a PLANS key)."""
    if name not in PLANS:
        raise ValueError(f"unknown mini-batch plan {name!r}; allowed: {', '.join(PLANS)}")
    return PLANS[name](group, advantage, n_minibatches, seed)


def cross_advantage(group: torch.Tensor, advantage: torch.Tensor, plan: list[torch.Tensor]):
    """Eq. 14 per (mini-batch, group) cell of `plan`: the rows k of the group in the mini-batch,
    the local advantage sum S_B = Σ_{i∈B} A_i, Σ_{i∈B} A_i² and the local cross-advantage term
    Σ_{i≠j∈B} A_i A_j = S_B² − Σ A_i², beside `grouped`, the same term of the whole group
    ((Σ A)² − Σ A² = −Σ A² for group-normalised advantages, which sum to zero). A DataFrame.
    """
    import pandas as pd
    group = torch.as_tensor(group)
    adv = torch.as_tensor(advantage, dtype=torch.float64)
    whole = {g: float(adv[group == g].sum() ** 2 - (adv[group == g] ** 2).sum()) for g in torch.unique(group).tolist()}
    rows = []
    for b, r in enumerate(plan):
        r = torch.as_tensor(r)
        for g in torch.unique(group[r]).tolist():
            a = adv[r[group[r] == g]]
            s, q = float(a.sum()), float((a ** 2).sum())
            rows.append(dict(minibatch=b, group=g, rows=len(a), S_B=s, sum_sq=q, cross=s * s - q, grouped=whole[g]))
    return pd.DataFrame(rows)


def cross_sign_share(group: torch.Tensor, advantage: torch.Tensor, plan: list[torch.Tensor]) -> tuple[float, float]:
    """How much of the batch's cross-sign coupling `plan` keeps inside its mini-batches (§4: "partition
    by advantage sign ... removes cross-sign gradient coupling"): (batch, group) shares of the
    advantage products |A_i A_j| over pairs with A_i A_j < 0 that share a mini-batch,

        batch:  Σ_B P_B N_B / (P N)                  (any two rollouts of the batch)
        group:  Σ_{B,g} P_{B,g} N_{B,g} / Σ_g P_g N_g  (pairs of one query group: Eq. 14's pairs)

    with P_B = Σ_{i∈B, A_i>0} A_i and N_B = Σ_{i∈B, A_i<0} (−A_i) (P, N over the whole batch). The whole
    batch as one mini-batch keeps 1 of both; QB keeps the group share at 1; a plan whose every
    mini-batch holds one sign keeps exactly 0 (one of P_B, N_B is an empty sum). NaN without a pair."""
    group = torch.as_tensor(group)
    adv = torch.as_tensor(advantage, dtype=torch.float64)
    pos, neg = adv.clamp(min=0), (-adv).clamp(min=0)

    def mass(rows):
        g = group[rows]
        ids = torch.unique(g).tolist()
        return (float(pos[rows].sum() * neg[rows].sum()),
                sum(float(pos[rows][g == i].sum() * neg[rows][g == i].sum()) for i in ids))
    whole = mass(torch.arange(len(adv)))
    local = [mass(torch.as_tensor(r)) for r in plan]
    return tuple(sum(m[k] for m in local) / whole[k] if whole[k] > 0 else math.nan for k in (0, 1))


def same_minibatch_probability(plan: list[torch.Tensor]) -> float:
    """The probability that two given rows share a mini-batch when `plan`'s mini-batch sizes are
    filled by a uniformly random permutation: Σ_b n_b(n_b − 1) / (N(N − 1)). Over random plans the
    expected local cross-advantage mass is this times the grouped one, whatever the advantages."""
    n = [len(r) for r in plan]
    N = sum(n)
    return sum(k * (k - 1) for k in n) / (N * (N - 1)) if N > 1 else float("nan")


def reward_balanced(group: torch.Tensor, advantage: torch.Tensor, batch_size: int, tau: float,
                    query_preserved: bool = False, priority: torch.Tensor | None = None) -> torch.Tensor | None:
    """RB selection: rows of an update batch with |B| = batch_size and min(N+, N-) >= τ|B|, or None.

    Units (rows, or with `query_preserved` whole groups) are taken by decreasing `priority`
    (ties: row order; the buffer passes the sampling round, so the freshest rollouts go first
    and older ones only top up a missing sign); a unit is skipped when taking it would leave
    too few free slots to reach the τ quota of either sign. Deterministic: no seed needed.
    """
    if not 0 <= tau <= 0.5:
        raise ValueError(f"tau={tau} must be in [0, 0.5] (both signs need τ|B| rollouts)")
    group, s = torch.as_tensor(group), sign(advantage)
    need = math.ceil(tau * batch_size - 1e-9)
    order = torch.arange(len(group)) if priority is None else \
        torch.sort(-torch.as_tensor(priority, dtype=torch.float64), stable=True).indices
    if query_preserved:
        seen = list(dict.fromkeys(group[order].tolist()))  # groups in priority order
        units = [(group == g).nonzero().squeeze(1) for g in seen]
    else:
        units = [order[i:i + 1] for i in range(len(group))]
    chosen, n, n_pos, n_neg = [], 0, 0, 0
    for rows in units:
        size, p, q = len(rows), int((s[rows] > 0).sum()), int((s[rows] < 0).sum())
        if n + size > batch_size:
            continue
        if max(0, need - n_pos - p) + max(0, need - n_neg - q) > batch_size - n - size:
            continue
        chosen.append(rows)
        n, n_pos, n_neg = n + size, n_pos + p, n_neg + q
        if n == batch_size:
            break
    if n == batch_size and min(n_pos, n_neg) >= need:
        return torch.cat(chosen)
    return None


def dynamic_sampling(group: torch.Tensor, advantage: torch.Tensor, batch_size: int,
                     priority: torch.Tensor | None = None) -> torch.Tensor | None:
    """DS selection: rows of whole mixed groups (some A ≠ 0) summing to exactly `batch_size`, or None.

    Groups are taken by decreasing `priority` of their rows (ties: row order; the buffer passes the
    sampling round, so the freshest groups go first); a group that would overshoot is skipped.
    Zero-variance groups (every A = 0) are never taken. Deterministic: no seed needed.
    """
    group, adv = torch.as_tensor(group), torch.as_tensor(advantage)
    order = torch.arange(len(group)) if priority is None else \
        torch.sort(-torch.as_tensor(priority, dtype=torch.float64), stable=True).indices
    chosen, n = [], 0
    for g in dict.fromkeys(group[order].tolist()):   # groups in priority order
        rows = (group == g).nonzero().squeeze(1)
        if not bool((adv[rows] != 0).any()) or n + len(rows) > batch_size:
            continue
        chosen.append(rows)
        n += len(rows)
        if n == batch_size:
            return torch.cat(chosen)
    return None


def concat(batches: list[RolloutBatch]) -> RolloutBatch:
    """Rows of several batches in one, right-padded to a common length, groups renumbered.

    Appended columns are masked out (attention 0, not response) and positions come from the
    attention mask, so every row's forward is unchanged; the pad id there is irrelevant (0).
    """
    L = max(b.input_ids.shape[1] for b in batches)
    pad = lambda x, v: torch.nn.functional.pad(x, (0, L - x.shape[1]), value=v)  # noqa: E731
    groups, problems, off = [], [], 0
    for b in batches:
        groups.append(b.group + off)
        problems += list(b.problems)
        off += max(len(b.problems), int(b.group.max()) + 1 if len(b) else 0)
    return RolloutBatch(
        input_ids=torch.cat([pad(b.input_ids, 0) for b in batches]),
        attention_mask=torch.cat([pad(b.attention_mask, 0) for b in batches]),
        response_mask=torch.cat([pad(b.response_mask, False) for b in batches]),
        group=torch.cat(groups), reward=torch.cat([b.reward for b in batches]),
        advantage=torch.cat([b.advantage for b in batches]), problems=problems,
        texts=sum((list(b.texts) for b in batches), []))


@dataclass
class RewardBalancedBuffer:
    """RB as a rollout buffer: `add` what was sampled, `release` a τ-balanced update batch or None.
    With `mixed_groups` it is DAPO's dynamic-sampling buffer instead (`dynamic_sampling`): it drops
    zero-variance groups as they arrive (`filtered`) and releases |B| rows of mixed groups.

    Freshest rollouts are released first (least off-policy); older ones top up a missing sign.
    Rollouts older than `max_age` sampling rounds are discarded before a release; `delayed`
    counts rollouts that went out in a later round than the one that sampled them. The buffer
    holds plain tensors and lists, so it pickles into a training checkpoint.
    """
    batch_size: int                     # |B|, rollouts per released update batch
    tau: float = 0.5                    # min(N+, N-) >= τ|B|
    query_preserved: bool = False       # select whole groups (QB+RB)
    max_age: int = 2                    # rounds a rollout may wait before it is discarded
    mixed_groups: bool = False          # DS: release whole mixed groups, no sign quota (τ unused)
    rows: RolloutBatch | None = None    # the buffered rollouts, oldest first
    born: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))  # round sampled
    sampled: int = 0                    # rollouts added
    released: int = 0                   # rollouts released in update batches
    delayed: int = 0                    # released in a later round than sampled
    discarded: int = 0                  # dropped for age
    filtered: int = 0                   # DS: rollouts of zero-variance groups, dropped on arrival

    def __len__(self):
        return 0 if self.rows is None else len(self.rows)

    def add(self, batch: RolloutBatch, round_: int):
        self.sampled += len(batch)
        if self.mixed_groups:   # DS keeps nothing of a zero-variance group: it can never be released
            keep = nonzero_variance_rows(batch.group, batch.advantage)
            self.filtered += len(batch) - len(keep)
            if not len(keep):
                return
            batch = batch.select(keep)
        self.rows = batch if self.rows is None else concat([self.rows, batch])
        self.born = torch.cat([self.born, torch.full((len(batch),), round_, dtype=torch.long)])

    def _keep(self, keep: torch.Tensor):
        self.rows, self.born = self.rows.select(keep.nonzero().squeeze(1)), self.born[keep]

    def release(self, round_: int, agree=None) -> RolloutBatch | None:
        """A τ-balanced batch of the buffered rollouts, or None. `agree(ok) -> bool` (several
        processes, each with its own buffer): release only if every process can, so that all
        take the same number of sampling rounds and optimizer steps."""
        if self.rows is None:
            if agree is not None:
                agree(False)   # the other processes wait for this answer
            return None
        old = round_ - self.born > self.max_age
        if old.any():
            self.discarded += int(old.sum())
            self._keep(~old)
        if self.mixed_groups:
            rows = dynamic_sampling(self.rows.group, self.rows.advantage, self.batch_size, priority=self.born)
        else:
            rows = reward_balanced(self.rows.group, self.rows.advantage, self.batch_size, self.tau,
                                   self.query_preserved, priority=self.born)
        if agree is not None and not agree(rows is not None):
            return None
        if rows is None:
            return None
        out = self.rows.select(rows)
        self.delayed += int((self.born[rows] < round_).sum())
        self.released += len(rows)
        keep = torch.ones(len(self), dtype=torch.bool)
        keep[rows] = False
        self._keep(keep)
        return out

    def stats(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("rows", "born")} | \
            {"buffered": len(self)}


def sample_until_release(sample, buffer: RewardBalancedBuffer | None, first_round: int, cap: int, agree=None):
    """One iteration's sampling rounds, shared by the small trainer and the TRL engine.

    `sample(round_, k)` draws sampling round `round_` (the run's round counter; `k` counts this
    iteration's rounds from 0). Without a buffer the first round is the batch. With RB every
    round goes into the buffer and the loop stops at the first release or after `cap` rounds.
    `agree`: see `RewardBalancedBuffer.release` (several processes). Returns (batch or None, the
    rounds drawn); the caller advances its round counter by len(drawn).
    """
    batch, drawn = None, []
    while batch is None and len(drawn) < cap:
        r = first_round + len(drawn)
        b = sample(r, len(drawn))
        drawn.append(b)
        if buffer is None:
            batch = b
        else:
            buffer.add(b, r)
            batch = buffer.release(r, agree)
    return batch, drawn
