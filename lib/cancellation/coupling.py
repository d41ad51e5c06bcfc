"""Output-layer proxy coupling kernel, first-order prediction, and masked updates (paper §2, App. D).

Token j of a batch (response tokens, flattened) has the LM-head input h_j, next-token
distribution π_j = softmax(W h_j), sampled token o_j and loss weight A_j. Its LM-head gradient
g_j = (e_{o_j} − π_j) h_jᵀ gives the proxy kernel (Eq. 7–8)

    K_jk = ⟨g_j, g_k⟩_F = ⟨h_j, h_k⟩ · φ_jk,   φ_jk = 1[o_j = o_k] − π_j(o_k) − π_k(o_j) + ⟨π_j, π_k⟩.

Nothing here materialises a per-token V×d gradient or a full N×V probability matrix: π is
recomputed from (h, W, logsumexp) per block of tokens × block of vocabulary, ⟨π_j, π_k⟩ is
summed over vocabulary chunks, and the cross terms π_j(o_k) are gathers (rows W[o_k]). Peak
memory is O(chunk² + chunk·vocab_chunk), so the same code serves a 152k vocabulary on a GPU.

Masked updates (Table 1, Fig. 3): an SGD step's masked twin θ'^{−M} differs from θ' only by M's
share of the gradient, θ'^{−M} = θ' + η ∇L_M(θ); we take ∇L_M from M's own backward (full
scope) or in closed form from (h, π, o) (lm_head scope) instead of redoing the step per candidate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import grpo, measure
from .compute import Compute
from .dryrun import dry_run
from . import stats as _stats


# ----------------------------------------------------------------------------- features
@dataclass
class Features:
    """Per-response-token quantities of one forward pass, flattened to N tokens."""
    h: torch.Tensor        # (N, d) LM-head input (after the final norm)
    W: torch.Tensor        # (V, d) LM-head weight
    o: torch.Tensor        # (N,) sampled token ids
    lse: torch.Tensor      # (N,) logsumexp of the logits W h_j
    A: torch.Tensor        # (N,) loss weight (advantage) of token j
    logp: torch.Tensor     # (N,) log π_j(o_j) from the training forward
    entropy: torch.Tensor  # (N,) entropy H_j
    rows: torch.Tensor     # (N,) row of token j in the batch
    cols: torch.Tensor     # (N,) column of token j in the batch

    def __len__(self):
        return self.h.shape[0]

    @property
    def p(self) -> torch.Tensor:
        return self.logp.exp()


def features(model, batch, stats: measure.TokenStats | None = None, weight: torch.Tensor | None = None,
             chunk: int = 1024, vocab_chunk: int = 8192, compute: Compute | None = None) -> Features:
    """Features of every response token of `batch`: from `stats` (token_stats(hidden=True)), or computed with
    the run's `compute` (one of the two is required: no default chunking)."""
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("coupling assumes an LM head without bias (logits = W h)")
    if (stats is None or stats.hidden is None) and compute is None:
        raise TypeError("coupling.features: pass the batch's token_stats(hidden=True) or the run's Compute")
    stats = stats if stats is not None and stats.hidden is not None else compute.stats(model, batch, hidden=True)
    rows, cols = batch.response_mask.nonzero(as_tuple=True)
    W = head.weight.detach()
    h = stats.hidden[rows, cols].to(W.device, W.dtype)
    weight = batch.advantage if weight is None else weight
    f = Features(h=h, W=W, o=batch.input_ids[rows, cols].to(W.device), lse=torch.empty(0),
                 A=weight[rows].to(W.device, W.dtype), logp=stats.logp[rows, cols].to(W.device, W.dtype),
                 entropy=stats.entropy[rows, cols].to(W.device, W.dtype), rows=rows, cols=cols)
    f.lse = torch.cat([_lse(f, slice(s, s + chunk), vocab_chunk) for s in range(0, len(f), chunk)])
    return f


def _lse(f: Features, J, vocab_chunk: int) -> torch.Tensor:
    """logsumexp_v (W h_j)_v, accumulated over vocabulary chunks."""
    out = None
    for v in range(0, f.W.shape[0], vocab_chunk):
        z = torch.logsumexp(f.h[J] @ f.W[v:v + vocab_chunk].T, dim=-1)
        out = z if out is None else torch.logaddexp(out, z)
    return out


def _probs(f: Features, J, v: slice) -> torch.Tensor:
    """π_j restricted to the vocabulary slice v, for tokens J: (|J|, |v|)."""
    return torch.exp(f.h[J] @ f.W[v].T - f.lse[J, None])


def _idx(J, n, device=None) -> torch.Tensor:
    """Token indices: all (None), a slice, or a list/tensor of indices (on `device`)."""
    if J is None:
        return torch.arange(n, device=device)
    if isinstance(J, slice):
        return torch.arange(n, device=device)[J]
    return torch.as_tensor(J, dtype=torch.long).to(device)


# ----------------------------------------------------------------------------- kernel
def _resid(f: Features, J, v: slice) -> torch.Tensor:
    """r_j = e_{o_j} − π_j restricted to the vocabulary slice v, for tokens J: (|J|, |v|).

    The o_j entry is 1 − π_j(o_j) = −expm1(log p_j), so a near-certain token keeps its tiny
    residual to full relative precision (1 − p would cancel to zero at p ≈ 1).
    """
    r = -_probs(f, J, v)
    o = f.o[J]
    lo, hi = v.start, min(v.stop, f.W.shape[0])
    hit = ((o >= lo) & (o < hi)).nonzero().squeeze(1)
    if len(hit):
        jj = _idx(J, len(f), f.h.device)[hit]
        logp = (f.h[jj] * f.W[f.o[jj]]).sum(-1) - f.lse[jj]
        r[hit, o[hit] - lo] = -torch.expm1(logp)
    return r


def phi_block(f: Features, J, K, vocab_chunk: int = 8192) -> torch.Tensor:
    """φ_jk = ⟨r_j, r_k⟩ = 1[o_j=o_k] − π_j(o_k) − π_k(o_j) + ⟨π_j,π_k⟩ for token indices J × K.

    Summed over vocabulary chunks; each chunk holds the Gram of π and, through the o-entries of
    r, the two cross terms and the indicator (the same four terms, in a cancellation-free order).
    """
    out = 0.0
    for v in range(0, f.W.shape[0], vocab_chunk):
        v = slice(v, v + vocab_chunk)
        out = out + _resid(f, J, v) @ _resid(f, K, v).T
    return out


def self_kernel(f: Features, chunk: int = 1024, vocab_chunk: int = 8192) -> torch.Tensor:
    """K_jj = ‖g_j‖² = ‖h_j‖² ‖e_{o_j} − π_j‖², for the cosine normalisation."""
    sq = torch.zeros(len(f), dtype=f.h.dtype, device=f.h.device)
    for s in range(0, len(f), chunk):
        J = torch.arange(s, min(s + chunk, len(f)), device=f.h.device)
        for v in range(0, f.W.shape[0], vocab_chunk):
            sq[J] += _resid(f, J, slice(v, v + vocab_chunk)).pow(2).sum(-1)
    return (f.h * f.h).sum(-1) * sq


def blocks(f: Features, J=None, K=None, chunk: int = 1024, vocab_chunk: int = 8192):
    """Yield (a, b, ⟨h_j,h_k⟩, φ_jk) for the block J[a:a+chunk] × K[b:b+chunk] (default: all tokens)."""
    J, K = _idx(J, len(f), f.h.device), _idx(K, len(f), f.h.device)
    for a in range(0, len(J), chunk):
        j = J[a:a + chunk]
        for b in range(0, len(K), chunk):
            k = K[b:b + chunk]
            yield a, b, f.h[j] @ f.h[k].T, phi_block(f, j, k, vocab_chunk)


def kernel(f: Features, J=None, K=None, chunk: int = 1024, vocab_chunk: int = 8192,
           cosine: bool = False) -> torch.Tensor:
    """Dense K[J, K] (choose J, K to bound memory); `cosine` divides by ‖g_j‖ ‖g_k‖."""
    Ji, Ki = _idx(J, len(f), f.h.device), _idx(K, len(f), f.h.device)
    out = torch.empty(len(Ji), len(Ki), dtype=f.h.dtype, device=f.h.device)
    for a, b, hg, phi in blocks(f, Ji, Ki, chunk, vocab_chunk):
        out[a:a + hg.shape[0], b:b + hg.shape[1]] = hg * phi
    if cosine:
        n = self_kernel(f, chunk, vocab_chunk).clamp(min=1e-300).sqrt()
        out = out / n[Ji, None] / n[None, Ki]
    return out


def pair_terms(f: Features, j: torch.Tensor, k: torch.Tensor, chunk: int = 4096, vocab_chunk: int = 8192) -> dict:
    """⟨h_j,h_k⟩, its cosine, φ_jk and K_jk for selected pairs (j[i], k[i]) only."""
    j, k = _idx(j, len(f), f.h.device), _idx(k, len(f), f.h.device)
    hdot, phi = [], []
    for s in range(0, len(j), chunk):
        a, b = j[s:s + chunk], k[s:s + chunk]
        acc = 0.0
        for v in range(0, f.W.shape[0], vocab_chunk):
            v = slice(v, v + vocab_chunk)
            acc = acc + (_resid(f, a, v) * _resid(f, b, v)).sum(-1)
        phi.append(acc)
        hdot.append((f.h[a] * f.h[b]).sum(-1))
    hdot, phi = torch.cat(hdot), torch.cat(phi)
    norm = f.h.norm(dim=-1)
    return {"hdot": hdot, "hcos": hdot / (norm[j] * norm[k]), "phi": phi, "kernel": hdot * phi}


def kernel_matvec(f: Features, a: torch.Tensor, J=None, chunk: int = 1024, vocab_chunk: int = 8192) -> torch.Tensor:
    """(K a)[J] = Σ_k K_jk a_k without storing K (memory bounded by the chunk)."""
    Ji = _idx(J, len(f), f.h.device)
    a = a.to(f.h.device, f.h.dtype)
    out = torch.zeros(len(Ji), dtype=f.h.dtype, device=f.h.device)
    for s, b, hg, phi in blocks(f, Ji, None, chunk, vocab_chunk):
        out[s:s + hg.shape[0]] += (hg * phi) @ a[b:b + hg.shape[1]]
    return out


def first_order_delta(f: Features, lr: float, n_tokens: int | None = None, **kw) -> torch.Tensor:
    """δ_j = η/N Σ_k A_k K_jk (Eq. 5/9): predicted Δlog p_j of one SGD lm_head step.

    At ρ = 1 the token-mean clipped loss has gradient −(1/N) Σ_k A_k g_k, N = response tokens.
    """
    n = len(f) if n_tokens is None else n_tokens
    return lr / n * kernel_matvec(f, f.A, **kw)


def entropy_bin_means(f: Features, bins: torch.Tensor, n_bins: int, chunk: int = 1024, vocab_chunk: int = 8192):
    """Mean of A_k⟨h_j,h_k⟩φ_jk and of its absolute value over pairs j ≠ k, per (bin(j), bin(k))."""
    dt, dev = f.h.dtype, f.h.device
    onehot = torch.nn.functional.one_hot(torch.as_tensor(bins).long().to(dev), n_bins).to(dt)
    s_signed = torch.zeros(n_bins, n_bins, dtype=dt, device=dev)
    s_abs = torch.zeros(n_bins, n_bins, dtype=dt, device=dev)
    for a, b, hg, phi in blocks(f, None, None, chunk, vocab_chunk):
        j, k = slice(a, a + hg.shape[0]), slice(b, b + hg.shape[1])
        c = hg * phi * f.A[k][None, :]
        if a == b:
            c.fill_diagonal_(0.0)                    # drop the self pairs j = k
        s_signed += onehot[j].T @ c @ onehot[k]
        s_abs += onehot[j].T @ c.abs() @ onehot[k]
    cnt = onehot.sum(0)
    pairs = cnt[:, None] * cnt[None, :] - torch.diag(cnt)
    return s_signed / pairs, s_abs / pairs


def pair_kind_terms(f: Features, chunk: int = 1024, vocab_chunk: int = 8192) -> dict:
    """Σ_k A_k K_jk for every token j split by pair kind (the first-order δ_j = η/N · their sum):
    `own` (k = j: A_j K_jj, of A_j's sign since K_jj = ‖g_j‖² ≥ 0), `same` (k ≠ j with o_k = o_j) and
    `different` (o_k ≠ o_j); plus `abs_same`, `abs_different`: Σ_k |A_k K_jk| over those pairs."""
    names = ("own", "same", "different", "abs_same", "abs_different")
    out = {n: torch.zeros(len(f), dtype=f.h.dtype, device=f.h.device) for n in names}
    for a, b, hg, phi in blocks(f, None, None, chunk, vocab_chunk):
        j, k = slice(a, a + hg.shape[0]), slice(b, b + hg.shape[1])
        c = hg * phi * f.A[k][None, :]
        eq = f.o[j][:, None] == f.o[k][None, :]
        own = torch.zeros_like(eq)
        if a == b:
            own.fill_diagonal_(True)
        same = eq & ~own
        out["own"][j] += torch.where(own, c, 0.0).sum(1)
        out["same"][j] += torch.where(same, c, 0.0).sum(1)
        out["different"][j] += torch.where(eq, 0.0, c).sum(1)
        out["abs_same"][j] += torch.where(same, c.abs(), 0.0).sum(1)
        out["abs_different"][j] += torch.where(eq, 0.0, c.abs()).sum(1)
    return out


# ----------------------------------------------------------------------------- masked updates
def lm_head_grad(f: Features, M=None, n_tokens: int | None = None, vocab_chunk: int = 8192) -> torch.Tensor:
    """∇_W of the token-mean loss at ρ = 1 restricted to tokens M: −(1/N) Σ_{k∈M} A_k (e_{o_k} − π_k) h_kᵀ."""
    M = _idx(M, len(f), f.h.device)
    n = len(f) if n_tokens is None else n_tokens
    ah = f.A[M, None] * f.h[M]
    g = torch.zeros_like(f.W).index_add_(0, f.o[M], ah)
    for v in range(0, f.W.shape[0], vocab_chunk):
        v = slice(v, v + vocab_chunk)
        g[v] -= _probs(f, M, v).T @ ah
    return -g / n


def masked_effects_lm_head(f: Features, cands: torch.Tensor, sets, lr: float,
                           n_tokens: int | None = None) -> torch.Tensor:
    """Exact δ = log π_θ'(c) − log π_θ'^{−M}(c) of an SGD lm_head step, for candidates c with sets (C, m).

    Only W moves, so the logits are linear in it: W'^{−M} h_c = W' h_c + η ∇_W L_M h_c, and
    ∇_W L_M h_c = −(1/N) Σ_{k∈M} A_k ⟨h_k, h_c⟩ (e_{o_k} − π_k): closed form from (h, π, o).
    """
    n = len(f) if n_tokens is None else n_tokens
    W1 = f.W - lr * lm_head_grad(f, None, n)                  # θ': the full step, once
    out = torch.empty(len(cands), dtype=f.h.dtype, device=f.h.device)
    for i, (c, M) in enumerate(zip(cands.tolist(), sets)):
        M = _idx(M, len(f), f.h.device)
        z1 = W1 @ f.h[c]
        w = f.A[M] * (f.h[M] @ f.h[c])                         # A_k ⟨h_k, h_c⟩
        pi = torch.exp(f.h[M] @ f.W.T - f.lse[M, None])        # (m, V); chunk M for huge V
        zm = z1 - lr / n * (torch.zeros_like(z1).index_add_(0, f.o[M], w) - w @ pi)
        o = f.o[c]
        out[i] = (z1[o] - torch.logsumexp(z1, 0)) - (zm[o] - torch.logsumexp(zm, 0))
    return out


def _token_weight(batch, f: Features, M, scale: float = 1.0) -> torch.Tensor:
    M = torch.as_tensor(M).cpu()
    tw = torch.zeros(batch.input_ids.shape, dtype=torch.float64)
    tw[f.rows[M], f.cols[M]] = scale
    return tw


def masked_effects_full(model, batch, f: Features, cands: torch.Tensor, sets, lr: float, *,
                        compute: Compute, progress: bool = False) -> torch.Tensor:
    """δ of an SGD full-parameter step for candidates c with sets M(c) (a (C, m) tensor or a list of
    index tensors of any sizes: pass every kind at once, θ' is computed once); the model is left
    unchanged, also when something raises (`grpo.trial`).

    θ' comes from one full step. Per candidate, M's gradient at θ comes from a backward over only
    the rows holding M (token weight 1[M] · n_rows/N keeps the batch's denominator N), then
    θ'^{−M} = θ' + η ∇L_M and one forward of c's row gives log π_θ'^{−M}(c).
    """
    from tqdm import tqdm

    cfg = compute.update(optimizer="sgd", lr=lr, scope="full")
    out = torch.empty(len(cands), dtype=torch.float64)
    with grpo.trial(model, "full"):
        params = list(model.parameters())
        theta = [p.detach().clone() for p in params]
        old = compute.stats(model, batch).logp           # θ_old = θ: ρ = 1
        grpo.grpo_step(model, batch, cfg, old_logp=old)
        theta1 = [p.detach().clone() for p in params]
        logp1 = compute.stats(model, batch).logp
        N = batch.n_tokens
        with grpo.only_grad_for(model, params):
            for i, (c, M) in enumerate(tqdm(list(zip(cands.tolist(), sets)), desc="masked full", disable=not progress)):
                with torch.no_grad():
                    for p, t in zip(params, theta):
                        p.copy_(t)
                rows = torch.unique(f.rows[torch.as_tensor(M).cpu()])
                n_rows = int(batch.response_mask[rows].sum())
                model.zero_grad(set_to_none=True)
                grpo.accumulate_grad(model, batch, rows, old, batch.advantage.to(torch.float64), cfg,
                                     token_weight=_token_weight(batch, f, M, n_rows / N))
                with torch.no_grad():
                    for p, t in zip(params, theta1):
                        p.copy_(t).add_(p.grad, alpha=lr) if p.grad is not None else p.copy_(t)
                    r, col = int(f.rows[c]), int(f.cols[c])
                    lp = compute.stats(model, batch.select([r])).logp   # chunked: no (L, V) logits
                out[i] = float(logp1[r, col]) - float(lp[0, col])
    return out


def masked_effect_bruteforce(model, batch, c: int, M, f: Features, lr: float, scope: str = "full",
                             *, compute: Compute) -> float:
    """Reference: re-run the whole SGD step with and without M's loss weights (two full steps)."""
    cfg = compute.update(optimizer="sgd", lr=lr, scope=scope)
    old = compute.stats(model, batch).logp
    r, col = int(f.rows[c]), int(f.cols[c])
    lp = []
    for weight in (None, 1.0 - _token_weight(batch, f, M)):
        with grpo.trial(model, "full"):
            grpo.grpo_step(model, batch, cfg, old_logp=old, token_weight=weight)
            lp.append(float(compute.stats(model, batch.select([r])).logp[0, col]))
    return lp[0] - lp[1]


# ----------------------------------------------------------------------------- mask sets and statistics
SET_KINDS = ("random", "same", "lowconf", "both")


POOLS = ("nonzero", "positive")


def masking_sets(f: Features, n_cands: int, size: int, low_quantile: float = 0.5, seed: int = 0,
                 pool: str = "nonzero"):
    """Candidates and equal-size masks M(c) of each kind (Table 1).

    Candidates and masks come from the live tokens: A ≠ 0 (`pool='nonzero'`; a zero-weight
    token's mask is a no-op) or A > 0 only (`pool='positive'`). Per candidate c, other than c:
    'same' o_k = o_c; 'lowconf' p_k below the `low_quantile` quantile of p; 'both' the
    intersection; 'random' any. Candidates are drawn among live tokens whose 'both' pool holds
    at least `size` tokens, so every kind has the same |M|. Returns (cands, {kind: (C, m)}).
    """
    if pool not in POOLS:
        raise ValueError(f"unknown mask pool {pool!r}; allowed: {', '.join(POOLS)}")
    g = torch.Generator().manual_seed(seed)   # CPU generator: the same draws on every device
    dev = f.h.device
    A, o, p = f.A.cpu(), f.o.cpu(), f.p.cpu()  # the selection runs on the CPU (small N-vectors)
    live = ((A != 0) if pool == "nonzero" else (A > 0)).nonzero().squeeze(1)
    if not len(live):
        raise ValueError("the batch has no token with a usable advantage (no mixed-reward group)")
    low = p < torch.quantile(p[live], low_quantile)
    live_low = torch.zeros(len(f), dtype=torch.bool)
    live_low[live[low[live]]] = True
    eligible = [int(c) for c in live if int(((o == o[c]) & live_low).sum()) - int(live_low[c]) >= size]
    any_id = False
    if not eligible and dry_run() is not None:
        # random weights over a 152k vocabulary rarely repeat a token: a dry run measures time and
        # memory, so its 'same' masks ignore the token id (same sizes, same cost), and says so
        print(f"dry run: no candidate has {size} same-token low-confidence tokens under random weights; "
              "'same' and 'both' masks ignore the token id (timing only)")
        any_id = True
        eligible = [int(c) for c in live if int(live_low.sum()) - int(live_low[c]) >= size]
    if not eligible:
        raise ValueError(f"no candidate has {size} same-token low-confidence tokens; lower `mask_size`")
    eligible = torch.tensor(eligible)
    cands = eligible[torch.randperm(len(eligible), generator=g)[:n_cands]]
    is_live = torch.zeros(len(f), dtype=torch.bool)
    is_live[live] = True
    sets = {k: [] for k in SET_KINDS}
    for c in cands.tolist():
        not_c = torch.ones(len(f), dtype=torch.bool)
        not_c[c] = False
        same = torch.ones_like(live_low) if any_id else o == o[c]
        pools = {"random": is_live & not_c, "same": is_live & not_c & same,
                 "lowconf": live_low & not_c, "both": live_low & not_c & same}
        for k, pool in pools.items():
            idx = pool.nonzero().squeeze(1)
            sets[k].append(idx[torch.randperm(len(idx), generator=g)[:size]])
    return cands.to(dev), {k: torch.stack(v).to(dev) for k, v in sets.items()}


# Relative precision at which two kernels count as tied in `top_coupled_sets`: far above the round-off of K
# (float64 ~1e-14, float32 ~1e-6 relative), far below the gaps between distinct tokens' kernels.
TIE_RTOL, TIE_RTOL_LOW = 1e-9, 1e-4   # float64; float32 and narrower


def top_coupled_sets(f: Features, cands: torch.Tensor, size: int, **kw) -> torch.Tensor:
    """The `size` tokens (A ≠ 0, ≠ c) with the largest proxy kernel K_ck for each candidate (Fig. 3c).

    Ties are common and matter: the same token after the same prefix in several rollouts of a group has
    the same hidden state, so the same K_ck, and those rollouts' advantages can have opposite signs.
    Which of them is masked flips the sign of the candidate's Δ. So K is compared at TIE_RTOL relative
    precision and tied tokens are taken in token order: round-off (another BLAS path, another machine,
    `trim_padding`) cannot reorder a tie. `torch.topk` left that order to the round-off."""
    cands = _idx(cands, len(f), f.h.device)
    Kc = kernel(f, cands, None, **kw)
    Kc[:, f.A == 0] = -float("inf")
    Kc[torch.arange(len(cands), device=Kc.device), cands] = -float("inf")
    scale = torch.where(torch.isfinite(Kc), Kc.abs(), 0).amax(1, keepdim=True).clamp(min=torch.finfo(Kc.dtype).tiny)
    q = torch.round(Kc / (scale * (TIE_RTOL if Kc.dtype == torch.float64 else TIE_RTOL_LOW)))  # -inf stays
    return torch.sort(-q, dim=1, stable=True).indices[:, :size]             # stable: ties in token order


def proxy_cosine(f: Features, cands: torch.Tensor, sets: torch.Tensor, **kw) -> torch.Tensor:
    """cos(g_c, Σ_{k∈M} A_k g_k) under the proxy kernel, per candidate (Fig. 3b coupling strength)."""
    kc = self_kernel(f)
    out = torch.empty(len(cands), dtype=f.h.dtype, device=f.h.device)
    for i, (c, M) in enumerate(zip(torch.as_tensor(cands).tolist(), sets)):
        M = _idx(M, len(f), f.h.device)
        a = f.A[M]
        num = kernel(f, [c], M, **kw)[0] @ a
        den = (a @ kernel(f, M, M, **kw) @ a).clamp(min=1e-300).sqrt() * kc[c].clamp(min=1e-300).sqrt()
        out[i] = num / den
    return out


def boost_stats(delta, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Boost Rate = mean 1[δ > 0] with its exact Clopper–Pearson interval (a bootstrap interval has
    zero width at 400/400), and Mean Boost = mean δ with a percentile bootstrap interval."""
    d = delta.detach().cpu().numpy() if isinstance(delta, torch.Tensor) else np.asarray(delta)
    rate, lo, hi, n = _stats.proportion(d > 0, level)
    r = _stats.bootstrap_stats(d, {"mean_boost": np.mean}, n_boot, seed, level)
    return {"boost_rate": rate, "boost_rate_lo": lo, "boost_rate_hi": hi,
            "mean_boost": r["mean_boost"][0], "mean_boost_lo": r["mean_boost"][1], "mean_boost_hi": r["mean_boost"][2],
            "n": n}


# ----------------------------------------------------------------------------- proxy fidelity (Fig. 10, App. D.3)
def proxy_sign_consistency(model, batch, lr: float, eps: float, compute: Compute) -> dict:
    """Share of response tokens whose Δlog p has the same sign under an SGD lm_head step and an SGD
    full step from the same θ on the same batch (the model is restored after both)."""
    before = compute.stats(model, batch).logp
    deltas = {}
    for scope in ("lm_head", "full"):
        cfg = compute.update(optimizer="sgd", lr=lr, scope=scope)
        deltas[scope] = grpo.trial_delta(model, batch, cfg, before)[batch.response_mask]
    a, b = deltas["lm_head"], deltas["full"]
    moved = (a.abs() > eps) & (b.abs() > eps)
    return {"sign_consistency": float((torch.sign(a) == torch.sign(b)).double().mean()),
            "sign_consistency_moved": float((torch.sign(a[moved]) == torch.sign(b[moved])).double().mean()),
            "pearson": float(torch.corrcoef(torch.stack([a, b]))[0, 1]), "n_tokens": int(a.numel()),
            "n_moved": int(moved.sum())}


def adam_first_step_ratio(model, batch, lr: float, compute: Compute) -> np.ndarray:
    """App. D.3: (θ0 − θ1) / (lr · sign(g)) for every parameter element of Adam's first step
    (1 would be exact sign descent); the model is restored."""
    cfg = compute.update(optimizer="adam", lr=lr, scope="full")
    with grpo.trial(model, "full"):
        params = list(model.parameters())
        theta0 = [p.detach().clone() for p in params]
        grpo.grpo_step(model, batch, cfg)
        ratios = [((t - p.detach()) / (lr * torch.sign(p.grad))).flatten()
                  for p, t in zip(params, theta0) if p.grad is not None]
    r = torch.cat(ratios)
    return r[torch.isfinite(r)].cpu().numpy()
