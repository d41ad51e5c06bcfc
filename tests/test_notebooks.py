"""Every notebook runs end to end through papermill on the smoke profile; assert on what it records."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cancellation import execute, profiles

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def out_root(tmp_path_factory):
    return tmp_path_factory.mktemp("smoke")


def _run(ref, out_root):
    out = execute.run_notebook(ref, "smoke", out_root=out_root, log_output=False)
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    return out_root / "data" / "results" / "smoke", out_root / "figures" / "smoke"


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    """Notebooks 05 and 06 (one CPU thread each) run side by side, as `make figures`'s pool runs them: the
    command line with --cores 2, on a checkout copy (its notebooks, the repository's data by link), so
    that each runs in its own runner process and both write the one claims registry."""
    repo, root = Path(profiles.ROOT), tmp_path_factory.mktemp("side_by_side")
    shutil.copytree(repo / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns("executed"))
    (root / "data").mkdir()
    for d in (repo / "data").iterdir():
        if d.name not in ("results", "cache"):
            (root / "data" / d.name).symlink_to(d)
    proc = subprocess.run([sys.executable, "-m", "cancellation.run", "05", "06", "--profile", "smoke", "--cores", "2",
                           "--root", str(root)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "2 notebooks in a pool of 2 cores" in proc.stdout and "(05 1, 06 1)" in proc.stdout
    assert "05_value_gap.py done in" in proc.stdout and "06_sampling_budget.py done in" in proc.stdout
    for stem in ("05_value_gap", "06_sampling_budget"):
        nb = json.loads((root / "notebooks" / "executed" / "smoke" / f"{stem}.ipynb").read_text())
        assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    return root / "data" / "results" / "smoke", root / "figures" / "smoke"


def test_01_token_flipping(out_root):
    res, figs = _run("01", out_root)
    for name in ("fig01_token_flipping", "fig09_flipping_across_models"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    frac = pd.read_parquet(res / "fig01_flip_fractions.parquet")
    sums = frac.groupby(["run", "step", "sign"]).fraction.sum()
    assert np.allclose(sums, 1.0) and set(frac.run) == {"grpo", "positive_only", "grpo_sgd"}  # sgd_lr > 0
    noise = pd.read_parquet(res / "fig01_noise_floor.parquet").set_index("measurement").max_abs_delta
    assert noise["repeat"] < 1e-6 and noise["zero_update"] < 1e-6
    assert noise["float32_roundoff"] > noise["repeat"]
    fig9 = pd.read_parquet(res / "fig09_flip_fractions.parquet")
    assert set(fig9.model) == {"tiny-m", "tiny-s"} and set(fig9.sign) == {"pos", "neg", "all"}
    deltas = pd.read_parquet(res / "fig01_token_deltas.parquet")
    assert (deltas.delta.abs() > 1e-6).mean() > 0.5  # an Adam step moves most tokens past ε
    comp = pd.read_parquet(res / "fig01_suppressed_categories.parquet").set_index(["policy", "run"])
    assert np.allclose(comp.sum(axis=1), 1.0) and "tiny-m-fixed (control)" in comp.index.get_level_values(0)
    # the fixed-scaffold control ran and recorded its Fig. 1(d) claim
    claims = pd.read_parquet(res / "claims.parquet").set_index("claim")
    assert claims.loc["fig01_d_drop_fixed_scaffold", "figure"] == "Fig. 1(d), fixed-scaffold control"
    assert {"fig01_ab_boosted_sgd", "fig01_signed_mean", "fig01_signed_mean_sgd"} <= set(claims.index)
    assert "grpo_sgd" not in comp.index.get_level_values(1)  # the SGD control stays out of Fig. 1(d)'s categories


def test_07_batching(out_root):
    res, figs = _run("07", out_root)
    for name in ("fig07a_sign_partition", "fig08_training_curves"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    t2 = pd.read_csv(res / "table2_batching.csv").set_index("strategy")
    assert list(t2.index) == ["random", "QB", "RB", "QB+RB", "sign_partitioned", "DS"]
    assert list(t2.QB) == [False, True, False, True, False, False]
    assert list(t2.RB) == [False, False, True, True, False, False]
    assert t2.average_mean.between(0, 100).all() and (t2.n_seeds == 2).all()
    assert (t2.optimizer_steps == 2 * 2).all()  # run_rounds: RB updates on every iteration, like the others
    sweep = pd.read_csv(res / "table2_lr_sweep.csv")
    assert sorted(sweep.lr.unique()) == [3e-4, 1e-3] and set(sweep.strategy) == {"random", "QB", "RB", "QB+RB"}
    assert (sweep.optimizer_steps == 4).all() and sweep.final.between(0, 1).all()
    curves = pd.read_parquet(res / "fig08_training_curves.parquet")
    start = curves[curves.iteration == 0].groupby(["seed", "set"]).accuracy.nunique()
    assert (start == 1).all()  # every strategy starts from the same policy and evaluation draws
    mbs = pd.read_parquet(res / "fig07a_minibatches.parquet")
    sp = mbs[mbs.strategy == "sign_partitioned"]
    assert not ((sp.n_pos > 0) & (sp.n_neg > 0)).any()
    assert (mbs[mbs.minibatch == 0].ratio_dev < 1e-5).all()  # ρ = 1 on each iteration's first step
    it = pd.read_parquet(res / "fig08_iterations.parquet")
    rb = it[it.strategy.isin(["RB", "QB+RB"])]
    assert (rb.buffer_sampled == rb.buffer_released + rb.buffer_discarded + rb.buffer_buffered).all()
    ds = it[it.strategy == "DS"]   # DAPO's dynamic sampling: zero-variance groups dropped on arrival, counted
    assert (ds.buffer_sampled == ds.buffer_released + ds.buffer_discarded + ds.buffer_filtered + ds.buffer_buffered).all()
    assert (ds[ds.updated].n_pos + ds[ds.updated].n_neg == ds[ds.updated].n_rollouts).all()   # every group mixed
    secs = pd.read_parquet(res / "timing" / "fig08_iterations_seconds.parquet")   # wall-clock apart (issue 38)
    assert "t_sample" not in it.columns and len(secs) == len(it) and (secs.t_sample > 0).all()
    assert secs[["strategy", "seed", "iteration"]].equals(it[["strategy", "seed", "iteration"]])
    imb = pd.read_csv(res / "table2_local_imbalance.csv")  # Eq. 14 on each seed's first batch
    assert set(imb.strategy) == {"random", "QB", "sign_partitioned"} and set(imb.seed) == {0, 1}
    live = imb[imb.live_groups > 0]  # retained is NaN on a batch without a mixed group (nothing to keep)
    assert imb[imb.live_groups == 0].retained.isna().all()
    assert (live.retained <= 1 + 1e-9).all() and np.allclose(live[live.strategy == "QB"].retained, 1)
    assert (imb.grad_var > -1e-12).all()


def test_02_coupling_heatmaps(out_root):
    res, figs = _run("02", out_root)
    assert (figs / "fig02_coupling.png").stat().st_size > 10_000 and (figs / "fig02_coupling.pdf").exists()
    pairs = pd.read_parquet(res / "fig02_pairs.parquet")
    assert set(pairs.pair) == {"same", "different"}
    assert np.allclose(pairs.kernel, pairs.hdot * pairs.phi) and (pairs.hcos.abs() <= 1 + 1e-9).all()
    # Eq. 10: for a same-token pair φ = (1 − p_j)(1 − p_k) + Σ_{v≠o} π_j π_k ≥ 0
    assert (pairs[pairs.pair == "same"].phi > -1e-12).all()
    heat = pd.read_parquet(res / "fig02_heatmap.parquet")
    assert (heat.mean_abs_contribution.dropna() >= heat.mean_contribution.dropna().abs() - 1e-15).all()
    fo = pd.read_parquet(res / "fig02_first_order.parquet").set_index("lr")
    assert fo.loc[0.1, "pearson"] > 0.99  # a first-order prediction of a small step must fit


def test_03_masked_updates(out_root):
    res, figs = _run("03", out_root)
    for name in ("fig03_masked_updates", "fig10_proxy_sign_consistency"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    t1 = pd.read_csv(res / "table1_masked_updates.csv")
    assert set(t1.kind) == {"random", "same", "lowconf", "both"} and set(t1.scope) == {"lm_head", "full"}
    assert ((t1.boost_rate_lo <= t1.boost_rate) & (t1.boost_rate <= t1.boost_rate_hi)).all()
    eff = pd.read_parquet(res / "fig03_masking_effects.parquet")
    assert (eff.proxy_cos.abs() <= 1 + 1e-9).all() and eff.delta.abs().max() > 0
    cons = pd.read_parquet(res / "fig10_proxy_sign_consistency.parquet")
    assert cons.sign_consistency.between(0, 1).all()
    adam = pd.read_parquet(res / "fig03_adam_sign_descent.parquet")
    assert 0.5 < adam.median_ratio[0] <= 1 + 1e-9  # |g|/(|g| + ε) ≤ 1


def test_04_category_shift(out_root):
    res, figs = _run("04", out_root)
    assert (figs / "fig04_category_shift.png").stat().st_size > 10_000 and (figs / "fig04_category_shift.pdf").exists()
    mass = pd.read_parquet(res / "fig04_category_mass_per_batch.parquet")
    assert set(mass["update"]) == {"positive_only", "grpo"} and {"Math", "Template", "Reasoning"} <= set(mass.category)
    assert (mass[["boosted_mass", "suppressed_mass"]] >= 0).all().all()
    g = mass.groupby(["update", "batch"])
    assert np.allclose(g.boosted_share.sum(), 1.0) and (g.boosted_mass.sum() > 0).all()  # both updates moved tokens
    # Δ is measured on the whole batch for both updates: same tokens, same counts
    n = mass.pivot_table(index=["batch", "category"], columns="update", values="n_tokens")
    assert (n.grpo == n.positive_only).all()
    table = pd.read_parquet(res / "fig04_category_shift.parquet")
    shift = table[table.measure == "boosted_share_shift"].set_index("category")
    share = table[table.measure == "boosted_share"].pivot(index="category", columns="update", values="mean")
    assert np.allclose(shift["mean"], (share.grpo - share.positive_only).loc[shift.index])  # paired mean = diff of means
    assert (table.lo <= table["mean"] + 1e-12).all() and (table["mean"] <= table.hi + 1e-12).all()
    top = pd.read_parquet(res / "fig04_top_tokens.parquet")
    assert np.allclose(top.difference, top.mean_delta_grpo - top.mean_delta_positive_only)
    assert (top.difference.abs().diff().dropna() <= 1e-15).all() and (top.n >= 3).all()
    # role table vs word table on the same tokens: spans only re-tag Math words as Reasoning
    st = pd.read_parquet(res / "fig04_settings.parquet").pivot(index="setting", columns="category", values="token_share")
    roles, words, control = (st.loc[[i for i in st.index if k in i][0]] for k in ("arithmetic_roles", "category_map", "control"))
    assert np.isclose(roles.Template, words.Template) and np.isclose(roles.Math + roles.Reasoning, words.Math + words.Reasoning)
    assert roles.Reasoning > words.Reasoning and control.name.startswith("tiny-m-fixed")
    claims = pd.read_parquet(res / "claims.parquet").set_index("claim")
    assert {"fig04_template", "fig04_reasoning", "fig04_template_fixed_scaffold"} <= set(claims.index)
    # the thesis rows: tokens of mixed groups only (A = 0 groups left out), each in one class of one pool
    cells = pd.read_parquet(res / "fig04_thesis_cells.parquet")
    assert set(cells.pool) == {"pos", "neg"} and set(cells.cls) <= {"shared", "specific"}
    assert set(cells.defn) == {"ids", "context", "state"}
    for d, c in cells.groupby("defn"):   # each definition classifies every mixed-group token once
        assert 0 < c.n.sum() <= n.grpo.sum() and c.n.sum() == cells[cells.defn == "ids"].n.sum()
    assert not cells.duplicated(["defn", "batch", "group", "pool", "cls", "state", "category", "token_id", "bin"]).any()
    assert cells.n_overlap.sum() == 0   # the random masks never touch a copy
    # the null: every shuffle pools the same tokens as the real signs (shuffle 0), on every definition
    nc = pd.read_parquet(res / "fig04_thesis_null_cells.parquet")
    per = nc.groupby(["defn", "k", "shuffle"]).n.sum()
    assert per.nunique() == 1 and per.iloc[0] == cells[cells.defn == "ids"].n.sum() and nc.shuffle.max() >= 39
    assert {"fig04_thesis_verdict", "fig04_thesis_alternative", "fig04_thesis_copies_vs_random",
            "fig04_thesis_pos_contrast_vs_null_ctx", "fig04_thesis_null_cancellation"} <= set(claims.index)
    smoke = claims[claims.index.str.startswith("fig04_thesis_")]
    assert (smoke.n >= 5).all() and smoke.lo.notna().any()   # 5 batches on smoke: the rows can decide
    assert (figs / "fig04_thesis.png").exists()


def test_05_value_gap(side_by_side):
    res, figs = side_by_side
    for name in ("fig05_value_gap", "fig11_repeated_updates"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    vt = pd.read_parquet(res / "fig05_token_values.parquet")
    assert set(vt.estimator) == {"exclude", "paper"} and (vt.prob <= 0.999).all() and (vt.delta_se >= 0).all()
    p, x = vt[vt.estimator == "paper"], vt[vt.estimator == "exclude"]
    assert np.allclose(p.delta_hat, (p.avg0 - p.avg1) / (1 - p.prob))  # Eq. 20
    assert np.allclose(x.delta_hat, x.avg0 - x.avg1)
    key = ["rollout", "position"]
    both = p.merge(x, on=key, suffixes=("_p", "_x"))
    assert len(both) == len(p) and np.array_equal(both.avg0_p, both.avg0_x)  # the s⊕o branch is shared (cache)
    cells = pd.read_parquet(res / "fig05_cell_means.parquet")
    assert ((cells.lo <= cells["mean"] + 1e-12) & (cells["mean"] <= cells.hi + 1e-12)).all()
    assert cells.groupby("estimator").n.nunique().eq(1).all()  # equal numbers per cell
    ent = pd.read_parquet(res / "fig05_entropy_gap.parquet")
    f11 = pd.read_parquet(res / "fig11_repeated_gap.parquet")
    assert set(ent.k) == {50, 100} and set(f11.step) == {1, 2, 3}
    assert set(zip(f11.optimizer, f11.lr)) == {("sgd", 0.1), ("sgd", 1.0), ("adam", 1e-3), ("adam", 1e-2)}
    first = f11[f11.step == 1]
    assert (first.changed_status == 0).all() and (first.change == 0).all()
    for _, d in f11.groupby(["optimizer", "lr"]):  # the paired change is the difference of the two splits' gaps
        ok = d.gap.notna()
        assert np.allclose(d.change[ok], d.gap[ok] - d.gap.iloc[0], equal_nan=True)
    ok = f11.lo.notna()
    assert ((f11.lo[ok] <= f11.gap[ok] + 1e-12) & (f11.gap[ok] <= f11.hi[ok] + 1e-12)).all()
    claims = pd.read_parquet(res / "claims.parquet").set_index("claim")
    assert {"fig11_sgd", "fig11_adam", "fig05a_exclude_heldout"} <= set(claims.index)
    h = pd.read_parquet(res / "fig05_heldout_values.parquet")  # held-out states: a balanced pool of a second batch
    assert set(h.status) == {"boosted", "suppressed"} and h.groupby(["sign", "status"]).size().nunique() == 1


def test_06_sampling_budget(side_by_side):
    res, figs = side_by_side
    for name in ("fig06_sampling_budget", "fig07b_reward_composition"):
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()
    gaps = pd.read_parquet(res / "fig06_value_gap.parquet")
    comp = pd.read_parquet(res / "fig07b_reward_composition.parquet")
    val = gaps[gaps.scope == "valued"]
    assert set(val.panel) == {"prompts", "rollouts"} and set(val.subset) == {"all", "top50", "top25"}
    assert set(gaps.scope) == {"valued", "within_sign"}
    ok = val.gap.notna()
    assert ok.any() and ((val.lo <= val.gap + 1e-12) & (val.gap <= val.hi + 1e-12))[ok].all()
    raw = pd.read_parquet(res / "fig06_valued_deltas.parquet")
    assert (np.where(raw.delta > 1e-6, "boosted", np.where(raw.delta < -1e-6, "suppressed", "stable")) == raw.status).all()
    # the fair test: every valued token lies in a rollout of the update, and a seed values the same tokens at every budget
    assert raw.in_update.all()
    for _, d in raw.groupby(["panel", "seed"]):
        sets = d.groupby("x").tok.apply(frozenset)
        assert sets.nunique() == 1
    assert raw.seed.nunique() == 3  # smoke: n_seeds 3
    # the gap recomputed from the raw table: mean Δ̂ of boosted − suppressed instances, seeds pooled
    allg = pd.concat([gaps, comp])
    for (panel, x), d in raw.groupby(["panel", "x"]):
        ref = d[d.status == "boosted"].delta_hat.mean() - d[d.status == "suppressed"].delta_hat.mean()
        g = allg[(allg.panel == panel) & (allg.x == x) & (allg.subset == "all") & (allg.scope == "valued")].gap.iloc[0]
        assert np.isclose(ref, g, equal_nan=True)
    assert set(raw[raw.panel == "composition"].x) == {1, 2}  # smoke: G_comp = 3, every composition
    trends = pd.read_parquet(res / "fig06_trends.parquet")
    assert {"prompts", "rollouts", "composition"} <= set(trends.panel)
    t = trends[trends.subset == "all"]
    assert (t.need_seeds > 0).all() and ((t.d_lo <= t.d + 1e-12) & (t.d <= t.d_hi + 1e-12)).all()
    claims = pd.read_parquet(res / "claims.parquet")
    c = claims[claims.notebook == "06"]
    assert {"fig06_prompts_all", "fig06_rollouts_all", "fig07b_sparse_all", "fig07b_saturated_all"} <= set(c.claim)
    # every row resamples the seeds and the query groups of its valued tokens (two-way), n = query groups
    assert (c.resampling == "seed × group").all()
    assert (c[c.claim.str.startswith("fig07b")].n == 2).all()
    assert all("x 3 seeds, both resampled" in d for d in c.detail)  # smoke: n_seeds 3
    assert {"fig06_rollouts_within_sign", "fig06_rollouts_top25_vs_all"} <= set(c.claim)
    assert {"fig05a_exclude_heldout", "fig11_sgd"} <= set(claims.claim)  # 05 and 06 ran at once: both kept their rows


def test_08_referee_controls(out_root):
    res, figs = _run("08", out_root)
    assert (figs / "fig12_referee_controls.png").stat().st_size > 10_000 and (figs / "fig12_referee_controls.pdf").exists()
    freq = pd.read_parquet(res / "fig12_frequency_matched.parquet")
    assert set(freq.tokens) == {"all tokens", "frequency-matched", "matched (step, id, conf)"}
    assert set(freq.measure) == {"share gap", "within-id gap"}
    lm = pd.read_parquet(res / "fig12_lm_head_kernel.parquet")
    assert len(lm) == 8 and (lm.mean_abs_K.dropna() >= lm.mean_K.dropna().abs() - 1e-15).all()
    # Eq. 10: a same-token pair has φ ≥ 0, so K = ⟨h_j,h_k⟩φ has the sign of ⟨h_j,h_k⟩; the share is a share
    assert lm.share_positive.dropna().between(0, 1).all()
    pairs = pd.read_parquet(res / "fig12_full_pairs.parquet")
    assert len(pairs) == pairs.j.nunique() * pairs.k.nunique() and np.isfinite(pairs.full_inner).all()
    claims = pd.read_parquet(res / "claims.parquet")
    assert {"fig12_matched_boosted", "fig12_same_token_K", "fig12_same_token_full"} <= set(claims.claim)
