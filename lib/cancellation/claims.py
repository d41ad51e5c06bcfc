"""The claims registry: every quantitative claim a notebook tests, with its verdict rule in code.

A notebook builds `Claim` records from the values it computed (never typed numbers) and calls
`record(results_dir, notebook, claims)`, which replaces that notebook's rows of
`<results_dir>/claims.parquet` atomically, under a lock on the registry (`claims.parquet.lock`), so
notebooks run at once never lose each other's rows. The verdict of a row is `RULES[rule](measured, lo, hi,
**params)`; `verdict_of(row)` recomputes it from the stored numbers, and the tests check that it
equals the stored verdict. What the registry says in words and tables (README's first screen, docs/claims.md,
the site's summary) is `findings.py`'s (`make claims`: `python -m cancellation.findings readme`).

Rules (all on the measured value m and its interval [lo, hi]; NaN bounds mean "no interval"):
- direction(sign, ref=0, paper=None, point_ok=False, refutes=""): the paper says sign·(m − ref) > 0.
  reproduced if the interval excludes ref in the paper's direction; not reproduced if it excludes
  ref the other way, or if m is on the wrong side of ref and the interval excludes the paper's
  value; else inconclusive. Without an interval: decided on m when point_ok (a deterministic
  quantity), else inconclusive. `refutes` (text only) says in the rule text which outcome would
  count against the hypothesis.
- similar(tol, target=0, point_ok=False): the paper says m ≈ target. reproduced if the interval
  lies inside [target − tol, target + tol]; not reproduced if it lies entirely outside it; else
  inconclusive. Without an interval: |m − target| ≤ tol decides when point_ok, else inconclusive.
- construction(why, sign=1, ref=0, point_ok=False): the paper's statement holds by how the test is
  built (`why` says how), so agreeing with it tests nothing: "holds by construction" where
  direction() would say reproduced, else direction()'s verdict (a broken construction shows).
  Never "reproduced".

- all_of(parts): a conjunction of other rows (their numbers and rules stored in `parts`): reproduced
  when every part is, not reproduced when any part is not, else inconclusive.
- exact(k, n, k_ref, n_ref, sign=-1, alpha=0.05): counts in an arm against a reference arm (e.g.
  collapsed runs), Fisher's exact test, one-sided in the paper's direction: reproduced at p ≤ alpha,
  not reproduced if the test the other way gives p ≤ alpha, else inconclusive.

`record` refuses a row whose rule cannot read "reproduced" at its n with its estimator, whatever
the data (`can_pass`: a Clopper–Pearson bound that no count reaches, a t interval or a bootstrap over
one unit, a Fisher test no counts can pass): such a row tests nothing at this profile's n, so it is
not recorded, and a printed line (in the notebook's output) names it and says why.

Every Claim also states its `estimator` (how the interval is computed: "t over steps",
"percentile bootstrap over candidates", "Clopper–Pearson", "point (no interval)", ...) and its
`resampling` unit (what one draw of the interval is: token, token id, pair, candidate, rollout, group,
batch, step, seed, run; "none" for a point; a multi-stage bootstrap names every unit it resamples,
outermost first, joined by " × ": "batch × group"). Both are required: an empty one raises.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

import pandas as pd

from . import cache
from .stats import clopper_pearson

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
BY_CONSTRUCTION = "holds by construction"
NOT_DECIDABLE = "not decidable"   # the test cannot be made here (degenerate classes, a null mask that falls short)
ABOUT_HALF = "about half"         # a "most" claim whose interval sits at a half
NULL_PASSES, NULL_DIFFERS = "null passes", "null differs"   # a null control's own words: not one of the paper's claims
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, BY_CONSTRUCTION, NOT_DECIDABLE, ABOUT_HALF)
CONTROL_VERDICTS = (NULL_PASSES, NULL_DIFFERS)   # rows with these are null controls: listed, never counted as claims
# params that make any rule read "not decidable" before it reads the numbers (the rule fixed before the run:
# issue 61): a class split whose specific class is under MIN_SPECIFIC of its pool's tokens, a null mask that
# reaches under MIN_SIZE of the size it must match
MIN_SPECIFIC, MIN_SIZE = 0.2, 0.9
UNITS = ("token", "token id", "pair", "candidate", "rollout", "group", "prompt", "batch", "step", "seed", "run",
         "none")
THESIS_PREFIX = "fig04_thesis_"  # the thesis rows; README lists those of THESIS_README one by one (docs/claims.md all)
THESIS_README = ("verdict", "pos_diffstate_cancellation", "pos_contrast_vs_null", "pos_amplification_vs_null",
                 "null_cancellation", "verdict_ctx", "pos_diffstate_cancellation_ctx", "pos_contrast_vs_null_ctx",
                 "pos_amplification_vs_null_ctx", "null_cancellation_ctx", "copies_vs_random", "mech_same_id_share")
COLUMNS = ["notebook", "claim", "figure", "statement", "paper", "measured", "lo", "hi", "n", "unit", "rule",
           "params", "rule_text", "detail", "verdict", "estimator", "resampling"]
LATER_COLUMNS = ("estimator", "resampling")  # added to the registry later; empty in an older registry's rows


def is_nan(x) -> bool:
    """None or a float NaN: no number (a row without an interval, or without a measured value of its own)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def direction(m, lo, hi, sign: int = 1, ref: float = 0.0, paper=None, point_ok: bool = False,
              refutes: str = "") -> str:
    s = 1 if sign >= 0 else -1
    if is_nan(m):
        return INCONCLUSIVE
    if is_nan(lo) or is_nan(hi):
        if not point_ok:
            return INCONCLUSIVE
        return REPRODUCED if s * (m - ref) > 0 else NOT_REPRODUCED
    a, b = sorted((s * (lo - ref), s * (hi - ref)))   # the interval in the paper's orientation
    if a > 0:
        return REPRODUCED
    if b < 0:
        return NOT_REPRODUCED
    if paper is not None and s * (m - ref) <= 0 and not (lo <= paper <= hi):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def similar(m, lo, hi, tol: float, target: float = 0.0, point_ok: bool = False) -> str:
    if is_nan(m):
        return INCONCLUSIVE
    if is_nan(lo) or is_nan(hi):
        if not point_ok:
            return INCONCLUSIVE
        return REPRODUCED if abs(m - target) <= tol else NOT_REPRODUCED
    if target - tol <= lo and hi <= target + tol:
        return REPRODUCED
    if lo > target + tol or hi < target - tol:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def construction(m, lo, hi, why: str, sign: int = 1, ref: float = 0.0, point_ok: bool = False) -> str:
    d = direction(m, lo, hi, sign=sign, ref=ref, point_ok=point_ok)
    return BY_CONSTRUCTION if d == REPRODUCED else d


def _fisher_p(k: int, n: int, k_ref: int, n_ref: int, lower: bool = True) -> Fraction:
    K, N = k + k_ref, n + n_ref
    total = math.comb(N, n)
    return sum((Fraction(math.comb(K, x) * math.comb(N - K, n - x), total)
                for x in range(max(0, n - (N - K)), min(K, n) + 1) if (x <= k if lower else x >= k)), Fraction(0))


def fisher_p(k: int, n: int, k_ref: int, n_ref: int, lower: bool = True) -> float:
    """One-sided Fisher's exact p of k/n against k_ref/n_ref (the hypergeometric tail of k given both
    margins): lower=True tests k/n < k_ref/n_ref (P(X ≤ k)), else k/n > k_ref/n_ref (P(X ≥ k)).
    Computed in exact rational arithmetic (`exact` compares it with alpha exactly: 0/3 vs 3/3 is 1/20)."""
    return float(_fisher_p(k, n, k_ref, n_ref, lower))


def exact(m, lo, hi, k: int, n: int, k_ref: int, n_ref: int, sign: int = -1, alpha: float = 0.05) -> str:
    """Counts of an event (e.g. collapsed runs) in an arm (k of n) against a reference arm (k_ref of
    n_ref), Fisher's exact test, one-sided: the paper says sign·(k/n − k_ref/n_ref) > 0. reproduced if
    the test in the paper's direction gives p ≤ alpha, not reproduced if the test the other way does,
    else inconclusive. m, lo, hi are shown only (the verdict reads the counts)."""
    if n <= 0 or n_ref <= 0:
        return INCONCLUSIVE
    a = Fraction(str(alpha))
    if _fisher_p(k, n, k_ref, n_ref, lower=sign < 0) <= a:
        return REPRODUCED
    if _fisher_p(k, n, k_ref, n_ref, lower=sign >= 0) <= a:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def all_of(m, lo, hi, parts: list, what: str = "") -> str:
    """A conjunction: `parts` is a list of [name, rule, m, lo, hi, params] (other rows' numbers, stored in
    this row so its verdict can be recomputed from the row alone). reproduced when every part is; not
    reproduced when any part is not reproduced; else inconclusive. m, lo, hi are shown only."""
    got = _parts(parts)
    if NOT_DECIDABLE in got:
        return NOT_DECIDABLE
    if got and all(g == REPRODUCED for g in got):
        return REPRODUCED
    if any(g == NOT_REPRODUCED for g in got):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def majority(m, lo, hi, threshold: float = 0.55) -> str:
    """A "most"/"majority" claim on a share: reproduced when the interval lies above `threshold` (0.55: a share
    just over a half is not "most"); not reproduced when it lies below 0.5; "about half" when it lies within
    [1 − threshold, threshold]; else inconclusive."""
    if is_nan(m) or is_nan(lo) or is_nan(hi):
        return INCONCLUSIVE
    if lo > threshold:
        return REPRODUCED
    if hi < 0.5:
        return NOT_REPRODUCED
    if lo >= 1 - threshold and hi <= threshold:
        return ABOUT_HALF
    return INCONCLUSIVE


def null_test(m, lo, hi, sign: int, p_paper: float, p_other: float, K: int, median: float = math.nan,
              band_lo: float = math.nan, band_hi: float = math.nan, alpha: float = 0.025) -> str:
    """The real statistic m against a permutation null (K within-group sign shuffles; `p_paper`, `p_other`: the
    one-sided permutation p-values toward the paper's side sign and away from it, in steps of 1/(K+1)):
    reproduced when m lies beyond the null's central 95% on the paper's side (p_paper ≤ alpha = 0.025); not
    reproduced otherwise: inside the band ("no different from sign-agnostic redistribution") or beyond it on the
    other side. median, band_lo, band_hi (the null's median and 2.5/97.5% quantiles) are shown only."""
    if is_nan(m) or not K:
        return INCONCLUSIVE
    return REPRODUCED if p_paper <= alpha else NOT_REPRODUCED


def null_control(m, lo, hi, sign: int, ref: float = 0.0) -> str:
    """A null control: m is the null's median, [lo, hi] its central 95% band. "null passes" when the whole band
    lies on the paper's side of ref (signs shuffled within groups would pass the test the real signs take), else
    "null differs". Never "reproduced", and not counted among the paper's claims."""
    if is_nan(lo) or is_nan(hi):
        return NULL_DIFFERS
    s = 1 if sign >= 0 else -1
    return NULL_PASSES if min(s * (lo - ref), s * (hi - ref)) > 0 else NULL_DIFFERS


def _parts(parts: list) -> list:
    return [judge(rule, pm, plo, phi, pp) for _, rule, pm, plo, phi, pp in parts]


def part_verdict(parts: list, need_all: bool = True) -> str:
    """One part of the thesis verdict from its rows: "not decidable" when any row is; reproduced when every row is;
    not reproduced when every row is not; else inconclusive."""
    got = _parts(parts)
    if not got or NOT_DECIDABLE in got:
        return NOT_DECIDABLE
    if all(g == REPRODUCED for g in got):
        return REPRODUCED
    if all(g == NOT_REPRODUCED for g in got):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def thesis_verdict(m, lo, hi, cancellation: list, credit: list) -> str:
    """The thesis (issue 61's rule, fixed before the run): two parts, each a list of rows [name, rule, m, lo, hi,
    params] (`part_verdict`): *cancellation* (different-state shared A > 0 tokens: cancellation below 0 and
    retained share below 1) and *success-specific credit* (contrast and specific amplification, each pool, beyond
    their sign-shuffle null on the paper's side). "not decidable" when a part is; reproduced when both are; not
    reproduced when either is not; else inconclusive. m, lo, hi: none (NaN); the parts carry the numbers."""
    c, s = part_verdict(cancellation), part_verdict(credit)
    if NOT_DECIDABLE in (c, s):
        return NOT_DECIDABLE
    if c == s == REPRODUCED:
        return REPRODUCED
    if NOT_REPRODUCED in (c, s):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def deciding_part(params: dict) -> str:
    """Which part of a thesis_verdict row decides it, in words."""
    c, s = part_verdict(params["cancellation"]), part_verdict(params["credit"])
    v = thesis_verdict(math.nan, math.nan, math.nan, **params)
    names = {"cancellation": c, "success-specific credit": s}
    if v == NOT_DECIDABLE:
        who = [n for n, x in names.items() if x == NOT_DECIDABLE]
    elif v == REPRODUCED:
        who = list(names)
    elif v == NOT_REPRODUCED:
        who = [n for n, x in names.items() if x == NOT_REPRODUCED]
    else:
        who = [n for n, x in names.items() if x == INCONCLUSIVE]
    return " and ".join(who)


RULES = {"direction": direction, "similar": similar, "construction": construction, "exact": exact, "all_of": all_of,
         "majority": majority, "null_test": null_test, "null_control": null_control, "thesis_verdict": thesis_verdict}


def judge(rule: str, m, lo, hi, params: dict) -> str:
    """The verdict of a row: "not decidable" when its params say the test cannot be made here (`specific_share`
    under MIN_SPECIFIC: degenerate classes; `size_share` under MIN_SIZE: a null mask that falls short of the size
    it must match), else RULES[rule] on the numbers and the other params."""
    p = dict(params)
    share, size = p.pop("specific_share", None), p.pop("size_share", None)
    if (share is not None and share < MIN_SPECIFIC) or (size is not None and size < MIN_SIZE):
        return NOT_DECIDABLE
    return RULES[rule](m, lo, hi, **p)


def rule_text(rule: str, params: dict) -> str:
    """The rule in words, with its parameters (shown in the README and the notebooks)."""
    p = dict(params)
    pre = []
    if "specific_share" in p:
        pre.append(f"not decidable if the specific class is under {MIN_SPECIFIC:.0%} of the pool "
                   f"(here {p.pop('specific_share'):.1%})")
    if "size_share" in p:
        pre.append(f"not decidable if the null mask reaches under {MIN_SIZE:.0%} of the copies' size "
                   f"(here {p.pop('size_share'):.1%})")
    if pre:
        return "; ".join(pre) + "; else " + rule_text(rule, p)
    if rule == "majority":
        t = p.get("threshold", 0.55)
        return (f"95% CI > {t:g} (a majority); not reproduced if CI < 0.5; 'about half' if CI within "
                f"[{1 - t:g}, {t:g}]")
    if rule == "null_test":
        side = "above" if p.get("sign", 1) >= 0 else "below"
        return (f"beyond the central 95% of its null ({p['K']} within-group sign shuffles of every batch) {side} it: "
                f"one-sided permutation p ≤ {p.get('alpha', 0.025):g} (resolution 1/{p['K'] + 1}); not reproduced "
                "inside the band (no different from sign-agnostic redistribution) or beyond it on the other side")
    if rule == "null_control":
        side = ">" if p.get("sign", 1) >= 0 else "<"
        return (f"a null control: 'null passes' if the null's central 95% band is {side} {p.get('ref', 0.0):g} "
                "(shuffled signs pass the test the real signs take), else 'null differs'; not a claim of the paper")
    if rule == "thesis_verdict":
        return ("not decidable if a part is; reproduced if both parts are; not reproduced if either is not. "
                "Cancellation part: " + "; ".join(f"{name} ({rule_text(r, pp)})" for name, r, _, _, _, pp in
                                                  p["cancellation"])
                + " (reproduced if both are, not reproduced if both are not). Success-specific credit part: "
                + "; ".join(name for name, *_ in p["credit"]) + ", each beyond its sign-shuffle null on the paper's "
                "side (reproduced if all are, not reproduced if none is)")
    pt = " (no interval: decided on the point)" if p.get("point_ok") else ""
    if rule == "direction":
        ref = p.get("ref", 0.0)
        side = ">" if p.get("sign", 1) >= 0 else "<"
        extra = f"; not if wrong side and CI excludes paper {p['paper']:g}" if p.get("paper") is not None else ""
        if p.get("refutes"):
            extra += f"; refuted (not reproduced) if {p['refutes']}"
        return f"95% CI {side} {ref:g}{pt}{extra}"
    if rule == "similar":
        t, tol = p.get("target", 0.0), p["tol"]
        return f"95% CI within {t:g} ± {tol:g}{pt}"
    if rule == "exact":
        side = "<" if p.get("sign", -1) < 0 else ">"
        return (f"Fisher's exact test, one-sided: share {side} the reference's at p ≤ {p.get('alpha', 0.05):g} "
                f"({p['k']}/{p['n']} vs {p['k_ref']}/{p['n_ref']}); not if the test the other way gives p ≤ "
                f"{p.get('alpha', 0.05):g}")
    if rule == "all_of":
        return ("every part reproduced: " + "; ".join(f"{name} ({rule_text(r, pp)})" for name, r, _, _, _, pp in p["parts"])
                + "; not reproduced if any part is not")
    if rule == "construction":
        side = ">" if p.get("sign", 1) >= 0 else "<"
        return f"built in ({p['why']}): 95% CI {side} {p.get('ref', 0.0):g}{pt} holds by construction, never 'reproduced'"
    raise ValueError(f"unknown rule {rule!r}; known: {', '.join(RULES)}")


@dataclass
class Claim:
    """One claim: what the paper says, what this run measured, and the rule that decides."""
    claim: str                 # stable id, e.g. 'fig01_ab_boosted_share'
    figure: str                # 'Fig. 1(a,b)'
    statement: str             # the paper's statement
    paper: str                 # the paper's value, as text ('similar', '≈ 0.7', '74–75 / 51')
    measured: float            # the measured value the rule reads
    lo: float = math.nan       # its 95% interval
    hi: float = math.nan
    n: int = 0                 # what the interval is over (tokens, steps, batches, seeds)
    unit: str = ""             # how to read `measured` ('pts', 'log10 ratio', ...)
    rule: str = "direction"
    params: dict = field(default_factory=dict)
    detail: str = ""           # the supporting numbers and caveats, as computed text (README column)
    verdict: str = ""
    estimator: str = ""        # how the interval is computed ('t over steps', 'percentile bootstrap over seeds', ...)
    resampling: str = ""       # the unit one draw of the interval is (UNITS); 'none' for a point value

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"Claim {self.claim}: unknown rule {self.rule!r}; known: {', '.join(RULES)}")
        self.measured, self.lo, self.hi = (float(x) if x is not None else math.nan
                                           for x in (self.measured, self.lo, self.hi))
        self.n = int(self.n)
        if not self.estimator or not self.resampling:
            raise ValueError(f"Claim {self.claim}: state its estimator and resampling unit "
                             f"(got {self.estimator!r}, {self.resampling!r})")
        if not resampling_ok(self.resampling):
            raise ValueError(f"Claim {self.claim}: resampling unit {self.resampling!r}; known: {', '.join(UNITS)}")
        self.verdict = judge(self.rule, self.measured, self.lo, self.hi, self.params)

    def row(self, notebook: str) -> dict:
        d = asdict(self)
        d["params"] = json.dumps(self.params, sort_keys=True)
        d["rule_text"] = rule_text(self.rule, self.params)
        d["notebook"] = notebook
        return d

    def line(self) -> str:
        """One printed line for the notebook's reading."""
        ci = "" if is_nan(self.lo) else f" [{self.lo:+.3g}, {self.hi:+.3g}]"
        return (f"{self.figure} {self.statement} (paper: {self.paper}): {self.measured:+.3g}{ci} {self.unit}, "
                f"n = {self.n} ({self.estimator}; unit: {self.resampling}) -> {self.verdict.upper()}  "
                f"[rule: {rule_text(self.rule, self.params)}]"
                + (f"\n    {self.detail}" if self.detail else ""))


def cite(claims: list[Claim], claim_id: str, scale: float = 1.0, fmt: str = "+.3g") -> str:
    """One claim of `claims` for a sentence of a notebook's reading: "m [lo, hi] (verdict)", the numbers
    times `scale` (100 for points), so no reading types a number that goes stale on another profile."""
    c = next((c for c in claims if c.claim == claim_id), None)
    if c is None:
        raise KeyError(f"no claim {claim_id!r} among {[c.claim for c in claims]}")
    ci = "" if is_nan(c.lo) else f" [{scale * c.lo:{fmt}}, {scale * c.hi:{fmt}}]"
    return f"{scale * c.measured:{fmt}}{ci} ({c.verdict})"


# estimators with a minimum n of their own (a substring of the estimator -> the least n that gives an interval)
MIN_N = {"batches, then groups": 5}   # the thesis rows' two-stage bootstrap (thesis.MIN_BATCHES)


def can_pass(rule: str, params: dict, n: int, estimator: str) -> tuple[bool, str]:
    """Whether a rule can read "reproduced" at its n with its estimator, given the best outcome the
    data could have: (True, "") or (False, why, with the n that would be needed where one exists).
    - construction: never "reproduced" by design (it reports "holds by construction"): exempt.
    - exact: every pair of counts (0..n, 0..n_ref) is tried.
    - Clopper–Pearson: every count k = 0..n is tried with its exact interval.
    - a point estimator (no interval): only with point_ok.
    - t intervals and bootstraps need at least 2 units (n = 1 has no spread: a t interval is
      undefined and a bootstrap of one unit is that unit); OLS at least 3 rows; an estimator in
      `MIN_N` at least its own n (the thesis rows' batch-then-group bootstrap: 5 batches).
    - all_of: every part must be able to pass.
    The bound of a continuous measure is not known here: beyond these, a rule is taken to be able to
    pass (the interval can sit anywhere)."""
    p = dict(params)
    est = str(estimator)
    if rule in ("construction", "null_control"):   # never "reproduced" by design
        return True, ""
    if rule == "null_test":
        ok = 1 / (p["K"] + 1) <= p.get("alpha", 0.025)
        return (True, "") if ok else (False, f"a permutation null of K = {p['K']} shuffles cannot reach p ≤ "
                                             f"{p.get('alpha', 0.025):g} (needs K ≥ {math.ceil(1 / p.get('alpha', 0.025)) - 1})")
    if rule == "thesis_verdict":
        bad = [(name, why) for name, r, _, _, _, pp in p["cancellation"] + p["credit"]
               for ok, why in [can_pass(r, {k: v for k, v in pp.items() if k not in ("specific_share", "size_share")},
                                        n, estimator if r != "null_test" else "permutation")] if not ok]
        return (False, "; ".join(f"{name}: {why}" for name, why in bad)) if bad else (True, "")
    if rule == "all_of":
        bad = [(name, why) for name, r, _, _, _, pp in p["parts"] for ok, why in [can_pass(r, pp, n, estimator)] if not ok]
        return (False, "; ".join(f"{name}: {why}" for name, why in bad)) if bad else (True, "")
    need = next((k for key, k in MIN_N.items() if key in est), None)
    if need is not None and n < need:
        return False, f"{est} over n = {n} gives no interval (needs at least {need})"
    if rule == "exact":
        k_max, r_max = p["n"], p["n_ref"]
        if any(exact(math.nan, math.nan, math.nan, k, k_max, j, r_max, p.get("sign", -1), p.get("alpha", 0.05))
               == REPRODUCED for k in range(k_max + 1) for j in range(r_max + 1)):
            return True, ""
        return False, (f"Fisher's exact test at {k_max} vs {r_max} runs cannot reach p ≤ {p.get('alpha', 0.05):g} "
                       "even at the most extreme counts")
    if "Clopper" in est:
        if any(RULES[rule](k / n, *clopper_pearson(k, n), **p) == REPRODUCED for k in range(n + 1)) if n > 0 else False:
            return True, ""
        need = next((m for m in range(max(n, 1) + 1, 1000)
                     if any(RULES[rule](k / m, *clopper_pearson(k, m), **p) == REPRODUCED for k in range(m + 1))), None)
        return False, (f"a Clopper–Pearson interval over {n} runs cannot pass '{rule_text(rule, p)}' at any count"
                       + (f"; it needs at least {need}" if need else ""))
    if est.startswith("point"):
        return (True, "") if p.get("point_ok") else (False, "no interval, and the rule does not decide on the point")
    if "OLS" in est:
        return (True, "") if n >= 3 else (False, f"OLS over {n} rows has no interval (needs at least 3)")
    if n < 2:
        return False, f"{est} over n = {n} has no spread, so no interval (needs at least 2)"
    return True, ""


def resampling_ok(resampling: str) -> bool:
    """A known unit, or known units (not "none") joined by " × " (a multi-stage bootstrap)."""
    parts = str(resampling).split(" × ")
    return resampling in UNITS or (len(parts) > 1 and all(p in UNITS and p != "none" for p in parts))


def verdict_of(row) -> str:
    """The verdict recomputed from a stored row's numbers and rule."""
    return judge(row["rule"], row["measured"], row["lo"], row["hi"], json.loads(row["params"]))


class ClaimsError(ValueError):
    """An unusable registry or README; the message is one line naming the file."""


def read_registry(path) -> pd.DataFrame:
    """A claims.parquet; ClaimsError naming the file when it is truncated or not a registry."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such claims registry")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        why = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e).strip() else type(e).__name__
        raise ClaimsError(f"{path}: unreadable claims registry ({why})") from e
    for c in LATER_COLUMNS:  # a registry written before these columns: its rows state them when re-recorded
        if c not in df.columns and any(k in df.columns for k in COLUMNS[:3]):
            df[c] = ""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ClaimsError(f"{path}: not a claims registry (missing columns {missing})")
    return df


def record(results_dir, notebook: str, claims: list[Claim]) -> pd.DataFrame:
    """Replace `notebook`'s rows of <results_dir>/claims.parquet with `claims`.

    The read-modify-write runs under `cache.lock` on the registry (a second notebook recording at
    the same time waits), and the write is atomic (readers see the old table or the new one).
    """
    path = Path(results_dir) / "claims.parquet"
    left_out = []  # a row that cannot pass at its n tests nothing: not recorded, one printed line says why
    for c in claims:
        ok, why = can_pass(c.rule, c.params, c.n, c.estimator)
        if not ok:
            left_out.append(f"not recorded: {c.claim} ({c.figure}: {c.statement}) cannot pass at n = {c.n}: {why}")
    claims = [c for c in claims if can_pass(c.rule, c.params, c.n, c.estimator)[0]]
    new = pd.DataFrame([c.row(notebook) for c in claims], columns=COLUMNS)
    ids = new.claim.tolist()
    if len(set(ids)) != len(ids):
        raise ValueError(f"record({notebook}): duplicate claim ids {sorted({i for i in ids if ids.count(i) > 1})}")
    with cache.lock(path):
        old = read_registry(path) if path.exists() else pd.DataFrame(columns=COLUMNS)
        old = old[old.notebook != notebook]
        out = pd.concat([old, new], ignore_index=True) if len(old) else new
        out = out.sort_values(["notebook"], kind="stable").reset_index(drop=True)
        cache.write_table(out[COLUMNS], path)
    for c in claims:
        print(c.line())
    for line in left_out:
        print(line)
    return out


def thesis_reading(rows: dict) -> list[str]:
    """The thesis in words, built from the rows (id without the prefix -> a row with verdict, measured, lo, hi,
    params, detail): per definition of 'shared', the verdict by the rule fixed before the run, its two parts with
    their numbers, and the null control; then the refutation and the mechanism. README's sentences under the
    thesis table (never hand-typed)."""
    def cite(k, fmt="+.3g"):
        r = rows[k]
        ci = "" if is_nan(r.lo) else f" [{r.lo:{fmt}}, {r.hi:{fmt}}]"
        return f"{r.measured:{fmt}}{ci}"

    def params(r):
        return r.params if isinstance(r.params, dict) else json.loads(r.params)

    def vs_null(k):
        r = rows[k]
        p = params(r)
        return (f"{r.measured:+.3g} against the null's {p['median']:+.3g} [{p['band_lo']:+.3g}, {p['band_hi']:+.3g}], "
                f"p = {p['p_paper']:.3f} ({r.verdict})")
    out = []
    for sfx, name in (("", "the same token id"), ("_ctx", "the same id after the same preceding tokens")):
        v = rows.get(f"verdict{sfx}")
        if v is None:
            continue
        p = params(v)
        c, s = part_verdict(p["cancellation"]), part_verdict(p["credit"])
        line = [f"- **'Shared' = {name}: the thesis is {v.verdict}** (decided by {deciding_part(p)})."]
        k1, k2 = f"pos_diffstate_cancellation{sfx}", f"pos_diffstate_retained{sfx}"
        if k1 in rows and k2 in rows:
            line.append(f"Cancellation on shared A>0 tokens at another state than any opposite-sign copy's: "
                        f"{cite(k1)} per token, retained share {cite(k2, '.2f')}: **{c}**.")
        share = params(rows[f"pos_contrast{sfx}"]).get("specific_share") if f"pos_contrast{sfx}" in rows else None
        if s == NOT_DECIDABLE and share is not None:
            line.append(f"Success-specific credit: **not decidable** (the specific class is {share:.1%} of a pool: "
                        "nearly every token is shared under this definition).")
        elif f"pos_contrast_vs_null{sfx}" in rows:
            line.append(f"Success-specific credit against sign shuffles within groups: contrast "
                        f"{vs_null(f'pos_contrast_vs_null{sfx}')}; amplification "
                        f"{vs_null(f'pos_amplification_vs_null{sfx}')}: **{s}**.")
        n = rows.get(f"null_cancellation{sfx}")
        if n is not None:
            line.append(f"Null control: under shuffled signs the same cancellation is {cite(f'null_cancellation{sfx}')} "
                        f"({n.verdict}).")
        out.append(" ".join(line))
    out += _plain_words(rows, params)
    for k, what in (("copies_vs_random", "Masking the opposite-sign copies against random masks of the same size drawn "
                     "among the other A<0 tokens (the refutation test)"),
                    ("mech_same_id_share", "The same-id share of the opposite-sign first-order coupling (Eq. 9)"),
                    ("mech_fo_cancellation", "What those opposite-sign first-order terms net to per shared A>0 token "
                     "(same-id terms lower it, other ids raise it)")):
        if k in rows:
            r = rows[k]
            extra = ""
            if r.verdict == NOT_DECIDABLE and "size_share" in params(r):
                extra = (f": the random masks disjoint from the copies reach {params(r)['size_share']:.1%} of their "
                         "size (the other A<0 tokens are too few on this task)")
            out.append(f"- {what}: " + (f"{r.verdict}{extra}." if is_nan(r.measured) else f"{cite(k)} ({r.verdict}{extra})."))
    return out


def _plain_words(rows: dict, params) -> list[str]:
    """One line in plain words, from the decisive definition's rows (in context): which part of the thesis the
    rows support and which they do not."""
    v = rows.get("verdict_ctx")
    if v is None:
        return []
    canc, cred = part_verdict(params(v)["cancellation"]), part_verdict(params(v)["credit"])
    ctrl = rows.get("null_cancellation_ctx")
    names = {"pos_contrast_vs_null_ctx": "the A>0 contrast", "pos_amplification_vs_null_ctx": "the A>0 amplification",
             "neg_contrast_vs_null_ctx": "the A<0 contrast", "neg_amplification_vs_null_ctx": "the A<0 amplification"}
    beyond = [w for k, w in names.items() if k in rows and rows[k].verdict == REPRODUCED]
    inside = [w for k, w in names.items() if k in rows and rows[k].verdict == NOT_REPRODUCED]
    line = ("- **In plain words** (in context): shared tokens at other states than their copies' "
            + ("do lose reinforcement under GRPO" if canc == REPRODUCED else "do not clearly lose reinforcement"
               if canc != NOT_REPRODUCED else "do not lose reinforcement") + "; ")
    if ctrl is not None and ctrl.verdict == NULL_PASSES:
        line += "but signs shuffled within groups make them lose as much or more, so this cancellation is not about success. "
    line += ("Beyond what shuffled signs give: " + (", ".join(beyond) if beyond else "nothing")
             + ("; no different from shuffled signs: " + ", ".join(inside) if inside else "") + f" (credit part: {cred}).")
    return [line]
