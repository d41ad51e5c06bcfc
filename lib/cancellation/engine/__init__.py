"""The batching interventions and the cancellation monitor on a real RL engine: TRL's GRPOTrainer.

Three pieces (issue 12), each usable on its own:

- `BatchingGRPOTrainer(GRPOTrainer)` (engine/trainer.py): the mini-batch strategies of Table 2
  (`STRATEGIES`: random, QB, RB, QB+RB, sign_partitioned) inside TRL, with the update matched to
  docs/methods.md (the "Matching docs/methods.md" notes are in that module's docstring).
- `grpo_config(...)` (engine/data.py): the GRPOConfig of docs/methods.md "The update"; with it the
  dataset and reward of a `sources.ProblemSource` (`problem_dataset`, `reward_function`) and the
  layout adapters between TRL's mini-batch dicts and `rollout.RolloutBatch` (`to_rollout`,
  `from_rollout`).
- `CancellationMonitor` (engine/monitor.py): a `transformers.TrainerCallback` measuring, after
  every optimizer step, Δlog p of that step's own mini-batch, logged as boosted/suppressed
  shares by advantage sign and confidence bin. The usual TRL idiom works:

      GRPOTrainer(..., callbacks=[CancellationMonitor(parquet="cancellation.parquet")])

  `measure_step` is the same measurement as a plain function for any trainer.

engine/recorder.py keeps the per-step record (loss, clipfrac, grad norm, time) that
engine/runner.py's `train_trl` returns next to the strategy's record; `small_trainer_frames`
reads a TRL run as the small trainer's (`train.train_run`) frames. engine/runs.py runs them as notebook 07
does: keyed, cached and checkpointed like the small trainer's runs (`cached_run`, `run_frames`: a `TrlSetup`
beside the run's `train.TrainConfig`), over `--procs N` ranks (`run_many`). The monitor's overhead
benchmark is `bench_sampling.bench_monitor` (`make bench B=monitor`).

Every public name is resolved lazily (module `__getattr__`), so `import cancellation.engine`
imports neither TRL nor transformers; `from cancellation.engine import X` imports X's module.
"""
from __future__ import annotations

import importlib

# public name -> the submodule that owns it
_WHERE = {
    "STRATEGIES": "data", "problem_dataset": "data", "reward_function": "data", "grpo_config": "data", "micro_batch": "data", "micro_rows": "data",
    "to_rollout": "data", "from_rollout": "data",
    "BatchingGRPOTrainer": "trainer",
    "CancellationMonitor": "monitor", "CONF_BINS": "monitor", "measure_step": "monitor", "step_table": "monitor",
    "summarize": "monitor", "read_parquet": "monitor", "_own_forward": "monitor",
    "StepRecorder": "recorder",
    "train_trl": "runner", "last_checkpoint": "runner", "small_trainer_frames": "runner", "SMALL_FRAMES": "runner", "TRL_FRAME_NOTES": "runner",
    "TrlSetup": "runs", "trl_arguments": "runs", "run_inputs": "runs", "is_cached": "runs", "cached_run": "runs",
    "run_frames": "runs", "run_many": "runs",
}

__all__ = [n for n in _WHERE if not n.startswith("_")]


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'cancellation.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
