"""seeds.derive gives every derived seed exactly as the committed tables were made: the old arithmetic,
written out here independently of seeds.py (a changed value would move a table)."""
import pytest

from cancellation import rollout, seeds, tasks

OLD = {  # purpose -> the expression each call site held before seeds.py
    "noise_probe": lambda s, i: s + 99,                   # fig01
    "coupling_batch": lambda s, i: s + 202,               # fig02
    "controls_batch": lambda s, i: s + 202,               # fig08
    "masked_batch": lambda s, i: s + 303,                 # fig03
    "category_batch": lambda s, i: s + 1000 + i,          # fig04
    "value_batch": lambda s, i: s + 505,                  # fig05
    "heldout_batch": lambda s, i: s + 606,                # fig05
    "heldout_pool": lambda s, i: s + 7,                   # fig05
    "heldout_gaps": lambda s, i: s + 9,                   # fig05
    "pool11": lambda s, i: s + 11,                        # fig05
    "value_null": lambda s, i: s * 1000 + 59,             # fig05 (the value gap's sign-shuffle null)
    "budget_batch": lambda s, i: s + 606,                 # fig06
    "composition_batch": lambda s, i: s + 607,            # fig06
    "budget_plan": lambda s, i: s * 1000 + i,             # fig06
    "plan": lambda s, i: s * 104729 + i,                  # train, engine.trainer, fig07
    "trl_shuffle": lambda s, i: s + 7654321,              # engine.trainer
    "round_problems": lambda s, i: 1000003 * (s + 1) + i,  # rollout.round_seeds
    "round_sampling": lambda s, i: s * 7919 + i,          # rollout.round_seeds
    "eval_set": lambda s, i: 10000019 * (1 + i) + s,      # tasks.eval_set
    "grpo_step": lambda s, i: s + i,                      # train._run_loop
    "topk_candidates": lambda s, i: s + 1,                # fig03.topk_table
    "balanced_gap": lambda s, i: s + 1,                   # value.sign_gaps
    "tiny_eval": lambda s, i: s + i,                      # tiny.pretrain
    "thesis_random_mask": lambda s, i: s * 1000 + 17 + i,  # fig04.thesis_updates (s: the batch seed)
    "thesis_fo_tokens": lambda s, i: s * 1000 + 43,       # fig04._first_order
    "thesis_null": lambda s, i: s * 1000 + 53,            # the sign-shuffle null (bench thesis_null)
}


def test_every_purpose_is_pinned_here():
    assert sorted(seeds.PURPOSES) == sorted(OLD)
    assert all(doc for _, doc in seeds.PURPOSES.values())


@pytest.mark.parametrize("purpose", sorted(OLD))
def test_each_purpose_equals_the_old_arithmetic(purpose):
    for s in (0, 1, 2, 7, 12345, 2**31 - 1):
        for i in (0, 1, 3, 63):
            assert seeds.derive(s, purpose, i) == OLD[purpose](s, i), (purpose, s, i)


def test_callers_read_the_helper():
    assert rollout.round_seeds(3, 5) == (1000003 * 4 + 5, 3 * 7919 + 5)
    assert [p.prompt for p in tasks.eval_set("easy", 3)] == [
        p.prompt for p in tasks.sample_problems(3, seed=10000019 * (1 + sorted(tasks.DIFFICULTIES).index("easy")) + 12345,
                                                kinds=tasks.DIFFICULTIES["easy"])]


def test_an_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match="unknown seed purpose 'bacth'"):
        seeds.derive(0, "bacth")
