"""The cancellation hypothesis as a test that could come out against the paper (notebook 04, App. E.1).

On one fixed batch and one saved θ₀, single SGD updates are taken from θ₀ and Δlog p is measured on
the whole batch after each (`fig04.batch_deltas`): positive-only (A·1[r=1]), negative-only (A·1[r=0]),
GRPO (A); GRPO with the *opposite-sign copies* masked (`copies_mask`: each token of an A < 0 rollout
whose id occurs in an A > 0 rollout of its group gets loss weight 0); GRPO with *random masks disjoint from
the copies* (`random_mask`: in every group and confidence bin, as many of the other A < 0 tokens as there are
copies, or all of them when they are fewer; the mean over draws). Besides, each token's first-order Δ under an
LM-head GRPO step (Eq. 9, δ_j = η/N Σ_k A_k K_jk) split by where its terms come from (`first_order_terms`).

The null (`null_batch`): K within-group shuffles of every batch's rewards and advantages (`shuffles`), and the
three single steps under each, exact to float round-off through per-rollout gradients (`rollout_gradients`,
`null_deltas`: the loss is linear in the per-rollout weights at ρ = 1). `thesis_null.null_cells` pools each
shuffle's sums over every batch for every definition of its NULL_DEFNS; `thesis_null.null_values` gives each
shuffle's statistics, `thesis_null.null_bands` the real value against the null's median, central 95% and permutation p.

Classes. A token of an A > 0 rollout is *shared* when it also occurs in an A < 0 rollout of the same
group, else *specific*; mirrored for A < 0. "Occurs" has three definitions (`DEFNS`): **ids** — the same
token id anywhere in the rollout (a bag of ids); **context** — the same id after the same k preceding
response tokens (`context_keys`; k chosen by a rule fixed before any row is read: the smallest k whose
specific share is at least `MIN_SPECIFIC` in both pools, `choose_k`); **state** — the same response prefix up to
and including the token (`state_keys`). Every class statistic is also given on the shared tokens at another
state than any copy's and at a copy's own state (`STATES`, `state_view`): at one state the two signs' gradients
add at one input, so only the others test coupling between different states. Zero-advantage groups carry no
signal and are left out.

Statistics (one pool at a time; single = positive-only for A > 0, negative-only for A < 0):
- cancellation of a class: its mean of Δ_GRPO − Δ_single (what adding the opposite sign did);
- retained share: Σ Δ_GRPO / Σ Δ_single over the class (< 1: GRPO kept less than the single-sign step);
- amplification of the specific class: the same ratio (> 1: GRPO gave it more than the single-sign step);
- the contrast: shared − specific cancellation, matched within token id × confidence bin;
- copies vs random: on shared A > 0 tokens, the mean of Δ_copies-masked − Δ_random-masked;
- frequency: the shared class's cancellation for high- minus low-frequency ids (an id's count in its
  batch at or above the batch's token-weighted median), matched within confidence bin;
- mechanism: the first-order opposite-sign terms of the shared class, and the same-id share of them.
Intervals: percentile bootstrap over batches, then over the groups of each drawn batch (one set of
draws per pool for every statistic: paired), `cluster_bootstrap`; none below `MIN_BATCHES` batches.

`cells` reduces the token table to the sufficient statistics (per definition, batch, group, pool,
class, state view, category, token id and confidence bin: the count and the sum of every Δ and first-order term,
the masks' sizes), the committed table `fig04_thesis_cells.parquet` (`n_fo`: the tokens among `n` whose
first-order terms were computed, all of them unless `fo_tokens` caps it); every statistic and interval is a
function of it. The decision rule and the rows are `figures/fig04_claims.thesis_claims`.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from . import coupling, grpo
from . import stats as S

UPDATES = ("positive_only", "negative_only", "grpo", "grpo_masked", "grpo_random")
PERMUTED = ("positive_only", "negative_only", "grpo")          # the updates rerun under each sign shuffle (the null)
FIRST_ORDER = ("fo_same_id_group", "fo_same_id_other", "fo_other_id", "fo_same_sign")
DEFNS = ("ids", "context", "state")
STATES = ("all", "other", "same")   # the shared class whole, its tokens at another state than any copy's, at the same
POOLS = ("pos", "neg")
CLASSES = ("shared", "specific")
KEYS = ["defn", "batch", "group", "pool", "cls", "state", "category", "token_id", "bin"]
SUMS = [f"sum_{u}" for u in UPDATES + FIRST_ORDER]
MASK_SIZES = ["n_copy", "n_random", "n_overlap"]
MIN_BATCHES = 5      # fewer batches: no interval (a percentile bootstrap over 2-4 batches says little)
MIN_SPECIFIC = 0.2   # the context definition's k: the smallest whose specific share reaches this in both pools
MAX_K = 4
SUMMARY_COLUMNS = ["defn", "states", "pool", "category", "statistic", "value", "lo", "hi", "n_shared", "n_specific",
                   "clusters", "batches"]


# ----------------------------------------------------------------------------- the updates' inputs
def copies_mask(batch) -> torch.Tensor:
    """(B, L) loss weights: 0 on each token of an A < 0 rollout whose token id occurs among the
    response tokens of an A > 0 rollout of the same group, 1 elsewhere."""
    w = torch.ones(batch.input_ids.shape, dtype=torch.float64, device=batch.input_ids.device)
    m, adv = batch.response_mask.bool(), batch.advantage
    for g in batch.group.unique():
        rows = batch.group == g
        pos, neg = rows & (adv > 0), rows & (adv < 0)
        if not pos.any() or not neg.any():
            continue
        ids = batch.input_ids[pos][m[pos]].unique()
        hit = torch.isin(batch.input_ids, ids) & m & neg[:, None]
        w[hit] = 0.0
    return w


def random_mask(batch, copies: torch.Tensor, prob: torch.Tensor, bins, seed: int) -> torch.Tensor:
    """(B, L) loss weights of the null for `copies_mask`, disjoint from the copies: in every group and confidence
    bin (edges `bins` on p = `prob`), as many A < 0 response tokens as the copies mask zeroes there, or all the
    non-copies there when they are fewer, drawn uniformly at random among that cell's A < 0 tokens that are not
    copies, get weight 0. No token is in both masks (a mask that overlaps the copies mostly re-masks them and
    tests the non-copies it leaves out, not the copies); the achieved size against the copies' is what
    `masked_sizes` reports, and a row reads "not decidable" where it falls short (fig04_claims)."""
    w = torch.ones_like(copies)
    m = batch.response_mask.bool() & (batch.advantage < 0)[:, None]
    b = torch.bucketize(prob.double().cpu(), torch.as_tensor(bins, dtype=torch.float64), right=True)
    gen = torch.Generator().manual_seed(seed)
    g_of = batch.group[:, None].expand_as(batch.input_ids).cpu()
    m, zero = m.cpu(), (copies == 0).cpu()
    for g in batch.group.unique().tolist():
        for k in b[m & (g_of == g)].unique().tolist():
            cell = m & (g_of == g) & (b == k)
            n = int((cell & zero).sum())
            free = (cell & ~zero).nonzero()
            pick = free[torch.randperm(len(free), generator=gen)[:n]]
            w[pick[:, 0], pick[:, 1]] = 0.0
    return w


def permuted(batch, seed: int):
    """The batch with its rollouts' rewards and advantages shuffled within each group (the same
    multiset per group, so mixed groups stay mixed): one draw of the null's law (`shuffles` with K = 1)."""
    o = shuffles(batch, 1, seed)[0].to(batch.reward.device)
    return replace(batch, reward=batch.reward[o], advantage=batch.advantage[o])


# ----------------------------------------------------------------------------- the sign-shuffle null
def shuffles(batch, K: int, seed: int) -> torch.Tensor:
    """(K, B) row orders, each shuffling the rollouts within every group (the same multiset of rewards and
    advantages per group, so mixed groups stay mixed), seeded: order k of the null is `row[order[k]]`."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.arange(len(batch)).repeat(K, 1)
    groups = [(batch.group == g).nonzero().squeeze(1).cpu() for g in batch.group.unique()]
    for k in range(K):
        for rows in groups:
            out[k, rows] = rows[torch.randperm(len(rows), generator=gen)]
    return out


def shuffle_weights(batch, orders: torch.Tensor, update: str) -> torch.Tensor:
    """(K, B) per-rollout weights of `update` (grpo.REWEIGHTS: A, A·1[r=1], A·1[r=0]) under each order."""
    A, r = batch.advantage.to(torch.float64).cpu(), batch.reward.to(torch.float64).cpu()
    return torch.stack([grpo.REWEIGHTS[update](A[o], r[o]) for o in orders])


def rollout_gradients(model, batch, knobs, scope: str = "full", n_tokens=None) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Per-rollout gradients at θ₀: (the update's parameters, (B, P) rows G_r, the log-probs at θ₀) where G_r is the gradient of
    rollout r's share of the GRPO loss with advantage 1, under the batch's token mean. The loss is linear in
    the advantages at ρ = 1 (no clip binds there; no KL, no gradient clipping), so one SGD step's gradient
    under any per-rollout weights w is exactly Σ_r w_r G_r (up to the order of float additions): every
    within-group sign shuffle's step direction is one matrix product, and only its "after" forward is
    left to run (`null_deltas`). `n_tokens`: the token mean's denominator when `batch` is a sub-batch (the
    rollouts of mixed groups: the others have A = 0 under every shuffle) of a batch of that many response
    tokens; default `batch`'s own. Memory: B × P numbers (tiny-m float64: 64 × 1.06M, 0.5 GB)."""
    params = grpo.scope_params(model, scope)
    cfg = knobs.update(optimizer="sgd", lr=1.0, scope=scope, reweight="grpo")
    before = grpo.token_stats(model, batch, cfg).logp
    n_batch = (batch.response_mask.sum() if n_tokens is None else torch.as_tensor(n_tokens)).clamp(min=1).double()
    G = torch.zeros(len(batch), sum(p.numel() for p in params), dtype=torch.float64)
    for r in range(len(batch)):
        n_r = batch.response_mask[r].sum()
        if n_r == 0:
            continue
        w = torch.zeros(len(batch), dtype=torch.float64)
        w[r] = 1.0
        for p in params:
            p.grad = None
        with grpo.only_grad_for(model, params):
            grpo.accumulate_grad(model, batch, torch.tensor([r]), before, w, cfg)
        # accumulate_grad takes the token mean over its rows (rollout r alone): rescale to the batch's
        G[r] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double().cpu()
                          for p in params]) * (n_r.double() / n_batch)
    for p in params:
        p.grad = None
    return params, G, before


def null_deltas(model, batch, knobs, lr: float, weights: torch.Tensor, scope: str = "full", G=None) -> torch.Tensor:
    """(M, B, L) Δlog p of the whole batch after one SGD step of rate `lr` from θ₀ whose gradient is
    Σ_r weights[m, r] G_r (`G`: what `rollout_gradients` returns, computed here when None), for each of the M rows of `weights`; θ₀ back after each
    (on a copy of the model). Equals `grpo.Trials.delta` of the same step to float round-off
    (tests/test_thesis.py): a shuffle costs one forward, not a backward and a forward."""
    params, G, before = G if G is not None else rollout_gradients(model, batch, knobs, scope)
    cfg = knobs.update(optimizer="sgd", lr=lr, scope=scope, reweight="grpo")
    work = copy.deepcopy(model)
    wparams = grpo.scope_params(work, scope)
    theta0 = [p.detach().clone() for p in params]
    out = torch.empty((len(weights),) + tuple(batch.input_ids.shape), dtype=before.dtype)
    for m, w in enumerate(weights):
        g = w.to(G.dtype) @ G
        with torch.no_grad():
            i = 0
            for q, p0 in zip(wparams, theta0):
                n = p0.numel()
                q.copy_(p0 - lr * g[i:i + n].view_as(p0).to(p0.dtype))
                i += n
        out[m] = (grpo.token_stats(work, batch, cfg).logp - before).cpu()
    return out


def mixed_rows(batch) -> torch.Tensor:
    """The rows of groups with both rewards (the only ones with A ≠ 0, under the real signs and every shuffle)."""
    keep = torch.zeros(len(batch), dtype=torch.bool)
    for g in batch.group.unique():
        rows = (batch.group == g).cpu()
        r = batch.reward.cpu()[rows]
        keep |= rows & bool(r.min() != r.max())
    return keep.nonzero().squeeze(1)


G_LIMIT = 2 ** 31   # bytes of the per-rollout gradient matrix the null's shortcut may hold (else exact steps)


def null_batch(model, batch, knobs, lr: float, K: int, seed: int, scope: str = "full", G_limit: float = G_LIMIT) -> dict:
    """The sign-shuffle null of one batch: K within-group shuffles (`shuffles`, seeded), and Δlog p of every response
    token after the SGD step (rate `lr`, from θ₀) of each update of PERMUTED under each shuffle. Only the rollouts of
    mixed groups are forwarded (the others carry A = 0 whatever the order; their tokens belong to no class): NaN
    there. Returns {"adv": (K, N) each token's shuffled advantage, u: (K, N) per update, "real_grpo": (N,) the real
    signs' GRPO Δ through the same path (to check against the exact step), "path": 'gradients' or 'steps'}, N the
    batch's response tokens in row-major order (the token table's).

    Path: `rollout_gradients` once (a backward per mixed rollout), then one matrix product and one forward per
    shuffle and update (`null_deltas`; the exact step to float round-off) when its (rollouts × parameters) float64
    matrix fits in `G_limit` bytes; else the exact steps (`grpo.Trials`, a backward and a forward each: the paper's
    models)."""
    m = batch.response_mask
    tok_row = m.nonzero(as_tuple=True)[0].cpu()
    orders = shuffles(batch, K, seed)
    adv = batch.advantage.to(torch.float64).cpu()
    rows = mixed_rows(batch)
    on = torch.isin(tok_row, rows)
    out = {"adv": adv[orders][:, tok_row].numpy()}
    ident = torch.arange(len(batch))[None]
    n_params = sum(p.numel() for p in grpo.scope_params(model, scope))
    if len(rows) == 0:
        for u in PERMUTED:
            out[u] = np.full((K, len(tok_row)), np.nan)
        out.update(real_grpo=np.full(len(tok_row), np.nan), path="none")
        return out
    if len(rows) * n_params * 8 <= G_limit:
        sub = batch.select(rows)
        G = rollout_gradients(model, sub, knobs, scope, n_tokens=m.sum())
        for u in PERMUTED:
            o = torch.cat([ident, orders]) if u == "grpo" else orders
            W = shuffle_weights(batch, o, u)[:, rows]
            D = null_deltas(model, sub, knobs, lr, W, scope, G=G)[:, sub.response_mask.cpu()].double().numpy()
            arr = np.full((len(o), len(tok_row)), np.nan)
            arr[:, on.numpy()] = D
            if u == "grpo":
                out["real_grpo"], arr = arr[0], arr[1:]
            out[u] = arr
        out["path"] = "gradients"
        return out
    trials = grpo.Trials(model, batch, knobs, scope=scope)
    for u in PERMUTED:
        cfg = knobs.update(optimizer="sgd", lr=lr, scope=scope, reweight=u)
        o = torch.cat([ident, orders]) if u == "grpo" else orders
        arr = np.stack([trials.delta(cfg, replace(batch, reward=batch.reward[x.to(batch.reward.device)],
                                                    advantage=batch.advantage[x.to(batch.reward.device)]))[m]
                        .double().cpu().numpy() for x in o])
        arr[:, ~on.numpy()] = np.nan
        if u == "grpo":
            out["real_grpo"], arr = arr[0], arr[1:]
        out[u] = arr
    out["path"] = "steps"
    return out


def first_order_terms(f: coupling.Features, group: torch.Tensor, lr: float, chunk: int = 1024,
                      vocab_chunk: int = 8192, J=None) -> dict:
    """Token j's first-order Δ under one SGD LM-head GRPO step, δ_j = η/N Σ_k A_k K_jk (Eq. 9), split
    by the source k: the same id in an opposite-sign rollout of j's group (`fo_same_id_group`) or of
    another group (`fo_same_id_other`), another id in an opposite-sign rollout (`fo_other_id`), and
    everything else (same-sign rollouts, j itself, zero advantage: `fo_same_sign`). The four sum to
    `coupling.first_order_delta`. `group`: the group of each token of f. `J`: the tokens j to compute
    (indices into f; default all), each against every token k: the cost is |J| × N × vocabulary, so the
    paper profiles cap |J| (fig04's `fo_tokens`). Memory: one chunk × chunk block. Returns (|J|,) arrays."""
    dev, dt = f.h.device, f.h.dtype
    Ji = coupling._idx(J, len(f), dev)
    g = group.to(dev)
    sgn = torch.sign(f.A)
    out = {k: torch.zeros(len(Ji), dtype=dt, device=dev) for k in FIRST_ORDER}
    total = torch.zeros(len(Ji), dtype=dt, device=dev)
    for a, b, hg, phi in coupling.blocks(f, Ji, None, chunk, vocab_chunk):
        r, k = slice(a, a + hg.shape[0]), slice(b, b + hg.shape[1])
        j = Ji[r]
        t = hg * phi * f.A[k][None, :]
        opp = (sgn[j][:, None] * sgn[k][None, :]) < 0
        same = f.o[j][:, None] == f.o[k][None, :]
        grp = g[j][:, None] == g[k][None, :]
        out["fo_same_id_group"][r] += (t * (opp & same & grp)).sum(1)
        out["fo_same_id_other"][r] += (t * (opp & same & ~grp)).sum(1)
        out["fo_other_id"][r] += (t * (opp & ~same)).sum(1)
        total[r] += t.sum(1)
    out["fo_same_sign"] = total - out["fo_same_id_group"] - out["fo_same_id_other"] - out["fo_other_id"]
    return {k: lr / len(f) * v for k, v in out.items()}


# ----------------------------------------------------------------------------- classes
def context_keys(tokens: pd.DataFrame, k: int) -> list[str]:
    """Add columns prev1..prevk to `tokens` (in place): the ids of the k response tokens before each
    token in its rollout (-1 before the response starts); returns the key columns (token_id first)."""
    t = tokens.sort_values(["batch", "rollout", "position"])
    cols = ["token_id"]
    for i in range(1, k + 1):
        tokens[f"prev{i}"] = t.groupby(["batch", "rollout"]).token_id.shift(i).fillna(-1).astype(np.int64)
        cols.append(f"prev{i}")
    return cols


def state_keys(tokens: pd.DataFrame) -> list[str]:
    """Add column `state` to `tokens` (in place): per (batch, group), one id per distinct response prefix that
    ends in the token (the node of the group's prefix trie), so two tokens share a state exactly when their
    rollouts' responses agree up to and including them (the group's rollouts share the prompt). `classify` on
    it gives the *same-state* definition: a shared token is then the same state as an opposite-sign rollout's,
    where GRPO's two signals add at one input and no coupling between different states is needed (issue 61).
    Returns the key columns (["state"])."""
    t = tokens.sort_values(["batch", "group", "rollout", "position"])
    node, trie, out = 0, {}, np.empty(len(t), dtype=np.int64)
    prev_roll, cur = None, -1
    for i, (b, g, r, tok) in enumerate(zip(t.batch.to_numpy(), t.group.to_numpy(), t.rollout.to_numpy(),
                                           t.token_id.to_numpy())):
        if (b, r) != prev_roll:   # a rollout's first response token: its parent is the group's prompt (root)
            prev_roll, cur = (b, r), -1 - int(g)   # roots are negative, distinct per group (batch in the key below)
        key = (b, g, cur, int(tok))
        if key not in trie:
            trie[key] = node
            node += 1
        cur = out[i] = trie[key]
    tokens["state"] = pd.Series(out, index=t.index).reindex(tokens.index).to_numpy()
    return ["state"]


def classify(tokens: pd.DataFrame, keys=("token_id",), sign: str = "advantage") -> pd.Series:
    """Per token: 'shared' when its key (the id; with context, the id and its preceding ids) occurs in a
    rollout of the opposite sign (of column `sign`) in its group, else 'specific'; '' for zero sign."""
    keys = list(keys)
    t = tokens[["batch", "group"] + keys].assign(p=tokens[sign] > 0, n=tokens[sign] < 0)
    has = t.groupby(["batch", "group"] + keys)[["p", "n"]].any().rename(columns={"p": "in_pos", "n": "in_neg"})
    j = t.join(has, on=["batch", "group"] + keys)
    shared = (j.p & j.in_neg) | (j.n & j.in_pos)
    out = np.where(shared, "shared", "specific")
    return pd.Series(np.where(j.p | j.n, out, ""), index=tokens.index, name="cls")


def specific_shares(tokens: pd.DataFrame, max_k: int = MAX_K) -> pd.DataFrame:
    """Per definition (ids: k = 0; context: k = 1..max_k) and pool: the share of the pool's tokens
    that are specific, and the token count — what `choose_k` reads (no Δ is read)."""
    rows = []
    for k in range(max_k + 1):
        t = tokens.copy()
        cls = classify(t, context_keys(t, k))
        for pool, sel in (("pos", t.advantage > 0), ("neg", t.advantage < 0)):
            rows.append(dict(defn="ids" if k == 0 else "context", k=k, pool=pool, n=int(sel.sum()),
                             specific_share=float((cls[sel] == "specific").mean()) if sel.any() else np.nan))
    return pd.DataFrame(rows)


def choose_k(shares: pd.DataFrame, min_specific: float = MIN_SPECIFIC) -> int:
    """The context definition's k: the smallest k ≥ 1 whose specific share is at least `min_specific`
    in both pools (the largest k tried when none is)."""
    ctx = shares[shares.defn == "context"]
    ok = ctx.groupby("k").specific_share.min()
    hit = ok[ok >= min_specific]
    return int(hit.index.min()) if len(hit) else int(ok.index.max())


def cells(tokens: pd.DataFrame, bins, k: int) -> pd.DataFrame:
    """The sufficient statistics: per (defn, batch, group, pool, cls, state, category, token_id, bin) the token
    count `n` and the sums of Δ under every update and of every first-order term (`sum_<name>`).
    `tokens` needs delta_<u> for UPDATES, fo_<term>, copy_masked, random_masked, advantage, prob, category, rollout,
    position; `bins`: the
    confidence-bin edges on p; `k`: the context definition's k. `state`: 'same' where the token's whole prefix
    (and the token) occurs in an opposite-sign rollout of its group (`state_keys`), else 'other'; on the state
    definition the shared class is exactly the 'same' tokens."""
    t = tokens.copy()
    ctx = context_keys(t, k)
    state_keys(t)
    t["state_id"] = t.pop("state")   # the prefix-trie node; "state" becomes the view of the shared class
    t["bin"] = np.digitize(t.prob, bins)
    t["state"] = np.where(classify(t, ["state_id"]) == "shared", "same", "other")
    keys = {"ids": ["token_id"], "context": ctx, "state": ["state_id"]}
    out = []
    for defn in DEFNS:
        d = t.assign(cls=classify(t, keys[defn]), defn=defn)
        d = d[d.cls != ""]
        d = d.assign(pool=np.where(d.advantage > 0, "pos", "neg"))
        sums = {f"sum_{u}": d[f"delta_{u}"] for u in UPDATES} | {f"sum_{f}": d[f] for f in FIRST_ORDER}
        sums["n_fo"] = d[FIRST_ORDER[0]].notna().astype(int)   # tokens whose first-order terms were computed
        # the masks' sizes (A < 0 tokens): copies masked, random-masked (mean over draws), both at once
        sums |= {"n_copy": d.copy_masked.astype(float), "n_random": d.random_masked.astype(float),
                 "n_overlap": (d.copy_masked & (d.random_masked > 0)).astype(float)}
        d = d.assign(**sums)
        agg = {s: (s, "sum") for s in sums}
        out.append(d.groupby(KEYS, observed=True).agg(n=("token_id", "size"), **agg).reset_index())
    return pd.concat(out, ignore_index=True).reindex(columns=KEYS + ["n", "n_fo"] + SUMS + MASK_SIZES)


def state_view(c: pd.DataFrame, states: str) -> pd.DataFrame:
    """The cells of one view of the shared class (STATES): 'all' of it; 'other', its tokens at another state than
    any opposite-sign copy's (the specific class unchanged: where coupling between different states must act);
    'same', its tokens at a copy's own state (where the two signs' gradients add at one input)."""
    if states == "all":
        return c
    return c[(c.cls != "shared") | (c.state == states)]


def with_frequency(c: pd.DataFrame) -> pd.DataFrame:
    """`c` with column `freq`: 'high' where the id's count in its batch (this definition's tokens) is at
    or above the batch's token-weighted median id count, else 'low'."""
    cnt = c.groupby(["defn", "batch", "token_id"]).n.sum().rename("count")
    c = c.join(cnt, on=["defn", "batch", "token_id"])
    med = {}
    for (defn, b), d in c.groupby(["defn", "batch"]):
        v = d.groupby("token_id")["count"].first()
        order = np.sort(np.repeat(v.to_numpy(), v.to_numpy()))   # every token carries its id's count
        med[(defn, b)] = order[(len(order) - 1) // 2]
    m = np.array([med[(a, b)] for a, b in zip(c.defn, c.batch)])
    return c.assign(freq=np.where(c["count"].to_numpy() >= m, "high", "low")).drop(columns="count")


# ----------------------------------------------------------------------------- per-cell values
def single(pool: str) -> str:
    return "positive_only" if pool == "pos" else "negative_only"


def values(c: pd.DataFrame, pool: str) -> dict:
    """The per-cell sums every statistic is built from (all linear in the cells, so a bootstrap
    replicate is a weighted sum of them)."""
    s = lambda name: c[f"sum_{name}"].to_numpy(dtype=float)  # noqa: E731
    fo_same = s("fo_same_id_group") + s("fo_same_id_other")
    return {"single": s(single(pool)), "grpo": s("grpo"), "cancellation": s("grpo") - s(single(pool)),
            "copies_vs_random": s("grpo_masked") - s("grpo_random"), "copies_restore": s("grpo_masked") - s("grpo"),
            "random_restore": s("grpo_random") - s("grpo"), "fo_same_id": fo_same,
            "fo_same_id_group": s("fo_same_id_group"), "fo_other_id": s("fo_other_id"),
            "fo_opposite": fo_same + s("fo_other_id"),
            "N_fo": c["n_fo"].fillna(0).to_numpy(dtype=float) if "n_fo" in c else c.n.to_numpy(dtype=float)}


def arrays(c: pd.DataFrame, pool: str, clusters: pd.MultiIndex, cls_col: str = "cls", classes=CLASSES,
           strata=("token_id", "bin")) -> tuple:
    """Dense (clusters, strata, classes) arrays of token counts N and of every value's sums V (`values`)
    for the cells `c` of one pool, on the given cluster index ((batch, group) pairs)."""
    cl = clusters.get_indexer(pd.MultiIndex.from_frame(c[["batch", "group"]]))
    st, _ = pd.factorize(pd.MultiIndex.from_frame(c[list(strata)]))
    k = np.array([list(classes).index(x) for x in c[cls_col]], dtype=int)
    shape = (len(clusters), int(st.max()) + 1 if len(st) else 0, len(classes))
    N = np.zeros(shape)
    np.add.at(N, (cl, st, k), c.n.to_numpy())
    V = {}
    for name, v in values(c, pool).items():
        V[name] = np.zeros(shape)
        np.add.at(V[name], (cl, st, k), v)
    return N, V


# ----------------------------------------------------------------------------- statistics of the arrays
def contrast(n: np.ndarray, v: np.ndarray, how: str = "matched") -> np.ndarray:
    """class 0 − class 1 of per-class means, over the last two axes (strata, class): 'raw' pools the
    strata, 'matched' averages within-stratum differences with weights n₁n₂/(n₁+n₂)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if how == "raw":
            ns, vs = n.sum(-2), v.sum(-2)
            return vs[..., 0] / ns[..., 0] - vs[..., 1] / ns[..., 1]
        m = v / n
        w = n[..., 0] * n[..., 1] / (n[..., 0] + n[..., 1])
        d = np.where(w > 0, m[..., 0] - m[..., 1], 0.0)
        w = np.where(w > 0, w, 0.0)
        return (w * d).sum(-1) / w.sum(-1)


def class_mean(n, v, k: int):
    with np.errstate(invalid="ignore", divide="ignore"):
        return v[..., k].sum(-1) / n[..., k].sum(-1)


def class_ratio(a, b, k: int):
    with np.errstate(invalid="ignore", divide="ignore"):
        return a[..., k].sum(-1) / b[..., k].sum(-1)


def abs_share(a, b, k: int):
    """|Σa| / (|Σa| + |Σb|) over class k: a's share of the two sources' combined size."""
    x, y = np.abs(a[..., k].sum(-1)), np.abs(b[..., k].sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return x / (x + y)


def cluster_weights(batch_of: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, clusters) multiplicities of the two-stage bootstrap: batches with replacement, then
    the clusters (groups) of each drawn batch with replacement (`stats.nested(batch, cluster)`, drawn
    by `stats.cluster_resamples`)."""
    way = S.nested(batch_of, np.arange(len(batch_of)))
    return np.array(list(S.cluster_resamples([way], n_boot, seed)), dtype=float).reshape(n_boot, len(batch_of))


def cluster_bootstrap(arrs: dict, stat, W: np.ndarray, level: float = 0.95):
    """(point, lo, hi) of stat(dict of arrays summed over clusters) with the multiplicities W
    (n_boot, clusters): every replicate at once (W @ the per-cluster arrays). Replicates where the
    statistic is undefined are dropped; no interval (NaN) when that is over 5% of them."""
    C = W.shape[1]
    flat = lambda A, W: (W @ A.reshape(C, -1)).reshape((W.shape[0],) + A.shape[1:])  # noqa: E731
    point = float(stat({k: flat(a, np.ones((1, C))) for k, a in arrs.items()})[0])
    reps = stat({k: flat(a, W) for k, a in arrs.items()})
    return (point, *S.percentile_interval(reps, level, min_defined=0.95))


# the statistics per pool and definition: name -> (which arrays, function of the summed arrays)
CLASS_STATS = {   # class 0 is shared, 1 specific (CLASSES)
    "shared_cancellation": lambda a: class_mean(a["N"], a["cancellation"], 0),
    "specific_cancellation": lambda a: class_mean(a["N"], a["cancellation"], 1),
    "shared_single": lambda a: class_mean(a["N"], a["single"], 0),
    "specific_single": lambda a: class_mean(a["N"], a["single"], 1),
    "shared_retained": lambda a: class_ratio(a["grpo"], a["single"], 0),
    "specific_amplification": lambda a: class_ratio(a["grpo"], a["single"], 1),
    "contrast": lambda a: contrast(a["N"], a["cancellation"], "matched"),
    "contrast_raw": lambda a: contrast(a["N"], a["cancellation"], "raw"),
}


ONLY_IDS = {   # on the ids definition, A > 0 pool: the masks and the mechanism
    "copies_vs_random": lambda a: class_mean(a["N"], a["copies_vs_random"], 0),
    "copies_restore": lambda a: class_mean(a["N"], a["copies_restore"], 0),
    "random_restore": lambda a: class_mean(a["N"], a["random_restore"], 0),
    "fo_opposite": lambda a: class_mean(a["N_fo"], a["fo_opposite"], 0),   # over the tokens with terms
    "fo_same_id": lambda a: class_mean(a["N_fo"], a["fo_same_id"], 0),
    "fo_same_id_group": lambda a: class_mean(a["N_fo"], a["fo_same_id_group"], 0),
    "fo_other_id": lambda a: class_mean(a["N_fo"], a["fo_other_id"], 0),
    "fo_same_id_share": lambda a: abs_share(a["fo_same_id"], a["fo_other_id"], 0),
}


def _arrs(N, V):
    return {"N": N, **V}


STATE_STATS = ("shared_cancellation", "shared_single", "shared_retained", "contrast")   # per view of the shared class


def summary(c: pd.DataFrame, categories=(), n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The tidy table of every statistic: per definition, view of the shared class (`states`: STATES, `state_view`),
    pool, category ('all' or one of `categories`) and statistic, the value with its two-stage cluster-bootstrap
    interval (one set of draws per pool: every statistic of a pool is paired), token counts, clusters and batches.
    Also 'frequency' (shared class, high − low frequency ids, matched on confidence bin) per definition and the
    ids-only statistics (the masks and the first-order mechanism)."""
    rows = []
    c = with_frequency(c)
    for pool in POOLS:
        cp = c[c.pool == pool]
        if cp.empty:
            continue
        clusters = pd.MultiIndex.from_frame(cp[["batch", "group"]].drop_duplicates().sort_values(["batch", "group"]))
        batch_of = np.asarray([b for b, _ in clusters])
        W = cluster_weights(batch_of, n_boot, seed)
        nb = len(np.unique(batch_of))

        def put(defn, cat, stat, fn, arrs, n_sh, n_sp, states="all"):
            v, lo, hi = cluster_bootstrap(arrs, fn, W)
            if nb < MIN_BATCHES:
                lo = hi = np.nan
            rows.append(dict(defn=defn, states=states, pool=pool, category=cat, statistic=stat, value=v, lo=lo, hi=hi,
                             n_shared=int(n_sh), n_specific=int(n_sp), clusters=len(clusters), batches=nb))

        for defn in DEFNS:
            for cat in ("all",) + (tuple(categories) if defn == "ids" else ()):
                d = cp[(cp.defn == defn) & ((cp.category == cat) if cat != "all" else True)]
                if d.empty or d.cls.nunique() < 2:
                    continue
                N, V = arrays(d, pool, clusters)
                n_sh, n_sp = N[..., 0].sum(), N[..., 1].sum()
                stats_ = CLASS_STATS if cat == "all" else {"contrast": CLASS_STATS["contrast"]}
                if defn == "ids" and cat == "all" and pool == "pos":
                    stats_ = stats_ | ONLY_IDS
                for stat, fn in stats_.items():
                    put(defn, cat, stat, fn, _arrs(N, V), n_sh, n_sp)
                if cat != "all":
                    continue
                for states in ([] if defn == "state" else STATES[1:]):   # the shared class at other / the same state
                    v = state_view(d, states)
                    if v.cls.nunique() < 2:
                        continue
                    Ns, Vs = arrays(v, pool, clusters)
                    for stat in STATE_STATS:
                        put(defn, cat, stat, CLASS_STATS[stat], _arrs(Ns, Vs), Ns[..., 0].sum(), Ns[..., 1].sum(), states)
                sh = d[d.cls == "shared"]
                if sh.freq.nunique() == 2:   # the shared class, high vs low frequency ids, matched on bin
                    Nf, Vf = arrays(sh, pool, clusters, "freq", ("high", "low"), ("bin",))
                    put(defn, cat, "frequency", lambda a: contrast(a["N"], a["cancellation"]), _arrs(Nf, Vf),
                        Nf[..., 0].sum(), Nf[..., 1].sum())
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def fidelity(tokens: pd.DataFrame) -> pd.DataFrame:
    """How well the first-order LM-head terms track the measured full-parameter Δ (mixed groups only):
    Pearson correlation and sign agreement of Σ terms vs Δ_GRPO (all tokens), and of the opposite-sign
    terms vs the measured cancellation Δ_GRPO − Δ_single (per pool)."""
    t = tokens[(tokens.advantage != 0) & tokens[FIRST_ORDER[0]].notna()]   # the tokens whose terms were computed
    fo = t[list(FIRST_ORDER)].sum(axis=1)
    opp = t.fo_same_id_group + t.fo_same_id_other + t.fo_other_id
    rows = [dict(what="first-order total vs Δ_GRPO", pool="both", n=len(t), corr=_corr(fo, t.delta_grpo),
                 sign_agreement=float((np.sign(fo) == np.sign(t.delta_grpo)).mean()))]
    for pool, sel in (("pos", t.advantage > 0), ("neg", t.advantage < 0)):
        c = t.delta_grpo[sel] - t[f"delta_{single(pool)}"][sel]
        rows.append(dict(what="opposite-sign terms vs cancellation", pool=pool, n=int(sel.sum()),
                         corr=_corr(opp[sel], c), sign_agreement=float((np.sign(opp[sel]) == np.sign(c)).mean())))
    return pd.DataFrame(rows)


def _corr(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.corrcoef(x, y)[0, 1]) if len(x) > 1 and x.std() > 0 and y.std() > 0 else np.nan
