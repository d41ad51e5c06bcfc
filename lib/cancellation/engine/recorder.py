"""The per-optimizer-step record of a GRPOTrainer run (what the small trainer records per mini-batch).

Owns `StepRecorder`, a callback that reads loss, clipfrac, token count, |ρ − 1|, entropy, the
gradient norm and the step's wall time off the trainer's own loss forward (no extra forward).
`runner.train_trl` attaches it and `runner.small_trainer_frames` reads it.
"""
from __future__ import annotations

import time

import pandas as pd
import torch
from transformers import TrainerCallback

from .. import grpo
from .monitor import hook_loss


class StepRecorder(TrainerCallback):
    """Per optimizer step of a GRPOTrainer, what `train.minibatch_update` records for a
    mini-batch step, read off the trainer's own loss forward (no extra forward): loss,
    clipfrac (verl's pg_clipfrac, `grpo.clip_binds`), n_tokens, ratio_dev (mean |ρ − 1|
    against the iteration's θ_old), entropy (token sum, at this step's parameters), the
    gradient norm before the optimizer step, and the step's wall time (`seconds`, from
    step begin to step end, before later callbacks such as the monitor and evaluation).
    Steps that take no update (skip steps of a short plan, RB without a release) have no row.
    With gradient accumulation (micro-batches of one mini-batch, `grpo_config`'s token_chunk
    sizing) a step's row adds up its micro-batches: loss (each micro loss is already normalised
    by the mini-batch's tokens), clipped tokens, tokens, Σ|ρ − 1| and the entropy sum.
    """

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.28):
        self.clip_low, self.clip_high = clip_low, clip_high
        self.rows: list[dict] = []
        self._row = None
        self._t0 = None

    def attach(self, trainer):
        self.trainer = trainer
        hook_loss(trainer, lambda model: model.training, self._after_loss)
        trainer.add_callback(self)
        return self

    def _after_loss(self, model, inputs, loss, logp, ent):
        if logp is None:
            return
        row = self._stats(inputs, logp, ent, loss, self.trainer.state.global_step)
        if self._row is None or self._row["step"] != row["step"]:
            self._row = row
            return
        a, b = self._row, row   # another micro-batch of the same optimizer step
        n = a["n_tokens"] + b["n_tokens"]
        a["clipfrac"] = (a["clipfrac"] * max(a["n_tokens"], 1) + b["clipfrac"] * max(b["n_tokens"], 1)) / max(n, 1)
        a["ratio_dev"] = (a["ratio_dev"] * max(a["n_tokens"], 1) + b["ratio_dev"] * max(b["n_tokens"], 1)) / max(n, 1)
        a["loss"] += b["loss"]
        a["entropy_sum"] += b["entropy_sum"]
        a["n_tokens"] = n

    def _stats(self, inputs, logp, ent, loss, step):
        m = inputs["completion_mask"].bool()
        old = inputs.get("old_per_token_logps")
        old = logp if old is None else old.detach()
        adv = inputs["advantages"].detach()
        adv = (adv if adv.dim() == 2 else adv[:, None]).double()
        ratio = torch.exp(logp.double() - old.double())
        n = int(m.sum())
        binds = grpo.clip_binds(ratio, adv, self.clip_low, self.clip_high) & m
        return dict(step=int(step), loss=float(loss.detach()), clipfrac=float(binds.sum()) / max(n, 1),
                    n_tokens=n, ratio_dev=float((ratio - 1).abs()[m].sum()) / max(n, 1),
                    entropy_sum=float(ent.double()[m].sum()) if ent is not None else float("nan"))

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if self._row is None:
            return
        ps = [p for p in (model if model is not None else self.trainer.model).parameters() if p.grad is not None]
        self._row["grad_norm"] = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ps))) if ps else 0.0

    def on_step_end(self, args, state, control, **kw):
        if self._row is not None:
            self._row["seconds"] = time.perf_counter() - self._t0 if self._t0 is not None else float("nan")
            self.rows.append(self._row)
        self._row = None

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["step", "loss", "clipfrac", "n_tokens", "ratio_dev",
                                                "entropy_sum", "grad_norm", "seconds"])
