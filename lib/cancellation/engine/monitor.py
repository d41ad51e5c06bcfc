"""The cancellation monitor: Δlog p of every optimizer step on its own mini-batch.

Owns `CancellationMonitor` (a `transformers.TrainerCallback` for TRL's GRPOTrainer), the plain
functions behind it (`measure_step` for any trainer, `step_table`, `summarize`), `read_parquet`
(the monitor's parquet output as one table) and `hook_loss` (how a callback sees the loss
forward's log-probs; the step recorder uses it too). Imports only torch, numpy, pandas,
transformers and the measurement modules: no TRL, no plotting, no notebook machinery, so a
training script can import it cheaply.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import TrainerCallback

from .. import measure, rollout
from ..controls import CONF_BINS, conf_bin  # noqa: F401 - CONF_BINS: re-exported by engine


# --------------------------------------------------------------------------- plain functions
def _own_forward(model, inputs) -> torch.Tensor:
    """log π of the completion tokens (B, C) by a plain forward, positions from the attention mask."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    dev = next(model.parameters()).device
    ids, am = ids.to(dev), am.to(dev)
    C = inputs["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0),
                       use_cache=False).logits[:, -C - 1:-1]
        return torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits,
                                 -1).gather(-1, ids[:, -C:, None]).squeeze(-1)


def step_table(inputs: dict, logp_before: torch.Tensor, logp_after: torch.Tensor, eps: float = 1e-6,
               conf_threshold: float = 0.9, **extra) -> pd.DataFrame:
    """Tidy per-token table of one step's own mini-batch (TRL layout: (B, C) completion log-probs):
    rollout, position, token_id, advantage, sign, logp_before, logp_after, delta, prob, conf_bin, status."""
    m = inputs["completion_mask"].detach().bool().cpu()
    rows, cols = m.nonzero(as_tuple=True)
    adv = inputs["advantages"].detach().double().cpu()
    adv = (adv[:, 0] if adv.dim() == 2 else adv)[rows].numpy()
    lb = logp_before.detach().double().cpu()[rows, cols].numpy()
    la = logp_after.detach().double().cpu()[rows, cols].numpy()
    df = pd.DataFrame({"rollout": rows.numpy(), "position": cols.numpy(),
                       "token_id": inputs["completion_ids"].detach().cpu()[rows, cols].numpy(),
                       "advantage": adv, "sign": np.where(adv > 0, "pos", np.where(adv < 0, "neg", "zero")),
                       "logp_before": lb, "logp_after": la, "delta": la - lb, "prob": np.exp(lb)})
    df["conf_bin"] = conf_bin(df.prob.values, conf_threshold)
    df["status"] = measure.classify(df.delta, eps)
    for k, v in extra.items():
        df[k] = v
    return df


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Shares of boosted/suppressed/stable tokens by sign (pos/neg; A = 0 excluded) and by sign ×
    confidence bin (tidy: sign, conf_bin ('all' or a bin), status, fraction, n_tokens)."""
    d = df[df.sign != "zero"]
    out = []
    for keys, sub in [(("all",), d.assign(conf_bin="all")), (None, d)]:
        g = sub.groupby(["sign", "conf_bin"])
        for (s, c), x in g:
            vc = x.status.value_counts(normalize=True)
            for st in measure.STATUSES:
                out.append(dict(sign=s, conf_bin=c, status=st, fraction=float(vc.get(st, 0.0)), n_tokens=len(x)))
    return pd.DataFrame(out, columns=["sign", "conf_bin", "status", "fraction", "n_tokens"])


def measure_step(model, inputs, logp_before, eps: float = 1e-6, conf_threshold: float = 0.9, forward=None,
                 knobs=None, **extra) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Δlog p of a just-taken optimizer step on its own mini-batch, for any trainer.

    `inputs`: the mini-batch in TRL's layout (prompt_ids, prompt_mask, completion_ids,
    completion_mask, advantages) or a RolloutBatch; `logp_before`: its completion log-probs
    before the step ((B, C), or (B, L) for a RolloutBatch, e.g. measure.token_stats(...).logp);
    `forward(model, inputs) -> (B, C)` the after-forward (default: a plain forward with positions
    from the attention mask; the monitor passes the trainer's own loss forward). `knobs`: the run's
    Compute, which a RolloutBatch's after-forward (`measure.token_stats`) needs.
    Returns (per-token table, `summarize` shares).
    """
    if isinstance(inputs, rollout.RolloutBatch):
        if knobs is None:
            raise TypeError("measure_step on a RolloutBatch needs knobs= (the run's Compute) for its forward")
        after = measure.token_stats(model, inputs, knobs).logp
        t = measure.token_table(inputs, measure.TokenStats(logp_before, torch.zeros_like(logp_before)),
                                measure.TokenStats(after, torch.zeros_like(after)), eps=eps, **extra)
        t["conf_bin"] = conf_bin(t.prob.values, conf_threshold)
        return t, summarize(t)
    after = (forward or _own_forward)(model, inputs)
    t = step_table(inputs, logp_before, after, eps, conf_threshold, **extra)
    return t, summarize(t)


MANIFEST = ".monitor-parts.json"  # the part files a monitor wrote in its parquet= directory (hidden: readers skip it)


def _manifest(out: Path) -> list[str]:
    import json
    try:
        return list(json.loads((out / MANIFEST).read_text())["parts"])
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{out / MANIFEST}: unreadable ({type(e).__name__}); the monitor cannot tell its own "
                         f"parts from others: remove the directory's part files and {MANIFEST}, or choose "
                         f"another parquet= directory") from None


def _atomic(path: Path, write):
    import os
    import tempfile
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_manifest(out: Path, parts: list[str]):
    import json
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / MANIFEST, lambda t: Path(t).write_text(json.dumps({"parts": sorted(parts)})))


def _first_step(name: str) -> int:
    return int(name[len("part-"):-len(".parquet")])


def read_parquet(path) -> pd.DataFrame:
    """The monitor's parquet output (a directory of part files, one per `flush_every` steps) as
    one table, in step order: the same table as `CancellationMonitor.table()` of that run."""
    parts = sorted(Path(path).glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True) if parts else pd.DataFrame()


# --------------------------------------------------------------------------- hooks
def hook_loss(trainer, active, after):
    """Wrap TRL's loss so that `after(model, inputs, loss, logp, entropy)` sees the per-token
    log-probs (and entropies) of the loss's own forward, detached; `active(model)` says whether
    this call is a training step to observe. Hooks stack: each wraps the functions it finds."""
    inner_loss, inner_logp = trainer._compute_loss, trainer._get_per_token_logps_and_entropies
    box = {"on": False, "out": None}

    def logp_fn(model, *a, **kw):
        out = inner_logp(model, *a, **kw)
        if box["on"]:
            box["out"] = out
        return out

    def compute_loss(model, inputs):
        if not active(model):
            return inner_loss(model, inputs)
        box["on"], box["out"] = True, None
        try:
            loss = inner_loss(model, inputs)
        finally:
            box["on"] = False
        out = box["out"]
        logp = None if out is None else out[0].detach()
        ent = None if out is None or out[1] is None else out[1].detach()
        after(model, inputs, loss, logp, ent)
        return loss

    trainer._get_per_token_logps_and_entropies = logp_fn
    trainer._compute_loss = compute_loss


def _calling_trainer():
    """The Trainer whose event is being handled: the nearest `self` up the stack that is one.

    Callback events receive the model, optimizer and dataloaders but not the trainer, and the
    monitor needs the trainer's loss (to hook it) and its log-prob function."""
    from transformers import Trainer

    f = sys._getframe(1)
    while f is not None:
        obj = f.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        f = f.f_back
    return None


@contextlib.contextmanager
def _eval_mode(model):
    """Dropout off for a measuring forward; the model's mode is restored after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _has_dropout(model) -> bool:
    """Whether the model's training-mode forward is random (a dropout with p > 0)."""
    model = getattr(model, "module", model)   # DDP / accelerate wrappers
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    cfg = getattr(model, "config", None)
    return any(isinstance(getattr(cfg, k, None), float) and getattr(cfg, k) > 0
               for k in ("attention_dropout", "hidden_dropout", "dropout"))


# --------------------------------------------------------------------------- the monitor
class CancellationMonitor(TrainerCallback):
    """Per optimizer step: Δlog p of the step's own mini-batch, boosted/suppressed shares.

    Use it as any callback, `GRPOTrainer(..., callbacks=[CancellationMonitor()])`, or attach it
    to a built trainer, `CancellationMonitor().attach(trainer)`. As a callback it attaches itself
    at `on_train_begin`: it wraps the trainer's loss so the mini-batch and its log-probs before
    the step (those the loss forward computed, detached) are kept; after the optimizer step one
    no-grad forward through the trainer's own log-prob function (same code, same dtype) gives
    the log-probs after. Measuring forwards run in eval mode (dropout off; the mode is restored
    after); when the model has dropout the "before" is measured the same way (one more forward),
    since the loss forward's log-probs then carry dropout noise.

    Logged keys (the trainer's log history, `trainer.state.log_history`):
    `cancellation/<sign>/<status>` and `cancellation/<sign>/<conf_bin>/<status>` (shares),
    `cancellation/noise_floor` (max |Δ| between the loss forward and a measuring forward with no
    update, on the first step and every `noise_every` steps), `cancellation/seconds` (the
    monitor's time in that step). With a GRPOTrainer the values go into its metric store, which
    `trainer.log` averages over the logging window and flushes to every logger; TensorBoard and
    W&B show them under `train/` (`train/cancellation/pos/boosted`, ...), as every training
    metric. Otherwise `trainer.log` is called.

    `parquet`: a directory; the tidy per-step shares go there as part files
    (`part-<first step>.parquet`, one per `flush_every` steps, at checkpoints and at the end of
    training; main process only); `read_parquet(path)` or `pd.read_parquet(path)` reads them
    back as one table. The monitor lists the parts it wrote in the directory's hidden `MANIFEST`
    and only ever removes or rewrites those: a new run replaces its earlier run's parts, a run
    resumed from a checkpoint at step S (`resume_from_checkpoint`) keeps the parts of steps <= S,
    and a `part-*.parquet` it did not write stops the run with an error naming it (never deleted).
    `keep_tokens`: keep the per-token tables in `self.tokens` (tests, small
    runs). `forward`: 'trainer' (default; the trainer's own log-prob function — TRL's fused LM
    head returns float32 log-probs even for a float64 model — before = the loss forward's, one
    extra forward per step) or 'model' (a plain forward in the model's dtype with positions
    from the attention mask, before and after: two extra forwards, exact in float64).
    """

    def __init__(self, eps: float = 1e-6, conf_threshold: float = 0.9, parquet: str | None = None,
                 noise_every: int = 0, keep_tokens: bool = False, enabled: bool = True,
                 forward: str = "trainer", flush_every: int = 50):
        if forward not in ("trainer", "model"):
            raise ValueError(f"CancellationMonitor.forward={forward!r}; allowed: trainer, model")
        self.own = forward == "model"
        self.eps, self.conf, self.parquet = eps, conf_threshold, parquet
        self.noise_every, self.keep_tokens, self.enabled = noise_every, keep_tokens, enabled
        self.flush_every = max(1, flush_every)
        self.trainer = None
        self._pending: list[tuple[dict, torch.Tensor]] = []
        self._noise = None
        self._dropout = None                  # whether the model has dropout (looked up once)
        self.rows: list[pd.DataFrame] = []    # per-step shares (self.table())
        self.tokens: list[pd.DataFrame] = []
        self._unwritten: list[tuple[int, pd.DataFrame]] = []   # (step, shares) not yet in a parquet part
        self.seconds = 0.0                    # the monitor's time over the run
        self._step_seconds = 0.0              # ... in the current step (logged)

    # ---- wiring
    def attach(self, trainer):
        """Hook `trainer`'s loss and register as its callback (once; a second call is a no-op)."""
        if self.trainer is trainer:
            return self
        if self.trainer is not None:
            raise ValueError("this CancellationMonitor is attached to another trainer already")
        if not hasattr(trainer, "_get_per_token_logps_and_entropies"):
            raise TypeError(f"CancellationMonitor hooks TRL's GRPOTrainer loss; {type(trainer).__name__} has none "
                            "(for another trainer call measure_step after each optimizer step)")
        self.trainer = trainer
        hook_loss(trainer, lambda model: self.enabled and model.training, self._after_loss)
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def on_train_begin(self, args, state, control, **kw):
        if self.trainer is None:   # passed as callbacks=[...]: find the trainer now
            trainer = _calling_trainer()
            if trainer is None:
                raise RuntimeError("CancellationMonitor cannot reach the trainer from its callback events; "
                                   "call CancellationMonitor(...).attach(trainer) before trainer.train()")
            self.attach(trainer)
        if self.parquet and state.is_world_process_zero:
            self._open_parquet(Path(self.parquet), int(state.global_step or 0))

    def _open_parquet(self, out: Path, resumed_at: int):
        """Make `out` ready for this run's parts, touching only parts the monitor wrote (its manifest,
        `MANIFEST`): a new run (step 0) removes its earlier run's parts; a run resumed from a
        checkpoint at step S keeps the parts up to S (and drops rows after S, written after that
        checkpoint by the run that stopped). A `part-*.parquet` the monitor did not write is an
        error naming it (it would mix into read_parquet), never removed."""
        if out.is_file():
            raise FileExistsError(f"{out} is a file; the monitor writes a directory of parquet parts there "
                                  "(remove it or choose another path)")
        own = _manifest(out)
        foreign = sorted(p.name for p in out.glob("part-*.parquet") if p.name not in own)
        if foreign:
            raise FileExistsError(f"{out}: {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''} "
                                  f"not written by the monitor (no entry in {MANIFEST}); it would mix into this "
                                  f"run's table: move it away or choose another parquet= directory")
        keep = []
        for name in own:
            p = out / name
            if not p.exists():
                continue
            if resumed_at <= 0 or _first_step(name) > resumed_at:
                p.unlink()  # a new run replaces its own earlier run; a resumed one redoes steps after S
                continue
            part = pd.read_parquet(p)
            if len(part) and part.step.max() > resumed_at:  # flushed after the checkpoint it resumes from
                part = part[part.step <= resumed_at].reset_index(drop=True)
                _atomic(p, lambda t, part=part: part.to_parquet(t, index=False))
            keep.append(name)
        if own or keep:
            _write_manifest(out, keep)

    # ---- measuring
    def _forward(self, model, inputs):
        with _eval_mode(model), torch.no_grad():
            if self.own:
                return _own_forward(model, inputs)
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            return self.trainer._get_per_token_logps_and_entropies(model, ids, am, inputs["completion_ids"].size(1))[0]

    def _after_loss(self, model, inputs, loss, logp, ent):
        t = time.perf_counter()
        if self._dropout is None:
            self._dropout = _has_dropout(model)
        # the loss forward's log-probs are the model's own only without dropout
        before = self._forward(model, inputs) if self.own or self._dropout or logp is None else logp
        step = self.trainer.state.global_step
        if self.noise_every and step % self.noise_every == 0 or (not self.noise_every and self._noise is None):
            again = self._forward(model, inputs)
            m = inputs["completion_mask"].bool()
            self._noise = float((again - before)[m].abs().max()) if m.any() else 0.0
        self._pending.append((inputs, before))
        self._step_seconds += time.perf_counter() - t

    def on_step_end(self, args, state, control, model=None, **kw):
        if not self._pending:
            return
        t0 = time.perf_counter()
        model = model if model is not None else self.trainer.model
        step = state.global_step   # already advanced: the step just taken
        tables = [step_table(inputs, before, self._forward(model, inputs), self.eps, self.conf, step=step, micro=k)
                  for k, (inputs, before) in enumerate(self._pending)]
        self._pending = []
        tok = pd.concat(tables, ignore_index=True)
        summ = summarize(tok).assign(step=step, noise_floor=self._noise)
        self.rows.append(summ)
        if self.keep_tokens:
            self.tokens.append(tok)
        logs = {}
        for r in summ.itertuples():
            key = f"cancellation/{r.sign}/{r.status}" if r.conf_bin == "all" else \
                f"cancellation/{r.sign}/{r.conf_bin}/{r.status}"
            logs[key] = r.fraction
        logs["cancellation/noise_floor"] = self._noise if self._noise is not None else float("nan")
        if self.parquet and state.is_world_process_zero:
            self._unwritten.append((step, summ))
            if len(self._unwritten) >= self.flush_every:
                self._flush()
        dt = self._step_seconds + time.perf_counter() - t0
        self.seconds += dt
        self._step_seconds = 0.0
        # this step's time: TRL averages the metric store over the logging window (a running
        # total would be averaged into nonsense)
        logs["cancellation/seconds"] = dt
        store = getattr(self.trainer, "_metrics", None)
        if store is not None and "train" in store:
            for k, v in logs.items():
                store["train"][k].append(v)
        else:
            self.trainer.log(logs)

    # ---- output
    def _flush(self):
        """Append the shares not yet written as one parquet part (no rewrite of earlier steps)."""
        if not self._unwritten:
            return
        first = self._unwritten[0][0]   # (a step whose tokens all have A = 0 has no rows)
        part = pd.concat([s for _, s in self._unwritten], ignore_index=True)
        self._unwritten = []
        out = Path(self.parquet)
        out.mkdir(parents=True, exist_ok=True)
        name = f"part-{first:09d}.parquet"
        if (out / name).exists() and name not in _manifest(out):
            raise FileExistsError(f"{out / name}: not written by the monitor; not overwritten (move it away)")
        _write_manifest(out, sorted(set(_manifest(out)) | {name}))  # listed before written: always its own
        _atomic(out / name, lambda t: part.to_parquet(t, index=False))

    def on_save(self, args, state, control, **kw):
        self._flush()   # a checkpoint's run can be read up to it

    def on_train_end(self, args, state, control, **kw):
        self._flush()

    def table(self) -> pd.DataFrame:
        return pd.concat(self.rows, ignore_index=True) if self.rows else pd.DataFrame()

    def token_table(self) -> pd.DataFrame:
        return pd.concat(self.tokens, ignore_index=True) if self.tokens else pd.DataFrame()
