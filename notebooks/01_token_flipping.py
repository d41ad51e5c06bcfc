# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Fig. 1 and Fig. 9 — token flipping
#
# *Paper, §1 and App. C.* During a GRPO training run, measure after every step how the step's
# update moved the log-probability of every token of **its own batch**:
# Δlog p = log π_θ'(o_t|s_t) − log π_θ(o_t|s_t), both from forward passes of the training model
# (never from sampler log-probs). A token is *boosted* if Δ > ε, *suppressed* if Δ < −ε, *stable*
# otherwise (ε = 1e-6). The sequence-level intuition says tokens of positive rollouts (A > 0)
# should be boosted and tokens of negative rollouts (A < 0) suppressed. The paper finds instead
# that both signs show **similar boosted/suppressed shares** (a, b) and **similar magnitudes**
# (c), and that the pattern largely disappears when training on positive rollouts only (d).
# Fig. 9 repeats (a, b) for every model of the profile.
#
# The update is verl's token-mean clipped loss (ε_low 0.2, ε_high 0.28, dual clip 3, no KL),
# Adam, `n_minibatches` optimizer steps per batch; groups with all-equal rewards get A = 0 and
# are left out of the sign split.

# %% tags=["parameters"]
profile = "tiny"                    # parameter profile (set by the runner)
fig_dir = "figures/tiny"            # where figures go (set by the runner)
results_dir = "data/results/tiny"   # where tidy tables go (set by the runner)
model_path = "data/policies/tiny-m"  # policy of panels (a)-(d)
models = ["data/policies/tiny-m", "data/policies/tiny-s"]  # one Fig. 9 row each
dtype = "float64"                   # analysis and update precision (float64: SGD-size Δ are < fp32 round-off)
sample_dtype = ""                   # dtype of the sampler copy; empty: the training model itself (paper: bfloat16)
backend = "hf"                      # sampler: 'hf' or 'vllm' (weights pushed after every update)
gpu_memory_utilization = 0.3        # vLLM's share of GPU memory, beside the training model
device = "cpu"                      # cpu or cuda
steps = 16                          # GRPO steps of the main run and of the positive-only run
fig9_steps = 8                      # GRPO steps per model for Fig. 9
n_prompts = 16                      # prompts per batch
G = 8                               # rollouts per prompt
lr = 1e-4                           # Adam learning rate
n_minibatches = 2                   # optimizer steps per batch (random mini-batches)
temperature = 1.0                   # sampling temperature
max_new_tokens = 96                 # response length cap
eps = 1e-6                          # boosted/suppressed threshold
problems_path = ""                  # real problems (DAPO-Math-17k / MATH-500 / prompt+answer file); empty: generated arithmetic
prompt_format = "auto"              # 'auto' (chat template when the tokenizer has one), 'chat' or 'raw'
chunk_rows = 64                     # rows per forward chunk
token_chunk = 4096                  # positions per LM-head chunk (bounds the batch x vocabulary tensors)
gradient_checkpointing = False      # recompute activations in the backward (large models)
seed = 0                            # seeds prompts, sampling and mini-batching
control_model_path = "data/policies/tiny-m-fixed"  # fixed-scaffold control policy for Fig. 1(d); empty: none
tagger = "shipped"                  # POS tagger of the token categories ('shipped', 'auto', 'perceptron')

# %%
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cancellation import cache, categories, grpo, measure, plots, policy, rollout, tasks, train

logging.basicConfig(level=logging.WARNING)
torch.manual_seed(seed)
Path(results_dir).mkdir(parents=True, exist_ok=True)

source = tasks.ProblemSource(path=problems_path, prompt_format=prompt_format)
source.load()  # a malformed problem file stops here, before any model loads
update_cfg = grpo.UpdateConfig(optimizer="adam", lr=lr, n_minibatches=n_minibatches, chunk_rows=chunk_rows,
                               token_chunk=token_chunk, gradient_checkpointing=gradient_checkpointing)
base_cfg = train.RunConfig(steps=steps, n_prompts=n_prompts, G=G, temperature=temperature,
                           max_new_tokens=max_new_tokens, seed=seed, eps=eps, source=source, backend=backend,
                           sample_dtype=sample_dtype, gpu_memory_utilization=gpu_memory_utilization,
                           update=update_cfg)


def run(path, cfg):
    """A cached GRPO run from the saved policy at `path`; returns its per-token table."""
    def compute():
        model, tok = policy.load_policy(path, dtype=dtype, device=device)
        return train.delta_run(model, tok, cfg, model_path=path)
    params = dict(model=policy.fingerprint(path), dtype=dtype, device=device, **train.run_params(cfg))
    return cache.cached("delta_run", params, compute)


# %% [markdown]
# ## Noise floor
# ε must sit above the numerical noise of the measurement. We measure Δlog p (i) between two
# forward passes with no update and (ii) across an Adam step whose token weights are all zero,
# on a batch sampled from the policy; and (iii) the round-off of the log-probs themselves: the
# median |log p| difference between a lower and a higher precision copy of the same weights —
# float32 against the float64 analysis on the tiny profile (why it runs in float64), the
# analysis dtype against float64 on the paper profile (what ε must clear there).

# %%
model, tok = policy.load_policy(model_path, dtype=dtype, device=device)
probe = rollout.sample(model, tok, replace(base_cfg.sample_config(model), backend="hf"), seed=seed + 99)  # one batch: HF
zero_w = torch.zeros(probe.input_ids.shape, dtype=torch.float64)
floor = measure.noise_floor(model, probe, chunk_rows, token_chunk=token_chunk, step_fn=lambda m, b: grpo.grpo_step(
    m, b, replace(base_cfg.update, n_minibatches=1), token_weight=zero_w))
low, high = ("float32", model) if dtype == "float64" else (dtype, policy.cast(model, "float64"))
lo_model = policy.cast(model, "float32") if dtype == "float64" else model
lp_lo = measure.token_stats(lo_model, probe, chunk_rows, token_chunk=token_chunk).logp.double()
lp_hi = measure.token_stats(high, probe, chunk_rows, token_chunk=token_chunk).logp.double()
floor[f"{low}_roundoff"] = float((lp_lo - lp_hi)[probe.response_mask].abs().median())
del lo_model, high
noise = pd.DataFrame([{"measurement": k, "max_abs_delta": v} for k, v in floor.items()])
noise["eps"] = eps
cache.write_table(noise, Path(results_dir) / "fig01_noise_floor.parquet")
print(f"probe batch: {len(probe)} rollouts, {probe.n_tokens} response tokens, "
      f"accuracy {probe.reward.float().mean():.2f}, mixed groups {probe.mixed_groups()}/{n_prompts}")
if source.reward_report():
    print(source.reward_report())
print(noise.to_string(index=False))
assert floor["repeat"] < eps and floor["zero_update"] < eps, "noise floor above ε: raise eps or the precision"

# %% [markdown]
# ## The runs
# One GRPO run (`grpo` weights) and one positive-only run (`positive_only`: A·1[r = 1], the
# negative rollouts' loss weights set to 0) from the same saved policy, with the same prompts
# and seeds. Results are cached under `data/cache/`, so a rerun that changes only plotting is
# instant.

# %%
runs = {
    "grpo": run(model_path, base_cfg),
    "positive_only": run(model_path, replace(base_cfg, update=replace(base_cfg.update, reweight="positive_only"))),
}
tokens = pd.concat([df.assign(run=name) for name, df in runs.items()], ignore_index=True)
signed = tokens[tokens.sign != "zero"]
frac = measure.flip_fractions(signed, by=("run", "step", "sign"))
acc = tokens.groupby(["run", "step", "rollout"]).reward.first().groupby(["run", "step"]).mean().rename("accuracy")
cache.write_table(frac, Path(results_dir) / "fig01_flip_fractions.parquet")
cache.write_table(signed[signed.run == "grpo"][["step", "sign", "delta", "status", "entropy", "prob", "token_id"]],
                  Path(results_dir) / "fig01_token_deltas.parquet")
summary = frac.groupby(["run", "sign", "status"]).fraction.agg(["mean", "std"]).unstack("status")
print(acc.unstack("run").round(3).T.to_string())
summary.round(3)

# %% [markdown]
# ## Fig. 1

# %%
import matplotlib.pyplot as plt

fig, axes = plots.figure(ncols=4, width=plots.WIDTH_2COL, height=2.3)
for ax, sign, title in ((axes[0], "pos", "(a) positive rollouts"), (axes[1], "neg", "(b) negative rollouts")):
    d = frac[(frac.run == "grpo") & (frac.sign == sign)]
    for status in measure.STATUSES:
        s = d[d.status == status]
        ax.plot(s.step, s.fraction, marker="o", ms=2.5, lw=1.2, color=plots.STATUS_COLORS[status], label=status)
    ax.set(title=title, xlabel="training step", ylim=(0, 1))
axes[0].set_ylabel("share of tokens")
fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.3, -0.02))
d = signed[(signed.run == "grpo") & (signed.status != "stable")]
bins = np.linspace(np.log10(eps), np.log10(max(d.delta.abs().max(), 10 * eps)), 40)
for sign in ("pos", "neg"):
    x = np.log10(d[d.sign == sign].delta.abs())
    axes[2].hist(x, bins=bins, histtype="step", lw=1.2, density=True, color=plots.SIGN_COLORS[sign],
                 label={"pos": "A > 0", "neg": "A < 0"}[sign])
axes[2].set(title="(c) |Δlog p|, GRPO run", xlabel="log10 |Δlog p|  (|Δ| > ε)", ylabel="density")
axes[2].set_ylim(0, axes[2].get_ylim()[1] * 1.3)
axes[2].legend(frameon=False, loc="upper right", fontsize=6)
d = frac[(frac.run == "positive_only") & (frac.status != "stable")]
for (sign, status), s in d.groupby(["sign", "status"]):
    axes[3].plot(s.step, s.fraction, marker="o" if sign == "pos" else "s", ms=2.5, lw=1.2,
                 color=plots.STATUS_COLORS[status], ls="-" if sign == "pos" else "--",
                 label="A > 0" if (sign, status) == ("pos", "boosted") else "A < 0" if (sign, status) == ("neg", "boosted") else None)
axes[3].set(title="(d) positive-only run", xlabel="training step", ylim=(0, 1))
axes[3].legend(frameon=False, loc="upper right", fontsize=6, handlelength=2.2)
fig.tight_layout(rect=(0, 0.07, 1, 1))
plots.save(fig, "fig01_token_flipping", fig_dir)
plt.show()

# %% [markdown]
# ## What the numbers say
# The cell below prints the mean share (± s.d. over steps) of boosted and suppressed tokens per
# rollout sign for both runs, and the mean |Δlog p| per sign. The paper's claims: (a) ≈ (b),
# magnitudes similar, and under positive-only training the flipping largely disappears.

# %%
def share(run, sign, status):
    s = frac[(frac.run == run) & (frac.sign == sign) & (frac.status == status)].fraction
    return f"{100 * s.mean():.1f}% ± {100 * s.std():.1f}"


mag = signed[signed.run == "grpo"].assign(a=lambda x: x.delta.abs()).groupby("sign").a.agg(["mean", "median"])
for r in runs:
    print(f"{r:>14}: positive rollouts boosted {share(r, 'pos', 'boosted')}, suppressed {share(r, 'pos', 'suppressed')}"
          f" | negative rollouts boosted {share(r, 'neg', 'boosted')}, suppressed {share(r, 'neg', 'suppressed')}")
print(f"|Δlog p| (grpo run), median / mean: positive rollouts {mag['median'].get('pos', np.nan):.2e} / "
      f"{mag['mean'].get('pos', np.nan):.2e}, negative rollouts {mag['median'].get('neg', np.nan):.2e} / "
      f"{mag['mean'].get('neg', np.nan):.2e}")
grpo_gap = (frac[(frac.run == "grpo") & (frac.status == "boosted")].pivot(index="step", columns="sign", values="fraction"))
pos_gap = (frac[(frac.run == "positive_only") & (frac.status == "boosted")].pivot(index="step", columns="sign", values="fraction"))
print(f"boosted share, positive minus negative rollouts: grpo {100 * (grpo_gap.pos - grpo_gap.neg).mean():+.1f} pts, "
      f"positive-only {100 * (pos_gap.pos - pos_gap.neg).mean():+.1f} pts")
# Tokens the policy is sure of (p > 0.9) barely move under any update; among the uncertain ones:
unsure = measure.flip_fractions(signed[signed.prob < 0.9], by=("run", "sign"))
print(f"share of tokens with p < 0.9: {(signed.prob < 0.9).mean():.1%}; their status shares:")
print(unsure.pivot_table(index=["run", "sign"], columns="status", values="fraction").round(3).to_string())

# %% [markdown]
# ## Claims and reading
# Each claim below is built from the values computed above and recorded in
# `claims.parquet` with the rule that decides its verdict (`cancellation.claims`). Intervals over
# training steps are Student-t intervals of the per-step quantity (steps share the policy's
# trajectory, so they are a rough guide, not independent draws).

# %%
from cancellation import claims as C
from cancellation import stats as S


def per_step(run_name, status, strata=None, e=eps):
    """Per-step share of `status` tokens among positive minus negative rollouts (points)."""
    d = signed[signed.run == run_name] if strata is None else signed[(signed.run == run_name) & strata]
    st = measure.classify(d.delta, e) if e != eps else d.status
    f = pd.crosstab([d.step, d.sign], st, normalize="index").reindex(columns=list(measure.STATUSES), fill_value=0)
    f = f[status].unstack("sign")
    return 100 * (f["pos"] - f["neg"])


g = signed[signed.run == "grpo"].assign(a=lambda x: x.delta.abs())
step_mag = g.groupby(["step", "sign"]).a.agg(["median", "mean"]).unstack("sign")
supp = frac[(frac.sign == "pos") & (frac.status == "suppressed")].pivot(index="step", columns="run", values="fraction")
conf = signed.prob >= 0.9
rows = [
    C.Claim("fig01_ab_boosted", "Fig. 1(a,b)", "positive and negative rollouts have similar boosted shares", "similar",
            *S.t_interval(per_step("grpo", "boosted")), n=len(grpo_gap), unit="pts (pos − neg)",
            rule="similar", params=dict(tol=10), detail=f"boosted {share('grpo', 'pos', 'boosted')} vs "
            f"{share('grpo', 'neg', 'boosted')} (mean ± s.d. over steps)"),
    C.Claim("fig01_ab_suppressed", "Fig. 1(a,b)", "positive and negative rollouts have similar suppressed shares",
            "similar", *S.t_interval(per_step("grpo", "suppressed")), n=len(grpo_gap), unit="pts (pos − neg)",
            rule="similar", params=dict(tol=10), detail=f"suppressed {share('grpo', 'pos', 'suppressed')} vs "
            f"{share('grpo', 'neg', 'suppressed')}"),
    C.Claim("fig01_ab_boosted_uncertain", "Fig. 1(a,b), p < 0.9", "similar boosted shares among uncertain tokens",
            "similar", *S.t_interval(per_step("grpo", "boosted", ~conf)), n=len(grpo_gap), unit="pts (pos − neg)",
            rule="similar", params=dict(tol=10), detail=f"{100 * (~conf).mean():.1f}% of tokens have p < 0.9"),
    C.Claim("fig01_ab_boosted_confident", "Fig. 1(a,b), p ≥ 0.9", "similar boosted shares among confident tokens",
            "similar", *S.t_interval(per_step("grpo", "boosted", conf)), n=len(grpo_gap), unit="pts (pos − neg)",
            rule="similar", params=dict(tol=10),
            detail=f"median |Δ| of confident tokens {g[g.prob >= 0.9].a.median():.1e} (ε = {eps:g})"),
    C.Claim("fig01_c_median", "Fig. 1(c)", "similar |Δlog p| for both signs (median)", "similar",
            *S.t_interval(np.log10(step_mag["median"]["neg"] / step_mag["median"]["pos"])), n=len(step_mag),
            unit="log10(neg/pos)", rule="similar", params=dict(tol=0.3),
            detail=f"median {mag['median'].get('pos', np.nan):.1e} vs {mag['median'].get('neg', np.nan):.1e}"),
    C.Claim("fig01_c_mean", "Fig. 1(c)", "similar |Δlog p| for both signs (mean)", "similar",
            *S.t_interval(np.log10(step_mag["mean"]["neg"] / step_mag["mean"]["pos"])), n=len(step_mag),
            unit="log10(neg/pos)", rule="similar", params=dict(tol=0.3),
            detail=f"mean {mag['mean'].get('pos', np.nan):.1e} vs {mag['mean'].get('neg', np.nan):.1e}"),
    C.Claim("fig01_d_drop", "Fig. 1(d)", "flipping largely disappears under positive-only training",
            "large drop", *S.t_interval(1 - supp["positive_only"] / supp["grpo"]), n=len(supp),
            unit="relative drop of suppressed share in A>0 rollouts", rule="direction", params=dict(sign=1, ref=0.5),
            detail=f"suppressed in A>0 rollouts {share('grpo', 'pos', 'suppressed')} → "
            f"{share('positive_only', 'pos', 'suppressed')}; A<0 rollouts boosted under positive-only "
            f"{share('positive_only', 'neg', 'boosted')}"),
]

# %% [markdown]
# ε sensitivity and confidence strata: the boosted share of positive minus negative rollouts
# (GRPO run, mean over steps, points) at ε from 1e-7 to 1e-4, for all tokens and by confidence.

# %%
sens = pd.DataFrame([{"eps": e, "stratum": name, "boosted_pos_minus_neg": per_step("grpo", "boosted", m, e).mean(),
                      "stable_share": float((measure.classify(signed[(signed.run == "grpo") & m].delta, e)
                                             == "stable").mean())}
                     for e in (1e-7, 1e-6, 1e-5, 1e-4)
                     for name, m in (("all", signed.prob >= 0), ("p<0.9", ~conf), ("p>=0.9", conf))])
cache.write_table(sens, Path(results_dir) / "fig01_eps_sensitivity.parquet")
print(sens.pivot(index="eps", columns="stratum").round(2).to_string())

# %% [markdown]
# What the numbers say (the printed lines are generated from the values above). Tokens the
# policy is sure of (p ≥ 0.9) move by amounts near ε, so their boosted/suppressed split depends on
# ε; the uncertain tokens carry most of |Δ|. Our reading of (d): the shared scaffold and digit
# tokens of negative rollouts are pulled up by the same tokens in positive rollouts (the coupling
# of Fig. 2), and Adam's sign-like first steps spread the update over all parameters, so a
# token's own weight matters little at this scale.

# %%
print(f"tiny-profile run: {Path(model_path).name}, {steps} Adam steps at lr {lr:g}, {n_prompts} prompts × {G} "
      f"rollouts, {n_minibatches} mini-batches per step; noise floor: repeat {floor['repeat']:.1e}, "
      f"zero update {floor['zero_update']:.1e} (ε = {eps:g})")
print(f"stable tokens (|Δ| ≤ ε): {100 * (signed[signed.run == 'grpo'].status == 'stable').mean():.1f}%; "
      f"uncertain tokens (p < 0.9): {100 * (~conf).mean():.1f}%")
claim_rows = rows

# %% [markdown]
# ## Fig. 1(d): which tokens are suppressed in positive rollouts, and a fixed-scaffold control
# Under GRPO a token of a rewarded rollout can be suppressed because the same token is pushed
# down in negative rollouts (the paper's reading) — or, on the tiny task, because it is one of
# several interchangeable scaffold wordings (First/Begin/Start, ...) whose rivals were rewarded
# elsewhere in the batch. The table gives the category (`data/categories/category_map.csv`) of
# the suppressed tokens in A > 0 rollouts per run. The control repeats both runs on
# `control_model_path`, a policy pretrained on traces with **one** wording per scaffold slot, so
# scaffold tokens there are shared by every rollout, as a real model's template is.

# %%
cz = categories.Categorizer(tagger=tagger)


def suppressed_categories(df):
    """Share of each category among the suppressed tokens of A > 0 rollouts (one run)."""
    d = df[df.sign == "pos"].copy()
    d["category"] = cz.tag_table(d, tok, seq_cols=("step", "rollout"))["category"]
    return d[d.status == "suppressed"].category.value_counts(normalize=True)


def drop_claim(runs_, cid, label, what=""):
    sp = pd.concat({r: measure.flip_fractions(df[df.sign != "zero"], by=("step", "sign")) for r, df in runs_.items()},
                   names=["run"]).reset_index(level=0)
    sp = sp[(sp.sign == "pos") & (sp.status == "suppressed")].pivot(index="step", columns="run", values="fraction")
    return C.Claim(cid, label, f"flipping largely disappears under positive-only training{what}", "large drop",
                   *S.t_interval(1 - sp["positive_only"] / sp["grpo"]), n=len(sp),
                   unit="relative drop of suppressed share in A>0 rollouts", rule="direction",
                   params=dict(sign=1, ref=0.5), detail=f"suppressed share in A>0 rollouts "
                   f"{100 * sp['grpo'].mean():.1f}% → {100 * sp['positive_only'].mean():.1f}% (mean over steps)")


comp = {(Path(model_path).name, r): suppressed_categories(df) for r, df in runs.items()}
if control_model_path:
    control_runs = {"grpo": run(control_model_path, base_cfg),
                    "positive_only": run(control_model_path,
                                         replace(base_cfg, update=replace(base_cfg.update, reweight="positive_only")))}
    comp.update({(Path(control_model_path).name + " (control)", r): suppressed_categories(df)
                 for r, df in control_runs.items()})
    claim_rows.append(drop_claim(control_runs, "fig01_d_drop_fixed_scaffold", "Fig. 1(d), fixed-scaffold control",
                                 " (fixed scaffold)"))
    cacc = pd.concat({r: df.groupby(["step", "rollout"]).reward.first().groupby("step").mean()
                      for r, df in control_runs.items()}, axis=1)
    print(f"control accuracy per step (mean over steps): grpo {cacc.grpo.mean():.3f}, "
          f"positive-only {cacc.positive_only.mean():.3f}")
    cf = pd.concat({r: measure.flip_fractions(df[df.sign != "zero"], by=("step", "sign")) for r, df in
                    control_runs.items()}, names=["run"]).reset_index(level=0)
    print("control: share of tokens per status (mean over steps), as Fig. 1(a,b,d):\n" +
          cf.groupby(["run", "sign", "status"]).fraction.mean().unstack("status").round(3).to_string())
comp = pd.DataFrame(comp).T.fillna(0.0).rename_axis(["policy", "run"])
cache.write_table(comp.reset_index(), Path(results_dir) / "fig01_suppressed_categories.parquet")
print("categories of the suppressed tokens in A > 0 rollouts (share of those tokens):")
print(comp.to_string(float_format=lambda v: f"{100 * v:.1f}%"))
print(claim_rows[-1].detail if control_model_path else "no control policy (control_model_path is empty)")

# %% [markdown]
# ## Fig. 9 — across models
# The same GRPO run (fewer steps) for every model of the profile; rows are models, columns the
# share of boosted / suppressed / stable tokens among positive, negative and all rollouts.

# %%
rows = []
for path in models:
    df = runs["grpo"] if (path == model_path and fig9_steps <= steps) else run(path, replace(base_cfg, steps=fig9_steps))
    df = df[(df.step < fig9_steps) & (df.sign != "zero")]
    f = pd.concat([measure.flip_fractions(df, by=("step", "sign")),
                   measure.flip_fractions(df.assign(sign="all"), by=("step", "sign"))])
    rows.append(f.assign(model=Path(path).name))
fig9 = pd.concat(rows, ignore_index=True)
cache.write_table(fig9, Path(results_dir) / "fig09_flip_fractions.parquet")

fig, axes = plots.figure(ncols=3, nrows=len(models), width=plots.WIDTH_2COL, height=1.6 * len(models), squeeze=False)
for i, (name, d) in enumerate(fig9.groupby("model", sort=False)):
    for j, status in enumerate(measure.STATUSES):
        ax = axes[i, j]
        for sign in ("pos", "neg", "all"):
            s = d[(d.sign == sign) & (d.status == status)]
            ax.plot(s.step, s.fraction, marker="o", ms=2, lw=1.1, color=plots.SIGN_COLORS[sign],
                    ls=":" if sign == "all" else "-", label={"pos": "A > 0", "neg": "A < 0", "all": "all"}[sign])
        ax.set(ylim=(0, 1), title=f"{name}: {status}")
        if i == len(models) - 1:
            ax.set_xlabel("training step")
        if j == 0:
            ax.set_ylabel("share of tokens")
axes[0, 0].legend(frameon=False)
fig.tight_layout()
plots.save(fig, "fig09_flipping_across_models", fig_dir)
plt.show()
fig9.groupby(["model", "sign", "status"]).fraction.mean().unstack("status").round(3)

# %%
for name, d in fig9[fig9.status == "boosted"].groupby("model", sort=False):
    p = d.pivot(index="step", columns="sign", values="fraction")
    claim_rows.append(C.Claim(f"fig09_{name}", "Fig. 9", f"{name}: similar boosted shares for both signs", "all models",
                              *S.t_interval(100 * (p["pos"] - p["neg"])), n=len(p), unit="pts (pos − neg)",
                              rule="similar", params=dict(tol=10)))
C.record(results_dir, "01", claim_rows);
