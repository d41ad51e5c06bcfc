"""Sampling budget and reward composition (paper §3.3 Fig. 6, §4 Fig. 7(b)).

The fair test (notebook 06). One base rollout batch (and, for 7(b), a batch with enough rollouts
per query that every composition k = 1..G−1 can be drawn from the same groups). Per seed, one
random order of groups and of the rollouts inside each group; a *setting* is a prefix of it
(`budget_plan`, `composition_plan`: nested sub-batches), so the rollouts of the smallest setting
are in every update of the sweep. The valued tokens of a seed are tokens of those rollouts
(`valued_tokens`, valued once with value.token_values): inside every update, the same tokens for
every budget. Group advantages are recomputed on each sub-batch (verl: a group of one rollout
gets A = r). One plain-SGD GRPO step per setting: at ρ = 1 it is θ + (lr/T_B) Σ_{i∈B} A_i h_i
with h_i the score of rollout i (`rollout_scores`, `step_coefficients`), so `sweep_deltas` takes
every step from scores computed once (or, for large models, runs a real grpo_step), undone with
grpo.trial. The value gap of a setting pools the (seed, token) instances of all seeds
(`pooled_gap`); intervals resample seeds, paired across the settings of a panel (`gap_table`);
trends and their noise budget (`trend_table`, `trend_noise`, `seeds_needed`).
`pool_delta` takes a real grpo_step on a sub-batch (the reference of the tests, and the
step of the paper profile).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from . import grpo, measure, procs, rollout
from .policy import load_policy
from .value import model_id


# --------------------------------------------------------------------------- sub-batches
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def composition_groups(batch, G: int) -> list[int]:
    """Groups with at least G−1 positive and G−1 negative rollouts: every composition k = 1..G−1
    of G rollouts can be drawn from each of them (the same queries for every k)."""
    out = []
    for grp in batch.group.unique().tolist():
        r = batch.reward[batch.group == grp]
        if int((r > 0.5).sum()) >= G - 1 and int((r <= 0.5).sum()) >= G - 1:
            out.append(grp)
    return out


def regroup(batch, rows) -> "rollout.RolloutBatch":
    """The sub-batch of `rows` with group advantages recomputed on it (what the update sees)."""
    sub = batch.select(rows)
    sub.advantage = rollout.group_advantages(sub.reward, sub.group)
    return sub


# --------------------------------------------------------------------------- the update
def pool_index(batch, pool: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pool rows of the batch, row of each pool token within them, column of each pool token)."""
    roll, pos = np.array(pool["rollout"], dtype=np.int64), np.array(pool["position"], dtype=np.int64)
    rows = torch.from_numpy(np.unique(roll))
    local = torch.from_numpy(np.searchsorted(rows.numpy(), roll))
    first = batch.response_mask.float().argmax(1)
    cols = first[torch.from_numpy(roll)] + torch.from_numpy(pos)
    return rows, local, cols


def pool_logp(model, batch, pool: pd.DataFrame, knobs) -> np.ndarray:
    """log π of every pool token under `model` (one forward over the pool's rows only; `knobs`: the run's
    Compute or an UpdateConfig carrying its knobs)."""
    rows, local, cols = pool_index(batch, pool)
    sub = trim(batch.select(rows), int(cols.max()) + 1 if len(cols) else None)
    lp = measure.token_stats(model, sub, knobs).logp
    return lp[local, cols].double().cpu().numpy()


def trim(batch, cut: int | None = None) -> "rollout.RolloutBatch":
    """`batch` with its columns cut at `cut` (default: after the last real token of any row). The
    model is causal, so the log-probs of the kept positions are those of the whole rows."""
    if cut is None:
        real = batch.attention_mask.bool().any(0).nonzero()
        cut = int(real.max()) + 1 if len(real) else batch.input_ids.shape[1]
    if cut >= batch.input_ids.shape[1]:
        return batch
    return dataclasses.replace(batch, input_ids=batch.input_ids[:, :cut], attention_mask=batch.attention_mask[:, :cut],
                               response_mask=batch.response_mask[:, :cut])


def pool_delta(model, batch, rows, pool: pd.DataFrame, cfg: grpo.UpdateConfig, old_logp: torch.Tensor,
               before: np.ndarray) -> np.ndarray:
    """Δlog p of the pool's tokens after one GRPO step on the sub-batch `rows` (advantages
    recomputed there). `old_logp`: (B, L) log-probs of the whole batch under θ (ρ = 1);
    `before`: pool_logp under θ. The model's parameters are restored afterwards."""
    sub = regroup(batch, rows)
    with grpo.trial(model, cfg.scope):
        grpo.grpo_step(model, sub, cfg, old_logp=old_logp[torch.as_tensor(rows)])
        return pool_logp(model, batch, pool, cfg) - before


# --------------------------------------------------------------------------- the value gap
# =========================================================================== the fair test
# Nested sub-batches: one random order per seed (of the groups, and of the rollouts inside each
# group); a setting takes a prefix of it, so the smallest setting's rollouts ("the core") are in
# every update of the sweep. The valued tokens of a seed are tokens of core rollouts: inside
# every update, the same tokens for every budget of the seed (a paired comparison in which only
# the update, not the valued tokens, changes with the budget).
def nested_order(batch, seed: int = 0) -> list[torch.Tensor]:
    """The seed's random order of the batch's groups, each with its rows in random order."""
    g = _gen(seed)
    groups = batch.group.unique()
    out = []
    for grp in groups[torch.randperm(len(groups), generator=g)]:
        idx = (batch.group == grp).nonzero().squeeze(1)
        out.append(idx[torch.randperm(len(idx), generator=g)])
    return out


def nested_rows(order, n_prompts: int, n: int) -> torch.Tensor:
    """Rows of the first `n` rollouts of each of the first `n_prompts` groups of `order` (sorted):
    a larger n_prompts or n gives a superset."""
    if n_prompts > len(order):
        raise ValueError(f"nested_rows: n_prompts={n_prompts} > {len(order)} groups in the batch")
    if any(n > len(o) for o in order[:n_prompts]):
        raise ValueError(f"nested_rows: n={n} > the rollouts of a group ({min(len(o) for o in order[:n_prompts])})")
    return torch.cat([o[:n] for o in order[:n_prompts]]).sort().values


def composition_order(batch, groups, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per group of `groups`: (its positive rows, its negative rows), each in the seed's random order."""
    g = _gen(seed)
    out = []
    for grp in groups:
        m = batch.group == grp
        pos = (m & (batch.reward > 0.5)).nonzero().squeeze(1)
        neg = (m & (batch.reward <= 0.5)).nonzero().squeeze(1)
        out.append((pos[torch.randperm(len(pos), generator=g)], neg[torch.randperm(len(neg), generator=g)]))
    return out


def nested_composition_rows(corder, k: int, G: int) -> torch.Tensor:
    """The first k positive and the first G−k negative rows of every group of `corder` (sorted):
    the first positive and the first negative are in every composition k = 1..G−1."""
    rows = []
    for pos, neg in corder:
        if k > len(pos) or G - k > len(neg):
            raise ValueError(f"nested_composition_rows: a group has {len(pos)} positive / {len(neg)} negative "
                             f"rollouts; k={k} of G={G} needs {k} / {G - k}")
        rows += [pos[:k], neg[:G - k]]
    return torch.cat(rows).sort().values


def budget_plan(batch, prompt_sizes, n_fixed: int, rollout_sizes, prompts_fixed: int, valued_per_prompt: int,
                seeds) -> list[dict]:
    """Fig. 6's settings for every seed: dicts (panel, x, seed, rows, valued).

    (a) 'prompts': the first P groups × the first `n_fixed` rollouts of the seed's order, valued
    rows: the first `valued_per_prompt` rollouts of each of the first min(prompt_sizes) groups.
    (b) 'rollouts': the first `prompts_fixed` groups × the first n rollouts, valued rows: the first
    min(rollout_sizes) rollouts of each of them (n = 1: one rollout per prompt). The valued rows
    are in every setting of their panel and seed."""
    plan = []
    for s in seeds:
        order = nested_order(batch, s)
        p0 = min(prompt_sizes)
        va = nested_rows(order, p0, min(valued_per_prompt, n_fixed))
        for P in sorted(prompt_sizes):
            plan.append(dict(panel="prompts", x=int(P), seed=int(s), rows=nested_rows(order, P, n_fixed), valued=va))
        vb = nested_rows(order, prompts_fixed, min(rollout_sizes))
        for n in sorted(rollout_sizes):
            plan.append(dict(panel="rollouts", x=int(n), seed=int(s), rows=nested_rows(order, prompts_fixed, n),
                             valued=vb))
    return plan


def composition_plan(batch, groups, G: int, seeds) -> list[dict]:
    """Fig. 7(b)'s settings for every seed: k = 1..G−1 positives of G per group of `groups`; valued
    rows: the first positive and the first negative of each group (in every composition)."""
    plan = []
    for s in seeds:
        co = composition_order(batch, groups, s)
        valued = torch.cat([torch.cat([p[:1], q[:1]]) for p, q in co]).sort().values
        for k in range(1, G):
            plan.append(dict(panel="composition", x=k, seed=int(s), rows=nested_composition_rows(co, k, G),
                             valued=valued))
    return plan


def valued_tokens(table: pd.DataFrame, rows, per_rollout: int, p_max: float, seed: int = 0) -> pd.DataFrame:
    """`per_rollout` tokens with p_t ≤ p_max drawn at random (fixed by `seed` and the row) from each of
    `rows` (rows of measure.token_table); fewer where a rollout has fewer such tokens."""
    t = table[table.rollout.isin(np.asarray(rows)) & (table.prob <= p_max)]
    parts = [d.sample(n=min(per_rollout, len(d)), random_state=(seed * 100_003 + int(r)) % 2**32) for r, d in t.groupby("rollout")]
    return pd.concat(parts).sort_values(["rollout", "position"]).reset_index(drop=True)


# --------------------------------------------------------------------------- exact steps from scores
def flat_params(model) -> list[torch.nn.Parameter]:
    return grpo.scope_params(model, "full")


def rollout_scores(model, batch, rows, old_logp: torch.Tensor, cfg: grpo.UpdateConfig,
                   dtype=torch.float32) -> torch.Tensor:
    """H (len(rows), P): the score h_i = ∇_θ Σ_t log π(o_it|s_it) of each rollout (response tokens),
    one backward per row through the project's loss (grpo.accumulate_grad with A = 1 on that row
    alone, whose gradient is −h_i / T_i at ρ = 1). θ is not changed.

    At ρ = 1 the clipped token-mean GRPO loss of a sub-batch B has the gradient
    −(1/T_B) Σ_{i∈B} A_i h_i (T_B: its response tokens), so one plain-SGD step of any sub-batch is
    θ + (lr/T_B) Σ_i A_i h_i (`step_directions`): H is computed once and serves every setting.
    `dtype`: storage (float32 halves the memory; the step then differs from a float64 step by a
    relative ~1e-7, far below ε)."""
    params = flat_params(model)
    n_par = sum(p.numel() for p in params)
    rows = torch.as_tensor(rows)
    H = torch.empty(len(rows), n_par, dtype=dtype)
    w = torch.ones(1, dtype=torch.float64)
    with grpo.only_grad_for(model, params):
        for j, r in enumerate(rows.tolist()):
            model.zero_grad(set_to_none=True)
            one = trim(batch.select([r]))       # the row alone, its trailing padding cut (exact: causal)
            L = one.input_ids.shape[1]
            info = grpo.accumulate_grad(model, one, torch.tensor([0]), old_logp[r:r + 1, :L], w, cfg)
            g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            H[j] = (-info["n_tokens"] * g).to(dtype)
    model.zero_grad(set_to_none=True)
    return H


def step_coefficients(batch, rows, index: dict, lr: float) -> torch.Tensor:
    """c (len(index),) with the SGD step of the sub-batch `rows` = Σ_i c_i h_i (`rollout_scores`):
    c_i = lr · A_i / T_B, A recomputed on the sub-batch (`regroup`), T_B its response tokens."""
    sub = regroup(batch, rows)
    c = torch.zeros(len(index), dtype=torch.float64)
    T = float(sub.response_mask.sum())
    for r, a in zip(torch.as_tensor(rows).tolist(), sub.advantage.tolist()):
        c[index[r]] = lr * a / T
    return c


@torch.no_grad()
def add_to_params(model, u: torch.Tensor):
    """θ ← θ + u (u flat, in `flat_params` order)."""
    o = 0
    for p in flat_params(model):
        p.add_(u[o:o + p.numel()].view_as(p).to(p.dtype))
        o += p.numel()


def sweep_deltas(model, batch, plan: list[dict], tokens: pd.DataFrame, cfg: grpo.UpdateConfig, old_logp: torch.Tensor,
                 H: torch.Tensor | None = None, H_rows=None, block: int = 128, before: dict | None = None) -> pd.DataFrame:
    """Δlog p of each setting's valued tokens after that setting's plain-SGD GRPO step from θ.

    `plan`: budget_plan / composition_plan entries; `tokens`: the valued tokens (rows of
    measure.token_table, `valued_tokens`), each entry's are those whose rollout is in its `valued`
    rows; `cfg`: a plain-SGD full-scope update (lr, chunks); `old_logp`: (B, L) log-probs of the
    batch under θ. With `H`, `H_rows` (rollout_scores of the rows every entry draws from) the step
    of an entry is θ + Σ_i c_i h_i (step_coefficients; the steps of a block of seeds in one matrix
    product); without, a real grpo_step on the sub-batch (pool_delta) — the same step, for models
    whose scores do not fit in memory. Either is undone with grpo.trial. Returns rows (panel, x,
    seed, tok, delta) with `tok` the index into `tokens`, plus the update's size (n_rollouts,
    n_tokens, n_mixed). `before` (a dict) keeps the valued tokens' log-probs under θ across calls."""
    if cfg.optimizer != "sgd" or cfg.scope != "full" or cfg.n_minibatches != 1:
        raise ValueError("sweep_deltas: the steps from scores are plain SGD, full scope, one mini-batch")
    lr = cfg.lr
    index = {int(r): j for j, r in enumerate(torch.as_tensor(H_rows).tolist())} if H is not None else {}
    roll = tokens.rollout.to_numpy()
    before, out = ({} if before is None else before), []
    by_seed: dict[int, list[dict]] = {}
    for e in plan:
        by_seed.setdefault(e["seed"], []).append(e)
    blocks, cur = [], []
    for entries in by_seed.values():   # seeds in blocks of about `block` steps: one pass over H per block
        if cur and len(cur) + len(entries) > block:
            blocks.append(cur)
            cur = []
        cur = cur + entries
    blocks += [cur] if cur else []
    for entries in blocks:
        if H is not None:
            U = torch.stack([step_coefficients(batch, e["rows"], index, lr) for e in entries]).to(H.dtype) @ H
        for j, e in enumerate(entries):
            key = tuple(torch.as_tensor(e["valued"]).tolist())
            tok = np.flatnonzero(np.isin(roll, np.asarray(key)))
            if not len(tok):
                continue
            sel = tokens.iloc[tok]
            if key not in before:
                before[key] = pool_logp(model, batch, sel, cfg)
            if H is None:
                delta = pool_delta(model, batch, e["rows"], sel, cfg, old_logp, before[key])
            else:
                with grpo.trial(model, "full"):
                    add_to_params(model, U[j].double())
                    delta = pool_logp(model, batch, sel, cfg) - before[key]
            sub = batch.select(e["rows"])
            out.append(pd.DataFrame(dict(panel=e["panel"], x=e["x"], seed=e["seed"], tok=tok,
                                         delta=delta, in_update=np.isin(roll[tok], e["rows"].numpy()),
                                         n_rollouts=len(e["rows"]),
                                         n_tokens=sub.n_tokens, n_mixed=sub.mixed_groups())))
    return pd.concat(out, ignore_index=True)


def sweep_deltas_split(model, batch, plan: list[dict], tokens: pd.DataFrame, cfg: grpo.UpdateConfig,
                       old_logp: torch.Tensor) -> pd.DataFrame:
    """`sweep_deltas` without scores (a real grpo_step per setting, step_mode 'grpo') with its
    settings x seeds split over $CANCELLATION_PROCS ranks (procs.fan_out; `_rank_sweep`): a unit is
    one plan entry (a setting of a seed), whose step is taken from θ and undone (grpo.trial), so a
    unit gives the same rows whichever rank takes it and whatever it took before; the rows come
    back in plan order, as on one process. Needs a model from sampler.load_sampler (it carries its
    recipe); without one, or on one process, it is `sweep_deltas` here."""
    recipe = getattr(model, "cancellation_recipe", None)
    units = list(plan)
    if recipe is None or procs.count() <= 1 or len(units) <= 1:
        return sweep_deltas(model, batch, plan, tokens, cfg, old_logp)
    dev = next(model.parameters()).device
    shared = dict(recipe=recipe, model_id=model_id(model), batch=batch.to("cpu"), tokens=tokens, cfg=cfg,
                  old_logp=old_logp.cpu())
    parts = procs.fan_out("cancellation.budget:_rank_sweep", shared, units, cuda=dev.type == "cuda",
                          what="settings x seeds (grpo steps)")
    return pd.concat([p for p in parts if p is not None], ignore_index=True)


def _rank_sweep(shared: dict, units: list, local_rank: int | None) -> list:
    """One rank's settings x seeds of `sweep_deltas_split`: the float policy rebuilt from its recipe (on the
    rank's own GPU) and checked against the caller's weights, one frame per unit (None: no valued tokens)."""
    recipe = shared["recipe"]
    device = f"cuda:{local_rank}" if local_rank is not None else recipe["device"]
    torch.manual_seed(recipe["seed"])
    if device == "cpu":
        torch.set_num_threads(recipe.get("threads", 1))
    model, _ = load_policy(recipe["model_path"], dtype=recipe["dtype"], device=device)
    if model_id(model) != shared["model_id"]:
        raise RuntimeError(f"the policy rebuilt from {recipe['model_path']} holds other weights than the caller's "
                           "(updated after loading?): its sweep cannot be split over processes")
    batch, old_logp = shared["batch"].to(device), shared["old_logp"].to(device)
    roll, before, out = shared["tokens"].rollout.to_numpy(), {}, []
    for e in units:  # an entry without valued tokens gives no rows (None), as sweep_deltas skips it
        if not np.isin(roll, torch.as_tensor(e["valued"]).numpy()).any():
            out.append(None)
            continue
        out.append(sweep_deltas(model, batch, [e], shared["tokens"], shared["cfg"], old_logp, before=before))
    return out


# --------------------------------------------------------------------------- the pooled gap over seeds
def seed_sums(values: np.ndarray, status: np.ndarray, seed_idx: np.ndarray, n_seeds: int) -> np.ndarray:
    """(n_seeds, 4): per seed, [#boosted, Σ value boosted, #suppressed, Σ value suppressed]."""
    v = np.asarray(values, float)
    b, s = np.asarray(status) == "boosted", np.asarray(status) == "suppressed"
    out = np.zeros((n_seeds, 4))
    for col, m, w in ((0, b, 1.0), (1, b, v), (2, s, 1.0), (3, s, v)):
        np.add.at(out[:, col], seed_idx[m], (w * np.ones_like(v))[m])
    return out


def _gap_of(sums: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums[..., 1] / sums[..., 0] - sums[..., 3] / sums[..., 2]


def pooled_gap(values, status) -> float:
    """Mean value of the boosted − mean value of the suppressed instances, all seeds pooled (NaN
    without a boosted or a suppressed instance)."""
    v, st = np.asarray(values, float), np.asarray(status)
    b, s = st == "boosted", st == "suppressed"
    return float(v[b].mean() - v[s].mean()) if b.any() and s.any() else np.nan


def seed_resamples(n_seeds: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """(n_boot, n_seeds) counts of each seed in a bootstrap resample of the seeds (the resampling
    unit: a seed draws both the sub-batches and the valued rollouts). Use the same counts for every
    setting of a panel: the replicates are paired."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_seeds, (n_boot, n_seeds))
    return np.stack([np.bincount(i, minlength=n_seeds) for i in idx]).astype(float)


def gap_replicates(values, status, seed_idx, counts: np.ndarray) -> tuple[float, np.ndarray]:
    """(pooled gap, its bootstrap replicates) under the seed-resample `counts` (seed_resamples)."""
    S = counts.shape[1]
    sums = seed_sums(values, status, np.asarray(seed_idx), S)
    return pooled_gap(values, status), _gap_of(counts @ sums)


def interval(reps, alpha: float = 0.05) -> tuple[float, float]:
    r = np.asarray(reps, float)
    if np.isnan(r).all():
        return np.nan, np.nan
    lo, hi = np.nanquantile(r, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def gap_weights_pooled(tok, status, n_tokens: int) -> np.ndarray:
    """w (n_tokens,) with the pooled gap = Σ_j w_j v_j: a token counts once per seed it is valued in
    (1/#boosted if boosted there, −1/#suppressed if suppressed)."""
    tok, st = np.asarray(tok), np.asarray(status)
    b, s = st == "boosted", st == "suppressed"
    w = np.zeros(n_tokens)
    if b.any() and s.any():
        np.add.at(w, tok[b], 1.0 / b.sum())
        np.add.at(w, tok[s], -1.0 / s.sum())
    return w


def trend_noise(d: float, reps_d: np.ndarray, w_a: np.ndarray, w_b: np.ndarray, se: np.ndarray) -> dict:
    """The variance of a trend d = gap(b) − gap(a) (or any difference of pooled gaps, weights w_b − w_a)
    split into the Monte Carlo noise of the values, var_mc = Σ_j (w_b − w_a)_j² se_j² (exact: d is
    linear in Δ̂), and the rest, var_seed = Var_boot(d) − var_mc (which sub-batches and which valued
    rollouts the seeds drew; scales as 1/seeds). In the form budget.needed reads (var_pool = 0)."""
    var_tot = float(np.nanvar(reps_d, ddof=1))
    var_mc = float(np.sum((np.asarray(w_b) - np.asarray(w_a)) ** 2 * np.asarray(se, float) ** 2))
    return dict(d=float(d), var_seed=max(var_tot - var_mc, 0.0), var_mc=var_mc, var_pool=0.0, var_tokens=var_tot)


def composition_rows_capped(batch, G: int, n_groups: int, seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """(groups, rows) for Fig. 7(b): the first `n_groups` groups of `batch` with at least G−1 positive
    and G−1 negative rollouts (composition_groups), each cut to G−1 positive and G−1 negative rows
    drawn at random (the rows every composition k = 1..G−1 draws from)."""
    groups = composition_groups(batch, G)[:n_groups]
    g = _gen(seed)
    keep = []
    for grp in groups:
        m = batch.group == grp
        for sign in (batch.reward > 0.5, batch.reward <= 0.5):
            idx = (m & sign).nonzero().squeeze(1)
            keep.append(idx[torch.randperm(len(idx), generator=g)[:G - 1]])
    return groups, (torch.cat(keep).sort().values if keep else torch.zeros(0, dtype=torch.long))


# --------------------------------------------------------------------------- the tables of the notebook
def gap_table(sw: pd.DataFrame, tokens: pd.DataFrame, subsets: dict, n_boot: int = 1000,
              seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The value gap of every (panel, x) of a sweep (sweep_deltas with a `status` column) for each
    token subset (name → bool mask over `tokens`), pooled over seeds, with a 95% interval from
    resampling seeds (the same resamples for every x of a panel: paired). Also the within-sign gap
    (scope 'within_sign': the mean of the gaps inside positive and inside negative rollouts, free of
    "tokens of positive rollouts have higher Δ̂"). Returns (table, replicates by (panel, x, name))."""
    v_all = tokens.delta_hat.to_numpy()
    pos = (tokens.reward > 0.5).to_numpy()
    rows, reps = [], {}
    for panel in sw.panel.unique():
        d = sw[sw.panel == panel]
        seeds = np.sort(d.seed.unique())
        counts = seed_resamples(len(seeds), n_boot, seed)
        for x in np.sort(d.x.unique()):
            dx = d[d.x == x]
            tok, st = dx.tok.to_numpy(), dx.status.to_numpy()
            sidx = np.searchsorted(seeds, dx.seed.to_numpy())
            base = dict(panel=panel, x=int(x), n_seeds=len(seeds), n_rollouts=float(dx.groupby("seed").n_rollouts.first().mean()),
                        mixed_groups=float(dx.groupby("seed").n_mixed.first().mean()))
            for name, m in subsets.items():
                sel = np.asarray(m)[tok]
                g, r = gap_replicates(v_all[tok][sel], st[sel], sidx[sel], counts)
                reps[(panel, int(x), name)] = r
                rows.append(dict(base, subset=name, scope="valued", gap=g, lo=interval(r)[0], hi=interval(r)[1],
                                 n_tokens=int(len(np.unique(tok[sel]))), n_instances=int(sel.sum()),
                                 boosted=float((st[sel] == "boosted").mean()),
                                 suppressed=float((st[sel] == "suppressed").mean())))
            parts = []
            for sgn in (True, False):
                sel = pos[tok] == sgn
                parts.append(gap_replicates(v_all[tok][sel], st[sel], sidx[sel], counts))
            g, r = (parts[0][0] + parts[1][0]) / 2, (parts[0][1] + parts[1][1]) / 2
            reps[(panel, int(x), "within_sign")] = r
            rows.append(dict(base, subset="all", scope="within_sign", gap=g, lo=interval(r)[0], hi=interval(r)[1],
                             n_tokens=int(len(np.unique(tok))), n_instances=len(tok)))
    return pd.DataFrame(rows), reps


def composition_trend_groups(sw: pd.DataFrame, tokens: pd.DataFrame, group_of_tok: np.ndarray, subsets: dict,
                             n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Fig. 7(b)'s trend d = mean gap of the middle compositions − that of the two ends (as trend_table),
    with an interval that resamples query groups as well as seeds: replicate b weights the instance
    (seed s, token of group g) by c_seed[b, s] · c_group[b, g], both bootstrap counts (seeds drawn
    first, then groups, from one generator); the gaps of every k use the same weights (paired). Also
    middle − each end alone (d_sparse, d_saturated) and each end's own gap (gap_sparse, gap_saturated)
    on the same replicates."""
    d = sw[sw.panel == "composition"]
    if not len(d):
        return pd.DataFrame()
    seeds, groups = np.sort(d.seed.unique()), np.unique(group_of_tok[d.tok.to_numpy()])
    rng = np.random.default_rng(seed)
    cs = np.stack([np.bincount(i, minlength=len(seeds)) for i in rng.integers(0, len(seeds), (n_boot, len(seeds)))])
    cg = np.stack([np.bincount(i, minlength=len(groups)) for i in rng.integers(0, len(groups), (n_boot, len(groups)))])
    v_all = tokens.delta_hat.to_numpy()
    xs = np.sort(d.x.unique())
    rows = []
    for name, m in subsets.items():
        gaps, reps = [], []
        for x in xs:
            dx = d[d.x == x]
            tok = dx.tok.to_numpy()
            sel = np.asarray(m)[tok]
            tok, st = tok[sel], dx.status.to_numpy()[sel]
            si, gi = np.searchsorted(seeds, dx.seed.to_numpy()[sel]), np.searchsorted(groups, group_of_tok[tok])
            # per (seed, group) cell: #boosted, Σ v, #suppressed, Σ v (seed_sums over the flat cell index)
            sums = seed_sums(v_all[tok], st, si * len(groups) + gi, len(seeds) * len(groups)).reshape(
                len(seeds), len(groups), 4)
            gaps.append(pooled_gap(v_all[tok], st))
            reps.append(_gap_of(np.einsum("bs,bg,sgk->bk", cs, cg, sums)))
        G0, R = np.array(gaps), np.stack(reps)
        ends, mid = [0, len(xs) - 1], list(range(1, len(xs) - 1)) or [0]
        lo, hi = interval(R[mid].mean(0) - R[ends].mean(0))
        row = dict(subset=name, d=float(G0[mid].mean() - G0[ends].mean()), d_lo=lo, d_hi=hi,
                   n_seeds=len(seeds), n_groups=len(groups))
        for e, i in (("sparse", 0), ("saturated", len(xs) - 1)):  # middle − each end alone, same replicates
            lo, hi = interval(R[mid].mean(0) - R[i])
            row.update({f"d_{e}": float(G0[mid].mean() - G0[i]), f"d_{e}_lo": lo, f"d_{e}_hi": hi})
            lo, hi = interval(R[i])  # the end's own gap ("diminishes or even becomes negative")
            row.update({f"gap_{e}": float(G0[i]), f"gap_{e}_lo": lo, f"gap_{e}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def trend_two_way(sw: pd.DataFrame, tokens: pd.DataFrame, panel: str, cluster_of_tok: np.ndarray, subsets: dict,
                  n_boot: int = 1000, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Fig. 6 (a)/(b)'s trend d = gap(largest budget) − gap(smallest) (as trend_table) with an interval
    that resamples the clusters of the valued tokens (`cluster_of_tok`, one label per row of `tokens`:
    the token itself, its rollout or its query) as well as the seeds: replicate b weights the instance
    (seed s, token of cluster c) by c_seed[b, s] · c_cluster[b, c] (seeds drawn first, then clusters,
    from one generator; the same weights for both budgets: paired). Per subset and 'within_sign' (the
    mean of the gaps inside positive and inside negative rollouts). Returns (rows, replicates of d by
    name): d, d_lo, d_hi, n_seeds, n_clusters."""
    d = sw[sw.panel == panel]
    if not len(d):
        return pd.DataFrame(), {}
    seeds = np.sort(d.seed.unique())
    labels = np.asarray(cluster_of_tok)
    clusters = np.unique(labels[np.unique(d.tok.to_numpy())])
    rng = np.random.default_rng(seed)
    cs = np.stack([np.bincount(i, minlength=len(seeds)) for i in rng.integers(0, len(seeds), (n_boot, len(seeds)))])
    cc = np.stack([np.bincount(i, minlength=len(clusters))
                   for i in rng.integers(0, len(clusters), (n_boot, len(clusters)))])
    v_all = tokens.delta_hat.to_numpy()
    pos = (tokens.reward > 0.5).to_numpy()
    xs = np.sort(d.x.unique())
    ends = (xs[0], xs[-1])

    def gap_and_reps(x, keep):
        dx = d[d.x == x]
        tok = dx.tok.to_numpy()
        sel = keep[tok]
        tok, st = tok[sel], dx.status.to_numpy()[sel]
        si, ci = np.searchsorted(seeds, dx.seed.to_numpy()[sel]), np.searchsorted(clusters, labels[tok])
        sums = seed_sums(v_all[tok], st, si * len(clusters) + ci, len(seeds) * len(clusters)).reshape(
            len(seeds), len(clusters), 4)
        return pooled_gap(v_all[tok], st), _gap_of(np.einsum("bs,bc,sck->bk", cs, cc, sums))

    rows, reps = [], {}
    for name in list(subsets) + ["within_sign"]:
        if name == "within_sign":
            parts = [[gap_and_reps(x, pos == sgn) for sgn in (True, False)] for x in ends]
            g = [(a[0] + b[0]) / 2 for a, b in parts]
            r = [(a[1] + b[1]) / 2 for a, b in parts]
        else:
            m = np.asarray(subsets[name], bool)
            g, r = zip(*[gap_and_reps(x, m) for x in ends])
        reps[name] = r[1] - r[0]
        lo, hi = interval(reps[name])
        rows.append(dict(panel=panel, subset=name, d=float(g[1] - g[0]), d_lo=lo, d_hi=hi, n_seeds=len(seeds),
                         n_clusters=len(clusters)))
    return pd.DataFrame(rows), reps


def needed(nb: dict, S: int, M: int, N: int, target: float | None = None, z: float = 2.0) -> dict:
    """The smallest seeds S', continuations M' or pool size N' (one at a time, others as
    measured) that bring the standard error of d below |target|/z (target: the measured d);
    inf where the other components alone already exceed it."""
    t = abs(nb["d"] if target is None else target)
    cap = (t / z) ** 2
    vs, vm, vp = (0.0 if np.isnan(nb["var_seed"]) else nb["var_seed"]), nb["var_mc"], nb["var_pool"]
    out = {}
    # the MC term scales as 1/(M·N): a larger pool shrinks it as well as the pool term
    for name, own, n0 in (("seeds", vs, S), ("M", vm, M), ("pool", vp + vm, N)):
        rest = vs + vm + vp - own
        out[name] = float(np.ceil(n0 * own / (cap - rest))) if cap > rest else np.inf
        if own == 0 and cap > rest:
            out[name] = float(n0)
    # all three scaled together by the same factor f (the cheapest combined reading)
    total = vs + vm + vp
    out["factor_all"] = float(total / cap) if cap > 0 else np.inf
    out["se"] = float(np.sqrt(total))
    return out


def seeds_needed(nb: dict, S: int, z: float = 2.0) -> float:
    """The seeds S' that bring the standard error of d below |d|/z when every term of its variance
    scales as 1/S: each seed draws fresh sub-batches *and* fresh valued rollouts, so the Monte Carlo
    term averages over seeds too (budget.needed's `seeds` keeps it fixed: an upper bound here)."""
    cap = (abs(nb["d"]) / z) ** 2
    tot = (0.0 if np.isnan(nb["var_seed"]) else nb["var_seed"]) + nb["var_mc"]
    return float(np.ceil(S * tot / cap)) if cap > 0 else np.inf


def trend_table(sw: pd.DataFrame, tokens: pd.DataFrame, gaps: pd.DataFrame, reps: dict, subsets: dict,
                M: int) -> pd.DataFrame:
    """Per panel and subset: the trend d with its paired 95% interval — (a)/(b): gap(largest budget) −
    gap(smallest) and the least-squares slope per doubling; 7(b): the mean gap of the middle
    compositions (k = 2..G−2) − that of the two ends (k = 1 sparse, k = G−1 saturated; also against
    each end alone: d_sparse, d_saturated) — and its noise
    budget (trend_noise; seeds_needed, and budget.needed for the continuations M, that make |d|
    twice its SE)."""
    se = tokens.delta_se.to_numpy()
    out = []
    for panel in gaps.panel.unique():
        d = sw[sw.panel == panel]
        xs = sorted(gaps[gaps.panel == panel].x.unique())
        if len(xs) < 2:
            continue
        S = d.seed.nunique()

        def w_of(x, m):
            dx = d[d.x == x]
            sel = np.asarray(m)[dx.tok.to_numpy()]
            return gap_weights_pooled(dx.tok.to_numpy()[sel], dx.status.to_numpy()[sel], len(tokens))

        for name in list(subsets) + ["within_sign"]:
            scope = "within_sign" if name == "within_sign" else "valued"
            sub = "all" if name == "within_sign" else name
            g = gaps[(gaps.panel == panel) & (gaps.subset == sub) & (gaps.scope == scope)].set_index("x").gap
            G0 = np.array([g[x] for x in xs])
            R = np.stack([reps[(panel, x, name)] for x in xs])
            if panel == "composition":
                ends = [0, len(xs) - 1]
                mid = list(range(1, len(xs) - 1)) or [0]
                dd, dr = G0[mid].mean() - G0[ends].mean(), R[mid].mean(0) - R[ends].mean(0)
                frm, to, slope, sr = "ends", "middle", np.nan, (np.nan, np.nan)
                ends_split = {f"d_{e}": (float(G0[mid].mean() - G0[i]), *interval(R[mid].mean(0) - R[i]))
                              for e, i in (("sparse", 0), ("saturated", len(xs) - 1))}
                wa = wb = None
                if name != "within_sign":
                    m = subsets[name]
                    wa = np.mean([w_of(xs[i], m) for i in ends], 0)
                    wb = np.mean([w_of(xs[i], m) for i in mid], 0)
            else:
                dd, dr = G0[-1] - G0[0], R[-1] - R[0]
                lx = np.log2(xs)
                X = (lx - lx.mean()) / ((lx - lx.mean()) ** 2).sum()
                slope, sr = float(X @ G0), interval(X @ R)
                frm, to = str(xs[0]), str(xs[-1])
                wa = wb = None
                if name != "within_sign":
                    wa, wb = w_of(xs[0], subsets[name]), w_of(xs[-1], subsets[name])
            lo, hi = interval(dr)
            row = dict(panel=panel, subset=name, frm=frm, to=to, d=float(dd), d_lo=lo, d_hi=hi,
                       slope_per_doubling=slope, slope_lo=sr[0], slope_hi=sr[1], n_seeds=S)
            if panel == "composition":   # middle − each end alone: which end makes the difference
                for k_, (g_, l_, h_) in ends_split.items():
                    row.update({k_: g_, f"{k_}_lo": l_, f"{k_}_hi": h_})
            if wa is not None:
                nb = trend_noise(dd, dr, wa, wb, se)
                need = needed(nb, S=S, M=M, N=len(tokens))
                row.update(var_seed=nb["var_seed"], var_mc=nb["var_mc"], se=need["se"],
                           need_seeds=seeds_needed(nb, S), need_M=need["M"])
            out.append(row)
    return pd.DataFrame(out)
