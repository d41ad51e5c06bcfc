"""Fig. 4 (notebook 04): where the boosted mass goes, positive-only vs GRPO (App. E.1, Algorithm 2).

`compute(P)` runs Algorithm 2 on `n_batches` independent batches of the policy θ₀: the token
table of each batch with Δlog p under a positive-only and a GRPO update, each from θ₀ (cached per
batch under every parameter, the policy's and problems' fingerprints and the batch index: the
expensive part, two full-parameter steps per batch; with `run --procs N` the batches not cached yet
are computed by N processes first, `fan_out_batches`: the same tables bit for bit). The tables are
tagged afterwards, never cached tagged, so an edited category table re-tags the cached Δlog p on the
next run. Then the boosted / suppressed mass per category and batch and its paired shift, the
tokens whose Δlog p differs most, and the same shift under the comparison table (`compare_map`) and
on the fixed-scaffold control policy (`control_model_path`, same batch seeds). The claim rows and
what the notebook prints are `fig04_claims`.

The per-token table (every response token of every kept batch) stays inside compute: the Result keeps
what is read off it (counts, masses, the top tokens and occurrences), so `load` (make plots) rebuilds
the Result from the tidy tables and a small snapshot (replot.save) without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from .. import cache, categories, coupling, grpo, measure, policy, procs, rollout, seeds, stage, thesis, thesis_null
from .. import workload as W
from . import base, replot
from .base import param

UPDATES = ("positive_only", "grpo")
LABELS = {"positive_only": "positive-only", "grpo": "GRPO"}
TABLES = {"mass": "fig04_category_mass_per_batch.parquet", "table": "fig04_category_shift.parquet",
          "top": "fig04_top_tokens.parquet", "compare": "fig04_settings.parquet",
          "thesis_cells": "fig04_thesis_cells.parquet", "thesis": "fig04_thesis.parquet",
          "thesis_shares": "fig04_thesis_shares.parquet", "thesis_fidelity": "fig04_thesis_fidelity.parquet",
          "thesis_null_cells": "fig04_thesis_null_cells.parquet", "thesis_null_draws": "fig04_thesis_null_draws.parquet",
          "thesis_null": "fig04_thesis_null.parquet"}
TRIM = 0.01   # the robust mass (fig04_claims.mass_robust_lines): each batch's 1% largest |Δ| tokens (per update) left out


@dataclass
class Params(base.FigureParams):
    """Notebook 04's parameters."""
    model_path: str = base.model_path(doc="the saved checkpoint θ₀: a local Hugging Face model directory "
                                          "or a hub repo id")
    dtype: str = base.dtype()
    n_batches: int = param(40, "independent rollout batches (one per seed)", min=1)
    n_prompts: int = base.n_prompts(8)
    G: int = base.G()
    lr: float = param(0.1, "SGD learning rate (the paper's causal analyses use 0.1)", gt=0)
    scope: str = param("full", "'full' (all parameters) or 'lm_head'", choices=["full", "lm_head"])
    temperature: float = base.temperature()
    max_new_tokens: int = base.max_new_tokens()
    eps: float = base.eps(doc="boosted/suppressed threshold for the token counts")
    tagger: str = base.tagger("'shipped' (NLTK lexicon+RegexpTagger; same tables everywhere), 'auto', "
                              "'perceptron'")
    category_map: str = param("data/categories/arithmetic_roles.csv", "category table; empty: "
                              "data/categories/category_map.csv", path="file")
    compare_map: str = param("data/categories/category_map.csv", "a second table whose verdicts are shown beside; "
                             "empty: none", path="file", optional=True)
    control_model_path: str = param("data/policies/tiny-m-fixed", "fixed-scaffold control policy (same batch "
                                    "seeds); empty: none", path="model", optional=True)
    top_k: int = param(14, "tokens in the panel of largest Δlog p differences", min=1)
    min_count: int = param(20, "a token type needs this many occurrences to enter that panel", min=1)
    sample_rows: int = base.sample_rows()
    gradient_checkpointing: bool = base.gradient_checkpointing()
    seed: int = base.seed("first batch seed (batch i uses seed + 1000 + i)")
    conf_bins: list = param([0.5, 0.9, 0.99], "edges on p of the confidence bins the thesis contrasts match on",
                            gt=0, lt=1, distinct=True)
    n_boot: int = param(1000, "bootstrap replicates of the thesis contrasts (batches, then groups)", min=100)
    n_random_masks: int = param(2, "random masks drawn per batch as the copies mask's null (disjoint from the copies; "
                                "the same count per group and confidence bin where the non-copies allow); Δ averaged "
                                "over the draws", min=1)
    null_shuffles: int = param(39, "K: within-group sign shuffles of every batch, the thesis rows' null (each costs "
                               "the three single updates' steps; 39 resolves a 2.5% tail: p-values in steps of "
                               "1/(K+1)); 0: no null", min=0)
    fo_tokens: int = param(0, "tokens per batch whose first-order terms (Eq. 9) are computed, a seeded random draw; "
                           "0: every token (each costs all tokens × the vocabulary)", min=0)
    context_k: int = param(0, "preceding tokens the in-context 'shared' definition matches on; 0: the smallest k "
                           "whose specific share is ≥ 20% in both pools (thesis.choose_k)", min=0, max=thesis.MAX_K)


@dataclass
class Result:
    """What Fig. 4 plots, its reading prints and its claims read."""
    batches: dict                # per policy: batches, tokens, accuracy, mixed groups, seconds; the category table
                                 # and the grading (numbers; `summary(R)` writes the lines)
    audit: pd.DataFrame          # per (category, token type): occurrences, most frequent first
    mass: pd.DataFrame           # per (update, batch, category): boosted / suppressed mass, counts, shares
    mass_trimmed: pd.DataFrame   # the same with each (update, batch)'s TRIM share of largest |Δ| tokens left out
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
    thesis: pd.DataFrame         # every thesis statistic with its cluster-bootstrap interval (thesis.summary)
    thesis_shares: pd.DataFrame  # per definition (ids; context with k = 1..4) and pool: the specific share
    thesis_fidelity: pd.DataFrame  # first-order LM-head terms vs the measured Δ: correlation, sign agreement
    thesis_null_cells: pd.DataFrame  # the null's pooled cells: per (defn, k, shuffle, pool, class, state, id, bin)
    thesis_null_draws: pd.DataFrame  # per (defn, k, states, pool, statistic, shuffle): the pooled statistic (0: real)
    thesis_null: pd.DataFrame        # per (defn, k, states, pool, statistic): real, the null's median and band, p

    def write(self, results_dir, P: Params) -> None:
        """The tidy tables, and for `load` what they do not hold (replot.save; the settings' per-batch shifts beyond
        the main one's, which `per` is, one frame each)."""
        for field, name in TABLES.items():
            cache.write_table(getattr(self, field), Path(results_dir) / name)
        replot.save(results_dir, P, batches=self.batches, audit=self.audit, mass_trimmed=self.mass_trimmed,
                    top_labels=self.top_labels, occurrences=self.occurrences,
                    template_confidence=self.template_confidence, settings=self.settings,
                    **{f"setting_shift_{i}": self.setting_shifts[s] for i, s in enumerate(self.settings) if i})


def load(results_dir, P: Params) -> Result:
    """The Result `write` wrote to `results_dir`, computing nothing (make plots): the tidy tables read back, the
    snapshot restored, the summaries, shifts and totals derived from the mass table as compute derives them."""
    t = {field: replot.table(results_dir, name) for field, name in TABLES.items()}
    snap = replot.restore(results_dir, P)
    settings = snap.pop("settings")
    per = categories.paired_shift(t["mass"], UPDATES)
    shifts = {s: per if not i else snap.pop(f"setting_shift_{i}") for i, s in enumerate(settings)}
    return Result(**t, **snap, summary_table=categories.mass_summary(t["mass"]), per=per, shift=_shift(per),
                  cats=_plotted(snap["audit"]), totals=_totals(t["mass"]), settings=settings, setting_shifts=shifts)


def _shift(per: pd.DataFrame) -> pd.DataFrame:
    """Per category: the mean paired shift of the boosted share with its t interval (categories.shift_summary)."""
    return categories.shift_summary(per).assign(measure="boosted_share_shift")


def _plotted(audit: pd.DataFrame) -> list:
    """The categories with at least 0.1% of the tokens (the ones plotted: a few stray tokens say nothing)."""
    n = audit.groupby("category").n.sum()
    share_of = n / n.sum()
    return [c for c in categories.CATEGORIES if share_of.get(c, 0) >= 0.001]


def _totals(mass: pd.DataFrame) -> pd.DataFrame:
    """Per update: the total boosted / suppressed mass per batch, mean over batches."""
    return mass.groupby(["update", "batch"])[["boosted_mass", "suppressed_mass"]].sum().groupby("update").mean()


def batch_deltas(P: Params, source, i: int, path: str, load, shared_forward: bool = True) -> pd.DataFrame:
    """Algorithm 2 on batch i of the policy at `path`: the token table with Δlog p under both updates
    (cached under every parameter, the policy's fingerprint and i). `shared_forward`: the updates' one
    forward from θ₀ shared (`grpo.Trials`; False: one forward per update, the old way, bit for bit the
    same table: tests/test_trials.py)."""
    bseed = seeds.derive(P.seed, "category_batch", i)
    main = path == P.model_path  # the control policy takes the two updates of Fig. 4 only

    def run():
        model, tok = load(path)
        return batch_table(P, model, tok, rollout.sample(model, tok, base.sample_config(P, source), seed=bseed),
                           i, bseed, main, shared_forward)

    return stage.CATEGORY_SHIFT.cached(run, **base.inputs(P, source, path), i=i, main=main)


def batch_table(P: Params, model, tok, batch, i: int, bseed: int, main: bool, shared_forward: bool = True):
    """The token table of one sampled batch (what `batch_deltas` caches): "before" statistics and Δlog p
    under every update, each from θ₀ (`grpo.Trials`, with `shared_forward` or the old way)."""
    cc = P.compute()
    trials = grpo.Trials(model, batch, cc, scope=P.scope, shared=shared_forward, hidden=main)
    before = trials.before
    df = measure.token_table(batch, before, tokenizer=tok).assign(batch=i)
    m = batch.response_mask
    for rw in UPDATES:
        cfg = cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight=rw)
        df[f"delta_{rw}"] = trials.delta(cfg)[m].double().cpu().numpy()
    if main:  # the thesis rows' updates (lib/cancellation/thesis.py), each from θ₀ too, and Eq. 9's terms
        thesis_updates(P, batch, trials, df, bseed)
        _first_order(P, model, batch, trials.before, df, bseed)
    # θ₀ must come back exactly for the second update (Algorithm 2, line 10): 0.0 (grpo.Trials.restore_error)
    df["restore_error"] = trials.restore_error()
    df["mixed_groups"] = batch.mixed_groups()
    return df


def thesis_updates(P: Params, batch, trials, df: pd.DataFrame, bseed: int) -> None:
    """The thesis rows' steps from θ₀ on one batch (`trials`: grpo.Trials), as columns of its token table
    `df`: negative-only; GRPO with the opposite-sign copies masked and with `n_random_masks` random masks disjoint
    from them, of the same size per group and confidence bin where the non-copies allow (their mean); and the null:
    positive-only, negative-only and GRPO under each of `null_shuffles` within-group sign shuffles (`thesis.null_batch`)."""
    cc, m, before = P.compute(), batch.response_mask, trials.before
    delta = lambda b, rw, **kw: trials.delta(  # noqa: E731
        cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight=rw), b, **kw)[m].double().cpu().numpy()
    df["delta_negative_only"] = delta(batch, "negative_only")
    w = thesis.copies_mask(batch)
    df["delta_grpo_masked"] = delta(batch, "grpo", token_weight=w)
    df["copy_masked"] = (w[m] == 0).cpu().numpy()
    draws = [thesis.random_mask(batch, w, before.logp.exp(), P.conf_bins, seeds.derive(bseed, "thesis_random_mask", d))
             for d in range(P.n_random_masks)]
    df["delta_grpo_random"] = np.mean([delta(batch, "grpo", token_weight=r) for r in draws], axis=0)
    df["random_masked"] = np.mean([(r[m] == 0).cpu().numpy() for r in draws], axis=0)
    if P.null_shuffles:   # the sign-shuffle null: K shuffles x the three single updates, each from θ₀
        null = thesis.null_batch(trials.model, batch, cc, P.lr, P.null_shuffles, seeds.derive(bseed, "thesis_null"),
                                 P.scope)
        cols = {f"null_adv_{s}": null["adv"][s - 1] for s in range(1, P.null_shuffles + 1)}
        cols |= {f"null_{u}_{s}": null[u][s - 1] for s in range(1, P.null_shuffles + 1) for u in thesis.PERMUTED}
        # the real signs through the null's path against the exact step: float round-off (thesis.null_batch)
        on = ~np.isnan(null["real_grpo"])
        cols["null_check"] = float(np.abs(null["real_grpo"][on] - df["delta_grpo"].to_numpy()[on]).max()) if on.any() \
            else 0.0
        df[list(cols)] = pd.DataFrame(cols, index=df.index)


def _first_order(P: Params, model, batch, before, df: pd.DataFrame, bseed: int) -> None:
    """The first-order LM-head terms of every token (Eq. 9; `fo_tokens` of them) at θ₀, as columns of `df`;
    the features from `before`'s hidden states when it has them (the shared forward), else from a forward."""
    f = coupling.features(model, batch, stats=before, compute=P.compute())
    J = None
    if P.fo_tokens and P.fo_tokens < len(f):   # a seeded draw of the tokens j (each against every token k)
        g = torch.Generator().manual_seed(seeds.derive(bseed, "thesis_fo_tokens"))
        J = torch.randperm(len(f), generator=g)[:P.fo_tokens].sort().values
    for k, v in thesis.first_order_terms(f, batch.group[f.rows], P.lr, J=J).items():
        col = np.full(len(f), np.nan)
        col[slice(None) if J is None else J.numpy()] = v.double().cpu().numpy()
        df[k] = col


def policy_loader(P: Params):
    """load(path) -> (model, tokenizer) in P's dtype and device, one model in memory at a time."""
    loaded = {}

    def load(path):
        if path not in loaded:
            loaded.clear()
            loaded[path] = policy.load_policy(path, dtype=P.dtype, device=P.device)
        return loaded[path]
    return load


def fan_out_batches(P: Params, source) -> int:
    """With `run --procs N` (N > 1): the batches of both policies not cached yet, computed by N ranks
    (procs.fan_out, `_rank_batches`), each batch cached by its rank; `compute` then reads them from the
    cache. A batch carries its own seed and a rank runs P's threads, so the tables are the one-process
    tables bit for bit (tests/test_procs.py). The units alternate between the policies, so every rank's
    contiguous share holds as many main batches (with the thesis steps: about 3.5x the work) as control ones.
    Returns the number of batches the ranks computed (0 on one process)."""
    if procs.count() <= 1:
        return 0
    paths = [P.model_path] + ([P.control_model_path] if P.control_model_path else [])
    units = [(path, i) for i in range(P.n_batches) for path in paths
             if not stage.CATEGORY_SHIFT.is_cached(**base.inputs(P, source, path), i=i, main=path == P.model_path)]
    if len(units) < 2:
        return 0
    procs.fan_out("cancellation.figures.fig04:_rank_batches", P, units, cuda=str(P.device).startswith("cuda"),
                  what=f"04 batches ({len(paths)} policies)")
    return len(units)


def _rank_batches(P: Params, units: list, local_rank) -> list:
    """One rank's share of `fan_out_batches`: each (policy path, batch index) through `batch_deltas` (which
    caches it), a policy's batches together (one model load each)."""
    base.pin_threads(P)
    torch.manual_seed(P.seed)
    source, load = base.problem_source(P), policy_loader(P)
    for path in dict.fromkeys(p for p, _ in units):
        for p, i in units:
            if p == path:
                batch_deltas(P, source, i, path, load)
    return [True] * len(units)


def compute(P: Params) -> Result:
    base.pin_threads(P)
    torch.manual_seed(P.seed)
    source = base.problem_source(P)
    facts = {"policies": []}
    fan_out_batches(P, source)   # before this kernel loads a model: on a GPU, rank 0 has the first card to itself
    load = policy_loader(P)

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
        facts["policies"].append(dict(policy=what, n_batches=P.n_batches, rollouts=P.n_prompts * P.G, tokens=len(df),
                                      accuracy=float(per.accuracy.mean()), mixed_groups=float(per.mixed_groups.mean()),
                                      n_prompts=P.n_prompts, seconds=time.time() - t0, empty=list(empty)))
        df = df[~df.batch.isin(empty)].reset_index(drop=True)
        if df.empty:
            raise base.no_signal(f"04: the {P.n_batches} batches ({what})", int(round(per.accuracy.sum() * P.n_prompts * P.G)),
                                 P.n_batches * P.n_prompts * P.G, source)
        return df

    cz = categories.Categorizer(P.category_map or None, tagger=P.tagger)
    tok = load(P.model_path)[1]
    tokens = batches(P.model_path, Path(P.model_path).name)
    facts.update(category_map=P.category_map or categories.DEFAULT_MAP, tagger=cz.tagger, grading=source.grading())
    audit = (tokens.groupby(["category", "token"]).size().rename("n").reset_index()
             .sort_values(["category", "n"], ascending=[True, False]))
    mass, summary, per = categories.share_shift(tokens, UPDATES, eps=P.eps)
    shift = _shift(per)
    table = pd.concat([summary, shift.drop(columns="n").assign(update="grpo - positive_only")], ignore_index=True)
    top, occurrences = _top_tokens(tokens, P)
    top_labels = [tok.convert_tokens_to_string([t]).strip() or repr(t) for t in top.token]
    cats = _plotted(audit)
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
    shares = thesis.specific_shares(tokens)
    k = P.context_k or thesis.choose_k(shares)   # fixed from the class shares before any Δ is read
    tcells = thesis.cells(tokens, P.conf_bins, k)
    t_cats = [c for c in cats if c in set(tcells.category)]
    facts["context_k"] = k
    # the sign-shuffle null: every definition's statistics under each of the K shuffles of every batch, pooled
    null_cells, draws, bands = (pd.DataFrame() for _ in range(3))
    if P.null_shuffles:
        t0 = time.time()
        null_cells = thesis_null.null_cells(tokens, P.null_shuffles, P.conf_bins)
        draws = thesis_null.null_values(null_cells)
        bands = thesis_null.null_bands(draws).assign(chosen=lambda d: (d.defn != "context") | (d.k == k))
        facts.update(null_check=float(tokens.null_check.max()), null_seconds=time.time() - t0)
    return Result(batches=facts, audit=audit, mass=mass, mass_trimmed=categories.update_mass(tokens, UPDATES, P.eps, TRIM),
                  summary_table=summary, per=per, shift=shift, table=table, top=top, top_labels=top_labels,
                  occurrences=occurrences, cats=cats, totals=_totals(mass), template_confidence=conf,
                  settings=list(settings), setting_shifts={k: v[1] for k, v in settings.items()}, compare=_compare(settings, P),
                  thesis_cells=tcells, thesis=thesis.summary(tcells, t_cats, n_boot=P.n_boot, seed=P.seed),
                  thesis_shares=shares.assign(chosen=lambda d: (d.defn == "ids") | (d.k == k)),
                  thesis_fidelity=thesis.fidelity(tokens), thesis_null_cells=null_cells, thesis_null_draws=draws,
                  thesis_null=bands)


def summary(R: Result) -> str:
    """Per policy: its batches, tokens, accuracy, mixed groups and seconds; the category table; the grader's line."""
    lines = [f"{b['policy']}: {b['n_batches']} batches x {b['rollouts']} rollouts, {b['tokens']} response tokens, "
             f"accuracy {b['accuracy']:.2f}, mixed groups per batch {b['mixed_groups']:.1f}/{b['n_prompts']}, "
             f"{b['seconds']:.0f} s (cached batches are instant)"
             + (f"; batches {b['empty']} have no mixed-reward group (no update signal) and are left out"
                if b["empty"] else "") for b in R.batches["policies"]]
    # the main policy, its category table and grading, then the control's batches (the order they ran in)
    head = base.with_grading(f"{lines[0]}\ncategory table: {R.batches['category_map']}, tagger={R.batches['tagger']}",
                             R.batches)
    return "\n".join([head] + lines[1:])


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
        # thesis rows' negative-only, copies-masked and random-masked updates, each measured after, and one forward
        # for the first-order features; the null (thesis.null_batch): K shuffles x the three updates and the real GRPO once more; where the per-rollout
        # gradients fit (rollouts x parameters float64 <= thesis.G_LIMIT: tiny) a backward per rollout (about one step's in all)
        # then one forward each, else an exact step each (the paper's models)
        thesis_steps = 2 + P.n_random_masks
        null_n = (len(thesis.PERMUTED) * P.null_shuffles + 1) if P.null_shuffles else 0
        shortcut = rows * shape.params * 8 <= thesis.G_LIMIT
        null_fwd, null_steps = (null_n, 1 if null_n else 0) if shortcut else (null_n, null_n)
        W.analysis(w, rows, z, P.chunk_rows, times=n * 4 + P.n_batches * (thesis_steps + 1 + null_fwd))
        W.step(w, kind, rows, z, P.chunk_rows, times=n * 2 + P.n_batches * (thesis_steps + null_steps))
        N = rows * z.new                                    # response tokens (upper bound: every row at the cap)
        W.kernel(w, (min(P.fo_tokens, N) if P.fo_tokens else N) * N * P.n_batches, shape, 1024, N)   # Eq. 9 terms
    w.full_grads = kind == "full"
    w.extra_bytes += shape.params * W.BYTES[P.dtype] * (policies - 1)
    if P.null_shuffles and shortcut:   # the per-rollout gradients (float64) and the copy the shuffles' steps run on
        w.extra_bytes += rows * shape.params * 8 + shape.params * W.BYTES[P.dtype]
    return w
