"""How often the thesis rows' interval covers a known effect: a simulation of notebook 04's design.

Batches of `groups` groups; per group and class (shared, specific) a token count and the sums of the
tokens' Δ_single-sign and Δ_GRPO − Δ_single-sign (the cancellation), built from a known mean per token,
a per-batch multiplier (the step's size varies by batch), a per-batch and a per-group random effect and
token noise. Every random part has mean 0 (the multiplier mean 1) and is independent of the counts, so
the true value of each ratio-of-sums statistic is a ratio of the known means (`truth`). The interval is
the one `thesis.summary` reports: `thesis.cluster_weights` (batches, then groups within each drawn batch)
and `thesis.cluster_bootstrap` with the statistic functions of `thesis.CLASS_STATS`.

`python -m cancellation.coverage` prints the table of docs/methods.md ("How many batches the thesis
rows need")."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from . import thesis

STATS = ("shared_cancellation", "shared_retained", "specific_amplification", "contrast")


@dataclass(frozen=True)
class Design:
    groups: int = 8                  # groups per batch (the mixed-sign groups: those with shared tokens)
    tokens: tuple = (200.0, 100.0)   # mean tokens per group, shared / specific class (negative binomial, cv `count_cv`)
    count_cv: float = 0.5
    single: tuple = (1.0, 1.0)       # true mean Δ_single-sign per token, shared / specific
    cancel: tuple = (-0.4, 0.5)      # true mean Δ_GRPO − Δ_single-sign per token, shared / specific
    token_sd: float = 4.0            # per-token noise (its sum over n tokens: √n · sd · z)
    group_sd: float = 0.5            # per-group effect, per class and value
    batch_sd: float = 0.0            # per-batch effect, per class and value
    batch_scale: float = 0.0         # sd of log of the per-batch multiplier of every Δ (its mean is 1)
    df: float = 0.0                  # > 2: batch and group effects Student-t with df (unit variance), 0: normal


def truth(d: Design) -> dict:
    """The true value of every statistic of `STATS` (the ratios of the per-token means)."""
    (s0, s1), (c0, c1) = d.single, d.cancel
    return {"shared_cancellation": c0, "shared_retained": (s0 + c0) / s0,
            "specific_amplification": (s1 + c1) / s1, "contrast": c0 - c1}


def _effect(rng, d: Design, shape) -> np.ndarray:
    if d.df > 2:
        return rng.standard_t(d.df, shape) * np.sqrt((d.df - 2) / d.df)
    return rng.standard_normal(shape)


def simulate(d: Design, n_batches: int, rng: np.random.Generator) -> tuple[dict, np.ndarray]:
    """(arrays, batch_of): `thesis.arrays`' shape (clusters, 1 stratum, 2 classes) of N, single,
    cancellation and grpo, and each cluster's batch."""
    C = n_batches * d.groups
    batch_of = np.repeat(np.arange(n_batches), d.groups)
    mean_n = np.asarray(d.tokens, float)
    k = 1.0 / d.count_cv ** 2                       # gamma shape: Poisson-gamma counts with cv ≈ count_cv
    N = rng.poisson(rng.gamma(k, mean_n / k, (C, 2))).astype(float)
    scale = np.exp(d.batch_scale * rng.standard_normal(n_batches) - d.batch_scale ** 2 / 2)[batch_of]
    sums = {}
    for name, mu in (("single", d.single), ("cancellation", d.cancel)):
        per_token = (np.asarray(mu, float) + d.batch_sd * _effect(rng, d, (n_batches, 2))[batch_of]
                     + d.group_sd * _effect(rng, d, (C, 2)))
        noise = d.token_sd * np.sqrt(N) * rng.standard_normal((C, 2))
        sums[name] = (scale[:, None] * (N * per_token + noise))[:, None, :]
    arrs = {"N": N[:, None, :], **sums, "grpo": sums["single"] + sums["cancellation"]}
    return arrs, batch_of


def coverage(d: Design, n_batches: int, reps: int = 200, n_boot: int = 1000, seed: int = 0,
             w_seeds: int = 20, stats=STATS, level: float = 0.95) -> pd.DataFrame:
    """Per statistic: the share of `reps` simulated data sets whose interval covers the truth (an
    undefined interval counts as a miss), the undefined share and the median width relative to the
    truth's size. The bootstrap multiplicities cycle over `w_seeds` seeds of `thesis.cluster_weights`
    (drawing them is the slow part; the data differ in every replicate)."""
    t = truth(d)
    Ws = {}
    hit = {s: [] for s in stats}
    width = {s: [] for s in stats}
    for r in range(reps):
        arrs, batch_of = simulate(d, n_batches, np.random.default_rng([seed, n_batches, r]))
        ws = r % w_seeds
        if ws not in Ws:
            Ws[ws] = thesis.cluster_weights(batch_of, n_boot, seed + ws)
        for s in stats:
            _, lo, hi = thesis.cluster_bootstrap(arrs, thesis.CLASS_STATS[s], Ws[ws], level)
            hit[s].append(lo <= t[s] <= hi if np.isfinite(lo) and np.isfinite(hi) else np.nan)
            width[s].append((hi - lo) / abs(t[s]))
    rows = []
    for s in stats:
        h = np.asarray(hit[s], float)
        rows.append(dict(statistic=s, n_batches=n_batches, coverage=float(np.nansum(h) / len(h)),
                         undefined=float(np.isnan(h).mean()), rel_width=float(np.nanmedian(width[s])), reps=reps))
    return pd.DataFrame(rows)


# the scenarios of docs/methods.md: the tiny run's heterogeneity (the batch means vary no more than
# their groups make them: no batch effect) and a batch effect that dominates a batch's mean
SCENARIOS = {
    "low (tiny-like)": Design(),
    "high": Design(batch_sd=0.4, batch_scale=0.5),
    "high, heavy tails": Design(batch_sd=0.4, batch_scale=0.5, df=3.0),
}


def batch_share(d: Design) -> float:
    """The share of a batch mean's variance (shared class, cancellation) that the batch effect makes
    (the multiplier left out): batch_sd² / (batch_sd² + (group_sd² + token_sd²/n) / groups)."""
    within = (d.group_sd ** 2 + d.token_sd ** 2 / d.tokens[0]) / d.groups
    return d.batch_sd ** 2 / (d.batch_sd ** 2 + within) if d.batch_sd else 0.0


def table(ns=(5, 8, 10, 12, 16, 40), groups=(8, 16), reps: int = 200, n_boot: int = 1000, seed: int = 0,
          scenarios=None, stats=STATS, w_seeds: int = 20) -> pd.DataFrame:
    out = []
    for name, d in (scenarios or SCENARIOS).items():
        for g in groups:
            dg = replace(d, groups=g)
            for n in ns:
                c = coverage(dg, n, reps, n_boot, seed, w_seeds, stats)
                out.append(c.assign(scenario=name, groups=g, batch_share=round(batch_share(dg), 2)))
    return pd.concat(out, ignore_index=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--ns", type=int, nargs="+", default=[5, 8, 10, 12, 16, 40])
    ap.add_argument("--groups", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t = table(tuple(a.ns), tuple(a.groups), a.reps, a.n_boot, a.seed)
    wide = t.pivot_table(index=["scenario", "batch_share", "groups", "statistic"], columns="n_batches",
                         values="coverage", sort=False)
    print(wide.round(3).to_string())
    return t


if __name__ == "__main__":
    main()
