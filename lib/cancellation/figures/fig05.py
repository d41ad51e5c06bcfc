"""Fig. 5 and Fig. 11 (notebook 05): the Monte Carlo counterfactual value of boosted vs suppressed tokens.

`compute(P)` samples one batch, takes the plain-SGD GRPO step that splits its tokens into boosted
/ suppressed (Fig. 5) and K repeated steps per optimizer and lr of the grids (Fig. 11,
`value.repeated_deltas`), then values a balanced pool of tokens with every estimator
(`value.token_values`: M continuations per branch) and reads (a) the value gap per rollout sign,
(b) the gap on the top-k% highest-entropy tokens and its peak, the gap by token class and by
confidence, and Fig. 11's gap after each repeated step on a pool drawn before any step. Every
interval resamples the query groups the valued tokens come from (a cluster bootstrap: a drawn group
brings all its tokens; the tokens of one prompt's rollouts are not independent). The
expensive parts keep their own caches, shared with other runs (the repeated steps by model, batch,
optimizer, lr and K; the continuations' rewards per prefix); the whole Result is cached under every
parameter and the model's, problems' and category table's fingerprints. `fig05_claims.claims(R, P)` gives the
notebook's claim rows.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

import torch

from .. import cache, categories, grpo, measure, policy, rollout, seeds, stage, thesis, value
from .. import workload as W
from .. import stats as S
from . import base, replot
from .base import param

TABLES = ("fig05_token_values", "fig05_cell_means", "fig05_entropy_gap", "fig05_strata_gap", "fig11_repeated_gap",
          "fig05_value_null", "fig05_value_null_tokens")
VALUE_COLUMNS = ["rollout", "group", "position", "token_id", "token", "category", "reward", "advantage", "sign", "prob",
                 "entropy", "delta", "status", "avg0", "avg1", "delta_hat", "delta_se", "M", "estimator"]
CONFIDENT = measure.CONFIDENT
CONFIDENCE = (f"p < {CONFIDENT:g}", f"p ≥ {CONFIDENT:g}")  # the confidence strata (p < CONFIDENT / p ≥ CONFIDENT)


@dataclass
class Params(base.FigureParams):
    """Notebook 05's parameters."""
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    sample_dtype: str = base.sample_dtype("float32")
    n_prompts: int = base.n_prompts(16, "prompts in the batch")
    G: int = base.G()
    temperature: float = base.temperature(doc="sampling temperature (batch and continuations)")
    max_new_tokens: int = base.max_new_tokens(doc="response cap (a continuation ends where a rollout would)")
    lr: float = param(0.1, "SGD learning rate of the GRPO step that splits Fig. 5's tokens (App. D.2: plain SGD, lr 0.1)",
                      gt=0)
    repeat_steps: int = param(10, "K: GRPO steps on the same batch for Fig. 11", min=1)
    sgd_lrs: list = param([0.1, 1.0], "Fig. 11: plain-SGD learning rates of the repeated steps ([] skips SGD)",
                          gt=0, distinct=True)
    adam_lrs: list = param([1e-3, 1e-2], "Fig. 11: Adam learning rates of the repeated steps (the training optimizer; "
                           "[] skips Adam)", gt=0, distinct=True)
    nonlinear_share: float = param(0.2, "Fig. 11 reads, per optimizer, the smallest lr at which this share of pool "
                                   "statuses changed from step 1 to step K", gt=0, max=1)
    null_shuffles: int = param(39, "K: within-group sign shuffles of the advantages for the value gap's null (one "
                               "SGD step each on the same batch, valued on Fig. 11's pool; 39 resolves a 2.5% tail, "
                               "permutation p-value resolution 1/(K + 1))", min=1)
    n_pool11: int = param(150, "Fig. 11: tokens per rollout sign valued for the repeated steps, drawn before any step, "
                          "whatever their status", min=1)
    heldout_per_cell: int = param(60, "held-out states: tokens valued per (sign, boosted/suppressed) cell of a second "
                                  "batch (new prompts) that the step on the first never saw (0 skips)", min=0)
    eps: float = base.eps()
    p_max: float = param(0.999, "skip tokens with p_t above this (Eq. 20 divides by 1 - p_t)", gt=0, lt=1)
    M: int = param(16, "continuations per branch and token (paper: 256)", min=2)
    n_per_cell: int = param(100, "tokens valued per (rollout sign, boosted/suppressed) cell of step 1", min=1)
    estimators: list = param(["exclude", "paper"], "Δ̂ estimators computed on the same tokens ('paper' is Eq. 20); "
                             "the first is the one Fig. 5(b), the strata and Fig. 11 read",
                             choices=["exclude", "paper"], nonempty=True, distinct=True)
    tagger: str = base.tagger("token classes of the by-class gap (as notebook 04): 'shipped', 'auto', 'perceptron'")
    category_map: str = param("", "path of a category table; empty: data/categories/category_map.csv", path="file")
    entropy_k: list = param([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], "top-k% highest-entropy subsets of panel (b)",
                            gt=0, max=100, nonempty=True)
    n_boot: int = param(2000, "bootstrap resamples of the 95% intervals", min=1)
    rows_per_chunk: int = param(1024, "continuation rows per sampler batch", min=1)
    backend: str = base.backend()
    gpu_memory_utilization: float = base.gpu_memory_utilization()
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    seed: int = base.seed()

    def grid(self) -> list[tuple[str, float]]:
        """Fig. 11's runs: (optimizer, lr) for every lr of sgd_lrs, then of adam_lrs."""
        return [("sgd", r) for r in self.sgd_lrs] + [("adam", r) for r in self.adam_lrs]


@dataclass
class Result:
    """What Fig. 5 and Fig. 11 plot and their claims read."""
    facts: dict               # the batch, the GRPO steps, the tokens of mixed groups (numbers; `summary(R)`)
    counts: pd.DataFrame      # tokens of mixed groups with p_t ≤ p_max per (sign) × (status after step 1)
    mc: pd.DataFrame          # per estimator: continuations sampled, cache hits, seconds
    se: pd.DataFrame          # per estimator: mean / median / 90% / max per-token standard error of Δ̂
    values: pd.DataFrame      # the Fig. 5 pool, one row per (token, estimator): Δ̂, its SE, status, class, p, entropy
    cells: pd.DataFrame       # (a): mean Δ̂ per (estimator, sign, status) with group-bootstrap intervals
    gap1: pd.DataFrame        # (a): value gap per (estimator, sign ∈ pos/neg/all) after step 1
    entropy_gap: pd.DataFrame  # (b): value gap per (estimator, top-k% entropy, sign)
    peak: dict                # (b): where the balanced gap peaks (k of the valued pool, and of all tokens), groups
    strata: pd.DataFrame      # value gap by token class and by confidence (first estimator)
    conf_gaps: pd.DataFrame   # value gap per (sign, confidence stratum) (first estimator)
    pool11: pd.DataFrame      # Fig. 11's pool, valued with the first estimator
    repeated: pd.DataFrame    # Fig. 11: gap per (optimizer, lr, step), changed statuses, paired change
    chosen: dict              # Fig. 11: optimizer -> the lr its claim reads (None: no lr changed enough statuses)
    seconds: float            # wall time of the computation (of the first run, when cached)
    heldout: pd.DataFrame | None = None  # held-out states: a second batch's pool, split by the step on the first
    value_null: pd.DataFrame | None = None  # the value gap's null: one row per step (0: real, 1..K: sign shuffles)
    null_tokens: pd.DataFrame | None = None  # its per-token table: Fig. 11's pool split by every step of it
    null_test: dict | None = None  # real gap − mean shuffled gap (pooled, sign-balanced), intervals, p-values, cost

    @property
    def last(self) -> pd.DataFrame:
        """Fig. 11 after the last step, indexed by (optimizer, lr)."""
        return self.repeated[self.repeated.step == self.repeated.step.max()].set_index(["optimizer", "lr"])

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save): the batch's facts, the counts
        per cell, the Monte Carlo cost, the peak (it reads every token's entropy), the null's run facts."""
        d = Path(results_dir)
        for name, df in zip(TABLES, (self.values[VALUE_COLUMNS], self.cells, self.entropy_gap, self.strata,
                                     self.repeated, self.value_null, self.null_tokens)):
            if df is not None:
                cache.write_table(df, d / f"{name}.parquet")
        if self.heldout is not None:
            cache.write_table(self.heldout[[c for c in VALUE_COLUMNS if c in self.heldout]],
                              d / "fig05_heldout_values.parquet")
        null_run = None if self.null_test is None else {k: self.null_test[k] for k in NULL_RUN}
        replot.save(results_dir, P, facts=self.facts, counts=self.counts, mc=self.mc, peak=self.peak,
                    seconds=self.seconds, null_run=null_run)


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots): the tables read back, the
    gaps and intervals no table holds derived from them as compute derives them. Its `values`, `heldout` and
    `pool11` (the null's step-0 rows) carry the columns the tables keep (what the claims and figures read)."""
    values, cells, entropy_gap, strata, repeated, value_null, null_tokens = (
        replot.table(results_dir, f"{name}.parquet") for name in TABLES)
    kept = replot.restore(results_dir, P)
    heldout = replot.table(results_dir, "fig05_heldout_values.parquet") if P.heldout_per_cell else None
    null_run = kept.pop("null_run")
    null_res = None if null_run is None else dict(null_test(null_tokens, P.n_boot, P.seed),
                                                  **{k: null_run[k] for k in NULL_RUN}, lr=P.lr)  # compute's order
    pool11 = null_tokens[null_tokens.shuffle == 0].drop(columns=["shuffle", "delta", "status"]).reset_index(drop=True)
    return Result(**kept, se=value_se(values), values=values, cells=cells, gap1=_gaps(values, P, step=1),
                  entropy_gap=entropy_gap, strata=strata,
                  conf_gaps=_confidence_gaps(values[values.estimator == P.estimators[0]], P), pool11=pool11,
                  repeated=repeated, chosen=fig11_chosen(repeated, P), heldout=heldout, value_null=value_null,
                  null_tokens=null_tokens, null_test=null_res)


def value_se(values: pd.DataFrame) -> pd.DataFrame:
    """Per estimator: mean / median / 90% / max per-token standard error of Δ̂."""
    return values.groupby("estimator").delta_se.describe(percentiles=[0.5, 0.9])[["mean", "50%", "90%", "max"]]


def fig11_chosen(repeated: pd.DataFrame, P: Params) -> dict:
    """Fig. 11: optimizer -> the smallest lr whose share of the pool's statuses changed between step 1 and
    step K reaches `nonlinear_share` (None: no lr of its grid did)."""
    last11 = repeated[repeated.step == P.repeat_steps].set_index(["optimizer", "lr"])
    return {o: value.nonlinear_choice(last11.loc[o].changed_status.to_dict(), P.nonlinear_share)
            for o in dict.fromkeys(o for o, _ in P.grid())}


def fig11_reads(R: Result) -> dict:
    """Per optimizer of Fig. 11: (the lr its claim row reads, whether that lr reached `nonlinear_share` of changed
    statuses between step 1 and step K): the smallest lr that did (`R.chosen`), else the largest lr of the grid."""
    return {o: (c, True) if c is not None else (float(R.repeated[R.repeated.optimizer == o].lr.max()), False)
            for o, c in R.chosen.items()}


def category_fingerprint(path: str = "") -> str:
    """sha256 of the category table's rows (its `include`s expanded): what the token classes depend on."""
    rows = [row for _, _, row in categories._map_rows(Path(path or categories.DEFAULT_MAP))]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    tagger = categories.Categorizer(P.category_map or None, tagger=P.tagger).tagger  # 'auto' resolved
    return base.cached(stage.FIG05, P, source, lambda: _compute(P, source),
                       categories=category_fingerprint(P.category_map), tagger_used=tagger)


def _compute(P: Params, source) -> Result:
    t_start = time.perf_counter()
    cc = P.compute()
    # the batch and every continuation come from one sampler (n = M per prefix); the policy is not
    # updated before valuing
    model, tok, sampler = base.load_sampler(P)  # seeds torch first
    verifier = source.verifier()
    fp = policy.fingerprint(P.model_path)
    scfg = base.sample_config(P, source, sampler=True)
    batch = rollout.sample(sampler, tok, scfg, seed=seeds.derive(P.seed, "value_batch"))
    base.require_signal(batch, source, "05: the value-gap batch")
    facts = base.batch_facts(batch, P.n_prompts, source, tokens=int(batch.n_tokens))

    def steps_run(optimizer, step_lr, K):
        """(K, response tokens) cumulative Δlog p of K steps on the batch (cached)."""
        return stage.REPEATED_DELTAS.cached(lambda: value.repeated_deltas(
            model, batch, cc.update(optimizer=optimizer, lr=step_lr, scope="full", n_minibatches=1), K),
            model=fp, dtype=P.dtype, sample=scfg, optimizer=optimizer, lr=step_lr, K=K)

    # GRPO steps: Fig. 5's split by one plain-SGD step, Fig. 11's K steps per optimizer and lr
    t0 = time.perf_counter()
    tokens = measure.token_table(batch, cc.stats(model, batch), tokenizer=tok)
    tokens["tok_idx"] = np.arange(len(tokens))  # position in the response-token order of every Δlog p array
    tokens["category"] = categories.Categorizer(P.category_map or None, tagger=P.tagger).tag_batch(
        batch, tok).category.to_numpy()
    tokens["delta"] = steps_run("sgd", P.lr, 1)[0]
    tokens["status"] = measure.classify(tokens["delta"], P.eps)
    grid = P.grid()
    deltas = {(o, r): steps_run(o, r, P.repeat_steps) for o, r in grid}
    facts.update(grid=len(grid), repeat_steps=P.repeat_steps, steps_seconds=time.perf_counter() - t0)
    mixed = (tokens.sign != "zero").to_numpy()
    facts["medians"] = [dict(optimizer=o, lr=r, first=float(np.median(np.abs(D[0][mixed]))),
                             last=float(np.median(np.abs(D[-1][mixed])))) for (o, r), D in deltas.items()]
    signed = tokens[tokens.sign != "zero"]
    skipped = signed.prob > P.p_max
    counts = signed[~skipped].groupby(["sign", "status"]).size().unstack("status", fill_value=0)
    facts.update(signed=len(signed), p_max=P.p_max, skipped=int(skipped.sum()), skipped_share=float(skipped.mean()))

    # Fig. 5's pool: n_per_cell tokens per (sign, boosted/suppressed) cell of step 1, valued under π_θ0
    cells = signed[~skipped & (signed.status != "stable")]
    pool_tokens = value.balanced_sample(cells, seed=P.seed, n=P.n_per_cell)
    mid = f"{fp}:{P.sample_dtype}"
    valued, mc = {}, []
    for est in P.estimators:
        mc_stats = {}
        valued[est] = value.token_values(sampler, tok, batch, pool_tokens, _value_config(P, est), mid=mid,
                                         verifier=verifier, stats=mc_stats)
        mc.append(dict(estimator=est, M=P.M, tokens=len(pool_tokens), **mc_stats,
                       per_second=mc_stats["continuations"] / mc_stats["seconds"] if mc_stats["continuations"]
                       else np.nan))
    mc = pd.DataFrame(mc)
    vt = pd.concat([v.assign(estimator=e) for e, v in valued.items()], ignore_index=True)
    se = value_se(vt)

    # Fig. 5(a) per cell and per sign, (b) on the top-k% highest-entropy tokens
    fig5a = _cell_means(vt, P)
    gap1 = _gaps(vt, P, step=1)
    ent_rows = []
    for k in P.entropy_k:
        thr = {e: d.entropy.quantile(1 - k / 100) for e, d in vt.groupby("estimator")}
        top = vt[vt.entropy >= vt.estimator.map(thr)]
        ent_rows.append(_gaps(top, P, k=k))
    fig5b = pd.concat(ent_rows, ignore_index=True)

    # by token class and by confidence (first estimator)
    v0 = vt[vt.estimator == P.estimators[0]].copy()
    v0["confidence"] = np.where(v0.prob < CONFIDENT, *CONFIDENCE)
    strata = []
    for col in ("category", "confidence"):
        for level, d in v0.groupby(col):
            strata += [dict(by=col, level=level, **r) for r in value.sign_gaps(d, P.n_boot, P.seed,
                                                                                 clusters=d.group)]
    strata = pd.DataFrame(strata)
    peak = _peak(v0, signed, P)
    conf_gaps = _confidence_gaps(v0, P)

    # Fig. 11: a pool drawn before any step, whatever its status; split after each repeated step
    pool11 = value.balanced_sample(signed[~skipped], by=("sign",), seed=seeds.derive(P.seed, "pool11"),
                                   n=P.n_pool11)
    v11 = value.token_values(sampler, tok, batch, pool11, _value_config(P, P.estimators[0]), mid=mid,
                             verifier=verifier)
    rows = []
    for (o, r), D in deltas.items():
        rg = value.repeated_gap(v11.delta_hat, v11.sign, D[:, v11.tok_idx.to_numpy()], P.eps, P.n_boot, P.seed,
                                clusters=v11.group)
        rows.append(rg.assign(optimizer=o, lr=r, estimator=P.estimators[0]))
    fig11 = pd.concat(rows, ignore_index=True)
    chosen = fig11_chosen(fig11, P)
    # the value gap's null: the same SGD step under K within-group sign shuffles of the advantages, valued on
    # Fig. 11's pool (drawn before any step, whatever its status: Fig. 5's pool is selected by the real step)
    t0 = time.perf_counter()
    null_seed = seeds.derive(P.seed, "value_null")
    null = stage.VALUE_NULL.cached(lambda: null_steps(model, batch, cc, P.lr, P.null_shuffles, null_seed),
                                   model=fp, dtype=P.dtype, sample=scfg, lr=P.lr, K=P.null_shuffles, seed=null_seed)
    real_error = float(np.abs(null["deltas"][0] - tokens["delta"].to_numpy()).max())
    # the same step by two float paths: round-off of the policy's dtype (float64: 1e-14 measured; float32, the
    # stand-ins': 2e-6 measured, log-probs of order 1 rounded at 1.2e-7 through a step)
    tol = 1e-9 * float(np.abs(tokens["delta"]).max()) + 1e-12 if P.dtype == "float64" else 1e3 * float(
        torch.finfo(getattr(torch, P.dtype)).eps)
    if not real_error <= tol:
        raise RuntimeError(f"05: the null's real-order step differs from the real step by {real_error:.2e}")
    null_tokens = null_token_table(v11, null["deltas"], P.eps)
    value_null = null_gaps(null_tokens)
    null_res = dict(null_test(null_tokens, P.n_boot, P.seed), path=null["path"], params=null["params"],
                    matrix_bytes=null["matrix_bytes"], steps_seconds=null["seconds"], real_error=real_error,
                    seconds=time.perf_counter() - t0, lr=P.lr)
    heldout = None
    if P.heldout_per_cell:  # a second batch, new prompts: its tokens split by the step on the first batch
        t0 = time.perf_counter()
        other = rollout.sample(sampler, tok, scfg, seed=seeds.derive(P.seed, "heldout_batch"))
        t2 = measure.token_table(other, cc.stats(model, other), tokenizer=tok)
        t2["tok_idx"] = np.arange(len(t2))
        t2["delta"] = value.heldout_deltas(model, batch, other, cc.update(optimizer="sgd", lr=P.lr, scope="full",
                                                                          n_minibatches=1))
        t2["status"] = measure.classify(t2["delta"], P.eps)
        cells2 = t2[(t2.sign != "zero") & (t2.prob <= P.p_max) & (t2.status != "stable")]
        pool2 = value.balanced_sample(cells2, seed=seeds.derive(P.seed, "heldout_pool"), n=P.heldout_per_cell)
        heldout = value.token_values(sampler, tok, other, pool2, _value_config(P, P.estimators[0]), mid=mid,
                                     verifier=verifier).assign(estimator=P.estimators[0])
        facts["heldout"] = dict(rollouts=len(other), tokens=len(pool2), seconds=time.perf_counter() - t0)
    return Result(facts=facts, counts=counts, mc=mc, se=se, values=vt, cells=fig5a, gap1=gap1,
                  entropy_gap=fig5b, peak=peak, strata=strata, conf_gaps=conf_gaps, pool11=v11, repeated=fig11,
                  chosen=chosen, seconds=time.perf_counter() - t_start, heldout=heldout, value_null=value_null,
                  null_tokens=null_tokens, null_test=null_res)


# ----------------------------------------------------------------------------- the value gap's sign-shuffle null
NULL_MATRIX_BYTES = 2 * 2**30  # rollouts x parameters float64 up to this: the matrix path; above it, exact steps
NULL_STATS = ("pooled", "balanced")  # the gap over both rollout signs as drawn; the mean of the per-sign gaps
NULL_RUN = ("path", "params", "matrix_bytes", "steps_seconds", "real_error", "seconds")  # R.null_test's facts of the run


def null_steps(model, batch, knobs, lr: float, K: int, seed: int) -> dict:
    """Δlog p of the batch's response tokens (row-major over its response_mask, the token table's order) after
    one plain-SGD GRPO step of rate `lr` from θ₀ (full scope, one mini-batch) under the real advantages (row 0)
    and under K within-group shuffles of the rollouts' advantages (`thesis.shuffles`: every group keeps its
    multiset of advantages; rows 1..K). Two paths, the same numbers to float round-off: `matrix`
    (`thesis.rollout_gradients` once, then one product and one forward per order, `thesis.null_deltas`) when
    the rollouts x parameters float64 matrix fits in NULL_MATRIX_BYTES, else `exact` (`grpo.Trials.delta` of
    the batch with each order's advantages: a backward and a step per order). θ₀ is left as it was.
    Returns deltas (K + 1, n), orders (K + 1, B), path, params, matrix_bytes, seconds."""
    t0 = time.perf_counter()
    orders = torch.cat([torch.arange(len(batch))[None], thesis.shuffles(batch, K, seed)])
    n_params = sum(p.numel() for p in grpo.scope_params(model, "full"))
    nbytes = len(batch) * n_params * 8
    path = "matrix" if nbytes <= NULL_MATRIX_BYTES else "exact"
    m = batch.response_mask.bool()
    if path == "matrix":
        G = thesis.rollout_gradients(model, batch, knobs, "full")
        D = thesis.null_deltas(model, batch, knobs, lr, thesis.shuffle_weights(batch, orders, "grpo"), "full", G=G)
        out = D[:, m.cpu()]
        del G
    else:
        trials = grpo.Trials(model, batch, knobs)
        cfg = knobs.update(optimizer="sgd", lr=lr, scope="full", reweight="grpo", n_minibatches=1)
        rows = []
        for o in orders:
            o = o.to(batch.reward.device)
            rows.append(trials.delta(cfg, dataclasses.replace(batch, reward=batch.reward[o],
                                                              advantage=batch.advantage[o]))[m].cpu())
        out = torch.stack(rows)
    return dict(deltas=out.double().numpy(), orders=orders.numpy(), path=path, params=n_params, matrix_bytes=nbytes,
                seconds=time.perf_counter() - t0)


def null_token_table(pool: pd.DataFrame, deltas: np.ndarray, eps: float) -> pd.DataFrame:
    """Fig. 11's valued pool split by every step of the null: one row per (step, pool token), step 0 the real
    order (`shuffle`), with the token's query group, rollout sign (as drawn), Δ̂, Δlog p and status."""
    idx = pool.tok_idx.to_numpy()
    d = np.asarray(deltas)[:, idx]
    k1, n = d.shape
    return pd.DataFrame(dict(shuffle=np.repeat(np.arange(k1), n), tok_idx=np.tile(idx, k1),
                             group=np.tile(pool.group.to_numpy(), k1), sign=np.tile(pool.sign.to_numpy(), k1),
                             delta_hat=np.tile(pool.delta_hat.to_numpy(dtype=float), k1), delta=d.ravel(),
                             status=measure.classify(d.ravel(), eps)))


def _null_arrays(nt: pd.DataFrame):
    """(values (n,), sign (n,), boosted (K+1, n), suppressed (K+1, n), group (n,)) of a null token table."""
    k1 = int(nt.shuffle.max()) + 1
    first = nt[nt.shuffle == 0]
    st = nt.status.to_numpy().reshape(k1, len(first))
    return (first.delta_hat.to_numpy(float), first.sign.to_numpy(), (st == "boosted").astype(float),
            (st == "suppressed").astype(float), first.group.to_numpy())


def _null_gap_matrix(W: np.ndarray, v, sign, Bm, Sm) -> dict:
    """Per weight row of W (observation weights: ones for the point, a replicate's cluster counts) and per
    step: the pooled gap (weighted mean Δ̂ of boosted − of suppressed over both signs), each sign's gap and
    their mean (balanced). (rows of W, K + 1) arrays; NaN where a cell is empty."""
    def gap(b, s):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (W @ (b * v).T) / (W @ b.T) - (W @ (s * v).T) / (W @ s.T)
    out = {"pooled": gap(Bm, Sm)}
    for sg in ("pos", "neg"):
        on = (sign == sg).astype(float)
        out[sg] = gap(Bm * on, Sm * on)
    out["balanced"] = (out["pos"] + out["neg"]) / 2
    return out


def null_gaps(nt: pd.DataFrame) -> pd.DataFrame:
    """One row per step of the null (0: the real order, 1..K: the shuffles): the value gap pooled over both
    rollout signs, per sign, sign-balanced, and the counts of boosted / suppressed tokens of the pool."""
    v, sign, Bm, Sm, _ = _null_arrays(nt)
    g = _null_gap_matrix(np.ones((1, len(v))), v, sign, Bm, Sm)
    pos = sign == "pos"
    return pd.DataFrame(dict(shuffle=np.arange(len(Bm)), real=np.arange(len(Bm)) == 0, gap=g["pooled"][0],
                             gap_pos=g["pos"][0], gap_neg=g["neg"][0], gap_balanced=g["balanced"][0],
                             n_boosted=Bm.sum(1).astype(int), n_suppressed=Sm.sum(1).astype(int),
                             n_boosted_pos=Bm[:, pos].sum(1).astype(int),
                             n_suppressed_pos=Sm[:, pos].sum(1).astype(int),
                             same_status_as_real=((Bm == Bm[0]) & (Sm == Sm[0])).mean(1)))


def permutation_p(real: float, null) -> float:
    """(1 + #{null ≥ real}) / (K + 1): the one-sided permutation p-value of `real` against K null draws."""
    null = np.asarray(null, float)
    return float((1 + (null >= real).sum()) / (len(null) + 1))


def null_test(nt: pd.DataFrame, n_boot: int, seed: int, alpha: float = 0.05) -> dict:
    """Per statistic (NULL_STATS): the real gap, the shuffles' mean, median and (alpha/2, 1 − alpha/2) band,
    the permutation p-value, and real − mean shuffled gap with a paired percentile cluster bootstrap over the
    pool's query groups: a replicate draws the groups with replacement (`stats.cluster_resamples`, the engine
    of every interval of this notebook) and recomputes the real gap and all K shuffles' gaps on the same draw
    (one matrix product for all replicates); replicates with an empty cell are dropped, NaN when over half are."""
    v, sign, Bm, Sm, group = _null_arrays(nt)
    K = len(Bm) - 1
    pt = _null_gap_matrix(np.ones((1, len(v))), v, sign, Bm, Sm)
    W = np.stack(list(S.cluster_resamples([group], n_boot, seed)))
    reps = _null_gap_matrix(W, v, sign, Bm, Sm)
    out = dict(K=K, n_tokens=len(v), n_groups=int(len(np.unique(group))), n_boot=n_boot)
    for name in NULL_STATS:
        g, r = pt[name][0], reps[name]
        lo, hi = S.percentile_interval(r[:, 0] - r[:, 1:].mean(1), q=(alpha / 2, 1 - alpha / 2), min_defined=0.5)
        qlo, med, qhi = np.quantile(g[1:], [alpha / 2, 0.5, 1 - alpha / 2])
        out[name] = dict(real=float(g[0]), null_mean=float(g[1:].mean()), null_median=float(med),
                         null_lo=float(qlo), null_hi=float(qhi), diff=float(g[0] - g[1:].mean()), lo=lo, hi=hi,
                         p=permutation_p(g[0], g[1:]), resolution=1 / (K + 1))
    return out


def summary(R: Result) -> str:
    """The batch (and the grader's line), the GRPO steps, the tokens of mixed groups, the held-out batch."""
    f = R.facts
    lines = [base.with_grading(f"batch: {f['rollouts']} rollouts, {f['tokens']} response tokens, accuracy "
                               f"{f['accuracy']:.2f}, mixed groups {f['mixed_groups']}/{f['n_prompts']}", f),
             f"1 + {f['grid']} x {f['repeat_steps']} GRPO steps + forwards: {f['steps_seconds']:.1f} s "
             "(cached after the first run)"]
    lines += [f"{m['optimizer']} lr {m['lr']:g}: median |Δlog p| after step 1 {m['first']:.1e}, after step "
              f"{f['repeat_steps']} {m['last']:.1e}" for m in f["medians"]]
    lines.append(f"tokens of mixed groups: {f['signed']}; skipped (p_t > {f['p_max']}): {f['skipped']} "
                 f"({100 * f['skipped_share']:.1f}%)")
    if f.get("heldout"):
        h = f["heldout"]
        lines.append(f"held-out states: a second batch ({h['rollouts']} rollouts, new prompts), split by the step on "
                     f"the first; {h['tokens']} tokens valued, {h['seconds']:.1f} s")
    return "\n".join(lines)


def _value_config(P: Params, estimator: str) -> value.ValueConfig:
    return value.ValueConfig(M=P.M, seed=P.seed, temperature=P.temperature, max_new_tokens=P.max_new_tokens,
                             estimator=estimator, p_max=P.p_max, rows_per_chunk=P.rows_per_chunk, backend=P.backend,
                             token_chunk=P.token_chunk)


def _cell_means(df, P: Params, status_col="status"):
    rows = []
    for (est, sign, status), d in df.groupby(["estimator", "sign", status_col]):
        if status == "stable":
            continue
        m, lo, hi = S.bootstrap_mean(d.delta_hat, P.n_boot, P.seed, clusters=d.group)
        rows.append(dict(estimator=est, sign=sign, status=status, n=len(d), mean=m, lo=lo, hi=hi))
    return pd.DataFrame(rows)


def _gaps(df, P: Params, status_col="status", **extra):
    """Value gap per sign and the sign average, with intervals that resample the query groups."""
    return pd.DataFrame([dict(estimator=est, **r, **extra) for est, d in df.groupby("estimator")
                         for r in value.sign_gaps(d, P.n_boot, P.seed, status_col, clusters=d.group)])


def _peak(v0, signed, P: Params) -> dict:
    """Fig. 5(b)'s peak k with its interval: query groups resampled (each brings all its valued tokens),
    each replicate finds its own peak k (all valued tokens, no balancing); `groups` counts them. k counts
    within the valued pool (p ≤ p_max); the paper's k counts all tokens: `all`, `all_lo`, `all_hi` map the
    pool's entropy threshold at k to the share of all response tokens of mixed groups above it (monotone
    in k)."""
    kmax, klo, khi = S.bootstrap_peak(v0.delta_hat, v0.sign, v0.status, v0.entropy, P.entropy_k,
                                      min(P.n_boot, 1000), P.seed, clusters=v0.group)
    a, a_lo, a_hi = S.bootstrap_peak(v0.delta_hat, v0.sign, v0.status, v0.entropy, P.entropy_k,
                                     min(P.n_boot, 1000), P.seed, to=lambda k: to_all(signed.entropy, v0.entropy, k,
                                                                                      max(P.entropy_k)),
                                     clusters=v0.group)
    return dict(k=kmax, lo=klo, hi=khi, all=a, all_lo=a_lo, all_hi=a_hi, n=len(v0),
                groups=int(v0.group.nunique()),
                reach=to_all(signed.entropy, v0.entropy, max(P.entropy_k) - 1e-9, max(P.entropy_k)),
                k_all=[to_all(signed.entropy, v0.entropy, k, np.inf) for k in P.entropy_k])  # (b)'s k as % of all


def to_all(all_entropy, pool_entropy, k, k_end):
    """Fig. 5(b)'s k of the valued pool as the paper's k (% of all response tokens of mixed groups at
    or above the pool's entropy threshold at k). A peak at the pool's last k (`k_end`) has no fall
    inside the pool, so it reads k = 100% of all tokens: a gap that grows to the pool's end fails the
    peak rule on the high side (the pool holds only the top ~half of tokens by entropy, so mapped
    literally even k = 100% of the pool would land near 40%)."""
    if k >= k_end:
        return 100.0
    return 100 * float((np.asarray(all_entropy) >= np.quantile(np.asarray(pool_entropy), 1 - k / 100)).mean())


def _confidence_gaps(v0, P: Params) -> pd.DataFrame:
    """The value gap per rollout sign within each confidence stratum (p confounds the gap), with intervals
    that resample the query groups of the stratum's tokens."""
    rows = []
    for sign in ("pos", "neg"):
        for conf, m in zip(CONFIDENCE, (v0.prob < CONFIDENT, v0.prob >= CONFIDENT)):
            d = v0[m & (v0.sign == sign)]
            b, sp = d[d.status == "boosted"], d[d.status == "suppressed"]
            g, lo, hi = S.bootstrap_gap(b.delta_hat, sp.delta_hat, P.n_boot, P.seed, clusters=(b.group, sp.group))
            rows.append(dict(sign=sign, confidence=conf, gap=g, lo=lo, hi=hi, n_boosted=len(b), n_suppressed=len(sp),
                             n_groups=int(pd.concat([b.group, sp.group]).nunique())))
    return pd.DataFrame(rows)


def heldout_text(R: Result, P: Params) -> str:
    """The value gap on held-out states (a second batch, new prompts, split by the step on the first)
    per rollout sign and sign-balanced, as the claim row reads it."""
    if R.heldout is None:
        return "held-out states: skipped (heldout_per_cell: 0)"
    return (f"held-out states ({len(R.heldout)} tokens of a second batch, split by the step on the first), value gap: "
            + ", ".join(f"{r['sign']} {r['gap']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
                        for r in heldout_gaps(R, P)))


def heldout_gaps(R: Result, P: Params) -> list[dict]:
    """value.sign_gaps of the held-out pool, its query groups (of the second batch) resampled."""
    return value.sign_gaps(R.heldout, P.n_boot, seeds.derive(P.seed, "heldout_gaps"), clusters=R.heldout.group)


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows, cr = W.Work(), P.n_prompts * P.G, P.chunk_rows
    W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
    steps = len(P.sgd_lrs) + len(P.adam_lrs)          # repeated steps: K steps per optimizer and lr
    W.step(w, "full", rows, z, cr, times=steps * P.repeat_steps + 1)
    W.analysis(w, rows, z, cr, times=steps * P.repeat_steps + 3)
    w.full_grads, w.adam = True, bool(P.adam_lrs)
    # Monte Carlo values: per valued token and branch M continuations of up to max_new_tokens;
    # 4 cells x n_per_cell tokens, n_pool11 per sign again, 2 branches, each estimator
    valued = (4 * P.n_per_cell + 2 * P.n_pool11) * len(P.estimators)
    # the value gap's null (null_steps): the matrix path takes per-rollout gradients (one backward per rollout:
    # one step's worth), holds rollouts x parameters float64 and runs a forward per order; the exact path a step
    # and a forward per order
    k1 = P.null_shuffles + 1
    if rows * shape.params * 8 <= NULL_MATRIX_BYTES:
        W.step(w, "full", rows, z, cr)
        W.analysis(w, rows, z, cr, times=k1 + 1)
        w.extra_bytes += rows * shape.params * 8
        w.extra_why.append("the value-gap null's per-rollout gradients (rollouts x parameters, float64)")
    else:
        W.step(w, "full", rows, z, cr, times=k1)
        W.analysis(w, rows, z, cr, times=k1 + 1)
    h = P.heldout_per_cell
    if h:  # held-out states: a second batch, its forward before and after one step, 4 cells valued
        W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
        W.analysis(w, rows, z, cr, times=3)
        W.step(w, "full", rows, z, cr)
        valued += 4 * h
    cont = valued * 2 * P.M
    # --procs divides sampler batches (procs.py), not tokens: rows_per_chunk // M prefixes (token x branch)
    # per batch, at least; fewer, larger units are the conservative count (ceil(units / N) each)
    with w.split("valued tokens' Monte Carlo continuations", W.ceil(2 * valued, max(1, P.rows_per_chunk // P.M))):
        W.sample(w, cont, z, chunk_rows_decode=P.rows_per_chunk)
    w.notes.append("continuations counted at the full response cap (they start mid-response: an upper bound)")
    if P.sample_dtype and P.backend == "hf":
        w.extra_bytes += shape.params * W.BYTES[P.sample_dtype]
        w.extra_why.append(f"the {P.sample_dtype} sampler copy")
    return w
