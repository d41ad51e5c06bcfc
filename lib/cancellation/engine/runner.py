"""Whole runs on TRL: `train_trl` (one Table 2 run) and `small_trainer_frames` (its output as
the small trainer's frames, so notebook 07 reads a TRL run as it reads `train.train_run`'s).

Owns the run wiring: policy, dataset, config, `BatchingGRPOTrainer`, the step recorder, the
monitor, evaluation callbacks; and the frame mapping (`SMALL_FRAMES`, `TRL_FRAME_NOTES`).
"""
from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import torch

from .. import cache, policy, sources
from .data import grpo_config, problem_dataset, reward_function
from .monitor import CancellationMonitor
from .recorder import StepRecorder
from .trainer import BatchingGRPOTrainer


# the columns of train.train_run's three frames, in its order (buffer_* only for RB runs, with_answer and graded
# only on a problem file)
SMALL_FRAMES = {
    "evals": ["iteration", "updates", "set", "accuracy", "seconds"],
    "iterations": ["iteration", "rounds", "sampled_acc", "updated", "t_sample", "buffer_discarded",
                   "buffer_delayed", "buffer_buffered", "buffer_sampled", "buffer_released", "batch_acc", "entropy",
                   "n_rollouts", "n_pos", "n_neg", "n_tokens", "resp_len", "loss", "t_update", "with_answer",
                   "graded"],
    "minibatches": ["loss", "clipfrac", "n_tokens", "ratio_dev", "minibatch", "rows", "n_pos", "n_neg",
                    "grad_norm", "iteration"],
}
# what the TRL frames give differently from train_run (printed by notebook 07 on engine='trl')
TRL_FRAME_NOTES = (
    "iterations.entropy: token-weighted mean of the mini-batch entropies from TRL's loss forwards, each at "
    "that step's parameters (train_run: one forward at θ_old over the whole batch; equal on the first "
    "mini-batch, then drifting by the within-iteration update);",
    "iterations.t_sample: TRL's generation and rewards (all RB rounds); t_update: the optimizer steps' wall "
    "time minus t_sample (loss forward, backward, Adam; the monitor's extra forward and evaluation excluded);",
    "evals.seconds: the evaluation's wall time, as train_run;",
    "a column with no source in the run (an old cached run without the step record) is NaN.",
)


def small_trainer_frames(out: dict, n_minibatches: int | None = None) -> dict:
    """`train_trl`'s output as `train.train_run`'s three frames (SMALL_FRAMES), so notebook 07's
    Fig. 8 / Table 2 / Fig. 7(a) code reads a TRL run as it reads the small trainer's.

    evals: iteration, updates (= iteration × n_minibatches), set, accuracy, seconds.
    iterations: one row per rollout batch (updated or not, as train_run): rounds, sampled_acc,
    updated, t_sample, RB's buffer_* counters; for an updated iteration batch_acc, n_rollouts,
    n_pos, n_neg, n_tokens, resp_len from the released batch (the trainer's mini-batch record),
    entropy, loss (mean over its mini-batch steps) and t_update from the per-step record.
    minibatches: one row per optimizer step taken: loss, clipfrac, n_tokens, ratio_dev,
    minibatch, rows, n_pos, n_neg, grad_norm, iteration. See TRL_FRAME_NOTES for the differences.
    """
    nan = float("nan")
    mb, its = out["minibatches"], out["iterations"].copy()
    steps = out.get("steps")
    if steps is None or not len(steps):
        steps = pd.DataFrame(columns=["step", "loss", "clipfrac", "n_tokens", "ratio_dev", "entropy_sum",
                                      "grad_norm", "seconds"])
    if n_minibatches is None:
        n_minibatches = int(out["trainer"].n_minibatches) if "trainer" in out else \
            int(mb.minibatch.max()) + 1 if len(mb) else 1
    # mini-batches: the trainer's row record grouped by step, joined with the step record
    if len(mb):
        per = mb.assign(pos=mb.sign > 0, neg=mb.sign < 0).groupby(["iteration", "minibatch", "step"], as_index=False) \
            .agg(rows=("row", "size"), n_pos=("pos", "sum"), n_neg=("neg", "sum"), mb_tokens=("n_tokens", "sum"))
    else:
        per = pd.DataFrame(columns=["iteration", "minibatch", "step", "rows", "n_pos", "n_neg", "mb_tokens"])
    per = per.merge(steps.drop(columns=["n_tokens"]), on="step", how="left")
    per["n_tokens"] = per.pop("mb_tokens")
    for c in ("rows", "n_pos", "n_neg", "n_tokens", "minibatch", "iteration"):
        per[c] = per[c].astype(int)
    minibatches = per[SMALL_FRAMES["minibatches"]].astype({c: float for c in ("loss", "clipfrac", "ratio_dev",
                                                                              "grad_norm")}).reset_index(drop=True)
    # iterations: the trainer's iteration record + the released batch + the steps
    if len(mb):
        rel = mb.drop_duplicates(["iteration", "row"])
        b = rel.groupby("iteration").agg(batch_acc=("reward", "mean"), n_rollouts=("row", "size"),
                                         n_pos=("sign", lambda s: int((s > 0).sum())),
                                         n_neg=("sign", lambda s: int((s < 0).sum())),
                                         n_tokens=("n_tokens", "sum"), resp_len=("n_tokens", "mean"))
        st = per.groupby("iteration").agg(loss=("loss", "mean"), ent=("entropy_sum", "sum"),
                                          ntok=("n_tokens", "sum"), secs=("seconds", "sum"),
                                          have=("entropy_sum", "count"))
        b["entropy"] = (st.ent / st.ntok).where(st.have == per.groupby("iteration").size())
        b["loss"] = st.loss
        b["_steps_s"] = st.secs.where(st.have == per.groupby("iteration").size())
    else:
        b = pd.DataFrame(columns=["batch_acc", "n_rollouts", "n_pos", "n_neg", "n_tokens", "resp_len", "entropy",
                                  "loss", "_steps_s"])
    its = its.merge(b, left_on="iteration", right_index=True, how="left")
    if "t_sample" not in its:
        its["t_sample"] = nan
    its["t_update"] = (its.pop("_steps_s") - its.t_sample).where(its.updated)
    its.loc[~its.updated.astype(bool), ["batch_acc", "entropy", "n_rollouts", "n_pos", "n_neg", "n_tokens",
                                        "resp_len", "loss"]] = nan
    cols = [c for c in SMALL_FRAMES["iterations"] if c in its or not c.startswith(("buffer_", "with_answer", "graded"))]
    for c in cols:
        if c not in its:
            its[c] = nan
    iterations = its[cols].reset_index(drop=True)
    # evals
    ev = out["evals"].copy()
    if len(ev):
        ev["updates"] = ev.iteration * n_minibatches
        et = out.get("eval_times")
        if et is not None and len(et):
            ev = ev.merge(et, on="iteration", how="left")
        else:
            ev["seconds"] = nan
        evals = ev[SMALL_FRAMES["evals"]].reset_index(drop=True)
    else:
        evals = pd.DataFrame(columns=SMALL_FRAMES["evals"])
    return {"evals": evals, "iterations": iterations, "minibatches": minibatches}


# --------------------------------------------------------------------------- runs
def _progress_bar(strategy: str, seed: int):
    """A tqdm bar over the run's optimizer steps, named by strategy and seed (the Trainer's own
    ProgressCallback also writes every log dict as a line; this one only moves the bar)."""
    from transformers.trainer_callback import ProgressCallback

    class _Bar(ProgressCallback):
        def on_train_begin(self, args, state, control, **kw):
            from tqdm.auto import tqdm
            if state.is_world_process_zero:
                self.training_bar = tqdm(total=state.max_steps, desc=f"TRL {strategy} seed {seed}", leave=False,
                                         dynamic_ncols=True)
            self.current_step = 0

        def on_log(self, args, state, control, logs=None, **kw):
            pass

    return _Bar()


def _tensorboard(log_dir: Path):
    """transformers' TensorBoardCallback writing to `log_dir` (None when tensorboard is not installed)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    from transformers.integrations import TensorBoardCallback
    log_dir.mkdir(parents=True, exist_ok=True)
    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(log_dir)))


STATE_FILE = "cancellation_state-{rank}.pt"   # in each checkpoint folder, per process, beside the Trainer's files


def last_checkpoint(output_dir, rank: int = 0) -> Path | None:
    """The newest `checkpoint-<step>` folder under `output_dir` that holds this process's run state (written
    after the Trainer's own files: a folder without it is a checkpoint cut off while saving); None when none."""
    found = []
    for d in Path(output_dir).glob("checkpoint-*"):
        step = d.name.removeprefix("checkpoint-")
        if step.isdigit() and (d / STATE_FILE.format(rank=rank)).exists():
            found.append((int(step), d))
    return max(found)[1] if found else None


def _checkpoints(trainer, recorder, mon, evals: list, eval_times: list):
    """A callback that writes, at each of the Trainer's checkpoints, what `train_trl(resume=True)` needs besides
    the Trainer's own files (weights, Adam, scheduler, RNGs, log): the strategy state
    (`BatchingGRPOTrainer.checkpoint_state`), the per-step record, the monitor's rows and the evaluations."""
    from transformers import TrainerCallback

    class _State(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not folder.is_dir():
                return
            st = dict(trainer=trainer.checkpoint_state(), steps=list(recorder.rows), evals=list(evals),
                      eval_times=list(eval_times))
            if mon is not None:
                st["monitor"] = dict(rows=list(mon.rows), tokens=list(mon.tokens), seconds=mon.seconds,
                                     noise=mon._noise)
            out = folder / STATE_FILE.format(rank=trainer.accelerator.process_index)
            cache.atomic_write(out, lambda tmp: torch.save(st, tmp))

    return _State()


def _restore(st: dict, trainer, recorder, mon, evals: list, eval_times: list) -> None:
    trainer.restore_state(st["trainer"])
    recorder.rows = list(st["steps"])
    evals[:], eval_times[:] = st["evals"], st["eval_times"]
    if mon is not None and "monitor" in st:
        m = st["monitor"]
        mon.rows, mon.tokens, mon.seconds, mon._noise = list(m["rows"]), list(m["tokens"]), m["seconds"], m["noise"]


def train_trl(model_path, source: sources.ProblemSource, strategy: str = "random", *, output_dir="data/cache/trl",
              iterations: int = 16, n_prompts: int = 8, G: int = 8, n_minibatches: int = 4, lr: float = 3e-4,
              max_new_tokens: int = 96, temperature: float = 1.0, tau: float = 0.4, max_rounds: int = 4,
              max_age: int = 2, seed: int = 0, dtype: str = "float32", device: str | None = None,
              use_vllm: bool = False, gradient_checkpointing: bool = False, monitor: bool = True,
              eval_fn=None, eval_every: int = 0, model=None, tokenizer=None, quiet: bool = True,
              compute=None, progress: bool = True, tensorboard: bool = True, save_every: int = 0,
              resume: bool = False, callbacks=(), **config_overrides) -> dict:
    """One Table 2 run on TRL: `strategy` (a registered strategy TRL runs: `STRATEGIES`) from `model_path` on
    `source`'s problems.

    Returns {'log' (trainer log history), 'minibatches', 'iterations', 'monitor' (per-step
    shares, when `monitor`), 'steps' (per optimizer step: loss, clipfrac, ratio_dev, entropy,
    grad norm, seconds), 'eval_times', 'evals' (when `eval_fn(model, tokenizer) -> {set: accuracy}` and
    `eval_every` (iterations) are given), 'trainer'}. The policy trains in place when `model`
    is given. On GPU with `use_vllm` generation runs in a colocated vLLM engine; across GPUs
    launch the script with `accelerate launch --config_file configs/accelerate_multi.yaml`.
    `compute` (a `Compute`): its token_chunk bounds TRL's loss forwards (rows × max_new_tokens per
    micro-batch, gradient accumulation making up the mini-batch: `grpo_config`).
    A long run is observable: `progress` shows a progress bar over the optimizer steps (tqdm, without
    the Trainer's per-step log lines), `tensorboard` writes TensorBoard event files of the Trainer's log
    (loss, reward, clip fraction, ...) under `<output_dir>/tensorboard` when tensorboard is installed
    (`tensorboard --logdir <output_dir>/tensorboard`). Neither changes a number of the run.
    `save_every` (iterations, 0: never) saves a checkpoint under `<output_dir>/checkpoint-<step>` at the end
    of every save_every-th iteration (the Trainer's weights, Adam, scheduler, RNG states and log, plus this run's
    state: `STATE_FILE`; the last two kept); with `resume` a run picks up at the newest complete checkpoint
    there (`last_checkpoint`; none: from the start) and gives the same records and weights as a run never
    interrupted (tests/test_checkpoints.py). `model` is then overwritten with the checkpoint's weights.
    `callbacks`: more `TrainerCallback`s, added after the run's own.
    """
    from transformers import TrainerCallback


    if model is None or tokenizer is None:
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = policy.load_policy(model_path, dtype=dtype if dtype != "bfloat16" else "float32",
                                              device=dev, exact=dtype == "float64")
    tokenizer.padding_side = "left"
    token_chunk = compute.token_chunk if compute is not None else None
    source.load()
    ds = problem_dataset(source, tokenizer, max(n_prompts * iterations * 2, 64), seed=seed)
    if len(ds) < n_prompts:  # TRL's dataloader drops the short batch: the run would take no step at all
        raise ValueError(f"the problems hold {len(ds)} distinct prompts, fewer than n_prompts = {n_prompts} "
                         "that one TRL sampling round draws: lower n_prompts or use a larger problem file")
    import warnings
    with warnings.catch_warnings():
        if quiet:  # transformers 5 renames gradient_checkpointing -> activation_checkpointing; TRL uses the old name
            warnings.filterwarnings("ignore", category=FutureWarning)
        cfg = grpo_config(output_dir, n_prompts=n_prompts, G=G, n_minibatches=n_minibatches, iterations=iterations,
                          lr=lr, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype,
                          use_vllm=use_vllm, gradient_checkpointing=gradient_checkpointing,
                          token_chunk=token_chunk,
                          **({"save_strategy": "steps", "save_steps": save_every * n_minibatches, "save_total_limit": 2}
                             if save_every else {}), **config_overrides)
    trainer = BatchingGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward_function(source)],
                      args=cfg, train_dataset=ds, strategy=strategy, tau=tau, max_rounds=max_rounds,
                      max_age=max_age, plan_seed=seed, token_chunk=token_chunk)
    recorder = StepRecorder().attach(trainer)   # before the monitor: its step time excludes the monitor's
    mon = CancellationMonitor().attach(trainer) if monitor else None
    evals, eval_times = [], []
    ckpt = last_checkpoint(output_dir, trainer.accelerator.process_index) if resume else None
    if ckpt is not None:
        _restore(torch.load(ckpt / STATE_FILE.format(rank=trainer.accelerator.process_index), weights_only=False),
                 trainer, recorder, mon, evals, eval_times)
        print(f"[trl] {strategy} seed {seed}: resuming from {ckpt}", flush=True)
    if save_every:
        trainer.add_callback(_checkpoints(trainer, recorder, mon, evals, eval_times))
    if eval_fn is not None and eval_every:
        class _Eval(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, **kw):
                if state.global_step % (eval_every * n_minibatches) == 0 or state.global_step == state.max_steps:
                    was = trainer.model.training
                    trainer.model.eval()
                    t = time.perf_counter()
                    for k, v in eval_fn(trainer.model, tokenizer).items():
                        evals.append(dict(iteration=state.global_step // n_minibatches, set=k, accuracy=v))
                    eval_times.append(dict(iteration=state.global_step // n_minibatches,
                                           seconds=time.perf_counter() - t))
                    trainer.model.train(was)
        if ckpt is None:   # a resumed run has its evaluations up to the checkpoint
            model.eval()
            t = time.perf_counter()
            evals += [dict(iteration=0, set=k, accuracy=v) for k, v in eval_fn(model, tokenizer).items()]
            eval_times.append(dict(iteration=0, seconds=time.perf_counter() - t))
        trainer.add_callback(_Eval())
    if quiet:  # the metrics stay in trainer.state.log_history (and TensorBoard/W&B if configured)
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    if progress:
        trainer.add_callback(_progress_bar(strategy, seed))
    if tensorboard:
        tb = _tensorboard(Path(output_dir) / "tensorboard")
        if tb is not None:
            trainer.add_callback(tb)
    for cb in callbacks:
        trainer.add_callback(cb)
    with warnings.catch_warnings():
        if quiet:  # transformers 5 renames gradient_checkpointing -> activation_checkpointing; TRL calls the old names
            warnings.filterwarnings("ignore", category=FutureWarning)
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt is not None else None)
    return {"log": pd.DataFrame(trainer.state.log_history), "minibatches": trainer.minibatch_table(),
            "iterations": trainer.iteration_table(), "monitor": mon.table() if mon else pd.DataFrame(),
            "evals": pd.DataFrame(evals), "steps": recorder.table(), "eval_times": pd.DataFrame(eval_times),
            "trainer": trainer, "monitor_callback": mon}
