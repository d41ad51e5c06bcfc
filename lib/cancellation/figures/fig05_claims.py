"""Notebook 05's claim rows and Reading, read off a `fig05.Result` (the computation and tables live in
`fig05.py`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import claims as C
from .. import value
from .. import stats as S
from .fig05 import CONFIDENCE, Params, Result, fig11_reads, heldout_gaps

# every interval resamples the query groups the valued tokens come from (tokens of one prompt's rollouts
# share its context and are not independent); the rows' n counts those groups
CLUSTER = "percentile cluster bootstrap over query groups (each drawn group brings all its tokens)"
GROUP = dict(estimator=CLUSTER, resampling="group")
# the rows' labels in plain words: the two Δ̂ estimators (value.py) and the gap both signs weigh equally
EST_WORDS = {"exclude": "Δ̂ with o left out of the first draw", "paper": "Eq. 20's Δ̂"}
BALANCED = "value gap (mean of the A>0 and A<0 gaps)"
NULL = dict(estimator="paired percentile cluster bootstrap over query groups (each drawn group brings all its tokens; "
            "the real gap and all K shuffled gaps recomputed on every draw)", resampling="group")
NULL_WORDS = {"pooled": ("fig05_value_gap_vs_null", "both rollout signs pooled as drawn"),
              "balanced": ("fig05_value_gap_vs_null_balanced", "within each rollout sign, the two signs averaged")}
PAIRED = dict(estimator="paired percentile cluster bootstrap over query groups (each drawn group brings all its "
              "tokens; the same tokens split at step 1 and step K)", resampling="group")


def _tokens(n_tokens: int, n_groups: int) -> str:
    return f"{n_tokens} valued tokens from {n_groups} query groups, groups resampled"


def id_matched_gaps(values: pd.DataFrame) -> pd.DataFrame:
    """Per (token id, sign) with at least one boosted and one suppressed token: mean Δ̂ of its boosted
    minus mean Δ̂ of its suppressed tokens, and the counts."""
    b = values[values.status.isin(["boosted", "suppressed"])]
    g = b.groupby(["token_id", "sign", "status"]).delta_hat.agg(["mean", "size"]).unstack("status").dropna()
    return pd.DataFrame({"gap": g["mean"]["boosted"] - g["mean"]["suppressed"], "n_boosted": g["size"]["boosted"],
                         "n_suppressed": g["size"]["suppressed"]}).reset_index()


def id_cluster_bootstrap(cells: pd.DataFrame, n_boot: int = 2000, seed: int = 0,
                         alpha: float = 0.05) -> tuple[float, float, float]:
    """The unweighted mean gap over (token id, sign) cells with a percentile interval that resamples
    token ids (a drawn id brings all of its cells: its two signs share the id's identity)."""
    gap = cells.gap.to_numpy()
    _, lo, hi, _ = S.cluster_bootstrap(lambda i: gap[i].mean(), cells.token_id.to_numpy(), n_boot=n_boot, seed=seed,
                                       q=(alpha / 2, 1 - alpha / 2), rows=True)   # ids in sorted order
    return float(cells.gap.mean()), lo, hi


def main_text_gaps(R: Result, P: Params) -> list[dict]:
    """The value gap per rollout sign under §3's estimator Â_M = avg₀ − avg₋₁ (continuations of
    s_t ⊕ o_t and of s_t; no 1/(1 − p_t) factor), on the tokens and continuations of the Eq. 20
    ('paper') estimator; [] when that estimator was not run."""
    v = R.values[R.values.estimator == "paper"]
    if not len(v):
        return []
    v = v.assign(main=v.avg0 - v.avg1)
    return [r for r in value.sign_gaps(v, P.n_boot, P.seed, value_col="main", clusters=v.group) if r["sign"] != "all"]


def step1_duplicates(repeated: pd.DataFrame) -> dict:
    """Fig. 11's step-1 rows that repeat a measurement: (optimizer, lr) → (lr', step) of a smaller lr of
    the same optimizer whose split at that step gives the same gap, interval and counts (the gap is a
    function of the pool's split only). Plain SGD's step moves log p by lr times a first-order term,
    so a larger lr's first step can split the pool as a smaller lr's k-th step does."""
    cols = ["gap", "lo", "hi", "n_boosted", "n_suppressed"]
    out = {}
    for o, d in repeated.groupby("optimizer", sort=False):
        for lr_ in sorted(d.lr.unique()):
            one = d[(d.lr == lr_) & (d.step == 1)][cols].iloc[0]
            for _, r in d[d.lr < lr_].iterrows():
                if all(np.isclose(r[c], one[c], rtol=0, atol=1e-12) for c in cols):
                    out[(o, lr_)] = (float(r.lr), int(r.step))
                    break
    return out


def claims(R: Result, P: Params) -> list[C.Claim]:
    est0 = P.estimators[0]
    rows = []
    for est in P.estimators:
        g = R.gap1[R.gap1.estimator == est].set_index("sign")
        cm = R.cells[R.cells.estimator == est].set_index(["sign", "status"])["mean"]
        for sign, label in (("pos", "A > 0"), ("neg", "A < 0")):
            r = g.loc[sign]
            rows.append(C.Claim(f"fig05a_{est}_{sign}", f"Fig. 5(a), {EST_WORDS[est]}",
                                f"boosted tokens have higher value than suppressed ({label})", "yes",
                                r.gap, r.lo, r.hi, n=int(r.n_groups), unit="value gap",
                                rule="direction", params=dict(sign=1), **GROUP,
                                detail=f"{_tokens(int(r.n_boosted + r.n_suppressed), int(r.n_groups))}; boosted "
                                f"{cm.get((sign, 'boosted'), np.nan):+.2f}, suppressed "
                                f"{cm.get((sign, 'suppressed'), np.nan):+.2f}; median SE {R.se.loc[est, '50%']:.2f}"))
    for r in main_text_gaps(R, P):  # the main text's Â_M (paper line 131): no 1/(1 − p) factor
        label = {"pos": "A > 0", "neg": "A < 0"}[r["sign"]]
        rows.append(C.Claim(f"fig05a_maintext_{r['sign']}", "Fig. 5(a), main-text estimator Â_M",
                            f"boosted tokens have higher value than suppressed ({label})", "yes",
                            r["gap"], r["lo"], r["hi"], n=int(r["n_groups"]),
                            unit="value gap of avg₀ − avg₋₁", rule="direction", params=dict(sign=1), **GROUP,
                            detail=f"{_tokens(int(r['n_boosted'] + r['n_suppressed']), int(r['n_groups']))}; §3's "
                            f"Â_M = mean reward from s_t ⊕ o_t − mean reward from s_t (M = {P.M} each), "
                            "the same continuations as the Eq. 20 row without its 1/(1 − p_t) factor: it weighs a "
                            "token's value by its improbability (Â_M = (1 − p_t)·Δ), so confident tokens count little"))
    if R.heldout is not None and len(R.heldout):  # the referee's control: values on states the step never saw
        g = {r["sign"]: r for r in heldout_gaps(R, P)}
        a = g["all"]
        rows.append(C.Claim(f"fig05a_{est0}_heldout", f"Fig. 5(a), {EST_WORDS[est0]}, held-out states",
                            "boosted tokens have higher value than suppressed on states the step never saw (a second "
                            "batch, new prompts)", "— (a control)", a["gap"], a["lo"], a["hi"],
                            n=int(a["n_groups"]), unit=BALANCED,
                            rule="direction", params=dict(sign=1), **GROUP,
                            detail=f"{_tokens(int(a['n_boosted'] + a['n_suppressed']), int(a['n_groups']))} (of "
                            f"the held-out batch); A > 0: {g['pos']['gap']:+.3f} [{g['pos']['lo']:+.3f}, "
                            f"{g['pos']['hi']:+.3f}], "
                            f"A < 0: {g['neg']['gap']:+.3f} [{g['neg']['lo']:+.3f}, {g['neg']['hi']:+.3f}]; "
                            f"{P.heldout_per_cell} tokens per (sign, status) cell, split by the same SGD step "
                            f"(lr {P.lr:g}) on the first batch"))
    b = R.entropy_gap[(R.entropy_gap.estimator == est0) & (R.entropy_gap.sign == "all")]
    pk = R.peak
    rows.append(C.Claim("fig05b_peak", f"Fig. 5(b), {EST_WORDS[est0]}", "the gap peaks at intermediate entropy", "k ≈ 40%",
                        pk["all"], pk["all_lo"], pk["all_hi"], n=pk["groups"], unit="top-% of all tokens at the peak",
                        rule="similar", params=dict(target=40, tol=15), estimator="percentile cluster bootstrap over "
                        "query groups (each drawn group brings all its tokens; argmax per replicate; a peak at the "
                        "pool's last k reads 100%)", resampling="group",
                        detail=f"{_tokens(pk['n'], pk['groups'])}; peak at k = {pk['k']:.0f}% [{pk['lo']:.0f}, "
                        f"{pk['hi']:.0f}] of the valued pool; the "
                        f"pool reaches {pk.get('reach', np.nan):.0f}% of all tokens, so a peak at its last k "
                        f"(k = {max(P.entropy_k)}%: no fall inside the pool) reads 100% and fails the rule on the "
                        "high side; balanced-draw gaps by k: "
                        + ", ".join(f"{k}%: {x:+.2f}" for k, x in zip(b.k, b.gap))))
    v0 = R.values[R.values.estimator == est0]
    d, lo, hi, kp = S.bootstrap_peak_minus_end(v0.delta_hat, v0.sign, v0.status, v0.entropy, P.entropy_k,
                                               min(P.n_boot, 1000), P.seed, clusters=v0.group)
    n_groups0 = int(v0.group.nunique())
    rows.append(C.Claim("fig05b_peak_minus_end", f"Fig. 5(b), {EST_WORDS[est0]}", "the gap rises, then falls (peak − all tokens)",
                        "falls after ≈ 40%", d, lo, hi, n=n_groups0,
                        unit=f"gap(peak k) − gap(k = {max(P.entropy_k)}%)", rule="direction", params=dict(sign=1),
                        estimator="paired percentile cluster bootstrap over query groups (each drawn group brings all "
                        "its tokens; peak k fixed)", resampling="group",
                        detail=f"{_tokens(len(v0), n_groups0)}; gap(k = {kp:.0f}%) − gap(k = {max(P.entropy_k)}%) "
                        "of the valued pool, the mean of the A>0 and A<0 gaps, "
                        f"on the top-k% highest-entropy tokens; k = {kp:.0f}% is the largest of {len(P.entropy_k)} "
                        "gaps on these same tokens, so the point is biased up"))
    bs = v0[v0.status.isin(["boosted", "suppressed"])]
    if len(bs) > 6 and bs.status.nunique() == 2:  # the gap with p, entropy, position and sign as continuous controls
        X = np.column_stack([(bs.status == "boosted").astype(float), bs.prob, bs.entropy, bs.position,
                             np.where(bs.sign == "pos", 1.0, -1.0)])
        b_, lo, hi, se = S.ols_coef(bs.delta_hat, X, 0)
        rows.append(C.Claim(f"fig05a_{est0}_ols", f"Fig. 5(a), {EST_WORDS[est0]}, regression control",
                            "boosted tokens have higher value than suppressed (controlling for p, entropy, position, "
                            "sign)", "yes", b_, lo, hi, n=len(bs), unit="value gap (OLS coefficient of boosted)",
                            rule="direction", params=dict(sign=1), estimator="OLS with HC1 standard errors, t interval",
                            resampling="token",
                            detail=f"Δ̂ ~ 1[boosted] + p + entropy + position + sign over {len(bs)} boosted and "
                            f"suppressed tokens; SE {se:.3f}; the raw gap rows above have no such control"))
    cells = id_matched_gaps(v0)
    if cells.token_id.nunique() >= 2:  # the same token id on both sides: frequency and identity cannot make the gap
        m, lo, hi = id_cluster_bootstrap(cells, min(P.n_boot, 2000), P.seed)
        rows.append(C.Claim(f"fig05a_{est0}_id_matched", f"Fig. 5(a), {EST_WORDS[est0]}, within token id",
                            "boosted tokens have higher value than suppressed tokens of the same id (and sign)", "yes",
                            m, lo, hi, n=cells.token_id.nunique(), unit="value gap, mean over (token id, sign) cells",
                            rule="direction", params=dict(sign=1),
                            estimator="percentile bootstrap over token ids (each drawn id brings all its (id, sign) "
                            "cells)", resampling="token id",
                            detail=f"{len(cells)} (id, sign) cells of {cells.token_id.nunique()} token ids holding "
                            f"{int(cells.n_boosted.sum())} boosted and {int(cells.n_suppressed.sum())} suppressed "
                            f"tokens (of {len(v0)}); unweighted mean over cells"))
    for _, r in R.strata[(R.strata.by == "category") & (R.strata.sign == "all")].iterrows():  # by token class
        nb_ = dict(n=int(r.n_groups), unit=BALANCED, **GROUP,
                   detail=f"{int(r.n_boosted)} boosted, {int(r.n_suppressed)} suppressed tokens of class "
                   f"{r.level} from {int(r.n_groups)} query groups, groups resampled")
        if r.level == "Template":  # a control: scaffold wording never changes the reward, so no gap is expected
            rows.append(C.Claim(f"fig05a_{est0}_{r.level}", f"Fig. 5(a), {EST_WORDS[est0]}, {r.level} tokens (control)",
                                "scaffold (Template) tokens show no value gap", "≈ 0 (control)", r.gap, r.lo, r.hi,
                                rule="similar", params=dict(target=0, tol=0.1), **nb_))
        else:
            rows.append(C.Claim(f"fig05a_{est0}_{r.level}", f"Fig. 5(a), {EST_WORDS[est0]}, {r.level} tokens",
                                f"boosted tokens have higher value than suppressed ({r.level} tokens, both signs)",
                                "yes", r.gap, r.lo, r.hi, rule="direction", params=dict(sign=1), **nb_))
    for _, r in R.conf_gaps.iterrows():  # the gap within confidence strata (p confounds it)
        label = {"pos": "A > 0", "neg": "A < 0"}[r.sign]
        rows.append(C.Claim(f"fig05a_{est0}_{r.sign}_{'low' if r.confidence == CONFIDENCE[0] else 'high'}conf",
                            f"Fig. 5(a), {EST_WORDS[est0]}, {r.confidence}",
                            f"boosted tokens have higher value than suppressed ({label}, {r.confidence})", "yes",
                            r.gap, r.lo, r.hi, n=int(r.n_groups), unit="value gap",
                            rule="direction", params=dict(sign=1), **GROUP,
                            detail=f"{int(r.n_boosted)} boosted, {int(r.n_suppressed)} suppressed tokens in this "
                            f"stratum from {int(r.n_groups)} query groups, groups resampled"))
    last11, unit = R.last, f"gap(step {P.repeat_steps}) − gap(step 1), paired"
    n11 = int(R.pool11.group.nunique())  # Fig. 11's pool: its query groups are what its intervals resample
    K = P.repeat_steps
    for o, (c, reached) in fig11_reads(R).items():  # Fig. 11 in the regime where repeated steps change the split
        others = "; ".join(f"lr {r:g}: {100 * x.changed_status:.0f}% changed, change {x.change:+.3f}"
                           for r, x in last11.loc[o].iterrows())
        x = last11.loc[(o, c)]
        run = R.repeated[(R.repeated.optimizer == o) & (R.repeated.lr == c)]
        top = run.loc[run.changed_status.idxmax()]
        # the rule reads the share changed between step 1 and step K (nonlinear_choice), not its largest value
        rule = f"rule: ≥ {P.nonlinear_share:.0%} at step {K}"
        regime = (f"non-linear regime: {x.changed_status:.0%} of statuses changed by step {K} ({rule})" if reached else
                  f"largest lr, {x.changed_status:.0%} of statuses changed by step {K} ({rule}"
                  + (f"; up to {top.changed_status:.0%} at step {int(top.step)}"
                     if top.changed_status >= P.nonlinear_share else "") + ")")
        first = run.gap.iloc[0]
        rows.append(C.Claim(f"fig11_{o}", f"Fig. 11 ({o} lr {c:g}, {EST_WORDS[est0]}, {regime})",
                            "repeated updates widen the gap", "yes", x.change, x.change_lo, x.change_hi,
                            n=n11, unit=unit, rule="direction", params=dict(sign=1), **PAIRED,
                            detail=f"{_tokens(len(R.pool11), n11)}; {100 * x.changed_status:.0f}% of statuses "
                            f"changed between step 1 and step {K} (largest share {100 * top.changed_status:.0f}%, "
                            f"step {int(top.step)}); gap {first:+.2f} → "
                            f"{x.gap:+.2f}; grid: {others}"))
    rows += null_rows(R, P)
    dup = step1_duplicates(R.repeated)  # one measurement, one row
    for (o, lr_), r in R.repeated[R.repeated.step == 1].set_index(["optimizer", "lr"]).iterrows():  # every run
        if (o, lr_) in dup:
            continue
        same = [f"lr {b:g}'s step-1 split is lr {lr_:g}'s step-{k} split (the same gap, interval and counts: "
                f"plain SGD's first-order step scales with lr), so it has no row of its own"
                for (oo, b), (a, k) in dup.items() if oo == o and a == lr_]
        rows.append(C.Claim(f"fig11_step1_{o}_lr{lr_:g}", f"Fig. 11 / 5(a) ({o} lr {lr_:g}, {EST_WORDS[est0]}, step 1)",
                            "boosted tokens have higher value than suppressed after one step", "yes", r.gap, r.lo,
                            r.hi, n=n11, unit=BALANCED + ", step 1", rule="direction",
                            params=dict(sign=1), **GROUP,
                            detail=f"{int(r.n_boosted)} boosted, {int(r.n_suppressed)} suppressed of the Fig. 11 pool "
                            f"({_tokens(len(R.pool11), n11)})"
                            + ("; the lr the Fig. 11 row reads" if fig11_reads(R)[o][0] == lr_ else "")
                            + "".join(f"; {x}" for x in same)))
    return rows


def null_rows(R: Result, P: Params) -> list[C.Claim]:
    """Credit by value (issue 61): the value gap after the real SGD step minus the mean gap after K steps whose
    advantages were shuffled within groups, on Fig. 11's pool (drawn before any step, whatever its status, so a
    shuffle's split is not selected by the real one). Pooled over both rollout signs, and within sign."""
    t = R.null_test
    if not t:
        return []
    out = []
    for name, (cid, words) in NULL_WORDS.items():
        x = t[name]
        out.append(C.Claim(
            cid, f"§3 / Fig. 5 (SGD lr {t['lr']:g}, {P.estimators[0]}, Fig. 11's pool), against a sign-shuffle null",
            "GRPO assigns credit by value: after the real step, boosted tokens out-value suppressed ones by more than "
            f"after the same step with the advantages shuffled within each group ({words})",
            "implied (§3: cancellation as hidden credit assignment)", x["diff"], x["lo"], x["hi"], n=t["n_groups"],
            unit=f"value gap, real − mean of {t['K']} shuffles", rule="direction", params=dict(sign=1), **NULL,
            detail=f"real gap {x['real']:+.3f}; null ({t['K']} within-group sign shuffles, the same SGD step on the "
            f"same batch): median {x['null_median']:+.3f}, 95% band [{x['null_lo']:+.3f}, {x['null_hi']:+.3f}]; "
            f"permutation p = {x['p']:.3f} (resolution 1/(K + 1) = {x['resolution']:.3f}); "
            f"{_tokens(t['n_tokens'], t['n_groups'])}, Fig. 11's pool (drawn before any step, whatever its status); "
            f"shuffled steps by the {t['path']} path"))   # no seconds in a row: the registry is bit for bit
    return out


def null_sentence(R: Result, P: Params) -> str:
    """One sentence on the value gap against its sign-shuffle null, from the numbers (notebook 05)."""
    t = R.null_test
    if not t:
        return "value-gap null: not computed"
    a, b = t["pooled"], t["balanced"]
    above = "above" if a["real"] > a["null_hi"] else ("below" if a["real"] < a["null_lo"] else "inside")
    return (f"After the real SGD step the value gap over Fig. 11's pool is {a['real']:+.3f}, {above} the 95% band "
            f"[{a['null_lo']:+.3f}, {a['null_hi']:+.3f}] of {t['K']} steps with the advantages shuffled within "
            f"groups (median {a['null_median']:+.3f}; real − mean shuffled {a['diff']:+.3f} [{a['lo']:+.3f}, "
            f"{a['hi']:+.3f}], permutation p = {a['p']:.3f}); within rollout sign: real {b['real']:+.3f}, null "
            f"median {b['null_median']:+.3f} [{b['null_lo']:+.3f}, {b['null_hi']:+.3f}], real − mean shuffled "
            f"{b['diff']:+.3f} [{b['lo']:+.3f}, {b['hi']:+.3f}], p = {b['p']:.3f}.")


def reading(rows: list[C.Claim], R: Result, P: Params) -> str:
    """The Reading's numbers, from the claim rows just built (nothing typed by hand)."""
    by = {r.claim: r for r in rows}
    est0 = P.estimators[0]

    def f(cid):
        r = by.get(cid)
        if r is None or _nan(r.measured):
            return "not measured"
        ci = "" if _nan(r.lo) else f" [{r.lo:+.3f}, {r.hi:+.3f}]"
        return f"{r.measured:+.3f}{ci}, {r.verdict}"

    out = [f"step-1 gap ({EST_WORDS[est0]}): A > 0 {f(f'fig05a_{est0}_pos')}; A < 0 {f(f'fig05a_{est0}_neg')}",
           f"main-text Â_M (no 1/(1 − p)): A > 0 {f('fig05a_maintext_pos')}; A < 0 {f('fig05a_maintext_neg')}",
           f"rises then falls, gap(peak) − gap(all): {f('fig05b_peak_minus_end')}; peak (% of all tokens): "
           f"{f('fig05b_peak')}"]
    if R.heldout is not None and len(R.heldout):
        g = {r["sign"]: r for r in heldout_gaps(R, P)}
        out.append(f"held-out states: balanced {f(f'fig05a_{est0}_heldout')}; per sign " + ", ".join(
            f"{s_} {g[s_]['gap']:+.3f} [{g[s_]['lo']:+.3f}, {g[s_]['hi']:+.3f}]"
            + ("" if g[s_]["lo"] > 0 else " (its interval holds 0)") for s_ in ("pos", "neg")))
    out.append(f"credit by value, real − sign-shuffled gap: pooled {f('fig05_value_gap_vs_null')}; within sign "
               f"{f('fig05_value_gap_vs_null_balanced')}")
    out.append("Fig. 11 step-1 gap per run: " + "; ".join(
        f"{r.claim.removeprefix('fig11_step1_').replace('_', ' ')} {f(r.claim)}"
        for r in rows if r.claim.startswith("fig11_step1_")))
    return "\n".join(out)


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and np.isnan(x))
