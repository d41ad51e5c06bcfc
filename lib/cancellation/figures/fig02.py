"""Fig. 2 (notebook 02): the coupling kernel K_jk = ⟨h_j,h_k⟩·φ_jk on one sampled batch.

`compute(P)` samples the batch, computes the blockwise features (never a per-token V×d
gradient nor an N×V probability matrix), then (a)(b) ⟨h,h⟩, cosine and φ for random same-token
and different-token pairs; (c) the mean coupling contribution A_k⟨h_j,h_k⟩φ_jk over every pair,
by entropy bins; and the first-order prediction δ_j = η/N Σ_k A_k K_jk against the measured
Δlog p of real SGD lm_head steps. Cached whole under every parameter and the model's and
problems' fingerprints. `claims(R, P)` gives the notebook's claim rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy import stats

from .. import cache, coupling, grpo, policy, rollout, seeds, stage
from .. import claims as C
from .. import workload as W
from .. import stats as S
from . import base, replot
from .base import param

TABLES = ("fig02_pairs", "fig02_heatmap", "fig02_first_order", "fig02_kernel_terms")


@dataclass
class Params(base.FigureParams):
    """Notebook 02's parameters."""
    CONSTRAINTS = ((lambda lr, lrs: lr in lrs,
                    "lr must be one of lrs: panel (d) and the summary read the first-order table's row at lr"),)
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    n_prompts: int = base.n_prompts(16, "prompts in the batch")
    G: int = base.G()
    temperature: float = base.temperature()
    max_new_tokens: int = base.max_new_tokens()
    n_pairs: int = param(20000, "sampled token pairs per split (same-token / different-token) for (a), (b)", min=1)
    n_entropy_bins: int = param(8, "entropy quantile bins of the heatmap (c)", min=1)
    lr: float = param(0.1, "SGD lr of the lm_head step whose Δlog p is predicted (paper's causal lr)", gt=0)
    lrs: list = param([0.01, 0.1, 1.0, 10.0], "learning rates of the first-order fidelity table",
                      gt=0, nonempty=True, distinct=True)
    chunk: int = param(1024, "tokens per kernel block", min=1)
    vocab_chunk: int = param(8192, "vocabulary entries per block (bounds memory for large vocabularies)", min=1)
    sample_rows: int = base.sample_rows()
    seed: int = base.seed()


@dataclass
class Result:
    """What Fig. 2 plots and its claims read."""
    batch: dict                  # the batch's numbers (base.batch_facts; `summary(R)` writes its line)
    pairs: pd.DataFrame          # one row per sampled pair: pair, j, k, hdot, hcos, phi, kernel, entropy_j, entropy_k
    pair_summary: pd.DataFrame   # per split: means, positive shares, |φ| quantities
    heat: pd.DataFrame           # per (bin_j, bin_k): mean and mean |A_k⟨h_j,h_k⟩φ_jk|
    absolute: np.ndarray         # (bins, bins) mean |contribution|, for the heatmap
    edges: list                  # entropy bin edges
    fidelity: pd.DataFrame       # per lr: Pearson, Spearman, sign agreement, R², median |Δ|
    scatter: pd.DataFrame        # at P.lr: predicted δ_j and measured Δlog p_j per token
    terms: pd.DataFrame          # per token: Σ_k A_k K_jk split into own / same-token / different-token pairs

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save)."""
        for name, df in zip(TABLES, (self.pairs, self.heat, self.fidelity, self.terms)):
            cache.write_table(df, Path(results_dir) / f"{name}.parquet")
        replot.save(results_dir, P, batch=self.batch, absolute=self.absolute, edges=self.edges, scatter=self.scatter)


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots)."""
    pairs, heat, fidelity, terms = (replot.table(results_dir, f"{name}.parquet") for name in TABLES)
    return Result(pairs=pairs, pair_summary=pair_summary(pairs), heat=heat, fidelity=fidelity, terms=terms,
                  **replot.restore(results_dir, P))


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    return base.cached(stage.FIG02, P, source, lambda: _compute(P, source))


def _compute(P: Params, source) -> Result:
    cc = P.compute()
    torch.manual_seed(P.seed)
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
    batch = rollout.sample(model, tok, base.sample_config(P, source), seed=seeds.derive(P.seed, "coupling_batch"))
    base.require_signal(batch, source, "02: the coupling batch")
    before = cc.stats(model, batch, hidden=True)
    f = coupling.features(model, batch, before, chunk=P.chunk, vocab_chunk=P.vocab_chunk)
    facts = base.batch_facts(batch, P.n_prompts, source, tokens=len(f), vocabulary=int(f.W.shape[0]),
                             hidden=int(f.h.shape[1]), signed_tokens=int((f.A != 0).sum()))
    pairs = _pairs(f, P)
    heat, absolute, edges = _heatmap(f, P)
    fidelity, scatter = _first_order(model, batch, before, f, P)
    t = coupling.pair_kind_terms(f, chunk=P.chunk, vocab_chunk=P.vocab_chunk)
    terms = pd.DataFrame({"row": f.rows.cpu().numpy(), "o": f.o.cpu().numpy(), "A": f.A.cpu().numpy(), "p": f.p.cpu().numpy(),
                          "entropy": f.entropy.cpu().numpy(), **{k: v.cpu().numpy() for k, v in t.items()},
                          "measured": scatter.measured.to_numpy()})
    return Result(batch=facts, pairs=pairs, pair_summary=pair_summary(pairs), heat=heat, absolute=absolute, edges=edges,
                  fidelity=fidelity, scatter=scatter, terms=terms)


def pair_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per split (same / different token): means, positive shares and |φ| quantities of the sampled pairs."""
    return pairs.groupby("pair").agg(
        hdot_mean=("hdot", "mean"), hcos_mean=("hcos", "mean"), hdot_positive=("hdot", lambda x: (x > 0).mean()),
        phi_mean=("phi", "mean"), phi_abs_median=("phi", lambda x: x.abs().median()),
        phi_above_1e_2=("phi", lambda x: (x.abs() > 1e-2).mean()), kernel_abs_mean=("kernel", lambda x: x.abs().mean()))


def _pairs(f: coupling.Features, P: Params) -> pd.DataFrame:
    """(a), (b): `different` uniformly among pairs with o_j ≠ o_k; `same` uniformly among pairs with
    o_j = o_k (a random j, then a random other occurrence of its token)."""
    rng = np.random.default_rng(P.seed)
    o = f.o.cpu().numpy()
    j = rng.integers(0, len(f), 4 * P.n_pairs)
    k = rng.integers(0, len(f), 4 * P.n_pairs)
    keep = o[j] != o[k]
    dj, dk = j[keep][:P.n_pairs], k[keep][:P.n_pairs]
    by_tok = pd.Series(np.arange(len(o))).groupby(o).apply(np.array)
    sj = rng.choice(np.nonzero(pd.Series(o).map(by_tok.map(len)).to_numpy() > 1)[0], P.n_pairs)
    sk = np.array([rng.choice(by_tok[o[x]][by_tok[o[x]] != x]) for x in sj])
    out = []
    for name, a, b in (("same", sj, sk), ("different", dj, dk)):
        t = coupling.pair_terms(f, torch.as_tensor(a), torch.as_tensor(b), vocab_chunk=P.vocab_chunk)
        out.append(pd.DataFrame({"pair": name, "j": a, "k": b, **{c: v.cpu().numpy() for c, v in t.items()},
                                 "entropy_j": f.entropy[a].cpu().numpy(), "entropy_k": f.entropy[b].cpu().numpy()}))
    return pd.concat(out, ignore_index=True)


def _heatmap(f: coupling.Features, P: Params):
    """(c): mean of A_k⟨h_j,h_k⟩φ_jk over every pair j ≠ k, per (entropy bin of j, of k), bins at quantiles."""
    n = P.n_entropy_bins
    edges = torch.quantile(f.entropy, torch.linspace(0, 1, n + 1, dtype=f.entropy.dtype, device=f.entropy.device))
    bins = torch.bucketize(f.entropy, edges[1:-1])
    signed, absolute = coupling.entropy_bin_means(f, bins, n, chunk=P.chunk, vocab_chunk=P.vocab_chunk)
    heat = pd.DataFrame([{"bin_j": a, "bin_k": b, "entropy_lo_j": float(edges[a]), "entropy_hi_j": float(edges[a + 1]),
                          "mean_contribution": float(signed[a, b]), "mean_abs_contribution": float(absolute[a, b])}
                         for a in range(n) for b in range(n)])
    return heat, absolute.cpu().numpy(), edges.tolist()


def _first_order(model, batch, before, f: coupling.Features, P: Params):
    """δ_j = η/N Σ_k A_k K_jk against the Δlog p of the real GRPO step (SGD, lm_head, ρ = 1) per lr."""
    cc = P.compute()
    delta1 = coupling.first_order_delta(f, 1.0, chunk=P.chunk, vocab_chunk=P.vocab_chunk).cpu()  # δ ∝ η
    rows, scatter = [], None
    for eta in P.lrs:
        d = grpo.trial_delta(model, batch, cc.update(optimizer="sgd", lr=eta, scope="lm_head"),
                             before.logp)[f.rows, f.cols]
        pred = eta * delta1
        if eta == P.lr:
            scatter = pd.DataFrame({"predicted": pred.numpy(), "measured": d.cpu().numpy()})
        rows.append({"lr": eta, "pearson": float(np.corrcoef(d, pred)[0, 1]), "spearman": stats.spearmanr(d, pred)[0],
                     "sign_agreement": float((torch.sign(d) == torch.sign(pred)).double().mean()),
                     "r2": float(1 - ((d - pred) ** 2).sum() / ((d - d.mean()) ** 2).sum()),
                     "median_abs_delta": float(d.abs().median())})
    if scatter is None:
        raise ValueError(f"lr = {P.lr} must be one of lrs = {P.lrs} (the scatter of panel (d) is at lr)")
    return pd.DataFrame(rows), scatter


PHI_NEGLIGIBLE = 1e-2  # |φ_jk| above this counts as non-negligible (pair_summary's phi_above_1e_2)


ROLLOUTS = dict(estimator="cluster bootstrap over rollouts (the tokens j of one rollout together)",
                resampling="rollout")


def coupling_shares(terms: pd.DataFrame) -> dict:
    """Per-token flags of the first-order decomposition δ_j ∝ own_j + same_j + different_j, over tokens
    with A_j ≠ 0 (own_j = A_j K_jj has A_j's sign): `flipped`, coupling sets the sign (sign δ_j ≠ sign A_j);
    `same_alone`, the same-token pairs alone already flip it (sign(own_j + same_j) ≠ sign A_j)."""
    t = terms[terms.A != 0]
    total = t.own + t.same + t.different
    return dict(t=t, flipped=(np.sign(total) != np.sign(t.A)).to_numpy(),
                same_alone=(np.sign(t.own + t.same) != np.sign(t.A)).to_numpy())


PAIRS = dict(estimator="two-way cluster bootstrap: rollouts drawn with replacement, then the sampled pairs; a pair "
             "counts w(rollout of j)·w(rollout of k)·m(pair) times, so pairs that share a rollout move together",
             resampling="rollout × pair")
CONF = 0.9  # low vs high confidence: p below / at or above this (as notebook 08's bins)


def pair_rollouts(R: Result) -> tuple[np.ndarray, np.ndarray]:
    """The rollout (batch row) of each sampled pair's j and k (the pairs index the token table `terms`)."""
    row = R.terms.row.to_numpy()
    return row[R.pairs.j.to_numpy()], row[R.pairs.k.to_numpy()]


def wmean(w, x, m) -> float:
    """Σ w·x / Σ w over the pairs where m holds (x, m arrays over the pairs)."""
    return float((w * x * m).sum() / (w * m).sum())


def negligible_share(pairs: pd.DataFrame, same_share: float):
    """stat(w) of "most φ are zero": the share of all ordered pairs j ≠ k with |φ| ≤ PHI_NEGLIGIBLE, the
    two sampled strata weighted by their shares of all pairs (same-token pairs: `same_share`)."""
    neg, same = (pairs.phi.abs() <= PHI_NEGLIGIBLE).to_numpy(float), (pairs.pair == "same").to_numpy(float)
    return lambda w: same_share * wmean(w, neg, same) + (1 - same_share) * wmean(w, neg, 1 - same)


def confidence_contrast(pairs: pd.DataFrame, p: np.ndarray):
    """stat(w) of the low- vs high-confidence contrast, over the same-token pairs: log10 of mean |K_jk|
    where both p < CONF over mean |K_jk| where both p ≥ CONF (p: per token, indexed by j and k)."""
    pj, pk = p[pairs.j.to_numpy()], p[pairs.k.to_numpy()]
    same = (pairs.pair == "same").to_numpy()
    lo, hi = (same & (pj < CONF) & (pk < CONF)).astype(float), (same & (pj >= CONF) & (pk >= CONF)).astype(float)
    k = pairs.kernel.abs().to_numpy()
    return (lambda w: np.log10(wmean(w, k, lo) / wmean(w, k, hi))), lo, hi


def claims(R: Result, P: Params) -> list[C.Claim]:
    same, diff = R.pairs[R.pairs.pair == "same"].hcos, R.pairs[R.pairs.pair == "different"].hcos
    top, bottom = float(R.absolute[-1, -1]), float(R.absolute[0, 0])
    row = R.fidelity.set_index("lr").loc[P.lr]
    rj, rk = pair_rollouts(R)
    is_same = (R.pairs.pair == "same").to_numpy(float)
    hcos, pos = R.pairs.hcos.to_numpy(), (R.pairs.hdot > 0).to_numpy(float)
    big = (R.pairs.phi.abs() > PHI_NEGLIGIBLE).to_numpy(float)
    b_same, b_diff = big[is_same == 1], big[is_same == 0]

    def boot(stat):
        return S.rollout_pair_bootstrap(stat, rj, rk, 1000, P.seed)

    a = boot(lambda w: wmean(w, hcos, is_same) - wmean(w, hcos, 1 - is_same))
    gp = boot(lambda w: wmean(w, pos, 1 - is_same))
    bp = boot(lambda w: wmean(w, big, is_same) - wmean(w, big, 1 - is_same))
    same_share = _same_pair_share(R.terms)
    nz = boot(negligible_share(R.pairs, same_share))
    cstat, clo, chi = confidence_contrast(R.pairs, R.terms.p.to_numpy())
    cc = boot(cstat)
    k_abs = R.pairs.kernel.abs().to_numpy()
    return [
        C.Claim("fig02_a_same_token", "Fig. 2(a)", "same-token pairs have more aligned hidden states", "yes",
                *a[:3], n=len(R.pairs), unit="cos, same − different", rule="direction", params=dict(sign=1),
                detail=f"mean cos {same.mean():.2f} (same) vs {diff.mean():.2f} (different); {a[3]} rollouts", **PAIRS),
        C.Claim("fig02_a_generally_positive", "Fig. 2(a)", "hidden-state similarities are generally positive "
                "(different-token pairs)", "generally positive", *gp[:3], n=len(diff),
                unit="share of different-token pairs with ⟨h_j, h_k⟩ > 0", rule="direction",
                params=dict(sign=1, ref=0.5),
                detail=f"mean cos {diff.mean():+.3f}; same-token pairs {100 * (same > 0).mean():.1f}% > 0; "
                f"'generally' read as a majority; {gp[3]} rollouts", **PAIRS),
        C.Claim("fig02_b_phi_same_token", "Fig. 2(b)", "non-negligible φ_jk sits on same-token pairs", "yes",
                *bp[:3], n=len(R.pairs), unit=f"share |φ| > {PHI_NEGLIGIBLE:g}, same − different", rule="direction",
                params=dict(sign=1),
                detail=f"{100 * b_same.mean():.1f}% of same-token vs {100 * b_diff.mean():.2f}% of different-token "
                f"pairs; median |φ| {R.pairs[R.pairs.pair == 'same'].phi.abs().median():.1e} vs "
                f"{R.pairs[R.pairs.pair == 'different'].phi.abs().median():.1e}", **PAIRS),
        C.Claim("fig02_b_phi_mostly_zero", "Fig. 2(b), §2", "most φ_jk are zero", "most of them",
                *nz[:3], n=len(R.pairs), unit=f"share of all pairs j ≠ k with |φ| ≤ {PHI_NEGLIGIBLE:g}",
                rule="direction", params=dict(sign=1, ref=0.5),
                detail=f"'zero' read as negligible (|φ| ≤ {PHI_NEGLIGIBLE:g}, Fig. 2(b)'s cut; exactly 0 in float64: "
                f"{int((R.pairs.phi == 0).sum())} of {len(R.pairs)} sampled pairs); the sampled same- and "
                f"different-token pairs weighted by their shares of all pairs ({100 * same_share:.2f}% same-token); "
                "'most' read as more than half", **PAIRS),
        C.Claim("fig02_low_vs_high_confidence", "§2 (Eq. 10)", "coupling is stronger between low-confidence than "
                "between high-confidence same-token pairs", "low-confidence pairs",
                *cc[:3], n=int(clo.sum() + chi.sum()),
                unit=f"log10(mean |K| both p < {CONF:g} / both p ≥ {CONF:g}), same-token pairs", rule="construction",
                params=dict(sign=1, why="Eq. 10 bounds φ ≤ 2(1−p_j)(1−p_k) for a same-token pair, so K vanishes as both "
                            "p → 1 whatever ⟨h_j, h_k⟩ does"),
                detail=f"mean |K| {k_abs[clo == 1].mean():.3g} over {int(clo.sum())} low- vs {k_abs[chi == 1].mean():.3g} "
                f"over {int(chi.sum())} high-confidence same-token pairs; Eq. 10 bounds the high side "
                f"(φ ≤ 2(1−p_j)(1−p_k) for a same-token pair), so the contrast is mostly ⟨h_j, h_k⟩ staying comparable",
                **PAIRS),
        C.Claim("fig02_c_entropy", "Fig. 2(c)", "coupling concentrates on high-entropy pairs", "yes",
                np.log10(top / bottom), n=P.n_entropy_bins ** 2, unit="log10(high×high / low×low)", rule="construction",
                params=dict(sign=1, point_ok=True, why="φ carries r_j r_k with r = 1 − p, which vanishes as p → 1 on "
                            "low-entropy tokens"),
                detail=f"mean |A⟨h,h⟩φ| {top:.2g} vs {bottom:.2g} (every pair of the batch)",
                estimator="point (every pair of the batch)", resampling="none"),
        *_decomposition_claims(R, P),
        C.Claim("fig02_first_order", "first order (not in paper)", "δ_j predicts Δlog p of an SGD lm_head step", "—",
                row.pearson, n=len(R.scatter), unit="Pearson", rule="construction",
                params=dict(sign=1, ref=0.9, point_ok=True, why="δ is Δlog p's first-order term, so at a small step "
                            "they agree by Taylor's theorem: an implementation check, not a claim of the paper"),
                detail=f"sign agreement {100 * row.sign_agreement:.1f}% at η = {P.lr:g}",
                estimator="point (every token)", resampling="none"),
    ]


def summary(R: Result) -> str:
    """One line on the batch (and the grader's, for a problem file)."""
    b = R.batch
    return base.with_grading(
        f"{b['rollouts']} rollouts, {b['tokens']} response tokens, vocabulary {b['vocabulary']}, hidden {b['hidden']}; "
        f"accuracy {b['accuracy']:.2f}, mixed groups {b['mixed_groups']}/{b['n_prompts']}, "
        f"tokens with A ≠ 0: {b['signed_tokens']}", b)


def decomposition_summary(R: Result) -> str:
    """The first-order decomposition of δ_j in two lines (the numbers of the three claim rows)."""
    t, sh = R.terms, coupling_shares(R.terms)
    share = float(t.abs_same.sum() / (t.abs_same + t.abs_different).sum())
    f, sa = sh["flipped"], sh["same_alone"]
    return (f"same-token pairs: {100 * _same_pair_share(t):.2f}% of the pairs, {100 * share:.1f}% of Σ|A_k K_jk|\n"
            f"coupling sets the first-order sign of {100 * f.mean():.1f}% of the {len(f)} A ≠ 0 tokens; same-token "
            f"pairs alone do it for {100 * sa[f].mean():.1f}% of those")


def _decomposition_claims(R: Result, P: Params) -> list[C.Claim]:
    """How much of the coupling sits on same-token pairs, and how often coupling, not the token's own
    term, sets the first-order sign (the paper's token flipping, §1–2)."""
    t = R.terms
    abs_all = t.abs_same + t.abs_different
    share = S.cluster_ratio(t.abs_same, abs_all, t.row, 1000, P.seed)
    sh = coupling_shares(t)
    tt, flipped = sh["t"], sh["flipped"]
    fl = S.cluster_ratio(flipped.astype(float), np.ones(len(tt)), tt.row, 1000, P.seed)
    fs = S.cluster_ratio(sh["same_alone"][flipped].astype(float), np.ones(int(flipped.sum())),
                         tt.row[flipped], 1000, P.seed)
    measured_opp = float((np.sign(tt.measured) == -np.sign(tt.A)).mean())
    return [
        C.Claim("fig02_same_token_share", "§2 (Eq. 10)", "non-negligible coupling sits primarily on same-token "
                "pairs", "primarily", *share[:3], n=len(t), unit="share of Σ_{j≠k} |A_k K_jk| on same-token pairs",
                rule="direction", params=dict(sign=1, ref=0.5),
                detail=f"{share[3]} rollouts; same-token pairs are {100 * _same_pair_share(t):.2f}% of the pairs; "
                f"'primarily' read as more than half the coupling mass", **ROLLOUTS),
        C.Claim("fig02_sign_set_by_coupling", "§1–2 (first order)", "coupling, not the token's own term, sets the "
                "first-order sign of nearly half the tokens", "nearly half", *fl[:3], n=len(tt),
                unit="share of A ≠ 0 tokens with sign δ_j ≠ sign A_j", rule="similar",
                params=dict(target=0.45, tol=0.05),
                detail=f"the measured SGD step (η = {P.lr:g}) moves {100 * measured_opp:.1f}% of them against A; "
                "'nearly half' read as 40–50% (as fig01_nearly_half_opposite)", **ROLLOUTS),
        C.Claim("fig02_flip_by_same_token", "§2 (Eq. 10)", "where coupling flips a token's sign, its same-token "
                "pairs alone flip it", "implied", *fs[:3], n=int(flipped.sum()),
                unit="share of flipped tokens with sign(own + same) ≠ sign A", rule="direction",
                params=dict(sign=1, ref=0.5),
                detail=f"{int(flipped.sum())} flipped tokens; the rest need different-token pairs; "
                "'primarily' read as more than half", **ROLLOUTS),
    ]


def _same_pair_share(t: pd.DataFrame) -> float:
    """Share of ordered pairs j ≠ k of the batch that are same-token pairs: Σ_id n_id (n_id − 1) / N (N − 1)."""
    n = t.o.value_counts().to_numpy().astype(float)
    return float((n * (n - 1)).sum() / (len(t) * (len(t) - 1)))


def reading(rows: list[C.Claim]) -> list[str]:
    """The reading's numbers, from the claim rows (nothing typed that goes stale on another profile)."""
    return [
        f"(a) different-token pairs with <h_j,h_k> > 0: {C.cite(rows, 'fig02_a_generally_positive', 100, '.1f')} % "
        "(pairs that share a rollout resampled together)",
        f"(b) pairs with negligible phi (all pairs, strata weighted): {C.cite(rows, 'fig02_b_phi_mostly_zero', 100, '.1f')} %; "
        f"non-negligible phi, same − different token: {C.cite(rows, 'fig02_b_phi_same_token', 100, '+.1f')} pts",
        f"low- vs high-confidence same-token pairs, log10 mean |K| ratio: "
        f"{C.cite(rows, 'fig02_low_vs_high_confidence', 1, '+.2f')}",
        f"same-token share of the coupling mass: {C.cite(rows, 'fig02_same_token_share', 100, '.1f')} %",
    ]


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows = W.Work(), P.n_prompts * P.G
    N = rows * z.new                                  # response tokens (upper bound: every row at the cap)
    W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
    W.features(w, P, shape, z, rows)
    W.kernel(w, 2 * P.n_pairs, shape, P.chunk, N)      # (a), (b): sampled pairs
    W.kernel(w, 2 * N * N, shape, P.chunk, N)          # (c) entropy bins and the first-order δ: every pair, twice
    for _ in P.lrs:                                   # a real SGD lm_head step and a forward per lr
        W.step(w, "lm_head", rows, z, P.chunk_rows)
        W.analysis(w, rows, z, P.chunk_rows)
    return w
