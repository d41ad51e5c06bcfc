"""The building blocks the planner counts, for each figure's `workload(P, shape, sizes)`.

A figure module declares its workload beside its `compute()`: which blocks it runs at its Params
(analysis forwards, full-parameter and lm_head GRPO steps, sampled rows and tokens, coupling-kernel
pairs), what it holds beside the model, and which part of its work N processes could divide. The
planner (`cancellation.plan`) turns a Work into memory and time with the device's unit costs.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from .engine.data import micro_batch, micro_rows
from .decode_common import bucket_len, bucket_rows

BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "": 4}


@dataclass
class Work:
    """Counts of the building blocks one notebook runs. A block's entry: body `positions` (rows x
    padded length), `head` positions (response tokens through the LM head), `calls` (body forwards,
    decode steps or kernel blocks) and `steps` (optimizer steps, for Adam's per-parameter cost)."""
    blocks: dict = field(default_factory=dict)
    sampled_rows: int = 0
    sampled_tokens: int = 0
    largest: tuple = (0, 0)          # (rows, length) of the largest batch held at once
    full_grads: bool = False         # gradients of every parameter (else lm_head only)
    adam: bool = False               # Adam state of every parameter
    extra_bytes: int = 0             # copies of θ, per-token gradients: what the notebook holds beside
    extra_why: list = field(default_factory=list)
    kv_rows: int = 0                 # rows decoded at once (KV cache)
    kv_len: int = 0
    notes: list = field(default_factory=list)
    parts: list = field(default_factory=list)  # the work --procs divides: dict(what, units, blocks)

    @contextmanager
    def split(self, what: str, units: int):
        """The blocks added inside are `units` independent pieces of work (Monte Carlo continuations,
        valued tokens, seeds, batches, masks, runs) that N processes divide, ceil(units / N) each."""
        before = {k: dict(v) for k, v in self.blocks.items()}
        yield
        delta = {}
        for k, b in self.blocks.items():
            d = {f: b[f] - before.get(k, {}).get(f, 0) for f in b}
            if any(d.values()):
                delta[k] = d
        if delta and units > 0:
            self.parts.append(dict(what=what, units=int(units), blocks=delta))

    def add(self, block: str, positions=0, head=0, calls=0, steps=0, pairs=0):
        b = self.blocks.setdefault(block, dict(positions=0, head=0, calls=0, steps=0, pairs=0))
        for k, v in dict(positions=positions, head=head, calls=calls, steps=steps, pairs=pairs).items():
            b[k] += int(v)

    def batch(self, rows, L):
        if rows * L > self.largest[0] * self.largest[1]:
            self.largest = (int(rows), int(L))


class Sizes:
    """Lengths of one batch of `rows` rollouts: a response runs to max_new_tokens (an upper bound:
    rows stop at a stop id, but a batch decodes until its last row stops)."""

    def __init__(self, prompt_mean: int, prompt_max: int, new: int):
        self.prompt, self.prompt_max, self.new = prompt_mean, prompt_max, new
        self.L = prompt_mean + new


def ceil(a, b):
    return -(-int(a) // max(int(b), 1))


def sample_rows(P) -> int:
    """Rollouts per HF sampler call of a notebook that samples through base.sample_config (its KV cache rows;
    every such notebook's Params declares sample_rows)."""
    return P.sample_rows


def sample(w: Work, rows: int, z: Sizes, chunk_rows_decode: int | None = None, times: int = 1):
    """HF KV-cache sampling of `rows` rows: prefill of the prompts, then one decode step per new token."""
    w.add("sample", positions=times * rows * (z.prompt + z.new), head=times * rows * z.new,
          calls=times * ceil(rows, chunk_rows_decode or rows) * z.new)
    w.sampled_rows += times * rows
    w.sampled_tokens += times * rows * z.new
    # the static-cache sampler preallocates its cache for the whole bucket: rows padded to a power of
    # two, prompt + new tokens rounded up to a multiple of 256 (decode_common.py)
    w.kv_rows = max(w.kv_rows, bucket_rows(min(rows, chunk_rows_decode or rows)))
    w.kv_len = max(w.kv_len, bucket_len(z.prompt_max + z.new))
    w.batch(rows, z.prompt_max + z.new)


def analysis(w: Work, rows: int, z: Sizes, cr: int, times: int = 1):
    """measure.token_stats: the body on every position, chunk_rows rows a call; the head on responses."""
    w.add("analysis", positions=times * rows * z.L, head=times * rows * z.new, calls=times * ceil(rows, cr))


def step(w: Work, kind: str, rows: int, z: Sizes, cr: int, minibatches: int = 1, times: int = 1):
    """grpo.grpo_step over `rows` rows split into `minibatches` optimizer steps. kind: 'full' (body
    forward+backward; Adam's update counted per step) or 'lm_head' (body without graph, head fwd+bwd)."""
    block = "sgd_lm_head" if kind == "lm_head" else "full_step"
    w.add(block, positions=times * rows * z.L, head=times * rows * z.new,
          calls=times * max(ceil(rows, cr), minibatches), steps=times * minibatches)


def kernel(w: Work, pairs: float, shape, chunk: int, n_tokens: int):
    """Coupling-kernel blocks: per pair ⟨π_j,π_k⟩ over the vocabulary, plus the probabilities of both
    sides recomputed per block (2·d·V per token per block): V·(1 + 2d/c) per pair, c = block size."""
    c = max(min(chunk, n_tokens), 1)
    w.add("kernel", pairs=pairs * shape.vocab * (1 + 2 * shape.hidden / c), calls=ceil(pairs, c * c))


def delta_run(w: Work, P, z: Sizes, rows: int, steps: int, minibatches: int, cr: int, analyses: int = 2):
    """train.delta_run: per step sample, analysis before (θ_old) and after, one Adam GRPO step."""
    sample(w, rows, z, times=steps)
    analysis(w, rows, z, cr, times=analyses * steps)
    step(w, "full", rows, z, cr, minibatches, times=steps)
    w.full_grads = w.adam = True


def features(w: Work, P, shape, z, rows):
    """coupling.features: one analysis with hidden states kept for the whole batch, and the
    log-sum-exp of every response token over the vocabulary (an extra head pass)."""
    analysis(w, rows, z, P.chunk_rows)
    w.add("analysis", head=rows * z.new)
    w.extra_bytes += rows * z.L * shape.hidden * BYTES[P.dtype]
    w.extra_why.append("hidden states of the whole batch")


def trl_compact(P) -> bool:
    """Whether TRL's fused LM head scores only the completion positions (Triton on a CUDA/XPU device, assumed
    there) or every position of the rows (elsewhere: a CPU), as `trl.trainer.utils.add_fused_lm_head` does."""
    return str(P.device).startswith(("cuda", "xpu"))


def trl_run(w: Work, P, z: Sizes, runs: int = 1, iterations: int | None = None, rb: bool = False,
            monitor: bool = True, logging_steps: int = 1):
    """engine.train_trl, `runs` runs of `iterations` (P.iterations) generation batches of n_prompts x G rows
    on TRL's GRPOTrainer (BatchingGRPOTrainer), block by block:

    - trl_generate: transformers' `generate` of every sampling round (RB: about two per iteration), every row
      to max_new_tokens (an upper bound), a dynamic KV cache of the whole batch;
    - trl_logp: TRL's fused-LM-head forward without a graph: θ_old's log-probs of every round when an
      iteration takes more than one optimizer step (micro-batch rows a call), RB's recomputation on the
      released batch, and the cancellation monitor's after-step forward of every micro-batch;
    - trl_step: the loss forward (fused head, with a graph) and backward of every micro-batch, Adam's update
      per optimizer step;
    - trl_run, trl_optimizer_step, trl_log: the Trainer's own cost per run (policy load, construction,
      set-up), per optimizer step (its loop, callbacks, the step record and monitor tables, empty
      accumulation steps) and per logging step (logging_steps 1: every optimizer step).
    Positions through the fused head: every position of the rows on a CPU, the completions on a GPU (Triton)."""
    its = P.iterations if iterations is None else iterations
    rows, nmb = P.n_prompts * P.G, P.n_minibatches
    micro = micro_batch(P.n_prompts, P.G, nmb, P.max_new_tokens, P.token_chunk)
    ga = rows // nmb // micro
    per_mb = 1 if ga == 1 else min(ga, ceil(rows // nmb, micro_rows(P.max_new_tokens, P.token_chunk)))
    rounds = its * (2 if rb else 1)
    L = z.prompt + z.new
    hl = z.new if trl_compact(P) else L
    w.add("trl_run", calls=runs)
    w.add("trl_generate", positions=runs * rounds * rows * L, head=runs * rounds * rows * z.new,
          calls=runs * rounds * z.new)
    w.sampled_rows += runs * rounds * rows
    w.sampled_tokens += runs * rounds * rows * z.new
    w.kv_rows = max(w.kv_rows, rows)                   # transformers' dynamic cache: the batch, unpadded
    w.kv_len = max(w.kv_len, z.prompt_max + z.new)
    w.batch(rows, z.prompt_max + z.new)
    passes = (rounds + (its if rb else 0)) if nmb > 1 else 0       # θ_old per round; RB: the released batch again
    w.add("trl_logp", positions=runs * passes * rows * L, head=runs * passes * rows * hl,
          calls=runs * passes * ceil(rows, micro))
    if monitor:
        w.add("trl_logp", positions=runs * its * rows * L, head=runs * its * rows * hl, calls=runs * its * nmb * per_mb)
    w.add("trl_step", positions=runs * its * rows * L, head=runs * its * rows * hl, calls=runs * its * nmb * per_mb,
          steps=runs * its * nmb)
    w.add("trl_optimizer_step", calls=runs * its * nmb)
    w.add("trl_log", calls=runs * (its * nmb // max(int(logging_steps), 1)))
    w.full_grads = w.adam = True
