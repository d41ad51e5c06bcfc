"""The paper profile's code paths on CPU stand-ins (`paper-smoke`): every notebook end to end.

`paper-smoke.yaml` mirrors `paper.yaml` key for key, so a section of the paper profile cannot
name a parameter its notebook lacks, or drift away from what the tests run."""
import json
import time

import numpy as np
import pandas as pd
import pytest

from cancellation import execute, guard, manifest, profiles, resolve

PAPER, SMOKE = profiles.HERE.params / "paper.yaml", profiles.HERE.params / "paper-smoke.yaml"
VOCAB = profiles.HERE.params / "paper-vocab.yaml"


@pytest.mark.parametrize("profile", [SMOKE, VOCAB], ids=["paper-smoke", "paper-vocab"])
def test_stand_in_profiles_mirror_paper_key_for_key(profile):
    """paper-smoke sets exactly paper.yaml's keys; paper-vocab may add a few that bound its run time. A figure's
    section is optional (the defaults and `common` apply): each section names a manifest figure, and a figure
    given a section in paper.yaml gets one with the same keys in paper-smoke.yaml and paper-vocab.yaml."""
    paper, smoke = profiles.load_profile(PAPER.stem), profiles.load_profile(profile.stem)
    assert list(paper) == list(smoke)
    for section in paper:
        if profile == SMOKE:
            assert set(paper[section]) == set(smoke[section]), section
        else:
            assert set(paper[section]) <= set(smoke[section]), section
    assert set(paper) - {"common"} <= {f.notebook for f in manifest.FIGURES}


def test_every_paper_parameter_is_declared_by_a_notebook():
    """A `common` key no notebook declares would be dropped silently; a section key is checked by resolve_params."""
    notebooks = [profiles.find_notebook(f.notebook) for f in manifest.FIGURES]
    declared = set().union(*(profiles.notebook_defaults(nb) for nb in notebooks))
    assert set(profiles.load_profile(PAPER.stem)["common"]) <= declared
    for nb in notebooks:   # a figure without a section of its own: the defaults and `common`
        resolve.resolve_params(nb, "paper")  # raises on an unknown name or a wrong type


@pytest.fixture(scope="module")
def out_root(canonical_standins, tmp_path_factory):
    return tmp_path_factory.mktemp("paper-smoke")


def _run(ref, out_root, profile="paper-smoke", log=None, cache=None):
    """Run a notebook on `profile` under the Compute guard: its LM head raises on more than the
    profile's `token_chunk` positions, and an UpdateConfig with other memory knobs than the
    profile's raises (knob reach: every forward and update of the notebook obeys the profile).
    With `log`, the guard tallies the positions it sees into that JSON file; with `cache`, the run
    takes that (fresh) cache directory instead of the session's, so every position is computed here."""
    params = resolve.resolve_params(profiles.find_notebook(ref), profile, None, out_root)
    knobs = {k: params[k] for k in guard.KNOBS if k in params}
    assert "token_chunk" in knobs, f"notebook {ref} declares no token_chunk"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(guard.GUARD_ENV, json.dumps(dict(knobs, **({"log": str(log)} if log else {}))))
        if cache:
            mp.setenv("CANCELLATION_CACHE", str(cache))
        out = execute.run_notebook(ref, profile, out_root=out_root, log_output=False)   # the kernel inherits it
    nb = json.loads(out.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return out_root / "data" / "results" / profile, out_root / "figures" / profile


def _timed(ref, out_root, tmp_path, tally=False):
    """`_run` with a cache of its own, timed, then test_plan's check of its seconds against the CPU plan (its
    one retry a plain run of its own, as test_plan makes it); with `tally`, also `_tallied`'s check on the
    same run. One paper-smoke run serves the three files' assertions."""
    from test_plan import check_plan_time, timed_fresh_run
    log = tmp_path / "tally.json" if tally else None
    t = time.time()
    res, figs = _run(ref, out_root, log=log, cache=tmp_path / "cache")
    check_plan_time(ref, time.time() - t, lambda: timed_fresh_run(ref, tmp_path / "retry"))
    if tally:
        from test_plan_tally import check_tally
        check_tally(ref, resolve.resolve_params(profiles.find_notebook(ref), "paper-smoke", None, out_root), log)
    return res, figs


def _tallied(ref, out_root, tmp_path):
    """`_run` with a cache of its own and the guard's tally, then test_plan_tally's check on that same run
    (the planner's workload within 2x of the tally): one paper-smoke run serves both files' assertions."""
    from test_plan_tally import check_tally
    log = tmp_path / "tally.json"
    res, figs = _run(ref, out_root, log=log, cache=tmp_path / "cache")
    check_tally(ref, resolve.resolve_params(profiles.find_notebook(ref), "paper-smoke", None, out_root), log)
    return res, figs


def _figs(figs, *names):
    for name in names:
        assert (figs / f"{name}.png").stat().st_size > 10_000 and (figs / f"{name}.pdf").exists()


@pytest.mark.slow
def test_01(out_root):
    res, figs = _run("01", out_root)
    _figs(figs, "fig01_token_flipping", "fig09_flipping_across_models")
    frac = pd.read_parquet(res / "fig01_flip_fractions.parquet")
    assert np.allclose(frac.groupby(["run", "step", "sign"]).fraction.sum(), 1.0)
    noise = pd.read_parquet(res / "fig01_noise_floor.parquet").set_index("measurement").max_abs_delta
    # float32 analysis against a float64 copy: round-off is real (not the old float32-vs-float32 zero)
    assert noise["float32_roundoff"] > 0 and noise["repeat"] == 0


@pytest.mark.slow
def test_02(out_root, tmp_path):
    res, figs = _timed("02", out_root, tmp_path, tally=True)
    _figs(figs, "fig02_coupling")
    pairs = pd.read_parquet(res / "fig02_pairs.parquet")
    assert np.allclose(pairs.kernel, pairs.hdot * pairs.phi)


@pytest.mark.slow
def test_03(out_root):
    res, figs = _run("03", out_root)
    _figs(figs, "fig03_masked_updates", "fig10_proxy_sign_consistency")
    cons = pd.read_parquet(res / "fig10_proxy_sign_consistency.parquet")
    assert cons.sign_consistency.between(0, 1).all()


@pytest.mark.slow
def test_04(out_root, tmp_path):
    res, figs = _tallied("04", out_root, tmp_path)
    _figs(figs, "fig04_category_shift")
    mass = pd.read_parquet(res / "fig04_category_mass_per_batch.parquet")
    assert set(mass["update"]) == {"positive_only", "grpo"}
    cells = pd.read_parquet(res / "fig04_thesis_cells.parquet")   # the thesis rows' updates ran on this profile too
    assert set(cells.pool) == {"pos", "neg"} and cells[[f"sum_{u}" for u in ("negative_only", "grpo_masked", "grpo_random")]].notna().all().all()
    assert pd.read_parquet(res / "fig04_thesis_null.parquet").K.max() >= 39   # the null ran here too (a statistic
    # undefined under a shuffle, an empty class on the stand-in's few tokens, leaves that shuffle out: K below 39)
    claims = pd.read_parquet(res / "claims.parquet").set_index("claim")
    # 5 batches: the thesis rows are not blanked for want of batches (the class rows have intervals; a matched
    # contrast can still be undefined in over 5% of the draws on the stand-ins' few strata, and says so: NaN)
    th = claims[claims.index.str.startswith("fig04_thesis_")]
    assert (th.n >= 5).all() and np.isfinite(claims.loc["fig04_thesis_pos_shared_cancellation"].lo)
    assert np.isfinite(th.lo).sum() >= len(th) // 2
    assert "fig04_thesis_verdict" in claims.index and "fig04_thesis_copies_vs_random" in claims.index
    assert "fig04_thesis_pos_contrast_vs_null_ctx" in claims.index


@pytest.mark.slow
def test_05(out_root):
    res, figs = _run("05", out_root)
    _figs(figs, "fig05_value_gap", "fig11_repeated_updates")
    vt = pd.read_parquet(res / "fig05_token_values.parquet")
    p = vt[vt.estimator == "paper"]
    assert np.allclose(p.delta_hat, (p.avg0 - p.avg1) / (1 - p.prob))
    h = pd.read_parquet(res / "fig05_heldout_values.parquet")  # held-out states: a balanced pool
    assert set(h.status) == {"boosted", "suppressed"} and h.groupby(["sign", "status"]).size().nunique() == 1


@pytest.mark.slow
def test_06(out_root):
    res, figs = _run("06", out_root)
    _figs(figs, "fig06_sampling_budget", "fig07b_reward_composition")
    assert len(pd.read_parquet(res / "fig06_value_gap.parquet"))
    raw = pd.read_parquet(res / "fig06_valued_deltas.parquet")  # step_mode grpo: real grpo_steps
    assert raw.in_update.all() and raw.seed.nunique() == 2 and set(raw[raw.panel == "composition"].x) <= {1}


@pytest.mark.slow
def test_07(out_root, tmp_path):
    res, figs = _tallied("07", out_root, tmp_path)
    _figs(figs, "fig07a_sign_partition", "fig08_training_curves")
    curves = pd.read_parquet(res / "fig08_training_curves.parquet")
    assert "math500" in set(curves.set)  # evaluated on the MATH-500-shaped file, rewarded by math-verify
    it = pd.read_parquet(res / "fig08_iterations.parquet")   # the reward's coverage, recorded per iteration
    assert (it.with_answer >= 0).all() and (it.with_answer <= it.graded).all() and (it.graded == it.rounds * 2 * 4).all()
    # engine: trl — the runs behind Fig. 8 / Table 2 are TRL's (its monitor table is written only then)
    assert len(pd.read_parquet(res / "fig08_trl_monitor.parquet"))
    mbs = pd.read_parquet(res / "fig07a_minibatches.parquet")
    assert mbs[["loss", "clipfrac", "ratio_dev", "grad_norm"]].notna().all().all()
    imb = pd.read_csv(res / "table2_local_imbalance.csv")  # Eq. 14's passes on the paper path
    assert set(imb.strategy) == {"random", "QB", "sign_partitioned"} and (imb.retained.dropna() <= 1 + 1e-9).all()


def test_paper_profile_can_fill_fig7b_and_trains_at_the_papers_lr():
    """7(b) draws k positives and G_comp − k negatives from one group of comp_G: it must hold G_comp − 1 of each
    (every composition 1..G_comp − 1 of the same queries); the scores h of a 1.7B model do not fit: real steps;
    Fig. 11's Adam repeats and the training runs use the paper's lr 1e-6, not the tiny profile's."""
    paper = profiles.load_profile(PAPER.stem)
    s = paper["06_sampling_budget"]
    assert s["comp_G"] >= 2 * (s["G_comp"] - 1) and s["G_comp"] >= 16 and s["step_mode"] == "grpo"
    assert paper["05_value_gap"]["adam_lrs"][0] == paper["01_token_flipping"]["lr"] == paper["07_batching"]["lr"] == 1e-6


@pytest.mark.slow
def test_08(out_root, tmp_path):
    res, figs = _timed("08", out_root, tmp_path)
    _figs(figs, "fig12_referee_controls")
    lm = pd.read_parquet(res / "fig12_lm_head_kernel.parquet")
    assert len(lm) == 8 and lm.n_pairs.sum() > 0
    pairs = pd.read_parquet(res / "fig12_full_pairs.parquet")
    assert np.isfinite(pairs.full_inner).all() and len(pairs) > 0
