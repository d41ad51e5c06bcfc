"""The reward's named answer-extraction modes (`answer_mode`) and the refusal of a problem file whose golds
the reward can never credit (`unrewardable_golds`): each mode on responses written in each style, the
default exactly the grader before modes had names (same rewards, same cache keys), the mode reaching every
reward call (verifier, TRL reward function, value cache id, held-out sets), and one-line errors."""
import dataclasses
import json

import pytest

from cancellation import execute, extract, grader, manifest, profiles, resolve, sources, tasks, train, value
from cancellation.engine import data as engine_data
from cancellation.figures import base, fig02, fig05, fig07

# Responses in the styles real models write, against the gold 12 (and 13 never appears in the
# final sentence unless it is the claimed answer).
STYLES = {
    "answer_line": "Add them up: 7 + 5.\nAnswer: 12",
    "boxed": "Add them up: 7 + 5 gives $\\boxed{12}$",
    "sentence": "Adding 7 and 5 gives the total.\nSo the final answer is 12.",
    "answer_line_boxed": "Work.\nAnswer: $\\boxed{12}$",
    "wrong_box_right_line": "I first thought \\boxed{13}.\nAnswer: 12\nDone, that was it.",
    "none": "I am not sure how to do this one",
}
# The reward each mode gives each style, written out by hand (not by the code under test).
EXPECTED = {
    "answer_line":       {"answer_line": 1, "boxed": 0, "sentence": 0, "answer_line_boxed": 1,
                          "wrong_box_right_line": 1, "none": 0},
    "boxed":             {"answer_line": 0, "boxed": 1, "sentence": 0, "answer_line_boxed": 1,
                          "wrong_box_right_line": 0, "none": 0},
    "last_sentence":     {"answer_line": 1, "boxed": 1, "sentence": 1, "answer_line_boxed": 1,
                          "wrong_box_right_line": 0, "none": 0},
    "answer_line+boxed": {"answer_line": 1, "boxed": 1, "sentence": 0, "answer_line_boxed": 1,
                          "wrong_box_right_line": 1, "none": 0},
    "answer_line+boxed+last_sentence": {"answer_line": 1, "boxed": 1, "sentence": 1, "answer_line_boxed": 1,
                                        "wrong_box_right_line": 1, "none": 0},
}

# Styles in which a mode finds no answer math-verify can read ('none' everywhere; "Done, that was it." is
# the last sentence of wrong_box_right_line).
UNREAD = {"answer_line": 3, "boxed": 3, "last_sentence": 2, "answer_line+boxed": 2, "answer_line+boxed+last_sentence": 1}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_each_mode_on_each_style(mode):
    v = grader.MathVerifier(mode=mode)
    got = {s: v(tasks.Problem("q", "12"), r) for s, r in STYLES.items()}
    assert got == EXPECTED[mode]
    # a wrong answer in the same style is never rewarded
    for r in STYLES.values():
        assert v(tasks.Problem("q", "41"), r) == 0.0
    # coverage: the styles a mode finds no readable answer in (twice: gold 12, then 41), by hand
    assert v.stats["unparsed_response"] == 2 * UNREAD[mode]


def test_auto_is_the_grader_before_modes_had_names():
    auto, explicit = grader.MathVerifier(), grader.MathVerifier(mode="answer_line+boxed")
    assert auto.mode == explicit.mode == extract.FILE_MODE == "answer_line+boxed"
    for r in STYLES.values():
        assert auto(tasks.Problem("q", "12"), r) == explicit(tasks.Problem("q", "12"), r)
    # its candidates are the ones answer_candidates always gave
    assert extract.answer_candidates("x\nAnswer: $\\frac{1}{2}$.\n") == ["\\boxed{\\frac{1}{2}}"]
    assert extract.answer_candidates("Answer: \\boxed{3}") == ["\\boxed{3}"]
    # cache keys at the default are the old ones: no mode in the verifier id, the source or the params
    assert "mode=" not in value.verifier_id(auto)
    assert value.verifier_id(grader.MathVerifier(mode="boxed")).endswith(" mode=boxed")
    assert "answer_mode" not in sources.ProblemSource().params()
    assert "unrewardable_golds" not in sources.ProblemSource().params()
    assert sources.ProblemSource(answer_mode="boxed").params()["answer_mode"] == "boxed"
    for mod in (fig02, fig05):
        assert "answer_mode" not in mod.Params().cache_params() and "unrewardable_golds" not in mod.Params().cache_params()
        assert mod.Params(answer_mode="last_sentence").cache_params()["answer_mode"] == "last_sentence"
    # the generated task keeps its exact check
    assert sources.ProblemSource().verifier() is tasks.verify


def test_words_in_the_last_sentence():
    v = grader.MathVerifier(mode="last_sentence")
    no = tasks.Problem("q", "No")
    assert v(no, "Checking both cases. So the answer is No.") == 1.0
    assert v(no, "Checking both cases. So the answer is On.") == 0.0
    assert v(no, "Checking.\n\\text{No}") == 1.0
    assert v(no, "There is no such number, so it is impossible. The answer is yes") == 0.0


def test_last_sentence_is_the_final_sentence_with_a_letter_or_digit():
    assert extract.last_sentence("First. Then 3.5 is it.\n$$\n") == "Then 3.5 is it."
    assert extract.last_sentence("  \n$$ \n") is None


def test_unknown_mode_is_one_line_listing_the_valid_ones():
    with pytest.raises(ValueError) as e:
        sources.ProblemSource(answer_mode="boxd")
    msg = str(e.value)
    assert "\n" not in msg and "'boxd'" in msg
    assert all(m in msg for m in extract.ANSWER_MODES)
    with pytest.raises(ValueError, match="answer_mode='sentence'"):
        grader.MathVerifier(mode="sentence")
    # from the command line / a profile: the runner's schema refuses it before anything runs
    with pytest.raises(profiles.ParameterError) as e:
        resolve.resolve_params(profiles.find_notebook("05"), "tiny", {"answer_mode": "boxd"})
    assert "answer_mode" in str(e.value) and "last_sentence" in str(e.value)


def test_the_mode_reaches_every_reward_call(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "7+5?", "answer": "12"}) + "\n")
    # from a profile's parameters to the source the figure builds
    params = resolve.resolve_params(profiles.find_notebook("05"), "tiny", {"answer_mode": "boxed", "problems_path": str(f)})
    P = fig05.Params(**{k: v for k, v in params.items() if k not in profiles.INJECTED})
    src = base.problem_source(P)
    assert src.answer_mode == "boxed" and src.verifier().mode == "boxed"
    # the TRL reward function grades with it
    reward = engine_data.reward_function(src)
    assert reward(["7+5?"] * 2, ["Answer: 12", "so \\boxed{12}"], ["12"] * 2, ["file"] * 2) == [0.0, 1.0]
    # the value cache keys on it
    assert value.verifier_id(src.verifier()) != value.verifier_id(grader.MathVerifier())
    # held-out sets, files and generated, are graded as the training rewards are
    assert train.eval_source(str(f), src).answer_mode == "boxed"
    assert train.eval_source("easy", src).verifier().mode == "boxed"
    # the generated task with a named mode is graded by math-verify with that extraction
    arith = sources.ProblemSource(answer_mode="answer_line")
    assert arith.verifier()(tasks.Problem("Q: 7 + 5 = ? A:", "12"), "Answer: 12") == 1.0
    assert arith.reward_report().startswith("math-verify (answer_mode answer_line): 1 responses graded")


# ------------------------------------------------------------------------- golds that can never be rewarded
def _golds_file(tmp_path):
    rows = [{"prompt": "a", "answer": "12"}, {"prompt": "b", "answer": "???"},
            {"prompt": "c", "answer": "sum_(k=1)^n 1/k"}, {"prompt": "d", "answer": "7"},
            {"prompt": "e", "answer": "No"}]
    f = tmp_path / "golds.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_refuse_is_the_default_and_names_the_count_and_the_file(tmp_path):
    src = sources.ProblemSource(str(_golds_file(tmp_path)))
    assert src.unrewardable_golds == "refuse"
    with pytest.raises(sources.UnrewardableGolds) as e:
        src.admit(out_dir=tmp_path)
    msg = str(e.value)
    ids = tmp_path / f"golds-{src.fingerprint()[:12]}.csv"
    assert "\n" not in msg and msg.startswith(f"{src.path}: 2 of 5 problems have a gold")
    assert str(ids) in msg and "'skip'" in msg and "'allow'" in msg
    assert ids.read_text().splitlines() == ["problem,answer,why", "1,???,unparseable",
                                           "2,sum_(k=1)^n 1/k,constant"]
    assert isinstance(e.value, sources.ProblemFileError)
    assert type(e.value).__name__ in execute.ONE_LINE_STOPS   # the runner prints it alone, as NoSignal


def test_skip_drops_those_problems_and_says_how_many(tmp_path):
    src = sources.ProblemSource(str(_golds_file(tmp_path)), unrewardable_golds="skip")
    line = src.admit(out_dir=tmp_path)
    assert line.endswith("; unrewardable_golds skip: 2 of 5 problems dropped, 3 left") and "\n" not in line
    assert [p.answer for p in src.load()] == ["12", "7", "No"]
    assert sorted(p.answer for p in src.draw(10, seed=0)) == ["12", "7", "No"]
    assert src.params()["unrewardable_golds"] == "skip"      # other problems: another cache key
    allow = sources.ProblemSource(str(_golds_file(tmp_path)), unrewardable_golds="allow")
    assert allow.admit(out_dir=tmp_path).endswith("2 of 5 problems kept though never rewarded")
    assert len(allow.load()) == 5 and "unrewardable_golds" not in allow.params()
    with pytest.raises(ValueError, match="unrewardable_golds='drop'; expected one of refuse, skip, allow"):
        sources.ProblemSource(unrewardable_golds="drop")


def test_skip_with_nothing_left_is_one_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"prompt": "a", "answer": "???"}) + "\n")
    with pytest.raises(sources.UnrewardableGolds, match="left no problem"):
        sources.ProblemSource(str(f), unrewardable_golds="skip").load()


def test_clean_files_pass_untouched(tmp_path):
    f = tmp_path / "ok.jsonl"
    f.write_text(json.dumps({"prompt": "a", "answer": "12"}) + "\n")
    line = sources.ProblemSource(str(f)).admit(out_dir=tmp_path)
    assert line == "gold answers: 1 distinct, 0 compared as words; each one is rewarded against its own text"
    assert sources.ProblemSource().admit() == ""


def test_a_figure_refuses_before_any_model_loads(tmp_path):
    P = fig02.Params(problems_path=str(_golds_file(tmp_path)), model_path=str(tmp_path / "no-model"))
    with pytest.raises(sources.UnrewardableGolds, match="2 of 5 problems"):
        fig02.compute(P)       # the model path does not exist: the refusal comes first


def test_07s_held_out_files_pass_the_same_gold_check_before_any_run(tmp_path, capsys):
    """A held-out file whose golds the reward can never credit would undercount every run's accuracy:
    07 refuses it (the default) before any model loads, or says it per `unrewardable_golds`."""
    clean = tmp_path / "ok.jsonl"
    clean.write_text(json.dumps({"prompt": "a", "answer": "12"}) + "\n")
    P = fig07.Params(problems_path=str(clean), eval_sets=[str(_golds_file(tmp_path))],
                     model_path=str(tmp_path / "no-model"))
    with pytest.raises(sources.UnrewardableGolds, match="golds.jsonl: 2 of 5 problems"):
        fig07.compute(P)       # the model path does not exist: the refusal comes first
    src = sources.ProblemSource(str(clean), unrewardable_golds="allow")
    capsys.readouterr()    # the training file's own line, printed before the refusal
    fig07.admit_eval_sets(dataclasses.replace(P, unrewardable_golds="allow"), src)
    out = capsys.readouterr().out
    assert out.startswith(f"held-out set {P.eval_sets[0]}: ") and out.rstrip().endswith("kept though never rewarded")
    assert train.eval_source(P.eval_sets[0], src).unrewardable_golds == "allow"


@pytest.mark.slow
def test_runner_prints_the_refusal_alone_and_promotes_nothing(tmp_path, canonical_standins):
    import subprocess
    import sys
    f = _golds_file(tmp_path)
    p = subprocess.run([sys.executable, "-m", "cancellation.run", "02", "--profile", "paper-smoke",
                        "-p", "problems_path", str(f)], capture_output=True, text=True, cwd=profiles.ROOT)
    assert p.returncode == 1
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert err[-1].startswith(f"error: 02_coupling_heatmaps stopped: {f}: 2 of 5 problems have a gold the reward "
                              "can never credit as written (listed in ")
    assert "Traceback" not in p.stderr and " cell" not in p.stderr     # no failing-cell listing
    assert not [x for x in p.stdout.splitlines() if "outputs in" in x]   # nothing promoted


def test_a_profiles_common_answer_mode_reaches_every_notebook(tmp_path, monkeypatch):
    from test_run import _profile
    _profile(tmp_path, monkeypatch, "common:\n  answer_mode: last_sentence\n  unrewardable_golds: skip\n")
    for nb in manifest.keys():
        p = resolve.resolve_params(profiles.find_notebook(nb), "mine")
        assert (p["answer_mode"], p["unrewardable_golds"]) == ("last_sentence", "skip"), nb
    _profile(tmp_path / "b", monkeypatch, "common:\n  answer_mode: last_line\n")
    with pytest.raises(profiles.ParameterError, match="answer_mode"):
        resolve.resolve_params(profiles.find_notebook("01"), "mine")


# Styles in which a mode finds an answer candidate at all (the coverage `with_answer` counts; by hand):
# last_sentence has one where the final sentence states an answer (not "Done, that was it." nor "I am not sure
# how to do this one"), answer_line reads the box on "Answer: $\boxed{12}$" when the mode has no boxed extractor.
WITH_CANDIDATE = {"answer_line": 3, "boxed": 3, "last_sentence": 4, "answer_line+boxed": 4,
                  "answer_line+boxed+last_sentence": 5}


@pytest.mark.parametrize("mode", list(WITH_CANDIDATE))
def test_coverage_counts_the_responses_holding_a_candidate(mode, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "What is 7+5?", "answer": "12"}) + "\n")
    assert sources.ProblemSource(str(f), answer_mode=mode).with_answer(list(STYLES.values())) == WITH_CANDIDATE[mode]
    assert sources.ProblemSource().with_answer(list(STYLES.values())) is None   # the exact check: no coverage


def test_07s_runs_record_coverage_per_iteration_and_report_it(tmp_path):
    """A training run on a problem file records, per iteration, how many sampled responses hold an answer
    (`with_answer`); it equals a recount over the same first round sampled again from the starting policy,
    and fig07's line states the share. The generated task's runs have no such column."""
    from cancellation import grpo, policy, rollout

    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n"   # the tiny task, as a file
                         for p in tasks.sample_problems(3, seed=0)))
    src = sources.ProblemSource(str(f))
    cfg = train.TrainConfig(iterations=1, n_prompts=2, G=2, max_new_tokens=96, eval_sets=["easy"], eval_n=2,
                            eval_every=1, source=src, update=grpo.UpdateConfig(n_minibatches=1))
    model, tok = policy.load_policy(str(profiles.ROOT / "data/policies/tiny-m"), dtype="float32")
    again = rollout.sample(model, tok, cfg.sample_config(model), problems=src.draw(2, rollout.round_seeds(0, 0)[0]),
                           seed=rollout.round_seeds(0, 0)[1])
    want = sum(bool(extract.extract_answers(t, extract.FILE_MODE)) for t in again.texts)
    it = train.train_run(model, tok, cfg, progress=False)["iterations"]
    assert want > 0, again.texts   # the tiny policy ends its working in a \\boxed{} answer
    assert int(it.with_answer.iloc[0]) == want and int(it.graded.iloc[0]) == 4
    P = fig07.Params(n_prompts=2, G=2)
    line = fig07.coverage_line(it, P)
    assert f"{want} of 4 sampled responses ({100 * want / 4:.1f}%)" in line and "answer_line+boxed" in line
    assert fig07.coverage_line(it.drop(columns=["with_answer", "graded"]), P) == ""


def test_trls_reward_function_counts_coverage_as_the_small_trainer(tmp_path):
    """engine.reward_function's `with_answer` adds up the graded completions holding a candidate (the count
    BatchingGRPOTrainer records per iteration); None for the generated task."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "What is 7+5?", "answer": "12"}) + "\n")
    fn = engine_data.reward_function(sources.ProblemSource(str(f)))
    texts = list(STYLES.values())
    n = len(texts)
    assert fn.with_answer == 0
    fn(["What is 7+5?"] * n, texts, ["12"] * n, ["file"] * n)
    fn(["What is 7+5?"] * 2, texts[:2], ["12"] * 2, ["file"] * 2)
    assert fn.with_answer == WITH_CANDIDATE["answer_line+boxed"] + 2   # answer_line and boxed styles again
    assert fn.graded == n + 2
    assert engine_data.reward_function(sources.ProblemSource()).with_answer is None


# ----------------------------------------------------------------------------- one final answer per response
HEDGED = {  # mode -> (a response stating two answers, the earlier one, the final one)
    "answer_line+boxed": ("We get \\boxed{5}, or maybe not.\nAnswer: 7", "5", "7"),
    "answer_line+boxed ": ("Answer: 5\nOn reflection the result is \\boxed{7}.", "5", "7"),
    "answer_line+last_sentence": ("Answer: 5\nChecking again, the answer is 7.", "5", "7"),
    "boxed+last_sentence": ("So \\boxed{5}.\nBut then the answer is 7.", "5", "7"),
    "answer_line+boxed+last_sentence": ("\\boxed{5}\nAnswer: 6\nSo the answer is 7.", "5", "7"),
    "answer_line": ("Answer: 5\nwait\nAnswer: 7", "5", "7"),
    "boxed": ("\\boxed{5} then \\boxed{7}", "5", "7"),
}


@pytest.mark.parametrize("key", list(HEDGED))
def test_a_hedged_response_is_graded_by_its_final_answer_only(key):
    """A response that states several answers earns the reward for its last one only, in every mode (verl's
    DAPO scorer and math-verify take one final answer): the earlier one gets 0."""
    mode = key.strip()
    text, earlier, final = HEDGED[key]
    v = grader.MathVerifier(mode=mode)
    assert v(tasks.Problem("q", final), text) == 1.0, (mode, text)
    assert v(tasks.Problem("q", earlier), text) == 0.0, (mode, text)
    if "+" in mode:   # the two extractors found different answers: the position decides, not the extractor
        assert len({t for _, t in extract.extract_answers(text, mode)}) >= 2
    assert extract.final_answer(text, mode) == extract.extract_answers(text, mode)[-1]


def test_a_huge_candidate_is_not_parsed_and_a_timeout_is_one_short_line(caplog):
    """Bounded work: a 200 KB "Answer:" line is not handed to math-verify (counted too_long, graded 0 at once);
    a parse that times out is counted and logged in one line with its length, never the response."""
    import time
    v = grader.MathVerifier()
    t = time.time()
    assert v(tasks.Problem("q", "12"), "Answer: " + "1+" * 100_000 + "1") == 0.0
    assert time.time() - t < 1.0 and v.stats["too_long"] == 1 and v.stats["unparsed_response"] == 1
    assert "too_long" in grader.grading_report({"mode": v.mode, **v.stats}) or "not parsed" in grader.grading_report(
        {"mode": v.mode, **v.stats})

    def slow(text, **kw):
        raise v._timeout_error("Timeout during parsing: " + text)
    v._parse = slow
    secret = "Answer: " + "7" * 500
    with caplog.at_level("WARNING"):
        assert v(tasks.Problem("q", "12"), secret) == 0.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "timed out" in lines[0] and "7777" not in lines[0]   # the gold's parse was cached
    assert v.stats["timeouts"] == 1


def test_the_grading_line_names_its_mode_and_never_contradicts_a_cached_run():
    g = {"mode": "answer_line+boxed", "graded": 0, "unparsed_response": 0, "unparsed_gold": 0, "errors": 0}
    line = grader.grading_report(g)
    assert "answer_mode answer_line+boxed" in line and "no response graded in this process" in line
    assert "0 responses graded" not in line
