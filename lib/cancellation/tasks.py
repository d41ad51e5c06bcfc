"""Problems, prompts and exact answer checking.

The tiny profile's task is synthetic column arithmetic with a chain-of-thought answer, written
one token per word/digit, e.g.

    Q: 4 7 + 3 8 = ? A: First ones digit : 7 + 8 = 1 5 , write 5 carry 1 . Next tens digit :
    4 + 3 + 1 = 8 , write 8 no carry . So the answer is \\boxed{ 8 5 } <eos>

Three kinds of token appear, as in real math rollouts: template/scaffold words (First, Next,
digit, write, So the answer is ...), whose wording is drawn at random because it never affects
correctness (a scaffold emitted with p ~ 1 carries no gradient); numbers and operators; and
decision words (carry / no carry, borrow) whose choice decides correctness. Pretraining traces
contain deliberate slips (see `make_trace`) so the base policy stays uncertain where it matters.

The paper profile reads real problem files instead through `ProblemSource` (DAPO-Math-17k,
MATH-500-style or plain prompt/answer files), renders prompts with the tokenizer's chat template
and grades responses with math-verify (`MathVerifier`).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import random
import re
import threading
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from . import cache, seeds, stage
from .dryrun import dry_run

log = logging.getLogger(__name__)

EOS = "<eos>"
PAD = "<pad>"
UNK = "<unk>"

# Interchangeable scaffold wordings: never affect correctness.
OPENERS = ["First", "Begin", "Start"]
NEXTS = ["Next", "Then", "Now"]
COLUMN_NOUNS = ["digit", "column", "place"]
WRITES = ["write", "put", "keep"]
FINALS = ["Finally", "Lastly"]
CONCLUDERS = ["So", "Thus", "Hence"]
ANSWER_NOUNS = ["answer", "result"]
COLUMNS = ["ones", "tens", "hundreds", "thousands"]

VOCAB = (
    [PAD, EOS, UNK, "Q:", "A:"]
    + [str(d) for d in range(10)]
    + ["+", "-", "*", "=", "?", ",", ".", ":", "\\boxed{", "}"]
    + COLUMNS + OPENERS + NEXTS + COLUMN_NOUNS + WRITES + FINALS + CONCLUDERS + ANSWER_NOUNS
    + ["carry", "borrow", "no", "the", "is"]
)

# Problem kinds and the held-out difficulty levels built from them.
KINDS = ("add2", "sub2", "add3", "sub3", "mul21")
DIFFICULTIES = {"easy": ("add2", "sub2"), "medium": ("add3", "sub3"), "hard": ("mul21",)}


@dataclass(frozen=True)
class Problem:
    """One question: the prompt text, the exact answer, and its kind."""
    prompt: str
    answer: str
    kind: str = "custom"


def digits(n: int) -> str:
    return " ".join(str(n))


def sample_problem(rng: random.Random, kind: str) -> Problem:
    if kind in ("add2", "sub2"):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
    elif kind in ("add3", "sub3"):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
    elif kind == "mul21":
        a, b = rng.randint(10, 99), rng.randint(2, 9)
    else:
        raise ValueError(f"unknown problem kind {kind!r}; known kinds: {', '.join(KINDS)}")
    if kind.startswith("sub"):
        a, b = max(a, b), min(a, b)
    op = {"add": "+", "sub": "-", "mul": "*"}[kind[:3]]
    ans = {"+": a + b, "-": a - b, "*": a * b}[op]
    return Problem(prompt=f"Q: {digits(a)} {op} {digits(b)} = ? A:", answer=str(ans), kind=kind)


def sample_problems(n: int, seed: int, kinds=KINDS) -> list[Problem]:
    """`n` problems, kinds drawn uniformly from `kinds`, reproducible from `seed`."""
    rng = random.Random(seed)
    return [sample_problem(rng, rng.choice(list(kinds))) for _ in range(n)]


def eval_set(difficulty: str, n: int, seed: int = 12345) -> list[Problem]:
    """A held-out evaluation set ('easy', 'medium', 'hard'); disjoint seed stream from training."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose from {sorted(DIFFICULTIES)}")
    return sample_problems(n, seed=seeds.derive(seed, "eval_set", sorted(DIFFICULTIES).index(difficulty)),
                           kinds=DIFFICULTIES[difficulty])


def _parse_prompt(prompt: str) -> tuple[int, str, int]:
    m = re.match(r"Q: ([\d ]+?) ([+\-*]) ([\d ]+?) = \? A:", prompt)
    if not m:
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return int(m.group(1).replace(" ", "")), m.group(2), int(m.group(3).replace(" ", ""))


SCAFFOLDS = ("varied", "fixed")


def make_trace(problem: Problem, rng: random.Random, error_rate: float = 0.0, scaffold: str = "varied") -> str:
    """A chain-of-thought response (without the prompt, ending in <eos>).

    scaffold: 'varied' draws every scaffold slot's wording at random (First/Begin/Start, ...);
    'fixed' always writes the first wording of each slot (First, Next, digit, write, Finally, So,
    answer) -- the control task of Fig. 1(d) / Fig. 4, where the scaffold is one phrasing shared
    by every rollout, as a real model's template is.

    With probability `error_rate` one slip is injected and carried through consistently: a +-1/2
    error in one column's result, a dropped carry/borrow, or a wrong boxed number. The returned
    trace is then usually (not always: a slip can cancel) wrong.
    """
    a, op, b = _parse_prompt(problem.prompt)
    slip = None
    if rng.random() < error_rate:
        slip = rng.choice(["value", "value", "drop_carry", "boxed"])
    da = [int(c) for c in str(a)][::-1]
    db = [int(c) for c in str(b)][::-1]
    ncol = len(da)
    slip_col = rng.randrange(ncol)
    if scaffold not in SCAFFOLDS:
        raise ValueError(f"scaffold={scaffold!r}; allowed: {', '.join(SCAFFOLDS)}")
    # a scaffold wording: random, or always the first one (draws nothing, so 'varied' streams are unchanged)
    w = (lambda xs: xs[0]) if scaffold == "fixed" else (lambda xs: rng.choice(xs))  # noqa: E731
    parts, written, carry = [], [], 0
    for k in range(ncol):
        x = da[k]
        y = db[0] if op == "*" else (db[k] if k < len(db) else 0)
        head = f"{w(OPENERS) if k == 0 else w(NEXTS)} {COLUMNS[k]} {w(COLUMN_NOUNS)} :"
        last = k == ncol - 1
        if op == "+":
            s = x + y + carry
            expr = f"{x} + {y}" + (" + 1" if carry else "")
            if slip == "value" and k == slip_col:
                s = max(0, s + rng.choice([-2, -1, 1, 2]))
            d, c = s % 10, s // 10
            if slip == "drop_carry" and k == slip_col:
                c = 0
            step = f"{head} {expr} = {digits(s)} , {w(WRITES)} {d} " + ("carry 1 ." if c else "no carry .")
            written.append(d)
            carry = c
        elif op == "-":
            s = x - y - carry
            expr = f"{x} - {y}" + (" - 1" if carry else "")
            c = 1 if s < 0 else 0
            if slip == "drop_carry" and k == slip_col and c:
                c, s = 0, abs(s)  # forgets to borrow: subtracts the wrong way round
            d = s + 10 * c
            if slip == "value" and k == slip_col:
                d = (d + rng.choice([-2, -1, 1, 2])) % 10
            step = (f"{head} borrow 1 , 1 {expr} = {digits(d)} , {w(WRITES)} {d} ." if c
                    else f"{head} {expr} = {d} , {w(WRITES)} {d} .")
            written.append(d)
            carry = c
        else:  # '*': multi-digit multiplicand times one digit
            s = x * y + carry
            expr = f"{x} * {y}" + (f" + {carry}" if carry else "")
            if slip == "value" and k == slip_col:
                s = max(0, s + rng.choice([-2, -1, 1, 2]))
            d, c = s % 10, s // 10
            if slip == "drop_carry" and k == slip_col and not last:
                c = 0
            if last:
                step = f"{head} {expr} = {digits(s)} , {w(WRITES)} {digits(s)} ."
                written.extend([int(ch) for ch in str(s)][::-1] if s else [0])
                c = 0
            else:
                step = f"{head} {expr} = {digits(s)} , {w(WRITES)} {d} " + (f"carry {c} ." if c else "no carry .")
                written.append(d)
            carry = c
        parts.append(step)
    if carry and op == "+":
        parts.append(f"{w(FINALS)} {w(WRITES)} 1 .")
        written.append(1)
    value = int("".join(str(d) for d in written[::-1]))
    if slip == "boxed":
        value = max(0, value + rng.choice([-10, -1, 1, 10]))
    parts.append(f"{w(CONCLUDERS)} the {w(ANSWER_NOUNS)} is \\boxed{{ {digits(value)} }} {EOS}")
    return " ".join(parts)


_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, whitespace removed; None if there is none."""
    hits = _BOXED_RE.findall(text)
    return hits[-1].replace(" ", "") if hits else None


def verify(problem: Problem, response: str) -> float:
    """Reward 1.0 if the response's last boxed answer equals the problem's answer, else 0.0.

    Exact string match after removing spaces; for real data with LaTeX answers use
    `MathVerifier` (math-verify) instead.
    """
    got = extract_boxed(response)
    return float(got is not None and got == problem.answer.replace(" ", ""))


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} with nested braces kept (e.g. \\frac{1}{2}); None if none or unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    start += len("\\boxed{")
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            if depth == 0:
                return text[start:j].strip()
            depth -= 1
    return None


# DAPO's reward reads the text after the last "Answer:" to the end of that line (verl math_dapo).
_ANSWER_LINE_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Named answer-extraction modes of the reward (`answer_mode`, a parameter of every notebook):
#   answer_line    DAPO's training reward (verl math_dapo): the text after the last "Answer:" to the end of its line
#   boxed          the last \boxed{...} (nested braces kept)
#   last_sentence  math-verify's own extraction (its default LaTeX + expression configs) over the response's
#                  final sentence (measured on real responses: ~55% recall at ~99.8% precision)
# or a '+' combination (a response is rewarded when any of its candidates matches). 'auto' is the paper's
# grader: problem files answer_line+boxed (by math-verify), the generated arithmetic task its exact \boxed{}.
EXTRACTORS = ("answer_line", "boxed", "last_sentence")
ANSWER_MODES = ("auto", "answer_line", "boxed", "last_sentence", "answer_line+boxed", "answer_line+last_sentence",
                "boxed+last_sentence", "answer_line+boxed+last_sentence")
FILE_MODE = "answer_line+boxed"   # what 'auto' means for a problem file (the grader before modes were named)


def check_answer_mode(mode: str) -> str:
    """`mode` if it is one of ANSWER_MODES, else ValueError in one line listing the valid ones."""
    if mode not in ANSWER_MODES:
        raise ValueError(f"answer_mode={mode!r} is not an extraction mode; valid: {', '.join(ANSWER_MODES)}")
    return mode


_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def last_sentence(response: str) -> str | None:
    """The response's final sentence: the last piece, split at line breaks and at . ! ? followed by a
    space, that holds a letter or a digit (a closing "$$" or "}" line is not a sentence); None if none."""
    parts = [t.strip() for t in _SENTENCE_SPLIT_RE.split(response)]
    parts = [t for t in parts if re.search(r"[A-Za-z0-9]", t)]
    return parts[-1] if parts else None


def extract_answers(response: str, mode: str = FILE_MODE) -> list[tuple[str, str]]:
    """What a response states as an answer under extraction `mode` (not 'auto'): (extractor, text) pairs,
    at most one per extractor of the mode, in the order they appear in the response (the last is its final
    answer, `final_answer`). answer_line: the last "Answer: ..." line, surrounding $, ** and a final period
    removed (a boxed answer on it is taken from its box); boxed: the last \\boxed{}'s content;
    last_sentence: the final sentence as written (math-verify finds the answer in it)."""
    parts = mode.split("+")
    out = []   # (position in the response, extractor, text)
    if "answer_line" in parts:
        lines = list(_ANSWER_LINE_RE.finditer(response))
        if lines:
            text = lines[-1].group(1).strip().rstrip(".").strip().strip("*$").strip()
            if "\\boxed{" in text:
                # an "Answer: \boxed{x}" line: the boxed candidate covers it when the mode has one
                text = "" if "boxed" in parts else (last_boxed(text) or "")
            if text:
                out.append((lines[-1].start(), "answer_line", text))
    if "boxed" in parts:
        boxed = last_boxed(response)
        if boxed:
            out.append((response.rfind("\\boxed{"), "boxed", boxed))
    if "last_sentence" in parts:
        sent = last_sentence(response)
        if sent:
            out.append((response.rfind(sent), "last_sentence", sent))
    return [(k, t) for _, k, t in sorted(out, key=lambda x: x[0])]


def final_answer(response: str, mode: str = FILE_MODE) -> tuple[str, str] | None:
    """The response's one final answer under `mode`: the candidate that comes last in the response (as
    verl's DAPO scorer takes the last "Answer:" and math-verify one final answer), or None. A response
    that states several answers is graded by its last one only: an earlier one is never credited."""
    cands = extract_answers(response, mode)
    return cands[-1] if cands else None


def answer_candidates(response: str, mode: str = FILE_MODE) -> list[str]:
    """What a response claims as its answer, as math-verify is handed it: the answer_line and boxed
    candidates wrapped in \\boxed{} for its LaTeX parser, the last sentence as written; empty when the
    response has none (see `extract_answers`)."""
    return [t if k == "last_sentence" else f"\\boxed{{{t}}}" for k, t in extract_answers(response, mode)]


# Words that are math when a gold is read as text (so "pi" or "\\infty" stay math, "No" does not).
_MATH_WORDS = {"pi", "infty", "inf", "infinity", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp",
               "sqrt", "frac", "dfrac", "cdot", "times", "le", "ge", "leq", "geq", "ne", "neq", "in", "cup", "cap",
               "mathbb", "left", "right", "pm", "mp", "circ", "deg", "emptyset", "varnothing", "arcsin", "arccos",
               "arctan", "sinh", "cosh", "tanh", "max", "min", "gcd", "lcm", "mod", "bmod", "pmod"}
_TEXT_WRAP_RE = re.compile(r"\\(?:text|mathrm|textbf|textit|mbox|operatorname)\s*\{([^{}]*)\}")


def word_answer(text: str) -> str | None:
    """A gold (or response) answer that is words rather than math, normalised for comparison as text:
    'Yes', '\\text{No}', 'infinitely many' -> 'yes', 'no', 'infinitely many'. None when it holds a digit,
    an operator, a bracket or a backslash command, or no word of two letters or more that is not a math
    name (so 'x', 'pi', '2\\pi' and '(A)' stay math). math-verify reads a word as a product of
    symbols ("No" = N·o = "On"); compared as text, "No" matches "no" and never "On"."""
    t = _TEXT_WRAP_RE.sub(r"\1", str(text)).strip().strip("$").strip().rstrip(".").strip()
    if not t or re.search(r"[0-9\\^_=+*/<>(){}\[\]|]", t):
        return None
    words = re.findall(r"[A-Za-z]+", t)
    if not any(len(w) >= 2 and w.lower() not in _MATH_WORDS for w in words):
        return None
    return " ".join(w.lower() for w in words)


def _says_words(sentence: str, words: str) -> bool:
    """A final sentence that states the word answer `words`: its words (lower case, text wrappers and
    punctuation dropped) are `words`, or end with "is <words>" / "answer <words>" ("So the answer is No.")."""
    t = " ".join(w.lower() for w in re.findall(r"[A-Za-z]+", _TEXT_WRAP_RE.sub(r"\1", sentence)))
    return t == words or t.endswith((f" is {words}", f" answer {words}"))


MAX_CANDIDATE = 2000   # characters of one answer candidate handed to math-verify (longer: no answer, 'too_long')


class MathVerifier:
    """Reward by math-verify for real math data: 1.0 if the response's answer equals the gold one.

    Gold answers are parsed as \\boxed{answer} (falling back to the raw text) and cached per
    answer string. A response is graded by its one final answer under its extraction `mode`
    (of the candidates the mode finds — default answer_line+boxed: its DAPO "Answer:" line and its last
    \\boxed{} — the one that comes last among those that read as an answer, as `final_answer` orders them);
    an earlier, hedged answer is never credited. A gold that is words (`word_answer`: "Yes", "No", "infinitely many") is compared
    as normalised text, not by math-verify (which reads "No" as N·o and rewards "On"); `stats`
    counts those responses under 'as_words'. Unparseable gold or response, and any math-verify
    error, give 0.0 and are counted in `stats`; a call never raises.
    """
    REVISION = "final-1"   # grading rules beyond math-verify's own (cache keys hold it: value.verifier_id); final-1: the final answer only

    def __init__(self, timeout_s: int = 5, mode: str = FILE_MODE):
        check_answer_mode(mode)
        self.mode = FILE_MODE if mode == "auto" else mode
        try:
            from math_verify import parse, verify as mv  # type: ignore
            from math_verify.errors import TimeoutException  # type: ignore
        except ImportError as e:  # pragma: no cover - a core dependency, but say how to fix a broken env
            raise ImportError("math-verify is needed for real math data: pip install 'math-verify[antlr4_13_2]'") from e
        self._parse, self._verify = parse, mv
        # math-verify's timeout error derives from BaseException; catch it explicitly.
        self._failures = (Exception, TimeoutException)
        self._timeout_error = TimeoutException
        self.timeout_s = timeout_s
        self.stats = {"graded": 0, "unparsed_response": 0, "unparsed_gold": 0, "errors": 0, "as_words": 0,
                      "too_long": 0, "timeouts": 0}
        self._gold: dict[str, list] = {}

    def _timeout(self) -> int | None:
        # math-verify times out with signal.alarm, which only works in the main thread; elsewhere
        # (e.g. a reward worker thread) run without a timeout rather than raise.
        return self.timeout_s if threading.current_thread() is threading.main_thread() else None

    def _parsed(self, text: str) -> list:
        """math-verify's parse, or [] when it found no mathematical expression.

        parse falls back to the raw matched string when SymPy cannot read it (e.g. \\boxed{???});
        such a string-only result counts as unparsed. A candidate over MAX_CANDIDATE characters is not
        handed to math-verify (counted 'too_long': a 200 KB "Answer:" line took 5 s a parse); a parse that
        times out is counted ('timeouts') and logged in one line with its length, never its text.
        """
        if len(text) > MAX_CANDIDATE:
            self.stats["too_long"] += 1
            return []
        try:
            out = self._parse(text, parsing_timeout=self._timeout(), raise_on_error=True)
        except self._timeout_error:
            self.stats["timeouts"] += 1
            log.warning("math-verify: parsing timed out on a %d-character candidate (graded as no answer)", len(text))
            return []
        except Exception:   # what parse(raise_on_error=False) turns into [] (and logs at debug level)
            return []
        return out if any(not isinstance(x, str) for x in out) else []

    def _gold_for(self, answer: str) -> list:
        if answer not in self._gold:
            self._gold[answer] = self._parsed(f"\\boxed{{{answer}}}") or self._parsed(answer)
        return self._gold[answer]

    def __call__(self, problem: Problem, response: str) -> float:
        self.stats["graded"] += 1
        try:
            words = word_answer(problem.answer)
            cands = extract_answers(response, self.mode)
            if words is not None:
                self.stats["as_words"] += 1
                if not cands:
                    self.stats["unparsed_response"] += 1
                    return 0.0
                k, t = cands[-1]   # the final answer only
                return float(_says_words(t, words) if k == "last_sentence" else word_answer(t) == words)
            gold = self._gold_for(problem.answer)
            if not gold:
                self.stats["unparsed_gold"] += 1
                return 0.0
            # the final answer: the last candidate that reads as math (a closing "Done." sentence is no answer)
            final = next((p for p in (self._parsed(t if k == "last_sentence" else f"\\boxed{{{t}}}")
                                      for k, t in reversed(cands)) if p), None)
            if final is None:
                self.stats["unparsed_response"] += 1
                return 0.0
            return float(self._verify(gold, final, timeout_seconds=self._timeout()))
        except self._failures:  # a reward must never stop a run
            self.stats["errors"] += 1
            return 0.0


# ---------------------------------------------------------------------------------------------
# Problem files. Three shapes, detected per row from its columns:
#   DAPO-Math-17k (verl parquet): prompt = [{"role": "user", "content": ...}], reward_model.ground_truth
#   MATH-500: problem + answer, or problem + solution with a \boxed{} answer
#   plain: prompt (text or chat messages) + answer

def gold_check(answers: list[str], verifier: "MathVerifier | None" = None) -> dict:
    """Grade every distinct gold answer against itself before a run: what the reward can never credit.

    Returns {'n': distinct golds, 'words': golds compared as text, and lists of golds that
    'unparseable' (math-verify finds no expression), 'reject_themselves' (neither `Answer: g` nor
    `\\boxed{g}` is rewarded against g), 'constant' (a gold with words that parses to a number its
    text does not state, e.g. "Σ i³, or equivalently (n(n+1)/2)²" -> 1 on real data, so `Answer: 1`
    scores) and
    'reject_short' (the text states one number, e.g. "3 is the only possible value", and
    `Answer: 3` is not rewarded)}. Each listed gold can never be rewarded as its text means."""
    v = verifier or MathVerifier()
    out = {"n": 0, "words": 0, "unparseable": [], "reject_themselves": [], "constant": [], "reject_short": []}
    for g in dict.fromkeys(answers):
        out["n"] += 1
        if word_answer(g) is not None:
            out["words"] += 1
            continue
        try:
            parsed = v._gold_for(g)
        except v._failures:
            parsed = []
        if not parsed:
            out["unparseable"].append(g)
            continue
        bare = _TEXT_WRAP_RE.sub(" ", re.sub(r"\\[A-Za-z]+", " ", g))
        nums = set(re.findall(r"-?\d+(?:\.\d+)?", bare))
        prose = [w for w in re.findall(r"[A-Za-z]{2,}", bare) if w.lower() not in _MATH_WORDS]
        try:
            c = parsed[0].doit() if hasattr(parsed[0], "doit") else parsed[0]
            const = bool(getattr(c, "is_number", False))
        except Exception:  # noqa: BLE001 - sympy raises many types on odd input; then no claim
            const = False
        if const and prose:   # words around math that came out a constant: a misread gold, unless it says so
            try:
                # numbers the text states on their own (the 1 of "n+1" is part of an expression)
                alone = re.findall(r"(?<![\w+\-*/^.])(-?\d+(?:\.\d+)?)(?![\w+\-*/^(.])", bare)
                stated = any(abs(float(c) - float(x)) <= 1e-9 * max(1.0, abs(float(x))) for x in alone)
            except (TypeError, ValueError):
                stated = True    # not a real number (a complex constant, say): no claim either way
            if not stated:
                out["constant"].append(g)
                continue
        q = Problem("gold check", g)
        if not (v(q, f"Answer: {g}") or v(q, f"\\boxed{{{g}}}")):
            out["reject_themselves"].append(g)
            continue
        if len(nums) == 1 and re.search(r"[A-Za-z]{2,}", bare):
            (num,) = nums
            if not v(q, f"Answer: {num}"):
                out["reject_short"].append(g)
    v.stats = {k: 0 for k in v.stats}   # the check's own grades are not a run's
    return out


def gold_line(check: dict, ids_path: str | None = None) -> str:
    """The gold check in one line (with where its list of golds is)."""
    bad = sum(len(check[k]) for k in ("unparseable", "reject_themselves", "constant", "reject_short"))
    if not bad:
        return (f"gold answers: {check['n']} distinct, {check['words']} compared as words; each one is rewarded "
                "against its own text")
    return (f"gold answers: {check['n']} distinct, {check['words']} compared as words; {bad} can never be rewarded as "
            f"written: {len(check['unparseable'])} unparseable, {len(check['reject_themselves'])} reject themselves, "
            f"{len(check['constant'])} parse to a constant their text does not state, "
            f"{len(check['reject_short'])} reject the one number their text states"
            + (f" (listed in {ids_path})" if ids_path and bad else ""))


class CoinFlip:
    """The dry run's reward: a seeded coin flip per (problem, response), not a grade."""
    REPORT = "DRY RUN: random weights; every reward is a seeded coin flip, not a grade (timings and memory only)"

    def __init__(self, seed: int = 0):
        # one seeded stream per source, drawn in call order: random weights often decode to the same
        # (empty) text for every rollout, so a flip keyed on the text would never mix a group
        self.rng = random.Random(seed)

    def __call__(self, problem: Problem, response: str) -> float:
        return float(self.rng.random() < 0.5)


class ProblemFileError(ValueError):
    """A problem file that cannot be used; the message names the file, the row and what was expected."""


class UnrewardableGolds(ProblemFileError):
    """A problem file with golds the reward can never credit (`gold_check`), refused before the run
    (`unrewardable_golds: refuse`); the runner prints its message as the notebook's one-line outcome."""


_COLUMNS = ("prompt", "reward_model", "problem", "answer", "solution")
_SHAPES_HINT = ("columns 'prompt'+'reward_model' (DAPO-Math-17k), 'problem'+'answer'/'solution' (MATH-500) "
                "or 'prompt'+'answer'")


class _RowError(ValueError):
    """What is wrong with one row; the loader adds the file and row."""


def _answer_text(value) -> str | None:
    """A ground-truth answer as text; None when missing (null, NaN, empty) or not a scalar."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value.strip() or None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # A parquet int column with nulls comes back as float: 12.0 means "12".
        if value != value:  # NaN: pandas' null
            return None
        written = getattr(value, "written", None)   # a JSON number: the file's own digits
        if written is not None:
            if re.fullmatch(r"-?\d+(\.0*)?", written):
                return written.split(".")[0]             # 12345678901234567890.0 -> all its digits
            if re.fullmatch(r"-?\d+\.\d+", written):
                return written                           # 0.50 stays 0.50
        # no exponent: math-verify reads '5e-05' as 5·e − 5
        return str(int(value)) if value.is_integer() else format(Decimal(written or repr(value)), "f")
    return None


class _Written(float):
    """A JSON number read as a float that keeps the text the file wrote (`json.loads(parse_float=...)`)."""

    def __new__(cls, text: str):
        x = super().__new__(cls, text)
        x.written = text
        return x


def _check_finite(value, name: str):
    """Raise _RowError for a non-finite number (JSON 1e400 / Infinity / NaN) given as an answer:
    it would otherwise become the text 'inf' (or be taken for a missing value)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        raise _RowError(f"expected a finite {name}; got {value!r} (a number too large for a float, or NaN/Infinity)")


def _prompt_text(value) -> str | None:
    """Prompt text from a string or a list of chat messages (the last user message's content)."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, (list, tuple, np.ndarray)):  # pandas reads message lists as numpy arrays
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        content = users[-1].get("content") if users else None
        return content if isinstance(content, str) and content.strip() else None
    return None


def _row_problem(row, kind: str) -> Problem:
    """One file row as a Problem; raises _RowError saying what was expected."""
    if not isinstance(row, dict):
        raise _RowError(f"expected an object with {_SHAPES_HINT}; got {type(row).__name__}")
    cols = set(row)
    if {"prompt", "reward_model"} <= cols:
        prompt = _prompt_text(row["prompt"])
        if prompt is None:
            raise _RowError(f"expected 'prompt' to be text or chat messages with a user message; got {row['prompt']!r:.80}")
        rm = row["reward_model"]
        if isinstance(rm, dict):
            _check_finite(rm.get("ground_truth"), "reward_model.ground_truth")
        answer = _answer_text(rm.get("ground_truth")) if isinstance(rm, dict) else None
        if answer is None:
            raise _RowError(f"expected a non-empty answer in reward_model.ground_truth; got {rm!r:.80}")
    elif "problem" in cols and ({"answer", "solution"} & cols):
        prompt = _prompt_text(row["problem"])
        if prompt is None:
            raise _RowError(f"expected 'problem' to be non-empty text; got {row['problem']!r:.80}")
        _check_finite(row.get("answer"), "'answer'")
        answer = _answer_text(row.get("answer"))
        if answer is None and isinstance(row.get("solution"), str):
            answer = last_boxed(row["solution"]) or None
        if answer is None:
            raise _RowError(f"expected a non-empty 'answer' or a \\boxed{{}} answer in 'solution'; "
                            f"got answer={row.get('answer')!r:.40}")
    elif {"prompt", "answer"} <= cols:
        prompt = _prompt_text(row["prompt"])
        if prompt is None:
            raise _RowError(f"expected 'prompt' to be text or chat messages with a user message; got {row['prompt']!r:.80}")
        _check_finite(row["answer"], "'answer'")
        answer = _answer_text(row["answer"])
        if answer is None:
            raise _RowError(f"expected a non-empty 'answer'; got {row['answer']!r:.80}")
    else:
        raise _RowError(f"expected {_SHAPES_HINT}; found columns {sorted(map(str, cols))}")
    return Problem(prompt=prompt, answer=answer, kind=kind)


def _text(path: Path) -> str:
    """The file's text (UTF-8); ProblemFileError naming the file and the byte offset otherwise."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ProblemFileError(f"{path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 4]!r}); "
                               f"expected a UTF-8 .jsonl/.json file") from None


def _iter_rows(path: Path):
    """(place, row) pairs of a .parquet, .jsonl or .json (list) file; place names the row for errors."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises several types for a damaged file
            raise ProblemFileError(f"{path}: unreadable parquet file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
        cols = [c for c in pf.schema_arrow.names if c in _COLUMNS] or pf.schema_arrow.names
        i = 0
        # Batches keep memory bounded: the real DAPO file repeats ~17k prompts to 1.79M rows.
        for batch in pf.iter_batches(batch_size=65_536, columns=cols):
            for row in batch.to_pylist():
                i += 1
                yield f"row {i}", row
    elif path.suffix == ".jsonl" or (path.suffix == ".json" and not _text(path).lstrip().startswith("[")):
        for n, line in enumerate(_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line, parse_float=_Written)
            except json.JSONDecodeError as e:
                raise ProblemFileError(f"{path}: line {n}: expected one JSON object per line ({e.msg})") from e
            except RecursionError:
                raise ProblemFileError(f"{path}: line {n}: JSON nested too deeply to read (a row holds "
                                       "thousands of nested lists or objects)") from None
            yield f"line {n}", row
    elif path.suffix == ".json":
        try:
            rows = json.loads(_text(path), parse_float=_Written)
        except json.JSONDecodeError as e:
            raise ProblemFileError(f"{path}: line {e.lineno}: expected a JSON list of objects ({e.msg})") from e
        except RecursionError:
            raise ProblemFileError(f"{path}: JSON nested too deeply to read (thousands of nested lists or "
                                   "objects)") from None
        for i, row in enumerate(rows, 1):
            yield f"row {i}", row
    else:
        raise ProblemFileError(f"{path}: expected a .parquet, .jsonl or .json file")


def _read_problem_file(path: Path) -> list[Problem]:
    """Validated problems of a file, deduplicated by (prompt, answer) in first-occurrence order.

    A prompt repeated with the same answer is one problem (the DAPO file repeats each prompt);
    a prompt given two different answers is a ProblemFileError naming both rows.
    """
    seen: dict[str, tuple[Problem, str]] = {}  # prompt -> (problem, place of its first row)
    n_rows = 0
    for place, row in _iter_rows(path):
        n_rows += 1
        try:
            p = _row_problem(row, kind=path.stem)
        except _RowError as e:
            raise ProblemFileError(f"{path}: {place}: {e}") from None
        first = seen.setdefault(p.prompt, (p, place))
        if first[0].answer != p.answer:
            raise ProblemFileError(f"{path}: {first[1]} and {place}: one prompt with two answers "
                                   f"({first[0].answer!r:.40} and {p.answer!r:.40}); prompt {p.prompt!r:.60}")
    if not n_rows:
        raise ProblemFileError(f"{path}: no rows (empty file); expected at least one problem with {_SHAPES_HINT}")
    return [p for p, _ in seen.values()]


PROMPT_FORMATS = ("auto", "chat", "raw")
GOLD_POLICIES = ("refuse", "skip", "allow")
_GOLD_WHYS = ("unparseable", "reject_themselves", "constant", "reject_short")


@dataclass
class ProblemSource:
    """Where problems come from (generated arithmetic or a file), how prompts are rendered and graded."""
    path: str = ""
    """"" -> generated arithmetic (tiny profile); else a .parquet/.jsonl/.json problem file."""
    kinds: tuple = KINDS
    """Problem kinds of the generated task (ignored for files)."""
    prompt_format: str = "auto"
    """'auto': chat template (add_generation_prompt=True) when the tokenizer has one; 'chat': require it; 'raw': prompt as is."""
    answer_mode: str = "auto"
    """How the reward finds a response's answer (ANSWER_MODES): 'auto' is the paper's grader (a file:
    answer_line+boxed by math-verify; generated arithmetic: the exact last \\boxed{}); any other mode grades by
    math-verify with that extraction."""
    unrewardable_golds: str = "refuse"
    """A file with golds `gold_check` flags: 'refuse' it (`admit` raises UnrewardableGolds), 'skip' those
    problems (`load` drops them) or 'allow' them (kept; never rewarded)."""

    def __post_init__(self):
        self.path = str(self.path or "")
        self.kinds = tuple(self.kinds)
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format={self.prompt_format!r}; expected one of {', '.join(PROMPT_FORMATS)}")
        check_answer_mode(self.answer_mode)
        if self.unrewardable_golds not in GOLD_POLICIES:
            raise ValueError(f"unrewardable_golds={self.unrewardable_golds!r}; expected one of {', '.join(GOLD_POLICIES)}")

    # Caches are plain attributes, not dataclass fields, so `asdict` (cache keys) never sees them.
    def _stat_key(self) -> tuple:
        path = Path(self.path)
        if not path.exists():
            raise FileNotFoundError(f"problem file not found: {path}")
        st = path.stat()
        return (self.path, st.st_mtime_ns, st.st_size)

    def _load_all(self) -> list[Problem]:
        if not self.path:
            return []
        key = self._stat_key()
        if getattr(self, "_loaded", (None,))[0] != key:
            self._loaded = (key, _read_problem_file(Path(self.path)))
        return list(self._loaded[1])

    def load(self) -> list[Problem]:
        """All problems, validated and deduplicated (cached until the file changes); [] for generated.
        With unrewardable_golds 'skip', without those whose gold `gold_check` flags."""
        problems = self._load_all()
        if self.unrewardable_golds == "skip" and problems:
            flagged = self._flagged()
            problems = [p for p in problems if p.answer not in flagged]
            if not problems:
                raise UnrewardableGolds(f"{self.path}: every gold is one the reward can never credit "
                                        "(unrewardable_golds: skip left no problem); see `check_golds`")
        return problems

    def draw(self, n: int, seed: int) -> list[Problem]:
        """`n` problems reproducible from `seed`: generated, or sampled without replacement from the file."""
        if not self.path:
            return sample_problems(n, seed=seed, kinds=self.kinds)
        pool = self.load()
        rng = random.Random(seed)
        return [pool[i] for i in rng.sample(range(len(pool)), min(n, len(pool)))]

    def render(self, problem: Problem, tokenizer) -> str:
        """The text to tokenize (with add_special_tokens=False) for `problem`'s prompt."""
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if self.prompt_format == "chat" and not has_template:
            raise ValueError(f"prompt_format='chat' needs a tokenizer with a chat template; "
                             f"{type(tokenizer).__name__} has none (use prompt_format='raw' or 'auto')")
        if self.prompt_format == "raw" or not has_template:
            return problem.prompt
        # As verl renders DAPO: the user message through the chat template, generation prompt added.
        return tokenizer.apply_chat_template([{"role": "user", "content": problem.prompt}],
                                             tokenize=False, add_generation_prompt=True)

    def verifier(self):
        """Reward function (problem, response) -> float: exact `verify` for generated, MathVerifier for files.

        The file verifier is one object per source, so its `stats` add up over a run.
        """
        if dry_run() is not None:  # random weights never solve anything: a labelled coin flip instead
            if getattr(self, "_coin", None) is None:
                self._coin = CoinFlip(dry_run()["seed"])
            return self._coin
        if not self.path and self.answer_mode == "auto":
            return verify
        if getattr(self, "_verifier", None) is None:
            self._verifier = MathVerifier(mode=self.answer_mode)
        return self._verifier

    def check_golds(self, out_dir: str | Path | None = None) -> str:
        """`gold_check` of the file's answers as one line ('' for generated problems), cached by the
        file's fingerprint; the golds it lists go to `<out_dir>/golds-<fingerprint[:12]>.csv`
        (default: the cache folder)."""
        if not self.path:
            return ""
        problems = self._load_all()
        check = self._gold_check()
        flagged = self._flagged()
        rows = [(i, p.answer, flagged[p.answer]) for i, p in enumerate(problems) if p.answer in flagged]
        self._ids = None
        if rows:
            self._ids = Path(out_dir or cache.DEFAULT_DIR) / f"golds-{self.fingerprint()[:12]}.csv"
            buf = io.StringIO()
            csv.writer(buf).writerows([("problem", "answer", "why"), *rows])
            cache.atomic_write(self._ids, lambda t: Path(t).write_text(buf.getvalue()))
        return gold_line(check, str(self._ids) if self._ids else None)

    def _gold_check(self) -> dict:
        """`gold_check` of the file's answers, cached by the file's fingerprint (independent of answer_mode:
        it asks whether a gold can be credited at all, by `Answer: g` or `\\boxed{g}`)."""
        return stage.GOLD_CHECK.cached(lambda: gold_check([p.answer for p in self._load_all()]),
                                       fingerprint=self.fingerprint(), grader=MathVerifier.REVISION)

    def _flagged(self) -> dict:
        """{gold: why} for every gold `gold_check` flags."""
        check = self._gold_check()
        return {g: why for why in _GOLD_WHYS for g in check[why]}

    def admit(self, out_dir: str | Path | None = None) -> str:
        """`check_golds`, then its `unrewardable_golds` policy: 'refuse' raises UnrewardableGolds in one
        line naming the count and the golds-<fingerprint>.csv file; 'skip' says how many problems `load`
        drops; 'allow' only reports. Returns the line to print ('' for generated problems)."""
        line = self.check_golds(out_dir)
        if not line:
            return line
        flagged = self._flagged()
        n_bad = sum(p.answer in flagged for p in self._load_all())
        if not n_bad:
            return line
        total = len(self._load_all())
        if self.unrewardable_golds == "refuse":
            raise UnrewardableGolds(
                f"{self.path}: {n_bad} of {total} problems have a gold the reward can never credit as written "
                f"(listed in {self._ids}); refused: correct those answers, or set unrewardable_golds to 'skip' "
                "(drop those problems) or 'allow' (keep them, never rewarded)")
        if self.unrewardable_golds == "skip":
            return line + f"; unrewardable_golds skip: {n_bad} of {total} problems dropped, {total - n_bad} left"
        return line + f"; unrewardable_golds allow: {n_bad} of {total} problems kept though never rewarded"

    def with_answer(self, texts) -> int | None:
        """How many of the responses `texts` hold an answer candidate under this source's extraction mode
        (`extract_answers`): the reward's coverage, counted from the texts themselves, so it can be recorded
        beside the results. None for the generated arithmetic task's exact check (no extraction mode)."""
        if not self.path and self.answer_mode == "auto":
            return None
        mode = FILE_MODE if self.answer_mode == "auto" else self.answer_mode
        return sum(bool(extract_answers(t, mode)) for t in texts)

    def grading(self) -> dict:
        """How the rewards so far were graded, as numbers: {} for the exact arithmetic check, {'dry_run': True}
        under a dry run, else math-verify's mode and counts (`grading_report` writes the line)."""
        if dry_run() is not None:
            return {"dry_run": True}
        v = self.verifier()
        if not isinstance(v, MathVerifier):
            return {}
        return {"mode": v.mode, **{k: int(n) for k, n in v.stats.items()}}

    def reward_report(self) -> str:
        """One line on how the rewards so far were graded ('' for the exact arithmetic check)."""
        return grading_report(self.grading())

    def fingerprint(self) -> str:
        """sha256 of the file's bytes, or 'arith:<kinds>' for the generated task."""
        if not self.path:
            return "arith:" + ",".join(self.kinds)
        key = self._stat_key()
        if getattr(self, "_fp", (None,))[0] != key:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._fp = (key, h.hexdigest())
        return self._fp[1]

    def params(self) -> dict:
        """JSON-able description for cache keys: what the problems and prompts depend on."""
        out = {"path": self.path, "kinds": list(self.kinds), "prompt_format": self.prompt_format,
               "fingerprint": self.fingerprint()}
        # set only when not the default, so keys (and every cache entry) of the default grader stay as they were
        if self.answer_mode != "auto":
            out["answer_mode"] = self.answer_mode
        if self.unrewardable_golds == "skip":   # 'refuse' and 'allow' run on the same problems
            out["unrewardable_golds"] = "skip"
        return out

    cache_params = params   # a stage input's canonical form (stage.canonical)


def grading_report(g: dict) -> str:
    """The line of `ProblemSource.grading()`'s numbers ('' for the exact arithmetic check)."""
    if not g:
        return ""
    if g.get("dry_run"):
        return CoinFlip.REPORT
    mode = f"math-verify (answer_mode {g['mode']})"
    if not g["graded"]:   # every reward of this run came from the cache: no count here can describe them
        return f"{mode}: no response graded in this process (the rewards were read from the cache)"
    cov = f" ({100 * (1 - g['unparsed_response'] / g['graded']):.1f}% had an answer)"
    return (f"{mode}: {g['graded']} responses graded{cov}; counted as wrong because unparseable: "
            f"{g['unparsed_response']} responses, {g['unparsed_gold']} gold answers; {g['errors']} errors"
            + (f"; {g['as_words']} graded against word answers as text" if g.get("as_words") else "")
            + (f"; {g['too_long']} candidates over {MAX_CANDIDATE} characters not parsed" if g.get("too_long") else "")
            + (f"; {g['timeouts']} parses timed out" if g.get("timeouts") else ""))
