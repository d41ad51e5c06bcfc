"""Fig. 1 and Fig. 9 (notebook 01): token flipping during GRPO training runs.

`compute(P)` measures the noise floor of Δlog p on one probe batch (cached under every parameter
and the policy's and problems' fingerprints), then runs a GRPO run and a positive-only run from
the same policy (`train.cached_delta_run`: one cache entry per run, shared with notebook 08),
the fixed-scaffold control's two runs and one shorter GRPO run per model of Fig. 9, and derives
the tables: shares of boosted / suppressed / stable tokens per (run, step, sign), their ε
sensitivity and the categories of the suppressed tokens of positive rollouts. The claim rows are
`fig01_claims.claims(R, P)`. `load(folder, P)` reads the Result back from the tables (make plots): it keeps
the GRPO run's tokens (fig01_token_deltas) and, of the other runs, only the small things derived from them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from .. import cache, categories, grpo, measure, policy, rollout, seeds, sources, stage, train
from .. import workload as W
from . import base, replot
from .base import param

EPS_GRID = (1e-7, 1e-6, 1e-5, 1e-4)  # ε of the sensitivity table
# fig01_token_deltas' columns: the GRPO run's signed tokens as `Result.signed` holds them (with `run`)
TOKEN_COLUMNS = ["step", "sign", "delta", "status", "entropy", "prob", "token_id", "rollout", "group"]


@dataclass
class Params(base.FigureParams):
    """Notebook 01's parameters."""
    model_path: str = base.model_path()
    models: list = param(["data/policies/tiny-m", "data/policies/tiny-s"], "policies of Fig. 9 (one row each)",
                         path="model", nonempty=True, distinct=True)
    dtype: str = base.dtype()
    sample_dtype: str = base.sample_dtype()
    backend: str = base.backend()
    gpu_memory_utilization: float = base.gpu_memory_utilization()
    steps: int = param(16, "GRPO steps of the main run and of the positive-only run", min=1)
    fig9_steps: int = param(8, "GRPO steps per model for Fig. 9", min=1)
    n_prompts: int = base.n_prompts(16)
    G: int = base.G(doc="rollouts per prompt (≥ 2: a group needs two rollouts for a nonzero advantage)")
    lr: float = param(1e-4, "Adam learning rate", gt=0)
    sgd_lr: float = param(0.1, "lr of an SGD run beside the Adam run, every other setting equal (Adam's early "
                          "steps are sign-like; the paper's causal SGD lr, App. D.2); 0: no SGD run", min=0)
    n_minibatches: int = param(2, "optimizer steps per batch (random mini-batches)", min=1)
    temperature: float = base.temperature()
    max_new_tokens: int = base.max_new_tokens()
    eps: float = base.eps()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    seed: int = base.seed()
    control_model_path: str = param("data/policies/tiny-m-fixed",
                                    "fixed-scaffold control policy for Fig. 1(d); empty: none",
                                    path="model", optional=True)
    tagger: str = base.tagger()


def run_config(P, source: sources.ProblemSource) -> train.RunConfig:
    """The GRPO run of Fig. 1 (Adam, verl's clipped token-mean loss) from the parameters `P` holds;
    notebook 08 builds its run with this too, so equal values read the same cached run."""
    update = P.compute().update(optimizer="adam", lr=P.lr, n_minibatches=P.n_minibatches)
    return train.RunConfig(steps=P.steps, n_prompts=P.n_prompts, G=P.G, temperature=P.temperature,
                           max_new_tokens=P.max_new_tokens, seed=P.seed, eps=P.eps, source=source, backend=P.backend,
                           sample_dtype=P.sample_dtype, gpu_memory_utilization=P.gpu_memory_utilization,
                           hf_sampler=P.hf_path(), update=update)


def sgd_run(cfg: train.RunConfig, lr: float) -> train.RunConfig:
    """The same run with plain SGD at `lr` in place of Adam."""
    return replace(cfg, update=replace(cfg.update, optimizer="sgd", lr=lr))


def positive_only(cfg: train.RunConfig) -> train.RunConfig:
    """The same run with the negative rollouts' loss weights set to 0 (A·1[r = 1])."""
    return replace(cfg, update=replace(cfg.update, reweight="positive_only"))


@dataclass
class Result:
    """What Fig. 1 and Fig. 9 plot and the claims read."""
    probe: dict                    # the noise floor's probe batch (base.batch_facts; `probe_summary(R)` writes it)
    noise: pd.DataFrame            # fig01_noise_floor: measurement, max_abs_delta, eps
    signed: pd.DataFrame           # the GRPO run's tokens with A ≠ 0 (fig01_token_deltas, with run = 'grpo')
    uncertain: pd.DataFrame        # status shares per (run, sign) among every run's A ≠ 0 tokens with p < 0.9
    uncertain_share: float         # share of every run's A ≠ 0 tokens with p < 0.9
    sgd_steps: pd.DataFrame | None  # the SGD run's per-step series its claim rows read (run_steps); None: no SGD run
    accuracy: pd.Series            # mean reward per (run, step)
    frac: pd.DataFrame             # fig01_flip_fractions: share per (run, step, sign, status)
    sens: pd.DataFrame             # fig01_eps_sensitivity: boosted gap and stable share per (ε, stratum)
    categories: pd.DataFrame       # fig01_suppressed_categories: category shares, index (policy, run)
    control: pd.DataFrame | None   # the control's flip fractions per (run, step, sign, status); None: no control
    control_accuracy: pd.DataFrame | None  # the control's mean reward per step (columns: runs)
    fig9: pd.DataFrame             # fig09_flip_fractions: share per (model, step, sign incl. 'all', status)
    eps: float

    @property
    def floor(self) -> pd.Series:
        return self.noise.set_index("measurement").max_abs_delta

    @property
    def token_deltas(self) -> pd.DataFrame:
        """fig01_token_deltas: the GRPO run's signed tokens (rollout and group: the units a row resamples)."""
        return self.signed[TOKEN_COLUMNS]

    def share(self, run, sign, status) -> str:
        """Mean ± s.d. over steps of the share of `status` tokens among `sign` rollouts of `run`."""
        s = self.frac[(self.frac.run == run) & (self.frac.sign == sign) & (self.frac.status == status)].fraction
        return f"{100 * s.mean():.1f}% ± {100 * s.std():.1f}"

    def magnitude(self) -> pd.DataFrame:
        """Mean and median |Δlog p| per sign, GRPO run."""
        g = self.signed[self.signed.run == "grpo"]
        return g.assign(a=lambda x: x.delta.abs()).groupby("sign").a.agg(["mean", "median"])

    def boosted_gap(self, run) -> pd.DataFrame:
        """Boosted share per step (rows) and sign (columns) of `run`."""
        f = self.frac
        return f[(f.run == run) & (f.status == "boosted")].pivot(index="step", columns="sign", values="fraction")

    def per_step(self, run, status, strata=None, e=None) -> pd.Series:
        return per_step(self.signed, self.eps, run, status, strata, e)

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save)."""
        d = Path(results_dir)
        cache.write_table(self.noise, d / "fig01_noise_floor.parquet")
        cache.write_table(self.frac, d / "fig01_flip_fractions.parquet")
        cache.write_table(self.token_deltas, d / "fig01_token_deltas.parquet")
        cache.write_table(self.sens, d / "fig01_eps_sensitivity.parquet")
        cache.write_table(self.categories.reset_index(), d / "fig01_suppressed_categories.parquet")
        cache.write_table(self.fig9, d / "fig09_flip_fractions.parquet")
        replot.save(results_dir, P, probe=self.probe, uncertain=self.uncertain, uncertain_share=self.uncertain_share,
                    sgd_steps=self.sgd_steps, accuracy=self.accuracy, control=self.control,
                    control_accuracy=self.control_accuracy)


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots)."""
    def table(name):
        return replot.table(results_dir, f"{name}.parquet")
    return Result(noise=table("fig01_noise_floor"), signed=table("fig01_token_deltas").assign(run="grpo"),
                  frac=table("fig01_flip_fractions"), sens=table("fig01_eps_sensitivity"),
                  categories=table("fig01_suppressed_categories").set_index(["policy", "run"]).rename_axis(
                      columns="category"),
                  fig9=table("fig09_flip_fractions"), eps=P.eps, **replot.restore(results_dir, P))


def per_step(signed: pd.DataFrame, eps: float, run, status, strata=None, e=None) -> pd.Series:
    """Per-step share of `status` tokens among positive minus negative rollouts of `run` (points),
    among the tokens of `strata` (a mask over `signed`), at threshold `e` (default: the run's ε)."""
    e = eps if e is None else e
    d = signed[signed.run == run] if strata is None else signed[(signed.run == run) & strata]
    st = measure.classify(d.delta, e) if e != eps else d.status
    f = pd.crosstab([d.step, d.sign], st, normalize="index").reindex(columns=list(measure.STATUSES), fill_value=0)
    f = f[status].unstack("sign").reindex(columns=["pos", "neg"])  # a sign with no token here: NaN
    return 100 * (f["pos"] - f["neg"])


def opposite_share(signed: pd.DataFrame) -> pd.DataFrame:
    """Per step: the share (points) of A ≠ 0 tokens that move against their rollout's advantage sign
    (suppressed in a positive rollout or boosted in a negative one; stable tokens move neither way),
    and the same share inside each sign ('pos': suppressed share, 'neg': boosted share)."""
    against = ((signed.sign == "pos") & (signed.status == "suppressed")) | \
              ((signed.sign == "neg") & (signed.status == "boosted"))
    d = signed.assign(against=against.astype(float))
    out = d.groupby("step").against.mean().mul(100).rename("all").to_frame()
    return out.join(d.groupby(["step", "sign"]).against.mean().mul(100).unstack("sign"))


def signed_mean_gap(signed: pd.DataFrame, run: str) -> pd.Series:
    """Per step: mean Δlog p of the A > 0 tokens minus that of the A < 0 tokens of `run`."""
    m = signed[signed.run == run].groupby(["step", "sign"]).delta.mean().unstack("sign")
    return m["pos"] - m["neg"]


def run_steps(signed: pd.DataFrame, eps: float, run: str) -> pd.DataFrame:
    """Per step of `run` (index: every step with A ≠ 0 tokens), the series a run's Fig. 1(a,b) and §1 claim rows
    read: the boosted / suppressed gaps (pos − neg, points; per_step), the boosted gap among p < 0.9 tokens, the
    opposite-moving shares (opposite_share: all, pos, neg) and the signed mean gap (signed_mean_gap). What the
    SGD run's rows need of its tokens, so the Result keeps these 16-odd rows, not the run's token table."""
    conf = signed.prob >= 0.9
    opp = opposite_share(signed[signed.run == run])
    return pd.DataFrame({"boosted": per_step(signed, eps, run, "boosted"),
                         "suppressed": per_step(signed, eps, run, "suppressed"),
                         "boosted_uncertain": per_step(signed, eps, run, "boosted", ~conf),
                         "opposite": opp["all"], "opposite_pos": opp["pos"], "opposite_neg": opp["neg"],
                         "signed_mean_gap": signed_mean_gap(signed, run)}).rename_axis("step")


def eps_sensitivity(signed: pd.DataFrame, eps: float) -> pd.DataFrame:
    """GRPO run: the boosted share of positive minus negative rollouts (mean over steps, points) and
    the stable share at every ε of EPS_GRID, for all tokens and by confidence (p < 0.9 / ≥ 0.9)."""
    conf = signed.prob >= 0.9
    return pd.DataFrame([{"eps": e, "stratum": name,
                          "boosted_pos_minus_neg": per_step(signed, eps, "grpo", "boosted", m, e).mean(),
                          "stable_share": float((measure.classify(signed[(signed.run == "grpo") & m].delta, e)
                                                 == "stable").mean())}
                         for e in EPS_GRID
                         for name, m in (("all", signed.prob >= 0), ("p<0.9", ~conf), ("p>=0.9", conf))])


def run_grid(P: Params) -> dict:
    """Which Δlog p runs this notebook trains, decided once (`delta_runs` builds them, `workload` counts them):
    name -> (policy path, variant, steps). ('main', r): the GRPO run, the positive-only run and (sgd_lr) the SGD
    control, its own rows, never in the categories of Fig. 1(d); ('control', r): the fixed-scaffold policy's GRPO
    and positive-only runs; ('fig9', path): Fig. 9's run of each model (the main GRPO run itself where it is long
    enough). The variant names the run's update (`VARIANTS`)."""
    out = {("main", "grpo"): (P.model_path, "grpo", P.steps),
           ("main", "positive_only"): (P.model_path, "positive_only", P.steps)}
    if P.sgd_lr:
        out[("main", "grpo_sgd")] = (P.model_path, "sgd", P.steps)
    if P.control_model_path:
        out[("control", "grpo")] = (P.control_model_path, "grpo", P.steps)
        out[("control", "positive_only")] = (P.control_model_path, "positive_only", P.steps)
    for path in P.models:
        if not (path == P.model_path and P.fig9_steps <= P.steps):
            out[("fig9", path)] = (path, "grpo", P.fig9_steps)
    return out


# a run's update from the GRPO run's config (`run_grid`'s variants)
VARIANTS = {"grpo": lambda cfg, P: cfg, "positive_only": lambda cfg, P: positive_only(cfg),
            "sgd": lambda cfg, P: sgd_run(cfg, P.sgd_lr)}


def delta_runs(P: Params, cfg) -> dict:
    """Every Δlog p run this notebook reads (`train.cached_delta_runs`): name -> (policy path, RunConfig), the
    runs of `run_grid` built from the GRPO run's `cfg`."""
    out = {}
    for name, (path, variant, steps) in run_grid(P).items():
        c = VARIANTS[variant](cfg, P)
        out[name] = (path, c if steps == c.steps else replace(c, steps=steps))
    return out


def compute(P: Params) -> Result:
    base.pin_threads(P)
    torch.manual_seed(P.seed)
    source = base.problem_source(P)
    cfg = run_config(P, source)
    probe, noise = base.cached(stage.FIG01_NOISE_FLOOR, P, source, lambda: _noise_floor(P, cfg))
    floor = noise.set_index("measurement").max_abs_delta
    if not (floor["repeat"] < P.eps and floor["zero_update"] < P.eps):
        raise RuntimeError(f"noise floor above ε = {P.eps:g}: raise eps or the precision\n{noise.to_string(index=False)}")

    def signal(name, g):
        """The GRPO run has rollouts of both signs (checked before the other runs train, on one process)."""
        if name == ("main", "grpo") and not {"pos", "neg"} <= set(g.sign.unique()):
            r = g.groupby(["step", "rollout"]).reward.first()
            raise base.no_signal(f"01: the GRPO run's {P.steps} batches", int((r > 0).sum()), len(r), source)

    every = train.cached_delta_runs(delta_runs(P, cfg), P.dtype, P.device, check=signal)  # --procs N: N ranks first
    runs = {r: every[("main", r)] for r in ("grpo", "positive_only", "grpo_sgd") if ("main", r) in every}
    tokens = pd.concat([df.assign(run=name) for name, df in runs.items()], ignore_index=True)
    signed = tokens[tokens.sign != "zero"]
    frac = measure.flip_fractions(signed, by=("run", "step", "sign"))
    acc = tokens.groupby(["run", "step", "rollout"]).reward.first().groupby(["run", "step"]).mean().rename("accuracy")
    sens = eps_sensitivity(signed, P.eps)
    uncertain = measure.flip_fractions(signed[signed.prob < 0.9], by=("run", "sign"))
    uncertain_share = float((signed.prob < 0.9).mean())
    sgd_steps = run_steps(signed, P.eps, "grpo_sgd") if "grpo_sgd" in set(signed.run) else None

    tok = policy.load_tokenizer(P.model_path)
    cz = categories.Categorizer(tagger=P.tagger)

    def suppressed_categories(df):
        """Share of each category among the suppressed tokens of A > 0 rollouts (one run)."""
        d = df[df.sign == "pos"].copy()
        d["category"] = cz.tag_table(d, tok, seq_cols=("step", "rollout"))["category"]
        return d[d.status == "suppressed"].category.value_counts(normalize=True)

    comp = {(Path(P.model_path).name, r): suppressed_categories(df) for r, df in runs.items() if r != "grpo_sgd"}
    if P.control_model_path:
        control_runs = {r: every[("control", r)] for r in ("grpo", "positive_only")}
        comp.update({(Path(P.control_model_path).name + " (control)", r): suppressed_categories(df)
                     for r, df in control_runs.items()})
        control = pd.concat({r: measure.flip_fractions(df[df.sign != "zero"], by=("step", "sign"))
                             for r, df in control_runs.items()}, names=["run"]).reset_index(level=0)
        control_acc = pd.concat({r: df.groupby(["step", "rollout"]).reward.first().groupby("step").mean()
                                 for r, df in control_runs.items()}, axis=1)
    else:
        control = control_acc = None
    comp = pd.DataFrame(comp).T.fillna(0.0).rename_axis(["policy", "run"])

    rows = []
    for path in P.models:
        df = every.get(("fig9", path), runs["grpo"])
        df = df[(df.step < P.fig9_steps) & (df.sign != "zero")]
        f = pd.concat([measure.flip_fractions(df, by=("step", "sign")),
                       measure.flip_fractions(df.assign(sign="all"), by=("step", "sign"))])
        rows.append(f.assign(model=Path(path).name))
    fig9 = pd.concat(rows, ignore_index=True)
    grpo_tokens = signed[signed.run == "grpo"][TOKEN_COLUMNS].reset_index(drop=True).assign(run="grpo")  # = load's
    return Result(probe=probe, noise=noise, signed=grpo_tokens, uncertain=uncertain, uncertain_share=uncertain_share,
                  sgd_steps=sgd_steps, accuracy=acc, frac=frac, sens=sens, categories=comp, control=control,
                  control_accuracy=control_acc, fig9=fig9, eps=P.eps)


def _noise_floor(P: Params, cfg: train.RunConfig):
    """Δlog p (i) between two forwards with no update, (ii) across an Adam step whose token weights
    are all zero, on a probe batch; (iii) the median |log p| round-off between a lower and a higher
    precision copy (float32 against the float64 analysis; the analysis dtype against float64)."""
    cc = P.compute()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
    probe = rollout.sample(model, tok, replace(cfg.sample_config(model), backend="hf"),  # HF
                           seed=seeds.derive(P.seed, "noise_probe"))
    zero_w = torch.zeros(probe.input_ids.shape, dtype=torch.float64)
    floor = measure.noise_floor(model, probe, cc,
                                step_fn=lambda m, b: grpo.grpo_step(m, b, replace(cfg.update, n_minibatches=1),
                                                                    token_weight=zero_w))
    low, high = ("float32", model) if P.dtype == "float64" else (P.dtype, policy.cast(model, "float64"))
    lo_model = policy.cast(model, "float32") if P.dtype == "float64" else model
    lp_lo = cc.stats(lo_model, probe).logp.double()
    lp_hi = cc.stats(high, probe).logp.double()
    floor[f"{low}_roundoff"] = float((lp_lo - lp_hi)[probe.response_mask].abs().median())
    del lo_model, high
    noise = pd.DataFrame([{"measurement": k, "max_abs_delta": v} for k, v in floor.items()])
    noise["eps"] = P.eps
    return base.batch_facts(probe, P.n_prompts, cfg.source, tokens=int(probe.n_tokens)), noise


def probe_summary(R: Result) -> str:
    """The noise floor's probe batch, one line (and the grader's)."""
    b = R.probe
    return base.with_grading(f"probe batch: {b['rollouts']} rollouts, {b['tokens']} response tokens, accuracy "
                             f"{b['accuracy']:.2f}, mixed groups {b['mixed_groups']}/{b['n_prompts']}", b)


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows, cr = W.Work(), P.n_prompts * P.G, P.chunk_rows
    # noise floor: a probe batch, 2 analyses + a zero-weight Adam step + 1 analysis, 2 round-off analyses
    W.sample(w, rows, z)
    W.analysis(w, rows, z, cr, times=5)
    W.step(w, "full", rows, z, cr)
    w.extra_bytes += shape.params * 8   # the float64 (or float32) copy of the round-off check
    w.extra_why.append("a float64 copy of θ (round-off check)")
    grid = run_grid(P)   # the runs compute() trains
    runs = [steps for (group, _), (_, _, steps) in grid.items() if group != "fig9"]
    fig9 = [steps for (group, _), (_, _, steps) in grid.items() if group == "fig9"]
    others = len(fig9)
    with w.split("the model grid's GRPO runs", len(runs)):
        W.delta_run(w, P, z, rows, sum(runs), P.n_minibatches, cr)
    # Fig. 9's other models are counted at this model's shape (they differ: an approximation)
    with w.split("Fig. 9's runs", others):
        W.delta_run(w, P, z, rows, sum(fig9), P.n_minibatches, cr)
    if others:
        w.notes.append(f"Fig. 9's {others} other model(s) counted at {Path(P.model_path).name}'s shape")
    return w
