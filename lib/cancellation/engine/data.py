"""What a TRL run is fed, and the layout of what it hands back.

Owns: `STRATEGIES` (Table 2's rows TRL runs: a view of `cancellation.strategies`), `problem_dataset` and
`reward_function` (a `sources.ProblemSource` as a TRL dataset and reward), `grpo_config` (the
GRPOConfig of docs/methods.md "The update", its micro-batch sized by `micro_batch` from the
Compute config's token_chunk), and `to_rollout` / `from_rollout` (TRL's mini-batch dicts
<-> `rollout.RolloutBatch`, which the measurements and the RB buffer read).
"""
from __future__ import annotations

import torch

from .. import rollout, sources, strategies, tasks

# name -> (mini-batch plan, reward-balanced buffer) of the strategies wired into TRL: a view of the registry
STRATEGIES = strategies.plans("trl")


def _import_trl():
    try:
        import trl
    except ImportError as e:  # pragma: no cover - trl is a core dependency
        raise ImportError("cancellation.engine needs TRL: pip install 'trl>=1.16,<2'") from e
    return trl


# --------------------------------------------------------------------------- data and reward
def problem_dataset(source: sources.ProblemSource, tokenizer, n: int, seed: int = 0):
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


def reward_function(source: sources.ProblemSource):
    """A TRL reward function (prompts, completions, answer, kind) -> [float] from `source.verifier()`.
    Its `with_answer` attribute counts the completions it graded that hold an answer candidate
    (`ProblemSource.with_answer`: the reward's coverage; None for the generated task's exact check) and
    `graded` the completions it graded, which `BatchingGRPOTrainer` records per iteration as the small
    trainer does."""
    verifier = source.verifier()

    def correctness(prompts, completions, answer, kind, **_):
        out, texts = [], []
        for p, c, a, k in zip(prompts, completions, answer, kind):
            text = c if isinstance(c, str) else c[-1]["content"]
            q = p if isinstance(p, str) else p[-1]["content"]
            out.append(float(verifier(tasks.Problem(q, a, k), text)))
            texts.append(text)
        if correctness.with_answer is not None:
            correctness.with_answer += source.with_answer(texts)
            correctness.graded += len(texts)
        return out

    correctness.with_answer = None if source.with_answer([]) is None else 0
    correctness.graded = 0   # the completions graded in this process (each process grades its own shard)
    return correctness


# --------------------------------------------------------------------------- config
def micro_rows(max_new_tokens: int, token_chunk: int) -> int:
    """Rows of one TRL loss forward within the Compute bound: rows × max completion length ≤
    token_chunk (TRL's fused LM head scores every completion position of its micro-batch at once);
    at least 1 (a single longer completion cannot be split)."""
    return max(1, token_chunk // max_new_tokens)


def micro_batch(n_prompts: int, G: int, n_minibatches: int, max_new_tokens: int, token_chunk: int | None) -> int:
    """TRL's per-device micro-batch (rows) for mini-batches of n_prompts·G / n_minibatches rows.

    The mini-batch itself while it is within the bound (mini × max_new_tokens ≤ token_chunk: no
    accumulation, the TRL run as without a bound); past it, 1: the trainer then accumulates
    `mini` micro-steps per optimizer step and packs each mini-batch into micro-batches of at most
    `micro_rows` rows, padding with empty steps, so that any mini-batch of up to mini × micro_rows
    rows (QB's and sign partitioning's uneven ones included) stays within the bound.
    """
    mini = n_prompts * G // n_minibatches
    if token_chunk is None or mini * max_new_tokens <= token_chunk:
        return mini
    return 1


def grpo_config(output_dir, *, n_prompts: int = 8, G: int = 8, n_minibatches: int = 4, iterations: int = 16,
                lr: float = 3e-4, max_new_tokens: int = 96, temperature: float = 1.0, seed: int = 0,
                dtype: str = "float32", use_vllm: bool = False, gradient_checkpointing: bool = False,
                token_chunk: int | None = None, **overrides):
    """The GRPOConfig of docs/methods.md "The update" for a run of `iterations` rollout batches of
    n_prompts × G rollouts, each split into `n_minibatches` optimizer steps (one GPU or CPU).

    `token_chunk` (the Compute config's) sizes the per-device micro-batch (`micro_batch`): where
    a mini-batch's rows × max_new_tokens exceed it, gradient accumulation makes up the mini-batch
    (the optimizer steps see the same batches; `BatchingGRPOTrainer` splits them). `dtype`
    'bfloat16' turns on bf16 mixed precision; other TRL/Trainer fields via `overrides`.
    """
    trl = _import_trl()
    B = n_prompts * G
    if B % n_minibatches:
        raise ValueError(f"n_prompts*G={B} must be divisible by n_minibatches={n_minibatches} (TRL's batch sizes)")
    micro = micro_batch(n_prompts, G, n_minibatches, max_new_tokens, token_chunk)
    ga = B // n_minibatches // micro
    kw = dict(
        output_dir=str(output_dir), seed=seed, data_seed=seed,
        per_device_train_batch_size=micro, steps_per_generation=n_minibatches * ga,
        gradient_accumulation_steps=ga, num_generations=G, num_iterations=1,
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
        kw.update(vllm_mode="colocate", vllm_gpu_memory_utilization=rollout.GPU_MEMORY_UTILIZATION)
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
