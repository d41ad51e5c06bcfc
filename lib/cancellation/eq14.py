"""Eq. 14: the noise of a mini-batch update along the directions a query's rollouts share
(docs/methods.md, "Batching interventions", item (4); notebook 07).

With G_i = Σ_t ∇log π(y_{i,t}) a rollout's score and c_g = (1/n_g) Σ_{i∈g} G_i the mean score of group g,
a mini-batch B's gradient holds s_B = −(1/T_B) Σ_g S_{B,g} c_g, S_{B,g} = Σ_{i∈B∩g} A_i; `shared_energy`
is Σ_B (T_B/T) ||s_B||² over a plan's mini-batches, 0 under QB and for the grouped update.
`shared_weights` gives the row weights that turn s_B into one backward, `group_score_gram` the Gram of
the c_g when they fit in memory. Every gradient is taken at θ with no step (`grpo.minibatch_grads`).
"""
from __future__ import annotations

import dataclasses

import torch

from . import grpo, measure


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
