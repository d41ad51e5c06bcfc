"""Fig. 12 (notebook 08): the referees' controls (not in the paper).

`compute(P)` (a) reads the GRPO run of notebook 01 (`fig01.run_config`: equal values hit the
same cached run), matches token-id counts per step across signs and computes the share gaps and
the token-id fixed-effects gap; (b) on the batch of notebook 02 (same seed offset) computes the
exact LM-head kernel K_jk = ⟨h_j,h_k⟩φ_jk for every cross-sign pair by confidence bins, and the
full-parameter inner products ⟨∇log p_j, ∇log p_k⟩ for a sample of tokens. Cached whole under
every parameter and the policy's and problems' fingerprints. `claims(R, P)` gives the claim rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import cache, controls, coupling, measure, policy, rollout, seeds, stage, train
from .. import claims as C
from .. import workload as W
from .. import stats as S
from . import base, fig01, replot
from .base import param


@dataclass
class Params(base.FigureParams):
    """Notebook 08's parameters; (a)'s run parameters equal notebook 01's read its cached run."""
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    sample_dtype: str = base.sample_dtype()
    backend: str = base.backend()
    gpu_memory_utilization: float = base.gpu_memory_utilization()
    steps: int = param(16, "(a) GRPO steps of the run (notebook 01's run: same values hit its cache)", min=1)
    n_prompts: int = base.n_prompts(16)
    G: int = base.G()
    lr: float = param(1e-4, "(a) Adam learning rate", gt=0)
    n_minibatches: int = param(2, "(a) optimizer steps per batch", min=1)
    temperature: float = base.temperature()
    max_new_tokens: int = base.max_new_tokens()
    eps: float = base.eps(doc="(a) boosted/suppressed threshold")
    conf_threshold: float = param(0.9, "confidence bins split at this p", gt=0, lt=1)
    n_full_tokens: int = param(240, "(b) tokens with full-parameter gradients (half positive, half negative)", min=2)
    grad_chunk: int = param(128, "(b) flattened per-token gradients held at once (per side)", min=1)
    chunk: int = param(1024, "(b) tokens per kernel block", min=1)
    vocab_chunk: int = param(8192, "(b) vocabulary entries per block", min=1)
    n_boot: int = param(1000, "bootstrap resamples", min=1)
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    seed: int = base.seed()


# Why Fig. 12(b)'s same-token rows cannot fail on φ: the rule text of those rows
SAME_TOKEN_K = ("same-token pairs have φ ≥ (1−p_j)(1−p_k) ≥ 0 (Eq. 10), so K's sign is ⟨h_j, h_k⟩'s, which "
                "Fig. 2(a) already tests")
TABLES = ("fig12_frequency_matched", "fig12_matched_per_step", "fig12_lm_head_kernel", "fig12_full_pairs",
          "fig12_full_summary", "fig12_kernel_cells")


@dataclass
class Result:
    """What Fig. 12 plots and its claims read."""
    run: dict                    # (a) the run's tokens and the matched subset (numbers; `run_summary(R)`)
    freq: pd.DataFrame           # (a) per (tokens, stratum, status, measure): shares, gap and t interval
    per_step: pd.DataFrame       # (a) boosted gap pos − neg per step (index): all tokens, matched, within-id
    batch: dict                  # (b) the batch's numbers (base.batch_facts; `batch_summary(R)`)
    mixed_groups: int            # (b) groups with both signs in the batch
    lm: pd.DataFrame             # (b) LM-head K_jk per (bin_j, bin_k, same/different token), every pair
    pooled: dict                 # (b) pair kind -> (mean K, lo, hi, n) over every same/different-token pair
    pairs: pd.DataFrame          # (b) sampled (j, k) pairs: full-parameter inner product and LM-head K
    full: pd.DataFrame           # (b) full-parameter inner products per (bin_j, bin_k, pair)
    corr: float                  # (b) corr(full, LM-head K) over the sampled pairs
    sign_agree: float            # (b) share of sampled pairs where they have the same sign
    seconds: float               # (b) time of the full-parameter gradients when computed
    cells: pd.DataFrame          # (b) LM-head K summed per (rollout of j, rollout of k, bins, pair): the intervals' data

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save)."""
        tables = (self.freq, self.per_step.reset_index(), self.lm, self.pairs, self.full, self.cells)
        for name, df in zip(TABLES, tables):
            cache.write_table(df, Path(results_dir) / f"{name}.parquet")
        replot.save(results_dir, P, run=self.run, batch=self.batch, seconds=self.seconds)

    def row(self, tokens, stratum, status, measure_name):
        f = self.freq
        return f[(f.tokens == tokens) & (f.stratum == stratum) & (f.status == status)
                 & (f.measure == measure_name)].iloc[0]


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots): the pooled kernel means
    re-derived from the rollout cells, the full-parameter agreement from the sampled pairs."""
    freq, per_step, lm, pairs, full, cells = (replot.table(results_dir, f"{name}.parquet") for name in TABLES)
    snap = replot.restore(results_dir, P)
    corr, sign_agree = agreement(pairs)
    return Result(freq=freq, per_step=per_step.set_index(per_step.columns[0]), lm=lm, pairs=pairs, full=full,
                  cells=cells, mixed_groups=snap["batch"]["mixed_groups"], pooled=pooled(cells, P), corr=corr,
                  sign_agree=sign_agree, **snap)


def pooled(cells: pd.DataFrame, P: Params) -> dict:
    """Pair kind -> (mean K, lo, hi, n) over every cross-sign same / different-token pair (controls.pooled_same_token)."""
    return {p: controls.pooled_same_token(n_boot=P.n_boot, seed=P.seed, pair=p, cells=cells) for p in controls.SAME}


def agreement(pairs: pd.DataFrame) -> tuple[float, float]:
    """corr(full-parameter inner product, LM-head K) over the sampled pairs, and the share with the same sign."""
    return (float(np.corrcoef(pairs.full_inner, pairs.lm_head_K)[0, 1]),
            float((np.sign(pairs.full_inner) == np.sign(pairs.lm_head_K)).mean()))


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    return base.cached(stage.FIG12, P, source, lambda: _compute(P, source))


def _compute(P: Params, source) -> Result:
    torch.manual_seed(P.seed)
    tokens = train.cached_delta_run(P.model_path, fig01.run_config(P, source), P.dtype, P.device)
    if not {"pos", "neg"} <= set(tokens.sign.unique()):
        r = tokens.groupby(["step", "rollout"]).reward.first()
        raise base.no_signal(f"08: the GRPO run's {P.steps} batches", int((r > 0).sum()), len(r), source)
    run, freq, per_step = _frequency_matched(tokens, P)

    cc = P.compute()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
    batch = rollout.sample(model, tok, base.sample_config(P, source), seed=seeds.derive(P.seed, "controls_batch"))
    base.require_signal(batch, source, "08: the referee-controls batch")
    before = cc.stats(model, batch, hidden=True)
    f = coupling.features(model, batch, before, chunk=P.chunk, vocab_chunk=P.vocab_chunk)
    n_pos, n_neg = int((f.A > 0).sum()), int((f.A < 0).sum())
    facts = base.batch_facts(batch, P.n_prompts, source, tokens=len(f), n_pos=n_pos, n_neg=n_neg,
                             conf_threshold=P.conf_threshold,
                             confident=float((f.p >= P.conf_threshold).double().mean()))
    cells = controls.cross_kernel_cells(f, P.conf_threshold, P.chunk, P.vocab_chunk)
    lm = controls.cross_kernel_summary(n_boot=P.n_boot, seed=P.seed, cells=cells)
    pooled_k = pooled(cells, P)

    t1 = time.time()
    J, K = controls.sample_tokens(f, P.n_full_tokens, P.conf_threshold, P.seed)
    ip = controls.full_grad_inner(model, batch, f, J, K, P.grad_chunk)
    pairs = controls.pair_table(f, J, K, ip, P.conf_threshold, P.vocab_chunk)
    full = controls.summarise_pairs(pairs, "full_inner")
    corr, sign_agree = agreement(pairs)
    return Result(run=run, freq=freq, per_step=per_step, batch=facts,
                  mixed_groups=batch.mixed_groups(), lm=lm, pooled=pooled_k, pairs=pairs, full=full, corr=corr,
                  sign_agree=sign_agree, seconds=time.time() - t1, cells=cells)


def _frequency_matched(tokens: pd.DataFrame, P: Params):
    """(a): share gaps (pos − neg, per step) and within-id gaps, for all tokens and for tokens matched
    per (step, token id) across signs, overall and per confidence bin."""
    signed = tokens[tokens.sign != "zero"].copy()
    signed["conf"] = controls.conf_bin(signed.prob, P.conf_threshold)
    matched = controls.frequency_match(signed, by=("step",), seed=P.seed)
    # matched within (step, token id, confidence bin): equal counts per sign inside each bin too, so
    # neither the token mix nor the confidence mix differs between the signs
    matched_conf = controls.frequency_match(signed, by=("step", "conf"), seed=P.seed)
    rows = []
    for name, d in (("all tokens", signed), ("frequency-matched", matched),
                    ("matched (step, id, conf)", matched_conf)):
        for stratum, m in (("all", d.prob >= 0), (controls.CONF_BINS[0], d.conf == controls.CONF_BINS[0]),
                           (controls.CONF_BINS[1], d.conf == controls.CONF_BINS[1])):
            for status in ("boosted", "suppressed"):
                x = d[m]
                gap = controls.status_gap(x, status) if len(x) else pd.Series(dtype=float)
                fe = controls.within_id_gap_per_step(x, status) if len(x) else pd.Series(dtype=float)
                sh = measure.flip_fractions(x, by=("step", "sign")) if len(x) else pd.DataFrame(
                    columns=["step", "sign", "status", "fraction"])
                sh = sh[sh.status == status].groupby("sign").fraction.mean()
                for measure_name, series in (("share gap", gap), ("within-id gap", fe)):
                    mean, lo, hi = S.t_interval(series)
                    rows.append({"tokens": name, "stratum": stratum, "status": status, "measure": measure_name,
                                 "pos_share": float(sh.get("pos", np.nan)), "neg_share": float(sh.get("neg", np.nan)),
                                 "gap": mean, "lo": lo, "hi": hi, "n_steps": int(series.notna().sum()),
                                 "n_tokens": len(x)})
    freq = pd.DataFrame(rows)
    per_step = pd.concat([controls.status_gap(d, "boosted").rename(name) for name, d in
                          (("all tokens", signed), ("frequency-matched", matched))], axis=1)
    per_step["within-id"] = controls.within_id_gap_per_step(signed, "boosted")
    run = dict(steps=int(signed.step.nunique()), signed=len(signed), matched=len(matched),
               matched_ids=int(matched.token_id.nunique()))
    return run, freq, per_step


def run_summary(R: Result) -> str:
    """(a) The run's tokens and the frequency-matched subset, one line."""
    r = R.run
    return (f"GRPO run: {r['steps']} steps, {r['signed']} signed tokens; frequency-matched: {r['matched']} tokens "
            f"({100 * r['matched'] / r['signed']:.0f}%), {r['matched_ids']} token ids")


def batch_summary(R: Result) -> str:
    """(b) The batch, one line (and the grader's)."""
    b = R.batch
    return base.with_grading(
        f"{b['rollouts']} rollouts, {b['tokens']} response tokens ({b['n_pos']} in A>0, {b['n_neg']} in A<0 rollouts), "
        f"share p ≥ {b['conf_threshold']}: {b['confident']:.1%}; mixed groups {b['mixed_groups']}/{b['n_prompts']}", b)


TS = dict(estimator="t over steps", resampling="step")
CLUSTER = dict(estimator="two-way cluster bootstrap over rollouts: one draw of the rollouts, a pair counts "
               "w(rollout of j)·w(rollout of k) times (j's positive and k's negative rollouts both resampled)",
               resampling="rollout")


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Intervals over training steps are Student-t intervals of the per-step gaps (as in notebook
    01), the kernel intervals a two-way bootstrap over the rollouts of j and of k."""
    fr = R.row
    rows = []
    for status in ("boosted", "suppressed"):
        r, r0 = fr("frequency-matched", "all", status, "share gap"), fr("all tokens", "all", status, "share gap")
        rows.append(C.Claim(
            f"fig12_matched_{status}", "Fig. 12(a), frequency-matched", f"similar {status} shares for both signs "
            "after matching token-id counts per step", "similar (control)", r.gap, r.lo, r.hi, n=r.n_steps,
            unit="pts (pos − neg)", rule="similar", params=dict(tol=10), **TS,
            detail=f"{status} {100 * r.pos_share:.1f}% vs {100 * r.neg_share:.1f}% on {r.n_tokens} matched tokens; "
                   f"unmatched gap {r0.gap:+.1f} pts"))
        r = fr("all tokens", "all", status, "within-id gap")
        rows.append(C.Claim(
            f"fig12_within_id_{status}", "Fig. 12(a), token-id fixed effects", f"similar {status} shares for both "
            "signs within a token id", "similar (control)", r.gap, r.lo, r.hi, n=r.n_steps,
            unit="pts (pos − neg), mean over ids", rule="similar", params=dict(tol=10), **TS,
            detail="per (step, id) with both signs present; unweighted mean over ids"))
    for stratum in controls.CONF_BINS:  # within a token id and a confidence bin
        r = fr("all tokens", stratum, "boosted", "within-id gap")
        rows.append(C.Claim(
            f"fig12_within_id_boosted_{'uncertain' if stratum == controls.CONF_BINS[0] else 'confident'}",
            f"Fig. 12(a), token-id fixed effects, {stratum}", f"similar boosted shares for both signs within a token "
            f"id, {stratum}", "similar (control)", r.gap, r.lo, r.hi, n=r.n_steps, unit="pts (pos − neg), mean over ids",
            rule="similar", params=dict(tol=10), **TS,
            detail=f"{r.n_tokens} tokens; per (step, id) with both signs present in the bin; unweighted mean over ids"))
    for status in ("boosted", "suppressed"):
        r = fr("matched (step, id, conf)", "all", status, "share gap")
        rows.append(C.Claim(
            f"fig12_matched_conf_{status}", "Fig. 12(a), matched per (step, id, confidence bin)",
            f"similar {status} shares for both signs after matching token-id counts per step and confidence bin",
            "similar (control)", r.gap, r.lo, r.hi, n=r.n_steps, unit="pts (pos − neg)", rule="similar",
            params=dict(tol=10), **TS, detail=f"{status} {100 * r.pos_share:.1f}% vs {100 * r.neg_share:.1f}% on "
            f"{r.n_tokens} matched tokens (p < 0.9 / ≥ 0.9 matched separately)"))
    for stratum in controls.CONF_BINS:
        r = fr("frequency-matched", stratum, "boosted", "share gap")
        rows.append(C.Claim(
            f"fig12_matched_boosted_{'uncertain' if stratum == controls.CONF_BINS[0] else 'confident'}",
            f"Fig. 12(a), matched, {stratum}", f"similar boosted shares after matching, {stratum}", "similar (control)",
            r.gap, r.lo, r.hi, n=r.n_steps, unit="pts (pos − neg)", rule="similar", params=dict(tol=10), **TS,
            detail=f"{r.n_tokens} matched tokens"))
    m, lo, hi, n = R.pooled["same"]
    md = R.pooled["different"]
    rows.append(C.Claim(
        "fig12_same_token_K", "Fig. 12(b), LM-head", "same-token cross-sign LM-head inner products are positive",
        "> 0 (hypothesis)", m, lo, hi, n=n, unit="mean K_jk over all same-token (A>0, A<0) pairs", rule="construction",
        params=dict(sign=1, why=SAME_TOKEN_K), **CLUSTER, detail=f"different-token pairs: mean K {md[0]:.3g} [{md[1]:.3g}, {md[2]:.3g}] over "
        f"{md[3]} pairs; the rollouts of {R.mixed_groups} mixed groups resampled"))
    tag = {"p<0.9": "u", "p>=0.9": "c"}
    for bj in controls.CONF_BINS:
        for bk in controls.CONF_BINS:
            r = R.lm[(R.lm.bin_j == bj) & (R.lm.bin_k == bk) & (R.lm.pair == "same")].iloc[0]
            rows.append(C.Claim(
                f"fig12_same_token_K_{tag[bj]}{tag[bk]}", f"Fig. 12(b), {bj} × {bk}",
                f"same-token cross-sign K_jk > 0 (j {bj}, k {bk})", "> 0 (hypothesis)", r.mean_K, r.mean_K_lo,
                r.mean_K_hi, n=r.n_pairs, unit="mean K_jk", rule="construction", params=dict(sign=1, why=SAME_TOKEN_K),
                **CLUSTER,
                detail=f"share K > 0 {100 * r.share_positive:.1f}%, mean |K| {r.mean_abs_K:.3g}"))
    same_pairs = R.pairs[R.pairs.pair == "same"]
    fs = same_pairs.full_inner
    x = fs.to_numpy()
    fm = (S.rollout_pair_bootstrap(lambda w: float((w * x).sum() / w.sum()), same_pairs.row_j, same_pairs.row_k,
                                   P.n_boot, P.seed, pairs=False) if len(fs) else (np.nan, np.nan, np.nan, 0))
    rows.append(C.Claim(
        "fig12_same_token_full", "Fig. 12(c), full parameters", "same-token cross-sign full-parameter inner products "
        "are positive", "> 0 (hypothesis)", *fm[:3], n=len(fs), unit="mean ⟨∇log p_j, ∇log p_k⟩ (sampled pairs)",
        rule="direction", params=dict(sign=1), **CLUSTER,
        detail=f"share > 0 {100 * (fs > 0).mean():.1f}%; corr with LM-head K {R.corr:.2f} over {len(R.pairs)} pairs; "
               f"{fm[3]} rollouts (the sampled tokens' pairs are every j × k, so only the rollouts are resampled)"))
    return rows


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows, cr = W.Work(), P.n_prompts * P.G, P.chunk_rows
    W.delta_run(w, P, z, rows, P.steps, P.n_minibatches, cr)   # (a) notebook 01's run (read from the cache when 01 ran)
    w.notes.append("(a) counts notebook 01's GRPO run, which a previous run of 01 leaves in the cache")
    W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
    W.features(w, P, shape, z, rows)
    N = rows * z.new
    W.kernel(w, N * N / 2 + N * N, shape, P.chunk, N)   # cross-sign pairs, then the same-token pools
    n = P.n_full_tokens // 2
    # (b) per-token full gradients: J's once, K's again for every chunk of J; one backward each,
    # through its row (one forward per row; the backward dominates)
    grads = n + W.ceil(n, P.grad_chunk) * n
    w.add("full_step", positions=grads * z.L, head=grads, calls=grads)
    w.extra_bytes += 2 * min(P.grad_chunk, n) * shape.params * W.BYTES[P.dtype]
    w.extra_why.append(f"2 x grad_chunk = {2 * min(P.grad_chunk, n)} flattened full gradients")
    return w
