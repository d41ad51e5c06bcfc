"""Notebook 04's claim rows, its thesis rows and what it prints (the tagging audit, the mass and shift
reports, the Reading), read off a `fig04.Result` (the computation and tables live in `fig04.py`)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import categories, thesis
from .. import claims as C
from .. import stats as S
from .fig04 import UPDATES, Params, Result


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


def thesis_view(T: pd.DataFrame) -> pd.DataFrame:
    """The thesis contrasts over all categories: per (pool, statistic) and estimator, the contrast with
    its interval as text."""
    return (T[T.category == "all"].assign(ci=lambda d: d.apply(lambda r: f"{r.contrast:+.2e} [{r.lo:+.2e}, "
                                                                           f"{r.hi:+.2e}]", axis=1))
            .pivot(index=["pool", "statistic"], columns="estimator", values="ci"))


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
    return rows + thesis_claims(R.thesis)


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


# the thesis rows: (id, pool, category, statistic, sign of the row's value vs shared − specific, paper's sign
# of the row's value, statement, what would refute)
THESIS_ROWS = (
    ("pos_cancellation", "pos", "all", "cancellation", 1, -1,
     "shared tokens of A>0 rollouts lose more of their positive-only gain under GRPO than success-specific ones "
     "(Δ_GRPO − Δ_pos-only, shared − specific)", "95% CI > 0 (shared tokens lose less)"),
    ("pos_net", "pos", "all", "net", -1, 1,
     "success-specific tokens end with the larger net Δ under GRPO (specific − shared)",
     "95% CI < 0 (shared tokens end higher)"),
    ("neg_cancellation", "neg", "all", "cancellation", 1, 1,
     "mirror: shared tokens of A<0 rollouts lose more of their negative-only suppression under GRPO than "
     "failure-specific ones (Δ_GRPO − Δ_neg-only, shared − specific)", "95% CI < 0"),
    ("neg_net", "neg", "all", "net", -1, -1,
     "mirror: failure-specific tokens end with the lower net Δ under GRPO (specific − shared)",
     "95% CI > 0 (failure-specific tokens end higher)"),
    ("pos_masked", "pos", "all", "mask_effect", 1, 1,
     "falsification: masking the opposite-sign copies (same id in the group's A<0 rollouts) shrinks the "
     "shared − specific cancellation contrast (matched contrast, masked GRPO − GRPO)",
     "95% CI < 0: the contrast grows without the opposite-sign copies, so they do not carry it"),
)


def thesis_report(T: pd.DataFrame, TC: list[C.Claim]) -> list[str]:
    """The thesis rows one per line, then each class's mean Δ under the single-sign step and under
    GRPO (the GRPO mean minus the cancellation): which class the contrast comes from."""
    out = [f"{c.claim.replace('fig04_thesis_', ''):>28}: {c.verdict.upper():>15}  {c.measured:+.3g} "
           f"[{c.lo:+.3g}, {c.hi:+.3g}]  ({c.detail.split(';')[0]})" for c in TC]
    out.append("(reproduced: the interval is on the paper's side; not reproduced: on the refuting side; else inconclusive)")
    for pool, single in (("pos", "positive-only"), ("neg", "negative-only")):
        d = T[(T.pool == pool) & (T.category == "all") & (T.estimator == "raw")].set_index("statistic")
        for cls in ("shared", "specific") if len(d) else ():
            net, c = d.loc["net", f"mean_{cls}"], d.loc["cancellation", f"mean_{cls}"]
            out.append(f"A{'>' if pool == 'pos' else '<'}0 {cls:>8}: mean Δ {single} {net - c:+.2e} -> GRPO {net:+.2e} "
                       f"(cancellation {c:+.2e})")
    return out


def thesis_claims(T: pd.DataFrame) -> list[C.Claim]:
    """The cancellation hypothesis (App. E.1 protocol): one row per pool and statistic on the
    contrast matched on token id × confidence bin (the raw contrast in the detail), the
    falsification row, and the A>0 cancellation per token category."""
    def get(pool, cat, stat, how):
        d = T[(T.pool == pool) & (T.category == cat) & (T.statistic == stat) & (T.estimator == how)]
        return d.iloc[0] if len(d) else None

    rows = list(THESIS_ROWS) + [(f"pos_cancellation_{c.lower()}", "pos", c, "cancellation", 1, -1,
                                 f"shared tokens of A>0 rollouts lose more under GRPO than success-specific ones, "
                                 f"{c} tokens only", "95% CI > 0")
                                for c in sorted(set(T.category) - {"all"}) if get("pos", c, "cancellation", "matched")
                                is not None]
    out = []
    for cid, pool, cat, stat, flip, sign, statement, refutes in rows:
        r, raw = get(pool, cat, stat, "matched"), get(pool, cat, stat, "raw")
        if r is None:
            continue
        m, (lo, hi) = flip * r.contrast, sorted((flip * r.lo, flip * r.hi))
        means = "" if np.isnan(r.mean_shared) else (f"; class means shared {r.mean_shared:+.3g}, specific "
                                                    f"{r.mean_specific:+.3g}")
        if stat == "net":  # how much of the net contrast the single-sign step alone already gives (matched is linear)
            alone = flip * (r.contrast - get(pool, cat, "cancellation", "matched").contrast)
            means += f"; under {thesis.single(pool).replace('_', '-')} alone the same contrast is {alone:+.3g}"
        if stat == "mask_effect":  # how much of the negatives the mask removed: the more, the weaker the test
            mc, neg = get(pool, cat, "masked_cancellation", "raw"), get("neg", "all", "net", "raw")
            dropped = neg.n_shared / (neg.n_shared + neg.n_specific) if neg is not None else np.nan
            means = (f"; masked cancellation means shared {mc.mean_shared:+.3g}, specific {mc.mean_specific:+.3g}; "
                     f"the mask drops {100 * dropped:.0f}% of the A<0 tokens' loss terms (the more, the closer the "
                     f"masked step is to positive-only and the weaker this test)")
        out.append(C.Claim(
            f"fig04_thesis_{cid}", "§3 / App. E.1 (thesis)", statement, "yes", m, lo, hi, n=int(r.batches),
            unit="Δlog p, matched on token id × confidence bin", rule="direction",
            params=dict(sign=sign, refutes=refutes),
            detail=f"raw contrast {flip * raw.contrast:+.3g} [{min(flip * raw.lo, flip * raw.hi):+.3g}, "
                   f"{max(flip * raw.lo, flip * raw.hi):+.3g}]{means}; {r.n_shared} shared / {r.n_specific} specific "
                   f"tokens, {r.clusters} groups, {100 * r.matched_share:.0f}% of tokens in matched strata",
            estimator="matched contrast, percentile cluster bootstrap (batches, then groups in a batch)",
            resampling="batch × group"))
    return out
