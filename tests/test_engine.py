"""TRL integration (engine.py): strategies' defining properties from the trainer's own record,
TRL's loss == grpo.policy_loss, and the monitor == measure.token_stats before/after.

CPU, the tiny-s policy, 2 iterations of 4 prompts x 4 rollouts, HF generation inside TRL."""
import copy
import math
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from cancellation import engine, grpo, measure, policy, rollout, sources, tasks  # noqa: E402
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify

MODEL = "data/policies/tiny-s"
SOURCE = dict(kinds=("add2", "sub2"))   # tiny-s solves these often enough for mixed groups
RUN = dict(iterations=2, n_prompts=4, G=4, n_minibatches=2, max_new_tokens=48, tau=0.25, max_rounds=3)

pytestmark = pytest.mark.skipif(not (Path(MODEL) / "config.json").exists(), reason="needs make policy")


def _run(strategy, dtype="float32", **kw):
    torch.manual_seed(0)
    model, tok = policy.load_policy(MODEL, dtype=dtype)
    with tempfile.TemporaryDirectory() as d:
        return engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), strategy, output_dir=d, model=model,
                                tokenizer=tok, dtype=dtype, **{**RUN, **kw})


@pytest.fixture(scope="module")
def runs():
    return {s: _run(s) for s in engine.STRATEGIES}


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
@pytest.mark.parametrize("strategy", list(engine.STRATEGIES))
def test_strategy_property_from_trainer_record(runs, strategy):
    out = runs[strategy]
    mb, its = out["minibatches"], out["iterations"]
    B = RUN["n_prompts"] * RUN["G"]
    plan, rb = engine.STRATEGIES[strategy]
    assert len(its) == RUN["iterations"]
    assert its.updated.any(), "no update in the run: the property would hold vacuously"
    for it, d in mb.groupby("iteration"):
        # every iteration's mini-batches partition its B released rollouts
        assert sorted(d.row) == list(range(B))
        assert d.minibatch.nunique() <= RUN["n_minibatches"]
        # advantages are verl's group normalisation of the recorded rewards (unbiased std, eps 1e-6)
        # (RB may release part of a group; its advantages are those of the whole sampled group)
        full = d[d.groupby("group").row.transform("size") == RUN["G"]].sort_values("row")
        adv = rollout.group_advantages(torch.tensor(full.reward.values), torch.tensor(full.group.values))
        assert torch.allclose(adv, torch.tensor(full.advantage.values), atol=1e-12)
        if plan == "query_preserved":   # groups intact
            assert (d.groupby("group").minibatch.nunique() == 1).all()
        if plan == "sign_partitioned":   # one sign per mini-batch
            signs = d[d.sign != 0].groupby("minibatch").sign.nunique()
            assert (signs <= 1).all()
        if plan == "random":             # TRL's own split: equal sizes
            assert d.groupby("minibatch").size().nunique() == 1
        if rb:                           # balanced counts
            assert min((d.sign > 0).sum(), (d.sign < 0).sum()) >= math.ceil(RUN["tau"] * B - 1e-9)
        if strategy == "DS":             # DAPO's dynamic sampling: whole groups, each with mixed rewards
            per = d.groupby("group").reward.agg(["size", "min", "max"])
            assert (per["size"] == RUN["G"]).all() and (per["min"] < per["max"]).all()
    if rb or strategy == "DS":
        assert {"buffer_discarded", "buffer_delayed"} <= set(its.columns)
        assert "rb/discarded" in out["log"].columns and "rb/delayed" in out["log"].columns
    # monitor ran and logged through the trainer
    assert "cancellation/noise_floor" in out["log"].columns
    assert len(out["monitor"]) and out["monitor"].noise_floor.max() < 1e-5


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_random_splits_groups_somewhere(runs):
    """The baseline scatters a query's rollouts (what QB fixes) — at least once in the run."""
    mb = runs["random"]["minibatches"]
    assert (mb.groupby(["iteration", "group"]).minibatch.nunique() > 1).any()


def test_config_is_methods_update():
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=4, G=4, n_minibatches=2)
    assert (cfg.loss_type, cfg.epsilon, cfg.epsilon_high, cfg.delta, cfg.beta) == ("dapo", 0.2, 0.28, 3.0, 0.0)
    assert (cfg.steps_per_generation, cfg.gradient_accumulation_steps, cfg.num_iterations) == (2, 1, 1)
    assert cfg.max_grad_norm == 0 and cfg.weight_decay == 0 and cfg.lr_scheduler_type == "constant"
    with pytest.raises(ValueError, match="divisible"):
        engine.grpo_config(tempfile.mkdtemp(), n_prompts=3, G=3, n_minibatches=2)


def test_micro_batch_sizing_binds_only_past_token_chunk():
    """rows × max_new_tokens ≤ token_chunk: TRL's micro-batch is the mini-batch (no accumulation) while it
    fits; past it, one nominal row per micro-step and mini-batch-many accumulation steps (optimizer steps unchanged)."""
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=8, G=8, n_minibatches=4, max_new_tokens=96,
                             token_chunk=4096)   # the tiny profile: 16 x 96 = 1536 <= 4096
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.steps_per_generation) == (16, 1, 4)
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=2, G=4, n_minibatches=2, max_new_tokens=24,
                             token_chunk=64, iterations=3)   # paper-smoke: 4 x 24 = 96 > 64
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps, cfg.steps_per_generation) == (1, 4, 8)
    assert cfg.max_steps == 3 * 2 and engine.micro_rows(24, 64) == 2 and engine.micro_rows(2048, 2048) == 1


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_guard_sees_trls_fused_head():
    """TRL's loss forward reads lm_head.weight in its fused head without calling the head module: the
    Compute guard counts it on the model object, so a run whose mini-batch exceeds token_chunk raises."""
    from cancellation import guard
    model, tok = policy.load_policy(MODEL, dtype="float32")
    guard.guard_lm_head(model, 2 * RUN["max_new_tokens"])
    with tempfile.TemporaryDirectory() as d, pytest.raises(guard.MemoryBoundError, match="fused LM head"):
        engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), "random", output_dir=d, model=model, tokenizer=tok,
                         monitor=False, **{**RUN, "iterations": 1})


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
@pytest.mark.parametrize("strategy", ["random", "sign_partitioned", "QB+RB"])
def test_micro_batches_take_the_same_steps(strategy):
    """A run whose mini-batches are accumulated from micro-batches (token_chunk binding) takes the same
    optimizer steps as one without (float64: same batches, same plans, same parameters to round-off), and
    no loss forward scores more than token_chunk positions (the Compute guard on the model)."""
    from cancellation import compute, guard
    out = {}
    model0 = [p.detach().clone() for p in policy.load_policy(MODEL, dtype="float64")[0].parameters()]
    for tc in (None, 2 * RUN["max_new_tokens"]):
        torch.manual_seed(0)
        model, tok = policy.load_policy(MODEL, dtype="float64")
        if tc:
            guard.guard_lm_head(model, tc)
        with tempfile.TemporaryDirectory() as d:
            r = engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), strategy, output_dir=d, model=model,
                                 tokenizer=tok, dtype="float64", monitor=False, iterations=1,
                                 compute=compute.Compute(token_chunk=tc) if tc else None,
                                 **{k: v for k, v in RUN.items() if k != "iterations"})
        assert r["trainer"].args.gradient_accumulation_steps == (1 if tc is None else 8)
        out[tc] = (r, [p.detach().clone() for p in model.parameters()])
    (a, pa), (b, pb) = out.values()
    assert a["minibatches"].equals(b["minibatches"]) and len(a["steps"]) == len(b["steps"]) > 0
    # TRL's fused head gives float32 log-probs even in float64: splitting a mini-batch moves them by
    # float32 round-off, so the steps agree to that, far below what a step moves (Adam at lr 3e-4)
    moved = max(float((x - y).abs().max()) for x, y in zip(pa, model0))
    assert max(float((x - y).abs().max()) for x, y in zip(pa, pb)) < 1e-4 * moved and moved > 1e-5
    sa, sb = a["steps"], b["steps"]
    for c in ("loss", "clipfrac", "ratio_dev", "entropy_sum", "grad_norm"):
        assert abs(sa[c] - sb[c]).max() <= 1e-5 * max(1.0, abs(sa[c]).max()), c
    assert (sa.n_tokens == sb.n_tokens).all()


def _loss_case():
    """A float64 trainer and one mini-batch with ratios far from 1 (clip and dual clip bind)."""
    model, tok = policy.load_policy(MODEL, dtype="float64")
    src = sources.ProblemSource(**SOURCE)
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=4, G=4, n_minibatches=2, max_new_tokens=16)
    tr = engine.BatchingGRPOTrainer(model=model, processing_class=tok, reward_funcs=[engine.reward_function(src)],
                                    args=cfg, train_dataset=engine.problem_dataset(src, tok, 8))
    b = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=2, G=4, max_new_tokens=16, source=RAW),
                       problems=tasks.sample_problems(2, seed=3, kinds=SOURCE['kinds']), seed=0)
    b.reward = torch.tensor([1, 0, 0, 1, 1, 0, 0, 0], dtype=torch.float64)
    b.advantage = rollout.group_advantages(b.reward, b.group)
    d = engine.from_rollout(b, tok.pad_token_id, "cpu")
    d["advantages"] = b.advantage.clone()   # float64 (from_rollout gives TRL's float32)
    g = torch.Generator().manual_seed(0)
    cur = measure.token_stats(model, b, KNOBS).logp
    old_full = cur + 1.5 * (2 * torch.rand(cur.shape, generator=g, dtype=torch.float64) - 1)
    # TRL's completion layout: response tokens start at column 0 of completion_ids
    C = d["completion_ids"].shape[1]
    old_c = torch.zeros(len(b), C, dtype=torch.float64)
    for i in range(len(b)):
        cols = b.response_mask[i].nonzero().squeeze(1)
        old_c[i, :len(cols)] = old_full[i, cols]
    d["old_per_token_logps"] = old_c
    n_tok = d["completion_mask"].sum()
    d["num_items_in_batch"] = n_tok * cfg.steps_per_generation   # what BatchingGRPOTrainer sets
    return model, tr, b, d, old_full


def test_trl_loss_equals_policy_loss():
    model, tr, b, d, old_full = _loss_case()
    model.train()
    tr.current_gradient_accumulation_steps = 1   # set by Trainer.train() per window
    model.zero_grad()
    # the same log-probs on both sides (TRL's fused LM head would round them to float32: see
    # test_trl_forward_precision), so loss and gradient differences are the formulas' alone
    C = d["completion_ids"].shape[1]
    cols = [b.response_mask[i].nonzero().squeeze(1) for i in range(len(b))]

    def same_logp(m, *a, **kw):
        lp = measure.token_logp(measure.forward_logits(m, b), b.input_ids)
        out = torch.zeros(len(b), C, dtype=lp.dtype)
        rows = torch.cat([torch.full((len(c),), i) for i, c in enumerate(cols)])
        pos = torch.cat([torch.arange(len(c)) for c in cols])
        out = out.index_put((rows, pos), lp[rows, torch.cat(cols)])
        return out, torch.zeros_like(out), None

    tr._get_per_token_logps_and_entropies = same_logp
    loss_trl = tr._compute_loss(model, d)
    loss_trl.backward()
    g_trl = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logp = measure.token_logp(measure.forward_logits(model, b), b.input_ids)
    adv = b.advantage[:, None] * b.response_mask
    loss_ours = grpo.policy_loss(logp, old_full, adv, b.response_mask)
    loss_ours.backward()
    g_ours = [p.grad.clone() for p in model.parameters()]
    # the case exercises every branch: low clip, high clip, dual clip (A < 0, ρ > 3)
    ratio = torch.exp(logp.detach() - old_full)[b.response_mask]
    a = adv[b.response_mask]
    assert ((ratio > 3) & (a < 0)).any() and ((ratio > 1.28) & (a > 0)).any() and ((ratio < 0.8) & (a < 0)).any()
    assert abs(float(loss_trl) - float(loss_ours)) < 1e-12 * max(1, abs(float(loss_ours)))
    num = sum(float((x - y).norm() ** 2) for x, y in zip(g_trl, g_ours)) ** 0.5
    den = sum(float(y.norm() ** 2) for y in g_ours) ** 0.5
    assert den > 0 and num / den < 1e-10
    # plain TRL's dapo normaliser (generation-batch tokens / steps_per_generation) would scale this
    # mini-batch's loss by n_tok(mb) * spg / n_tok(batch); with the whole batch as "mini-batch" it is 1
    model.zero_grad()


def test_trl_forward_precision():
    """TRL's loss forward (fused LM head) returns float32 log-probs: on a float64 model they differ
    from ours by float32 round-off only (documented in engine.py)."""
    model, tr, b, d, _ = _loss_case()
    ids = torch.cat([d["prompt_ids"], d["completion_ids"]], 1)
    am = torch.cat([d["prompt_mask"], d["completion_mask"]], 1)
    with torch.no_grad():
        lp = tr._get_per_token_logps_and_entropies(model, ids, am, d["completion_ids"].size(1))[0]
    own = engine._own_forward(model, d)
    m = d["completion_mask"].bool()
    assert lp.dtype == torch.float32
    err = float((lp.double() - own)[m].abs().max())
    assert err < 1e-5, err


def test_plain_trl_advantage_difference_is_bounded():
    """TRL's group scaling uses std + 1e-4 (verl: + 1e-6); both std unbiased: the exact ratio."""
    from trl.trainer.utils import nanstd
    for G in (2, 4, 8, 16):
        for k in range(1, G):
            r = torch.tensor([1.0] * k + [0.0] * (G - k), dtype=torch.float64)
            std = nanstd(r)
            trl_adv = (r - r.mean()) / (std + 1e-4)
            ours = rollout.group_advantages(r, torch.zeros(G, dtype=torch.long))
            assert torch.allclose(trl_adv / ours, (std + 1e-6) / (std + 1e-4))
            # std >= sqrt(1/G) for binary rewards: at most 99e-6·sqrt(G) relative (2.8e-4 at G = 8)
            assert float(1 - (std + 1e-6) / (std + 1e-4)) <= 99e-6 * G ** 0.5 + 1e-12


def test_monitor_equals_token_stats_on_same_step():
    """Per step: the monitor's Δlog p == measure.token_stats(after) - token_stats(before) on the
    same mini-batch, same update (float64: round-off ~1e-12)."""
    from transformers import TrainerCallback

    model, tok = policy.load_policy(MODEL, dtype="float64")
    src = sources.ProblemSource(**SOURCE)
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=4, G=4, n_minibatches=2, iterations=1,
                             max_new_tokens=48, lr=1e-3)
    tr = engine.BatchingGRPOTrainer(model=model, processing_class=tok, reward_funcs=[engine.reward_function(src)],
                                    args=cfg, train_dataset=engine.problem_dataset(src, tok, 16), strategy="QB")
    mon = engine.CancellationMonitor(keep_tokens=True, forward="model").attach(tr)
    ours = []

    class Reference(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kw):
            self.before = copy.deepcopy(tr.model)

        def on_step_end(self, args, state, control, model=None, **kw):
            inputs = tr._buffered_inputs[(tr._step - 1) % cfg.steps_per_generation]
            if inputs.get("_skip"):
                return
            b = engine.to_rollout(inputs)
            t = measure.token_table(b, measure.token_stats(self.before, b, KNOBS),
                                    measure.token_stats(tr.model, b, KNOBS), step=state.global_step)
            ours.append(t)

    tr.add_callback(Reference())
    tr.train()
    import pandas as pd
    ref = pd.concat(ours, ignore_index=True).sort_values(["step", "rollout", "position"]).reset_index(drop=True)
    got = mon.token_table().sort_values(["step", "rollout", "position"]).reset_index(drop=True)
    assert len(ref) == len(got) > 0 and ref.step.nunique() == 2
    assert (ref.token_id.values == got.token_id.values).all()
    assert abs(ref.delta.values - got.delta.values).max() < 1e-10
    assert abs(ref.delta.values).max() > 1e-4          # the steps did move log-probs
    assert (ref.status.values == got.status.values).all()
    assert mon.table().noise_floor.max() < 1e-12


def test_measure_step_plain_function_on_rollout_batch(model64, batch):
    """measure_step for any trainer: the RolloutBatch path equals token_stats before/after."""
    m = copy.deepcopy(model64)
    before = measure.token_stats(m, batch, KNOBS).logp
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    grpo.grpo_step(m, batch, grpo.UpdateConfig(optimizer="sgd", lr=0.1), optimizer=opt, old_logp=before)
    tokens, shares = engine.measure_step(m, batch, before, knobs=KNOBS)
    after = measure.token_stats(m, batch, KNOBS).logp
    assert abs(tokens.delta.values - (after - before)[batch.response_mask].numpy()).max() < 1e-12
    assert set(shares.sign) <= {"pos", "neg"} and set(shares.conf_bin) <= {"all", *engine.CONF_BINS}
    s = shares[shares.conf_bin == "all"].groupby("sign").fraction.sum()
    assert (abs(s - 1) < 1e-12).all()


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_small_trainer_frames_maps_a_trl_run(runs):
    """engine.small_trainer_frames gives train_run's three frames (columns, meanings) from a TRL run."""
    from cancellation import train  # noqa: F401  (the frames' reference: train.train_run)

    for strategy in ("random", "QB+RB"):
        out = runs[strategy]
        evals = [dict(iteration=i, set=s, accuracy=0.5) for i in (0, RUN["iterations"]) for s in ("easy", "hard")]
        out = dict(out, evals=__import__("pandas").DataFrame(evals))
        f = engine.small_trainer_frames(out)
        it, mb, ev = f["iterations"], f["minibatches"], f["evals"]
        rb = engine.STRATEGIES[strategy][1]
        # buffer_* for RB only; with_answer only on a problem file (these runs: the generated task's exact check)
        want = [c for c in engine.SMALL_FRAMES["iterations"]
                if (rb or not c.startswith("buffer_")) and c not in ("with_answer", "graded")]
        assert list(it.columns) == want
        assert list(mb.columns) == engine.SMALL_FRAMES["minibatches"]
        assert list(ev.columns) == engine.SMALL_FRAMES["evals"]
        assert list(it.iteration) == list(range(RUN["iterations"]))
        assert (ev.updates == ev.iteration * RUN["n_minibatches"]).all()
        rec = out["minibatches"]
        upd = it[it.updated]
        # one mini-batch row per optimizer step taken, each with the step record (no NaN)
        assert len(mb) == len(out["steps"]) == rec.groupby(["iteration", "minibatch"]).ngroups
        assert mb[["loss", "clipfrac", "ratio_dev", "grad_norm"]].notna().all().all()
        assert (mb.grad_norm > 0).any() and ((mb.clipfrac >= 0) & (mb.clipfrac <= 1)).all()
        # rows / signs / tokens add up: mini-batches partition the released batch
        g = mb.groupby("iteration")[["rows", "n_pos", "n_neg", "n_tokens"]].sum()
        assert (g.rows == upd.set_index("iteration").n_rollouts).all()
        assert (g.n_pos == upd.set_index("iteration").n_pos).all()
        assert (g.n_tokens == upd.set_index("iteration").n_tokens).all()
        # ρ = 1 on an iteration's first mini-batch (θ_old), as in train_run
        assert mb[mb.minibatch == 0].ratio_dev.abs().max() < 1e-5
        assert upd[["batch_acc", "entropy", "loss", "t_sample", "t_update", "resp_len"]].notna().all().all()
        assert (upd.entropy > 0).all() and ((upd.batch_acc >= 0) & (upd.batch_acc <= 1)).all()
        assert (upd.n_rollouts == RUN["n_prompts"] * RUN["G"]).all()


# --------------------------------------------------------------------------- the monitor as a plain TRL callback
def test_monitor_module_imports_without_trl_or_notebook_machinery():
    import subprocess
    import sys
    heavy = ("matplotlib", "papermill", "jupytext", "nbformat", "nbclient", "IPython", "trl")
    code = ("import sys, cancellation.engine; assert 'transformers' not in sys.modules; "
            "import cancellation.engine.monitor; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _plain_trainer(tmp, callbacks, steps=2, dtype="float32", **cfg):
    """TRL's own GRPOTrainer (not the subclass) on the tiny policy, as a user would build it."""
    from trl import GRPOTrainer

    model, tok = policy.load_policy(MODEL, dtype=dtype)
    tok.padding_side = "left"
    src = sources.ProblemSource(**SOURCE)
    args = engine.grpo_config(tmp, n_prompts=4, G=4, n_minibatches=2, iterations=steps // 2, max_new_tokens=48,
                              **cfg)
    return GRPOTrainer(model=model, processing_class=tok, reward_funcs=[engine.reward_function(src)], args=args,
                       train_dataset=engine.problem_dataset(src, tok, 16), callbacks=callbacks)


def test_monitor_from_callbacks_list(tmp_path):
    """callbacks=[CancellationMonitor()] measures every step; per-step seconds; parquet parts == table()."""
    import pandas as pd
    from transformers.integrations.integration_utils import rewrite_logs

    pq = tmp_path / "cancellation.parquet"
    mon = engine.CancellationMonitor(parquet=str(pq), flush_every=1)
    tr = _plain_trainer(str(tmp_path), [mon], steps=4)
    tr.train()
    tab = mon.table()
    assert mon.trainer is tr and sorted(tab.step.unique()) == [1, 2, 3, 4]
    log = pd.DataFrame(tr.state.log_history)
    assert {"cancellation/pos/boosted", "cancellation/neg/suppressed", "cancellation/noise_floor"} <= set(log)
    assert log["cancellation/noise_floor"].max() < 1e-5
    # cancellation/seconds is each step's own time (logging_steps=1): they add up to the run's total
    secs = log["cancellation/seconds"].dropna()
    assert len(secs) == 4 and abs(secs.sum() - mon.seconds) < 1e-9 and (secs > 0).all()
    # the loggers (TensorBoard, W&B) prefix training metrics with train/: the names README shows
    assert "train/cancellation/pos/boosted" in rewrite_logs(tr.state.log_history[0])
    # appended, not rewritten: one part per step, read back as the in-memory table
    assert len(list(pq.glob("part-*.parquet"))) == 4
    pd.testing.assert_frame_equal(engine.read_parquet(pq), tab)
    pd.testing.assert_frame_equal(pd.read_parquet(pq).sort_values(["step"], kind="stable").reset_index(drop=True), tab)


def test_monitor_measures_in_eval_mode_and_restores_it(tmp_path):
    """With dropout on, the before/after forwards run in eval mode: the noise floor stays at round-off
    (the loss forward's dropout-noised log-probs are not used as "before"), and training mode is restored."""
    seen = []
    mon = engine.CancellationMonitor()
    tr = _plain_trainer(str(tmp_path), [mon], steps=2)
    tr.model.config.attention_dropout = 0.5
    for layer in tr.model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    mon.attach(tr)   # attach before train also works (and is idempotent with callbacks=[mon])
    inner, inner_fwd, in_monitor = tr._get_per_token_logps_and_entropies, mon._forward, [False]

    def spy(model, *a, **kw):   # every log-prob forward: (called by the monitor, training mode)
        seen.append((in_monitor[0], model.training))
        return inner(model, *a, **kw)

    def monitor_forward(model, inputs):
        was, in_monitor[0] = model.training, True
        try:
            return inner_fwd(model, inputs)
        finally:
            in_monitor[0] = False
            assert model.training == was   # the mode is restored

    tr._get_per_token_logps_and_entropies = spy
    mon._forward = monitor_forward
    tr.train()
    # (dropout may spoil every answer here, leaving no A != 0 rows: the noise floor is measured anyway)
    assert mon._noise is not None and mon._noise < 1e-5
    measuring = [training for by_monitor, training in seen if by_monitor]
    assert measuring and not any(measuring)      # the monitor's forwards: eval mode
    assert any(training for by_monitor, training in seen if not by_monitor)   # the loss forwards: training
    assert tr.model.training


def test_monitor_without_reachable_trainer_names_attach():
    from transformers import TrainerControl, TrainerState
    mon = engine.CancellationMonitor()
    with pytest.raises(RuntimeError, match=r"\.attach\(trainer\)"):
        mon.on_train_begin(None, TrainerState(), TrainerControl())


def test_rb_extra_rounds_go_through_the_trainer_dataloader(monkeypatch):
    """RB's extra rounds come from a Trainer dataloader (accelerate-prepared: sharded per process),
    with the seeded order the engine always used and the global RNG left untouched."""
    model, tok = policy.load_policy(MODEL)
    src = sources.ProblemSource(**SOURCE)
    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=4, G=4, n_minibatches=2)
    ds = engine.problem_dataset(src, tok, 10)
    tr = engine.BatchingGRPOTrainer(model=model, processing_class=tok, reward_funcs=[engine.reward_function(src)],
                                    args=cfg, train_dataset=ds, strategy="RB", plan_seed=3)
    calls = []
    inner = tr._get_dataloader
    monkeypatch.setattr(tr, "_get_dataloader", lambda *a, **kw: calls.append(kw) or inner(*a, **kw))
    state = torch.get_rng_state()
    got = [tr._extra_generation_batch() for _ in range(5)]   # 10 prompts, 4 a batch: passes of 2 batches
    assert torch.equal(state, torch.get_rng_state())
    assert len(calls) == 1 and calls[0]["is_training"]
    g = torch.Generator().manual_seed(3 + 7_654_321)
    want = []
    while len(want) < 5:
        want += [[ds[int(i)] for i in idx for _ in range(4)] for idx in torch.randperm(10, generator=g).split(4)
                 if len(idx) == 4]
    assert got == want[:5]


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_example_script_runs(tmp_path):
    """examples/trl_monitor.py: plain TRL with callbacks=[CancellationMonitor(...)] writes its rows."""
    import os
    import subprocess
    import sys

    import pandas as pd
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root / "lib") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(root / "examples/trl_monitor.py"), "--model", str(root / MODEL),
                          "--steps", "2", "--max-new-tokens", "48", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "cancellation.parquet")
    assert sorted(rows.step.unique()) == [1, 2] and {"pos", "neg"} & set(rows.sign)
    assert "steps measured" in out.stdout
    # TensorBoard (the dev extra installs it): the monitor's scalars under the tags README names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = sorted(tmp_path.rglob("events.out.tfevents.*"))
    assert events, sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    tags = set().union(*(EventAccumulator(str(e.parent)).Reload().Tags()["scalars"] for e in events))
    ours = {t for t in tags if t.startswith("train/cancellation/")}
    assert "train/cancellation/pos/boosted" in ours and "train/cancellation/seconds" in ours, sorted(tags)
    steps = {e.step for e in EventAccumulator(str(events[0].parent)).Reload().Scalars("train/cancellation/pos/boosted")}
    assert steps == {1, 2}


DDP_WORKER = '''
import os, sys
from cancellation import engine, policy, sources, tasks
out, rank = sys.argv[1], int(os.environ["RANK"])
model, tok = policy.load_policy("data/policies/tiny-s")
src = sources.ProblemSource(kinds=("add2", "sub2"))
cfg = engine.grpo_config(out, n_prompts=4, G=4, n_minibatches=2, iterations=1, max_new_tokens=48)
mon = engine.CancellationMonitor(parquet=f"{out}/cancellation{rank}", flush_every=1)
tr = engine.BatchingGRPOTrainer(model=model, processing_class=tok, reward_funcs=[engine.reward_function(src)],
                                args=cfg, train_dataset=engine.problem_dataset(src, tok, 32), strategy="QB+RB",
                                tau=0.25, max_rounds=3, callbacks=[mon])
tr.train()
assert tr.accelerator.num_processes == 2
tr.minibatch_table().to_json(f"{out}/minibatches{rank}.json")
tr.iteration_table().to_json(f"{out}/iterations{rank}.json")
# Both ranks are past every collective before either leaves; then leave without the interpreter's
# teardown: gloo's C++ threads can abort a rank there ("terminate called without an active
# exception", SIGABRT) after all the work is done -- seen in CI even after destroy_process_group.
import torch.distributed as dist
if dist.is_initialized():
    dist.barrier()
open(f"{out}/done{rank}", "w").close()
sys.stdout.flush(); sys.stderr.flush()
os._exit(0)
'''


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_two_processes_qb_rb_with_monitor(tmp_path):
    """Two CPU processes under `accelerate launch --config_file configs/accelerate_multi.yaml` (the shipped
    data-parallel config: its multi-GPU launcher, torch elastic underneath; on a machine without GPUs the
    processes join with gloo. `--cpu` would pick accelerate's single-process launcher, which starts one
    process only without MPI): each samples its own shard, the RB release is agreed by both, groups stay
    intact, both ranks build the same plan, and only the main process writes the monitor's parquet."""
    import os
    import shutil
    import subprocess
    import sys

    import pandas as pd
    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    if launcher is None:
        pytest.skip("no accelerate launcher next to the interpreter")
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "worker.py").write_text(DDP_WORKER)
    env = dict(os.environ, PYTHONPATH=str(root / "lib") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    run = subprocess.run([launcher, "launch", "--config_file", str(root / "configs/accelerate_multi.yaml"),
                          str(tmp_path / "worker.py"), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600)
    done = all((tmp_path / f"done{r}").exists() for r in (0, 1))
    # A nonzero exit once both ranks wrote `done` can only be the launcher's teardown, not our work.
    assert run.returncode == 0 or done, run.stderr[-3000:]
    assert done, run.stderr[-3000:]
    mb = [pd.read_json(tmp_path / f"minibatches{r}.json") for r in (0, 1)]
    its = [pd.read_json(tmp_path / f"iterations{r}.json") for r in (0, 1)]
    assert its[0].rounds.tolist() == its[1].rounds.tolist() and its[0].updated.tolist() == its[1].updated.tolist()
    assert its[0].updated.all()
    for d in mb:
        assert (d.groupby(["iteration", "group"]).minibatch.nunique() == 1).all()   # QB: groups intact
        assert min((d.sign > 0).sum(), (d.sign < 0).sum()) >= 4                     # RB: τ|B| of each sign
    plan = [d.groupby(["iteration", "minibatch"]).group.apply(lambda g: sorted(set(g))).tolist() for d in mb]
    assert plan[0] == plan[1]                       # the same plan (group ids are local) on both ranks
    assert sorted(p.name for p in (tmp_path / "cancellation0").glob("*.parquet")) == \
        ["part-000000001.parquet", "part-000000002.parquet"]
    assert not (tmp_path / "cancellation1").exists()


@pytest.mark.slow   # trains or runs a subprocess: make test, not make test-fast
def test_unscorable_rewards_stop_the_trainer_in_one_line():
    """A reward function that returns None (TRL: unscorable) for some completions: one line naming the
    function and the count, not a reward of 0 trained down as wrong nor a NaN advantage; a NaN of one
    function beside another's number stays TRL's 'does not apply' (summed away)."""
    from cancellation.engine.trainer import check_rewards
    nan, inf = float("nan"), float("inf")
    check_rewards(torch.tensor([[1.0, nan], [nan, 0.0]]), ["a", "b"])      # every row scored by one of them
    with pytest.raises(ValueError) as e:
        check_rewards(torch.tensor([[nan, nan], [1.0, nan], [nan, nan], [0.0, inf]]), ["a", "b"])
    assert str(e.value).startswith("BatchingGRPOTrainer: 2 of 4 completions got no reward (every reward function "
                                   "returned None/NaN); 1 of 4 completions got an infinite reward [a: 2 NaN, "
                                   "b: 3 NaN, 1 infinite]; ")
    model, tok = policy.load_policy(MODEL, dtype="float32")
    src = sources.ProblemSource(**SOURCE)
    correct = engine.reward_function(src)

    def sometimes_none(prompts, completions, **kw):
        r = correct(prompts, completions, **kw)
        return [None if i % 4 == 1 else x for i, x in enumerate(r)]    # one of every four: unscorable

    cfg = engine.grpo_config(tempfile.mkdtemp(), n_prompts=4, G=4, n_minibatches=2, iterations=1, max_new_tokens=8)
    tr = engine.BatchingGRPOTrainer(model=model, processing_class=tok, reward_funcs=[sometimes_none], args=cfg,
                                    train_dataset=engine.problem_dataset(src, tok, 8))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as e:
        tr.train()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("BatchingGRPOTrainer: 4 of 16 completions got no reward")
    assert "[sometimes_none: 4 NaN]" in msg
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))   # no step was taken


@pytest.mark.slow
def test_a_trl_run_writes_tensorboard_events_and_keeps_its_numbers(tmp_path):
    """Observability changes no number: the same run with and without the progress bar and TensorBoard
    gives the same per-step record, and the observed one leaves event files under <output_dir>/tensorboard."""
    model, tok = policy.load_policy(MODEL)
    torch.manual_seed(0)
    a = engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), "random", output_dir=tmp_path / "a", model=model,
                         tokenizer=tok, **{**RUN, "iterations": 1})
    model, tok = policy.load_policy(MODEL)
    torch.manual_seed(0)
    b = engine.train_trl(MODEL, sources.ProblemSource(**SOURCE), "random", output_dir=tmp_path / "b", model=model,
                         tokenizer=tok, progress=False, tensorboard=False, **{**RUN, "iterations": 1})
    cols = ["loss", "grad_norm"]
    assert a["steps"][cols].equals(b["steps"][cols]) and len(a["steps"]) == RUN["n_minibatches"]
    assert list((tmp_path / "a" / "tensorboard").glob("events.out.tfevents.*"))
    assert not (tmp_path / "b" / "tensorboard").exists()
