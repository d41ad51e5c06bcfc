"""`BatchingGRPOTrainer`: TRL's GRPOTrainer with the mini-batch strategies of Table 2.

Owns the trainer subclass. TRL splits each generation batch in one place (`_prepare_inputs`:
`shuffle_sequence_dict` then `split_tensor_dict`); the subclass replaces that split by
`batching.make_plan` (random keeps TRL's own shuffle+split), puts RB's
`batching.RewardBalancedBuffer` in front of it (the sampling loop is
`batching.sample_until_release`, the small trainer's own), and records every mini-batch's rows
(group ids, advantages, signs) in `trainer.minibatch_table()`, so the defining property of each
strategy can be checked from the run itself. RB's extra sampling rounds take their prompts
through the Trainer's data path (a second training dataloader with its own seed, prepared by
accelerate), so under `accelerate launch` every process samples its own shard, as in round 0.

Matching docs/methods.md (checked by tests/test_engine.py):
- loss: `loss_type="dapo"` is verl's token-mean, `epsilon=0.2`, `epsilon_high=0.28`; TRL's
  two-sided clip `delta=3` equals verl's dual clip c = 3 exactly (value and gradient) because
  1 + ε_high < c: for A < 0 both give −A·min(c, max(ρ, clip(ρ))), for A > 0 the cap never binds
  below clip(ρ). `beta=0` (no KL, no reference model), entropy bonus off.
- token-mean denominator: TRL's "dapo" divides by the generation batch's tokens / steps_per_
  generation (the *average* mini-batch's token count); verl and docs/methods.md divide by the tokens of
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
  iteration's first mini-batch, as in docs/methods.md.
- optimizer: TRL's default AdamW with weight_decay 0 is Adam; lr constant; `max_grad_norm=0`
  (the artifact's trainer does not clip; verl's default clips at 1.0 — set it if you want verl).
- not matched / not used: TRL's vLLM truncated-importance-sampling correction is switched off
  (`vllm_importance_sampling_correction=False`: docs/methods.md has no such term); TRL's position ids
  come from HF's default (arange over the padded row) where ours come from the attention mask:
  with RoPE the two give the same attention scores up to round-off (relative positions only).

Strategies with fewer mini-batches than `steps_per_generation` in some iteration (QB with fewer
groups than mini-batches, sign partitioning with one sign only, RB when the buffer releases
nothing) take fewer optimizer steps, as the artifact's trainer does: the missing steps are
"skip" steps whose parameters keep `grad=None`, which torch's Adam/AdamW leaves untouched.
Rewards: every completion must get a finite reward (`check_rewards`): a completion for which every
reward function returned None/NaN (plain TRL: "unscorable", advantage 0) or an infinite reward stops the
run with one line naming the reward functions and the counts, never a silent 0 or a NaN advantage.
Single process only for the skip steps and the exact per-mini-batch denominators across ranks
(multi-GPU: see configs/accelerate_multi.yaml; the plans then act per rank).
"""
from __future__ import annotations

import time

import pandas as pd
import torch

from .. import batching, rollout, seeds, strategies
from .data import _import_trl, from_rollout, micro_rows, to_rollout

GRPOTrainer = _import_trl().GRPOTrainer


def check_rewards(rewards_per_func: torch.Tensor, names: list[str]) -> None:
    """Refuse, in one line, completions the strategies cannot place: a row for which every reward function
    returned None/NaN ("unscorable"), or an infinite reward. A NaN of one function beside a number of another
    is TRL's "this function does not apply" and is summed away (nansum), as in plain TRL.

    Plain TRL gives an unscorable completion A = 0 and leaves it out of its group's baseline; here its
    reward would also have to be a number for the RB buffer, the plans and the records (a NaN is never a
    0, which would train it down as wrong), so the run stops naming the reward functions and the count:
    return a number for every completion (0.0 for an unreadable answer, as `reward_function` does)."""
    if not len(rewards_per_func):
        return
    nan_rows = torch.isnan(rewards_per_func).all(dim=1)
    inf = torch.isinf(rewards_per_func)
    if not (nan_rows.any() or inf.any()):
        return
    n = len(rewards_per_func)
    per_func = ", ".join(f"{name}: {int(torch.isnan(rewards_per_func[:, k]).sum())} NaN"
                         + (f", {int(inf[:, k].sum())} infinite" if inf[:, k].any() else "")
                         for k, name in enumerate(names))
    what = []
    if nan_rows.any():
        what.append(f"{int(nan_rows.sum())} of {n} completions got no reward (every reward function returned "
                    "None/NaN)")
    if inf.any():
        what.append(f"{int(inf.any(dim=1).sum())} of {n} completions got an infinite reward")
    raise ValueError(f"BatchingGRPOTrainer: {'; '.join(what)} [{per_func}]; the strategies need a finite reward "
                     "for every completion: make the reward function return a number (0.0 for an unreadable answer; "
                     "plain GRPOTrainer instead gives an unscorable completion advantage 0)")


class BatchingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose generation batches are split by a Table 2 strategy (`cancellation.strategies`).

    Extra arguments: `strategy` (a registered strategy wired into TRL: `engine.STRATEGIES`), `tau`,
    `max_rounds`, `max_age` (RB and DS, as in train.TrainConfig), `plan_seed` (seeds the plans as
    train_run does), `token_chunk` (the Compute bound: with `gradient_accumulation_steps` > 1, see
    `grpo_config`, each mini-batch is packed into micro-batches of at most token_chunk //
    max_completion_length rows, one per accumulation step, empty steps padding the rest). Everything else is
    GRPOTrainer's. After training: `minibatch_table()` (one row per rollout per
    mini-batch: iteration, minibatch, step, row, group, reward, advantage, sign, n_tokens),
    `iteration_table()` (rounds, updated, RB buffer counters); the RB counters are also
    logged (`rb/discarded`, `rb/delayed`, `rb/buffered`, `rb/rounds`, `rb/updated`).
    """

    def __init__(self, *args, strategy: str = "random", tau: float = 0.4, max_rounds: int = 4,
                 max_age: int = 2, plan_seed: int | None = None, token_chunk: int | None = None, **kw):
        spec = strategies.lookup(strategy, "trl")   # the registry's entry: plan, release rule (RB / DS / none)
        super().__init__(*args, **kw)
        if self.num_iterations != 1:
            raise ValueError("BatchingGRPOTrainer needs num_iterations=1 (one pass over each batch, docs/methods.md)")
        self.strategy = strategy
        self.plan, self.reward_balanced, self.dynamic_sampling = spec.plan, spec.reward_balanced, spec.dynamic_sampling
        self.max_rounds = max_rounds
        self.plan_seed = self.args.seed if plan_seed is None else plan_seed
        self.accumulation = self.args.gradient_accumulation_steps
        if self.args.steps_per_generation % self.accumulation:
            raise ValueError("steps_per_generation must be a multiple of gradient_accumulation_steps "
                             "(one mini-batch per optimizer step)")
        self.n_minibatches = self.args.steps_per_generation // self.accumulation
        B = self.args.per_device_train_batch_size * self.args.steps_per_generation
        self.micro_rows = micro_rows(self.args.max_completion_length, token_chunk) if token_chunk else \
            B // self.n_minibatches
        self.buffer = batching.RewardBalancedBuffer(B, tau, spec.query_preserved, max_age,
                                                    mixed_groups=spec.dynamic_sampling) if spec.buffered else None
        self._iteration = 0
        self._round = 0
        self._extra_iter = None
        self._extra_drawn = 0     # RB's extra generation batches drawn so far (a resumed run skips as many)
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
        check_rewards(rpf, self.reward_func_names)
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

    def _agree(self, ok: bool) -> bool:
        """RB across processes: every process's buffer holds its own shard, so a release needs
        all of them (else the processes would sample different numbers of rounds and hang in
        TRL's gathers). One process: its own answer, no communication."""
        if self.accelerator.num_processes == 1:
            return ok
        flags = self.accelerator.gather(torch.tensor([float(ok)], device=self.accelerator.device))
        return bool(flags.min() > 0)

    def _extra_generation_batch(self):
        """Prompts of RB's additional sampling rounds, through the Trainer's data path.

        A second training dataloader built like TRL's (`_get_dataloader`: the collator, the
        per-process batch size, accelerate's `prepare`, so each process gets its own shard)
        whose RepeatSampler has its own seed (the extra rounds must not replay the prompts the
        main dataloader will serve) and repeat_count 1 (every batch is a new generation batch).
        A used-up pass starts the next one (a new permutation from the same generator).
        """
        if self._extra_iter is None:
            from trl.trainer.utils import RepeatSampler

            G = self.num_generations
            sampler = RepeatSampler(self.train_dataset, mini_repeat_count=G,
                                    batch_size=self.args.generation_batch_size // G, repeat_count=1,
                                    shuffle=True, seed=seeds.derive(self.plan_seed, "trl_shuffle"))
            dl = self._get_dataloader(self.train_dataset, "Training",
                                      self._train_batch_size * self.args.steps_per_generation,
                                      sampler_fn=lambda ds: sampler, is_training=True)

            def passes():
                while True:
                    yield from dl
            self._extra_iter = passes()
            with torch.random.fork_rng(devices=[]):   # a resumed run: the batches the run before it drew
                for _ in range(self._extra_drawn):
                    next(self._extra_iter)
        # DataLoader draws its base seed from the global CPU RNG when an iterator starts: keep
        # that RNG (and with it the sampling of every later round) as if no batch were drawn
        with torch.random.fork_rng(devices=[]):
            batch = next(self._extra_iter)
        self._extra_drawn += 1
        return batch

    # ---- checkpoints: what a resumed run needs beside the Trainer's own checkpoint
    def checkpoint_state(self) -> dict:
        """This process's strategy state at an iteration boundary (the Trainer's checkpoint holds the weights,
        Adam, the RNGs and the log): iteration and round counters, the records, RB's buffer, the extra
        rounds' dataloader position and the reward's coverage counters."""
        rf = self.reward_funcs[0] if self.reward_funcs else None
        return dict(iteration=self._iteration, round=self._round, minibatch_rows=list(self.minibatch_rows),
                    iteration_rows=list(self.iteration_rows), buffer=self.buffer, extra_drawn=self._extra_drawn,
                    coverage=(getattr(rf, "with_answer", None), getattr(rf, "graded", None)))

    def restore_state(self, st: dict) -> None:
        """`checkpoint_state()`'s dict back into this trainer (before `train(resume_from_checkpoint=...)`)."""
        self._iteration, self._round = st["iteration"], st["round"]
        self.minibatch_rows, self.iteration_rows = list(st["minibatch_rows"]), list(st["iteration_rows"])
        self.buffer, self._extra_drawn, self._extra_iter = st["buffer"], st["extra_drawn"], None
        rf = self.reward_funcs[0] if self.reward_funcs else None
        if rf is not None and st["coverage"][0] is not None and getattr(rf, "with_answer", None) is not None:
            rf.with_answer, rf.graded = st["coverage"]

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
        cap = self.max_rounds if self.buffer is not None else 1

        def sample(r, k):
            return self._generate_round(generation_batch if k == 0 else self._extra_generation_batch())

        rf = self.reward_funcs[0] if self.reward_funcs else None
        covered = (rf.with_answer, rf.graded) if getattr(rf, "with_answer", None) is not None else None
        batch, drawn = batching.sample_until_release(sample, self.buffer, self._round, cap, self._agree)
        rounds = len(drawn)
        self._round += rounds
        row = dict(iteration=it, rounds=rounds, updated=batch is not None,
                   sampled_acc=float(torch.cat([d.reward for d in drawn]).mean()),
                   t_sample=time.perf_counter() - t0)
        if covered is not None:   # a problem file: this process's graded responses, and those holding an answer
            row["with_answer"], row["graded"] = rf.with_answer - covered[0], rf.graded - covered[1]
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
        ga = self.accumulation
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
            sub["num_items_in_batch"] = tot * spg / ga
            out += [sub] if ga == 1 else self._micro_split(sub, ga)
            ntoks = batch.response_mask[rows].sum(1)
            self.minibatch_rows += [dict(iteration=it, minibatch=k, step=step0 + k, row=int(r),
                                         group=int(batch.group[r]), reward=float(batch.reward[r]),
                                         advantage=float(batch.advantage[r]), sign=int(s[r]),
                                         n_tokens=int(t)) for r, t in zip(rows.tolist(), ntoks.tolist())]
        return out + [{"_skip": True}] * (spg - len(out))

    def _micro_split(self, sub: dict, ga: int) -> list[dict]:
        """One mini-batch as `ga` accumulation steps: micro-batches of at most `micro_rows` rows
        (near-equal), then empty steps. Each keeps the mini-batch's `num_items_in_batch`, so the
        micro losses add up to the mini-batch's token mean. A mini-batch longer than ga × micro_rows
        rows (possible only for uneven plans past that size) is split into ga near-equal parts."""
        n = len(sub["completion_mask"])
        k = min(ga, max(1, -(-n // self.micro_rows)))
        if -(-n // k) > self.micro_rows:
            import warnings
            warnings.warn(f"a mini-batch of {n} rows exceeds {ga} micro-batches of {self.micro_rows} rows "
                          f"(token_chunk): micro-batches of up to {-(-n // k)} rows")
        parts = []
        for rows in torch.tensor_split(torch.arange(n), k):
            parts.append({key: (v[rows.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() >= 1 else v)
                          for key, v in sub.items()})
        return parts + [{"_skip": True}] * (ga - k)

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
        n_mb = self.n_minibatches
        if self.plan == "random":   # TRL's own shuffle + split, rows tracked through it
            from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict
            sh = shuffle_sequence_dict({"_row": torch.arange(len(batch))})
            return [p["_row"] for p in split_tensor_dict(sh, n_mb)]
        return batching.make_plan(self.plan, batch.group, batch.advantage, n_mb,
                                  seed=seeds.derive(self.plan_seed, "plan", it))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if inputs.get("_skip"):   # a leaf zero: the parameters' grads stay None, Adam/AdamW skip them
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    # ---- the record
    def minibatch_table(self) -> pd.DataFrame:
        return pd.DataFrame(self.minibatch_rows)

    def iteration_table(self) -> pd.DataFrame:
        return pd.DataFrame(self.iteration_rows)
