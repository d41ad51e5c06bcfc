"""Token categories: tiny vocabulary, a real byte-level BPE tokenisation, SentencePiece-style
pieces, the editable table, the tagger choice, and the mass aggregation against a plain loop."""
import random
import re

import numpy as np
import pandas as pd
import pytest

from cancellation import categories
from cancellation import measure, policy, rollout, sources, tasks
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

RAW = sources.ProblemSource(prompt_format="raw")  # prompts as given, rewards by tasks.verify

SENTENCE = "Therefore, 3x + 5 = 11, so x = 2. The answer is \\boxed{2}."
# hand labels of the sentence's words (independent of the table): word -> category, in order
SENTENCE_WORDS = [("Therefore", "Reasoning"), (",", "Template"), ("3", "Math"), ("x", "Math"), ("+", "Math"),
                  ("5", "Math"), ("=", "Math"), ("11", "Math"), (",", "Template"), ("so", "Reasoning"),
                  ("x", "Math"), ("=", "Math"), ("2", "Math"), (".", "Template"), ("The", "Template"),
                  ("answer", "Template"), ("is", "Template"), ("\\boxed", "Template"), ("{", "Template"),
                  ("2", "Math"), ("}", "Template"), (".", "Template")]
# the tiny task's response vocabulary, labelled by hand (see the category table's header)
TINY_MATH = set("0123456789") | {"+", "-", "*", "="}
TINY_REASONING = {"carry", "borrow", "no"}


def char_labels(text, words):
    """Category of every character of `text` from hand-labelled words (spaces: None)."""
    lab, pos = [None] * len(text), 0
    for w, c in words:
        i = text.index(w, pos)
        lab[i:i + len(w)] = [c] * len(w)
        pos = i + len(w)
    return lab


@pytest.fixture(scope="module")
def cz():
    return categories.Categorizer(tagger="shipped")


@pytest.fixture(scope="module")
def tiny_tok():
    return policy.load_policy("data/policies/tiny-m")[1]


def test_tiny_vocabulary_every_token(cz, tiny_tok):
    rng = random.Random(3)
    problems = tasks.sample_problems(40, seed=3)
    traces = [tasks.make_trace(p, rng, error_rate=0.5) for p in problems]
    ids = [tiny_tok(t, add_special_tokens=False).input_ids for t in traces]
    assert categories.detect_scheme(tiny_tok.convert_ids_to_tokens(list(range(len(tiny_tok))))) == "wordpiece"
    n = 0
    for trace, (cats, words) in zip(traces, cz.tag_ids(ids, tiny_tok)):
        toks = trace.split()
        assert len(cats) == len(toks)
        for t, c in zip(toks, cats):
            want = "Math" if t in TINY_MATH else "Reasoning" if t in TINY_REASONING else "Template"
            assert c == want, (t, c, trace)
            n += 1
    assert n > 1500


def test_phrase_and_brace_context(cz):
    # 'So' opening the answer scaffold is Template; 'so' as a connective is Reasoning
    cats, _ = cz.tag_pieces("So the answer is \\boxed{ 4 2 }".split(), "wordpiece")
    assert cats == ["Template"] * 5 + ["Math", "Math", "Template"]
    cats, _ = cz.tag_pieces("so carry 1".split(), "wordpiece")
    assert cats == ["Reasoning", "Reasoning", "Math"]
    # the tiny prompt marker 'Q:' (words Q + :) is format; a lone q is a variable
    assert cz.tag_pieces(["Q:", "q", "=", "1"], "wordpiece")[0] == ["Template", "Math", "Math", "Math"]
    # braces of a Math command stay Math, nested inside a Template \boxed; pieces cut mid-word
    text = "\\boxed{\\frac{1}{2}}"
    cats, words = cz.tag_pieces([text[:7], text[7:12], text[12:]], "bytelevel")
    assert words == ["\\boxed", "\\frac", "{"] and cats == ["Template", "Math", "Math"]
    got = cz.word_categories([["\\boxed", "{", "\\frac", "{", "1", "}", "{", "2", "}", "}"]])[0]
    assert got == ["Template", "Template", "Math", "Math", "Math", "Math", "Math", "Math", "Math", "Template"]


def _train_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["The answer is 42.", "so we add 3 and 5", "x + 1 = 2, then x = 1", "fore and aft", "There is a box",
              "Therefore the sum is 7", "we write \\frac{1}{2}", "boxes and boxed items"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         show_progress=False))
    return tok


def test_real_bpe_tokenisation_every_token(cz):
    bpe = _train_bpe()
    enc = bpe.encode(SENTENCE)
    pieces = enc.tokens
    assert "".join(pieces).replace("Ġ", " ") == SENTENCE.replace(" ", " ")  # ASCII: one char per byte
    assert any(p.startswith("Ġ") for p in pieces) and len(pieces) > len(SENTENCE.split())  # real sub-word pieces
    assert not any(p in ("\\boxed", "Therefore") for p in pieces)  # both words are split
    cats, words = cz.tag_pieces(pieces, "bytelevel")
    lab = char_labels(SENTENCE, SENTENCE_WORDS)
    for piece, (a, b), c in zip(pieces, enc.offsets, cats):
        # the tokenizer's own offsets; a lone space piece belongs to the word after it
        first = next(i for i in range(a, len(SENTENCE)) if SENTENCE[i] != " ")
        assert c == lab[first], (piece, c, lab[first])
    # the same through a transformers tokenizer (ids -> pieces -> scheme detected)
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=bpe)
    assert categories.detect_scheme(hf.convert_ids_to_tokens(list(range(len(hf))))) == "bytelevel"
    assert cz.tag_ids([enc.ids], hf)[0][0] == cats


def test_sentencepiece_pieces_and_split_bytes(cz):
    # '×' (U+00D7, bytes C3 97) as two byte-fallback pieces; ▁ marks the leading space
    pieces = ["▁There", "fore", ",", "▁3", "▁", "<0xC3>", "<0x97>", "▁4", "▁=", "▁1", "2", "<|im_end|>"]
    cats, words = cz.tag_pieces(pieces, "sentencepiece", special=frozenset({"<|im_end|>"}))
    assert words == ["Therefore", "Therefore", ",", "3", "×", "×", "×", "4", "=", "12", "12", "<|im_end|>"]
    assert cats == ["Reasoning"] * 2 + ["Template"] + ["Math"] * 8 + ["Template"]
    # the same product in GPT-2 byte-level pieces: 'Ã' 'Ĺ' are the stand-ins of bytes C3 97
    cats2, words2 = cz.tag_pieces(["Ġ3", "ĠÃ", "Ĺ", "Ġ4"], "bytelevel")
    assert words2 == ["3", "×", "×", "4"] and cats2 == ["Math"] * 4


def test_newlines_markdown_and_prose(cz):
    pieces = ["We", "Ġcompute", "Ġthe", "Ġsum", ".", "ĊĊ", "##", "ĠStep", "Ġ2", ":"]
    cats, words = cz.tag_pieces(pieces, "bytelevel")
    assert dict(zip(pieces, cats)) == {"We": "Other", "Ġcompute": "Reasoning", "Ġthe": "Other", "Ġsum": "Other",
                                       ".": "Template", "ĊĊ": "Template", "##": "Template", "ĠStep": "Template",
                                       "Ġ2": "Math", ":": "Template"}
    # an unknown -ing word goes through the NLTK RegexpTagger back-off (VBG -> Reasoning)
    assert cz.word_categories([["substituting", "apples"]])[0] == ["Reasoning", "Other"]


def test_editable_table(tmp_path, tiny_tok):
    src = categories.DEFAULT_MAP.read_text()
    edited = src.replace("word,ones,Template", "word,ones,Math")
    assert edited != src
    (tmp_path / "m.csv").write_text(edited)
    ids = tiny_tok("First ones digit : 7 + 8", add_special_tokens=False).input_ids
    assert categories.Categorizer(tmp_path / "m.csv", tagger="shipped").tag_ids([ids], tiny_tok)[0][0][1] == "Math"
    assert categories.Categorizer(tagger="shipped").tag_ids([ids], tiny_tok)[0][0][1] == "Template"
    (tmp_path / "bad.csv").write_text("rule,key,value\nword,carry,Decision\n")
    with pytest.raises(ValueError, match=r"bad\.csv:2: unknown category 'Decision'"):
        categories.load_map(tmp_path / "bad.csv")
    with pytest.raises(FileNotFoundError):
        categories.load_map(tmp_path / "missing.csv")


def test_tagger_choice(monkeypatch):
    import nltk
    cz = categories.Categorizer(tagger="shipped")
    assert isinstance(cz._shipped, nltk.UnigramTagger) and isinstance(cz._shipped.backoff, nltk.RegexpTagger)
    if not categories.perceptron_available():  # nothing is downloaded: 'auto' falls back, 'perceptron' explains
        assert categories.Categorizer(tagger="auto").tagger == "shipped"
        with pytest.raises(LookupError, match="never downloads"):
            categories.Categorizer(tagger="perceptron")
    monkeypatch.setattr(categories, "perceptron_available", lambda: True)
    assert categories.Categorizer(tagger="auto").tagger == "perceptron"
    with pytest.raises(ValueError, match="tagger="):
        categories.Categorizer(tagger="spacy")


def test_category_mass_against_loop():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"delta": rng.normal(size=300) * 10.0 ** rng.integers(-9, -1, 300),
                       "category": rng.choice(["Math", "Template", "Reasoning"], 300),
                       "update": rng.choice(["a", "b"], 300)})
    out = categories.category_mass(df, "delta", by=("update",), eps=1e-6).set_index(["update", "category"])
    for u in ("a", "b"):
        tot = sum(d for d, uu in zip(df.delta, df["update"]) if uu == u and d > 0)
        for c in categories.CATEGORIES:
            rows = [d for d, uu, cc in zip(df.delta, df["update"], df.category) if uu == u and cc == c]
            b = sum(d for d in rows if d > 0)
            s = sum(-d for d in rows if d < 0)
            r = out.loc[(u, c)]
            assert r.boosted_mass == pytest.approx(b, rel=1e-12, abs=1e-300)
            assert r.suppressed_mass == pytest.approx(s, rel=1e-12, abs=1e-300) and r.n_tokens == len(rows)
            assert r.n_boosted == sum(d > 1e-6 for d in rows)
            assert abs(r.boosted_share - b / tot) < 1e-12
    assert out.loc[("a", "Other")].n_tokens == 0  # every category listed


def test_tag_table_matches_batch(cz, tiny_tok):
    model, tok = policy.load_policy("data/policies/tiny-m")
    batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=3, G=2, source=RAW),
                           problems=tasks.sample_problems(3, seed=1), seed=1)
    st = measure.token_stats(model, batch, KNOBS)
    df = measure.token_table(batch, st, tokenizer=tok)
    ref = cz.tag_batch(batch, tok)
    shuffled = df.sample(frac=1.0, random_state=0)
    got = cz.tag_table(shuffled, tok)
    assert (got.loc[df.index, "category"].to_numpy() == ref.category.to_numpy()).all()
    # against the hand labels of the tiny vocabulary (pieces of a sampled response may break the
    # scaffold, so only scaffold-free tokens are checked here)
    for t, c in zip(df.token, ref.category):
        if t in TINY_MATH:
            assert c == "Math"
        elif t in TINY_REASONING:
            assert c == "Reasoning"


def test_naive_reference_agrees_without_context(cz, tiny_tok):
    trace = tasks.make_trace(tasks.sample_problems(1, seed=9)[0], random.Random(9))
    pieces = trace.split()
    fast, _ = cz.tag_pieces(pieces, "wordpiece", frozenset({"<eos>"}))
    slow = categories.tag_naive(pieces, "wordpiece", cz, frozenset({"<eos>"}))
    context = {"}", "So", "Thus", "Hence", "the", "is"}  # need the phrase / brace context
    assert len([p for p in pieces if p not in context]) > 30
    assert all(f == s for p, f, s in zip(pieces, fast, slow) if p not in context)
    assert any(f != s for p, f, s in zip(pieces, fast, slow) if p in context)


def test_padded_vocabulary_ids_are_tagged_not_an_index_error(tok):
    """Qwen's model vocabulary is padded past the tokenizer: a sampled padded id must not crash tagging."""
    cz = categories.Categorizer(tagger="shipped")
    ids = tok("Q: 4 7 + 3 8", add_special_tokens=False)["input_ids"]
    padded = len(tok) + 5
    cats, words = cz.tag_ids([ids + [padded]], tok)[0]
    assert len(cats) == len(ids) + 1 and words[-1] == f"<pad:{padded}>"
    assert cats[:-1] == cz.tag_ids([ids], tok)[0][0]  # the real tokens are tagged as without it


# Role tagging of the tiny task (data/categories/arithmetic_roles.csv), labelled by hand:
# computed digits, the digit written, carry/borrow amounts and words, the boxed answer = R(easoning);
# operands, operators, '=' and the carry-in = M(ath); scaffold wording and punctuation = T(emplate).
ROLE_TRACES = [
    ("First ones digit : 7 + 8 = 1 5 , write 5 carry 1 . Next tens digit : 4 + 3 + 1 = 8 , write 8 no carry . "
     "So the answer is \\boxed{ 8 5 } <eos>",
     "T T T T M M M M R R T T R R R T T T T T M M M M M M R T T R R R T T T T T T R R T T"),
    ("Begin ones column : borrow 1 , 1 4 - 6 = 8 , keep 8 . Then tens place : 8 - 2 - 1 = 5 , put 5 . "
     "Hence the result is \\boxed{ 5 8 } <eos>",
     "T T T T R R T M M M M M R T T R T T T T T M M M M M M R T T R T T T T T T R R T T"),
    ("Start ones digit : 5 * 3 = 1 5 , put 5 carry 1 . Now tens column : 9 * 3 + 1 = 2 8 , write 2 8 . "
     "Finally put 1 . Thus the answer is \\boxed{ 2 8 5 } <eos>",
     "T T T T M M M M R R T T R R R T T T T T M M M M M M R R T T R R T T T R T T T T T T R R R T T"),
]


def test_role_tags_match_hand_labels(tiny_tok):
    cz = categories.Categorizer(categories.ROLES_MAP, tagger="shipped")
    ids = [tiny_tok(t, add_special_tokens=False).input_ids for t, _ in ROLE_TRACES]
    for (trace, labels), (cats, _) in zip(ROLE_TRACES, cz.tag_ids(ids, tiny_tok)):
        assert len(labels.split()) == len(trace.split()) == len(cats)
        got = " ".join(c[0] for c in cats)
        assert got == labels, f"{trace}\n want {labels}\n got  {got}"


def _roles_by_grammar(trace):
    """An independent labelling: parse each column step of make_trace's grammar with one regex."""
    toks = trace.split()
    lab = ["M" if t == "=" else "T" if t not in TINY_MATH and t not in TINY_REASONING else None for t in toks]
    step = re.compile(r"(?:\S+ \S+ \S+ : (?:(borrow) (1) , )?([\d+\-* ]+?) = ([\d ]+?) , \S+ ([\d ]+?)"
                      r"(?: (carry) ([\d ]+)| (no) (carry))? \.)|(?:\S+ \S+ ([\d ]+) \.)|(?:\\boxed\{ ([\d ]+) \})")
    text = " ".join(toks)
    # map character offsets to token indices
    starts = np.cumsum([0] + [len(t) + 1 for t in toks[:-1]])
    groups = dict(zip("borrow amt expr res wr carry camt no nocarry final boxed".split(), range(1, 12)))
    for m in step.finditer(text):
        for name, g in groups.items():
            if m.group(g) is None:
                continue
            a, b = m.span(g)
            for k in np.flatnonzero((starts >= a) & (starts < b)):
                lab[k] = "M" if name == "expr" else "R"
    return " ".join(map(str, lab))


def test_role_tags_match_grammar_parse_on_generated_traces(tiny_tok):
    cz = categories.Categorizer(categories.ROLES_MAP, tagger="shipped")
    rng = random.Random(11)
    problems = tasks.sample_problems(120, seed=11)
    traces = [tasks.make_trace(p, rng, error_rate=0.5) for p in problems]
    ids = [tiny_tok(t, add_special_tokens=False).input_ids for t in traces]
    n_reasoning_digits = 0
    for trace, (cats, _) in zip(traces, cz.tag_ids(ids, tiny_tok)):
        want = _roles_by_grammar(trace)
        assert "None" not in want.split(), trace
        assert " ".join(c[0] for c in cats) == want, trace
        n_reasoning_digits += sum(c == "Reasoning" and t.isdigit() for t, c in zip(trace.split(), cats))
    assert n_reasoning_digits > 1000


def test_include_and_span_rows(tmp_path):
    (tmp_path / "base.csv").write_text("rule,key,value\nregex,\\d+,Math\n")
    (tmp_path / "roles.csv").write_text('rule,key,value\ninclude,base.csv,\nspan,"is ... ,",Reasoning\n')
    cz = categories.Categorizer(tmp_path / "roles.csv", tagger="shipped")
    assert cz.word_categories([["x", "is", "4", "2", ",", "5"]])[0][2:] == ["Reasoning", "Reasoning", "Other", "Math"]
    (tmp_path / "cycle.csv").write_text("rule,key,value\ninclude,cycle.csv,\n")
    with pytest.raises(ValueError, match="include cycle"):
        categories.load_map(tmp_path / "cycle.csv")
    (tmp_path / "badspan.csv").write_text("rule,key,value\nspan,is,Reasoning\n")
    with pytest.raises(ValueError, match=r"badspan\.csv:2: a span key"):
        categories.load_map(tmp_path / "badspan.csv")


def test_share_shift_against_loop():
    from scipy import stats as ss
    rng = np.random.default_rng(0)
    n, cats = 600, ["Math", "Template", "Reasoning"]
    df = pd.DataFrame(dict(batch=rng.integers(0, 5, n), category=rng.choice(cats, n),
                           delta_positive_only=rng.normal(size=n), delta_grpo=rng.normal(size=n)))
    mass, summary, shift = categories.share_shift(df)
    for b in range(5):
        d = df[df.batch == b]
        for c in cats:
            share = {}
            for u in ("positive_only", "grpo"):
                tot = sum(max(x, 0.0) for x in d[f"delta_{u}"])
                share[u] = sum(max(x, 0.0) for x, cc in zip(d[f"delta_{u}"], d.category) if cc == c) / tot
            assert shift.loc[b, c] == pytest.approx(share["grpo"] - share["positive_only"], abs=1e-12)
    x = shift["Template"].to_numpy()
    h = ss.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    s = categories.shift_summary(shift).set_index("category")
    assert s.loc["Template", "lo"] == pytest.approx(x.mean() - h) and s.loc["Template", "n"] == 5
    m = summary.set_index(["update", "category", "measure"]).loc[("grpo", "Math", "boosted_mass")]
    per_batch = [df[(df.batch == b) & (df.category == "Math")].delta_grpo.clip(lower=0).sum() for b in range(5)]
    assert m["mean"] == pytest.approx(np.mean(per_batch))


def test_fig04_mass_ratios_and_the_trimmed_ones_by_a_loop():
    """fig04_claims.mass_ratios against loops: per batch the boosted / suppressed mass of each update (after leaving
    out the batch's tokens above its 99% |Δ| quantile, per update, when trimmed), the log ratio, its mean, exp."""
    import math

    import numpy as np
    import pandas as pd

    from cancellation.figures import fig04_claims
    rng = np.random.default_rng(0)
    n = 400
    t = pd.DataFrame(dict(batch=rng.integers(0, 4, n), category=rng.choice(["Template", "Reasoning", "Math"], n),
                          delta_positive_only=rng.standard_t(2, n), delta_grpo=rng.standard_t(2, n)))
    for trim in (0.0, 0.01):
        got = fig04_claims.mass_ratios(t, trim)
        for kind in ("boosted", "suppressed"):
            for cat in ("all", "Template"):
                logs = []
                for b in sorted(set(t.batch)):
                    m = {}
                    for u in ("positive_only", "grpo"):
                        d = [x for x in t[t.batch == b][f"delta_{u}"]]
                        c = [y for y in t[t.batch == b].category]
                        cut = np.quantile(np.abs(d), 1 - trim) if trim else math.inf
                        m[u] = sum(max(x if kind == "boosted" else -x, 0.0) for x, y in zip(d, c)
                                   if abs(x) <= cut and (cat == "all" or y == cat))
                    if m["grpo"] > 0 and m["positive_only"] > 0:
                        logs.append(math.log(m["grpo"] / m["positive_only"]))
                assert got[(kind, cat)] == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-10), (trim, kind, cat)
