"""Notebook 03's claim rows and Reading, read off a `fig03.Result` (the computation and tables live in
`fig03.py`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import claims as C
from .. import stats as S
from .fig03 import Params, Result


# the candidate and mask pools (Params.pools) in plain words, for the rows' labels
POOL_WORDS = {"nonzero": "masks among A ≠ 0 tokens", "positive": "masks among A > 0 rollouts"}

BUILT_IN = ("positive pool: every mask token has A_k > 0 and same-token kernels K_ck > 0, so a mask holding the "
            "candidate's own token must boost it")
BOOT = dict(estimator="percentile bootstrap over candidates", resampling="candidate")


# (a, b, sign, paper's a − b from its Table 1 (LM-head), statement)
TABLE1_PAIRS = (("both", "same", 1, 0.0792, "relaxing low confidence weakens the boost (both − same-token only)"),
                ("both", "lowconf", 1, 0.2992, "relaxing same token weakens the boost (both − low-confidence only)"),
                ("lowconf", "random", -1, -0.064, "low confidence alone boosts no more than random (paper: 44.2 vs 50.6)"),
                ("same", "random", 1, 0.156, "same token alone boosts more than random (paper: 66.2 vs 50.6)"))


def standardized_mean(a, axis=0):
    """mean(δ) / mean(|δ|): Mean Boost on the scale of the masking effects themselves."""
    return np.mean(a, axis=axis) / np.mean(np.abs(a), axis=axis)


def signed_boost(effects: pd.DataFrame, pool: str, kind: str, scope: str) -> pd.Series:
    """Sign-aware Boost Rate's indicator per candidate: 1[sign δ = sign Σ_{k∈M} A_k]. Masking M removes
    η/N Σ_{k∈M} A_k K_ck from the candidate's change, so with positive kernels δ takes the sign of M's
    advantage sum; candidates whose mask sums to zero (no predicted sign) are left out."""
    e = effects[(effects.pool == pool) & (effects.kind == kind) & (effects.scope == scope)]
    e = e[e.mask_adv_sum.abs() > 1e-12]
    return pd.Series((np.sign(e.delta.to_numpy()) == np.sign(e.mask_adv_sum.to_numpy())).astype(float),
                     index=e.cand.to_numpy())


FIRST_ORDER = ("lm_head scope: one SGD step on the LM head moves the candidate by η/N Σ_{k∈M} A_k K_ck to first "
               "order, the proxy cosine's numerator, so δ takes the cosine's sign")


SIGNED_BUILT_IN = ("lm_head scope: δ = η/N Σ_{k∈M} A_k K_ck to first order, and a same-token kernel is "
                   "⟨h_c, h_k⟩·φ with φ ≥ (1−p_c)(1−p_k) > 0 (Eq. 10), positive wherever ⟨h_c, h_k⟩ > 0 (Fig. 2(a): "
                   "99.9% of same-token pairs), so a both mask's δ follows its advantages' sign whenever they share "
                   "one; random masks mix kernel signs")
MONOTONE_BUILT_IN = ("positive pool, lm_head: every top-coupled mask token has A_k > 0 and K_ck > 0, so masking "
                     "more of them adds positive terms η/N A_k K_ck to δ")


def proxy_agreement(effects: pd.DataFrame, pool: str, kind: str, scope: str) -> tuple[int, int]:
    """(masks whose δ in `scope` has the sign of the lm_head δ of the same candidate and mask, masks)."""
    e = effects[(effects.pool == pool) & (effects.kind == kind)]
    m = e[e.scope == scope][["cand", "delta"]].merge(e[e.scope == "lm_head"][["cand", "delta"]], on="cand",
                                                      suffixes=("", "_lm"))
    return int((np.sign(m.delta) == np.sign(m.delta_lm)).sum()), len(m)


def cos_bins(effects: pd.DataFrame, pool: str, n_bins: int) -> pd.DataFrame:
    """Fig. 3(b)'s bins: the pool's effects with `bin`, the quantile bin of the proxy cosine (edges from
    the lm_head scope, as `_boost_vs_cos`), and `boost` = 1[δ > 0]."""
    e = effects[effects.pool == pool]
    edges = np.quantile(e[e.scope == "lm_head"].proxy_cos, np.linspace(0, 1, n_bins + 1))
    return e.assign(bin=np.clip(np.digitize(e.proxy_cos, edges[1:-1]), 0, n_bins - 1),
                    boost=(e.delta > 0).astype(float))


def paired_median_shift(effects: pd.DataFrame, pool: str, scope: str, a: str = "both", b: str = "random"):
    """Fig. 3(a)'s right shift as per-candidate pairs: an (n, 2) array of (δ_a, δ_b) on the same candidates
    (its statistic: median δ_a − median δ_b)."""
    e = effects[(effects.pool == pool) & (effects.scope == scope)]
    m = e[e.kind == a][["cand", "delta"]].merge(e[e.kind == b][["cand", "delta"]], on="cand", suffixes=("_a", "_b"))
    return m[["delta_a", "delta_b"]].to_numpy()


def median_shift(x, axis=0):
    """median of column 0 − median of column 1 along `axis` (bootstrap_stats' statistic)."""
    return np.median(x[..., 0], axis=axis) - np.median(x[..., 1], axis=axis)


def topk_pairs(topk_effects: pd.DataFrame, pool: str, scope: str) -> tuple[int, int, pd.DataFrame]:
    """(smallest k, largest k, per candidate δ at both) for Fig. 3(c)'s paired comparison."""
    t = topk_effects[(topk_effects.pool == pool) & (topk_effects.scope == scope)]
    if t.k.nunique() < 2:  # no sizes in this scope (topk_full_sizes empty) or a single one: nothing to compare
        return 0, 0, t.iloc[:0][["cand", "delta"]]
    k0, k1 = int(t.k.min()), int(t.k.max())
    m = t[t.k == k0][["cand", "delta"]].merge(t[t.k == k1][["cand", "delta"]], on="cand", suffixes=("_lo", "_hi"))
    return k0, k1, m


def boost_vs_cos_ends(effects: pd.DataFrame, pool: str, n_bins: int):
    """Per scope: (scope, its effects, 1[δ > 0] in the lowest and in the highest of `n_bins` quantile bins
    of the proxy cosine, the edges taken from the lm_head scope as in Fig. 3(b))."""
    e = effects[effects.pool == pool]
    edges = np.quantile(e[e.scope == "lm_head"].proxy_cos, np.linspace(0, 1, n_bins + 1))
    out = []
    for scope in ("lm_head", "full"):
        s = e[e.scope == scope]
        b = np.clip(np.digitize(s.proxy_cos, edges[1:-1]), 0, n_bins - 1)
        x = (s.delta > 0).astype(float).to_numpy()
        out.append((scope, s, x[b == 0], x[b == n_bins - 1]))
    return out


def paired_boost(effects: pd.DataFrame, pool: str, scope: str, a: str, b: str) -> pd.Series:
    """Per candidate: 1[δ_a > 0] − 1[δ_b > 0] for the masks of kinds a and b of the same candidate."""
    e = effects[(effects.pool == pool) & (effects.scope == scope)]
    x = e[e.kind == a].set_index("cand").delta.gt(0).astype(float)
    y = e[e.kind == b].set_index("cand").delta.gt(0).astype(float)
    return (x - y).dropna()


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Table 1 per pool and scope (Boost Rates with Clopper–Pearson intervals; both − random with a
    bootstrap interval over candidates; the positive pool's rows hold by construction), the paired
    comparisons of Table 1's conditions on the same candidates, random ≈ 50% and Mean Boost ≈ 0,
    Fig. 3(c) on the nonzero pool, Fig. 10, App. D.3."""
    effects, topk, consistency, adam = R.effects, R.topk, R.consistency, R.adam

    def sel(p, k, s):
        return effects[(effects.pool == p) & (effects.kind == k) & (effects.scope == s)].delta

    def br(p, k, s):
        e = sel(p, k, s)
        r, lo, hi, n = S.proportion(e > 0)
        return f"{100 * r:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] (n={n})", (e > 0).astype(float)

    rows = []
    for p in P.pools:
        for s_ in ("lm_head", "full"):
            (tb, xb), (tr, xr) = br(p, "both", s_), br(p, "random", s_)
            rule = (dict(rule="construction", params=dict(sign=1, why=BUILT_IN)) if p == "positive"
                    else dict(rule="direction", params=dict(sign=1, paper=0.24)))
            rows.append(C.Claim(f"table1_{p}_{s_}", f"Table 1 ({POOL_WORDS[p]}, {s_})",
                                "Boost Rate same+low-conf. above random", "74–75 / 51 (+0.24)",
                                *S.bootstrap_gap(xb, xr, P.n_boot, P.seed), n=len(xb) + len(xr),
                                unit="Boost Rate, both − random", detail=f"both {tb}, random {tr}", **rule, **BOOT))
    for p in P.pools:  # the conditions one at a time, paired on the same candidates (paper: Table 1's rows)
        for s_ in ("lm_head", "full"):
            for a, b, sign, paper, stmt in TABLE1_PAIRS:
                if p == "positive" and (a, b) == ("both", "same"):
                    continue  # both sides hold the candidate's own token: 100% each by construction, no test
                d = paired_boost(effects, p, s_, a, b)
                rule = (dict(rule="construction", params=dict(sign=sign, why=BUILT_IN))
                        if p == "positive" and a in ("both", "same")
                        else dict(rule="direction", params=dict(sign=sign, paper=paper)))
                rows.append(C.Claim(f"table1_{p}_{s_}_{a}_vs_{b}", f"Table 1 ({POOL_WORDS[p]}, {s_})", stmt,
                                    f"{paper:+.3f}", *S.bootstrap_mean(d.to_numpy(), P.n_boot, P.seed), n=len(d),
                                    unit=f"Boost Rate, {a} − {b} (paired)", **rule,
                                    detail=f"{a} {br(p, a, s_)[0]}, {b} {br(p, b, s_)[0]}", **BOOT))
        if p != "nonzero":
            continue
        for s_ in ("lm_head", "full"):
            e = sel(p, "random", s_)
            r, lo, hi, n = S.proportion(e > 0)
            rows.append(C.Claim(f"table1_{p}_{s_}_random_rate", f"Table 1 ({POOL_WORDS[p]}, {s_})",
                                "random masks: Boost Rate ≈ 50%", "50.6 / 50.2", r, lo, hi, n=n,
                                unit="Boost Rate (random)", rule="similar", params=dict(target=0.5, tol=0.1),
                                detail="tolerance ±10 points", estimator="Clopper–Pearson", resampling="candidate"))
            m, lo, hi = S.bootstrap_stats(e.to_numpy(), {"r": standardized_mean}, P.n_boot, P.seed)["r"]
            rows.append(C.Claim(f"table1_{p}_{s_}_random_mean", f"Table 1 ({POOL_WORDS[p]}, {s_})",
                                "random masks: Mean Boost ≈ 0", "-.0039 / +.0048 (both: +.030)", m, lo, hi, n=len(e),
                                unit="Mean Boost / mean |δ| (random)", rule="similar", params=dict(target=0, tol=0.1),
                                detail=f"scale-free (δ's scale depends on model and lr): ≈ 0 read as |mean| within a "
                                f"tenth of the mean |δ|; Mean Boost {e.mean():+.2e}, both {sel(p, 'both', s_).mean():+.2e}",
                                **BOOT))
    if "nonzero" in P.pools:  # a mixed-sign mask: does δ follow the sign of the mask's advantage sum?
        for s_ in ("lm_head", "full"):
            xb, xr = signed_boost(effects, "nonzero", "both", s_), signed_boost(effects, "nonzero", "random", s_)
            ties = int((sel("nonzero", "both", s_).size - len(xb)) + (sel("nonzero", "random", s_).size - len(xr)))
            rule = (dict(rule="construction", params=dict(sign=1, why=SIGNED_BUILT_IN)) if s_ == "lm_head"
                    else dict(rule="direction", params=dict(sign=1, paper=0.24)))
            agree = proxy_agreement(effects, "nonzero", "both", s_)
            rows.append(C.Claim(f"table1_nonzero_{s_}_signed", f"Table 1 ({POOL_WORDS['nonzero']}, {s_})",
                                "sign-aware Boost Rate of same+low-conf. masks above random's", "74–75 / 51 (+0.24)",
                                *S.bootstrap_gap(xb, xr, P.n_boot, P.seed), n=len(xb) + len(xr),
                                unit="P[sign δ = sign Σ_{k∈M} A_k], both − random", **rule,
                                detail=f"both {100 * xb.mean():.0f}% (n={len(xb)}), random {100 * xr.mean():.0f}% "
                                f"(n={len(xr)}); {ties} masks with Σ A_k = 0 left out; the paper's Boost Rate "
                                "1[δ > 0] read with the direction the mask's advantages predict; δ has the sign of the "
                                f"lm_head proxy (its first-order δ) on {agree[0]} of {agree[1]} both masks", **BOOT))
        for s_, e, lo_, hi_ in boost_vs_cos_ends(effects, "nonzero", P.n_cos_bins):  # Fig. 3(b), its two end bins
            rule = (dict(rule="construction", params=dict(sign=1, why=FIRST_ORDER)) if s_ == "lm_head"
                    else dict(rule="direction", params=dict(sign=1)))
            rows.append(C.Claim(f"fig03b_nonzero_{s_}", f"Fig. 3(b) ({POOL_WORDS['nonzero']}, {s_})", "Boost Rate rises with "
                                "coupling strength (proxy cosine)", "rises monotonically",
                                *S.bootstrap_gap(hi_, lo_, P.n_boot, P.seed), n=len(hi_) + len(lo_),
                                unit="Boost Rate, top − bottom proxy-cosine bin", **rule, **BOOT,
                                detail=f"{P.n_cos_bins} quantile bins of the lm_head cosine; top {100 * hi_.mean():.0f}% "
                                f"[{100 * S.proportion(hi_ > 0)[1]:.0f}, {100 * S.proportion(hi_ > 0)[2]:.0f}] "
                                f"(n={len(hi_)}), bottom {100 * lo_.mean():.0f}% [{100 * S.proportion(lo_ > 0)[1]:.0f}, "
                                f"{100 * S.proportion(lo_ > 0)[2]:.0f}] (n={len(lo_)}, Clopper–Pearson: a bootstrap of "
                                "all-or-none bins has zero width); δ and the cosine "
                                f"share a sign for {100 * ((e.delta > 0) == (e.proxy_cos > 0)).mean():.0f}% of masks"))
        # Table 1 reports both scopes alike: do their masked updates agree in sign?
        e = effects[effects.pool == "nonzero"]
        pairs = e[e.scope == "full"].merge(e[e.scope == "lm_head"][["kind", "cand", "delta"]], on=["kind", "cand"],
                                           suffixes=("_full", "_lm"))
        if len(pairs):
            pairs = pairs.assign(agree=(np.sign(pairs.delta_full) == np.sign(pairs.delta_lm)).astype(float))
            per_cand = pairs.groupby("cand").agree.mean()   # the kinds of one candidate share its batch: one unit
            rows.append(C.Claim("table1_nonzero_scope_agreement", f"Table 1 ({POOL_WORDS['nonzero']})",
                                "lm_head and full-parameter masked updates agree in sign", "both scopes alike",
                                *S.bootstrap_mean(per_cand.to_numpy(), P.n_boot, P.seed), n=len(per_cand),
                                unit="same-sign share of δ (per candidate, over its mask kinds)", rule="direction",
                                params=dict(sign=1, ref=0.5),
                                detail=f"{len(pairs)} (candidate, mask kind) pairs measured in both scopes; Pearson r of "
                                f"δ {np.corrcoef(pairs.delta_full, pairs.delta_lm)[0, 1]:+.2f}", **BOOT))
        tk = topk[(topk.pool == "nonzero") & (topk.scope == "lm_head")].sort_values("k").iloc[-1]
        rows.append(C.Claim("fig03c_nonzero", f"Fig. 3(c) ({POOL_WORDS['nonzero']}, lm_head)", "masking top-coupled tokens boosts",
                            "rises", tk.mean_boost, tk.mean_boost_lo, tk.mean_boost_hi, n=tk.n,
                            unit=f"Mean Boost at k={tk.k}", rule="direction", params=dict(sign=1),
                            detail=f"Boost Rate {100 * tk.boost_rate:.0f}% [{100 * tk.boost_rate_lo:.0f}, "
                                   f"{100 * tk.boost_rate_hi:.0f}]", **BOOT))
    rows += _missing_claims(R, P)
    rows.append(C.Claim("fig10_sign_agreement", "Fig. 10", "lm_head and full steps agree in sign", "≈ 0.7",
                        *S.t_interval(consistency.sign_consistency), n=len(consistency),
                        unit="same-sign share (steps)", rule="similar", params=dict(target=0.7, tol=0.1),
                        detail=f"range {consistency.sign_consistency.min():.2f}–{consistency.sign_consistency.max():.2f}",
                        estimator="t over steps", resampling="step"))
    rows.append(C.Claim("appD3_sign_descent", "App. D.3", "Adam's first step is sign descent", "yes",
                        adam.median_ratio[0], n=adam.n_elements[0], unit="median ratio to lr·sign(g)",
                        rule="construction", params=dict(sign=1, ref=0.99, point_ok=True, why=(
                            "at step 1 Adam's bias-corrected m̂ = g and v̂ = g², so the update is lr·g/(|g| + ε) = "
                            "lr·sign(g) up to ε: the ratio is 1 except where |g| is near ε")),
                        detail=f"{100 * adam['share_above_0.99'][0]:.1f}% of elements within 1%",
                        estimator="point (median over parameter elements)", resampling="none"))
    return rows


FIG10_DRIFT_TOL = 0.1  # "stable": the fitted change of the same-sign share over the whole run within ± this


def _missing_claims(R: Result, P: Params) -> list[C.Claim]:
    """Table 1's Mean Boost of both masks, Fig. 3(a)'s right shift, Fig. 3(b)'s trend over every bin,
    Fig. 3(c)'s change from the smallest to the largest k (no Boost Rate row where it is 100% at the
    smallest k: it cannot rise), Fig. 10's stability along the run."""
    effects, rows = R.effects, []
    t1 = R.table1.set_index(["pool", "kind", "scope"])
    for p in P.pools:
        for s_ in ("lm_head", "full"):
            r = t1.loc[(p, "both", s_)]
            rule = (dict(rule="construction", params=dict(sign=1, why=BUILT_IN)) if p == "positive"
                    else dict(rule="direction", params=dict(sign=1)))  # no paper value: δ's scale is the model's
            rows.append(C.Claim(f"table1_{p}_{s_}_both_mean", f"Table 1 ({POOL_WORDS[p]}, {s_})",
                                "same+low-conf. masks: clearly positive Mean Boost", "+.0301 / +.0306",
                                r.mean_boost, r.mean_boost_lo, r.mean_boost_hi, n=int(r.n),
                                unit="Mean Boost (both)", **rule, **BOOT,
                                detail=f"random {t1.loc[(p, 'random', s_), 'mean_boost']:+.2e}; δ's scale depends on "
                                "model and lr, so only the sign is compared"))
    for p in P.pools:  # Fig. 3(a): the lm_head δ of both masks against random masks of the same candidates
        x = paired_median_shift(effects, p, "lm_head")
        m, lo, hi = S.bootstrap_stats(x, {"d": median_shift}, P.n_boot, P.seed)["d"]
        rule = (dict(rule="construction", params=dict(sign=1, why=BUILT_IN)) if p == "positive"
                else dict(rule="direction", params=dict(sign=1)))
        rows.append(C.Claim(f"fig03a_{p}_right_shift", f"Fig. 3(a) ({POOL_WORDS[p]}, lm_head)", "coupled (same+low-conf.) "
                            "masks give a right-shifted masking-effect distribution against random", "right-shifted",
                            m, lo, hi, n=len(x), unit="median δ, both − random (paired)", **rule, **BOOT,
                            detail=f"median δ both {np.median(x[:, 0]):+.2e}, random {np.median(x[:, 1]):+.2e}; "
                            f"share δ_both > δ_random {100 * (x[:, 0] > x[:, 1]).mean():.0f}%"))
    if "nonzero" in P.pools:  # Fig. 3(b): the Boost Rate's trend over every proxy-cosine bin
        b = cos_bins(effects, "nonzero", P.n_cos_bins)
        for s_ in ("lm_head", "full"):
            e = b[b.scope == s_].reset_index(drop=True)
            x, y = e.bin.to_numpy(float), e.boost.to_numpy()
            m, lo, hi, nc = S.cluster_bootstrap(lambda i: S.ols_slope(x[i], y[i]), pd.factorize(e.cand)[0],
                                                 n_boot=P.n_boot, seed=P.seed, rows=True)  # candidates as met
            per_bin = e.groupby("bin").boost.mean()
            drops = int((np.diff(per_bin.to_numpy()) < 0).sum())
            rule = (dict(rule="construction", params=dict(sign=1, why=FIRST_ORDER)) if s_ == "lm_head"
                    else dict(rule="direction", params=dict(sign=1)))
            rows.append(C.Claim(f"fig03b_nonzero_{s_}_trend", f"Fig. 3(b) ({POOL_WORDS['nonzero']}, {s_})", "Boost Rate increases "
                                "monotonically with coupling strength (proxy cosine), over every bin", "monotone",
                                m, lo, hi, n=len(e), unit="OLS slope of 1[δ > 0] on the proxy-cosine bin (0 … "
                                f"{P.n_cos_bins - 1})", **rule, estimator="cluster bootstrap over candidates (a "
                                "candidate's masks of every kind together)", resampling="candidate",
                                detail="Boost Rate per bin " + " ".join(f"{100 * v:.0f}%" for v in per_bin)
                                + f"; {drops} of {len(per_bin) - 1} steps between adjacent bins fall; 'monotone' read "
                                f"as a positive slope; {nc} candidates"))
    for p in P.pools:  # Fig. 3(c): masking more top-coupled tokens, the same candidates at the smallest and largest k
        for s_ in ("lm_head", "full"):
            k0, k1, m = topk_pairs(R.topk_effects, p, s_)
            if not len(m):
                continue
            built = p == "positive" and s_ == "lm_head"
            rule = (dict(rule="construction", params=dict(sign=1, why=MONOTONE_BUILT_IN)) if built
                    else dict(rule="direction", params=dict(sign=1)))
            dm = (m.delta_hi - m.delta_lo).to_numpy()
            db = ((m.delta_hi > 0).astype(float) - (m.delta_lo > 0).astype(float)).to_numpy()
            for what, d, unit, tail in (
                    ("mean", dm, f"Mean Boost, k={k1} − k={k0} (paired)",
                     f"Mean Boost {m.delta_lo.mean():+.2e} at k={k0} → {m.delta_hi.mean():+.2e} at k={k1}"),
                    ("rate", db, f"Boost Rate, k={k1} − k={k0} (paired)",
                     f"Boost Rate {100 * (m.delta_lo > 0).mean():.0f}% at k={k0} → {100 * (m.delta_hi > 0).mean():.0f}% "
                     f"at k={k1}")):
                if what == "rate" and (m.delta_lo > 0).all():
                    continue  # the Boost Rate is 100% at the smallest k already: a rise cannot show, no row
                rows.append(C.Claim(f"fig03c_{p}_{s_}_{what}_rises", f"Fig. 3(c) ({POOL_WORDS[p]}, {s_})",
                                    f"masking more top-coupled tokens increases {'Mean Boost' if what == 'mean' else 'Boost Rate'}",
                                    "increases", *S.bootstrap_mean(d, P.n_boot, P.seed), n=len(d), unit=unit, **rule,
                                    **BOOT, detail=tail + f" ({len(d)} candidates)"))
    c = R.consistency
    if len(c) >= 3:
        b, lo, hi, _ = S.ols_coef(c.sign_consistency, c.step)
        span = float(c.step.max() - c.step.min())
        rows.append(C.Claim("fig10_stable", "Fig. 10", "the same-sign share stays stable across training", "stable",
                            b * span, lo * span, hi * span, n=len(c), unit=f"fitted change over the run (OLS slope × "
                            f"{span:g} steps)", rule="similar", params=dict(target=0, tol=FIG10_DRIFT_TOL),
                            estimator="OLS slope over steps, HC1 Student-t interval", resampling="step",
                            detail=f"per-step share {c.sign_consistency.min():.2f}–{c.sign_consistency.max():.2f}; "
                            f"'stable' read as a fitted drift within ±{FIG10_DRIFT_TOL:g} over the run"))
    return rows


def reading(rows: list[C.Claim], R: Result) -> list[str]:
    """The reading's numbers, from the claim rows and the tables (nothing typed that goes stale on
    another profile)."""
    ids = {c.claim for c in rows}

    def cite(cid, scale=100, fmt="+.1f"):
        return C.cite(rows, cid, scale, fmt) if cid in ids else "(no row on this profile)"

    out = [f"nonzero pool, Table 1 contrasts (pts, paired, lm_head / full): both − same "
           f"{cite('table1_nonzero_lm_head_both_vs_same')} / {cite('table1_nonzero_full_both_vs_same')}; "
           f"same − random {cite('table1_nonzero_lm_head_same_vs_random')} / {cite('table1_nonzero_full_same_vs_random')}",
           f"nonzero pool, Mean Boost of both masks (lm_head / full): {cite('table1_nonzero_lm_head_both_mean', 1, '+.2e')}"
           f" / {cite('table1_nonzero_full_both_mean', 1, '+.2e')}",
           f"sign-aware Boost Rate, both − random (pts): lm_head {cite('table1_nonzero_lm_head_signed')} (built in: "
           f"first-order identity and non-negative same-token kernels), full {cite('table1_nonzero_full_signed')}"]
    if "nonzero" in set(R.effects.pool):
        a, n = proxy_agreement(R.effects, "nonzero", "both", "full")
        e = R.effects[R.effects.pool == "nonzero"]
        m = e[e.scope == "full"].merge(e[e.scope == "lm_head"][["kind", "cand", "delta"]], on=["kind", "cand"],
                                       suffixes=("", "_lm"))
        out.append(f"full-scope δ has the lm_head proxy's sign on {a} of {n} both masks and on "
                   f"{100 * (np.sign(m.delta) == np.sign(m.delta_lm)).mean():.0f}% of all {len(m)} masks measured in "
                   f"both scopes (scope agreement per candidate {cite('table1_nonzero_scope_agreement')} %)")
    out += [f"Fig. 3(a) right shift, median δ both − random: nonzero {cite('fig03a_nonzero_right_shift', 1, '+.2e')}, "
            f"positive {cite('fig03a_positive_right_shift', 1, '+.2e')}",
            f"Fig. 3(b) slope of the Boost Rate over the cosine bins (pts per bin): lm_head "
            f"{cite('fig03b_nonzero_lm_head_trend')}, full {cite('fig03b_nonzero_full_trend')}",
            f"Fig. 3(c) nonzero pool, smallest → largest k (lm_head): Mean Boost change "
            f"{cite('fig03c_nonzero_lm_head_mean_rises', 1, '+.2e')}, Boost Rate change "
            f"{cite('fig03c_nonzero_lm_head_rate_rises')} pts",
            f"Fig. 10 fitted drift of the same-sign share over the run: {cite('fig10_stable', 1, '+.3f')}"]
    small = [c for c in rows if c.verdict == C.INCONCLUSIVE and 0 < c.n < 30]
    if small:
        out.append("too few units on this profile to decide (inconclusive at their n): "
                   + ", ".join(f"{c.claim} (n = {c.n})" for c in small))
    return out
