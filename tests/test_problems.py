"""Problem files (three shapes), prompt rendering and math-verify rewards (sources.ProblemSource)."""
import json
import threading

import numpy as np
import pandas as pd
import pytest

from cancellation import extract, grader, sources, tasks

DAPO_INSTR = ("Solve the following math problem step by step. The last line of your response should be of the "
              "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def dapo_row(question, answer, idx=0):
    """One row of verl's DAPO-Math-17k parquet schema."""
    return {"data_source": "math_dapo",
            "prompt": [{"role": "user", "content": DAPO_INSTR + question + "\n\nRemember to put your answer on its own "
                        "line after \"Answer:\"."}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule"},
            "extra_info": {"index": str(idx)}}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------ loaders

def test_dapo_parquet_is_deduplicated_in_first_occurrence_order(tmp_path):
    qs = [("What is 3+4?", "7"), ("Find x if 2x=10.", "5"), ("Compute 6*7.", "42")]
    # Like the real file: the prompts repeated many times, interleaved.
    rows = [dapo_row(q, a, i) for i, (q, a) in enumerate(qs)] * 5 + [dapo_row(*qs[1], 1)]
    f = tmp_path / "dapo-math-17k.parquet"
    pd.DataFrame(rows).to_parquet(f)
    problems = sources.ProblemSource(str(f)).load()
    assert len(problems) == 3
    assert [p.answer for p in problems] == ["7", "5", "42"]
    assert problems[0].prompt.startswith(DAPO_INSTR + "What is 3+4?")  # DAPO's instruction kept
    assert "Answer:" in problems[0].prompt and problems[0].kind == "dapo-math-17k"
    # Same prompt with another answer is an error naming both rows (not a second problem).
    pd.DataFrame(rows + [dapo_row("What is 3+4?", "8")]).to_parquet(f)
    with pytest.raises(sources.ProblemFileError, match=r"dapo-math-17k\.parquet: row 1 and row 17: one prompt with two answers \('7' and '8'\)"):
        sources.ProblemSource(str(f)).load()


def test_dapo_messages_as_numpy_arrays_and_integer_ground_truth():
    # pandas hands parquet list columns back as numpy arrays of dicts.
    msgs = np.array([{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}], dtype=object)
    p = sources._row_problem({"prompt": msgs, "reward_model": {"ground_truth": np.int64(2)}}, kind="k")
    assert p == tasks.Problem("1+1?", "2", "k")
    assert sources._answer_text(12.0) == "12" and sources._answer_text(0.5) == "0.5"
    assert sources._answer_text(None) is None and sources._answer_text(float("nan")) is None
    assert sources._answer_text("  ") is None


def test_dapo_jsonl_and_json_list(tmp_path):
    rows = [dapo_row("What is 3+4?", "7"), dapo_row("What is 3+4?", "7"), dapo_row("Compute 6*7.", "42")]
    assert [p.answer for p in sources.ProblemSource(str(write_jsonl(tmp_path / "d.jsonl", rows))).load()] == ["7", "42"]
    g = tmp_path / "d.json"
    g.write_text(json.dumps(rows, indent=1))
    assert [p.answer for p in sources.ProblemSource(str(g)).load()] == ["7", "42"]


def test_math500_answer_and_solution_only_with_nested_boxed(tmp_path):
    f = write_jsonl(tmp_path / "math500.jsonl", [
        {"problem": "Half of one?", "answer": "\\frac{1}{2}", "solution": "... \\boxed{0.5}", "level": 1},
        {"problem": "Simplify.", "solution": "First \\boxed{1}, then $\\boxed{\\frac{\\sqrt{3}}{2}}$."},
    ])
    a, b = sources.ProblemSource(str(f)).load()
    assert (a.prompt, a.answer) == ("Half of one?", "\\frac{1}{2}")  # 'answer' wins over the solution
    assert (b.prompt, b.answer) == ("Simplify.", "\\frac{\\sqrt{3}}{2}")  # last box, nested braces kept
    assert extract.last_boxed("\\boxed{1} and \\boxed{{a}{b}") is None  # unclosed last box


def test_math500_parquet(tmp_path):
    f = tmp_path / "test.parquet"
    pd.DataFrame({"problem": ["p1", "p2"], "solution": ["s \\boxed{3}", "t"], "answer": ["3", "x^2"]}).to_parquet(f)
    assert [(p.prompt, p.answer) for p in sources.ProblemSource(str(f)).load()] == [("p1", "3"), ("p2", "x^2")]


def test_plain_prompt_answer(tmp_path):
    f = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": "6"}])
    assert sources.ProblemSource(str(f)).load() == [tasks.Problem("2+2?", "4", "plain"), tasks.Problem("3+3?", "6", "plain")]


@pytest.mark.parametrize("name, content, place, expected", [
    ("missing.jsonl", [{"prompt": "ok", "answer": "1"}, {"question": "q", "answer": "2"}], "line 2", "'prompt'"),
    ("null.jsonl", [{"prompt": "ok", "answer": "1"}, {"prompt": "q", "answer": None}], "line 2", "non-empty 'answer'"),
    ("emptyans.jsonl", [{"prompt": "q", "answer": "  "}], "line 1", "non-empty 'answer'"),
    ("badprompt.jsonl", [{"prompt": "ok", "answer": "1"}, {"prompt": 5, "answer": "1"}], "line 2", "'prompt' to be text"),
    ("nouser.jsonl", [{"prompt": [{"role": "system", "content": "x"}], "answer": "1"}], "line 1", "user message"),
    ("dapo.jsonl", [dapo_row("q", "1"), {"prompt": "q", "reward_model": {"style": "rule"}}], "line 2",
     "reward_model.ground_truth"),
    ("nobox.jsonl", [{"problem": "q", "solution": "no box here"}], "line 1", "\\boxed{} answer in 'solution'"),
    ("list.json", [{"prompt": "ok", "answer": "1"}, ["not", "an", "object"]], "row 2", "expected an object"),
])
def test_malformed_files_name_file_row_and_expectation(tmp_path, name, content, place, expected):
    f = tmp_path / name
    if name.endswith(".jsonl"):
        write_jsonl(f, content)
    else:
        f.write_text(json.dumps(content))
    with pytest.raises(sources.ProblemFileError) as e:
        sources.ProblemSource(str(f)).load()
    msg = str(e.value)
    assert str(f) in msg and f": {place}:" in msg and expected in msg and "\n" not in msg
    assert "None" not in msg.split(expected)[0]  # a null answer is reported, not turned into text


def test_malformed_parquet_json_and_empty_files(tmp_path):
    f = tmp_path / "nullgt.parquet"
    pd.DataFrame([dapo_row("q", "1"), dapo_row("r", None)]).to_parquet(f)
    with pytest.raises(sources.ProblemFileError, match=r"nullgt\.parquet: row 2: .*ground_truth"):
        sources.ProblemSource(str(f)).load()
    g = tmp_path / "cols.parquet"
    pd.DataFrame({"question": ["q"], "final": ["1"]}).to_parquet(g)
    with pytest.raises(sources.ProblemFileError, match=r"cols\.parquet: row 1: expected columns .*found columns \['final', 'question'\]"):
        sources.ProblemSource(str(g)).load()
    h = tmp_path / "zero.parquet"
    pd.DataFrame({"prompt": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(h)
    with pytest.raises(sources.ProblemFileError, match=r"zero\.parquet: no rows"):
        sources.ProblemSource(str(h)).load()
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(sources.ProblemFileError, match=r"empty\.jsonl: no rows"):
        sources.ProblemSource(str(tmp_path / "empty.jsonl")).load()
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with pytest.raises(sources.ProblemFileError, match=r"bad\.jsonl: line 3: expected one JSON object per line"):
        sources.ProblemSource(str(tmp_path / "bad.jsonl")).load()
    (tmp_path / "bad.json").write_text('[{"prompt": "a",\n "answer": }]')
    with pytest.raises(sources.ProblemFileError, match=r"bad\.json: line 2: expected a JSON list"):
        sources.ProblemSource(str(tmp_path / "bad.json")).load()
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(sources.ProblemFileError, match=r"junk\.parquet: unreadable parquet"):
        sources.ProblemSource(str(tmp_path / "junk.parquet")).load()
    (tmp_path / "p.csv").write_text("prompt,answer\n")
    with pytest.raises(sources.ProblemFileError, match=r"p\.csv: expected a \.parquet, \.jsonl or \.json"):
        sources.ProblemSource(str(tmp_path / "p.csv")).load()
    with pytest.raises(FileNotFoundError):
        sources.ProblemSource(str(tmp_path / "missing.parquet")).load()
    assert issubclass(sources.ProblemFileError, ValueError)


@pytest.mark.parametrize("name, rows, places", [
    ("plain.jsonl", [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"},
                     {"prompt": "2+2?", "answer": "4"}, {"prompt": "2+2?", "answer": "5"}], "line 1 and line 4"),
    ("list.json", [{"prompt": "2+2?", "answer": 4}, {"prompt": "2+2?", "answer": 4.5}], "row 1 and row 2"),
    ("math500.jsonl", [{"problem": "q", "answer": "1"}, {"problem": "q", "solution": "\\boxed{2}"}], "line 1 and line 2"),
    ("dapo.jsonl", [dapo_row("q", "1"), dapo_row("r", "1"), dapo_row("q", "1"), dapo_row("q", "-1")],
     "line 1 and line 4"),
])
def test_one_prompt_with_two_answers_is_an_error_naming_both_rows(tmp_path, name, rows, places):
    f = tmp_path / name
    f.write_text(json.dumps(rows)) if name.endswith(".json") else write_jsonl(f, rows)
    with pytest.raises(sources.ProblemFileError) as e:
        sources.ProblemSource(str(f)).load()
    msg = str(e.value)
    assert msg.startswith(f"{f}: {places}: one prompt with two answers") and "\n" not in msg


def test_exact_duplicates_are_one_problem(tmp_path):
    f = write_jsonl(tmp_path / "dup.jsonl", [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": 6},
                                             {"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": "6"}])
    assert sources.ProblemSource(str(f)).load() == [tasks.Problem("2+2?", "4", "dup"), tasks.Problem("3+3?", "6", "dup")]


@pytest.mark.parametrize("name, text, place, shown", [
    ("big.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": 1e400}\n', "line 2", "inf"),
    ("neg.jsonl", '{"prompt": "b", "answer": -Infinity}\n', "line 1", "-inf"),
    ("nan.jsonl", '{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": NaN}\n', "line 2", "nan"),
    ("dapo.jsonl", '{"prompt": "b", "reward_model": {"ground_truth": 1e999}}\n', "line 1", "inf"),
    ("math.json", '[{"problem": "p", "answer": 2}, {"problem": "q", "answer": 1e400, "solution": "\\\\boxed{1}"}]',
     "row 2", "inf"),
])
def test_non_finite_answer_is_an_error_naming_file_and_row(tmp_path, name, text, place, shown):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(sources.ProblemFileError) as e:
        sources.ProblemSource(str(f)).load()
    msg = str(e.value)
    assert msg.startswith(f"{f}: {place}: expected a finite ") and f"got {shown}" in msg


def test_non_finite_answer_in_parquet(tmp_path):
    f = tmp_path / "inf.parquet"
    pd.DataFrame({"prompt": ["a", "b"], "answer": [1.0, float("inf")]}).to_parquet(f)
    with pytest.raises(sources.ProblemFileError, match=r"inf\.parquet: row 2: expected a finite 'answer'; got inf"):
        sources.ProblemSource(str(f)).load()


@pytest.mark.parametrize("name", ["latin1.jsonl", "latin1.json", "list.json"])
def test_non_utf8_file_is_an_error_naming_the_file(tmp_path, name):
    f = tmp_path / name
    body = '{"prompt": "Caf\u00e9: 2+2?", "answer": "4"}'
    f.write_bytes((f"[{body}]" if name == "list.json" else body + "\n").encode("latin-1"))
    with pytest.raises(sources.ProblemFileError) as e:
        sources.ProblemSource(str(f)).load()
    assert str(e.value).startswith(f"{f}: not UTF-8 text (byte ") and not isinstance(e.value, UnicodeDecodeError)


# ------------------------------------------------------------------------------------ draw / params

def test_generated_draw_equals_sample_problems():
    src = sources.ProblemSource()
    assert src.draw(40, seed=7) == tasks.sample_problems(40, seed=7)
    sub = sources.ProblemSource(kinds=["mul21"])
    assert sub.draw(10, seed=3) == tasks.sample_problems(10, seed=3, kinds=("mul21",))
    assert sub.fingerprint() == "arith:mul21" and src.load() == [] and src.verifier() is tasks.verify


def test_file_draw_is_a_seeded_sample_without_replacement(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)])
    src = sources.ProblemSource(str(f))
    a = src.draw(10, seed=4)
    assert a == src.draw(10, seed=4) and len({p.prompt for p in a}) == 10
    import random
    assert [p.prompt for p in a] == [f"q{i}" for i in random.Random(4).sample(range(30), 10)]
    assert len(src.draw(100, seed=1)) == 30


def test_params_and_fingerprint_follow_file_bytes(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "answer": "1"}])
    src = sources.ProblemSource(str(f), prompt_format="raw")
    p1 = src.params()
    import hashlib
    assert p1["fingerprint"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert json.loads(json.dumps(p1)) == p1 and p1["prompt_format"] == "raw"
    assert src.load()[0].answer == "1"
    write_jsonl(f, [{"prompt": "q", "answer": "2"}, {"prompt": "r", "answer": "3"}])
    assert src.params()["fingerprint"] != p1["fingerprint"]
    assert [p.answer for p in src.load()] == ["2", "3"]  # the load cache follows the file too
    assert sources.ProblemSource(str(f), prompt_format="chat").params() != src.params()
    with pytest.raises(ValueError, match="prompt_format"):
        sources.ProblemSource(prompt_format="jinja")


# ------------------------------------------------------------------------------------ rendering

@pytest.fixture(scope="module")
def chat_tok():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.WordLevel({"<unk>": 0, "1+1?": 1}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")
    tok.chat_template = CHATML
    return tok


def test_render_raw_auto_chat(chat_tok, tok):
    p = tasks.Problem("1+1?", "2")
    expected = "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    assert sources.ProblemSource(prompt_format="auto").render(p, chat_tok) == expected
    assert sources.ProblemSource(prompt_format="chat").render(p, chat_tok) == expected
    assert sources.ProblemSource(prompt_format="raw").render(p, chat_tok) == "1+1?"
    # The tiny word-level tokenizer has no template: 'auto' leaves the arithmetic prompt unchanged.
    q = tasks.sample_problems(1, seed=0)[0]
    assert sources.ProblemSource().render(q, tok) == q.prompt
    with pytest.raises(ValueError, match="chat template"):
        sources.ProblemSource(prompt_format="chat").render(q, tok)


# ------------------------------------------------------------------------------------ math-verify

def test_math_verifier_grades_answer_lines_and_boxes():
    v = grader.MathVerifier()
    half, twelve = tasks.Problem("q", "0.5"), tasks.Problem("q", "12")
    assert v(half, "so it is \\boxed{\\frac{1}{2}}") == 1.0
    assert v(tasks.Problem("q", "\\frac{1}{2}"), "Answer: 0.5") == 1.0
    assert v(twelve, "Let me think.\nAnswer: 12") == 1.0
    assert v(twelve, "Answer: $12$.") == 1.0
    assert v(twelve, "I get \\boxed{12}.") == 1.0
    assert v(twelve, "I get \\boxed{13}.") == 0.0
    assert v(twelve, "Answer: 13\nAnswer: 12") == 1.0  # the last Answer line counts
    assert v(twelve, "Answer: 12\nAnswer: 13") == 0.0
    assert v(twelve, "Answer: 13 but \\boxed{12}") == 1.0  # either candidate may match
    assert v(tasks.Problem("q", "2\\pi"), "Answer: 2\\pi") == 1.0  # bare LaTeX in the Answer line
    assert v(tasks.Problem("q", "\\frac{\\sqrt{3}}{2}"), "\\boxed{\\frac{\\sqrt{3}}{2}}") == 1.0
    assert v.stats == {"graded": 11, "unparsed_response": 0, "unparsed_gold": 0, "errors": 0, "as_words": 0,
                       "too_long": 0, "timeouts": 0}


def test_math_verifier_counts_unparseable_and_never_raises():
    v = grader.MathVerifier()
    twelve = tasks.Problem("q", "12")
    assert v(twelve, "I don't know, sorry") == 0.0
    assert v(twelve, "Answer: ???") == 0.0
    assert v.stats == {"graded": 2, "unparsed_response": 2, "unparsed_gold": 0, "errors": 0, "as_words": 0,
                       "too_long": 0, "timeouts": 0}
    assert v(tasks.Problem("q", "}"), "\\boxed{12}") == 0.0
    assert v(tasks.Problem("q", "???"), "\\boxed{???}") == 0.0  # a string-only parse is not math
    assert v.stats["unparsed_gold"] == 2 and v.stats["graded"] == 4

    def boom(*a, **k):
        raise RuntimeError("math-verify blew up")
    v._verify = boom
    assert v(twelve, "\\boxed{12}") == 0.0 and v.stats["errors"] == 1


def test_math_verifier_runs_in_a_worker_thread():
    # math-verify's signal timeouts only work in the main thread; the verifier must switch them off.
    v, out = grader.MathVerifier(), []
    th = threading.Thread(target=lambda: out.append(v(tasks.Problem("q", "12"), "Answer: 12")))
    th.start()
    th.join()
    assert out == [1.0] and v.stats["errors"] == 0


def test_file_source_uses_one_math_verifier(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "answer": "1"}])
    src = sources.ProblemSource(str(f))
    v = src.verifier()
    assert isinstance(v, grader.MathVerifier) and src.verifier() is v
    assert sources.ProblemSource().verifier() is tasks.verify   # the generated task: the exact check


def test_answer_candidates():
    assert extract.answer_candidates("x\nAnswer: $\\frac{1}{2}$.\n") == ["\\boxed{\\frac{1}{2}}"]
    assert extract.answer_candidates("Answer: \\boxed{3}") == ["\\boxed{3}"]
    assert extract.answer_candidates("nothing") == []


def test_reward_report_counts_what_math_verify_could_not_parse(tmp_path):
    p = tmp_path / "plain.jsonl"
    p.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    src = sources.ProblemSource(path=str(p))
    (prob,) = src.load()
    v = src.verifier()
    assert v(prob, "Answer: 2") == 1.0 and v(prob, "no answer here") == 0.0
    assert src.reward_report() == ("math-verify (answer_mode answer_line+boxed): 2 responses graded (50.0% had an answer); counted as wrong because unparseable: "
                                   "1 responses, 0 gold answers; 0 errors")
    assert sources.ProblemSource().reward_report() == ""


# ------------------------------------------------------------------ free-form golds (issue: real answers)

def test_word_golds_are_compared_as_words_not_as_products_of_letters():
    v = grader.MathVerifier()
    no, yes = tasks.Problem("q", "No"), tasks.Problem("q", "\\text{Yes}")
    assert v(no, "Answer: On") == 0.0            # math-verify alone: N*o == O*n, rewarded
    assert v._verify(v._gold_for("No"), v._parsed("\\boxed{On}"))   # (that is what this guards against)
    assert v(no, "Answer: no.") == 1.0 and v(no, "so \\boxed{\\text{No}}") == 1.0
    assert v(yes, "Answer: Yes") == 1.0 and v(yes, "Answer: No") == 0.0
    assert v(tasks.Problem("q", "infinitely many"), "Answer: Infinitely many") == 1.0
    assert v(no, "I think not") == 0.0 and v.stats["unparsed_response"] == 1 and v.stats["as_words"] == 7
    for math_gold in ("x", "2\\pi", "pi", "(A)", "3", "\\frac{1}{2}"):
        assert extract.word_answer(math_gold) is None, math_gold


def test_numbers_are_stored_as_written(tmp_path):
    f = tmp_path / "n.jsonl"
    f.write_text('{"prompt": "a", "answer": 0.00005}\n{"prompt": "b", "answer": 12345678901234567890.0}\n'
                 '{"prompt": "c", "answer": 0.50}\n{"prompt": "d", "answer": 1.5e3}\n{"prompt": "e", "answer": 12.0}\n')
    got = [p.answer for p in sources.ProblemSource(str(f)).load()]
    assert got == ["0.00005", "12345678901234567890", "0.50", "1500", "12"]
    assert sources._answer_text(5e-05) == "0.00005"     # a float from parquet: no exponent either
    v = grader.MathVerifier()
    assert v(tasks.Problem("q", got[0]), "\\boxed{0.00005}") == 1.0


def test_gold_check_names_what_can_never_be_rewarded(tmp_path):
    golds = {"12": "ok", "No": "words", "Yes": "words", "???": "unparseable",
             "Σ i³, or equivalently (n(n+1)/2)²": "constant", "x = 1": "ok", "\\sum_{i=1}^{3} i": "ok",
             "3 is the only possible value": None, "\\frac{1}{2}": "ok"}
    rows = [{"prompt": f"problem {i}", "answer": g} for i, g in enumerate(golds)]
    f = write_jsonl(tmp_path / "golds.jsonl", rows)
    src = sources.ProblemSource(str(f))
    # the parse math-verify gave this gold on real data (1: a misread); here it finds nothing, so it is
    # handed the real-data parse, and the rule (words + a constant the text does not state) is what is tested
    import sympy
    sigma = "Σ i³, or equivalently (n(n+1)/2)²"
    v0 = grader.MathVerifier()
    v0._gold[sigma] = [sympy.Integer(1), sigma]
    check = grader.gold_check(list(golds), v0)
    assert check["constant"] == [sigma]
    line = grader.gold_line(check, "ids.csv")
    # brute force over the golds: each gold's own verdict, recomputed here one by one
    v = grader.MathVerifier()
    for g in golds:
        if extract.word_answer(g) is not None:
            continue
        self_ok = bool(v._gold_for(g)) and (v(tasks.Problem("q", g), f"Answer: {g}") or
                                            v(tasks.Problem("q", g), f"\\boxed{{{g}}}"))
        flagged = any(g in check[k] for k in ("unparseable", "reject_themselves", "constant", "reject_short"))
        if not self_ok:
            assert flagged, g
    assert check["n"] == 9 and check["words"] == 2
    assert check["unparseable"] == ["???"]
    # math-verify reads it as 3·E·E·a·b·...; the grader reads its short form, 3, and credits `Answer: 3`
    assert check["reject_short"] == [] and v(tasks.Problem("q", "3 is the only possible value"), "Answer: 3") == 1.0
    assert not check["reject_themselves"]
    bad = sum(len(check[k]) for k in ("unparseable", "reject_themselves", "constant", "reject_short"))
    assert line.startswith(f"gold answers: 9 distinct, 2 compared as words; {bad} can never be rewarded")
    assert line.count("\n") == 0 and "listed in ids.csv" in line
    line = src.check_golds(out_dir=tmp_path)    # the file's own check (math-verify's own parses): its ids file
    check = grader.gold_check(list(golds))
    bad = sum(len(check[k]) for k in ("unparseable", "reject_themselves", "constant", "reject_short"))
    assert f"{bad} can never be rewarded" in line and str(tmp_path) in line
    ids = list(tmp_path.glob("golds-*.csv"))
    assert len(ids) == 1
    listed = ids[0].read_text().splitlines()
    assert listed[0] == "problem,answer,why" and len(listed) == 1 + bad
    assert any(r.startswith("3,???,unparseable") for r in listed)
