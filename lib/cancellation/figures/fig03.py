"""Fig. 3, Table 1, Fig. 10 and App. D.3 (notebook 03): masked updates and proxy fidelity.

`compute(P)` samples the masked-update batch and computes its features, then: the precision
check (a full SGD step with transformers' float32 norms against `policy.exact_norms`);
`masking_effects`, one row per (pool, kind, scope, candidate) with δ, the proxy cosine and the
candidate's sign, and Table 1's Boost Rate / Mean Boost from it; `topk_table`, Fig. 3(c)'s Boost
Rate / Mean Boost per (pool, k, scope); Fig. 10's sign-consistency training run; the Adam
first-step ratio. The whole result is cached under every parameter and the model's and problems'
fingerprints; its expensive stages (the full-parameter δ's: one backward over M's rows per
candidate; the training run) are also cached on their own under the same key plus every argument
that shapes them (`compute`: the memory knobs, which can move float round-off), so an interrupted
run resumes. `load(folder, P)` reads the Result back from the tables `R.write` wrote (make plots);
`fig03_claims.claims(R, P)` gives the notebook's claim rows, `fig03_plots` draws the figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import cache, coupling, grpo, policy, rollout, seeds, stage, train
from .. import workload as W
from ..compute import Compute
from . import base, replot
from .base import param

TABLES = {"precision": "fig03_precision.parquet", "effects": "fig03_masking_effects.parquet",
          "table1": "table1_masked_updates.csv", "topk": "fig03_topk.parquet",
          "consistency": "fig10_proxy_sign_consistency.parquet", "adam": "fig03_adam_sign_descent.parquet",
          "topk_effects": "fig03_topk_effects.parquet"}


@dataclass
class Params(base.FigureParams):
    """Notebook 03's parameters."""
    CONSTRAINTS = ((lambda topk_full_sizes, topk_sizes: max(topk_full_sizes, default=0) <= max(topk_sizes),
                    "every topk_full_sizes entry must be <= max(topk_sizes)"),)
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    n_prompts: int = base.n_prompts(16, "prompts in the masked-update batch")
    G: int = base.G()
    temperature: float = base.temperature()
    max_new_tokens: int = base.max_new_tokens()
    lr: float = param(0.1, "SGD lr of the masked-update steps (paper: 0.1)", gt=0)
    mask_size: int = param(8, "|M(c)|, equal for every kind", min=1)
    low_quantile: float = param(0.5, "low confidence: p below this quantile of the live tokens' p", gt=0, max=1)
    pools: list = param(["nonzero", "positive"], "candidate and mask pools: nonzero (A ≠ 0 tokens) or positive "
                        "(positive rollouts only)", choices=["nonzero", "positive"], nonempty=True, distinct=True)
    n_cands: int = param(400, "candidates per pool (lm_head scope, closed form: cheap)", min=1)
    n_cands_full: int = param(44, "of those, candidates per pool and kind for the full-parameter scope (44: a "
                              "Clopper–Pearson interval of ±15 points at a 50% Boost Rate)", min=1)
    topk_sizes: list = param([1, 2, 4, 8, 16, 32], "Fig. 3(c): number of top-coupled tokens masked (lm_head)",
                             min=1, nonempty=True, distinct=True)
    topk_full_sizes: list = param([2, 8, 32], "Fig. 3(c): sizes also run with the full-parameter scope",
                                  min=1, distinct=True)
    n_cands_topk_full: int = param(12, "candidates per size for the full scope of Fig. 3(c)", min=1)
    n_cos_bins: int = param(5, "Fig. 3(b): quantile bins of the proxy cosine", min=1)
    n_boot: int = param(1000, "bootstrap resamples for the intervals", min=1)
    run_steps: int = param(6, "Fig. 10: GRPO training steps", min=1)
    run_n_prompts: int = param(8, "Fig. 10: prompts per step", min=1)
    run_G: int = param(8, "Fig. 10: rollouts per prompt", min=2)
    adam_lr: float = param(1e-4, "Fig. 10 training optimizer and App. D.3 Adam step", gt=0)
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = base.gradient_checkpointing("recompute activations in the backward of the "
                                                               "Fig. 10 run (large models)")
    seed: int = base.seed("seeds prompts, sampling, candidates and masks")


@dataclass
class Result:
    """What Fig. 3, Table 1, Fig. 10 and App. D.3 plot and their claims read."""
    batch: dict                  # the batch's numbers (base.batch_facts; `summary(R)` writes its line)
    precision: pd.DataFrame      # stock float32 norms vs exact: median |Δ|, median |error|, sign agreement
    effects: pd.DataFrame        # per (pool, kind, scope, cand): delta, proxy_cos, cand_sign, mask_adv_sum
    table1: pd.DataFrame         # per (pool, kind, scope): Boost Rate and Mean Boost with intervals
    scope_agree: pd.DataFrame    # per pool: Pearson and sign agreement of δ, full vs lm_head (same pairs)
    boost_vs_cos: pd.DataFrame   # Fig. 3(b), pools[0]: per (scope, proxy-cos bin) median cos and Boost Rate
    topk: pd.DataFrame           # Fig. 3(c): per (pool, k, scope) Boost Rate and Mean Boost
    consistency: pd.DataFrame    # Fig. 10: per training step, the same-sign share of lm_head and full steps
    adam: pd.DataFrame           # App. D.3: Adam's first step against lr·sign(g)
    topk_effects: pd.DataFrame   # Fig. 3(c) per (pool, k, scope, cand): δ (the paired rows of 3(c) read it)

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold: the batch's numbers (replot.save)."""
        for field, name in TABLES.items():
            cache.write_table(getattr(self, field), Path(results_dir) / name)
        replot.save(results_dir, P, batch=self.batch)


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots): the tables read back,
    Table 1, the scope agreement and Fig. 3(b)'s bins derived from the masking effects as compute does."""
    t = {field: replot.table(results_dir, name) for field, name in TABLES.items() if field != "table1"}
    return Result(**t, table1=table1_of(t["effects"], P), scope_agree=scope_agreement(t["effects"]),
                  boost_vs_cos=_boost_vs_cos(t["effects"], P), **replot.restore(results_dir, P))


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    inputs = base.inputs(P, source)   # the expensive stages inside read these too: a new version of the
    return stage.FIG03.cached(lambda: _compute(P, source, inputs), **inputs)   # Result leaves them cached


def _compute(P: Params, source, inputs: dict) -> Result:
    cc = P.compute()  # reaches every forward and update below
    torch.manual_seed(P.seed)
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)  # float64 norms too (exact_norms)
    batch = rollout.sample(model, tok, base.sample_config(P, source), seed=seeds.derive(P.seed, "masked_batch"))
    base.require_signal(batch, source, "03: the masked-update batch")
    f = coupling.features(model, batch, compute=cc)
    facts = base.batch_facts(batch, P.n_prompts, source, tokens=len(f), signed_tokens=int((f.A != 0).sum()))
    precision = _precision(model, batch, P)
    effects = masking_effects(model, batch, f, pools=P.pools, n_cands=P.n_cands, n_cands_full=P.n_cands_full,
                              mask_size=P.mask_size, low_quantile=P.low_quantile, lr=P.lr, seed=P.seed, inputs=inputs,
                              compute=cc)
    topk, topk_effects = topk_table(model, batch, f, pools=P.pools, n_cands=P.n_cands, low_quantile=P.low_quantile,
                      topk_sizes=P.topk_sizes, topk_full_sizes=P.topk_full_sizes,
                      n_cands_topk_full=P.n_cands_topk_full, lr=P.lr, n_boot=P.n_boot, seed=P.seed, inputs=inputs,
                      compute=cc)
    consistency = _sign_consistency(P, source, inputs)
    ratio = coupling.adam_first_step_ratio(model, batch, P.adam_lr, compute=cc)
    adam = pd.DataFrame([{"n_elements": len(ratio), "median_ratio": float(np.median(ratio)),
                          "share_above_0.99": float((ratio > 0.99).mean()),
                          "share_above_0.5": float((ratio > 0.5).mean()), "min_ratio": float(ratio.min())}])
    return Result(batch=facts, precision=precision, effects=effects, table1=table1_of(effects, P),
                  scope_agree=scope_agreement(effects), boost_vs_cos=_boost_vs_cos(effects, P), topk=topk,
                  consistency=consistency, adam=adam, topk_effects=topk_effects)



def summary(R: Result) -> str:
    """One line on the batch (and the grader's, for a problem file)."""
    b = R.batch
    return base.with_grading(f"{b['rollouts']} rollouts, {b['tokens']} response tokens, accuracy {b['accuracy']:.2f}, "
                             f"mixed groups {b['mixed_groups']}/{b['n_prompts']}, tokens with A ≠ 0: "
                             f"{b['signed_tokens']}", b)

def _precision(model, batch, P: Params) -> pd.DataFrame:
    """The same full-parameter SGD step with transformers' float32 RMSNorm and with policy.exact_norms."""
    cc = P.compute()

    def full_step_delta(m):
        return grpo.trial_delta(m, batch, cc.update(optimizer="sgd", lr=P.lr, scope="full"),
                                cc.stats(m, batch).logp)[batch.response_mask]

    stock, _ = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device, exact=False)  # float32 norms
    d_stock, d_exact = full_step_delta(stock), full_step_delta(model)
    del stock
    return pd.DataFrame([{
        "median_abs_delta_exact": float(d_exact.abs().median()),
        "median_abs_error_stock_norms": float((d_stock - d_exact).abs().median()),
        "sign_agreement_stock_vs_exact": float((torch.sign(d_stock) == torch.sign(d_exact)).double().mean())}])


def table1_of(effects: pd.DataFrame, P: Params) -> pd.DataFrame:
    """Table 1: Boost Rate and Mean Boost with their intervals per (pool, kind, scope) of the masking effects."""
    return pd.DataFrame([{"pool": p, "kind": k, "scope": s, **coupling.boost_stats(g.delta, P.n_boot, P.seed)}
                         for (p, k, s), g in effects.groupby(["pool", "kind", "scope"], sort=False)])


def scope_agreement(effects: pd.DataFrame) -> pd.DataFrame:
    """Per pool: Pearson and sign agreement of δ, full vs lm_head, on the (candidate, mask) pairs measured in both."""
    both = effects[effects.scope == "full"].merge(
        effects[effects.scope == "lm_head"][["pool", "kind", "cand", "delta"]], on=["pool", "kind", "cand"],
        suffixes=("_full", "_lm"))
    return both.groupby("pool").apply(lambda g: pd.Series({
        "pearson": np.corrcoef(g.delta_full, g.delta_lm)[0, 1],
        "sign_agreement": (np.sign(g.delta_full) == np.sign(g.delta_lm)).mean(), "n": len(g)}), include_groups=False)


def _boost_vs_cos(effects: pd.DataFrame, P: Params) -> pd.DataFrame:
    """Fig. 3(b): Boost Rate per quantile bin of the proxy cosine (edges from the lm_head scope), pools[0]."""
    e = effects[effects.pool == P.pools[0]]
    edges = np.quantile(e[e.scope == "lm_head"].proxy_cos, np.linspace(0, 1, P.n_cos_bins + 1))
    out = []
    for scope in ("lm_head", "full"):
        s = e[e.scope == scope]
        b = np.clip(np.digitize(s.proxy_cos, edges[1:-1]), 0, P.n_cos_bins - 1)
        out.append(pd.DataFrame({"scope": scope, "proxy_cos": s.groupby(b).proxy_cos.median(),
                                 "boost_rate": s.groupby(b).delta.apply(lambda x: (x > 0).mean())}))
    return pd.concat(out).rename_axis("bin").reset_index()


def _sign_consistency(P: Params, source, inputs: dict) -> pd.DataFrame:
    """Fig. 10: a GRPO training run (Adam, adam_lr) comparing an SGD lm_head and full step before each step."""
    run_cfg = train.RunConfig(steps=P.run_steps, n_prompts=P.run_n_prompts, G=P.run_G, temperature=P.temperature,
                              max_new_tokens=P.max_new_tokens, seed=P.seed, source=source, sample_rows=P.sample_rows,
                              hf_sampler=P.hf_path(), update=P.compute().update(optimizer="adam", lr=P.adam_lr))

    def sign_run():
        m, t = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
        return train.sign_consistency_run(m, t, run_cfg, P.lr, model_path=P.model_path)

    return stage.SIGN_CONSISTENCY_RUN.cached(sign_run, **inputs, run=run_cfg)


# ----------------------------------------------------------------------------- the cached masked-update stages

def masking_effects(model, batch, f: coupling.Features, *, pools, n_cands: int, n_cands_full: int, mask_size: int,
                    low_quantile: float, lr: float, seed: int, inputs: dict, compute: Compute) -> pd.DataFrame:
    """Table 1's per-candidate δ: lm_head scope in closed form for every candidate, full scope for the
    first `n_cands_full` of each kind (cached: stage.MASKED_FULL; `inputs` are the figure stage's, base.inputs)."""
    out = []
    for pool in pools:
        cands, sets = coupling.masking_sets(f, n_cands, mask_size, low_quantile, seed=seed, pool=pool)
        rows = []
        for kind, M in sets.items():
            d = coupling.masked_effects_lm_head(f, cands, M, lr)
            cos = coupling.proxy_cosine(f, cands, M)
            rows.append(pd.DataFrame({"pool": pool, "kind": kind, "scope": "lm_head", "cand": cands.cpu().numpy(),
                                      "delta": d.cpu().numpy(), "proxy_cos": cos.cpu().numpy(),
                                      "cand_sign": np.sign(f.A[cands].cpu().numpy()),
                                      "mask_adv_sum": f.A[M].sum(1).cpu().numpy()}))  # Σ_{k∈M} A_k
        nf = min(n_cands_full, len(cands))
        jobs = [(kind, i) for kind in coupling.SET_KINDS for i in range(nf)]
        d_full = stage.MASKED_FULL.cached(lambda: coupling.masked_effects_full(
            model, batch, f, torch.stack([cands[i] for _, i in jobs]), [sets[k][i] for k, i in jobs], lr,
            compute=compute, progress=True), **inputs, compute=compute, pool=pool, n_cands=n_cands, n_full=nf,
            mask_size=mask_size, low_quantile=low_quantile, lr=lr, seed=seed)
        full = pd.DataFrame({"pool": pool, "kind": [k for k, _ in jobs], "scope": "full",
                             "cand": [int(cands[i]) for _, i in jobs], "delta": np.asarray(d_full)})
        lm = pd.concat(rows, ignore_index=True)
        full = full.merge(lm[["kind", "cand", "proxy_cos", "cand_sign", "mask_adv_sum"]].drop_duplicates(["kind", "cand"]),
                          on=["kind", "cand"])
        out.append(pd.concat([lm, full], ignore_index=True))
    return pd.concat(out, ignore_index=True)


def topk_table(model, batch, f: coupling.Features, *, pools, n_cands: int, low_quantile: float, topk_sizes,
               topk_full_sizes, n_cands_topk_full: int, lr: float, n_boot: int, seed: int, inputs: dict,
               compute: Compute) -> pd.DataFrame:
    """Fig. 3(c): Boost Rate and Mean Boost as the k top-coupled tokens (by the proxy kernel K_ck
    alone) are masked; lm_head for every k, full scope for `topk_full_sizes` (cached). Returns the
    table and the per-candidate δ's behind it (pool, k, scope, cand, delta)."""
    rows, per = [], []
    for p in pools:
        cands_c, _ = coupling.masking_sets(f, n_cands, 1, low_quantile, seed=seeds.derive(seed, "topk_candidates"), pool=p)
        fp = coupling.Features(**{**f.__dict__, "A": f.A * (f.A > 0) if p == "positive" else f.A})  # pool's weights
        top = coupling.top_coupled_sets(fp, cands_c, max(topk_sizes))
        for k in topk_sizes:
            d = coupling.masked_effects_lm_head(f, cands_c, top[:, :k], lr)
            rows.append({"pool": p, "k": k, "scope": "lm_head", **coupling.boost_stats(d, n_boot, seed)})
            per.append(pd.DataFrame({"pool": p, "k": k, "scope": "lm_head", "cand": cands_c.cpu().numpy(),
                                     "delta": d.cpu().numpy()}))
        nf = min(n_cands_topk_full, len(cands_c))
        jobs = [(k, i) for k in topk_full_sizes for i in range(nf)]
        d_full = np.asarray(stage.MASKED_TOPK_FULL.cached(lambda: coupling.masked_effects_full(
            model, batch, f, cands_c[[i for _, i in jobs]], [top[i, :k] for k, i in jobs], lr,
            compute=compute, progress=True), **inputs, compute=compute, pool=p, sizes=list(topk_full_sizes), n=nf,
            n_cands=n_cands, low_quantile=low_quantile, max_k=max(topk_sizes), lr=lr, seed=seed))
        for k in topk_full_sizes:
            sel = [kk == k for kk, _ in jobs]
            rows.append({"pool": p, "k": k, "scope": "full", **coupling.boost_stats(d_full[sel], n_boot, seed)})
            per.append(pd.DataFrame({"pool": p, "k": k, "scope": "full",
                                     "cand": cands_c[[i for kk, i in jobs if kk == k]].cpu().numpy(),
                                     "delta": d_full[sel]}))
    return pd.DataFrame(rows), pd.concat(per, ignore_index=True)


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows, cr = W.Work(), P.n_prompts * P.G, P.chunk_rows
    W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
    W.analysis(w, rows, z, cr)                         # features
    # precision check: per copy (stock norms, exact) an analysis, a full SGD step and an analysis
    W.analysis(w, rows, z, cr, times=4)
    W.step(w, "full", rows, z, cr, times=2)
    w.extra_bytes += shape.params * W.BYTES[P.dtype] * 3  # the stock-norms copy, θ and θ' of the masked steps
    w.extra_why.append("a second copy of the policy and two snapshots of θ")
    w.full_grads = True
    pools = len(P.pools)
    n_full = pools * 3 * min(P.n_cands_full, P.n_cands) + pools * len(P.topk_full_sizes) * P.n_cands_topk_full
    # masked full effects: per call a full step + analysis, then per candidate a backward over the rows
    # holding M (≈ mask_size rows, at most the batch) and a one-row forward
    m_rows = min(P.mask_size, rows)
    W.step(w, "full", rows, z, cr, times=2 * pools)
    W.analysis(w, rows, z, cr, times=4 * pools)
    with w.split("masks (candidates)", n_full):
        w.add("full_step", positions=n_full * m_rows * z.L, head=n_full * m_rows * z.new,
              calls=n_full * W.ceil(m_rows, cr))
        w.add("analysis", positions=n_full * z.L, head=n_full * z.new, calls=n_full)
    N = rows * z.new
    with w.split("masks (proxy cosines)", pools * P.n_cands):
        W.kernel(w, pools * (P.n_cands * 3 * P.mask_size + P.n_cands * N), shape, 1024, N)  # proxy cosines, top-coupled
    # Fig. 10 run: per step a sample, an analysis, an SGD lm_head and a full step with their analyses, an Adam step
    r10 = P.run_n_prompts * P.run_G
    W.sample(w, r10, z, chunk_rows_decode=W.sample_rows(P), times=P.run_steps)
    W.analysis(w, r10, z, cr, times=3 * P.run_steps)
    W.step(w, "lm_head", r10, z, cr, times=P.run_steps)
    W.step(w, "full", r10, z, cr, times=2 * P.run_steps)
    w.adam = True
    W.step(w, "full", rows, z, cr)                     # App. D.3: Adam's first step
    return w
