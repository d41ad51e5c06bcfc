"""Fig. 3 and Table 1 (notebook 03): masked updates in both scopes, and Fig. 3(c)'s top-coupled masks.

`masking_effects` gives one row per (pool, kind, scope, candidate) with δ, the proxy cosine and
the candidate's sign; `topk_table` gives Boost Rate / Mean Boost per (pool, k, scope). The
full-parameter δ's are the expensive part (one backward over M's rows per candidate): each is
cached under a key of every argument that shapes it (`inputs`: the model and batch fingerprints
of the caller; `compute`: the memory knobs, which can move float round-off).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .. import cache, coupling
from ..compute import Compute


def _key(inputs: dict, compute: Compute, **params) -> dict:
    return dict(inputs, compute=compute.key(), **params)


def masking_effects(model, batch, f: coupling.Features, *, pools, n_cands: int, n_cands_full: int, mask_size: int,
                    low_quantile: float, lr: float, seed: int, inputs: dict, compute: Compute) -> pd.DataFrame:
    """Table 1's per-candidate δ: lm_head scope in closed form for every candidate, full scope for the
    first `n_cands_full` of each kind (cached)."""
    out = []
    for pool in pools:
        cands, sets = coupling.masking_sets(f, n_cands, mask_size, low_quantile, seed=seed, pool=pool)
        rows = []
        for kind, M in sets.items():
            d = coupling.masked_effects_lm_head(f, cands, M, lr)
            cos = coupling.proxy_cosine(f, cands, M)
            rows.append(pd.DataFrame({"pool": pool, "kind": kind, "scope": "lm_head", "cand": cands.cpu().numpy(),
                                      "delta": d.cpu().numpy(), "proxy_cos": cos.cpu().numpy(),
                                      "cand_sign": np.sign(f.A[cands].cpu().numpy())}))
        nf = min(n_cands_full, len(cands))
        jobs = [(kind, i) for kind in coupling.SET_KINDS for i in range(nf)]
        key = _key(inputs, compute, pool=pool, n_cands=n_cands, n_full=nf, mask_size=mask_size,
                   low_quantile=low_quantile, lr=lr, seed=seed)
        d_full = cache.cached("masked_full", key, lambda: coupling.masked_effects_full(
            model, batch, f, torch.stack([cands[i] for _, i in jobs]), [sets[k][i] for k, i in jobs], lr,
            compute=compute, progress=True))
        full = pd.DataFrame({"pool": pool, "kind": [k for k, _ in jobs], "scope": "full",
                             "cand": [int(cands[i]) for _, i in jobs], "delta": np.asarray(d_full)})
        lm = pd.concat(rows, ignore_index=True)
        full = full.merge(lm[["kind", "cand", "proxy_cos", "cand_sign"]].drop_duplicates(["kind", "cand"]),
                          on=["kind", "cand"])
        out.append(pd.concat([lm, full], ignore_index=True))
    return pd.concat(out, ignore_index=True)


def topk_table(model, batch, f: coupling.Features, *, pools, n_cands: int, low_quantile: float, topk_sizes,
               topk_full_sizes, n_cands_topk_full: int, lr: float, n_boot: int, seed: int, inputs: dict,
               compute: Compute) -> pd.DataFrame:
    """Fig. 3(c): Boost Rate and Mean Boost as the k top-coupled tokens (by the proxy kernel K_ck
    alone) are masked; lm_head for every k, full scope for `topk_full_sizes` (cached)."""
    rows = []
    for p in pools:
        cands_c, _ = coupling.masking_sets(f, n_cands, 1, low_quantile, seed=seed + 1, pool=p)
        fp = coupling.Features(**{**f.__dict__, "A": f.A * (f.A > 0) if p == "positive" else f.A})  # pool's weights
        top = coupling.top_coupled_sets(fp, cands_c, max(topk_sizes))
        for k in topk_sizes:
            d = coupling.masked_effects_lm_head(f, cands_c, top[:, :k], lr)
            rows.append({"pool": p, "k": k, "scope": "lm_head", **coupling.boost_stats(d, n_boot, seed)})
        nf = min(n_cands_topk_full, len(cands_c))
        jobs = [(k, i) for k in topk_full_sizes for i in range(nf)]
        key = _key(inputs, compute, pool=p, sizes=list(topk_full_sizes), n=nf, n_cands=n_cands,
                   low_quantile=low_quantile, max_k=max(topk_sizes), lr=lr, seed=seed)
        d_full = np.asarray(cache.cached("masked_topk_full", key, lambda: coupling.masked_effects_full(
            model, batch, f, cands_c[[i for _, i in jobs]], [top[i, :k] for k, i in jobs], lr,
            compute=compute, progress=True)))
        for k in topk_full_sizes:
            rows.append({"pool": p, "k": k, "scope": "full",
                         **coupling.boost_stats(d_full[[kk == k for kk, _ in jobs]], n_boot, seed)})
    return pd.DataFrame(rows)
