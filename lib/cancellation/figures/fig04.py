"""Fig. 4 (notebook 04): where the boosted mass goes, positive-only vs GRPO (App. E.1, Algorithm 2).

`compute(P)` runs Algorithm 2 on `n_batches` independent batches of the policy θ₀: the token
table of each batch with Δlog p under a positive-only and a GRPO update, each from θ₀ (cached per
batch under every parameter, the policy's and problems' fingerprints and the batch index: the
expensive part, two full-parameter steps per batch). The tables are tagged afterwards, never
cached tagged, so an edited category table re-tags the cached Δlog p on the next run. Then the
boosted / suppressed mass per category and batch and its paired shift, the tokens whose Δlog p
differs most, and the same shift under the comparison table (`compare_map`) and on the
fixed-scaffold control policy (`control_model_path`, same batch seeds). `claims(R, P)` gives the
notebook's claim rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .. import cache, categories, grpo, measure, policy, rollout, seeds, stage, thesis
from .. import claims as C
from .. import workload as W
from .. import stats as S
from . import base
from .base import param

UPDATES = ("positive_only", "grpo")
LABELS = {"positive_only": "positive-only", "grpo": "GRPO"}
TABLES = {"mass": "fig04_category_mass_per_batch.parquet", "table": "fig04_category_shift.parquet",
          "top": "fig04_top_tokens.parquet", "compare": "fig04_settings.parquet",
          "thesis_cells": "fig04_thesis_cells.parquet", "thesis": "fig04_thesis.parquet"}


@dataclass
class Params(base.FigureParams):
    """Notebook 04's parameters."""
    model_path: str = param("data/policies/tiny-m", "the saved checkpoint θ₀: a local Hugging Face model directory "
                            "or a hub repo id", path="model")
    dtype: str = base.dtype()
    n_batches: int = param(40, "independent rollout batches (one per seed)", min=1)
    n_prompts: int = param(8, "prompts per batch", min=1)
    G: int = param(8, "rollouts per prompt (≥ 2: one rollout gives no advantage)", min=2)
    lr: float = param(0.1, "SGD learning rate (the paper's causal analyses use 0.1)", gt=0)
    scope: str = param("full", "'full' (all parameters) or 'lm_head'", choices=["full", "lm_head"])
    temperature: float = param(1.0, "sampling temperature", gt=0)
    max_new_tokens: int = param(96, "response length cap", min=1)
    eps: float = param(1e-6, "boosted/suppressed threshold for the token counts", gt=0)
    tagger: str = param("shipped", "'shipped' (NLTK lexicon+RegexpTagger; same tables everywhere), 'auto', "
                        "'perceptron'", choices=["shipped", "auto", "perceptron"])
    category_map: str = param("data/categories/arithmetic_roles.csv", "category table; empty: "
                              "data/categories/category_map.csv", path="file")
    compare_map: str = param("data/categories/category_map.csv", "a second table whose verdicts are shown beside; "
                             "empty: none", path="file", optional=True)
    control_model_path: str = param("data/policies/tiny-m-fixed", "fixed-scaffold control policy (same batch "
                                    "seeds); empty: none", path="model", optional=True)
    top_k: int = param(14, "tokens in the panel of largest Δlog p differences", min=1)
    min_count: int = param(20, "a token type needs this many occurrences to enter that panel", min=1)
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = param(False, "recompute activations in the backward (large models)")
    seed: int = param(0, "first batch seed (batch i uses seed + 1000 + i)", min=0)
    conf_bins: list = param([0.5, 0.9, 0.99], "edges on p of the confidence bins the thesis contrasts match on",
                            gt=0, lt=1, distinct=True)
    n_boot: int = param(1000, "bootstrap replicates of the thesis contrasts (batches, then groups)", min=100)


@dataclass
class Result:
    """What Fig. 4 plots, its reading prints and its claims read."""
    summary: str                 # per policy: batches, tokens, accuracy, mixed groups; the category table
    tokens: pd.DataFrame         # every response token of the kept batches, tagged, with delta_<update>
    audit: pd.DataFrame          # per (category, token type): occurrences, most frequent first
    mass: pd.DataFrame           # per (update, batch, category): boosted / suppressed mass, counts, shares
    summary_table: pd.DataFrame  # per (update, category, measure): mean over batches with a t interval
    per: pd.DataFrame            # per batch (rows) and category: paired boosted-share shift GRPO − positive-only
    shift: pd.DataFrame          # per category: mean paired shift with its t interval
    table: pd.DataFrame          # summary_table and shift in one (the committed table)
    top: pd.DataFrame            # token types whose mean Δlog p differs most between the updates
    top_labels: list             # those tokens as text (byte-level 'Ġx' -> 'x')
    occurrences: pd.DataFrame    # single occurrences with the largest difference, with their context
    cats: list                   # categories with at least 0.1% of the tokens (the ones plotted)
    totals: pd.DataFrame         # per update: total boosted / suppressed mass per batch
    template_confidence: pd.DataFrame  # Template mass per batch by confidence (p > 0.9 or not) and update
    settings: list               # names of the settings compared (main first; the control last when there is one)
    setting_shifts: dict         # setting -> its per-batch paired shifts
    compare: pd.DataFrame        # per (setting, category): shift with interval, token share, boosted shares
    thesis_cells: pd.DataFrame   # cancellation hypothesis: per (batch, group, pool, class, category, id, bin) Δ sums
    thesis: pd.DataFrame         # its contrasts shared − specific with cluster-bootstrap intervals (thesis.summary)

    def write(self, results_dir) -> None:
        for field, name in TABLES.items():
            cache.write_table(getattr(self, field), Path(results_dir) / name)


def batch_deltas(P: Params, source, i: int, path: str, load) -> pd.DataFrame:
    """Algorithm 2 on batch i of the policy at `path`: the token table with Δlog p under both updates
    (cached under every parameter, the policy's fingerprint and i)."""
    bseed = seeds.derive(P.seed, "category_batch", i)
    main = path == P.model_path  # the control policy takes the two updates of Fig. 4 only
    cc = P.compute()
    scfg = base.sample_config(P, source)

    def run():
        model, tok = load(path)
        batch = rollout.sample(model, tok, scfg, seed=bseed)
        before = cc.stats(model, batch)
        df = measure.token_table(batch, before, tokenizer=tok).assign(batch=i)
        m = batch.response_mask
        for rw in UPDATES:
            cfg = cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight=rw)
            df[f"delta_{rw}"] = grpo.trial_delta(model, batch, cfg, before.logp)[m].double().cpu().numpy()
        if main:  # the thesis rows' updates (lib/cancellation/thesis.py), each from θ₀ too
            cfg = cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight="negative_only")
            df["delta_negative_only"] = grpo.trial_delta(model, batch, cfg, before.logp)[m].double().cpu().numpy()
            cfg = cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight="grpo")
            w = thesis.copies_mask(batch)
            df["delta_grpo_masked"] = grpo.trial_delta(model, batch, cfg, before.logp,
                                                       token_weight=w)[m].double().cpu().numpy()
            df["copy_masked"] = (w[m] == 0).cpu().numpy()
        # θ₀ must come back exactly for the second update (Algorithm 2, line 10): same forward, Δ = 0
        again = cc.stats(model, batch)
        df["restore_error"] = float((again.logp - before.logp)[m].abs().max())
        df["mixed_groups"] = batch.mixed_groups()
        return df

    return stage.CATEGORY_SHIFT.cached(run, **base.inputs(P, source, path), i=i, main=main)


def compute(P: Params) -> Result:
    torch.manual_seed(P.seed)
    source = base.problem_source(P)
    loaded, lines = {}, []

    def load(path):
        if path not in loaded:
            loaded.clear()  # one model in memory at a time
            loaded[path] = policy.load_policy(path, dtype=P.dtype, device=P.device)
        return loaded[path]

    def batches(path, what):
        """All batches of one policy, tagged; batches without a mixed-reward group are left out."""
        t0 = time.time()
        df = pd.concat([batch_deltas(P, source, i, path, load)
                        for i in tqdm(range(P.n_batches), desc=what, leave=False)], ignore_index=True)
        df[["category", "word"]] = cz.tag_table(df, tok, seq_cols=("batch", "rollout"))
        per = df.groupby("batch").agg(accuracy=("reward", "mean"), mixed_groups=("mixed_groups", "first"),
                                      restore_error=("restore_error", "first"), n_tokens=("token_id", "size"))
        assert per.restore_error.max() == 0.0, "θ₀ was not restored exactly between the two updates"
        # a batch without a mixed-reward group has A = 0 everywhere: neither update moves anything
        empty = per.index[per.mixed_groups == 0].tolist()
        lines.append(f"{what}: {P.n_batches} batches x {P.n_prompts * P.G} rollouts, {len(df)} response tokens, "
                     f"accuracy {per.accuracy.mean():.2f}, mixed groups per batch {per.mixed_groups.mean():.1f}/"
                     f"{P.n_prompts}, {time.time() - t0:.0f} s (cached batches are instant)"
                     + (f"; batches {empty} have no mixed-reward group (no update signal) and are left out"
                        if empty else ""))
        df = df[~df.batch.isin(empty)].reset_index(drop=True)
        if df.empty:
            raise base.no_signal(f"04: the {P.n_batches} batches ({what})", int(round(per.accuracy.sum() * P.n_prompts * P.G)),
                                 P.n_batches * P.n_prompts * P.G, source)
        return df

    cz = categories.Categorizer(P.category_map or None, tagger=P.tagger)
    tok = load(P.model_path)[1]
    tokens = batches(P.model_path, Path(P.model_path).name)
    lines.append(f"category table: {P.category_map or categories.DEFAULT_MAP}, tagger={cz.tagger}")
    if source.reward_report():
        lines.append(source.reward_report())
    audit = (tokens.groupby(["category", "token"]).size().rename("n").reset_index()
             .sort_values(["category", "n"], ascending=[True, False]))
    mass, summary, per = categories.share_shift(tokens, UPDATES, eps=P.eps)
    shift = categories.shift_summary(per).assign(measure="boosted_share_shift")
    table = pd.concat([summary, shift.drop(columns="n").assign(update="grpo - positive_only")], ignore_index=True)
    top, occurrences = _top_tokens(tokens, P)
    top_labels = [tok.convert_tokens_to_string([t]).strip() or repr(t) for t in top.token]
    share_of = tokens.category.value_counts(normalize=True)
    cats = [c for c in categories.CATEGORIES if share_of.get(c, 0) >= 0.001]  # a few stray tokens say nothing
    totals = mass.groupby(["update", "batch"])[["boosted_mass", "suppressed_mass"]].sum().groupby("update").mean()
    # where the Template mass sits: confident scaffold (p > 0.9) vs uncertain wording choices
    long = pd.concat([tokens.assign(update=u, delta=tokens[f"delta_{u}"]) for u in UPDATES], ignore_index=True)
    conf = long.assign(confident=np.where(long.prob > 0.9, "p>0.9", "p<=0.9"))
    conf = categories.category_mass(conf, "delta", by=("update", "batch", "confident"), eps=P.eps)
    conf = conf[conf.category == "Template"].groupby(["confident", "update"])[["n_tokens", "boosted_mass",
                                                                                 "suppressed_mass"]].mean()
    # the same Δlog p under the comparison table, and the same batch seeds on the control policy
    settings = {f"{Path(P.model_path).name}, {Path(P.category_map or categories.DEFAULT_MAP).stem}": (tokens, per)}
    if P.compare_map:
        cz_words = categories.Categorizer(P.compare_map, tagger=P.tagger)
        words = tokens.drop(columns=["category", "word"])
        words[["category", "word"]] = cz_words.tag_table(words, tok, seq_cols=("batch", "rollout"))
        settings[f"{Path(P.model_path).name}, {Path(P.compare_map).stem}"] = (
            words, categories.share_shift(words, UPDATES, eps=P.eps)[2])
    if P.control_model_path:
        control = batches(P.control_model_path, Path(P.control_model_path).name)
        settings[f"{Path(P.control_model_path).name} (control), "
                 f"{Path(P.category_map or categories.DEFAULT_MAP).stem}"] = (
            control, categories.share_shift(control, UPDATES, eps=P.eps)[2])
    # the cancellation hypothesis on the main policy's batches (thesis.py): classes, cells, contrasts
    cls = thesis.classify(tokens)
    assert (tokens.copy_masked == ((cls == "shared") & (tokens.advantage < 0))).all(), "copies_mask != classify"
    tcells = thesis.cells(tokens, P.conf_bins)
    t_cats = [c for c in cats if c in set(tcells.category)]
    return Result(summary="\n".join(lines), tokens=tokens, audit=audit, mass=mass, summary_table=summary, per=per,
                  shift=shift, table=table, top=top, top_labels=top_labels, occurrences=occurrences, cats=cats,
                  totals=totals, template_confidence=conf, settings=list(settings),
                  setting_shifts={k: v[1] for k, v in settings.items()}, compare=_compare(settings, P),
                  thesis_cells=tcells, thesis=thesis.summary(tcells, t_cats, n_boot=P.n_boot, seed=P.seed))


def _top_tokens(tokens: pd.DataFrame, P: Params):
    """Per token type with at least `min_count` occurrences: mean Δlog p under each update, the
    `top_k` largest |mean Δ_GRPO − mean Δ_positive-only|; and the 8 single occurrences with the
    largest difference, each with the 6 tokens before it."""
    per_type = (tokens.groupby(["token", "category"])
                .agg(n=("token_id", "size"), mean_delta_positive_only=("delta_positive_only", "mean"),
                     mean_delta_grpo=("delta_grpo", "mean"), prob=("prob", "mean")).reset_index())
    per_type["difference"] = per_type.mean_delta_grpo - per_type.mean_delta_positive_only
    top = (per_type[per_type.n >= P.min_count].assign(a=lambda d: d.difference.abs())
           .nlargest(P.top_k, "a").drop(columns="a").reset_index(drop=True))
    occ = tokens.assign(difference=tokens.delta_grpo - tokens.delta_positive_only)
    occ = occ.loc[occ.difference.abs().nlargest(8).index, ["batch", "rollout", "position", "token", "category",
                                                            "reward", "prob", "delta_positive_only", "delta_grpo"]]
    occ["context"] = [" ".join(tokens[(tokens.batch == r.batch) & (tokens.rollout == r.rollout)
                                      & (tokens.position < r.position) & (tokens.position >= r.position - 6)]
                               .sort_values("position").token) for r in occ.itertuples()]
    return top, occ


def _compare(settings: dict, P: Params) -> pd.DataFrame:
    """Per setting and category: the paired shift of the boosted share with its t interval, the
    category's share of tokens and its mean boosted share under each update."""
    rows = []
    for name, (df, p) in settings.items():
        share_of_tokens = df.category.value_counts(normalize=True)
        _, summ, _ = categories.share_shift(df, UPDATES, eps=P.eps)
        share = summ[summ.measure == "boosted_share"].pivot(index="category", columns="update", values="mean")
        for r in categories.shift_summary(p).itertuples():
            rows.append(dict(setting=name, category=r.category, shift=r.mean, lo=r.lo, hi=r.hi, n=r.n,
                             token_share=share_of_tokens.get(r.category, 0.0),
                             **{f"boosted_share_{u}": share.loc[r.category, u] for u in UPDATES}))
    compare = pd.DataFrame(rows)
    return compare[compare.token_share >= 0.001]  # categories with a handful of stray tokens say nothing


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


# ----------------------------------------------------------------------------- the planner's workload
def workload(P: Params, shape, z: W.Sizes) -> W.Work:
    """What the planner counts for this notebook at P (read off compute(); approximations stated)."""
    w, rows = W.Work(), P.n_prompts * P.G
    policies = 1 + (1 if P.control_model_path else 0)
    kind = "full" if P.scope == "full" else "lm_head"
    n = policies * P.n_batches
    with w.split("batches", n):
        W.sample(w, rows, z, chunk_rows_decode=W.sample_rows(P), times=n)
        # before, after each of the two updates, the restore check; the main policy's batches also take the
        # thesis rows' negative-only and copies-masked GRPO updates, each measured after
        W.analysis(w, rows, z, P.chunk_rows, times=n * 4 + P.n_batches * 2)
        W.step(w, kind, rows, z, P.chunk_rows, times=n * 2 + P.n_batches * 2)
    w.full_grads = kind == "full"
    w.extra_bytes += shape.params * W.BYTES[P.dtype] * (policies - 1)
    return w
