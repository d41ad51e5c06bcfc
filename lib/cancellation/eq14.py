"""Eq. 14: the noise of a mini-batch update along the directions a query's rollouts share
(docs/methods.md, "Batching interventions", item (4); notebook 07).

With G_i = Σ_t ∇log π(y_{i,t}) a rollout's score and c_g = (1/n_g) Σ_{i∈g} G_i the mean score of group g,
a mini-batch B's gradient holds s_B = −(1/T_B) Σ_g S_{B,g} c_g, S_{B,g} = Σ_{i∈B∩g} A_i; `shared_energy`
is Σ_B (T_B/T) ||s_B||² over a plan's mini-batches, 0 under QB and for the grouped update.
`shared_weights` gives the row weights that turn s_B into one backward, `group_score_gram` the Gram of
the c_g when they fit in memory. Every gradient is taken at θ with no step (`grpo.minibatch_grads`).
`local_imbalance` measures one batch under draws of several plans (notebook 07's Eq. 14 table).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from . import batching, grpo, measure
from .seeds import derive


def shared_weights(group: torch.Tensor, advantage: torch.Tensor, plan: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per mini-batch B of `plan`, row weights w_i = S_{B,g(i)} / n_{g(i)} over the whole batch (n_g: the
    group's rows, S_{B,g}: its local advantage sum in B, 0 for groups B does not hold). Σ_i w_i G_i =
    Σ_g S_{B,g} c_g with c_g = (1/n_g) Σ_{i∈g} G_i, the direction a group's rollouts share: B's gradient
    along its groups' shared directions (`shared_energy`). A group wholly inside B contributes
    Σ_{i∈g} A_i = 0 (group-normalised advantages): its round-off sum is set to exactly 0."""
    group = torch.as_tensor(group)
    adv = torch.as_tensor(advantage, dtype=torch.float64)
    n = {g: int((group == g).sum()) for g in torch.unique(group).tolist()}
    tol = 1e-9 * max(float(adv.abs().max()) if len(adv) else 0.0, 1.0)
    out = []
    for r in plan:
        r = torch.as_tensor(r)
        w = torch.zeros(len(group), dtype=torch.float64)
        for g in torch.unique(group[r]).tolist():
            inside = r[group[r] == g]
            s = float(adv[inside].sum())
            if len(inside) == n[g] and abs(s) <= tol:
                continue
            w[group == g] = s / n[g]
        out.append(w)
    return out



def group_score_gram(model, batch, cfg: grpo.UpdateConfig, old_logp=None, max_bytes: float = 2 ** 30):
    """(groups, Gram) of the groups' mean scores c_g = (1/n_g) Σ_{i∈g} G_i (G_i = Σ_t ∇ log π(y_{i,t}) over the
    `cfg.scope` parameters, at θ): Gram[g, h] = ⟨c_g, c_h⟩ in float64. Each c_g is one backward over its
    group's rows with unit weights at ρ = 1 (the update's own loss: −(1/T_g) Σ_{i∈g} G_i). It keeps every c_g
    (groups × parameters × 8 bytes): None when that exceeds `max_bytes` (`shared_energy` then takes the
    memory-bounded way)."""
    params = grpo.scope_params(model, cfg.scope)
    groups = torch.unique(batch.group)
    if len(groups) * sum(p.numel() for p in params) * 8 > max_bytes:
        return None
    if old_logp is None:
        old_logp = measure.token_stats(model, batch, cfg).logp
    unit = dataclasses.replace(cfg, reweight="grpo")
    ones = torch.ones(len(batch), dtype=torch.float64)
    C = []
    with grpo.only_grad_for(model, params), grpo.checkpointing(model, cfg.gradient_checkpointing):
        for g in groups.tolist():
            rows = torch.nonzero(batch.group == g).flatten()
            model.zero_grad(set_to_none=True)
            grpo.accumulate_grad(model, batch, rows, old_logp, ones, unit)
            T_g = float(batch.response_mask[rows].sum())
            grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).double().flatten().cpu()
                              for p in params])
            C.append(grad * (-T_g / len(rows)))
    model.zero_grad(set_to_none=True)
    C = torch.stack(C)
    return groups, C @ C.T


def shared_energy(model, batch, plan, cfg: grpo.UpdateConfig, old_logp=None, gram=None) -> float:
    """Eq. 14's noise along shared directions, at θ (no step): Σ_B (T_B/T) ||s_B||² over the mini-batches
    of `plan`, where s_B = −(1/T_B) Σ_g S_{B,g} c_g is the part of B's gradient (ρ = 1, token mean) along the
    directions its groups' rollouts share, c_g = (1/n_g) Σ_{i∈g} G_i (G_i = Σ_t ∇ log π(y_{i,t}): rollout i's
    score), S_{B,g} = Σ_{i∈B∩g} A_i. The grouped update holds none of it (Σ_{i∈g} A_i = 0), nor does a QB
    mini-batch.

    With `gram` (`group_score_gram`'s (groups, Gram)) it is Σ_B S_B·Gram·S_B / (T·T_B), no model call.
    Without, each mini-batch takes one backward over the batch and no gradient is kept (memory as a
    training step's): s_B is T/T_B times the whole batch's gradient under row weights S_{B,g(i)} / n_{g(i)}
    (`shared_weights`)."""
    weight = grpo.reweight_advantage(batch, cfg.reweight)
    T = float(batch.response_mask.sum())
    W = shared_weights(batch.group, weight, plan)
    if gram is not None:
        groups, M = gram
        first = [int(torch.nonzero(batch.group == g)[0]) for g in groups.tolist()]
        n = torch.tensor([int((batch.group == g).sum()) for g in groups.tolist()], dtype=torch.float64)
        total = 0.0
        for rows, w in zip(plan, W):
            S = w[first] * n    # S_{B,g}: w holds S_{B,g} / n_g on every row of g
            total += float(S @ M @ S) / (T * float(batch.response_mask[torch.as_tensor(rows)].sum()))
        return total
    if old_logp is None:
        old_logp = measure.token_stats(model, batch, cfg).logp
    every = torch.arange(len(batch))
    total = 0.0
    for rows, w in zip(plan, W):
        if not bool(w.abs().max() > 0):
            continue   # every group of B is whole: s_B = 0
        b = dataclasses.replace(batch, advantage=w)
        g = grpo.minibatch_grads(model, b, [every], dataclasses.replace(cfg, reweight="grpo"), old_logp)[0]["grad_norm"]
        total += T / float(batch.response_mask[torch.as_tensor(rows)].sum()) * g ** 2
    return total


def local_imbalance(model, batch, cfg: grpo.UpdateConfig, plans: dict[str, str], draws: int, seed: int) -> list[dict]:
    """Eq. 14 on one batch at θ (no step), split by `draws` draws of each plan of `plans` (name: the plan
    `batching.make_plan` draws; draw k seeded by `derive(seed, "plan", k)`, so draw 0 is the split a run of
    that seed uses at iteration 0). One row per (plan, draw):

    - `retained`: the local cross-advantage mass Σ_{B,g} (S_B² − Σ_{i∈B} A_i²) over the grouped one
      Σ_g −Σ A_i² (1 when every group shares one mini-batch, as under QB; `batching.cross_advantage`),
      and `retained_expected`, its mean over random plans in closed form (`same_minibatch_probability`);
    - `sb_nonzero`: the share of (mini-batch, group) cells of groups with A ≠ 0 where S_B ≠ 0;
    - `grad_var`: how far the mini-batch gradients g_B scatter around the whole batch's gradient g (the
      grouped update), Σ_B (T_B/T) ||g_B − g||² = Σ_B (T_B/T) ||g_B||² − ||g||² (T_B: the mini-batch's
      response tokens; at ρ = 1 the loss is linear, so Σ_B (T_B/T) g_B = g), every gradient at the
      starting θ (`grpo.minibatch_grads`: no step), so only the split differs; `grad_sq` is the first
      sum, `full_sq` = ||g||²;
    - `shared_sq`: the part of that scatter along the directions a split query's rollouts share,
      Σ_B (T_B/T) ||s_B||² with s_B = −(1/T_B) Σ_g S_{B,g} c_g (`shared_energy`; 0 under QB);
    - `cross_sign`, `cross_sign_group`: the share of the batch's (of each query group's) cross-sign
      advantage products |A_i A_j| (A_i A_j < 0) whose rollouts share a mini-batch
      (`batching.cross_sign_share`): 0 exactly for a plan whose every mini-batch holds one sign;
    with the batch's seed, rows, mini-batches and groups with A ≠ 0 (live_groups).
    """
    old = measure.token_stats(model, batch, cfg).logp
    live = set(batch.group[batch.advantage != 0].tolist())
    full_sq = grpo.minibatch_grads(model, batch, [torch.arange(len(batch))], cfg, old_logp=old)[0]["grad_norm"] ** 2
    gram = group_score_gram(model, batch, cfg, old_logp=old)   # None at large models
    rows = []
    for name, plan_name in plans.items():
        for draw in range(draws):
            plan = batching.make_plan(plan_name, batch.group, batch.advantage, cfg.n_minibatches,
                                      seed=derive(seed, "plan", draw))   # draw 0: iteration 0's plan
            x = batching.cross_advantage(batch.group, batch.advantage, plan)
            grouped = x.drop_duplicates("group").grouped.sum()
            cells = x[x.group.isin(live)]
            info = grpo.minibatch_grads(model, batch, plan, cfg, old_logp=old)
            w = np.array([i["n_tokens"] for i in info], float)
            g_sq = float((w / w.sum()) @ np.square([i["grad_norm"] for i in info]))
            shared = shared_energy(model, batch, plan, cfg, old_logp=old, gram=gram)
            xs, xs_group = batching.cross_sign_share(batch.group, batch.advantage, plan)
            rows.append(dict(seed=seed, strategy=name, draw=draw, rows=len(batch),
                             minibatches=len(plan), live_groups=len(live),
                             retained=float(x.cross.sum() / grouped) if grouped else np.nan,
                             retained_expected=batching.same_minibatch_probability(plan),
                             sb_nonzero=float((cells.S_B.abs() > 1e-9).mean()) if len(cells) else np.nan,
                             grad_sq=g_sq, full_sq=full_sq, grad_var=g_sq - full_sq, shared_sq=shared,
                             cross_sign=xs, cross_sign_group=xs_group))
    return rows
