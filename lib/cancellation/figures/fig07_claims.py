"""Notebook 07's claim rows (Table 2, the lr sweep, the fair controls, Eq. 14, §4's drift and cross-sign
coupling) and its reading, read off a `fig07.Result`: `claims(R, P)` gives the rows whose rule can pass at the
profile's n, `undecidable(R, P)` says which were left out and why; the text the notebook prints (`summary`,
`table2_summary`, `table2_shown` / `table2_html`, `sweep_shown`, `sign_pure_reading`, `equal_rollouts`,
`cross_check`, `versus_random`) is written here from the Result's numbers, so a wording change recomputes
nothing. The runs and tables live in `fig07.py`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import claims as C
from .. import engine as rl_engine
from .. import stats as ST
from .. import strategies
from .fig07 import Params, Result, coverage_line, scatter_vs_qb


PAIRED_T = dict(estimator="paired t over seeds", resampling="seed")
CP = dict(estimator="Clopper–Pearson", resampling="run")
FISHER = dict(estimator="Fisher's exact test, one-sided (counts in params; no interval)", resampling="run")


def nonzero_share(iters: pd.DataFrame) -> pd.Series:
    """Per strategy: the share of the rollouts of its updates that carry A ≠ 0 (n_pos + n_neg over the
    rollouts of every iteration that updated); zero-variance groups carry A = 0."""
    u = iters[iters.updated.astype(bool)]
    share = (u.n_pos + u.n_neg).groupby(u.strategy).sum() / u.n_rollouts.groupby(u.strategy).sum()
    filtered = [s for s in share.index if s in strategies.STRATEGIES and strategies.STRATEGIES[s].filtered]
    share[filtered] = 1.0  # its plan drops the A = 0 rows: they are sampled, never in an update
    return share


def caveats(R: Result, P: Params, name: str) -> str:
    """What a Table 2 row's number also rests on, beside it: the rollouts it sampled against the
    baseline's, the share of its update rows with A ≠ 0, its own and the baseline's collapsed runs, and
    the paired difference without the seeds where the baseline collapsed."""
    fa, thr = R.final_avg, 0.5 * R.start / 100
    t2 = R.table2.set_index("strategy")
    nz = nonzero_share(R.iters)
    out = [f"{t2.rollouts_sampled[name] / t2.rollouts_sampled['random']:.1f}× the baseline's rollouts",
           f"A ≠ 0 on {100 * nz.get(name, np.nan):.0f}% of update rows vs {100 * nz.get('random', np.nan):.0f}%",
           f"collapsed {int((fa[name] < thr).sum())}/{len(fa)} (baseline {int((fa['random'] < thr).sum())}/{len(fa)})"]
    keep = fa["random"] >= thr
    if (~keep).any() and keep.sum() >= 2:
        m, lo, hi = ST.t_interval(100 * (fa[name] - fa["random"])[keep])
        out.append(f"without the seeds where the baseline collapsed: {m:+.1f} [{lo:+.1f}, {hi:+.1f}] (n = {int(keep.sum())})")
    return "; ".join(out)


# A strategy is unstable when its share of collapsed runs (final average below half the start) has a
# 95% Clopper-Pearson interval above this rate: more than one run in ten. One collapsed run of ten
# (interval [0.003, 0.45]) is then inconclusive, never "unstable"; ten runs need four collapses.
COLLAPSE_RATE = 0.1


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Notebook 07's claim rows, without those that cannot pass at their n (`undecidable` says which)."""
    return [c for c in _all_claims(R, P) if C.can_pass(c.rule, c.params, c.n, c.estimator)[0]]


def undecidable(R: Result, P: Params) -> str:
    """One line per claim left out because its rule cannot pass at the runs this profile has."""
    out = []
    for c in _all_claims(R, P):
        ok, why = C.can_pass(c.rule, c.params, c.n, c.estimator)
        if not ok:
            out.append(f"{c.claim} ({c.statement}): not recorded at this profile's n = {c.n}: {why}")
    return "\n".join(out) if out else "every claim can pass at its n"


def drift_row(R: Result, P: Params) -> list[C.Claim]:
    """§4's optimization drift: later mini-batches of an iteration see ρ ≠ 1 (the policy moved). Per
    seed, the mean |ρ − 1| of random's last mini-batch step over iterations."""
    m = R.minibatches
    if m is None or not len(m) or "random" not in set(m.strategy) or m.minibatch.max() < 1:
        return []
    last = m[m.minibatch == m.minibatch.max()]
    per = last[last.strategy == "random"].groupby("seed").ratio_dev.mean()
    by = last.groupby("strategy")
    return [C.Claim("sec4_drift", f"§4 optimization drift ({per.size} seeds x {P.iterations} iterations)",
                    "later mini-batches use shifted importance ratios (the policy drifts within an iteration)",
                    "present", *ST.t_interval(per), n=per.size, unit="mean |ρ − 1| at the last mini-batch step, random",
                    rule="construction", params=dict(sign=1, ref=0.0, why="|ρ − 1| ≥ 0, and > 0 after any step with "
                                                      "lr > 0; the size is the finding"),
                    estimator="t over seeds (each the mean over iterations)", resampling="seed",
                    detail="mean |ρ − 1| at the last mini-batch step: " + ", ".join(
                        f"{s_} {v:.4f}" for s_, v in by.ratio_dev.mean().items())
                    + f"; the clip binds on {100 * last[last.strategy == 'random'].clipfrac.mean():.1f}% of random's "
                    "tokens there")]


def _all_claims(R: Result, P: Params) -> list[C.Claim]:
    rows, fa, start, sweep = [], R.final_avg, R.start, R.sweep
    T2 = f"Table 2 ({len(P.seeds)} seeds x {P.iterations} iterations)"  # the run size, in the claim's figure column
    T2_SWEEP = f"Table 2, lr sweep ({len(P.probe_seeds)} seeds x {P.iterations} iterations)"
    for name, sign, stmt in (("QB+RB", 1, "QB+RB beats the baseline"), ("QB", 1, "QB beats the baseline"),
                             ("RB", 1, "RB beats the baseline"), ("sign_partitioned", -1, "sign partitioning hurts")):
        if name in fa and "random" in fa:
            d = 100 * (fa[name] - fa["random"])
            rows.append(C.Claim(f"table2_{name}", T2, stmt, "yes", *ST.t_interval(d), n=len(d),
                                unit="pts vs random (paired)", rule="direction", params=dict(sign=sign), **PAIRED_T,
                                detail=f"final average {100 * fa[name].mean():.1f}% vs random "
                                f"{100 * fa['random'].mean():.1f}%; " + caveats(R, P, name)))
    if "QB+RB" in fa and "RB" in fa:  # the paper's best strategy against its strongest single intervention
        d = 100 * (fa["QB+RB"] - fa["RB"])
        rows.append(C.Claim("table2_QB+RB_vs_RB", T2, "QB+RB does at least as well as RB (the best row)", "yes",
                            *ST.t_interval(d), n=len(d), unit="pts QB+RB − RB (paired)", rule="direction",
                            params=dict(sign=1), **PAIRED_T,
                            detail=f"final average {100 * fa['QB+RB'].mean():.1f}% vs RB {100 * fa['RB'].mean():.1f}%"))
    rows += _fair_baselines(R, P, T2)
    rows += _imbalance_rows(R, P)
    rows += drift_row(R, P)
    if "random" in fa:
        k = int((fa["random"] < 0.5 * start / 100).sum())
        r, lo, hi, n = ST.proportion(fa["random"] < 0.5 * start / 100)
        others = ", ".join(f"{s} {int((fa[s] < 0.5 * start / 100).sum())}/{len(fa)}" for s in fa if s != "random")
        rows.append(C.Claim("table2_baseline_collapse", T2, "the baseline is unstable (collapses)", "yes",
                            r, lo, hi, n=n, unit="share of baseline runs collapsed", rule="direction",
                            params=dict(sign=1, ref=COLLAPSE_RATE), **CP,
                            detail=f"{k}/{n} collapsed at lr {P.lr:g} (final average below half the start); unstable "
                            f"means more than {COLLAPSE_RATE:g} of runs; the other strategies: {others}"))
    for r_ in (P.probe_lrs if len(sweep) else []):
        at = sweep[sweep.lr == r_].pivot(index="seed", columns="strategy", values="final")
        if "random" in at:
            k = int(sweep[(sweep.lr == r_) & (sweep.strategy == "random")].collapsed.sum())
            pr, lo, hi, n = ST.proportion(sweep[(sweep.lr == r_) & (sweep.strategy == "random")].collapsed)
            rows.append(C.Claim(f"table2_baseline_collapse_lr{r_:g}", T2_SWEEP, f"the baseline collapses at lr {r_:g}",
                                "yes", pr, lo, hi, n=n, unit="share of baseline runs collapsed", rule="direction",
                                params=dict(sign=1, ref=COLLAPSE_RATE), **CP,
                                detail=f"{k}/{n} collapsed (unstable: more than {COLLAPSE_RATE:g} of runs)"))
        for name in ("QB", "RB", "QB+RB"):   # the paper: QB and RB each mitigate instability, QB+RB the most
            rows += _sweep_rows(sweep[sweep.lr == r_], name, r_, T2_SWEEP)
    return rows


def _sweep_rows(sw: pd.DataFrame, name: str, lr: float, label: str) -> list[C.Claim]:
    """Strategy `name` against the baseline at one lr of the stability sweep (`sw`: its rows): collapses
    compared by Fisher's exact test, and the paired final accuracy."""
    col = sw.pivot(index="seed", columns="strategy", values="collapsed")
    at = sw.pivot(index="seed", columns="strategy", values="final")
    if name not in col or "random" not in col:
        return []
    q, b = sw[sw.strategy == name].collapsed, sw[sw.strategy == "random"].collapsed
    k, n, kb, nb = int(q.sum()), len(q), int(b.sum()), len(b)
    d = 100 * (at[name] - at["random"])
    return [C.Claim(f"table2_{name}_stable_lr{lr:g}", label, f"{name} collapses less often than the baseline at lr "
                    f"{lr:g}", f"yes ({name} stable, the baseline not)", k / n - kb / nb, n=n,
                    unit=f"share collapsed, {name} − random", rule="exact",
                    params=dict(k=k, n=n, k_ref=kb, n_ref=nb, sign=-1, alpha=0.05), **FISHER,
                    detail=f"{name} {k}/{n} collapsed, random {kb}/{nb}; one-sided p = "
                    f"{C.fisher_p(k, n, kb, nb, lower=True):.3g} (at {n} vs {nb} runs the smallest p possible is "
                    f"{C.fisher_p(0, n, nb, nb, lower=True):.3g}); replaces a Clopper–Pearson bound below "
                    f"{COLLAPSE_RATE:g}, which no count of fewer than 36 runs reaches"),
            C.Claim(f"table2_{name}_lr{lr:g}", label, f"{name} beats the baseline at lr {lr:g}", "yes",
                    *ST.t_interval(d), n=len(d), unit="pts vs random (paired)", rule="direction", params=dict(sign=1),
                    **PAIRED_T, detail=f"final average {100 * at[name].mean():.1f}% vs random "
                    f"{100 * at['random'].mean():.1f}%; {name} collapsed {int(col[name].sum())}/{len(col)} too (a win "
                    "over a collapsed baseline, not stability)")]


def _fair_baselines(R: Result, P: Params, T2: str) -> list[C.Claim]:
    """The referee's controls of RB's win: DAPO's dynamic sampling (DS: the same buffer and batch size,
    released once every group is mixed, no sign quota), the baseline with zero-variance groups dropped
    from its own batch (random+filter: a smaller update batch, so a weaker control), and RB held to the
    baseline's rollout budget. Each row says what its control shows."""
    rows, fa = [], R.final_avg
    controls = (("DS", "DAPO's dynamic sampling (sampling until the batch is full of mixed groups) beats the "
                 "baseline", "its win is more than a batch full of mixed groups: RB's sign quota adds to it"),
                ("random+filter", "the baseline's own mixed groups alone (zero-variance groups dropped, a smaller "
                 "batch) beat the baseline", "its win is more than dropping the A = 0 groups of the baseline's batch"))
    for ctl, stmt, more in controls:
        if "random" not in fa or ctl not in fa:
            continue
        d = 100 * (fa[ctl] - fa["random"])
        rows.append(C.Claim(f"table2_{ctl}", T2, stmt, "— (a control)", *ST.t_interval(d), n=len(d),
                            unit="pts vs random (paired)", rule="direction", params=dict(sign=1), **PAIRED_T,
                            detail=f"final average {100 * fa[ctl].mean():.1f}% vs random "
                            f"{100 * fa['random'].mean():.1f}%; " + caveats(R, P, ctl)))
        suffix = "filter" if ctl == "random+filter" else ctl   # table2_RB_vs_filter: the id rows had before DS
        for name in ("RB", "QB+RB"):
            if name in fa:
                d = 100 * (fa[name] - fa[ctl])
                rows.append(C.Claim(f"table2_{name}_vs_{suffix}", T2, f"{name} beats {ctl} ({more})", "implied",
                                    *ST.t_interval(d), n=len(d), unit=f"pts vs {ctl} (paired)", rule="direction",
                                    params=dict(sign=1), **PAIRED_T,
                                    detail=f"final average {100 * fa[name].mean():.1f}% vs {ctl} "
                                    f"{100 * fa[ctl].mean():.1f}%"))
    if R.budget is not None and len(R.budget) and "random" in fa:
        t2 = R.table2.set_index("strategy")
        label = f"Table 2, equal rollouts ({len(P.seeds)} seeds x {P.iterations} iterations)"
        for name, g in R.budget.groupby("strategy", sort=False):
            b = g.set_index("seed").final
            d = 100 * (b - fa["random"].reindex(b.index))
            rows.append(C.Claim(f"table2_{name}_equal_rollouts", label, f"{name} beats the baseline at an equal "
                                "rollout budget", "yes", *ST.t_interval(d), n=len(d), unit="pts vs random (paired)",
                                rule="direction", params=dict(sign=1), **PAIRED_T,
                                detail=f"final average {100 * b.mean():.1f}% vs random "
                                f"{100 * fa['random'].reindex(b.index).mean():.1f}%; {g.rollouts_sampled.mean():.0f} "
                                f"rollouts sampled (random {t2.rollouts_sampled['random']:.0f}), "
                                f"{g.optimizer_steps.mean():.0f} optimizer steps (random "
                                f"{t2.optimizer_steps['random']:.0f}); the equal-steps row is table2_{name}"))
    return rows


def _imbalance_rows(R: Result, P: Params) -> list[C.Claim]:
    """Eq. 14 (§4, local imbalance): random mini-batches carry a nonzero S_B and lose the grouped
    update's negative cross-advantage term; whether that makes the local update larger is measured."""
    if R.imbalance is None or not len(R.imbalance):
        return []
    m = R.imbalance
    per = m.groupby(["strategy", "seed"]).mean(numeric_only=True)
    fig = f"§4 Eq. 14 ({m.seed.nunique()} seeds' first batches x {m.draw.nunique()} plan draws)"
    T = dict(estimator="t over seeds (each the mean of its plan draws)", resampling="seed")
    rows = []
    if "random" in per.index.get_level_values(0):
        r, extra = per.loc["random"], ""
        if "sign_partitioned" in per.index.get_level_values(0):
            extra = f"; sign-partitioned keeps {per.loc['sign_partitioned'].retained.mean():+.2f} (the term changes sign)"
        rows.append(C.Claim(
            "eq14_random_retained", fig, "under random mini-batching the grouped update's negative cross-advantage "
            "terms are weakened", "weakened or lost", *ST.t_interval(r.retained), n=len(r),
            unit="local / grouped Σ A_i A_j (i ≠ j, one group)", rule="construction",
            params=dict(sign=-1, ref=1.0, why="Σ_B S_B² ≥ 0, so a split keeps at most the grouped term"), **T,
            detail=f"random keeps {r.retained.mean():.3f} of the grouped mass (closed form over random plans "
            f"{r.retained_expected.mean():.3f}: the chance two rows share a mini-batch); QB keeps 1 by construction"
            + extra))
        rows.append(C.Claim(
            "eq14_sb_nonzero", fig, "the local advantage sum S_B of a query split across mini-batches is generally "
            "nonzero", "generally nonzero", *ST.t_interval(r.sb_nonzero), n=len(r),
            unit="share of (mini-batch, group) cells with A ≠ 0 and S_B ≠ 0", rule="construction",
            params=dict(sign=1, ref=0.5, why="a group's advantages sum to 0 only over all of its rows; a random "
                        "split leaves a part summing to 0 only by coincidence, a combinatorial property of random "
                        "splits with no training signal"), **T,
            detail=f"{r.live_groups.mean():.1f} of {P.n_prompts} groups per batch have A ≠ 0; "
            f"{r.rows.mean():.0f} rows in {r.minibatches.mean():.0f} mini-batches"))
    rows += cross_sign_row(m, fig)
    for name, stmt in (("random", "random mini-batching makes the local update noisier than query-preserved"),
                       ("sign_partitioned", "sign-partitioned mini-batches lose cancellation (a larger update)")):
        if name in set(m.strategy) and "QB" in set(m.strategy):
            lr_ = np.log10(scatter_vs_qb(m)[m.strategy == name]).groupby(m.seed).mean()
            rows.append(C.Claim(
                f"eq14_grad_{name}_vs_QB", fig, stmt, "yes", *ST.t_interval(lr_), n=len(lr_),
                unit=f"log10 of the mini-batch gradients' scatter around the batch gradient (Eq. 14), {name} / query-preserved (QB)", rule="direction", params=dict(sign=1), **T,
                detail=f"the mini-batch gradients scatter {10 ** lr_.mean():.2f}× as much around the whole batch's "
                "as QB's (geometric mean); every gradient at the starting θ on the same batch, only the split "
                "differs; the scatter is total: it also holds the spread between queries that QB's whole-group "
                "mini-batches carry, where the paper's variance is along directions a query's rollouts share"))
    if "shared_sq" in m and "random" in set(m.strategy):
        r = m[m.strategy == "random"]
        share = (r.shared_sq / r.grad_var).groupby(r.seed).mean()
        detail = f"random: {share.mean():.2f} of its scatter, {(r.shared_sq / r.full_sq).mean():.2f}× ||g||²"
        if "sign_partitioned" in set(m.strategy):
            sp = m[m.strategy == "sign_partitioned"]
            detail += (f"; sign-partitioned: {(sp.shared_sq / sp.grad_var).mean():.2f} of its scatter, "
                       f"{(sp.shared_sq / sp.full_sq).mean():.2f}× ||g||²")
        detail += "; QB: 0 (whole groups)"
        if "QB" in set(m.strategy):
            qb = m[m.strategy == "QB"].grad_var.mean()
            detail += (f". Random's scatter is {r.grad_var.mean() / qb:.2f}× QB's, {(r.grad_var - r.shared_sq).mean() / qb:.2f}× "
                       "without its shared part: QB removes that noise, and its whole-group mini-batches spread more "
                       "between queries")
        rows.append(C.Claim(
            "eq14_shared_random", fig, "random mini-batches add noise along the directions a split query's rollouts "
            "share, which the grouped update cancels", "present", *ST.t_interval(share), n=len(share),
            unit="share of the mini-batch gradients' scatter along directions a split query's rollouts share, random", rule="construction",
            params=dict(sign=1, ref=0.0, why="||s_B||² ≥ 0, > 0 wherever S_B ≠ 0 (s_B = −(1/T_B) Σ_g S_B,g c_g, "
                        "c_g the mean score of group g's rollouts); the size is the finding"), **T, detail=detail))
    return rows


CROSS_SIGN_TOL = 1e-9   # a mini-batch holding both signs keeps at least min|A|² / (P N) ≫ this (0 exactly otherwise)


def cross_sign_row(m: pd.DataFrame, fig: str) -> list[C.Claim]:
    """§4: "partitioning by advantage sign removes cross-sign gradient coupling". True of the plan by
    construction (every sign-partitioned mini-batch holds one sign), so the row holds by construction:
    the largest share of cross-sign advantage mass kept inside a mini-batch over every (seed, plan draw)
    of the Eq. 14 table; a plan that mixed signs reads > 0 and fails (not reproduced)."""
    if "cross_sign" not in m or "sign_partitioned" not in set(m.strategy):
        return []   # an Eq. 14 table written before the cross-sign columns
    sp = m[m.strategy == "sign_partitioned"]
    worst = float(np.nanmax(np.maximum(sp.cross_sign, sp.cross_sign_group)))
    keep = m.groupby("strategy", sort=False)[["cross_sign", "cross_sign_group"]].mean()
    return [C.Claim(
        "sec4_sign_partitioned_cross_sign", fig, "partitioning each batch by advantage sign removes cross-sign "
        "coupling (no mini-batch holds a positive and a negative rollout)", "removed", worst, n=len(sp),
        unit="largest share of cross-sign |A_i A_j| kept in a mini-batch, sign-partitioned",
        rule="construction", params=dict(sign=-1, ref=CROSS_SIGN_TOL, point_ok=True,
                                         why="every sign-partitioned mini-batch holds one sign "
                                         "(batching.sign_partitioned), so Σ_B P_B N_B = 0 on any batch; a plan "
                                         "that mixed signs would keep > 0 and fail"),
        estimator="point (no interval): the largest over seeds × plan draws", resampling="none",
        detail="share kept inside mini-batches, mean over seeds and draws (whole batch / within query groups): "
        + ", ".join(f"{s} {r.cross_sign:.3f} / {r.cross_sign_group:.3f}" for s, r in keep.iterrows())
        + "; the training result of breaking it is table2_sign_partitioned")]


# ----------------------------------------------------------------------------- the reading (what the notebook prints)
LIGHT_RUN_NOTE = ("The light run of `make figures`. The full test (10 seeds x 64 iterations, avg@4 on 256 problems per "
                  "set) is `make table2`: notebooks/executed/tiny-table2/, its claims marked (`make table2`) in "
                  "docs/claims.md.")


def table2_shown(R) -> pd.DataFrame:
    """Table 2 as displayed: mean ± 95% half-width per set, rollouts (sampled / discarded / delayed for a buffered
    strategy), optimizer steps."""
    t = R.table2
    shown = t[["strategy"]].copy()
    for c in ("QB", "RB"):   # the strategy's parts: a tick where it has one
        shown[c] = t[c].map({True: "✓", False: ""})
    for c in R.cols:
        shown[c] = [f"{m:.1f} ± {h:.1f}" for m, h in zip(t[f"{c}_mean"], t[f"{c}_ci95"])]
    buffered = [strategies.STRATEGIES[s].buffered for s in t.strategy]
    shown["rollouts (sampled / discarded / delayed)"] = [
        f"{s:.0f} / {d:.0f} / {y:.0f}" if r else f"{s:.0f}" for s, d, y, r in
        zip(t.rollouts_sampled, t.rollouts_discarded.fillna(0), t.rollouts_delayed.fillna(0), buffered)]
    shown["optimizer steps"] = [f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}" for v in t.optimizer_steps]
    return shown


def comparison_word(a: float, b: float, rel_tol: float = 0.02) -> str:
    """'larger', 'smaller' or 'about the same as' for a against b (within rel_tol of b: the same)."""
    if abs(a - b) <= rel_tol * abs(b):
        return "about the same as"
    return "larger than" if a > b else "smaller than"


def sign_pure_reading(R) -> str:
    """Fig. 7(a)'s middle panel in words, from the medians it plots: a sign-pure mini-batch has nothing to cancel
    against, so the cancellation reading expects its gradient to be larger than a mixed one's; says whether it is."""
    gn = R.grad_norm
    if gn.empty or "one sign" not in gn or "mixed" not in gn or "random" not in gn.index:
        return "no sign-pure vs mixed comparison (a strategy or composition is missing)"
    pure = gn["one sign"].drop("random").dropna()
    pure = pure[pure > 0]   # a one-sign mini-batch of only A = 0 rollouts has no gradient
    ref = float(gn.loc["random", "mixed"])
    if pure.empty:
        return "no strategy has sign-pure mini-batches with a gradient"
    parts = [f"{k} {v:.3f} ({comparison_word(v, ref)} random's)" for k, v in pure.items()]
    word = {comparison_word(v, ref).split()[0] for v in pure}
    verdict = ("larger, as the cancellation reading expects" if word == {"larger"} else
               "smaller, not what the cancellation reading expects" if word == {"smaller"} else "mixed")
    return (f"median gradient norm of sign-pure mini-batches: {', '.join(parts)}; random's mixed mini-batches "
            f"{ref:.3f}: sign-pure is {verdict}")


def table2_html(R) -> str:
    """Table 2 as shown, as HTML with a fixed id (a pandas Styler prints a new id and memory address on every
    run, so the executed notebook would change with each rerun)."""
    return table2_shown(R).style.hide(axis="index").set_uuid("table2").to_html()


def sweep_shown(R) -> pd.DataFrame | None:
    """The lr sweep as displayed (None without one): final average ± 95% t half-width over seeds, runs
    collapsed, optimizer steps."""
    if R.probe_evals is None or R.sweep.empty:
        return None
    return R.sweep.groupby(["strategy", "lr"]).agg(
        final_avg=("final", lambda x: f"{100 * x.mean():.1f} ± {100 * ST.t_interval(x)[2] - 100 * x.mean():.1f}"
                   if len(x) > 1 else f"{100 * x.mean():.1f}"),
        collapsed=("collapsed", lambda x: f"{int(x.sum())}/{len(x)}"),
        optimizer_steps=("optimizer_steps", "mean")).unstack("strategy")


def versus_random(R: Result, P: Params) -> str:
    """Each strategy's final average against the baseline, seed by seed, and its collapsed runs."""
    fa, lines = R.final_avg, []
    for name in P.strategies:
        d = 100 * (fa[name] - fa["random"]) if "random" in fa else pd.Series(dtype=float)
        collapsed = int((fa[name] < 0.5 * R.start / 100).sum())
        lines.append(f"{name:>16}: final average {100 * fa[name].mean():5.1f}% (per seed "
                     + ", ".join(f"{100 * v:.1f}" for v in fa[name]) + f"), vs random {d.mean():+5.1f} pts "
                     f"(per seed " + ", ".join(f"{v:+.1f}" for v in d) + f"), collapsed runs {collapsed}/{len(P.seeds)}")
    return "\n".join(lines)


def equal_rollouts(R: Result) -> str:
    """The equal-rollout-budget arm as text: final average (%) per seed beside random's, then the
    rollouts sampled and optimizer steps of each strategy (mean over seeds)."""
    if R.budget is None:
        return "no equal-rollout-budget runs (budget_strategies is empty)"
    b = R.budget.pivot(index="seed", columns="strategy", values="final").mul(100)
    b.insert(0, "random", 100 * R.final_avg["random"].reindex(b.index))
    t2 = R.table2.set_index("strategy")
    cost = R.budget.groupby("strategy", sort=False)[["rollouts_sampled", "optimizer_steps"]].mean()
    cost.loc["random"] = t2.loc["random", ["rollouts_sampled", "optimizer_steps"]]
    return ("final average held-out accuracy (%), equal rollout budget:\n" + b.round(1).to_string()
            + "\n\nper run (mean over seeds):\n" + cost.round(0).to_string())


def cross_check(R: Result, P: Params) -> str:
    """The small trainer against TRL on the same strategies (engine 'small'), as text."""
    if P.engine == "trl":
        return ("engine = 'trl': the runs above are already TRL's; the small trainer is not run, so there is no "
                "small-vs-TRL cross-check on this profile (run the tiny profile for it).")
    if R.trl_vs_small is None:
        return "no TRL cross-check (trl_strategies is empty)"
    return ("average held-out accuracy, small trainer vs TRL (same strategy, seed, batch shape, lr):\n"
            + (R.trl_vs_small * 100).round(1).to_string()
            + "\ncancellation monitor on the TRL runs (mean share per optimizer step):\n"
            + R.trl_monitor_shares.round(3).to_string())


def summary(R: Result) -> str:
    """The runs: how many, this session's seconds, threads (engine 'trl': how its frames differ)."""
    r = R.runs
    if not r:
        return ""
    out = (f"{r['runs']} runs ({r['strategies']} strategies x seeds {r['seeds']}, {r['sweep']} sweep runs, "
           f"{r['budget']} equal-rollout-budget runs), {r['seconds']:.0f} s in this session "
           f"(0 s means every run came from the cache), torch threads {r['threads']}")
    if r["engine"] == "trl":
        out += ("\nengine = 'trl': every run below (Fig. 8, Table 2, Fig. 7(a), the lr sweep) is TRL's "
                "GRPOTrainer (engine.train_trl), read back through engine.small_trainer_frames into the small "
                "trainer's frames. Differences from the small trainer's columns:\n- " + "\n- ".join(rl_engine.TRL_FRAME_NOTES))
    return out


def table2_summary(R: Result, P: Params) -> str:
    """The starting accuracy, run size, evaluation noise, optimizer steps per run (and why some took fewer),
    and the reward's coverage of a problem file."""
    table2 = R.table2
    causes = {}   # why a strategy took fewer steps than the most: each cause, with the strategies it applies to
    for s in table2.strategy[table2.optimizer_steps < table2.optimizer_steps.max()]:
        causes.setdefault(_fewer_steps_cause(s, P), []).append(s)
    why = "; ".join(f"{', '.join(names)}: {cause}" for cause, names in causes.items())
    note = (f"start (every run's iteration 0): average accuracy {R.start:.1f}%; {len(P.seeds)} seeds {P.seeds}, "
            f"{P.iterations} iterations x {P.n_minibatches} Adam steps, lr {P.lr:g}; evaluation avg@{P.eval_samples} "
            f"on {P.eval_n} problems per set (binomial SE of one run's score on one set up to "
            f"{100 * 0.5 / np.sqrt(P.eval_n * P.eval_samples):.1f} pts)\n"
            "optimizer steps per run " + ("equal across strategies" if table2.optimizer_steps.nunique() == 1 else
                                          f"differ across strategies ({why})")
            + ": " + ", ".join(f"{s} {v:g}" for s, v in zip(table2.strategy, table2.optimizer_steps)))
    coverage = coverage_line(R.iters, P)
    return note + ("\n" + coverage if coverage else "")


def _fewer_steps_cause(name: str, P: Params) -> str:
    """Why strategy `name` can take fewer optimizer steps than the others."""
    s = strategies.STRATEGIES[name]
    if s.buffered:
        return ("the whole-run sampling budget (run_rounds) ran out before every iteration had released a batch; "
                "a larger run_rounds equalises them" if P.run_rounds else
                "the buffer released no batch within max_rounds on some iterations; run_rounds > 0 keeps it sampling")
    if s.filtered:
        return "no step on an iteration whose batch held only zero-variance (A = 0) groups"
    return "no step on some iterations"
