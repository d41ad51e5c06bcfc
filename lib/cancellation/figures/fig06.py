"""Fig. 6 and Fig. 7(b) (notebook 06): the value gap against the sampling budget and the reward composition.

`compute(P)` samples the base batch (Fig. 6) and the composition batch (Fig. 7(b)), draws every
seed's nested sub-batches and valued rollouts (`budget.budget_plan`, `budget.composition_plan`),
values the seeds' tokens once (`value.token_values`, cached per prefix and shared with other runs),
takes one plain-SGD GRPO step per setting and seed (`budget.sweep_deltas`, from per-rollout scores
or a real grpo_step; cached under its own key), and reads the gap per setting (`budget.gap_table`)
and its trends with their noise budget (`budget.trend_table`). The whole Result is cached under
every parameter and the model's and problems' fingerprints. `claims(R, P)` gives the notebook's
claim rows.

The step of a sub-batch B at ρ = 1 is exactly θ + (lr/T_B) Σ_{i∈B} A_i h_i, h_i the score of
rollout i: with `step_mode` 'scores' h is computed once per rollout (`budget.rollout_scores`) and
every setting's step is taken from it and undone with `grpo.trial` (tests: equal to a real
`grpo_step` and to a hand-written SGD step); 'grpo' (large models, whose h do not fit in memory)
runs a real `grpo_step` per setting.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import budget, cache, measure, policy, rollout, stage, value
from .. import claims as C
from .. import workload as W
from ..seeds import derive
from . import base, replot
from .base import param

TABLES = ("fig06_valued_deltas", "fig06_value_gap", "fig07b_reward_composition", "fig06_trends", "fig07b_group_trend")
VALUED_COLUMNS = ["batch", "rollout", "position", "token", "reward", "prob", "entropy", "delta_hat", "delta_se",
                  "group"]   # the valued tokens' columns fig06_valued_deltas carries beside each sweep row
PANELS = {"prompts": ("Fig. 6(a)", "prompts per update"), "rollouts": ("Fig. 6(b)", "rollouts per prompt"),
          "composition": ("Fig. 7(b)", "")}


@dataclass
class Params(base.FigureParams):
    """Notebook 06's parameters."""
    CONSTRAINTS = (
        (lambda prompt_sizes, n_prompts: max(prompt_sizes) <= n_prompts,
         "every prompt_sizes entry must be <= n_prompts (the base batch's prompts)"),
        (lambda prompts_fixed, n_prompts: prompts_fixed <= n_prompts, "prompts_fixed must be <= n_prompts"),
        (lambda n_fixed, G: n_fixed <= G, "n_fixed must be <= G (rollouts per prompt of the base batch)"),
        (lambda rollout_sizes, G: max(rollout_sizes) <= G, "every rollout_sizes entry must be <= G"),
        (lambda G_comp, comp_G: 2 * (G_comp - 1) <= comp_G,
         "comp_G must hold G_comp - 1 positive and G_comp - 1 negative rollouts "
         "(comp_G at least 2 (G_comp - 1))"),
        (lambda valued_per_prompt, n_fixed: valued_per_prompt <= n_fixed,
         "valued_per_prompt must be <= n_fixed (the valued rollouts are in every "
         "update of panel (a))"),
    )
    model_path: str = base.model_path()
    dtype: str = base.dtype()
    sample_dtype: str = base.sample_dtype("float32")
    n_prompts: int = base.n_prompts(32, "prompts in the base batch of Fig. 6 (the largest prompt budget)")
    G: int = base.G(16, "rollouts per prompt in the base batch (the largest rollout budget)")
    temperature: float = base.temperature(doc="sampling temperature (batches and continuations)")
    max_new_tokens: int = base.max_new_tokens(doc="response cap")
    lr: float = param(0.1, "SGD learning rate of the one GRPO step (App. D.2)", gt=0)
    eps: float = base.eps()
    p_max: float = param(0.999, "valued tokens have p_t at most p_max (as notebook 05)", gt=0, lt=1)
    M: int = param(16, "continuations per branch and token (paper: 256)", min=2)
    estimator: str = param("exclude", "Δ̂ estimator (notebook 05: 'exclude' has no 1/(1-p) noise blow-up)",
                           choices=["exclude", "paper"])
    prompt_sizes: list = param([4, 8, 16, 32], "(a) prompts per update (paper 16..96), at n_fixed rollouts each",
                               min=1, nonempty=True)
    n_fixed: int = param(8, "(a) rollouts per prompt", min=1)
    valued_per_prompt: int = param(2, "(a) valued rollouts of each of the min(prompt_sizes) core prompts", min=1)
    rollout_sizes: list = param([1, 2, 4, 8, 16], "(b) rollouts per prompt (paper 1..8), at prompts_fixed prompts",
                                min=1, nonempty=True)
    prompts_fixed: int = param(16, "(b) prompts per update", min=1)
    tokens_per_rollout: int = param(1, "valued tokens drawn from each valued rollout (fixed per rollout)", min=1)
    G_comp: int = param(32, "7(b): rollouts per query group; from 1 to G_comp - 1 of them positive", min=2)
    comp_prompts: int = param(16, "7(b): prompts of the composition batch", min=1)
    comp_G: int = param(96, "7(b): rollouts per prompt of the composition batch (holds G_comp - 1 of each sign)", min=2)
    comp_groups: int = param(7, "7(b): query groups used (the first with G_comp - 1 of each sign); the group-"
                             "resampled interval needs several", min=1)
    top_fracs: list = param([50, 25], "highest-|Δ̂| subsets of the valued tokens (percent), besides all tokens",
                            gt=0, max=100)
    n_seeds: int = param(32, "subsampling seeds (each draws the sub-batches and the valued rollouts)", min=1)
    n_boot: int = param(1000, "bootstrap resamples of the seeds", min=1)
    rows_per_chunk: int = param(1024, "continuation rows per sampler batch", min=1)
    backend: str = base.backend()
    gpu_memory_utilization: float = base.gpu_memory_utilization()
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    step_mode: str = param("scores", "'scores': steps from per-rollout scores h (small models); 'grpo': a real "
                           "grpo_step each", choices=["scores", "grpo"])
    score_dtype: str = param("float32", "storage of the per-rollout scores h (float32 halves the memory)",
                             choices=["float32", "float64"])
    seed: int = base.seed()


@dataclass
class Result:
    """What Fig. 6 and Fig. 7(b) plot and their claims read."""
    facts: dict               # the batches, the valued tokens and the sweep (numbers; `summary(R)` writes them)
    valued: pd.DataFrame      # the valued tokens (Fig. 6's, then 7(b)'s): Δ̂, its SE, reward, p, entropy
    sweep: pd.DataFrame       # one row per (panel, x, seed, valued token): Δlog p of the setting's step, status
    gaps: pd.DataFrame        # per (panel, x, subset, scope): pooled gap with its seed-resampled interval
    trends: pd.DataFrame      # per (panel, subset): d, slope per doubling, ends split, noise budget
    subsets: list             # token subsets: 'all', then 'top<f>' for every f of top_fracs
    n_comp_groups: int        # query groups of 7(b)
    group_trend: pd.DataFrame  # 7(b)'s trend per subset with query groups resampled as well as seeds
    seconds: dict             # wall time: values, sweep, total (of the first run, when cached)
    panel_trend: pd.DataFrame | None = None  # 6(a)/(b)'s trends with query groups resampled as well as seeds

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save): the batches' facts, the
        number of 7(b)'s query groups, the wall times."""
        d = Path(results_dir)
        tables = (self.sweep.merge(self.valued[VALUED_COLUMNS].reset_index(names="tok"), on="tok"),
                  self.gaps[self.gaps.panel != "composition"], self.gaps[self.gaps.panel == "composition"], self.trends,
                  self.group_trend)
        for name, df in zip(TABLES, tables):
            cache.write_table(df, d / f"{name}.parquet")
        if self.panel_trend is not None:
            cache.write_table(self.panel_trend, d / "fig06_group_trend.parquet")
        replot.save(results_dir, P, facts=self.facts, n_comp_groups=self.n_comp_groups, seconds=self.seconds)

    def at(self, panel, x, scope="valued", subset="all") -> pd.Series:
        """The gap row of one setting."""
        g = self.gaps
        return g[(g.panel == panel) & (g.x == x) & (g.scope == scope) & (g.subset == subset)].iloc[0]

    def trend(self, panel, subset="all") -> pd.Series:
        """The trend row of one panel and subset ('within_sign' for the within-sign gap)."""
        return self.trends[(self.trends.panel == panel) & (self.trends.subset == subset)].iloc[0]


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots). The sweep and the valued
    tokens come back from fig06_valued_deltas (one row per sweep row, the valued token's columns beside it:
    `valued` keeps those columns, every valued token being in the sweep); the gaps from its two tables
    (Fig. 6's rows, then 7(b)'s, as gap_table orders them); the subsets by token_subsets."""
    deltas, gap6, gap7b, trends, group_trend = (replot.table(results_dir, f"{name}.parquet") for name in TABLES)
    sweep = deltas.drop(columns=VALUED_COLUMNS)
    valued = deltas.drop_duplicates("tok").sort_values("tok")
    if not np.array_equal(valued.tok.to_numpy(), np.arange(len(valued))):
        raise replot.ReplotError(f"06: {results_dir}/fig06_valued_deltas.parquet does not hold every valued token "
                                 "(a token no setting measured): run the notebook (make fig06) to recompute")
    valued = valued[VALUED_COLUMNS].reset_index(drop=True)
    panel = Path(results_dir) / "fig06_group_trend.parquet"
    kept = replot.restore(results_dir, P)
    kept["facts"]["sweep"]["per_update"] = per_update(sweep)   # in the sweep's panel order (the JSON sorts keys)
    return Result(**kept, valued=valued, sweep=sweep,
                  gaps=pd.concat([gap6, gap7b], ignore_index=True), trends=trends,
                  subsets=list(token_subsets(valued, P.top_fracs)), group_trend=group_trend,
                  panel_trend=replot.table(results_dir, panel.name) if panel.exists() else None)


def per_update(sw: pd.DataFrame) -> dict:
    """Per panel of the sweep (in its order): the mean number of valued tokens per update (setting x seed)."""
    return {p: float(sw[sw.panel == p].groupby(["x", "seed"]).size().mean()) for p in sw.panel.unique()}


def resolved(t) -> str:
    """Whether a trend's seeds suffice for |d| = 2 SE (its noise budget), in words."""
    return ("resolved with this run's seeds" if t.need_seeds <= t.n_seeds else
            f"{t.need_seeds / t.n_seeds:.1f}x this run's {t.n_seeds} (n_seeds, sized to the profile's time budget), so "
            "the interval decides and the verdict stays inconclusive unless it already excludes 0")


def compute(P: Params) -> Result:
    base.pin_threads(P)
    source = base.problem_source(P)
    R = base.cached(stage.FIG06, P, source, lambda: _compute(P, source))
    # the two-way intervals (seeds × query groups) of every trend row, from the cached sweep (fast)
    subsets = token_subsets(R.valued, P.top_fracs)
    R.group_trend = budget.composition_trend_groups(R.sweep, R.valued, R.valued.group.to_numpy(), subsets,
                                                    P.n_boot, P.seed)
    R.panel_trend = panel_trends(R, P)
    return R


def panel_trends(R: Result, P: Params) -> pd.DataFrame:
    """6(a)/(b)'s trends d = gap(largest) − gap(smallest) per subset and within sign, and d(top25) −
    d(all), with intervals that resample the query groups as well as the seeds (budget.trend_two_way:
    a valued token's cluster is its query; each valued rollout gives one token, so tokens, rollouts
    and queries nest)."""
    subsets = token_subsets(R.valued, P.top_fracs)
    cluster = (R.valued.batch.astype(str) + ":" + R.valued.group.astype(str)).to_numpy()
    out = []
    for panel in ("prompts", "rollouts"):
        rows, reps = budget.trend_two_way(R.sweep, R.valued, panel, cluster, subsets, P.n_boot, P.seed)
        if not len(rows):
            continue
        if "top25" in reps:
            lo, hi = budget.interval(reps["top25"] - reps["all"])
            t = rows.set_index("subset")
            rows = pd.concat([rows, pd.DataFrame([dict(panel=panel, subset="top25_vs_all",
                                                       d=float(t.d["top25"] - t.d["all"]), d_lo=lo, d_hi=hi,
                                                       n_seeds=int(t.n_seeds.iloc[0]),
                                                       n_clusters=int(t.n_clusters.iloc[0]))])], ignore_index=True)
        out.append(rows)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _compute(P: Params, source) -> Result:
    t_start = time.perf_counter()
    cc = P.compute()
    # every batch and continuation comes from one sampler (n = M per prefix); valuing happens before any update
    model, tok, sampler = base.load_sampler(P)  # seeds torch first
    verifier = source.verifier()
    fp = policy.fingerprint(P.model_path)
    scfg = base.sample_config(P, source, sampler=True)
    batch = rollout.sample(sampler, tok, scfg, seed=derive(P.seed, "budget_batch"))
    base.require_signal(batch, source, "06: the sampling-budget batch")
    n_pos = pd.Series([int(batch.reward[batch.group == g].sum()) for g in range(P.n_prompts)])
    facts = base.batch_facts(batch, P.n_prompts, source, tokens=int(batch.n_tokens), G=P.G,
                             positives=sorted(n_pos.tolist()))
    ccfg = base.sample_config(P, source, sampler=True, n_prompts=P.comp_prompts, G=P.comp_G)
    cfull = rollout.sample(sampler, tok, ccfg, seed=derive(P.seed, "composition_batch"))
    comp_gs, comp_rows = budget.composition_rows_capped(cfull, P.G_comp, P.comp_groups, seed=P.seed)
    cbatch = cfull.select(comp_rows)
    c_pos = [int(cfull.reward[cfull.group == g].sum()) for g in range(P.comp_prompts)]
    facts["composition"] = dict(rollouts=len(cfull), G=P.comp_G, positives=sorted(c_pos), used=len(comp_gs),
                                groups=len(budget.composition_groups(cfull, P.G_comp)), G_comp=P.G_comp,
                                rows=len(cbatch))
    facts["grading"] = source.grading()

    # the plans (nested sub-batches per seed) and the valued tokens of all seeds, valued in one call per batch
    seeds = [derive(P.seed, "budget_plan", s) for s in range(P.n_seeds)]
    plan = budget.budget_plan(batch, P.prompt_sizes, P.n_fixed, P.rollout_sizes, P.prompts_fixed,
                              P.valued_per_prompt, seeds)
    cplan = budget.composition_plan(cbatch, comp_gs, P.G_comp, seeds) if comp_gs else []
    cfg = cc.update(optimizer="sgd", lr=P.lr, scope="full", n_minibatches=1)
    vcfg = value.ValueConfig(M=P.M, seed=P.seed, temperature=P.temperature, max_new_tokens=P.max_new_tokens,
                             estimator=P.estimator, p_max=P.p_max, rows_per_chunk=P.rows_per_chunk,
                             backend=P.backend, token_chunk=P.token_chunk)
    before = cc.stats(model, batch)
    cbefore = cc.stats(model, cbatch)
    runs = [(name, b, bf, pl) for name, b, bf, pl in (("fig6", batch, before, plan), ("fig7b", cbatch, cbefore, cplan))
            if pl]
    parts, stats, t0 = [], {}, time.perf_counter()
    for name, b, bf, pl in runs:
        vrows = np.unique(np.concatenate([e["valued"].numpy() for e in pl]))
        vt = budget.valued_tokens(measure.token_table(b, bf, tokenizer=tok), vrows, P.tokens_per_rollout, P.p_max,
                                  P.seed)
        st = {}
        vt = value.token_values(sampler, tok, b, vt, vcfg, mid=f"{fp}:{P.sample_dtype}", verifier=verifier, stats=st)
        vt["group"] = b.group[torch.as_tensor(vt.rollout.to_numpy(copy=True))].cpu().numpy()  # the query of the token
        for k in ("cache_hits", "requests", "continuations"):
            stats[k] = stats.get(k, 0) + st.get(k, 0)
        parts.append(vt.assign(batch=name))
    t_values = time.perf_counter() - t0
    tokens = {p.batch.iloc[0]: p.reset_index(drop=True) for p in parts}
    allv = pd.concat(parts, ignore_index=True)
    facts["values"] = dict(cache_hits=stats["cache_hits"], requests=stats["requests"],
                           continuations=stats["continuations"], seconds=t_values,
                           median_se=float(allv.delta_se.median()))
    facts["valued"] = []
    for k, t in tokens.items():
        v = t.delta_hat.to_numpy()
        facts["valued"].append(dict(batch=k, tokens=len(t), rollouts=int(t.rollout.nunique()), mean=float(v.mean()),
                                    positive=float(v[t.reward > 0.5].mean()), negative=float(v[t.reward <= 0.5].mean()),
                                    above_0_1=float((np.abs(v) > 0.1).mean())))

    # the sweep: scores h_i of every rollout a plan draws from, each setting's exact step from them
    def sweep():
        out = []
        for name, b, bf, pl in runs:
            hrows = np.unique(np.concatenate([e["rows"].numpy() for e in pl]))
            if P.step_mode == "grpo":  # a real step per setting: with --procs N, seeds split over N ranks
                out.append(budget.sweep_deltas_split(model, b, pl, tokens[name], cfg, bf.logp))
                continue
            H = budget.rollout_scores(model, b, hrows, bf.logp, cfg, dtype=getattr(torch, P.score_dtype))
            out.append(budget.sweep_deltas(model, b, pl, tokens[name], cfg, bf.logp, H, hrows))
            del H
        return pd.concat(out, ignore_index=True)

    t0 = time.perf_counter()
    sw = stage.BUDGET_SWEEP_NESTED.cached(
        sweep, model=fp, dtype=P.dtype, sample=scfg, comp=ccfg, lr=P.lr, p_max=P.p_max,
        prompt_sizes=list(P.prompt_sizes), n_fixed=P.n_fixed, valued_per_prompt=P.valued_per_prompt,
        rollout_sizes=list(P.rollout_sizes), prompts_fixed=P.prompts_fixed, tokens_per_rollout=P.tokens_per_rollout,
        G_comp=P.G_comp, comp_groups=P.comp_groups, n_seeds=P.n_seeds, step_mode=P.step_mode,
        score_dtype=P.score_dtype, seed=P.seed)
    t_sweep = time.perf_counter() - t0
    sw["status"] = measure.classify(sw.delta, P.eps)
    # one token table for both batches: `tok` indexes `valued` (the 7(b) tokens after Fig. 6's)
    off = {"fig6": 0, "fig7b": len(tokens.get("fig6", []))}
    sw["tok"] = sw.tok + np.where(sw.panel == "composition", off["fig7b"], 0)
    valued = pd.concat([tokens[k] for k in ("fig6", "fig7b") if k in tokens], ignore_index=True)
    n_steps = sw.groupby(["panel", "x", "seed"]).ngroups
    facts["sweep"] = dict(settings=n_steps, seconds=t_sweep, median_abs_delta=float(sw.delta.abs().median()),
                          stable=float(np.mean(sw.status == "stable")),
                          per_update=per_update(sw))

    # the gap per setting for all valued tokens and the top-f% by |Δ̂|, and its trends
    subsets = token_subsets(valued, P.top_fracs)
    gaps, reps = budget.gap_table(sw, valued, subsets, P.n_boot, P.seed)
    trends = budget.trend_table(sw, valued, gaps, reps, subsets, P.M)
    group_trend = budget.composition_trend_groups(sw, valued, valued.group.to_numpy(), subsets, P.n_boot, P.seed)
    return Result(facts=facts, valued=valued, sweep=sw, gaps=gaps, trends=trends, subsets=list(subsets),
                  n_comp_groups=len(comp_gs), group_trend=group_trend,
                  seconds=dict(values=t_values, sweep=t_sweep, total=time.perf_counter() - t_start))



def summary(R: Result) -> str:
    """The two batches (and the grader's line), the valued tokens and the sweep, a line each."""
    f, c, v, sw = R.facts, R.facts["composition"], R.facts["values"], R.facts["sweep"]
    lines = [f"Fig. 6 base batch: {f['rollouts']} rollouts, {f['tokens']} response tokens, accuracy "
             f"{f['accuracy']:.2f}, mixed groups {f['mixed_groups']}/{f['n_prompts']}",
             "positives per group (of %d): %s" % (f["G"], f["positives"]),
             base.with_grading(f"7(b) batch: {c['rollouts']} rollouts, positives per group (of {c['G']}): "
                               f"{c['positives']}; {c['used']} of the {c['groups']} groups with at least "
                               f"{c['G_comp'] - 1} positive and {c['G_comp'] - 1} negative rollouts used, "
                               f"{c['rows']} rows", f),
             "valued tokens: " + ", ".join(f"{t['batch']} {t['tokens']} from {t['rollouts']} rollouts" for t in f["valued"])
             + f"; {v['cache_hits']}/{v['requests']} prefixes cached, {v['continuations']} continuations sampled, "
             f"{v['seconds']:.0f} s; median SE of Δ̂ {v['median_se']:.3f}"]
    lines += [f"{t['batch']}: Δ̂ mean {t['mean']:+.3f}, positive rollouts {t['positive']:+.3f}, negative "
              f"{t['negative']:+.3f}; |Δ̂| > 0.1 for {t['above_0_1']:.0%}" for t in f["valued"]]
    lines.append(f"{sw['settings']} settings x seeds, sweep {sw['seconds']:.0f} s (cached after the first run); valued "
                 "tokens per update " + ", ".join(f"{p} {n:.1f}" for p, n in sw["per_update"].items())
                 + f"; median |Δlog p| {sw['median_abs_delta']:.1e}, stable (|Δ| ≤ ε) {sw['stable']:.3f}")
    return "\n".join(lines)

def token_subsets(valued: pd.DataFrame, top_fracs) -> dict:
    """'all', then 'top<f>': the valued tokens whose |Δ̂| is in the top f% (a bool mask each)."""
    v = valued.delta_hat.to_numpy()
    subsets = {"all": np.ones(len(valued), bool)}
    for f in top_fracs:
        subsets[f"top{f}"] = np.abs(v) >= np.quantile(np.abs(v), 1 - f / 100)
    return subsets


def top_minus_all(R: Result, P: Params, panel: str, sub: str = "top25") -> tuple[float, float, float]:
    """d(sub) − d(all) of an (a)/(b) panel (d = gap(largest) − gap(smallest budget)), with the paired
    percentile interval from the same seed resamples every gap of the panel uses (budget.gap_table)."""
    sw = R.sweep[R.sweep.panel == panel]
    gaps, reps = budget.gap_table(sw, R.valued, token_subsets(R.valued, P.top_fracs), P.n_boot, P.seed)
    xs = sorted(gaps.x.unique())
    g = gaps[gaps.scope == "valued"].set_index(["subset", "x"]).gap
    d = (g[(sub, xs[-1])] - g[(sub, xs[0])]) - (g[("all", xs[-1])] - g[("all", xs[0])])
    r = (reps[(panel, xs[-1], sub)] - reps[(panel, xs[0], sub)]) - (reps[(panel, xs[-1], "all")] - reps[(panel, xs[0], "all")])
    return float(d), *budget.interval(r)


SEEDS = dict(estimator="percentile bootstrap over seeds (paired across settings)", resampling="seed")
GROUPS = dict(estimator="two-way percentile bootstrap over seeds and query groups (paired across settings)",
              resampling="seed × group")


def claims(R: Result, P: Params) -> list[C.Claim]:
    """Every interval resamples the seeds (nested sub-batches; every setting of a panel on the same
    resamples) and the query groups of the valued tokens (two-way: the tokens, their rollouts and
    queries stay fixed across seeds, so seeds alone are optimistic); n is the number of query groups,
    the seeds, valued tokens and the seeds-only interval are in the detail."""
    trends, gaps = R.trends, R.gaps
    pt = R.panel_trend.set_index(["panel", "subset"]) if R.panel_trend is not None and len(R.panel_trend) else None
    rows = []

    def n_tok(panel, subset, scope="valued"):
        return int(gaps[(gaps.panel == panel) & (gaps.subset == subset) & (gaps.scope == scope)].n_tokens.max())

    def two_way(panel, subset, seeds_lo, seeds_hi, **kw):
        g = pt.loc[(panel, subset)]
        return dict(measured=g.d, lo=g.d_lo, hi=g.d_hi, n=int(g.n_clusters), **GROUPS,
                    detail=f"{kw.pop('tokens')} valued tokens from {int(g.n_clusters)} query groups x "
                    f"{int(g.n_seeds)} seeds, both resampled; seeds only: [{seeds_lo:+.3g}, {seeds_hi:+.3g}]"
                    + kw.pop("extra", ""))

    for panel, (fig, what) in PANELS.items():
        for _, t in trends[(trends.panel == panel) & trends.subset.isin(["all", "top25"])].iterrows():
            if panel == "composition":  # one row per end below: the mean of both ends is no measurement of its own
                continue
            stmt = f"the gap grows with {what}"
            extra = f"; |d| = 2 SE needs {t.need_seeds:g} seeds (seeds only)" if np.isfinite(t.se) else ""
            unit = f"gap({t.to}) − gap({t.frm}), tokens in every nested sub-batch"
            rows.append(C.Claim(f"fig06_{panel}_{t.subset}", f"{fig}, {t.subset}", stmt, "yes", unit=unit,
                                rule="direction", params=dict(sign=1),
                                **two_way(panel, t.subset, t.d_lo, t.d_hi, tokens=n_tok(panel, t.subset),
                                          extra=extra)))
        if panel != "composition":
            w = trends[(trends.panel == panel) & (trends.subset == "within_sign")]
            if len(w):
                t = w.iloc[0]
                rows.append(C.Claim(f"fig06_{panel}_within_sign", f"{fig}, within sign", f"the gap grows with {what} "
                                    "(mean of the gaps inside positive and inside negative rollouts)", "yes",
                                    unit=f"gap({t.to}) − gap({t.frm}), within-sign", rule="direction",
                                    params=dict(sign=1),
                                    **two_way(panel, "within_sign", t.d_lo, t.d_hi,
                                              tokens=n_tok(panel, "all", "within_sign"),
                                              extra="; free of 'tokens of positive rollouts have higher Δ̂'")))
            if "top25" in R.subsets:
                s_lo, s_hi = top_minus_all(R, P, panel)[1:]
                rows.append(C.Claim(f"fig06_{panel}_top25_vs_all", f"{fig}, top25 − all",
                                    "the growth is most pronounced for the top-25% highest-value tokens", "yes",
                                    unit="d(top25) − d(all)", rule="direction", params=dict(sign=1),
                                    **two_way(panel, "top25_vs_all", s_lo, s_hi, tokens=n_tok(panel, "all"),
                                              extra=f"; d(top25) {pt.loc[(panel, 'top25')].d:+.3f}, d(all) "
                                              f"{pt.loc[(panel, 'all')].d:+.3f}")))
        if panel == "composition":  # the paper's statement names both ends: each end against the middle on its own
            for _, t in trends[(trends.panel == panel) & trends.subset.isin(["all", "top25"])].iterrows():
                g = R.group_trend[R.group_trend.subset == t.subset].iloc[0]
                for end, k in (("sparse", 1), ("saturated", P.G_comp - 1)):
                    rows.append(C.Claim(f"fig07b_{end}_{t.subset}", f"{fig}, {t.subset}",
                                        f"the gap is smaller when reward is {end} (middle − k = {k})", "yes",
                                        g[f"d_{end}"], g[f"d_{end}_lo"], g[f"d_{end}_hi"], n=int(g.n_groups),
                                        unit=f"gap(middle) − gap(k = {k}), tokens in every nested sub-batch",
                                        rule="direction", params=dict(sign=1), **GROUPS,
                                        detail=f"{n_tok(panel, t.subset)} valued tokens from {int(g.n_groups)} query "
                                        f"groups x {int(g.n_seeds)} seeds, both resampled; seeds only: "
                                        f"[{t[f'd_{end}_lo']:+.3g}, {t[f'd_{end}_hi']:+.3g}]; the mean of both ends "
                                        f"{g.d:+.3g} [{g.d_lo:+.3g}, {g.d_hi:+.3g}] (seeds only: [{t.d_lo:+.3g}, "
                                        f"{t.d_hi:+.3g}])"))
            g = R.group_trend[R.group_trend.subset == "all"].iloc[0]
            for end, k in (("sparse", 1), ("saturated", P.G_comp - 1)):  # "... or even becomes negative"
                rows.append(C.Claim(f"fig07b_{end}_negative", f"{fig}, all", f"under {end} reward (k = {k}) the value "
                                    "gap even becomes negative", "diminishes or even becomes negative",
                                    g[f"gap_{end}"], g[f"gap_{end}_lo"], g[f"gap_{end}_hi"], n=int(g.n_groups),
                                    unit=f"gap(k = {k}), tokens in every nested sub-batch", rule="direction",
                                    params=dict(sign=-1), **GROUPS,
                                    detail=f"{n_tok(panel, 'all')} valued tokens from {int(g.n_groups)} query groups x "
                                    f"{int(g.n_seeds)} seeds, both resampled; the paper hedges ('or even'): a gap "
                                    "above 0 here refutes only the 'negative' half, the 'diminishes' half is "
                                    f"fig07b_{end}_all"))
    return rows


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, cr = W.Work(), P.chunk_rows
    rows, crows = P.n_prompts * P.G, P.comp_prompts * P.comp_G
    W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P))
    W.sample(w, crows, z, chunk_rows_decode=W.sample_rows(P))
    W.analysis(w, rows, z, cr)
    W.analysis(w, P.comp_groups * P.G_comp, z, cr)
    settings = [(p * P.n_fixed) for p in P.prompt_sizes] + [P.prompts_fixed * g for g in P.rollout_sizes] + \
        [P.G_comp] * max(P.G_comp - 1, 0)
    if P.step_mode == "grpo":   # a real grpo_step per setting and seed, on the sub-batch of the setting
        with w.split("settings x seeds", len(settings) * P.n_seeds):
            for r in settings:
                W.step(w, "full", r, z, cr, times=P.n_seeds)
                W.analysis(w, r, z, cr, times=P.n_seeds)
    else:   # 'scores': one backward per rollout the plans draw from (budget.rollout_scores; at most every row of
        # both batches), then each setting's step from the scores (a matrix product, not counted) and its forward
        W.step(w, "full", 1, z, cr, minibatches=0, times=rows + P.comp_groups * P.G_comp)
        for r in settings:
            W.analysis(w, r, z, cr, times=P.n_seeds)
        w.notes.append("step_mode scores: one backward per rollout; the settings' steps from the scores are "
                       "matrix products, not counted")
    w.full_grads = True
    valued = P.n_seeds * (min(P.prompt_sizes) * P.valued_per_prompt + P.comp_groups * P.G_comp) * P.tokens_per_rollout
    # each valued token is sampled once (value.token_values caches per prefix) and a rollout's tokens are fixed
    # across seeds, so at most every rollout the seeds draw from is valued: the base batch and the composition
    # batch's comp_groups query groups
    valued = min(valued, (P.n_prompts * P.G + P.comp_groups * P.comp_G) * P.tokens_per_rollout)
    # --procs divides sampler batches of rows_per_chunk // M prefixes (token x branch), not tokens (fig05)
    with w.split("valued tokens' Monte Carlo continuations", W.ceil(2 * valued, max(1, P.rows_per_chunk // P.M))):
        W.sample(w, valued * 2 * P.M, z, chunk_rows_decode=P.rows_per_chunk)
    w.notes.append("valued tokens: every seed's, at most every rollout's (the cache shares prefixes across seeds), "
                   "continuations at the full response cap: an upper bound")
    if P.sample_dtype and P.backend == "hf":
        w.extra_bytes += shape.params * W.BYTES[P.sample_dtype]
    return w
