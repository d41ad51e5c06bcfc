import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cancellation import policy, sources, tasks, tiny


@pytest.mark.parametrize("kind", tasks.KINDS)
def test_error_free_traces_are_correct_and_in_vocab(kind, tok):
    rng = random.Random(0)
    for p in tasks.sample_problems(200, seed=2, kinds=[kind]):
        t = tasks.make_trace(p, rng, error_rate=0.0)
        assert tasks.verify(p, t) == 1.0, (p, t)
        ids = tok(p.prompt + " " + t)["input_ids"]
        assert tok.unk_token_id not in ids


def test_slipped_traces_are_mostly_wrong_and_answers_checked_exactly():
    rng = random.Random(1)
    probs = tasks.sample_problems(400, seed=3)
    wrong = sum(tasks.verify(p, tasks.make_trace(p, rng, error_rate=1.0)) == 0 for p in probs)
    assert wrong > 0.8 * len(probs)
    p = tasks.Problem("Q: 1 2 + 3 4 = ? A:", "46")
    assert tasks.verify(p, "So the answer is \\boxed{ 4 6 } <eos>") == 1.0
    assert tasks.verify(p, "\\boxed{ 4 6 } then \\boxed{ 4 7 }") == 0.0  # last box counts
    assert tasks.verify(p, "the answer is 4 6") == 0.0


def test_eval_sets_are_fixed_and_disjoint_by_difficulty():
    a, b = tasks.eval_set("easy", 50), tasks.eval_set("easy", 50)
    assert a == b and {p.kind for p in a} <= {"add2", "sub2"}
    assert {p.kind for p in tasks.eval_set("hard", 20)} == {"mul21"}
    with pytest.raises(ValueError, match="difficulty"):
        tasks.eval_set("extreme", 5)


def test_load_problems_checks_columns(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    assert sources.ProblemSource(str(f)).load()[0].answer == "2"
    g = tmp_path / "q.jsonl"
    g.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="'prompt'"):
        sources.ProblemSource(str(g)).load()
    with pytest.raises(FileNotFoundError):
        sources.ProblemSource(str(tmp_path / "missing.parquet")).load()


@pytest.mark.slow
def test_pretraining_smoke_saves_a_loadable_policy(tmp_path):
    cfg = tiny.PretrainConfig(size="tiny-s", max_steps=6, eval_every=3, eval_prompts=8, batch_size=8,
                                target_acc=2.0)
    m = tiny.pretrain(cfg, tmp_path, progress=False)
    assert m["steps"] == 6 and len(m["history"]) == 2
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert set(man["sha256"]) == {"model.safetensors"} and set(man["heldout_acc_t1"]) == set(tasks.DIFFICULTIES)
    model, tok = policy.load_policy(tmp_path)
    assert model.config.model_type == "qwen2" and len(tok) == len(tasks.VOCAB)


def test_committed_policies_match_their_manifest():
    for size in tiny.TINY_SIZES:
        d = Path("data/policies") / size
        man = json.loads((d / "manifest.json").read_text())
        assert hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() == man["sha256"]["model.safetensors"]
        acc = sum(man["heldout_acc_t1"].values()) / len(man["heldout_acc_t1"])
        assert 0.2 <= acc <= 0.8, (size, man["heldout_acc_t1"])


def test_policy_does_not_import_rollout():
    """policy <-> rollout used to import each other; building the tiny policies lives in tiny.py now."""
    code = "import sys, cancellation.policy; print('cancellation.rollout' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": "lib", "PATH": ""}).stdout
    assert out.strip() == "False"


@pytest.mark.skipif(not Path("data/policies/tiny-s/config.json").exists(), reason="needs make policy")
def test_float64_norms_survive_train_and_eval():
    """A float64 policy's RMSNorms stay float64 through model.train()/eval(): transformers >= 5.25 turns hub
    kernels on by default and re-kernelizes at each mode switch, which put the stock float32 norm back
    (the monitor test's 5.6e-7). Checked against the norm computed here by hand in float64."""
    import torch
    model, _ = policy.load_policy("data/policies/tiny-s", dtype="float64")
    model.train()
    model.eval()
    model.train()
    norm = model.model.norm
    x = torch.randn(3, 5, model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = norm.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    assert (norm(x) - ref).abs().max() < 1e-13
