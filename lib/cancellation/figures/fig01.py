"""Fig. 1 and Fig. 9 (notebook 01): token flipping during GRPO training runs.

`compute(P)` measures the noise floor of Δlog p on one probe batch (cached under every parameter
and the policy's and problems' fingerprints), then runs a GRPO run and a positive-only run from
the same policy (`train.cached_delta_run`: one cache entry per run, shared with notebook 08),
the fixed-scaffold control's two runs and one shorter GRPO run per model of Fig. 9, and derives
the tables: shares of boosted / suppressed / stable tokens per (run, step, sign), their ε
sensitivity and the categories of the suppressed tokens of positive rollouts. `claims(R, P)`
gives the notebook's claim rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import cache, categories, grpo, measure, policy, rollout, seeds, stage, tasks, thesis, train
from .. import claims as C
from .. import workload as W
from .. import stats as S
from . import base
from .base import param

EPS_GRID = (1e-7, 1e-6, 1e-5, 1e-4)  # ε of the sensitivity table


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
    n_prompts: int = param(16, "prompts per batch", min=1)
    G: int = param(8, "rollouts per prompt (≥ 2: a group needs two rollouts for a nonzero advantage)", min=2)
    lr: float = param(1e-4, "Adam learning rate", gt=0)
    sgd_lr: float = param(0.1, "lr of an SGD run beside the Adam run, every other setting equal (Adam's early "
                          "steps are sign-like; the paper's causal SGD lr, App. D.2); 0: no SGD run", min=0)
    n_minibatches: int = param(2, "optimizer steps per batch (random mini-batches)", min=1)
    temperature: float = param(1.0, "sampling temperature", gt=0)
    max_new_tokens: int = param(96, "response length cap", min=1)
    eps: float = param(1e-6, "boosted/suppressed threshold on Δlog p", gt=0)
    gradient_checkpointing: bool = base.gradient_checkpointing()
    seed: int = base.seed()
    control_model_path: str = param("data/policies/tiny-m-fixed",
                                    "fixed-scaffold control policy for Fig. 1(d); empty: none",
                                    path="model", optional=True)
    tagger: str = param("shipped", "POS tagger of the token categories", choices=["shipped", "auto", "perceptron"])


def run_config(P, source: tasks.ProblemSource) -> train.RunConfig:
    """The GRPO run of Fig. 1 (Adam, verl's clipped token-mean loss) from the parameters `P` holds;
    notebook 08 builds its run with this too, so equal values read the same cached run."""
    update = P.compute().update(optimizer="adam", lr=P.lr, n_minibatches=P.n_minibatches)
    return train.RunConfig(steps=P.steps, n_prompts=P.n_prompts, G=P.G, temperature=P.temperature,
                           max_new_tokens=P.max_new_tokens, seed=P.seed, eps=P.eps, source=source, backend=P.backend,
                           sample_dtype=P.sample_dtype, gpu_memory_utilization=P.gpu_memory_utilization, update=update)


def sgd_run(cfg: train.RunConfig, lr: float) -> train.RunConfig:
    """The same run with plain SGD at `lr` in place of Adam."""
    return replace(cfg, update=replace(cfg.update, optimizer="sgd", lr=lr))


def positive_only(cfg: train.RunConfig) -> train.RunConfig:
    """The same run with the negative rollouts' loss weights set to 0 (A·1[r = 1])."""
    return replace(cfg, update=replace(cfg.update, reweight="positive_only"))


@dataclass
class Result:
    """What Fig. 1 and Fig. 9 plot and the claims read."""
    probe: str                     # the probe batch of the noise floor, one line (and the verifier's report)
    noise: pd.DataFrame            # fig01_noise_floor: measurement, max_abs_delta, eps
    signed: pd.DataFrame           # tokens with A ≠ 0 of both runs: run, step, rollout, ..., delta, status
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
        return self.signed[self.signed.run == "grpo"][["step", "sign", "delta", "status", "entropy", "prob",
                                                        "token_id", "rollout", "group"]]

    def share(self, run, sign, status) -> str:
        """Mean ± s.d. over steps of the share of `status` tokens among `sign` rollouts of `run`."""
        s = self.frac[(self.frac.run == run) & (self.frac.sign == sign) & (self.frac.status == status)].fraction
        return f"{100 * s.mean():.1f}% ± {100 * s.std():.1f}"

    def magnitude(self) -> pd.DataFrame:
        """Mean and median |Δlog p| per sign, GRPO run."""
        g = self.signed[self.signed.run == "grpo"]
        return g.assign(a=lambda x: x.delta.abs()).groupby("sign").a.agg(["mean", "median"])

    def uncertain(self) -> pd.DataFrame:
        """Status shares per (run, sign) among the tokens with p < 0.9."""
        return measure.flip_fractions(self.signed[self.signed.prob < 0.9], by=("run", "sign"))

    def boosted_gap(self, run) -> pd.DataFrame:
        """Boosted share per step (rows) and sign (columns) of `run`."""
        f = self.frac
        return f[(f.run == run) & (f.status == "boosted")].pivot(index="step", columns="sign", values="fraction")

    def per_step(self, run, status, strata=None, e=None) -> pd.Series:
        return per_step(self.signed, self.eps, run, status, strata, e)

    def write(self, results_dir) -> None:
        d = Path(results_dir)
        cache.write_table(self.noise, d / "fig01_noise_floor.parquet")
        cache.write_table(self.frac, d / "fig01_flip_fractions.parquet")
        cache.write_table(self.token_deltas, d / "fig01_token_deltas.parquet")
        cache.write_table(self.sens, d / "fig01_eps_sensitivity.parquet")
        cache.write_table(self.categories.reset_index(), d / "fig01_suppressed_categories.parquet")
        cache.write_table(self.fig9, d / "fig09_flip_fractions.parquet")


def per_step(signed: pd.DataFrame, eps: float, run, status, strata=None, e=None) -> pd.Series:
    """Per-step share of `status` tokens among positive minus negative rollouts of `run` (points),
    among the tokens of `strata` (a mask over `signed`), at threshold `e` (default: the run's ε)."""
    e = eps if e is None else e
    d = signed[signed.run == run] if strata is None else signed[(signed.run == run) & strata]
    st = measure.classify(d.delta, e) if e != eps else d.status
    f = pd.crosstab([d.step, d.sign], st, normalize="index").reindex(columns=list(measure.STATUSES), fill_value=0)
    f = f[status].unstack("sign").reindex(columns=["pos", "neg"])  # a sign with no token here: NaN
    return 100 * (f["pos"] - f["neg"])


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


def compute(P: Params) -> Result:
    torch.manual_seed(P.seed)
    source = base.problem_source(P)
    cfg = run_config(P, source)
    probe, noise = base.cached(stage.FIG01_NOISE_FLOOR, P, source, lambda: _noise_floor(P, cfg))
    floor = noise.set_index("measurement").max_abs_delta
    if not (floor["repeat"] < P.eps and floor["zero_update"] < P.eps):
        raise RuntimeError(f"noise floor above ε = {P.eps:g}: raise eps or the precision\n{noise.to_string(index=False)}")

    runs = {"grpo": train.cached_delta_run(P.model_path, cfg, P.dtype, P.device),
            "positive_only": train.cached_delta_run(P.model_path, positive_only(cfg), P.dtype, P.device)}
    if P.sgd_lr:  # the SGD control: its own rows, never in the categories of Fig. 1(d)
        runs["grpo_sgd"] = train.cached_delta_run(P.model_path, sgd_run(cfg, P.sgd_lr), P.dtype, P.device)
    g = runs["grpo"]
    if not {"pos", "neg"} <= set(g.sign.unique()):
        r = g.groupby(["step", "rollout"]).reward.first()
        raise base.no_signal(f"01: the GRPO run's {P.steps} batches", int((r > 0).sum()), len(r), source)
    tokens = pd.concat([df.assign(run=name) for name, df in runs.items()], ignore_index=True)
    signed = tokens[tokens.sign != "zero"]
    frac = measure.flip_fractions(signed, by=("run", "step", "sign"))
    acc = tokens.groupby(["run", "step", "rollout"]).reward.first().groupby(["run", "step"]).mean().rename("accuracy")
    sens = eps_sensitivity(signed, P.eps)

    tok = policy.load_tokenizer(P.model_path)
    cz = categories.Categorizer(tagger=P.tagger)

    def suppressed_categories(df):
        """Share of each category among the suppressed tokens of A > 0 rollouts (one run)."""
        d = df[df.sign == "pos"].copy()
        d["category"] = cz.tag_table(d, tok, seq_cols=("step", "rollout"))["category"]
        return d[d.status == "suppressed"].category.value_counts(normalize=True)

    comp = {(Path(P.model_path).name, r): suppressed_categories(df) for r, df in runs.items() if r != "grpo_sgd"}
    if P.control_model_path:
        control_runs = {"grpo": train.cached_delta_run(P.control_model_path, cfg, P.dtype, P.device),
                        "positive_only": train.cached_delta_run(P.control_model_path, positive_only(cfg), P.dtype,
                                                                P.device)}
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
        df = runs["grpo"] if (path == P.model_path and P.fig9_steps <= P.steps) else train.cached_delta_run(
            path, replace(cfg, steps=P.fig9_steps), P.dtype, P.device)
        df = df[(df.step < P.fig9_steps) & (df.sign != "zero")]
        f = pd.concat([measure.flip_fractions(df, by=("step", "sign")),
                       measure.flip_fractions(df.assign(sign="all"), by=("step", "sign"))])
        rows.append(f.assign(model=Path(path).name))
    fig9 = pd.concat(rows, ignore_index=True)
    return Result(probe=probe, noise=noise, signed=signed, accuracy=acc, frac=frac, sens=sens, categories=comp,
                  control=control, control_accuracy=control_acc, fig9=fig9, eps=P.eps)


def _noise_floor(P: Params, cfg: train.RunConfig):
    """Δlog p (i) between two forwards with no update, (ii) across an Adam step whose token weights
    are all zero, on a probe batch; (iii) the median |log p| round-off between a lower and a higher
    precision copy (float32 against the float64 analysis; the analysis dtype against float64)."""
    cc = P.compute()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype, device=P.device)
    probe = rollout.sample(model, tok, replace(cfg.sample_config(model), backend="hf"),  # HF
                           seed=seeds.derive(P.seed, "noise_probe"))
    zero_w = torch.zeros(probe.input_ids.shape, dtype=torch.float64)
    floor = measure.noise_floor(model, probe, P.chunk_rows, token_chunk=P.token_chunk,
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
    line = (f"probe batch: {len(probe)} rollouts, {probe.n_tokens} response tokens, "
            f"accuracy {probe.reward.float().mean():.2f}, mixed groups {probe.mixed_groups()}/{P.n_prompts}")
    if cfg.source.reward_report():
        line += "\n" + cfg.source.reward_report()
    return line, noise


TS = dict(estimator="t over steps", resampling="step")  # every row of notebook 01: a Student-t interval over steps


def _claim(*a, **k) -> C.Claim:
    return C.Claim(*a, **TS, **k)


def opposite_share(signed: pd.DataFrame) -> pd.DataFrame:
    """Per step: the share (points) of A ≠ 0 tokens that move against their rollout's advantage sign
    (suppressed in a positive rollout or boosted in a negative one; stable tokens move neither way),
    and the same share inside each sign ('pos': suppressed share, 'neg': boosted share)."""
    against = ((signed.sign == "pos") & (signed.status == "suppressed")) | \
              ((signed.sign == "neg") & (signed.status == "boosted"))
    d = signed.assign(against=against.astype(float))
    out = d.groupby("step").against.mean().mul(100).rename("all").to_frame()
    return out.join(d.groupby(["step", "sign"]).against.mean().mul(100).unstack("sign"))


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
                rule="similar", params=dict(tol=10), detail=f"{100 * (~conf).mean():.1f}% of tokens have p < 0.9"),
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
    if "grpo_sgd" in set(signed.run):
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
    `paper_profile`: the paper profile's YAML (`run.load_profile("paper")`), whose `models` it names."""
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


def signed_mean_gap(signed: pd.DataFrame, run: str) -> pd.Series:
    """Per step: mean Δlog p of the A > 0 tokens minus that of the A < 0 tokens of `run`."""
    m = signed[signed.run == run].groupby(["step", "sign"]).delta.mean().unstack("sign")
    return m["pos"] - m["neg"]


def _sgd_claims(R: Result, P: Params) -> list[C.Claim]:
    """Fig. 1(a,b)'s rows again on the SGD run (App. D.2's optimizer): Adam's first steps move every
    weight by about ±lr, which could equalise the shares by itself."""
    signed, per_step = R.signed, R.per_step
    conf = signed.prob >= 0.9
    n = signed[signed.run == "grpo_sgd"].step.nunique()
    label = f"Fig. 1(a,b), SGD lr {P.sgd_lr:g}"
    rows = [_claim(f"fig01_ab_{st}_sgd", label, f"similar {st} shares for both signs (SGD run)", "similar",
                   *S.t_interval(per_step("grpo_sgd", st)), n=n, unit="pts (pos − neg)", rule="similar",
                   params=dict(tol=10), detail=f"{st} {R.share('grpo_sgd', 'pos', st)} vs "
                   f"{R.share('grpo_sgd', 'neg', st)} (mean ± s.d. over steps); the Adam run: fig01_ab_{st}")
            for st in ("boosted", "suppressed")]
    rows.append(_claim("fig01_ab_boosted_uncertain_sgd", label + ", p < 0.9", "similar boosted shares among "
                       "uncertain tokens (SGD run)", "similar", *S.t_interval(per_step("grpo_sgd", "boosted", ~conf)),
                       n=n, unit="pts (pos − neg)", rule="similar", params=dict(tol=10)))
    opp = opposite_share(signed[signed.run == "grpo_sgd"])
    rows.append(_claim("fig01_nearly_half_opposite_sgd", "§1, SGD run", "nearly half of the tokens move opposite "
                       "to their rollout's advantage sign (SGD run)", "nearly half", *S.t_interval(opp["all"]),
                       n=len(opp), unit="% of A ≠ 0 tokens moving against A", rule="similar",
                       params=dict(target=45, tol=5),
                       detail=f"suppressed in A>0 rollouts {opp['pos'].mean():.1f}%, boosted in A<0 rollouts "
                       f"{opp['neg'].mean():.1f}%"))
    rows.append(_claim("fig01_signed_mean_sgd", "§1 (Fig. 1(c)), signed, SGD run", "the SGD update favours positive "
                       "rollouts: mean Δlog p of their tokens above that of negative rollouts' tokens", "implied",
                       *S.t_interval(signed_mean_gap(signed, "grpo_sgd")), n=n, unit="mean Δlog p, pos − neg",
                       rule="direction", params=dict(sign=1)))
    return rows


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
    runs = 2 + (2 if P.control_model_path else 0) + (1 if getattr(P, "sgd_lr", 0) else 0)
    others = sum(1 for m in P.models if not (m == P.model_path and P.fig9_steps <= P.steps))
    with w.split("the model grid's GRPO runs", runs):
        W.delta_run(w, P, z, rows, runs * P.steps, P.n_minibatches, cr)
    # Fig. 9's other models are counted at this model's shape (they differ: an approximation)
    with w.split("Fig. 9's runs", others):
        W.delta_run(w, P, z, rows, others * P.fig9_steps, P.n_minibatches, cr)
    if others:
        w.notes.append(f"Fig. 9's {others} other model(s) counted at {Path(P.model_path).name}'s shape")
    return w
