"""The paper-smoke stand-ins, checked against facts independent of the builder's own code paths."""
import json
import re
import struct
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from cancellation import standins


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("standins")
    t0 = time.time()
    paths = standins.build(out, seed=0, paper_vocab=False)  # the wide model: test_paper_vocab_model
    return paths, time.time() - t0, out


@pytest.fixture(scope="session")
def loaded(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = built[0]["model"]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def test_paths_and_build_time(built):
    paths, seconds, out = built
    assert set(paths) == {"model", "dapo", "math500", "plain"} and all(Path(p).exists() for p in paths.values())
    man = json.loads((out / "manifest.json").read_text())
    assert man["version"] == standins.VERSION and man["seconds"]["total"] <= seconds + 1
    print(f"standins build: {seconds:.1f} s (target < 60 s on one core)")
    assert seconds < 120  # the target is 60 s; the margin keeps a slow CI machine from flaking


def test_model_is_a_tied_gqa_qwen3_with_padded_vocab(loaded):
    model, tok = loaded
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied after load
    c = model.config
    assert c.tie_word_embeddings and c.num_key_value_heads < c.num_attention_heads and c.head_dim
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (c.head_dim,)
    assert c.vocab_size > len(tok)


def test_checkpoint_is_bf16(built):
    f = Path(built[0]["model"]) / "model.safetensors"
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in header  # tied: one stored matrix, as in Qwen3-1.7B-Base
    assert json.loads((Path(built[0]["model"]) / "config.json").read_text())["dtype"] == "bfloat16"


def test_tokenizer_reloads_with_chat_template_and_two_stop_ids(built, loaded):
    from transformers import PreTrainedTokenizerFast
    _, tok = loaded
    fresh = standins.build_tokenizer()
    assert type(tok) is type(fresh) and isinstance(tok, PreTrainedTokenizerFast)
    text = "What is $6 \\times 7$? The answer is $\\boxed{42}$.<|im_end|>"
    assert tok(text)["input_ids"] == fresh(text)["input_ids"]
    assert tok.convert_ids_to_tokens(tok(text)["input_ids"])[-1] == "<|im_end|>"  # a special token, not bytes
    r = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert r == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    gen = json.loads((Path(built[0]["model"]) / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == sorted(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


def test_problem_files_have_the_paper_schemas(built):
    paths = built[0]
    df = pd.read_parquet(paths["dapo"])
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    msgs = df.prompt.iloc[0]
    assert len(msgs) == 1 and msgs[0]["role"] == "user" and "Answer:" in msgs[0]["content"]
    assert df.reward_model.iloc[0]["style"] == "rule" and df.reward_model.iloc[0]["ground_truth"]
    n_unique = df.prompt.map(lambda m: m[0]["content"]).nunique()
    assert len(df) > n_unique >= 15  # repeated rows, as in the real file
    rows = [json.loads(x) for x in open(paths["math500"])]
    assert {"problem", "solution", "answer", "subject", "level", "unique_id"} <= set(rows[0])
    assert all(f"\\boxed{{{r['answer']}}}" in r["solution"] for r in rows)
    assert any(r["answer"].startswith("\\frac") for r in rows) and any(r["answer"] == "\\sqrt{2}" for r in rows)
    assert {"prompt", "answer"} <= set(json.loads(open(paths["plain"]).readline()))


def _grade(response, answer):
    """Independent string check: the last \\boxed{...} or "Answer:" value equals the answer."""
    boxed = re.findall(r"\\boxed\{(.*)\}", response)
    if boxed:
        return boxed[-1] == answer
    return "Answer:" in response and response.rsplit("Answer:", 1)[1].strip().strip("$") == answer


@torch.no_grad()
def test_sampled_groups_have_mixed_rewards(loaded, built):
    """8 samples per DAPO prompt at T = 1, own multinomial loop (no KV cache), cut at either stop id."""
    model, tok = loaded
    stops = set(model.generation_config.eos_token_id)
    df = pd.read_parquet(built[0]["dapo"]).drop_duplicates("extra_info")
    g = torch.Generator().manual_seed(123)
    mixed = 0
    for msgs, rm in zip(df.prompt, df.reward_model):
        text = tok.apply_chat_template([dict(m) for m in msgs], tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]] * 8)
        resp = [[] for _ in range(8)]
        for _ in range(24):
            probs = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1)
            nxt = torch.multinomial(probs, 1, generator=g)
            for i, t in enumerate(nxt[:, 0].tolist()):
                if not (resp[i] and resp[i][-1] in stops):
                    resp[i].append(t)
            ids = torch.cat([ids, nxt], 1)
        texts = [tok.decode([t for t in r if t not in stops]) for r in resp]
        assert all(r[-1] in stops for r in resp), texts  # short responses that end at a stop id
        right = sum(_grade(t, rm["ground_truth"]) for t in texts)
        mixed += 0 < right < 8
    assert mixed >= len(df) / 2, mixed


def test_build_is_deterministic_and_idempotent(built, canonical_standins):
    """The second build to compare with is data/standins (canonical_standins: standins.build at seed 0 in a
    call of its own, the paper-smoke tests' stand-ins, made anyway on a fresh clone), not a third build here:
    every file both builds hold has the same bytes; it adds model-vocab/ beside them."""
    paths, _, out = built
    man = json.loads((out / "manifest.json").read_text())
    t0 = time.time()
    standins.build(out, seed=0, paper_vocab=False)  # manifest matches: nothing rebuilt
    assert time.time() - t0 < 5 and json.loads((out / "manifest.json").read_text()) == man
    again = json.loads((Path(canonical_standins["model"]).parent / "manifest.json").read_text())
    assert (again["version"], again["seed"]) == (standins.VERSION, 0) and Path(out) != Path(canonical_standins["model"]).parent
    assert again["sha256"]["model/model.safetensors"] == man["sha256"]["model/model.safetensors"]
    assert {k: again["sha256"].get(k) for k in man["sha256"]} == man["sha256"]
    assert {k for k in again["sha256"] if k not in man["sha256"]} <= {f"model-vocab/{f}" for f in (
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json")}


@pytest.mark.slow
def test_paper_vocab_model_is_qwen_wide_and_never_samples_padding(canonical_standins):
    """The paper-vocab stand-in (data/standins/model-vocab, built as the paper-smoke tests build
    it): Qwen3's 151,936-row tied head, the small model's tokenizer, and padded ids whose total
    probability is negligible where the model samples (a plain forward and softmax, not the
    builder's code), so sampled groups still have mixed rewards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = canonical_standins
    assert "model_vocab" in paths
    model = AutoModelForCausalLM.from_pretrained(paths["model_vocab"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(paths["model_vocab"])
    assert model.config.vocab_size == 151_936 and model.lm_head.weight is model.model.embed_tokens.weight
    assert len(tok) == len(AutoTokenizer.from_pretrained(paths["model"]))
    prompts = [standins.DAPO_TEMPLATE.format(problem=q) for q, *_ in standins.PROBLEMS[:6]]
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             + "Working it out, the answer is" for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.no_grad():
        probs = torch.softmax(model(**enc).logits[:, -8:].double(), -1)   # the last 8 positions of every row
    mass = probs[..., len(tok):].sum(-1)
    assert float(mass.max()) < 0.05, float(mass.max())
    man = json.loads((Path(paths["model"]).parent / "manifest.json").read_text())["paper_vocab"]
    assert man["model_vocab"] == 151_936 and man["padded_mass_max"] < 0.05
    assert int(man["mixed_prompts"].split("/")[0]) >= 20
