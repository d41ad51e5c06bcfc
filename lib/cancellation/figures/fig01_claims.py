"""Notebook 01's claim rows (Fig. 1, Fig. 9 and §1's sign reading), read off a `fig01.Result` (the
runs and tables live in `fig01.py`). Intervals over training steps are Student-t intervals of the
per-step quantity unless a row says otherwise."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import claims as C
from .. import stats as S
from .. import thesis
from .fig01 import Params, Result, opposite_share, signed_mean_gap


TS = dict(estimator="t over steps", resampling="step")  # every row of notebook 01: a Student-t interval over steps


def _claim(*a, **k) -> C.Claim:
    return C.Claim(*a, **TS, **k)


def _drop_claim(fractions: pd.DataFrame, cid: str, label: str, what: str = "") -> C.Claim:
    sp = fractions[(fractions.sign == "pos") & (fractions.status == "suppressed")].pivot(
        index="step", columns="run", values="fraction")
    return _claim(cid, label, f"flipping largely disappears under positive-only training{what}", "large drop",
                   *S.t_interval(1 - sp["positive_only"] / sp["grpo"]), n=len(sp),
                   unit="relative drop of suppressed share in A>0 rollouts", rule="direction",
                   params=dict(sign=1, ref=0.5), detail=f"suppressed share in A>0 rollouts "
                   f"{100 * sp['grpo'].mean():.1f}% → {100 * sp['positive_only'].mean():.1f}% (mean over steps)")


def control_drop(R: Result) -> C.Claim | None:
    """Fig. 1(d)'s claim on the fixed-scaffold control's runs (None without a control)."""
    if R.control is None:
        return None
    return _drop_claim(R.control, "fig01_d_drop_fixed_scaffold", "Fig. 1(d), fixed-scaffold control",
                       " (fixed scaffold)")


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Intervals over training steps are Student-t intervals of the per-step quantity (steps share
    the policy's trajectory, so they are a rough guide, not independent draws)."""
    signed, frac, share, per_step = R.signed, R.frac, R.share, R.per_step
    n_steps = len(R.boosted_gap("grpo"))
    mag = R.magnitude()
    g = signed[signed.run == "grpo"].assign(a=lambda x: x.delta.abs())
    step_mag = g.groupby(["step", "sign"]).a.agg(["median", "mean"]).unstack("sign")
    supp = frac[(frac.sign == "pos") & (frac.status == "suppressed")].pivot(index="step", columns="run",
                                                                            values="fraction")
    conf = signed.prob >= 0.9
    rows = [
        _claim("fig01_ab_boosted", "Fig. 1(a,b)", "positive and negative rollouts have similar boosted shares",
                "similar", *S.t_interval(per_step("grpo", "boosted")), n=n_steps, unit="pts (pos − neg)",
                rule="similar", params=dict(tol=10), detail=f"boosted {share('grpo', 'pos', 'boosted')} vs "
                f"{share('grpo', 'neg', 'boosted')} (mean ± s.d. over steps)"),
        _claim("fig01_ab_suppressed", "Fig. 1(a,b)", "positive and negative rollouts have similar suppressed shares",
                "similar", *S.t_interval(per_step("grpo", "suppressed")), n=n_steps, unit="pts (pos − neg)",
                rule="similar", params=dict(tol=10), detail=f"suppressed {share('grpo', 'pos', 'suppressed')} vs "
                f"{share('grpo', 'neg', 'suppressed')}"),
        _claim("fig01_ab_boosted_uncertain", "Fig. 1(a,b), p < 0.9", "similar boosted shares among uncertain tokens",
                "similar", *S.t_interval(per_step("grpo", "boosted", ~conf)), n=n_steps, unit="pts (pos − neg)",
                rule="similar", params=dict(tol=10), detail=f"{100 * R.uncertain_share:.1f}% of tokens have p < 0.9"),
        _claim("fig01_ab_boosted_confident", "Fig. 1(a,b), p ≥ 0.9", "similar boosted shares among confident tokens",
                "similar", *S.t_interval(per_step("grpo", "boosted", conf)), n=n_steps, unit="pts (pos − neg)",
                rule="similar", params=dict(tol=10),
                detail=f"median |Δ| of confident tokens {g[g.prob >= 0.9].a.median():.1e} (ε = {P.eps:g})"),
        _claim("fig01_c_median", "Fig. 1(c)", "similar |Δlog p| for both signs (median)", "similar",
                *S.t_interval(np.log10(step_mag["median"]["neg"] / step_mag["median"]["pos"])), n=len(step_mag),
                unit="log10(neg/pos)", rule="similar", params=dict(tol=0.3),
                detail=f"median {mag['median'].get('pos', np.nan):.1e} vs {mag['median'].get('neg', np.nan):.1e}"),
        _claim("fig01_c_mean", "Fig. 1(c)", "similar |Δlog p| for both signs (mean)", "similar",
                *S.t_interval(np.log10(step_mag["mean"]["neg"] / step_mag["mean"]["pos"])), n=len(step_mag),
                unit="log10(neg/pos)", rule="similar", params=dict(tol=0.3),
                detail=f"mean {mag['mean'].get('pos', np.nan):.1e} vs {mag['mean'].get('neg', np.nan):.1e}"),
        _claim("fig01_d_drop", "Fig. 1(d)", "flipping largely disappears under positive-only training",
                "large drop", *S.t_interval(1 - supp["positive_only"] / supp["grpo"]), n=len(supp),
                unit="relative drop of suppressed share in A>0 rollouts", rule="direction", params=dict(sign=1, ref=0.5),
                detail=f"suppressed in A>0 rollouts {share('grpo', 'pos', 'suppressed')} → "
                f"{share('positive_only', 'pos', 'suppressed')}; A<0 rollouts boosted under positive-only "
                f"{share('positive_only', 'neg', 'boosted')}"),
    ]
    opp = opposite_share(signed[signed.run == "grpo"])
    moving = signed[(signed.run == "grpo") & (signed.status != "stable")]
    rows.append(_claim("fig01_nearly_half_opposite", "§1 (Fig. 1(a,b))",
                       "nearly half of the tokens move opposite to their rollout's advantage sign", "nearly half",
                       *S.t_interval(opp["all"]), n=len(opp), unit="% of A ≠ 0 tokens moving against A",
                       rule="similar", params=dict(target=45, tol=5),
                       detail=f"suppressed in A>0 rollouts {opp['pos'].mean():.1f}%, boosted in A<0 rollouts "
                       f"{opp['neg'].mean():.1f}% (means over steps); among tokens that move (|Δ| > ε) "
                       f"{opposite_share(moving)['all'].mean():.1f}%; 'nearly half' read as 40–50%"))
    rows.append(_claim("fig01_signed_mean", "§1 (Fig. 1(c)), signed", "the update still favours positive rollouts: "
                       "mean Δlog p of their tokens above that of negative rollouts' tokens", "implied",
                       *S.t_interval(signed_mean_gap(signed, "grpo")), n=n_steps, unit="mean Δlog p, pos − neg",
                       rule="direction", params=dict(sign=1),
                       detail="similar shares and magnitudes (a–c) do not mean the signs are ignored; per step, "
                       "mean over the A ≠ 0 tokens of each sign"))
    rows.append(sign_prediction_claim(signed, P))
    if R.sgd_steps is not None:
        rows += _sgd_claims(R, P)
    if R.control is not None:
        rows.append(control_drop(R))
    own = fig9_own_runs(P)
    for name, d in R.fig9[R.fig9.status == "boosted"].groupby("model", sort=False):
        if name not in own:   # Fig. 1's run again (its first fig9_steps steps): fig01_ab_boosted tests it
            continue
        p = d.pivot(index="step", columns="sign", values="fraction")
        rows.append(_claim(f"fig09_{name}", "Fig. 9", f"{name}: similar boosted shares for both signs", "all models",
                            *S.t_interval(100 * (p["pos"] - p["neg"])), n=len(p), unit="pts (pos − neg)",
                            rule="similar", params=dict(tol=10),
                            detail=f"a GRPO run of its own, {P.fig9_steps} steps; Fig. 9's models with a run of "
                            f"their own: {', '.join(own)} (the notebook's Fig. 9 line says what 'across models' needs)"))
    return rows


def fig9_own_runs(P: Params) -> list[str]:
    """The Fig. 9 models (names) with a run of their own: the profile's model_path is Fig. 1's run reused
    (its first fig9_steps steps, as compute() builds fig9), so its panel tests nothing fig01_ab_boosted does not."""
    return [Path(m).name for m in P.models if not (m == P.model_path and P.fig9_steps <= P.steps)]


def fig9_scope(P: Params, paper_profile: dict) -> str:
    """One line: which of Fig. 9's policies have a run of their own, and whether that can test "across
    models" (two or more runs of their own besides Fig. 1's: three models, as the paper's Fig. 9);
    `paper_profile`: the paper profile's YAML (`profiles.load_profile("paper")`), whose `models` it names."""
    paper_models = {**(paper_profile.get("common") or {}), **(paper_profile.get("01_token_flipping") or {})}.get(
        "models", [])
    own = fig9_own_runs(P)
    reused = [Path(m).name for m in P.models if Path(m).name not in own]
    line = (f"Fig. 9 here: {len(P.models)} polic{'y' if len(P.models) == 1 else 'ies'} "
            f"({', '.join(Path(m).name for m in P.models)})"
            + (f"; {', '.join(reused)} is Fig. 1's own run (its first {P.fig9_steps} steps: fig01_ab_boosted)"
               if reused else "") + f"; {len(own)} with a run of its own")
    if len(own) >= 2:   # with Fig. 1's run, three models or more: the paper's Fig. 9 has three
        return line + ": the fig09_<model> rows (and fig01_ab_boosted) test 'across models' model by model"
    return (line + f": too few to test 'across models' (the paper's Fig. 9 has three; each fig09_ row speaks for its "
            f"model only); the paper profile runs {len(paper_models)}: {', '.join(str(m) for m in paper_models)}")


SIGN_PREDICTION_REF = 0.75   # 'poor': closer to chance (0.5) than to a perfect predictor (1)


def sign_prediction_cells(signed: pd.DataFrame, run: str = "grpo") -> pd.DataFrame:
    """Per (step, group) of `run`, among the A ≠ 0 tokens that move (|Δ| > ε): the tokens of A > 0
    rollouts (`pos`) and how many were boosted (`pos_right`), of A < 0 rollouts (`neg`) and how many were
    suppressed (`neg_right`): what sign(A) gets right as a predictor of sign(Δlog p)."""
    d = signed[(signed.run == run) & (signed.status != "stable")]
    pos, neg = d.sign == "pos", d.sign == "neg"
    return pd.DataFrame({"step": d.step, "group": d.group, "pos": pos, "pos_right": pos & (d.status == "boosted"),
                         "neg": neg, "neg_right": neg & (d.status == "suppressed")}).groupby(
        ["step", "group"]).sum().astype(float).reset_index()


def balanced_accuracy(c: pd.DataFrame, W=None) -> np.ndarray:
    """½ (boosted share of A > 0 movers + suppressed share of A < 0 movers) of the cells `c`, once per row
    of the cell multiplicities W (default: every cell once); chance is 0.5 whatever the base rates."""
    W = np.ones((1, len(c))) if W is None else W
    with np.errstate(invalid="ignore", divide="ignore"):
        return 0.5 * (W @ c.pos_right.to_numpy() / (W @ c.pos.to_numpy())
                      + W @ c.neg_right.to_numpy() / (W @ c.neg.to_numpy()))


def sign_prediction_claim(signed: pd.DataFrame, P: Params, run: str = "grpo", n_boot: int = 2000) -> C.Claim:
    """§1: "the rollout-level advantage sign is a poor predictor for token-level updates". The balanced
    accuracy of sign(A) for sign(Δlog p) among the tokens that move, with a two-stage cluster bootstrap
    (steps, then prompt groups within a step: tokens of one rollout, rollouts of one prompt are not
    independent draws)."""
    c = sign_prediction_cells(signed, run)
    m = float(balanced_accuracy(c)[0])
    reps = balanced_accuracy(c, thesis.cluster_weights(c.step.to_numpy(), n_boot, seed=0))
    ok = reps[np.isfinite(reps)]
    lo, hi = np.quantile(ok, [0.025, 0.975]) if len(ok) >= 0.95 * n_boot else (np.nan, np.nan)  # a sign that never moves
    tot = c[["pos", "pos_right", "neg", "neg_right"]].sum()
    moving = signed[(signed.run == run) & (signed.status != "stable")]
    acc = (tot.pos_right + tot.neg_right) / (tot.pos + tot.neg)
    return C.Claim("fig01_sign_predicts_update", "§1 (Fig. 1(a,b))", "the rollout-level advantage sign is a poor "
                   "predictor of token-level updates", "poor (nearly half move against A)", m, lo, hi, n=len(c),
                   unit="balanced accuracy of sign(A) for sign(Δlog p), tokens with |Δ| > ε", rule="direction",
                   params=dict(sign=-1, ref=SIGN_PREDICTION_REF, refutes="the CI lies above 0.75: sign(A) gets "
                               "most token moves right"),
                   estimator=f"percentile two-stage cluster bootstrap ({n_boot} draws: steps, then prompt groups "
                   "within a step)", resampling="step × group",
                   detail=f"A>0 movers boosted {100 * tot.pos_right / tot.pos:.1f}%, A<0 movers suppressed "
                   f"{100 * tot.neg_right / tot.neg:.1f}%; plain accuracy {100 * acc:.1f}% vs "
                   f"{100 * (moving.status == 'boosted').mean():.1f}% for 'every token is boosted', which ignores A; "
                   f"{len(c)} (step, group) cells over {c.step.nunique()} steps; 'poor' = below "
                   f"{SIGN_PREDICTION_REF:g}, closer to chance (0.5) than to perfect (1); fig01_ab_boosted is the "
                   "boosted-share gap with stable tokens counted")


def _sgd_claims(R: Result, P: Params) -> list[C.Claim]:
    """Fig. 1(a,b)'s rows again on the SGD run (App. D.2's optimizer): Adam's first steps move every
    weight by about ±lr, which could equalise the shares by itself. Read off `R.sgd_steps` (fig01.run_steps)."""
    s = R.sgd_steps
    n = len(s)   # the run's steps (every step with A ≠ 0 tokens)
    label = f"Fig. 1(a,b), SGD lr {P.sgd_lr:g}"
    rows = [_claim(f"fig01_ab_{st}_sgd", label, f"similar {st} shares for both signs (SGD run)", "similar",
                   *S.t_interval(s[st]), n=n, unit="pts (pos − neg)", rule="similar",
                   params=dict(tol=10), detail=f"{st} {R.share('grpo_sgd', 'pos', st)} vs "
                   f"{R.share('grpo_sgd', 'neg', st)} (mean ± s.d. over steps); the Adam run: fig01_ab_{st}")
            for st in ("boosted", "suppressed")]
    rows.append(_claim("fig01_ab_boosted_uncertain_sgd", label + ", p < 0.9", "similar boosted shares among "
                       "uncertain tokens (SGD run)", "similar", *S.t_interval(s.boosted_uncertain),
                       n=n, unit="pts (pos − neg)", rule="similar", params=dict(tol=10)))
    rows.append(_claim("fig01_nearly_half_opposite_sgd", "§1, SGD run", "nearly half of the tokens move opposite "
                       "to their rollout's advantage sign (SGD run)", "nearly half", *S.t_interval(s.opposite),
                       n=n, unit="% of A ≠ 0 tokens moving against A", rule="similar",
                       params=dict(target=45, tol=5),
                       detail=f"suppressed in A>0 rollouts {s.opposite_pos.mean():.1f}%, boosted in A<0 rollouts "
                       f"{s.opposite_neg.mean():.1f}%"))
    rows.append(_claim("fig01_signed_mean_sgd", "§1 (Fig. 1(c)), signed, SGD run", "the SGD update favours positive "
                       "rollouts: mean Δlog p of their tokens above that of negative rollouts' tokens", "implied",
                       *S.t_interval(s.signed_mean_gap), n=n, unit="mean Δlog p, pos − neg",
                       rule="direction", params=dict(sign=1)))
    return rows
