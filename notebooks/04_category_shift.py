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
# # Fig. 4 — where the boosted mass goes: positive-only vs GRPO
#
# *Paper, §3 and App. E.1 (Algorithm 2).* From one saved checkpoint θ₀ and one rollout batch B,
# take two single updates: **positive-only** (advantages A·1[r = 1]) and **GRPO** (the original
# A), each from θ₀ (`grpo.trial_delta`: snapshot, step, measure, restore), and measure
# Δlog p = log π_θ'(o_t|s_t) − log π_θ₀(o_t|s_t) on the **whole** batch for both. Every response
# token is tagged Math / Template / Reasoning / Other (`cancellation.categories`: detokenise to
# words, NLTK POS tags plus the rules of the category table `category_map`, tags mapped back to
# tokens). Per category we sum the *boosted mass* Σ max(Δ, 0) and the *suppressed mass*
# Σ max(−Δ, 0), and take each category's share of all boosted mass.
#
# The paper's claim: compared with positive-only, GRPO "greatly weakens updates on template and
# formatting tokens and shifts emphasis toward reasoning tokens" — tokens shared by positive and
# negative rollouts receive opposing signals that cancel.
#
# The update is the causal-analysis update of App. D.2/D.3: plain SGD (no momentum), one step on
# the whole batch, verl's token-mean clipped loss, all parameters, float64 on the tiny profile
# (Adam's first step is sign descent and would wash out the per-token magnitudes we compare).
# The experiment is repeated on `n_batches` independent batches (different prompts and sampling
# seeds); intervals are 95% t-intervals over batches.
#
# **Tagging on the tiny task is by role** (`data/categories/arithmetic_roles.csv`, editable): the
# digits a column computes, the digit written, carry/borrow amounts and words and the boxed answer
# are the decisions (Reasoning); operands and operators copied from the prompt are Math; scaffold
# wording and punctuation are Template. The word table the paper's POS reading uses
# (`compare_map`) is shown beside it: there, only carry/no/borrow are Reasoning.
#
# **Control** (`control_model_path`): the same batches on a policy pretrained on a *fixed
# scaffold* (one wording per slot, `tiny-m-fixed`), so the reader can see which verdicts come
# from the tiny task's random scaffold wording rather than from the update rule.

# %% tags=["parameters"]
profile = "tiny"                     # parameter profile (set by the runner)
fig_dir = "figures/tiny"             # where figures go (set by the runner)
results_dir = "data/results/tiny"    # where tidy tables go (set by the runner)
model_path = "data/policies/tiny-m"  # the saved checkpoint θ₀
dtype = "float64"                    # analysis and update precision
device = "cpu"                       # cpu or cuda
n_batches = 40                       # independent rollout batches (one per seed)
n_prompts = 8                        # prompts per batch
G = 8                                # rollouts per prompt
lr = 0.1                             # SGD learning rate (the paper's causal analyses use 0.1)
scope = "full"                       # 'full' (all parameters) or 'lm_head'
chunk_rows = 64                      # rows per forward chunk (lower on a GPU with long responses)
temperature = 1.0                    # sampling temperature
max_new_tokens = 96                  # response length cap
eps = 1e-6                           # boosted/suppressed threshold for the token counts
tagger = "shipped"                   # 'shipped' (NLTK lexicon+RegexpTagger; same tables everywhere), 'auto', 'perceptron'
category_map = "data/categories/arithmetic_roles.csv"  # category table; empty: data/categories/category_map.csv
compare_map = "data/categories/category_map.csv"       # a second table whose verdicts are shown beside; empty: none
control_model_path = "data/policies/tiny-m-fixed"      # fixed-scaffold control policy (same batch seeds); empty: none
top_k = 14                           # tokens in the panel of largest Δlog p differences
min_count = 20                       # a token type needs this many occurrences to enter that panel
problems_path = ""                   # real problems (DAPO-Math-17k / MATH-500 / prompt+answer file); empty: generated arithmetic
prompt_format = "auto"               # 'auto' (chat template when the tokenizer has one), 'chat' or 'raw'
token_chunk = 4096                   # positions per LM-head chunk (bounds the batch x vocabulary tensors)
gradient_checkpointing = False       # recompute activations in the backward (large models)
seed = 0                             # first batch seed (batch i uses seed + 1000 + i)

# %%
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from tqdm import tqdm

from cancellation import cache, categories, grpo, measure, plots, policy, rollout, tasks

logging.basicConfig(level=logging.WARNING)
torch.manual_seed(seed)
Path(results_dir).mkdir(parents=True, exist_ok=True)
UPDATES = ("positive_only", "grpo")
LABELS = {"positive_only": "positive-only", "grpo": "GRPO"}
COLORS = {"positive_only": plots.PALETTE[0], "grpo": plots.PALETTE[1]}

source = tasks.ProblemSource(path=problems_path, prompt_format=prompt_format)
source.load()  # a malformed problem file stops here, before any model loads
scfg = rollout.SampleConfig(n_prompts=n_prompts, G=G, temperature=temperature, max_new_tokens=max_new_tokens,
                            device=device, source=source, token_chunk=token_chunk)
_loaded = {}


def load(path):
    if path not in _loaded:
        _loaded.clear()  # one model in memory at a time
        _loaded[path] = policy.load_policy(path, dtype=dtype, device=device)
    return _loaded[path]


def batch_deltas(i, path=model_path):
    """Algorithm 2 on batch i of the policy at `path`: the token table with Δlog p under both updates (cached)."""
    bseed = seed + 1000 + i

    def compute():
        model, tok = load(path)
        batch = rollout.sample(model, tok, scfg, seed=bseed)
        before = measure.token_stats(model, batch, chunk_rows, token_chunk=token_chunk)
        df = measure.token_table(batch, before, tokenizer=tok).assign(batch=i)
        m = batch.response_mask
        for rw in UPDATES:
            cfg = grpo.UpdateConfig(optimizer="sgd", lr=lr, scope=scope, reweight=rw, chunk_rows=chunk_rows,
                                    token_chunk=token_chunk, gradient_checkpointing=gradient_checkpointing)
            df[f"delta_{rw}"] = grpo.trial_delta(model, batch, cfg, before.logp)[m].double().cpu().numpy()
        # θ₀ must come back exactly for the second update (Algorithm 2, line 10): same forward, Δ = 0
        again = measure.token_stats(model, batch, chunk_rows, token_chunk=token_chunk)
        df["restore_error"] = float((again.logp - before.logp)[m].abs().max())
        df["mixed_groups"] = batch.mixed_groups()
        return df

    params = dict(model=policy.fingerprint(path), dtype=dtype, device=device, i=i, seed=seed,
                  n_prompts=n_prompts, G=G, lr=lr, scope=scope, chunk_rows=chunk_rows, temperature=temperature,
                  max_new_tokens=max_new_tokens, source=source.params())
    return cache.cached("category_shift", params, compute)


def batches(path, what):
    """All batches of one policy, tagged; batches without a mixed-reward group are left out."""
    t0 = time.time()
    df = pd.concat([batch_deltas(i, path) for i in tqdm(range(n_batches), desc=what, leave=False)], ignore_index=True)
    df[["category", "word"]] = cz.tag_table(df, tok, seq_cols=("batch", "rollout"))
    per = df.groupby("batch").agg(accuracy=("reward", "mean"), mixed_groups=("mixed_groups", "first"),
                                  restore_error=("restore_error", "first"), n_tokens=("token_id", "size"))
    assert per.restore_error.max() == 0.0, "θ₀ was not restored exactly between the two updates"
    # a batch without a mixed-reward group has A = 0 everywhere: neither update moves anything
    empty = per.index[per.mixed_groups == 0].tolist()
    print(f"{what}: {n_batches} batches x {n_prompts * G} rollouts, {len(df)} response tokens, accuracy "
          f"{per.accuracy.mean():.2f}, mixed groups per batch {per.mixed_groups.mean():.1f}/{n_prompts}, "
          f"{time.time() - t0:.0f} s (cached batches are instant)"
          + (f"; batches {empty} have no mixed-reward group (no update signal) and are left out" if empty else ""))
    df = df[~df.batch.isin(empty)].reset_index(drop=True)
    if df.empty:
        raise ValueError("no batch has a mixed-reward group: raise n_prompts or G")
    return df


cz = categories.Categorizer(category_map or None, tagger=tagger)
tok = load(model_path)[1]
tokens = batches(model_path, Path(model_path).name)
print(f"category table: {category_map or categories.DEFAULT_MAP}, tagger={cz.tagger}")

# %% [markdown]
# ## Tagging check
# How each token type of the batch was tagged (with the word it belongs to), so a reader can
# audit the category table. Edit the table (`category_map`; the role table includes the word
# table `data/categories/category_map.csv`) to change a choice; the cached Δlog p are re-tagged on
# the next run without recomputing.

# %%
audit = (tokens.groupby(["category", "token"]).size().rename("n").reset_index()
         .sort_values(["category", "n"], ascending=[True, False]))
for c, d in audit.groupby("category", sort=False):
    print(f"{c:>9} ({d.n.sum():6d} tokens): " + "  ".join(f"{t}×{n}" for t, n in zip(d.token, d.n)))

# %% [markdown]
# ## Boosted and suppressed mass per category

# %%
mass, summary, per = categories.share_shift(tokens, UPDATES, eps=eps)
shift = categories.shift_summary(per).assign(measure="boosted_share_shift")
table = pd.concat([summary, shift.drop(columns="n").assign(update="grpo - positive_only")], ignore_index=True)
cache.write_table(mass, Path(results_dir) / "fig04_category_mass_per_batch.parquet")
cache.write_table(table, Path(results_dir) / "fig04_category_shift.parquet")
view = summary[summary.measure.isin(["boosted_mass", "suppressed_mass", "boosted_share", "n_tokens"])]
view.pivot_table(index=["category"], columns=["measure", "update"], values="mean").round(4)

# %% [markdown]
# ## Tokens whose Δlog p differs most between the two updates
# Per token type with at least `min_count` occurrences: mean Δlog p under each update over all
# its occurrences in all batches, ranked by |mean Δ_GRPO − mean Δ_positive-only|.

# %%
per_type = (tokens.groupby(["token", "category"])
            .agg(n=("token_id", "size"), mean_delta_positive_only=("delta_positive_only", "mean"),
                 mean_delta_grpo=("delta_grpo", "mean"), prob=("prob", "mean")).reset_index())
per_type["difference"] = per_type.mean_delta_grpo - per_type.mean_delta_positive_only
top = (per_type[per_type.n >= min_count].assign(a=lambda d: d.difference.abs())
       .nlargest(top_k, "a").drop(columns="a").reset_index(drop=True))
cache.write_table(top, Path(results_dir) / "fig04_top_tokens.parquet")
occ = tokens.assign(difference=tokens.delta_grpo - tokens.delta_positive_only)
occ = occ.loc[occ.difference.abs().nlargest(8).index, ["batch", "rollout", "position", "token", "category", "reward",
                                                        "prob", "delta_positive_only", "delta_grpo"]]
print("single occurrences with the largest difference (with the 6 tokens before them):")
for r in occ.itertuples():
    ctx = tokens[(tokens.batch == r.batch) & (tokens.rollout == r.rollout) & (tokens.position < r.position)
                 & (tokens.position >= r.position - 6)].sort_values("position").token
    print(f"  ...{' '.join(ctx)} [{r.token}] ({r.category}, r={r.reward:.0f}, p={r.prob:.2f}): "
          f"Δ positive-only {r.delta_positive_only:+.2e}, Δ GRPO {r.delta_grpo:+.2e}")
top.round(5)

# %% [markdown]
# ## Fig. 4

# %%
import matplotlib.pyplot as plt

share_of = tokens.category.value_counts(normalize=True)
cats = [c for c in categories.CATEGORIES if share_of.get(c, 0) >= 0.001]  # a few stray tokens say nothing
x = np.arange(len(cats))
fig, axes = plots.figure(ncols=2, nrows=2, width=plots.WIDTH_2COL, height=4.3)


def bars(ax, meas, sign=1, alpha=1.0):
    for k, u in enumerate(UPDATES):
        s = summary[(summary["update"] == u) & (summary.measure == meas)].set_index("category").loc[cats]
        ax.bar(x + (k - 0.5) * 0.38, sign * s["mean"], 0.38, yerr=[s["mean"] - s.lo, s.hi - s["mean"]], capsize=2,
               color=COLORS[u], alpha=alpha, label=LABELS[u] if sign > 0 else None, error_kw={"lw": 0.8})
    ax.set_xticks(x, cats)


ax = axes[0, 0]
bars(ax, "boosted_share")
ax.set(ylabel="share of all boosted mass", title="(a) share of boosted mass Σmax(Δ,0)", ylim=(0, 1))
ax.legend(frameon=False)
ax = axes[0, 1]
s = shift.set_index("category").loc[cats]
ax.errorbar(x, s["mean"], yerr=[s["mean"] - s.lo, s.hi - s["mean"]], fmt="o", color="k", capsize=3, ms=4)
ax.axhline(0, color="k", lw=0.6)
ax.set_xticks(x, cats)
ax.set(ylabel="share: GRPO − positive-only", title="(b) paired shift of the boosted share (95% CI)")
ax = axes[1, 0]
bars(ax, "boosted_mass")
bars(ax, "suppressed_mass", sign=-1, alpha=0.45)
ax.axhline(0, color="k", lw=0.6)
ax.set(ylabel="mass per batch", title="(c) boosted (up) and suppressed (down) mass")
ax = axes[1, 1]
scale = 10.0 ** np.floor(np.log10(max(top[["mean_delta_positive_only", "mean_delta_grpo"]].abs().max().max(), 1e-300)))
y = np.arange(len(top))[::-1]
ax.barh(y + 0.2, top.mean_delta_positive_only / scale, 0.4, color=COLORS["positive_only"])
ax.barh(y - 0.2, top.mean_delta_grpo / scale, 0.4, color=COLORS["grpo"])
shown = [tok.convert_tokens_to_string([t]).strip() or repr(t) for t in top.token]  # byte-level 'Ġx' -> 'x'
ax.set_yticks(y, [f"[{c[0]}] {t}".replace("$", r"\$") for t, c in zip(shown, top.category)], fontsize=6.5)
ax.axvline(0, color="k", lw=0.6)
ax.set(xlabel=f"mean Δlog p per occurrence (×{scale:.0e})",
       title="(d) tokens that differ most ([M]ath [T]emplate [R]easoning)")
fig.tight_layout()
plots.save(fig, "fig04_category_shift", fig_dir)
plt.show()

# %% [markdown]
# ## What the numbers say
# The claim holds at this scale if GRPO's share of boosted mass on Template tokens is lower than
# positive-only's and its share on Reasoning tokens higher, with 95% intervals (over batches) of
# the paired difference excluding zero. The cell below prints that test.

# %%
sh = shift.set_index("category")


def fmt(c, meas="boosted_share", u=None):
    d = table[(table.category == c) & (table.measure == meas) & ((table["update"] == u) if u else True)].iloc[0]
    return f"{d['mean']:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]" if meas.endswith("shift") else f"{d['mean']:.4f}"


def moved(p, c, want):
    """How many batches move category c's boosted share in the paper's direction."""
    return f"{int((np.sign(p[c]) == want).sum())} of {int(p[c].notna().sum())} batches"


for c in cats:
    print(f"{c:>9}: boosted share positive-only {fmt(c, u='positive_only')}, GRPO {fmt(c, u='grpo')}; "
          f"paired shift GRPO − positive-only {fmt(c, 'boosted_share_shift')}")
for c, want in (("Template", -1), ("Reasoning", 1)):
    if c in per:
        print(f"  {c}: {moved(per, c, want)} move in the paper's direction")
tot = mass.groupby(["update", "batch"])[["boosted_mass", "suppressed_mass"]].sum().groupby("update").mean()
print("total mass per batch:\n" + tot.to_string())
# where the Template mass sits: confident scaffold (p > 0.9) vs uncertain wording choices
long = pd.concat([tokens.assign(update=u, delta=tokens[f"delta_{u}"]) for u in UPDATES], ignore_index=True)
conf = long.assign(confident=np.where(long.prob > 0.9, "p>0.9", "p<=0.9"))
conf = categories.category_mass(conf, "delta", by=("update", "batch", "confident"), eps=eps)
conf = conf[conf.category == "Template"].groupby(["confident", "update"])[["n_tokens", "boosted_mass",
                                                                             "suppressed_mass"]].mean()
print("Template tokens by confidence (means per batch):\n" + conf.round(4).to_string())

# %% [markdown]
# ## Which verdicts come from the tagging and which from the scaffold wording
# The same Δlog p tagged with the word table (`compare_map`), and the same batch seeds on the
# fixed-scaffold control policy (`control_model_path`, tagged with `category_map`). One row per
# setting; the columns are the paired shifts of the boosted share (GRPO − positive-only) with
# 95% t intervals over batches.

# %%
settings = {f"{Path(model_path).name}, {Path(category_map or categories.DEFAULT_MAP).stem}": (tokens, per)}
if compare_map:
    cz_words = categories.Categorizer(compare_map, tagger=tagger)
    words = tokens.drop(columns=["category", "word"])
    words[["category", "word"]] = cz_words.tag_table(words, tok, seq_cols=("batch", "rollout"))
    settings[f"{Path(model_path).name}, {Path(compare_map).stem}"] = (words, categories.share_shift(words, UPDATES, eps=eps)[2])
if control_model_path:
    control = batches(control_model_path, Path(control_model_path).name)
    settings[f"{Path(control_model_path).name} (control), {Path(category_map or categories.DEFAULT_MAP).stem}"] = (
        control, categories.share_shift(control, UPDATES, eps=eps)[2])
rows = []
for name, (df, p) in settings.items():
    share_of_tokens = df.category.value_counts(normalize=True)
    _, summ, _ = categories.share_shift(df, UPDATES, eps=eps)
    share = summ[summ.measure == "boosted_share"].pivot(index="category", columns="update", values="mean")
    for r in categories.shift_summary(p).itertuples():
        rows.append(dict(setting=name, category=r.category, shift=r.mean, lo=r.lo, hi=r.hi, n=r.n,
                         token_share=share_of_tokens.get(r.category, 0.0),
                         **{f"boosted_share_{u}": share.loc[r.category, u] for u in UPDATES}))
compare = pd.DataFrame(rows)
compare = compare[compare.token_share >= 0.001]  # categories with a handful of stray tokens say nothing
cache.write_table(compare, Path(results_dir) / "fig04_settings.parquet")
compare.assign(tokens=lambda d: (100 * d.token_share).map("{:.1f}%".format),
               **{"boosted share (positive-only → GRPO)": lambda d: d.apply(
                   lambda r: f"{r.boosted_share_positive_only:.3f} → {r.boosted_share_grpo:.3f}", axis=1),
                  "paired shift [95% CI]": lambda d: d.apply(
                      lambda r: f"{r['shift']:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}]", axis=1)}) \
    .set_index(["setting", "category"])[["tokens", "boosted share (positive-only → GRPO)", "paired shift [95% CI]"]]

# %%
fig, ax = plots.figure(width=plots.WIDTH_1COL * 1.5, height=2.9)
names = list(settings)
shown_cats = [c for c in categories.CATEGORIES if c in set(compare.category)]
for k, name in enumerate(names):
    d = compare[compare.setting == name].set_index("category").reindex(shown_cats)
    xs = np.arange(len(shown_cats)) + (k - (len(names) - 1) / 2) * 0.22
    ax.errorbar(xs, d["shift"], yerr=[d["shift"] - d.lo, d.hi - d["shift"]], fmt="os^"[k % 3], ms=4, capsize=2,
                color=plots.PALETTE[k], label=name)
ax.axhline(0, color="k", lw=0.6)
ax.set_xticks(np.arange(len(shown_cats)), shown_cats)
ax.set(ylabel="boosted share: GRPO − positive-only", title="Fig. 4(b) by tagging and by scaffold (95% CI)")
ax.legend(frameon=False, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
fig.tight_layout()
plots.save(fig, "fig04b_category_shift_settings", fig_dir)
plt.show()

# %% [markdown]
# ## Claims and reading
# Each verdict below comes from the paired shift's 95% interval over batches
# (`cancellation.claims`): Template's share must fall and Reasoning's rise under GRPO. The claims
# on the fixed-scaffold policy are labelled as controls: they tell whether the main verdicts
# depend on the tiny task's random scaffold wording. Printed from this run's numbers:

# %%
from cancellation import claims as C


def claim_rows(p, suffix="", label="Fig. 4", what="", shares=False):
    """The two Fig. 4 claims for one setting's per-batch shifts `p`."""
    out = []
    s_ = categories.shift_summary(p).set_index("category")
    for c, sign in (("Template", -1), ("Reasoning", 1)):
        if c not in s_.index:
            continue
        r = s_.loc[c]
        detail = f"{moved(p, c, sign)} in the paper's direction"
        if shares:  # mean boosted shares of the main setting
            detail = f"{fmt(c, u='positive_only')} → {fmt(c, u='grpo')}; " + detail
        out.append(C.Claim(f"fig04_{c.lower()}{suffix}", label, f"GRPO {'lowers' if sign < 0 else 'raises'} {c}'s "
                           f"share of boosted mass vs positive-only{what}", "yes", r["mean"], r.lo, r.hi, n=int(r.n),
                           unit="boosted-share shift", rule="direction", params=dict(sign=sign), detail=detail))
    return out


rows = claim_rows(per, shares=True)
if control_model_path:
    rows += claim_rows(settings[names[-1]][1], "_fixed_scaffold", "Fig. 4, fixed-scaffold control", " (fixed scaffold)")
C.record(results_dir, "04", rows);
