"""Build, pretrain and save the tiny policies of the tiny profile.

The tiny policy is a real `Qwen2ForCausalLM` with a word-level tokenizer (`PreTrainedTokenizerFast`
over a `tokenizers` WordLevel model), saved with `save_pretrained`, so
`AutoModelForCausalLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` load it
like any hub model (`policy.load_policy`). Pretraining is plain next-token prediction on generated
traces, of which a fixed share is deliberately wrong (tasks.make_trace) so the base policy stays
uncertain where it matters; it stops when sampled held-out accuracy reaches a target, so the RL
groups are mixed.

    python -m cancellation.tiny --size tiny-m --out data/policies/tiny-m
    python -m cancellation.tiny --size tiny-m --scaffold fixed --out data/policies/tiny-m-fixed   # the control
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import rollout, seeds, sources, tasks
from .policy import n_params

log = logging.getLogger(__name__)

# The sizes the tiny profile ships (Fig. 9 runs "across models" over these).
TINY_SIZES = {
    "tiny-m": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4),
    "tiny-s": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4),
}


def build_tokenizer():
    """Word-level tokenizer over tasks.VOCAB, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tasks.VOCAB)}, unk_token=tasks.UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=tasks.PAD, eos_token=tasks.EOS,
                                   unk_token=tasks.UNK, padding_side="left")


def save_tokenizer(tok, out: str | Path):
    """save_pretrained, plus a pin so AutoTokenizer loads the word-level tokenizer as saved.

    transformers 5 maps model_type 'qwen2' to its byte-level BPE Qwen2Tokenizer regardless of the
    saved tokenizer_class ('qwen2' is on its list of hub repos with a wrong class); an `auto_map`
    entry naming the generic TokenizersBackend takes the branch that honours tokenizer_class.
    """
    tok.save_pretrained(out)
    cfg_path = Path(out) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "TokenizersBackend"
    cfg["auto_map"] = {"AutoTokenizer": [None, "TokenizersBackend"]}
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def build_tiny_model(size: str = "tiny-m", seed: int = 0, vocab_size: int | None = None):
    """A freshly initialised Qwen2 causal LM of one of TINY_SIZES (untied LM head)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if size not in TINY_SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose from {sorted(TINY_SIZES)}")
    cfg = Qwen2Config(vocab_size=vocab_size or len(tasks.VOCAB), max_position_embeddings=256,
                      num_key_value_heads=TINY_SIZES[size]["num_attention_heads"], tie_word_embeddings=False,
                      pad_token_id=tasks.VOCAB.index(tasks.PAD), eos_token_id=tasks.VOCAB.index(tasks.EOS),
                      bos_token_id=None, **TINY_SIZES[size])
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


# --------------------------------------------------------------------------- pretraining
@dataclass
class PretrainConfig:
    """Pretraining of one tiny policy on generated traces."""
    size: str = "tiny-m"            # key of TINY_SIZES
    seed: int = 0                   # seeds init, data stream and evaluation sampling
    batch_size: int = 64            # traces per AdamW step
    lr: float = 3e-3                # AdamW peak learning rate (linear warm-up, then constant)
    warmup: int = 100               # warm-up steps
    max_steps: int = 3000           # hard cap on steps
    error_rate: float = 0.35        # share of traces with a deliberate slip
    eval_every: int = 200           # steps between held-out evaluations
    eval_prompts: int = 192         # held-out prompts per evaluation (one sample each, T = 1)
    target_acc: float = 0.5         # stop once sampled held-out accuracy reaches this
    kinds: list = field(default_factory=lambda: list(tasks.KINDS))  # problem kinds in the mix
    scaffold: str = "varied"        # 'varied' (random scaffold wording) or 'fixed' (one phrasing per slot: the control task)


def _encode_traces(tok, problems, traces):
    """Right-padded ids and a loss mask over response tokens (prompt tokens are context only)."""
    ids, masks = [], []
    for p, t in zip(problems, traces):
        pi = tok(p.prompt, add_special_tokens=False)["input_ids"]
        ri = tok(t, add_special_tokens=False)["input_ids"]
        ids.append(pi + ri)
        masks.append([0] * len(pi) + [1] * len(ri))
    L = max(map(len, ids))
    pad = tok.pad_token_id
    input_ids = torch.tensor([x + [pad] * (L - len(x)) for x in ids])
    loss_mask = torch.tensor([m + [0] * (L - len(m)) for m in masks])
    attn = torch.tensor([[1] * len(x) + [0] * (L - len(x)) for x in ids])
    return input_ids, attn, loss_mask


def sampled_accuracy(model, tok, problems, seed: int, temperature: float = 1.0, max_new_tokens: int = 96) -> float:
    """Share of problems solved by one sample each at `temperature`."""
    cfg = rollout.SampleConfig(n_prompts=len(problems), G=1, temperature=temperature, max_new_tokens=max_new_tokens,
                       device=next(model.parameters()).device.type, source=sources.ProblemSource(prompt_format="raw"))
    batch = rollout.sample(model, tok, cfg, problems=problems, seed=seed)
    return float(batch.reward.mean())


def pretrain(cfg: PretrainConfig, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Train one tiny policy; save it (HF format + manifest.json) to `out_dir` if given.

    Returns the manifest: config, steps run, wall time, held-out accuracies, sha256 of weights.
    """
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    tok = build_tokenizer()
    model = build_tiny_model(cfg.size, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup))
    rng = random.Random(cfg.seed)
    eval_problems = tasks.sample_problems(cfg.eval_prompts, seed=10_007 + cfg.seed, kinds=cfg.kinds)
    history, t0, acc, step = [], time.time(), 0.0, 0
    bar = tqdm(total=cfg.max_steps, desc=f"pretrain {cfg.size}", disable=not progress)
    for step in range(1, cfg.max_steps + 1):
        model.train()
        probs = [tasks.sample_problem(rng, rng.choice(cfg.kinds)) for _ in range(cfg.batch_size)]
        traces = [tasks.make_trace(p, rng, cfg.error_rate, cfg.scaffold) for p in probs]
        ids, attn, lmask = _encode_traces(tok, probs, traces)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        tgt, m = ids[:, 1:], lmask[:, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        loss = (nll * m.reshape(-1)).sum() / m.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            model.eval()
            acc = sampled_accuracy(model, tok, eval_problems, seed=seeds.derive(cfg.seed, "tiny_eval", step))
            history.append(dict(step=step, loss=float(loss.detach()), acc_t1=acc, minutes=(time.time() - t0) / 60))
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc=f"{acc:.2f}")
            log.info("step %d loss %.4f sampled acc %.3f", step, float(loss.detach()), acc)
            if acc >= cfg.target_acc:
                break
    bar.close()
    model.eval()
    held_out = {d: sampled_accuracy(model, tok, tasks.eval_set(d, 256), seed=cfg.seed) for d in tasks.DIFFICULTIES}
    held_out_greedy = {d: sampled_accuracy(model, tok, tasks.eval_set(d, 256), seed=cfg.seed, temperature=1e-4)
                       for d in tasks.DIFFICULTIES}
    manifest = dict(config=asdict(cfg), steps=step, minutes=round((time.time() - t0) / 60, 2), n_params=n_params(model),
                    heldout_acc_t1=held_out, heldout_acc_greedy=held_out_greedy, history=history,
                    torch=torch.__version__)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        save_tokenizer(tok, out)
        manifest["sha256"] = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(out.glob("*.safetensors"))}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv=None):
    """`python -m cancellation.tiny --size tiny-m --out data/policies/tiny-m [--max-steps N]`."""
    import argparse
    ap = argparse.ArgumentParser(description="Pretrain a tiny policy on generated arithmetic traces.")
    ap.add_argument("--size", default="tiny-m", choices=sorted(TINY_SIZES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=PretrainConfig.max_steps)
    ap.add_argument("--eval-every", type=int, default=PretrainConfig.eval_every)
    ap.add_argument("--target-acc", type=float, default=PretrainConfig.target_acc)
    ap.add_argument("--scaffold", default="varied", choices=tasks.SCAFFOLDS,
                    help="'fixed': one wording per scaffold slot (the control policy tiny-m-fixed)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    m = pretrain(PretrainConfig(size=a.size, seed=a.seed, max_steps=a.max_steps, eval_every=a.eval_every,
                                target_acc=a.target_acc, scaffold=a.scaffold), a.out)
    print(json.dumps({k: m[k] for k in ("steps", "minutes", "n_params", "heldout_acc_t1", "heldout_acc_greedy")}, indent=2))


if __name__ == "__main__":
    main()
