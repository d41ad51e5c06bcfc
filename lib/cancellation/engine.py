"""The batching interventions and the cancellation monitor on a real RL engine: TRL's GRPOTrainer.

Three pieces (issue 12), each usable on its own:

- `BatchingGRPOTrainer(GRPOTrainer)`: the mini-batch strategies of Table 2 (`train.STRATEGIES`:
  random, QB, RB, QB+RB, sign_partitioned) inside TRL. TRL splits each generation batch in one
  place (`_prepare_inputs`: `shuffle_sequence_dict` then `split_tensor_dict`); this subclass
  replaces that split by `batching.make_plan` (random keeps TRL's own shuffle+split), puts RB's
  `batching.RewardBalancedBuffer` in front of it, and records every mini-batch's rows (group
  ids, advantages, signs) in `trainer.minibatch_table()`, so the defining property of each
  strategy can be checked from the run itself.
- `grpo_config(...)`: the GRPOConfig of METHODS "The update" (verl's token-mean clipped loss,
  ε 0.2 / 0.28, dual clip 3, no KL, no entropy bonus, Adam at a constant lr, no grad clipping).
  What TRL cannot do by configuration, the subclass does (see "Matching METHODS" below).
- `CancellationMonitor`: a `transformers.TrainerCallback` measuring, after every optimizer step,
  Δlog p of that step's own mini-batch (one extra no-grad forward; the "before" log-probs are
  the ones the loss forward already computed), logging boosted/suppressed shares by advantage
  sign and confidence bin through the trainer's loggers and to a tidy parquet. Two lines in any
  GRPO run:

      monitor = CancellationMonitor(parquet="cancellation.parquet").attach(trainer)
      trainer.train()

  `measure_step` is the same measurement as a plain function for any trainer.

Matching METHODS (checked by tests/test_engine.py):
- loss: `loss_type="dapo"` is verl's token-mean, `epsilon=0.2`, `epsilon_high=0.28`; TRL's
  two-sided clip `delta=3` equals verl's dual clip c = 3 exactly (value and gradient) because
  1 + ε_high < c: for A < 0 both give −A·min(c, max(ρ, clip(ρ))), for A > 0 the cap never binds
  below clip(ρ). `beta=0` (no KL, no reference model), entropy bonus off.
- token-mean denominator: TRL's "dapo" divides by the generation batch's tokens / steps_per_
  generation (the *average* mini-batch's token count); verl and METHODS divide by the tokens of
  *this* mini-batch. The subclass sets each mini-batch's `num_items_in_batch` so that TRL's
  normaliser is exactly the mini-batch's token count (the two differ by the factor
  n_tok(mini-batch) · n_minibatches / n_tok(batch), ≠ 1 for unequal mini-batches: QB, sign
  partitioning, different response lengths).
- advantages: TRL's `scale_rewards="group"` is (r − mean)/(std + 1e-4) with the unbiased std;
  verl's eps is 1e-6. The subclass recomputes advantages from TRL's rewards with
  `rollout.group_advantages` (verl exactly); the plain-TRL difference is a factor
  (std + 1e-6)/(std + 1e-4), i.e. 1 − 99e-6/(std + 1e-4): for binary rewards std ≥ sqrt(1/G)
  (one success in G), so at most 99e-6·sqrt(G) relative (2.8e-4 at G = 8, 4.0e-4 at G = 16).
- log-probs: TRL's loss forward (fused LM head) returns float32 log-probs even for a float64
  model (max |Δ| 9e-7 against a float64 forward on the tiny policy); for bf16/float32 training
  this is at or below the model's own precision. The loss formula itself matches to 1e-12.
- θ_old: with steps_per_generation > 1 TRL computes old log-probs by one forward at generation
  (RB: recomputed here on the released batch with the current policy), so ρ = 1 on an
  iteration's first mini-batch, as in METHODS.
- optimizer: TRL's default AdamW with weight_decay 0 is Adam; lr constant; `max_grad_norm=0`
  (the artifact's trainer does not clip; verl's default clips at 1.0 — set it if you want verl).
- not matched / not used: TRL's vLLM truncated-importance-sampling correction is switched off
  (`vllm_importance_sampling_correction=False`: METHODS has no such term); TRL's position ids
  come from HF's default (arange over the padded row) where ours come from the attention mask:
  with RoPE the two give the same attention scores up to round-off (relative positions only).

Strategies with fewer mini-batches than `steps_per_generation` in some iteration (QB with fewer
groups than mini-batches, sign partitioning with one sign only, RB when the buffer releases
nothing) take fewer optimizer steps, as the artifact's trainer does: the missing steps are
"skip" steps whose parameters keep `grad=None`, which torch's Adam/AdamW leaves untouched.
Single process only for the skip steps and the exact per-mini-batch denominators across ranks
(multi-GPU: see configs/accelerate_zero2.yaml; the plans then act per rank).
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import batching, measure, rollout, tasks, train

log = logging.getLogger(__name__)

STRATEGIES = train.STRATEGIES          # name -> (mini-batch plan, reward-balanced buffer)
CONF_BINS = ("p<0.9", "p>=0.9")


def _import_trl():
    try:
        import trl  # noqa: F401
    except ImportError as e:  # pragma: no cover - trl is a core dependency
        raise ImportError("cancellation.engine needs TRL: pip install 'trl>=1.16,<2'") from e
    import trl
    return trl


# --------------------------------------------------------------------------- data and reward
def problem_dataset(source: tasks.ProblemSource, tokenizer, n: int, seed: int = 0):
    """A `datasets.Dataset` of `n` problems of `source` with columns prompt, answer, kind.

    Prompts are rendered as `source.render` renders them: plain text when the tokenizer has no
    chat template or the format is 'raw' (TRL tokenizes it as is), else a one-message
    conversation that TRL renders with the chat template and the generation prompt (verl's DAPO
    rendering, the same text as `source.render`).
    """
    from datasets import Dataset

    problems = source.draw(n, seed)
    chat = source.prompt_format != "raw" and bool(getattr(tokenizer, "chat_template", None))
    prompt = [[{"role": "user", "content": p.prompt}] if chat else p.prompt for p in problems]
    return Dataset.from_dict({"prompt": prompt, "answer": [p.answer for p in problems],
                              "kind": [p.kind for p in problems]})


def reward_function(source: tasks.ProblemSource):
    """A TRL reward function (prompts, completions, answer, kind) -> [float] from `source.verifier()`."""
    verifier = source.verifier()

    def correctness(prompts, completions, answer, kind, **_):
        out = []
        for p, c, a, k in zip(prompts, completions, answer, kind):
            text = c if isinstance(c, str) else c[-1]["content"]
            q = p if isinstance(p, str) else p[-1]["content"]
            out.append(float(verifier(tasks.Problem(q, a, k), text)))
        return out

    return correctness


# --------------------------------------------------------------------------- config
def grpo_config(output_dir, *, n_prompts: int = 8, G: int = 8, n_minibatches: int = 4, iterations: int = 16,
                lr: float = 3e-4, max_new_tokens: int = 96, temperature: float = 1.0, seed: int = 0,
                dtype: str = "float32", use_vllm: bool = False, gradient_checkpointing: bool = False,
                **overrides):
    """The GRPOConfig of METHODS "The update" for a run of `iterations` rollout batches of
    n_prompts × G rollouts, each split into `n_minibatches` optimizer steps (one GPU or CPU).

    `dtype` 'bfloat16' turns on bf16 mixed precision; other TRL/Trainer fields via `overrides`.
    """
    trl = _import_trl()
    B = n_prompts * G
    if B % n_minibatches:
        raise ValueError(f"n_prompts*G={B} must be divisible by n_minibatches={n_minibatches} (TRL's batch sizes)")
    kw = dict(
        output_dir=str(output_dir), seed=seed, data_seed=seed,
        per_device_train_batch_size=B // n_minibatches, steps_per_generation=n_minibatches,
        gradient_accumulation_steps=1, num_generations=G, num_iterations=1,
        max_steps=iterations * n_minibatches, max_completion_length=max_new_tokens, temperature=temperature,
        top_p=1.0, top_k=0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=3.0, beta=0.0, scale_rewards="group",
        mask_truncated_completions=False, importance_sampling_level="token",
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        bf16=dtype == "bfloat16", fp16=False, use_cpu=not torch.cuda.is_available(),
        use_vllm=use_vllm, vllm_importance_sampling_correction=False,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, log_completions=False,
        remove_unused_columns=False, dataloader_num_workers=0,
    )
    kw["gradient_checkpointing"] = gradient_checkpointing   # TRL's default is on; the tiny runs need not recompute
    if use_vllm:
        kw.update(vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    kw.update(overrides)
    return trl.GRPOConfig(**kw)


# --------------------------------------------------------------------------- layout conversions
def to_rollout(inputs: dict, group=None, reward=None) -> rollout.RolloutBatch:
    """A TRL mini-batch dict (prompt_ids/prompt_mask left-padded, completion_ids/completion_mask
    right-padded, advantages) as a RolloutBatch (measure.token_stats reads it)."""
    pm, cm = inputs["prompt_mask"].long().cpu(), inputs["completion_mask"].long().cpu()
    n = pm.shape[0]
    adv = inputs["advantages"].detach().double().cpu()
    adv = adv[:, 0] if adv.dim() == 2 else adv
    group = torch.arange(n) if group is None else torch.as_tensor(group).long().cpu()
    return rollout.RolloutBatch(
        input_ids=torch.cat([inputs["prompt_ids"].cpu(), inputs["completion_ids"].cpu()], 1),
        attention_mask=torch.cat([pm, cm], 1),
        response_mask=torch.cat([torch.zeros_like(pm, dtype=torch.bool), cm.bool()], 1),
        group=group, reward=torch.zeros(n, dtype=torch.float64) if reward is None else
        torch.as_tensor(reward).double().cpu(), advantage=adv,
        problems=[None] * (int(group.max()) + 1 if n else 0))


def from_rollout(batch: rollout.RolloutBatch, pad_id: int, device) -> dict:
    """Inverse of `to_rollout` for rows whose padding may differ (the RB buffer concatenates rounds)."""
    from trl.trainer.utils import pad

    prompts, comps = [], []
    for i in range(len(batch)):
        keep = batch.attention_mask[i].bool()
        resp = batch.response_mask[i]
        prompts.append(batch.input_ids[i][keep & ~resp])
        comps.append(batch.input_ids[i][resp])
    ones = lambda xs: [torch.ones_like(x) for x in xs]  # noqa: E731
    return {
        "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left").to(device),
        "prompt_mask": pad(ones(prompts), padding_value=0, padding_side="left").to(device),
        "completion_ids": pad(comps, padding_value=pad_id, padding_side="right").to(device),
        "completion_mask": pad(ones(comps), padding_value=0, padding_side="right").to(device),
        "advantages": batch.advantage.to(device=device, dtype=torch.float32),
    }


# --------------------------------------------------------------------------- the trainer
def _make_batching_trainer():
    GRPOTrainer = _import_trl().GRPOTrainer

    class BatchingGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose generation batches are split by a Table 2 strategy (`STRATEGIES`).

        Extra arguments: `strategy` (a key of STRATEGIES), `tau`, `max_rounds`, `max_age` (RB,
        as in train.TrainConfig), `plan_seed` (seeds the plans as train_run does). Everything
        else is GRPOTrainer's. After training: `minibatch_table()` (one row per rollout per
        mini-batch: iteration, minibatch, step, row, group, reward, advantage, sign, n_tokens),
        `iteration_table()` (rounds, updated, RB buffer counters); the RB counters are also
        logged (`rb/discarded`, `rb/delayed`, `rb/buffered`, `rb/rounds`, `rb/updated`).
        """

        def __init__(self, *args, strategy: str = "random", tau: float = 0.4, max_rounds: int = 4,
                     max_age: int = 2, plan_seed: int | None = None, **kw):
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown batching strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
            super().__init__(*args, **kw)
            if self.num_iterations != 1:
                raise ValueError("BatchingGRPOTrainer needs num_iterations=1 (one pass over each batch, METHODS)")
            self.strategy = strategy
            self.plan, self.reward_balanced = STRATEGIES[strategy]
            self.max_rounds = max_rounds
            self.plan_seed = self.args.seed if plan_seed is None else plan_seed
            B = self.args.per_device_train_batch_size * self.args.steps_per_generation
            self.buffer = batching.RewardBalancedBuffer(B, tau, self.plan == "query_preserved", max_age) \
                if self.reward_balanced else None
            self._iteration = 0
            self._round = 0
            self._extra_iter = None
            self._last_rewards = None
            self.minibatch_rows: list[dict] = []
            self.iteration_rows: list[dict] = []

        # ---- rewards -> verl advantages
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._last_rewards = out
            return out

        def _generate_round(self, generation_batch) -> rollout.RolloutBatch:
            """One sampling round: TRL's generation and rewards, verl's advantages, as a RolloutBatch."""
            d = self._generate_and_score_completions(generation_batch)
            rpf = self._last_rewards
            w = self.reward_weights.to(rpf.device)
            reward = torch.nan_to_num((rpf * w[None]).nansum(1), nan=0.0).double().cpu()
            G = self.num_generations
            n = len(d["advantages"])
            sl = slice(self.accelerator.process_index * n, (self.accelerator.process_index + 1) * n)
            group_all = torch.arange(len(reward)) // G
            adv = rollout.group_advantages(reward, group_all)[sl]
            d["advantages"] = adv.to(d["advantages"].device, d["advantages"].dtype)
            rb = to_rollout(d, group_all[sl] - group_all[sl].min(), reward[sl])
            rb.__dict__["_trl"] = d  # the TRL dict (old log-probs included) of the same rows
            return rb

        def _extra_generation_batch(self):
            """Prompts of RB's additional sampling rounds: a private, seeded pass over the dataset."""
            if self._extra_iter is None:
                n = self.args.generation_batch_size // self.num_generations
                g = torch.Generator().manual_seed(self.plan_seed + 7_654_321)

                def gen():
                    while True:
                        for idx in torch.randperm(len(self.train_dataset), generator=g).split(n):
                            if len(idx) == n:
                                yield [self.train_dataset[int(i)] for i in idx for _ in range(self.num_generations)]
                self._extra_iter = gen()
            return next(self._extra_iter)

        # ---- the split
        def _prepare_inputs(self, generation_batch):
            if not self.model.training:
                return super()._prepare_inputs(generation_batch)
            spg = self.args.steps_per_generation
            if self._step % spg == 0 or self._buffered_inputs is None:
                self._buffered_inputs = self._make_minibatches(generation_batch)
            return self._buffered_inputs[self._step % spg]

        def _make_minibatches(self, generation_batch) -> list[dict]:
            spg = self.args.steps_per_generation
            it = self._iteration
            self._iteration += 1
            t0 = time.perf_counter()
            batch, rounds, drawn = None, 0, []
            while batch is None and rounds < (self.max_rounds if self.reward_balanced else 1):
                gb = generation_batch if rounds == 0 else self._extra_generation_batch()
                b = self._generate_round(gb)
                drawn.append(b)
                r = self._round
                self._round, rounds = r + 1, rounds + 1
                if self.buffer is None:
                    batch = b
                else:
                    self.buffer.add(b, r)
                    batch = self.buffer.release(r)
            row = dict(iteration=it, rounds=rounds, updated=batch is not None,
                       sampled_acc=float(torch.cat([d.reward for d in drawn]).mean()),
                       t_sample=time.perf_counter() - t0)
            if self.buffer is not None:
                st = self.buffer.stats()
                row.update({f"buffer_{k}": st[k] for k in ("discarded", "delayed", "buffered", "sampled", "released")})
                for k in ("discarded", "delayed", "buffered"):
                    self._metrics["train"][f"rb/{k}"].append(float(st[k]))
                self._metrics["train"]["rb/rounds"].append(float(rounds))
                self._metrics["train"]["rb/updated"].append(float(batch is not None))
            self.iteration_rows.append(row)
            if batch is None:
                return [{"_skip": True}] * spg
            d = self._trl_inputs(batch)
            parts = self._plan(batch, d, it)
            s = batching.sign(batch.advantage)
            out = []
            step0 = self.state.global_step
            for k, rows in enumerate(parts):
                sub = {key: (v[rows.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v)
                       for key, v in d.items() if key != "num_items_in_batch"}
                ntok = sub["completion_mask"].sum()
                # TRL's dapo normaliser = num_items / n_proc * GA / spg: make it this mini-batch's tokens
                tot = self.accelerator.gather(ntok.reshape(1).float()).sum()
                sub["num_items_in_batch"] = tot * spg / self.args.gradient_accumulation_steps
                out.append(sub)
                ntoks = batch.response_mask[rows].sum(1)
                self.minibatch_rows += [dict(iteration=it, minibatch=k, step=step0 + k, row=int(r),
                                             group=int(batch.group[r]), reward=float(batch.reward[r]),
                                             advantage=float(batch.advantage[r]), sign=int(s[r]),
                                             n_tokens=int(t)) for r, t in zip(rows.tolist(), ntoks.tolist())]
            return out + [{"_skip": True}] * (spg - len(out))

        def _trl_inputs(self, batch: rollout.RolloutBatch) -> dict:
            d = batch.__dict__.get("_trl")
            if d is not None and self.buffer is None:
                return d
            # RB: rows of several rounds, re-padded; θ_old = the current policy (ρ = 1 on the first step)
            d = from_rollout(batch, self._tokenizer.pad_token_id, self.accelerator.device)
            if self.args.steps_per_generation > 1:
                ids = torch.cat([d["prompt_ids"], d["completion_ids"]], 1)
                am = torch.cat([d["prompt_mask"], d["completion_mask"]], 1)
                with torch.no_grad():
                    d["old_per_token_logps"] = self._get_per_token_logps_and_entropies(
                        self.model, ids, am, d["completion_ids"].size(1),
                        batch_size=self.args.per_device_train_batch_size)[0]
            return d

        def _plan(self, batch: rollout.RolloutBatch, d: dict, it: int) -> list[torch.Tensor]:
            n_mb = self.args.steps_per_generation
            if self.plan == "random":   # TRL's own shuffle + split, rows tracked through it
                from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict
                sh = shuffle_sequence_dict({"_row": torch.arange(len(batch))})
                return [p["_row"] for p in split_tensor_dict(sh, n_mb)]
            return batching.make_plan(self.plan, batch.group, batch.advantage, n_mb,
                                      seed=self.plan_seed * 104_729 + it)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if inputs.get("_skip"):   # a leaf zero: the parameters' grads stay None, Adam/AdamW skip them
                return torch.zeros((), device=self.accelerator.device, requires_grad=True)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        # ---- the record
        def minibatch_table(self) -> pd.DataFrame:
            return pd.DataFrame(self.minibatch_rows)

        def iteration_table(self) -> pd.DataFrame:
            return pd.DataFrame(self.iteration_rows)

    return BatchingGRPOTrainer


_TRAINER = None


def __getattr__(name):  # BatchingGRPOTrainer / CancellationMonitor import trl lazily
    global _TRAINER, _MONITOR
    if name == "BatchingGRPOTrainer":
        if _TRAINER is None:
            _TRAINER = _make_batching_trainer()
        return _TRAINER
    if name == "CancellationMonitor":
        if _MONITOR is None:
            _MONITOR = _make_monitor()
        return _MONITOR
    raise AttributeError(name)


# --------------------------------------------------------------------------- the monitor
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
    df["conf_bin"] = np.where(df.prob >= conf_threshold, CONF_BINS[1], CONF_BINS[0])
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
                 **extra) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Δlog p of a just-taken optimizer step on its own mini-batch, for any trainer.

    `inputs`: the mini-batch in TRL's layout (prompt_ids, prompt_mask, completion_ids,
    completion_mask, advantages) or a RolloutBatch; `logp_before`: its completion log-probs
    before the step ((B, C), or (B, L) for a RolloutBatch, e.g. measure.token_stats(...).logp);
    `forward(model, inputs) -> (B, C)` the after-forward (default: a plain forward with positions
    from the attention mask; the monitor passes the trainer's own loss forward).
    Returns (per-token table, `summarize` shares).
    """
    if isinstance(inputs, rollout.RolloutBatch):
        after = measure.token_stats(model, inputs).logp
        t = measure.token_table(inputs, measure.TokenStats(logp_before, torch.zeros_like(logp_before)),
                                measure.TokenStats(after, torch.zeros_like(after)), eps=eps, **extra)
        t["conf_bin"] = np.where(t.prob >= conf_threshold, CONF_BINS[1], CONF_BINS[0])
        return t, summarize(t)
    after = (forward or _own_forward)(model, inputs)
    t = step_table(inputs, logp_before, after, eps, conf_threshold, **extra)
    return t, summarize(t)


_MONITOR = None


def _hook_loss(trainer, active, after):
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


def _make_monitor():
    from transformers import TrainerCallback

    class CancellationMonitor(TrainerCallback):
        """Per optimizer step: Δlog p of the step's own mini-batch, boosted/suppressed shares.

        `attach(trainer)` wraps the trainer's loss so the mini-batch and its log-probs before
        the step (those the loss forward computed, detached) are kept; after the optimizer
        step one no-grad forward through the trainer's own log-prob function (same code, same
        dtype) gives the log-probs after. Logged keys `cancellation/<sign>/<status>` and
        `cancellation/<sign>/<conf_bin>/<status>` (shares), `cancellation/noise_floor` (max |Δ|
        between the loss forward and a no-grad forward with no update, measured on the first
        step and every `noise_every` steps), `cancellation/seconds` (monitor time). With a
        GRPOTrainer the values go into its metric store, which `trainer.log` flushes to every
        logger (TensorBoard, W&B...) at its logging steps; otherwise `trainer.log` is called.
        `parquet`: the tidy per-step shares are appended there (rewritten after each step).
        `keep_tokens`: keep the per-token tables in `self.tokens` (tests, small runs).
        `forward`: 'trainer' (default; the trainer's own log-prob function — TRL's fused LM head
        returns float32 log-probs even for a float64 model — before = the loss forward's, one
        extra forward per step) or 'model' (a plain forward in the model's dtype with positions
        from the attention mask, before and after: two extra forwards, exact in float64).
        """

        def __init__(self, eps: float = 1e-6, conf_threshold: float = 0.9, parquet: str | None = None,
                     noise_every: int = 0, keep_tokens: bool = False, enabled: bool = True,
                     forward: str = "trainer"):
            if forward not in ("trainer", "model"):
                raise ValueError(f"CancellationMonitor.forward={forward!r}; allowed: trainer, model")
            self.own = forward == "model"
            self.eps, self.conf, self.parquet = eps, conf_threshold, parquet
            self.noise_every, self.keep_tokens, self.enabled = noise_every, keep_tokens, enabled
            self.trainer = None
            self._pending: list[tuple[dict, torch.Tensor]] = []
            self._noise = None
            self.rows: list[pd.DataFrame] = []
            self.tokens: list[pd.DataFrame] = []
            self.seconds = 0.0

        def attach(self, trainer):
            self.trainer = trainer
            _hook_loss(trainer, lambda model: self.enabled and model.training, self._after_loss)
            trainer.add_callback(self)
            return self

        def _after_loss(self, model, inputs, loss, logp, ent):
            before = _own_forward(model, inputs) if self.own else logp
            step = self.trainer.state.global_step
            if self.noise_every and step % self.noise_every == 0 or (not self.noise_every and self._noise is None):
                t = time.perf_counter()
                again = self._forward(model, inputs)
                m = inputs["completion_mask"].bool()
                self._noise = float((again - before)[m].abs().max()) if m.any() else 0.0
                self.seconds += time.perf_counter() - t
            self._pending.append((inputs, before))

        def _forward(self, model, inputs):
            if self.own:
                return _own_forward(model, inputs)
            tr = self.trainer
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            with torch.no_grad():
                return tr._get_per_token_logps_and_entropies(model, ids, am, inputs["completion_ids"].size(1))[0]

        def on_step_end(self, args, state, control, model=None, **kw):
            if not self._pending:
                return
            t0 = time.perf_counter()
            model = model if model is not None else self.trainer.model
            was = model.training
            step = state.global_step   # already advanced: the step just taken
            tables = []
            for k, (inputs, before) in enumerate(self._pending):
                tables.append(step_table(inputs, before, self._forward(model, inputs), self.eps, self.conf,
                                         step=step, micro=k))
            model.train(was)
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
            self.seconds += time.perf_counter() - t0
            logs["cancellation/seconds"] = self.seconds
            store = getattr(self.trainer, "_metrics", None)
            if store is not None and "train" in store:
                for k, v in logs.items():
                    store["train"][k].append(v)
            else:
                self.trainer.log(logs)
            if self.parquet:
                Path(self.parquet).parent.mkdir(parents=True, exist_ok=True)
                self.table().to_parquet(self.parquet, index=False)

        def table(self) -> pd.DataFrame:
            return pd.concat(self.rows, ignore_index=True) if self.rows else pd.DataFrame()

        def token_table(self) -> pd.DataFrame:
            return pd.concat(self.tokens, ignore_index=True) if self.tokens else pd.DataFrame()

    return CancellationMonitor



# --------------------------------------------------------------------------- per-step record
def _make_step_recorder():
    from transformers import TrainerCallback

    from . import grpo

    class StepRecorder(TrainerCallback):
        """Per optimizer step of a GRPOTrainer, what `train.minibatch_update` records for a
        mini-batch step, read off the trainer's own loss forward (no extra forward): loss,
        clipfrac (verl's pg_clipfrac, `grpo.clip_binds`), n_tokens, ratio_dev (mean |ρ − 1|
        against the iteration's θ_old), entropy (token sum, at this step's parameters), the
        gradient norm before the optimizer step, and the step's wall time (`seconds`, from
        step begin to step end, before later callbacks such as the monitor and evaluation).
        Steps that take no update (skip steps of a short plan, RB without a release) have no row.
        """

        def __init__(self, clip_low: float = 0.2, clip_high: float = 0.28):
            self.clip_low, self.clip_high = clip_low, clip_high
            self.rows: list[dict] = []
            self._row = None
            self._t0 = None

        def attach(self, trainer):
            self.trainer = trainer
            _hook_loss(trainer, lambda model: model.training, self._after_loss)
            trainer.add_callback(self)
            return self

        def _after_loss(self, model, inputs, loss, logp, ent):
            if logp is not None:
                self._row = self._stats(inputs, logp, ent, loss, self.trainer.state.global_step)

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

    return StepRecorder


# the columns of train.train_run's three frames, in its order (buffer_* only for RB runs)
SMALL_FRAMES = {
    "evals": ["iteration", "updates", "set", "accuracy", "seconds"],
    "iterations": ["iteration", "rounds", "sampled_acc", "updated", "t_sample", "buffer_discarded",
                   "buffer_delayed", "buffer_buffered", "buffer_sampled", "buffer_released", "batch_acc", "entropy",
                   "n_rollouts", "n_pos", "n_neg", "n_tokens", "resp_len", "loss", "t_update"],
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
        n_minibatches = int(out["trainer"].args.steps_per_generation) if "trainer" in out else \
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
    cols = [c for c in SMALL_FRAMES["iterations"] if c in its or not c.startswith("buffer_")]
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
def train_trl(model_path, source: tasks.ProblemSource, strategy: str = "random", *, output_dir="data/cache/trl",
              iterations: int = 16, n_prompts: int = 8, G: int = 8, n_minibatches: int = 4, lr: float = 3e-4,
              max_new_tokens: int = 96, temperature: float = 1.0, tau: float = 0.4, max_rounds: int = 4,
              max_age: int = 2, seed: int = 0, dtype: str = "float32", device: str | None = None,
              use_vllm: bool = False, gradient_checkpointing: bool = False, monitor: bool = True,
              eval_fn=None, eval_every: int = 0, model=None, tokenizer=None, quiet: bool = True,
              **config_overrides) -> dict:
    """One Table 2 run on TRL: `strategy` (STRATEGIES) from `model_path` on `source`'s problems.

    Returns {'log' (trainer log history), 'minibatches', 'iterations', 'monitor' (per-step
    shares, when `monitor`), 'steps' (per optimizer step: loss, clipfrac, ratio_dev, entropy,
    grad norm, seconds), 'eval_times', 'evals' (when `eval_fn(model, tokenizer) -> {set: accuracy}` and
    `eval_every` (iterations) are given), 'trainer'}. The policy trains in place when `model`
    is given. On GPU with `use_vllm` generation runs in a colocated vLLM engine; across GPUs
    launch the script with `accelerate launch --config_file configs/accelerate_zero2.yaml`.
    """
    from transformers import TrainerCallback

    from . import policy

    if model is None or tokenizer is None:
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = policy.load_policy(model_path, dtype=dtype if dtype != "bfloat16" else "float32",
                                              device=dev, exact=dtype == "float64")
    tokenizer.padding_side = "left"
    source.load()
    ds = problem_dataset(source, tokenizer, max(n_prompts * iterations * 2, 64), seed=seed)
    import warnings
    with warnings.catch_warnings():
        if quiet:  # transformers 5 renames gradient_checkpointing -> activation_checkpointing; TRL uses the old name
            warnings.filterwarnings("ignore", category=FutureWarning)
        cfg = grpo_config(output_dir, n_prompts=n_prompts, G=G, n_minibatches=n_minibatches, iterations=iterations,
                          lr=lr, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype,
                          use_vllm=use_vllm, gradient_checkpointing=gradient_checkpointing, **config_overrides)
    Trainer = __getattr__("BatchingGRPOTrainer")
    trainer = Trainer(model=model, processing_class=tokenizer, reward_funcs=[reward_function(source)],
                      args=cfg, train_dataset=ds, strategy=strategy, tau=tau, max_rounds=max_rounds,
                      max_age=max_age, plan_seed=seed)
    recorder = _make_step_recorder()().attach(trainer)   # before the monitor: its step time excludes the monitor's
    mon = __getattr__("CancellationMonitor")().attach(trainer) if monitor else None
    evals, eval_times = [], []
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
        model.eval()
        t = time.perf_counter()
        evals += [dict(iteration=0, set=k, accuracy=v) for k, v in eval_fn(model, tokenizer).items()]
        eval_times.append(dict(iteration=0, seconds=time.perf_counter() - t))
        trainer.add_callback(_Eval())
    if quiet:  # the metrics stay in trainer.state.log_history (and TensorBoard/W&B if configured)
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    with warnings.catch_warnings():
        if quiet:  # transformers 5 renames gradient_checkpointing -> activation_checkpointing; TRL calls the old names
            warnings.filterwarnings("ignore", category=FutureWarning)
        trainer.train()
    return {"log": pd.DataFrame(trainer.state.log_history), "minibatches": trainer.minibatch_table(),
            "iterations": trainer.iteration_table(), "monitor": mon.table() if mon else pd.DataFrame(),
            "evals": pd.DataFrame(evals), "steps": recorder.table(), "eval_times": pd.DataFrame(eval_times),
            "trainer": trainer, "monitor_callback": mon}


def bench_monitor(model_path="data/policies/tiny-s", steps: int = 4, n_prompts: int = 4, G: int = 4,
                  n_minibatches: int = 2, max_new_tokens: int = 24, repeats: int = 1, quiet: bool = False) -> dict:
    """Training time per optimizer step with the monitor on vs off (same run, same seed); prints
    and returns {'off_s', 'on_s', 'ratio', 'monitor_s'} (per step; `monitor_s` is the monitor's
    own time). Generation is included in the step time, as it is in a real run."""
    import tempfile

    from . import policy

    res = {}
    for on in (False, True):
        best = math.inf
        for _ in range(repeats):
            model, tok = policy.load_policy(model_path)
            with tempfile.TemporaryDirectory() as d:
                t = time.perf_counter()
                out = train_trl(model_path, tasks.ProblemSource(), "random", output_dir=d,
                                iterations=steps // n_minibatches, n_prompts=n_prompts, G=G,
                                n_minibatches=n_minibatches, max_new_tokens=max_new_tokens, monitor=on,
                                model=model, tokenizer=tok)
                best = min(best, (time.perf_counter() - t) / steps)
                if on:
                    res["monitor_s"] = out["monitor_callback"].seconds / steps
        res["on_s" if on else "off_s"] = best
    res["ratio"] = res["on_s"] / res["off_s"]
    if not quiet:
        print(f"TRL GRPO step (tiny policy, {n_prompts}x{G} rollouts, {n_minibatches} mini-batches): "
              f"monitor off {res['off_s']:.3f} s/step, on {res['on_s']:.3f} s/step, ratio {res['ratio']:.2f} "
              f"(monitor's own time {res['monitor_s']:.3f} s/step)")
    return res
