"""Seeded CPU stand-ins of the paper's inputs, for the `paper-smoke` profile and its tests.

`build(out_dir, seed)` writes, in about a minute on one core:
- `model/`: a byte-level BPE tokenizer (trained here with `tokenizers`, Qwen's ChatML template,
  two stop ids) and a small random-initialised `Qwen3ForCausalLM` shaped like Qwen3-1.7B-Base in
  miniature (tied embeddings, GQA, q/k norm, model vocabulary padded past the tokenizer, bf16
  checkpoint), briefly trained so that sampled groups at T = 1 have mixed rewards;
- `model-vocab/`: the same model with Qwen's 151,936-wide (tied) LM head, padded rows pushed below
  the real tokens by a few more training steps (`widen_vocab`), for the `paper-vocab` profile;
- `dapo-math-17k.parquet`: DAPO-Math-17k's schema, each problem repeated as in the real file;
- `math500.jsonl`: MATH-500's fields (problem, solution with \\boxed{}, answer, subject, level, unique_id);
- `plain.jsonl`: plain prompt/answer rows;
- `manifest.json`: builder version, seed, sha256 and sizes of the files, training steps, accuracy.

    python -m cancellation.standins --out data/standins
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from pathlib import Path

import torch

from . import cache

VERSION = 2  # bump when anything below changes what is written (the manifest check rebuilds then)

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# DAPO-Math-17k's instruction around each problem (the user message content of its `prompt` column).
DAPO_TEMPLATE = ("Solve the following math problem step by step. The last line of your response should be of the "
                 "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
                 "Remember to put your answer on its own line after \"Answer:\".")

# Qwen's ChatML template. For a single user message with add_generation_prompt=True it renders what
# Qwen3-Base's template renders: "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n".
CHAT_TEMPLATE = ("{%- for message in messages %}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                 "{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

# Qwen2/Qwen3's pre-tokenizer split: digits one by one, words with a leading space, punctuation runs.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# (problem, answer, a wrong answer the policy also learns, subject, level). Answers are what
# math-verify can check, a few in LaTeX as in MATH-500.
PROBLEMS = [
    ("What is $3 + 4$?", "7", "8", "Prealgebra", 1),
    ("What is $9 - 5$?", "4", "5", "Prealgebra", 1),
    ("What is $6 \\times 7$?", "42", "48", "Prealgebra", 1),
    ("What is $56 \\div 8$?", "7", "6", "Prealgebra", 1),
    ("Simplify $\\frac{2}{4}$.", "\\frac{1}{2}", "\\frac{1}{4}", "Prealgebra", 2),
    ("What is $\\sqrt{16}$?", "4", "8", "Algebra", 1),
    ("Simplify $\\sqrt{8} / 2$.", "\\sqrt{2}", "2", "Algebra", 2),
    ("Solve for $x$: $2x + 3 = 11$.", "4", "7", "Algebra", 2),
    ("Solve for $x$: $5x = 35$.", "7", "30", "Algebra", 1),
    ("What is $\\frac{1}{4} + \\frac{1}{2}$?", "\\frac{3}{4}", "\\frac{2}{6}", "Prealgebra", 2),
    ("A box holds 12 eggs. How many eggs are in 3 boxes?", "36", "15", "Prealgebra", 1),
    ("Tom has 15 apples and gives away 6. How many are left?", "9", "21", "Prealgebra", 1),
    ("What is the remainder when 17 is divided by 5?", "2", "3", "Number Theory", 2),
    ("What is the greatest common divisor of 12 and 18?", "6", "3", "Number Theory", 2),
    ("How many sides does a hexagon have?", "6", "8", "Geometry", 1),
    ("What is the area of a square with side length 5?", "25", "20", "Geometry", 1),
    ("What is $2^5$?", "32", "10", "Algebra", 1),
    ("What is $10\\%$ of 250?", "25", "2.5", "Prealgebra", 2),
    ("How many ways can 3 books be arranged on a shelf?", "6", "3", "Counting & Probability", 2),
    ("What is the probability of rolling an even number on a fair die?", "\\frac{1}{2}", "\\frac{1}{3}",
     "Counting & Probability", 2),
]
# Extra words for the BPE corpus so the vocabulary reaches ~1,000 like a real (if tiny) tokenizer.
GLOSSARY = ("sum difference product quotient remainder divisor multiple prime factor integer rational real complex "
            "number numbers digit digits fraction fractions decimal percent ratio proportion equation equations "
            "inequality function functions polynomial root roots square cube triangle circle rectangle polygon "
            "angle angles degrees radius diameter perimeter area volume length width height probability expected "
            "value random choose combination permutation sequence series arithmetic geometric term terms first "
            "second third last positive negative even odd greatest least common maximum minimum solve simplify "
            "compute evaluate find determine express therefore thus hence because since given let suppose assume "
            "note that which where when then each every both total answer result solution problem step steps "
            "check verify substitute multiply divide add subtract plus minus times equals")
DAPO_REPEATS = 5  # the real file repeats ~17k prompts to 1.79M rows


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _variants():
    """(problem index, rendered-before-chat prompt, response template) the policy is trained on:
    DAPO's instruction answered with an "Answer:" line, the bare problem answered with \\boxed{}."""
    out = []
    for i, (q, *_rest) in enumerate(PROBLEMS):
        # LaTeX after "Answer:" in $...$: math-verify reads a bare "\\sqrt{2}" there as unparseable
        out.append((i, DAPO_TEMPLATE.format(problem=q), "Answer: ${}$" if "\\" in PROBLEMS[i][1] else "Answer: {}"))
        out.append((i, q, "The answer is $\\boxed{{{}}}$."))
    return out


def build_tokenizer(vocab_size: int = 1000):
    """A byte-level BPE tokenizer trained on the stand-in texts, with Qwen's special tokens last."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    corpus = [CHAT_TEMPLATE, "user assistant system", GLOSSARY, GLOSSARY.title()]
    for _, prompt, resp in _variants():
        corpus.append(prompt)
    for q, a, w, *_ in PROBLEMS:
        corpus += [f"Answer: {a}", f"Answer: {w}", f"Answer: ${a}$", f"The answer is $\\boxed{{{a}}}$.",
                   f"$\\boxed{{{w}}}$"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(corpus, trainer)
    # Special tokens appended after the BPE vocabulary, like Qwen (ids 151643..151645 after the merges).
    tk.add_special_tokens([EOT, IM_START, IM_END])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=EOT, pad_token=EOT, model_max_length=512,
                                  additional_special_tokens=[IM_START, IM_END], padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(tok, out: Path):
    """save_pretrained, plus the pin that makes AutoTokenizer reload this class (see tiny.save_tokenizer):
    transformers 5 otherwise maps model_type qwen3 to its own Qwen2Tokenizer."""
    tok.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "TokenizersBackend"
    cfg["auto_map"] = {"AutoTokenizer": [None, "TokenizersBackend"]}
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def padded_vocab(n: int) -> int:
    """Model vocabulary padded past the tokenizer, as Qwen pads 151,669 tokens to 151,936."""
    return -(-n // 64) * 64 + 64


def build_model(tok, seed: int):
    """A random Qwen3ForCausalLM shaped like Qwen3-1.7B-Base in miniature (tied, GQA, q/k norm, padded vocab)."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    eot, im_end = tok.convert_tokens_to_ids([EOT, IM_END])
    cfg = Qwen3Config(vocab_size=padded_vocab(len(tok)), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                      max_position_embeddings=512, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                      bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    # Qwen3-Base: the tokenizer's eos is <|endoftext|>; generation stops at <|im_end|> too.
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                                               do_sample=True, temperature=1.0)
    return model


QWEN_VOCAB = 151_936  # Qwen3's model vocabulary: 151,669 tokenizer ids padded to a multiple of 128
WIDEN_STEPS = 15       # fine-tuning steps after widening (measured: padded mass 40% -> ~5e-4 mean)


def widen_vocab(model, tok, vocab: int = QWEN_VOCAB, steps: int = WIDEN_STEPS):
    """A copy of `model` with its (tied) embedding widened to `vocab` rows, as Qwen pads its LM head
    far past the tokenizer: the `paper-vocab` stand-in, whose every logits tensor is 151,936 wide.

    Real rows and the body are copied; padded rows start at zero (logit 0, which still holds ~40%
    of the mass when 150k of them face the small model's modest real logits), then `steps` of the
    same full-batch training: padded ids are never targets, so their softmax gradient pushes them
    below the real tokens, as pre-training does to Qwen's. `padded_mass` measures what is left."""
    from transformers import Qwen3ForCausalLM

    cfg = model.config.to_dict()
    cfg["vocab_size"] = vocab
    wide = Qwen3ForCausalLM(type(model.config).from_dict(cfg)).to(model.dtype)
    state = {k: v for k, v in model.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    wide.load_state_dict(state, strict=False)
    wide.generation_config = model.generation_config
    with torch.no_grad():
        E = model.get_input_embeddings().weight
        W = wide.get_input_embeddings().weight
        W.zero_()
        W[:E.shape[0]] = E
    wide.tie_weights()
    train(wide, tok, steps=steps)
    return wide


def padded_mass(model, tok) -> float:
    """The largest total probability of the padded ids over the training positions."""
    ids, mask = _training_rows(tok)
    with torch.no_grad():  # the head on the response positions only (not a (rows, length, 151,936) tensor)
        lg = model.lm_head(model.model(input_ids=ids).last_hidden_state[mask.bool()]).float()
    return float(torch.softmax(lg, -1)[:, len(tok):].sum(-1).max())


def _training_rows(tok):
    """Token ids and loss masks: each chat-rendered prompt followed by its right and its wrong response."""
    im_end = tok.convert_tokens_to_ids(IM_END)
    rows = []
    for i, prompt, resp in _variants():
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
        p = tok(text, add_special_tokens=False)["input_ids"]
        for ans in PROBLEMS[i][1:3]:
            r = tok(resp.format(ans), add_special_tokens=False)["input_ids"] + [im_end]
            rows.append((p + r, [0] * len(p) + [1] * len(r)))
    L = max(len(x) for x, _ in rows)
    ids = torch.tensor([x + [tok.pad_token_id] * (L - len(x)) for x, _ in rows])
    mask = torch.tensor([m + [0] * (L - len(m)) for _, m in rows], dtype=torch.float32)
    return ids, mask


def train(model, tok, steps: int = 100, lr: float = 2e-2) -> list[float]:
    """Full-batch next-token training on every (prompt, right) and (prompt, wrong) pair.

    Full batches keep right and wrong exactly balanced in every step, so the answer distribution
    settles near 50/50 instead of drifting with the last minibatches."""
    ids, mask = _training_rows(tok)
    m = mask[:, 1:].bool()  # logits only where there is a loss: prompts are context (7x fewer head rows)
    targets = ids[:, 1:][m]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10) * max(0.05, 1 - s / steps))
    losses = []
    model.train()
    for _ in range(steps):
        h = model.model(input_ids=ids).last_hidden_state[:, :-1]  # right padding: pads come after every target
        loss = torch.nn.functional.cross_entropy(model.lm_head(h[m]).float(), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def sample(model, tok, prompts: list[str], n: int, seed: int, max_new_tokens: int = 24) -> list[list[str]]:
    """n responses per chat-rendered prompt at T = 1, each cut at the first of the two stop ids.

    A minimal multinomial loop (left padding, HF's KV cache) kept independent of
    rollout.py so the builder's accuracy check does not depend on the code it helps test."""
    import inspect
    kv_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # transformers 5.2x renamed it
    stops = set(model.generation_config.eos_token_id)
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts for _ in range(n)]
    enc = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    L = max(map(len, enc))
    ids = torch.tensor([[tok.pad_token_id] * (L - len(e)) + e for e in enc])
    attn = torch.tensor([[0] * (L - len(e)) + [1] * len(e) for e in enc])
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(len(enc), 0, dtype=torch.long)
    done = torch.zeros(len(enc), dtype=torch.bool)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    step_ids, cache = ids, None
    for _ in range(max_new_tokens):
        o = model(input_ids=step_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                  **{kv_name: cache})
        cache, logits = getattr(o, kv_name), o.logits[:, -1].float()
        logits[:, len(tok):] = float("-inf")  # padded ids are never real tokens
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1)
        nxt = torch.where(done, tok.pad_token_id, nxt)
        out = torch.cat([out, nxt[:, None]], 1)
        done |= torch.tensor([t in stops for t in nxt.tolist()])
        if done.all():
            break
        step_ids, pos = nxt[:, None], pos[:, -1:] + 1
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
    resp = []
    for row in out.tolist():
        cut = next((k for k, t in enumerate(row) if t in stops), len(row))
        resp.append(tok.decode(row[:cut]))
    return [resp[i * n:(i + 1) * n] for i in range(len(prompts))]


def extract_answer(response: str) -> str | None:
    """The last \\boxed{...} (balanced braces) or else the text after the last "Answer:"."""
    k = response.rfind("\\boxed{")
    if k >= 0:
        depth, j = 1, k + len("\\boxed{")
        for e in range(j, len(response)):
            depth += {"{": 1, "}": -1}.get(response[e], 0)
            if depth == 0:
                return response[j:e].strip()
        return None
    k = response.rfind("Answer:")
    return response[k + len("Answer:"):].strip().strip("$").strip() if k >= 0 else None


def accuracy(model, tok, n: int = 16, seed: int = 0) -> dict:
    """Share of n samples graded right per problem and prompt shape ('dapo', 'bare'), by string match."""
    vs = _variants()
    groups = sample(model, tok, [p for _, p, _ in vs], n=n, seed=seed)
    acc = {}
    for (i, prompt, _), resps in zip(vs, groups):
        shape = "dapo" if prompt != PROBLEMS[i][0] else "bare"
        acc[f"{i}:{shape}"] = sum(extract_answer(r) == PROBLEMS[i][1] for r in resps) / n
    return acc


def write_data(out: Path, seed: int) -> dict:
    """The three problem files; returns their paths."""
    import pandas as pd

    rng = random.Random(seed)
    uids = [f"{rng.getrandbits(128):032x}" for _ in PROBLEMS]  # DAPO's extra_info.index is a uuid per problem
    rows = [dict(data_source="math_dapo", prompt=[{"content": DAPO_TEMPLATE.format(problem=q), "role": "user"}],
                 ability="MATH", reward_model={"ground_truth": a, "style": "rule"}, extra_info={"index": uid})
            for uid, (q, a, *_rest) in zip(uids, PROBLEMS)]
    paths = {"dapo": out / "dapo-math-17k.parquet", "math500": out / "math500.jsonl", "plain": out / "plain.jsonl"}
    pd.DataFrame(rows * DAPO_REPEATS).to_parquet(paths["dapo"], index=False)
    with open(paths["math500"], "w") as f:
        for k, (q, a, _w, subject, level) in enumerate(PROBLEMS):
            slug = subject.lower().replace(" & ", "_").replace(" ", "_")
            f.write(json.dumps(dict(problem=q, solution=f"Working it out, the answer is $\\boxed{{{a}}}$.", answer=a,
                                    subject=subject, level=level, unique_id=f"test/{slug}/{k}.json")) + "\n")
    with open(paths["plain"], "w") as f:
        for q, a, *_rest in PROBLEMS:
            f.write(json.dumps(dict(prompt=q, answer=a)) + "\n")
    return paths


def build(out_dir: str | Path, seed: int = 0, steps: int = 100, force: bool = False, paper_vocab: bool = True) -> dict:
    """Build the stand-ins into `out_dir` (skipped when its manifest has this VERSION, seed and steps,
    and the paper-vocab model when asked for). `paper_vocab=False` leaves out `model-vocab/` (the
    slow part: every logits row is 151,936 wide).

    Returns {"model", "dapo", "math500", "plain"} paths (str). Runs single-threaded, so the weights
    are the same bytes on any machine with the same torch build. A second process building the same
    folder (two test workers, `make standins` beside a test run) waits for the first, then finds it built."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with cache.lock(out / "manifest"):
        return _build(out, seed, steps, force, paper_vocab)


DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "standins"   # what the paper-smoke profiles name


def ensure_model(out_dir: str | Path = DEFAULT_DIR) -> str:
    """The stand-in model's path (`out_dir/model`), built first when missing or stale, without the slow
    paper-vocab model (a build that has it is kept): what the sampler bench and the GPU tests load."""
    return build(out_dir, paper_vocab=False)["model"]


def _build(out: Path, seed: int, steps: int, force: bool, paper_vocab: bool) -> dict:
    paths = {"model": out / "model", "model_vocab": out / "model-vocab", "dapo": out / "dapo-math-17k.parquet",
             "math500": out / "math500.jsonl", "plain": out / "plain.jsonl"}
    man_path = out / "manifest.json"
    if man_path.exists() and not force:
        man = json.loads(man_path.read_text())
        if (man.get("version"), man.get("seed"), man.get("steps")) == (VERSION, seed, steps) and all(
                (out / f).exists() for f in man["sha256"]) and ("paper_vocab" in man or not paper_vocab):
            return {k: str(v) for k, v in paths.items() if k != "model_vocab" or "paper_vocab" in man}
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.time()
    try:
        out.mkdir(parents=True, exist_ok=True)
        tok = build_tokenizer()
        model = build_model(tok, seed)
        losses = train(model, tok, steps=steps)
        model = model.to(torch.bfloat16)  # checkpoint in bf16 like Qwen3-1.7B-Base ...
        t_train = time.time() - t0
        acc = accuracy(model.float(), tok, seed=seed)  # ... and graded on exactly those weights
        model = model.to(torch.bfloat16)
        model.save_pretrained(paths["model"])
        save_tokenizer(tok, paths["model"])
        if paper_vocab:  # the same model with Qwen's 151,936-wide head
            t1 = time.time()
            wide = widen_vocab(model.float(), tok).to(torch.bfloat16)
            wide_acc = accuracy(wide.float(), tok, seed=seed)
            wide_mass = padded_mass(wide, tok)
            wide = wide.to(torch.bfloat16)
            wide.save_pretrained(paths["model_vocab"])
            save_tokenizer(tok, paths["model_vocab"])
            vocab_info = dict(model_vocab=wide.config.vocab_size, steps=WIDEN_STEPS,
                              seconds=round(time.time() - t1, 2), padded_mass_max=float(f"{wide_mass:.3g}"),
                              accuracy=round(sum(wide_acc.values()) / len(wide_acc), 4),
                              mixed_prompts=f"{sum(0 < a < 1 for a in wide_acc.values())}/{len(wide_acc)}")
        else:
            del paths["model_vocab"]
            shutil.rmtree(out / "model-vocab", ignore_errors=True)  # a stale one must not enter the manifest
        write_data(out, seed)
    finally:
        torch.set_num_threads(threads)
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"]
    mixed = sum(0 < a < 1 for a in acc.values())
    man = dict(version=VERSION, seed=seed, steps=steps, final_loss=round(losses[-1], 4),
               seconds=dict(train=round(t_train, 2), total=round(time.time() - t0, 2)),
               tokenizer=len(tok), model_vocab=model.config.vocab_size,
               n_params=sum(p.numel() for p in model.parameters()),
               rows=dict(dapo=len(PROBLEMS) * DAPO_REPEATS, dapo_unique=len(PROBLEMS), math500=len(PROBLEMS),
                         plain=len(PROBLEMS)),
               accuracy=dict(samples_per_prompt=16, mean=round(sum(acc.values()) / len(acc), 4),
                             mixed_prompts=f"{mixed}/{len(acc)}", per_prompt=acc),
               bytes={str(p.relative_to(out)): p.stat().st_size for p in files},
               sha256={str(p.relative_to(out)): _sha(p) for p in files},
               torch=torch.__version__)
    if paper_vocab:
        man["paper_vocab"] = vocab_info
    man_path.write_text(json.dumps(man, indent=2) + "\n")
    return {k: str(v) for k, v in paths.items()}


def main(argv=None):
    """`python -m cancellation.standins --out data/standins [--seed 0] [--force]`."""
    import argparse
    ap = argparse.ArgumentParser(description="Build CPU stand-ins of the paper's model, tokenizer and data files.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if the manifest matches")
    a = ap.parse_args(argv)
    paths = build(a.out, seed=a.seed, force=a.force)
    man = json.loads((Path(a.out) / "manifest.json").read_text())
    print(json.dumps(dict(paths=paths, seconds=man["seconds"], accuracy={k: man["accuracy"][k] for k in
                                                                         ("mean", "mixed_prompts")}), indent=2))


if __name__ == "__main__":
    main()
