"""Notebook 04's claim rows, its thesis rows and what it prints (the tagging audit, the mass and shift
reports, the Reading), read off a `fig04.Result` (the computation and tables live in `fig04.py`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import categories, thesis
from .. import claims as C
from .. import stats as S
from .fig04 import TRIM, UPDATES, Params, Result


# ----------------------------------------------------------------------------- what the notebook shows
def audit_lines(audit: pd.DataFrame) -> list[str]:
    """The tagging check: per category, its token count and every token type with its occurrences."""
    return [f"{c:>9} ({d.n.sum():6d} tokens): " + "  ".join(f"{t}×{n}" for t, n in zip(d.token, d.n))
            for c, d in audit.groupby("category", sort=False)]


def mass_view(summary_table: pd.DataFrame) -> pd.DataFrame:
    """Per category (rows) and measure × update (columns): the mean over batches of the boosted and
    suppressed mass, the boosted share and the token count, rounded to 4 places."""
    view = summary_table[summary_table.measure.isin(["boosted_mass", "suppressed_mass", "boosted_share", "n_tokens"])]
    return view.pivot_table(index=["category"], columns=["measure", "update"], values="mean").round(4)


def occurrence_lines(occurrences: pd.DataFrame) -> list[str]:
    """The single occurrences whose Δlog p differs most between the updates, each with its context."""
    return ["single occurrences with the largest difference (with the 6 tokens before them):"] + [
        f"  ...{r.context} [{r.token}] ({r.category}, r={r.reward:.0f}, p={r.prob:.2f}): "
        f"Δ positive-only {r.delta_positive_only:+.2e}, Δ GRPO {r.delta_grpo:+.2e}" for r in occurrences.itertuples()]


def shift_report(R: Result) -> list[str]:
    """The test the claim rows make, in words: per category the boosted shares and their paired shift,
    how many batches move Template and Reasoning in the paper's direction, the total mass per batch and
    Template's mass by confidence."""
    out = [f"{c:>9}: boosted share positive-only {fmt(R.table, c, u='positive_only')}, GRPO "
           f"{fmt(R.table, c, u='grpo')}; paired shift GRPO − positive-only {fmt(R.table, c, 'boosted_share_shift')}"
           for c in R.cats]
    out += [f"  {c}: {moved(R.per, c, want)} move in the paper's direction"
            for c, want in (("Template", -1), ("Reasoning", 1)) if c in R.per]
    return out + ["total mass per batch:\n" + R.totals.to_string(),
                  "Template tokens by confidence (means per batch):\n" + R.template_confidence.round(4).to_string()]


COMPARE_COLUMNS = ["tokens", "boosted share (positive-only → GRPO)", "paired shift [95% CI]"]


def compare_view(compare: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, category): the category's share of tokens, its boosted share under each update and
    the paired shift with its 95% t interval, as text."""
    return compare.assign(**{
        "tokens": lambda d: (100 * d.token_share).map("{:.1f}%".format),
        COMPARE_COLUMNS[1]: lambda d: d.apply(lambda r: f"{r.boosted_share_positive_only:.3f} → "
                                                       f"{r.boosted_share_grpo:.3f}", axis=1),
        COMPARE_COLUMNS[2]: lambda d: d.apply(lambda r: f"{r['shift']:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}]", axis=1),
    }).set_index(["setting", "category"])[COMPARE_COLUMNS]


STAT_WORDS = {
    "shared_cancellation": "shared: cancellation (mean Δ_GRPO − Δ_single)",
    "specific_cancellation": "specific: cancellation",
    "shared_single": "shared: mean single-sign Δ",
    "specific_single": "specific: mean single-sign Δ",
    "shared_retained": "shared: share of the single-sign Δ kept (Σ ratio)",
    "specific_amplification": "specific: amplification (Σ ratio)",
    "contrast": "contrast shared − specific (matched on id × confidence bin)",
    "contrast_raw": "contrast shared − specific (unmatched)",
    "frequency": "shared: high − low frequency ids",
    "copies_vs_random": "copies mask − disjoint random mask (shared A>0)",
    "copies_restore": "copies mask − GRPO (shared A>0)",
    "random_restore": "disjoint random mask − GRPO (shared A>0)",
    "fo_opposite": "first-order opposite-sign terms",
    "fo_same_id": "first-order: same id",
    "fo_same_id_group": "first-order: same id, same group",
    "fo_other_id": "first-order: other ids",
    "fo_same_id_share": "first-order: same-id share",
}
DEFN_NAMES = {"ids": "same id", "context": "same id in context", "state": "same state"}
STATES_NAMES = {"all": "all shared", "other": "shared at another state", "same": "shared at a copy's state"}


def _ci(v, lo, hi) -> str:
    if not np.isfinite(v):
        return "undefined (an empty class)"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{v:+.3g} (no interval: undefined in > 5% of resamples, or under 5 batches)"
    return f"{v:+.3g} [{lo:+.3g}, {hi:+.3g}]"


def thesis_view(T: pd.DataFrame) -> pd.DataFrame:
    """The thesis statistics over all categories, readable: per (definition, view of the shared class, statistic
    in words) and pool (A>0, A<0), the value with its 95% interval as text, the reason where there is none."""
    d = T[T.category == "all"].copy()
    if d.empty:
        return d
    d["definition"] = d.defn.map(DEFN_NAMES)
    d["shared class"] = d.states.map(STATES_NAMES)
    d["statistic "] = d.statistic.map(STAT_WORDS).fillna(d.statistic)
    d["pool "] = d.pool.map({"pos": "A>0", "neg": "A<0"})
    d["value [95% CI]"] = [_ci(v, lo, hi) for v, lo, hi in zip(d.value, d.lo, d.hi)]
    return d.pivot(index=["definition", "shared class", "statistic "], columns="pool ", values="value [95% CI]").fillna("")


def null_view(B: pd.DataFrame) -> pd.DataFrame:
    """The sign-shuffle null, readable, for what the decision rule reads: per (definition: ids, the chosen context k,
    state; view; statistic; pool) the real value, the null's median and central 95%, and the one-sided permutation
    p toward the paper's side (resolution 1/(K+1))."""
    if B is None or B.empty:
        return pd.DataFrame()
    d = B.copy()
    d["definition"] = [DEFN_NAMES[x] + (f" (k = {k}{', chosen' if c and x == 'context' else ''})" if x == "context" else "")
                       for x, k, c in zip(d.defn, d.k, d.chosen)]
    d["shared class"] = d.states.map(STATES_NAMES)
    d["statistic "] = d.statistic.map(STAT_WORDS)
    d["pool "] = d.pool.map({"pos": "A>0", "neg": "A<0"})
    d["real"] = d.real.map("{:+.3g}".format)
    d["null median [central 95%]"] = [f"{m:+.3g} [{lo:+.3g}, {hi:+.3g}]" for m, lo, hi in
                                      zip(d.null_median, d.null_lo, d.null_hi)]
    d["p toward the paper"] = d.p_paper.map("{:.3f}".format)
    # what the rule reads (the cancellation at another state, the contrast and the amplification) on the deciding
    # definitions (ids, the chosen k) and the state one; every definition and view is in fig04_thesis_null.parquet
    read = (((d.states == "other") & d.statistic.isin(["shared_cancellation", "shared_retained"]))
            | ((d.states == "all") & d.statistic.isin(["contrast", "specific_amplification"]))
            | ((d.defn == "state") & d.statistic.isin(["shared_cancellation", "shared_retained"])))
    keep = d[read & d.chosen]
    return keep.set_index(["definition", "shared class", "statistic ", "pool "])[
        ["real", "null median [central 95%]", "p toward the paper"]]


def pool_lines(R: Result) -> list[str]:
    """What the thesis rows pool: batches kept and lost (a batch without a mixed-reward group has no signal), the
    null's shuffles and its check against the exact step."""
    main = R.batches["policies"][0]
    lost = main.get("empty", [])
    kept = main["n_batches"] - len(lost)
    out = [f"the thesis rows pool {kept} of {main['n_batches']} batches"
           + (f"; batches {lost} have no mixed-reward group and are left out" if lost else "")]
    if kept < thesis.MIN_BATCHES:
        out.append(f"under {thesis.MIN_BATCHES} batches the thesis rows have no interval and are not recorded: this "
                   "profile does not decide the thesis (a memory or smoke test, not a decision)")
    if R.thesis_null is None or R.thesis_null.empty:
        out.append("no sign-shuffle null on this profile (null_shuffles = 0): the rows against the null are not made")
    if "null_check" in R.batches and R.thesis_null is not None and len(R.thesis_null):
        out.append(f"the null: {int(R.thesis_null.K.max())} within-group sign shuffles of every batch; the real signs "
                   f"through the null's path vs the exact GRPO step: max |Δ difference| {R.batches['null_check']:.1e}")
    return out


def fmt(table: pd.DataFrame, c: str, meas: str = "boosted_share", u: str | None = None) -> str:
    """One category's mean (with its interval for a shift) from the committed table."""
    d = table[(table.category == c) & (table.measure == meas) & ((table["update"] == u) if u else True)].iloc[0]
    return f"{d['mean']:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]" if meas.endswith("shift") else f"{d['mean']:.4f}"


def moved(p: pd.DataFrame, c: str, want: int) -> str:
    """How many batches move category c's boosted share in the paper's direction."""
    return f"{int((np.sign(p[c]) == want).sum())} of {int(p[c].notna().sum())} batches"


def mass_log_ratio(mass: pd.DataFrame, category: str) -> pd.Series:
    """Per batch: log(boosted mass under GRPO / under positive-only) of `category` (batches where
    either is 0 dropped)."""
    t = mass[mass.category == category].pivot(index="batch", columns="update", values="boosted_mass")
    t = t.reindex(columns=list(UPDATES))   # a category with no mass under one update: no ratio (NaN, dropped)
    r = np.log(t["grpo"] / t["positive_only"])
    return r[np.isfinite(r)]


def _mean_mass(mass: pd.DataFrame, category: str, update: str) -> float:
    return float(mass[(mass.category == category) & (mass["update"] == update)].boosted_mass.mean())


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Template's share of boosted mass falls and Reasoning's rises under GRPO (paired shift, 95% t
    interval over batches); the same on the fixed-scaffold control, labelled as a control."""

    def claim_rows(p, suffix="", label="Fig. 4", what="", shares=False):
        out = []
        s_ = categories.shift_summary(p).set_index("category")
        for c, sign in (("Template", -1), ("Reasoning", 1)):
            if c not in s_.index:
                continue
            r = s_.loc[c]
            detail = f"{moved(p, c, sign)} in the paper's direction"
            if shares:  # mean boosted shares of the main setting
                detail = f"{fmt(R.table, c, u='positive_only')} → {fmt(R.table, c, u='grpo')}; " + detail
            out.append(C.Claim(f"fig04_{c.lower()}{suffix}", label, f"GRPO {'lowers' if sign < 0 else 'raises'} "
                               f"{c}'s share of boosted mass vs positive-only{what}", "yes", r["mean"], r.lo, r.hi,
                               n=int(r.n), unit="boosted-share shift", rule="direction", params=dict(sign=sign),
                               detail=detail, estimator="t over batches (paired)", resampling="batch"))
        return out

    rows = claim_rows(R.per, shares=True)
    for c, sign in (("Template", -1), ("Reasoning", 1)):  # absolute boosted mass, not its share
        lr_ = mass_log_ratio(R.mass, c)
        if not len(lr_):
            continue
        m, lo, hi = S.t_interval(lr_)
        rows.append(C.Claim(f"fig04_{c.lower()}_mass_ratio", "Fig. 4 (absolute mass)",
                            f"GRPO {'weakens' if sign < 0 else 'strengthens'} {c}'s boosted mass vs positive-only",
                            "greatly weakens" if sign < 0 else "shifts toward", np.exp(m), np.exp(lo), np.exp(hi),
                            n=len(lr_), unit="boosted mass, GRPO / positive-only (geometric mean)", rule="direction",
                            params=dict(sign=sign, ref=1.0),
                            detail=f"t interval of the per-batch log ratio, exponentiated; mean mass per batch "
                            f"{_mean_mass(R.mass, c, 'positive_only'):.3g} → {_mean_mass(R.mass, c, 'grpo'):.3g}",
                            estimator="t over batches (paired, log ratio)", resampling="batch"))
    if P.control_model_path:
        rows += claim_rows(R.setting_shifts[R.settings[-1]], "_fixed_scaffold", "Fig. 4, fixed-scaffold control",
                           " (fixed scaffold)")
    return rows + thesis_rows(R)


def thesis_rows(R: Result) -> list[C.Claim]:
    """The thesis rows of R (`thesis_claims` on its thesis tables and chosen context k)."""
    return thesis_claims(R.thesis, R.thesis_fidelity, R.batches.get("context_k"), R.thesis_shares, R.thesis_null,
                         R.thesis_cells)


def mass_ratios(tokens: pd.DataFrame, trim: float = 0.0) -> dict:
    """Geometric mean over batches of the boosted and the suppressed mass, GRPO / positive-only, for all tokens and
    per category; `trim`: leave out each batch's `trim` share of tokens with the largest |Δ| under each update first
    (a few single tokens moved by ~10 in log p can carry a batch's mass). Returns {(kind, category or 'all'): ratio}."""
    return mass_ratios_of(categories.update_mass(tokens, UPDATES, trim=trim))


def mass_ratios_of(mass: pd.DataFrame) -> dict:
    """`mass_ratios` from the per (update, batch, category) masses (`categories.update_mass`: R.mass, and
    R.mass_trimmed with each batch's TRIM share of largest |Δ| left out); 'all' is a batch's categories summed."""
    out = {}
    per = {u: pd.concat([d.groupby("batch")[["boosted_mass", "suppressed_mass"]].sum().assign(category="all"),
                         d.set_index("batch")[["boosted_mass", "suppressed_mass", "category"]]])
           for u, d in mass.groupby("update")}
    for kind in ("boosted", "suppressed"):
        for cat in ["all"] + sorted(set(mass.category)):
            a = per["grpo"][per["grpo"].category == cat][f"{kind}_mass"]
            b = per["positive_only"][per["positive_only"].category == cat][f"{kind}_mass"]
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.log(a / b.reindex(a.index))
            r = r[np.isfinite(r)]
            if len(r):
                out[(kind, cat)] = float(np.exp(r.mean()))
    return out


def mass_robust_lines(R: Result) -> list[str]:
    """The mass ratios against the total's and with each batch's largest 1% |Δ| tokens left out (the robust reading
    of "greatly weakens"): GRPO / positive-only, geometric mean over batches."""
    full, trim = mass_ratios_of(R.mass), mass_ratios_of(R.mass_trimmed)
    out = []
    for kind in ("boosted", "suppressed"):
        tot, tt = full.get((kind, "all")), trim.get((kind, "all"))
        if tot is None:
            continue
        line = (f"total {kind} mass, GRPO / positive-only: ×{tot:.2f} (×{tt:.2f} without each batch's {TRIM:.0%} "
                f"largest |Δ|)")
        for cat in ("Template", "Reasoning"):
            if (kind, cat) in full:
                line += (f"; {cat} ×{full[(kind, cat)]:.2f}, relative to the total ×{full[(kind, cat)] / tot:.2f} "
                         f"(trimmed ×{trim.get((kind, cat), np.nan):.2f}, relative ×"
                         f"{trim.get((kind, cat), np.nan) / tt:.2f})")
        out.append(line)
    return out


def mass_lines(R: Result, rows: list[C.Claim]) -> list[str]:
    """The absolute-mass reading (`mass_reading`), then the same ratios against the total mass (which GRPO also
    changes) and robust to the few single tokens one SGD step moves by ~10 in log p (`mass_robust_lines`)."""
    return [mass_reading(rows)] + mass_robust_lines(R)


def mass_reading(rows: list[C.Claim]) -> str:
    """The absolute-mass reading of "greatly weakens updates on template tokens", from the claim rows
    (never hand-typed: the numbers are this profile's)."""
    by = {c.claim: c for c in rows}
    t, r = by.get("fig04_template_mass_ratio"), by.get("fig04_reasoning_mass_ratio")
    if t is None or r is None:
        return "absolute boosted mass: no batch with both categories boosted under both updates on this profile"
    verb = lambda c: "raises" if c.measured > 1 else "lowers"  # noqa: E731
    return (f"absolute boosted mass, GRPO / positive-only (geometric mean over {t.n} batches): GRPO {verb(t)} "
            f"Template's ×{t.measured:.2f} [{t.lo:.2f}, {t.hi:.2f}] ({t.verdict}), {verb(r)} Reasoning's "
            f"×{r.measured:.2f} [{r.lo:.2f}, {r.hi:.2f}] ({r.verdict})")


# ----------------------------------------------------------------------------- the thesis rows (thesis.py)
BOOT = "percentile cluster bootstrap (batches, then groups in a batch)"
PERM = "permutation null: K within-group sign shuffles of every batch, pooled as the real statistic"
DEFN_WORDS = {"ids": "", "context": " [in context: the same id after the same k tokens]"}
SFX = {"ids": "", "context": "_ctx"}
RETAIN_TOL = 0.25   # "shared tokens keep their gain": their retained share within 1 ± this
ABSTRACT = "yes (abstract: tokens more specific to successful rollouts receive stronger reinforcement)"


def _cls_rows(pool: str) -> list[tuple]:
    """(id, statistic, states, sign, ref, statement, paper, refutes, unit) of one pool's class rows."""
    up, s = (("A>0", "positive-only"), -1) if pool == "pos" else (("A<0", "negative-only"), 1)
    sign_text, single = up
    gain = "reinforcement" if pool == "pos" else "suppression"
    mirror = "" if pool == "pos" else "mirror: "
    who = "success" if pool == "pos" else "failure"
    return [
        (f"{pool}_shared_cancellation", "shared_cancellation", "all", s, 0.0,
         f"{mirror}shared tokens of {sign_text} rollouts lose {gain} under GRPO "
         f"(mean Δ_GRPO − Δ_{single} {'<' if s < 0 else '>'} 0)", "yes (§3: opposite signals on shared tokens cancel)",
         f"95% CI {'>' if s < 0 else '<'} 0 (shared tokens gain {gain} when the opposite sign joins)", "Δlog p per token"),
        (f"{pool}_shared_retained", "shared_retained", "all", -1, 1.0,
         f"{mirror}shared tokens of {sign_text} rollouts keep less than their "
         f"{single} Δ under GRPO (Σ Δ_GRPO / Σ Δ_{single} < 1)", "yes (implied: they lose part of it)",
         "95% CI > 1 (they keep more than all of it)", "retained share"),
        (f"{pool}_diffstate_cancellation", "shared_cancellation", "other", s, 0.0,
         f"{mirror}shared tokens of {sign_text} rollouts at another state than any opposite-sign copy's (coupling "
         f"between different states, §2) lose {gain} under GRPO (mean Δ_GRPO − Δ_{single})",
         "yes (§2–3: cancellation through coupling)", f"95% CI {'>' if s < 0 else '<'} 0", "Δlog p per token"),
        (f"{pool}_diffstate_retained", "shared_retained", "other", -1, 1.0,
         f"{mirror}shared tokens of {sign_text} rollouts at another state than any copy's keep less than their "
         f"{single} Δ under GRPO", "yes (implied)", "95% CI > 1", "retained share"),
        (f"{pool}_specific_amplification", "specific_amplification", "all", 1, 1.0,
         f"GRPO amplifies the {single} Δ of {who}-specific tokens (Σ Δ_GRPO / Σ Δ_{single} > 1)",
         ABSTRACT if pool == "pos" else "mirror of the abstract's statement", "95% CI < 1", "amplification"),
        (f"{pool}_contrast", "contrast", "all", s, 0.0,
         f"{mirror}shared tokens of {sign_text} rollouts lose more {gain} under GRPO "
         f"than {who}-specific ones (Δ_GRPO − Δ_{single}, shared − specific, "
         "matched on token id × confidence bin)", "yes (§3)",
         f"95% CI {'>' if s < 0 else '<'} 0 (specific tokens lose more)", "Δlog p, matched on token id × confidence bin"),
    ]


def _get(T, defn, pool, stat, cat="all", states="all"):
    d = T[(T.defn == defn) & (T.pool == pool) & (T.category == cat) & (T.statistic == stat) & (T.states == states)]
    return d.iloc[0] if len(d) else None


def _band(B, defn, k, pool, stat, states="all"):
    if B is None or B.empty:
        return None
    d = B[(B.defn == defn) & (B.k == k) & (B.pool == pool) & (B.statistic == stat) & (B.states == states)]
    return d.iloc[0] if len(d) else None


def _claim(cid, statement, paper, r, sign, ref, refutes, unit, detail, estimator="class mean, " + BOOT, rule=None,
           params=None, value=None, lo=None, hi=None, n=None, resampling="batch × group") -> C.Claim:
    params = params if params is not None else dict(sign=sign, ref=ref, refutes=refutes)
    return C.Claim(f"{C.THESIS_PREFIX}{cid}", "§3 / App. E.1 (thesis)", statement, paper,
                   r.value if value is None else value, r.lo if lo is None else lo, r.hi if hi is None else hi,
                   n=int(r.batches) if n is None else n, unit=unit, rule=rule or "direction", params=params,
                   detail=detail, estimator=estimator, resampling=resampling)


def _counts(r) -> str:
    return f"{r.n_shared} shared / {r.n_specific} specific tokens, {r.clusters} groups"


def _part(c: C.Claim) -> list:
    return [c.claim.replace(C.THESIS_PREFIX, ""), c.rule, c.measured, c.lo, c.hi, c.params]


def _null_text(b) -> str:
    return (f"real {b.real:+.3g}; null median {b.null_median:+.3g}, central 95% [{b.null_lo:+.3g}, {b.null_hi:+.3g}] "
            f"over K = {b.K} shuffles; one-sided p {b.p_paper:.3f} toward the paper's side (resolution "
            f"1/{b.K + 1})")


def specific_share(shares: pd.DataFrame | None, defn: str, k: int) -> float | None:
    """The smaller specific share of the two pools on a definition (what decides 'degenerate classes')."""
    if shares is None or shares.empty:
        return None
    d = shares[(shares.defn == defn) & (shares.k == (0 if defn == "ids" else k))]
    return float(d.specific_share.min()) if len(d) else None


def thesis_claims(T: pd.DataFrame, fidelity: pd.DataFrame | None = None, k: int | None = None,
                  shares: pd.DataFrame | None = None, bands: pd.DataFrame | None = None,
                  cells: pd.DataFrame | None = None) -> list[C.Claim]:
    """The cancellation hypothesis (App. E.1 protocol, thesis.py), decided by issue 61's rule: per definition of
    'shared' (ids; in context) and pool, the class rows (shared cancellation and retained share, on all shared
    tokens and on those at another state than any copy's; specific amplification; the matched contrast), the
    contrast and amplification against their sign-shuffle null (`bands`: thesis_null.null_bands), the verdict (two
    parts: cancellation on different-state shared A>0 tokens; success-specific credit against the null) and the
    alternative reading, each a verdict of its parts with no number of its own; the null control (does the
    shuffled null pass the cancellation test?); the frequency split; on the ids definition the copies mask against
    disjoint random masks (`cells`: the masks' sizes), the first-order mechanism; the A>0 contrast per category.
    A row on a class split whose specific class is under 20% of a pool (`shares`) reads "not decidable"."""
    out, by = [], {}
    for defn in ("ids", "context"):
        words, sfx = DEFN_WORDS[defn] + (f" (k = {k})" if defn == "context" and k else ""), SFX[defn]
        kk = 0 if defn == "ids" else (k or 0)
        share = specific_share(shares, defn, kk)
        degenerate = {} if share is None else {"specific_share": share}
        for pool in ("pos", "neg"):
            for cid, stat, states, sign, ref, statement, paper, refutes, unit in _cls_rows(pool):
                r = _get(T, defn, pool, stat, states=states)
                if r is None:
                    continue
                detail = _counts(r)
                if stat == "shared_retained":
                    sh = _get(T, defn, pool, "shared_single", states=states)
                    detail = f"mean Δ single-sign {sh.value:+.3g} per shared token; " + detail
                if stat == "specific_amplification":
                    sp = _get(T, defn, pool, "specific_single")
                    detail = f"mean Δ single-sign {sp.value:+.3g} per specific token; " + detail
                if states == "other":
                    same = _get(T, defn, pool, stat, states="same")
                    if same is not None:
                        detail = (f"the same statistic at a copy's own state (gradients add at one input): "
                                  f"{same.value:+.3g} [{same.lo:+.3g}, {same.hi:+.3g}]; " + detail)
                if stat == "contrast":
                    raw, shc, spc = (_get(T, defn, pool, x) for x in ("contrast_raw", "shared_cancellation",
                                                                       "specific_cancellation"))
                    detail = (f"raw contrast {raw.value:+.3g} [{raw.lo:+.3g}, {raw.hi:+.3g}]; cancellation shared "
                              f"{shc.value:+.3g}, specific {spc.value:+.3g}; " + detail)
                est = ("matched contrast, " if stat == "contrast" else "ratio of class sums, " if stat in
                       ("shared_retained", "specific_amplification") else "class mean, ") + BOOT
                params = dict(sign=sign, ref=ref, refutes=refutes)
                if stat in ("contrast", "specific_amplification"):
                    params |= degenerate
                c = _claim(cid + sfx, statement + words, paper, r, sign, ref, refutes, unit, detail, est, params=params)
                by[cid + sfx] = c
                out.append(c)
            for stat, name, what in (("contrast", "contrast_vs_null", "the matched contrast"),
                                     ("specific_amplification", "amplification_vs_null",
                                      "the specific class's amplification")):
                b = _band(bands, defn, kk, pool, stat)
                if b is None:
                    continue
                who = "success" if pool == "pos" else "failure"
                c = _claim(f"{pool}_{name}{sfx}", f"{what} ({'A>0' if pool == 'pos' else 'A<0'} pool) goes beyond what "
                           f"signs shuffled within groups give: the credit is {who}-specific" + words,
                           ABSTRACT if pool == "pos" else "mirror of the abstract's statement", None, 0, 0, "",
                           by[f"{pool}_{stat}{sfx}"].unit if f"{pool}_{stat}{sfx}" in by else "", _null_text(b), PERM,
                           rule="null_test", value=b.real, lo=np.nan, hi=np.nan,
                           n=by[f"{pool}_{stat}{sfx}"].n if f"{pool}_{stat}{sfx}" in by else 0, resampling="rollout",
                           params=dict(sign=int(b.side), p_paper=float(b.p_paper), p_other=float(b.p_other), K=int(b.K),
                                       median=float(b.null_median), band_lo=float(b.null_lo),
                                       band_hi=float(b.null_hi)) | degenerate)
                by[f"{pool}_{name}{sfx}"] = c
                out.append(c)
        r = _get(T, defn, "pos", "frequency")
        if r is not None:
            out.append(_claim(f"pos_frequency{sfx}", "among shared A>0 tokens, high-frequency ids lose more under GRPO "
                              "than low-frequency ids (cancellation, high − low, matched on confidence bin)" + words,
                              "related work (cancellation concentrates on frequent tokens), not the paper", r, -1, 0.0,
                              "95% CI > 0 (low-frequency ids lose more)", "Δlog p, matched on confidence bin",
                              f"{r.n_shared} high- / {r.n_specific} low-frequency shared tokens (an id's count in its "
                              "batch at or above the batch's token-weighted median is high)", "matched contrast, " + BOOT))
        canc = [by.get(f"pos_diffstate_cancellation{sfx}"), by.get(f"pos_diffstate_retained{sfx}")]
        credit = [by.get(f"{p}_{x}_vs_null{sfx}") for p in ("pos", "neg") for x in ("contrast", "amplification")]
        if all(x is not None for x in canc + credit):
            params = dict(cancellation=[_part(x) for x in canc], credit=[_part(x) for x in credit])
            decides = C.deciding_part(params)
            v = C.thesis_verdict(np.nan, np.nan, np.nan, **params)
            out.append(_claim(f"verdict{sfx}", "THE THESIS, by the rule fixed before the run: opposite signals cancel on "
                              "shared tokens (different-state shared A>0 tokens lose reinforcement and keep less than "
                              "their positive-only gain) and the credit is success-specific (contrast and "
                              "amplification beyond their sign-shuffle null)" + words, "yes (§3, abstract)", canc[0],
                              0, 0, "", "a verdict of its parts (no number of its own)",
                              f"{v}, decided by {decides}: cancellation part {C.part_verdict(params['cancellation'])}, "
                              f"success-specific credit part {C.part_verdict(params['credit'])}",
                              "verdict of two parts: class means and ratios, " + BOOT + "; and a " + PERM,
                              rule="thesis_verdict", params=params, value=np.nan, lo=np.nan, hi=np.nan, n=canc[0].n))
        a, b = by.get(f"pos_specific_amplification{sfx}"), by.get(f"pos_shared_retained{sfx}")
        if a is not None and b is not None:
            keep = [b.claim.replace(C.THESIS_PREFIX, "") + " ≈ 1", "similar", b.measured, b.lo, b.hi,
                    dict(target=1.0, tol=RETAIN_TOL)]
            r = _get(T, defn, "pos", "specific_amplification")
            out.append(_claim(f"alternative{sfx}", "the alternative reading: GRPO amplifies success-specific tokens while "
                              f"shared ones keep their gain (retained share within 1 ± {RETAIN_TOL:g})" + words,
                              "not the paper's reading", r, 0, 0, "", "a verdict of its parts (no number of its own)",
                              f"conjunction of {a.claim} ({a.verdict}) and the shared class's retained share "
                              f"{b.measured:.3g} [{b.lo:.3g}, {b.hi:.3g}] within 1 ± {RETAIN_TOL:g}",
                              "conjunction of two rows, each a " + BOOT, rule="all_of", params=dict(parts=[_part(a), keep]),
                              value=np.nan, lo=np.nan, hi=np.nan))
        b = _band(bands, defn, kk, "pos", "shared_cancellation", "other")
        if b is not None:
            out.append(_claim(f"null_cancellation{sfx}", "null control: with signs shuffled within groups, different-"
                              "state shared A>0 tokens also lose reinforcement under GRPO (the null's median "
                              "cancellation and its central 95% band)" + words, "a control (not in the paper)", None,
                              0, 0, "", "Δlog p per token", _null_text(b), PERM, rule="null_control",
                              params=dict(sign=-1, ref=0.0), value=b.null_median, lo=b.null_lo, hi=b.null_hi,
                              n=int(_get(T, defn, "pos", "shared_cancellation").batches), resampling="rollout"))
    r = _get(T, "ids", "pos", "copies_vs_random")
    if r is not None:
        cr, rr = _get(T, "ids", "pos", "copies_restore"), _get(T, "ids", "pos", "random_restore")
        size = {}
        if cells is not None and "n_copy" in cells:
            neg = cells[(cells.defn == "ids") & (cells.pool == "neg")]
            n_copy, n_rand, n_over = neg.n_copy.sum(), neg.n_random.sum(), neg.n_overlap.sum()
            size = {"size_share": float(n_rand / n_copy) if n_copy else 0.0}
            size_text = (f"random masks disjoint from the copies (overlap {int(n_over)} tokens): {n_rand:.0f} masked "
                         f"tokens against the copies' {n_copy:.0f} ({size['size_share']:.1%}; the non-copies are "
                         f"{1 - n_copy / neg.n.sum():.1%} of A<0 tokens); ")
        else:
            size_text = ""
        short = size.get("size_share", 1.0) < C.MIN_SIZE   # no test at this size: the row gives the share, no number
        if short:
            size_text = (f"not decidable here: {size_text}the difference at that size, not a test: {r.value:+.3g} "
                         f"[{r.lo:+.3g}, {r.hi:+.3g}]; ")
        out.append(_claim("copies_vs_random", "refutation test: masking the opposite-sign copies restores more of the "
                          "shared A>0 tokens' gain than random masks of the same size per group and confidence bin, "
                          "drawn among the other A<0 tokens (mean Δ_copies-masked − Δ_random-masked)",
                          "yes (the copies carry the cancellation)", r, 1, 0.0,
                          "95% CI < 0 (a random mask of the same size restores more: the copies are not special)",
                          "Δlog p per shared A>0 token",
                          size_text + f"restored vs GRPO: copies mask {cr.value:+.3g} [{cr.lo:+.3g}, {cr.hi:+.3g}], "
                          f"random {rr.value:+.3g} [{rr.lo:+.3g}, {rr.hi:+.3g}]; " + _counts(r),
                          params=dict(sign=1, ref=0.0, refutes="95% CI < 0 (a random mask of the same size restores "
                                      "more: the copies are not special)") | size,
                          **(dict(value=np.nan, lo=np.nan, hi=np.nan) if short else {})))
    fid = ""
    if fidelity is not None and len(fidelity):
        f = fidelity.set_index(["what", "pool"])
        tot, opp = f.loc[("first-order total vs Δ_GRPO", "both")], f.loc[("opposite-sign terms vs cancellation", "pos")]
        fid = (f"first-order fidelity (LM-head kernel vs the measured full step): total vs Δ_GRPO corr {tot['corr']:.2f}, "
               f"sign agreement {tot.sign_agreement:.2f}; opposite-sign terms vs the A>0 cancellation corr "
               f"{opp['corr']:.2f}, sign agreement {opp.sign_agreement:.2f}")
    r = _get(T, "ids", "pos", "fo_same_id_share")
    if r is not None:
        sid, oth, grp = (_get(T, "ids", "pos", x) for x in ("fo_same_id", "fo_other_id", "fo_same_id_group"))
        out.append(_claim("mech_same_id_share", "mechanism: the same-id terms carry most of the opposite-sign first-order "
                          "coupling of shared A>0 tokens (|Σ same id| / (|Σ same id| + |Σ other ids|), Eq. 9)",
                          "yes (§3: identical tokens couple)", r, 1, 0.5, "", "share",
                          f"mean first-order term per shared A>0 token: same id {sid.value:+.3g} (same group "
                          f"{grp.value:+.3g}), other ids {oth.value:+.3g}; {fid}", "ratio of class sums, " + BOOT,
                          rule="majority", params=dict(threshold=0.55)))
        r = _get(T, "ids", "pos", "fo_opposite")
        out.append(_claim("mech_fo_cancellation", "mechanism: the opposite-sign first-order terms lower shared A>0 tokens "
                          "(mean of their sum, Eq. 9)", "yes (§3)", r, -1, 0.0, "95% CI > 0 (they raise them)",
                          "first-order Δlog p per token", fid, "class mean, " + BOOT))
    ids_share = specific_share(shares, "ids", 0)
    for cat in sorted(set(T.category) - {"all"}):
        r = _get(T, "ids", "pos", "contrast", cat)
        if r is None:
            continue
        out.append(_claim(f"pos_contrast_{cat.lower()}", "shared tokens of A>0 rollouts lose more under GRPO than "
                          f"success-specific ones, {cat} tokens only", "yes (§3)", r, -1, 0.0, "95% CI > 0",
                          "Δlog p, matched on token id × confidence bin", _counts(r), "matched contrast, " + BOOT,
                          params=dict(sign=-1, ref=0.0, refutes="95% CI > 0")
                          | ({} if ids_share is None else {"specific_share": ids_share})))
    return out


def thesis_reading(TC: list[C.Claim]) -> list[str]:
    """Which reading the rows support, per definition, in words built from the rows: README's sentences
    (`claims.thesis_reading`), read off this run's rows."""
    return C.thesis_reading({c.claim[len(C.THESIS_PREFIX):]: c for c in TC})


def class_lines(R: Result) -> list[str]:
    """The context definition's k, what each definition's classes can test (`class_share_lines`) and what the
    thesis rows pool (`pool_lines`)."""
    k = R.batches["context_k"]
    return ([f"context definition: k = {k} preceding tokens (rule: the smallest k whose specific share is ≥ 20% in "
             "both pools)"] + class_share_lines(R.thesis_shares, k) + pool_lines(R))


def shares_view(shares: pd.DataFrame) -> pd.DataFrame:
    """The specific share per definition (rows: defn, k) and pool, rounded to 3 places."""
    return shares.pivot(index=["defn", "k"], columns="pool", values="specific_share").round(3)


def class_share_lines(shares: pd.DataFrame, k: int) -> list[str]:
    """What this task's classes can test: per definition, the specific share of each pool and whether it
    reaches thesis.MIN_SPECIFIC (below it, nearly every token is 'shared' and the specific class is a
    handful of rare ids: its rows say little about what happens to specific tokens)."""
    out, MIN_SPECIFIC = [], thesis.MIN_SPECIFIC
    for defn, kk in (("ids", 0), ("context", k)):
        d = shares[(shares.defn == defn) & (shares.k == kk)].set_index("pool").specific_share
        ok = (d >= MIN_SPECIFIC).all()
        name = "same id" if defn == "ids" else f"same id after the same {kk} tokens"
        out.append(f"'shared' = {name}: specific share A>0 {d.get('pos', np.nan):.1%}, A<0 {d.get('neg', np.nan):.1%} -> "
                   + ("the classes are not degenerate: both classes' rows can be read" if ok else
                      f"below {MIN_SPECIFIC:.0%}: nearly every token is shared on this task, so the specific class "
                      "is a few rare ids and the rows on it test little"))
    return out


def thesis_report(T: pd.DataFrame, TC: list[C.Claim]) -> list[str]:
    """The thesis rows one per line (verdict, value, interval, first part of the detail)."""
    out = [f"{c.claim.replace(C.THESIS_PREFIX, ''):>34}: {c.verdict.upper():>15}  "
           + ("(a verdict of its parts)" if not np.isfinite(c.measured) else
              f"{c.measured:+.3g}" + (f" [{c.lo:+.3g}, {c.hi:+.3g}]" if np.isfinite(c.lo) else ""))
           + f"  ({c.detail.split(';')[0]})" for c in TC]
    out.append("(reproduced: the interval, or the real value against its null, is on the paper's side; not reproduced: "
               "on the refuting side, or inside the null; not decidable: the classes are degenerate or a null mask "
               "falls short; null passes / differs: a null control, not a claim)")
    return out
