"""Every seed derived from a run's `seed`, in one place: `derive(seed, purpose, i)`.

Each purpose is one use (a batch, a plan, a draw) with the arithmetic the committed tables were made
with; `tests/test_seeds.py` writes that arithmetic out again and checks every purpose against it. Two
purposes may share an arithmetic (the Fig. 2 and Fig. 12 batches are the same batch by design); a new
use takes a new purpose name rather than reusing another's. Imports nothing of the package (bottom layer).
"""
from __future__ import annotations

PLAN_PRIME = 104_729           # seed * PLAN_PRIME + iteration: the mini-batch plan of each iteration
ROUND_PRIME = 1_000_003        # (seed + 1) * ROUND_PRIME + round: the problems of each sampling round
ROUND_SAMPLE = 7919            # seed * ROUND_SAMPLE + round: the sampling seed of each round
EVAL_PRIME = 10_000_019        # (1 + difficulty index) * EVAL_PRIME + seed: the held-out evaluation sets

# purpose -> (seed, i -> derived seed, one-line doc)
PURPOSES: dict = {
    "noise_probe": (lambda s, i: s + 99, "Fig. 1: the probe batch of the noise floor"),
    "coupling_batch": (lambda s, i: s + 202, "Fig. 2: the analysed batch"),
    "controls_batch": (lambda s, i: s + 202, "Fig. 12 (notebook 08): the referee-controls batch, Fig. 2's batch"),
    "masked_batch": (lambda s, i: s + 303, "Fig. 3: the masked-update batch"),
    "category_batch": (lambda s, i: s + 1000 + i, "Fig. 4: batch i of the category shift"),
    "thesis_random_mask": (lambda s, i: s * 1000 + 17 + i, "Fig. 4 thesis: random-mask draw i of a batch (s: the batch seed)"),
    "thesis_fo_tokens": (lambda s, i: s * 1000 + 43, "Fig. 4 thesis: the tokens whose first-order terms are computed (s: the batch seed)"),
    "thesis_null": (lambda s, i: s * 1000 + 53, "Fig. 4 thesis: the K within-group shuffles of a batch's null (s: the batch seed)"),
    "value_batch": (lambda s, i: s + 505, "Fig. 5: the value-gap batch"),
    "heldout_batch": (lambda s, i: s + 606, "Fig. 5: the held-out batch (new prompts)"),
    "heldout_pool": (lambda s, i: s + 7, "Fig. 5: the held-out tokens' balanced draw"),
    "heldout_gaps": (lambda s, i: s + 9, "Fig. 5: the held-out sign gaps' bootstrap"),
    "pool11": (lambda s, i: s + 11, "Fig. 11: the token pool drawn before any step"),
    "value_null": (lambda s, i: s * 1000 + 59, "Fig. 5: the K within-group sign shuffles of the value gap's null"),
    "budget_batch": (lambda s, i: s + 606, "Fig. 6: the sampling-budget base batch"),
    "composition_batch": (lambda s, i: s + 607, "Fig. 7(b): the composition batch"),
    "budget_plan": (lambda s, i: s * 1000 + i, "Fig. 6: the nested sub-batch plan of seed i"),
    "plan": (lambda s, i: s * PLAN_PRIME + i, "the mini-batch plan of iteration i (small trainer, TRL, Fig. 8)"),
    "trl_shuffle": (lambda s, i: s + 7_654_321, "TRL trainer: the RepeatSampler shuffle of the extra batches"),
    "round_problems": (lambda s, i: ROUND_PRIME * (s + 1) + i, "the problem draw of training round i"),
    "round_sampling": (lambda s, i: s * ROUND_SAMPLE + i, "the sampling seed of training round i"),
    "eval_set": (lambda s, i: EVAL_PRIME * (1 + i) + s, "the held-out evaluation set of difficulty index i"),
    "grpo_step": (lambda s, i: s + i, "a GRPO run's step i: its mini-batch shuffle (train.delta_run, train.sign_consistency_run)"),
    "topk_candidates": (lambda s, i: s + 1, "Fig. 3(c): the masking candidates of the top-k table"),
    "balanced_gap": (lambda s, i: s + 1, "the sign-balanced value gap's bootstrap, beside the per-sign ones at s"),
    "tiny_eval": (lambda s, i: s + i, "building the tiny policy: the sampled-accuracy check at step i"),
}


def derive(seed: int, purpose: str, i: int = 0) -> int:
    """The seed of `purpose` (a key of PURPOSES) from the run's `seed` (and index `i` where the purpose has one)."""
    try:
        fn, _ = PURPOSES[purpose]
    except KeyError:
        raise ValueError(f"unknown seed purpose {purpose!r}; known: {', '.join(PURPOSES)}") from None
    return fn(int(seed), int(i))
