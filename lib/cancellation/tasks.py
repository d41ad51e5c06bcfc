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

from . import answers, cache, seeds, stage
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
#   last_sentence  the answer the response's final sentence states (`sentence_answer`: "the answer is X", "there
#                  are X ways", "X is the only ...", "= X" after so/thus/we get; negations refused), no candidate when
#                  it states none (on tests/data/graded_responses.jsonl: 96% recall at 100% precision)
# or a '+' combination (a response is graded by its final candidate, `final_answer`). 'auto' is the paper's
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


_DISPLAY_TOKEN_RE = re.compile(r"\$\$|\\\[|\\\]")


def _display_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each closed display-math block of `text` ($$...$$, \\[...\\]), one linear pass."""
    out, opened = [], None
    for m in _DISPLAY_TOKEN_RE.finditer(text):
        tok = m.group(0)
        if opened is None:
            if tok != "\\]":
                opened = (tok, m.start())
        elif (opened[0], tok) in (("$$", "$$"), ("\\[", "\\]")):
            out.append((opened[1], m.end()))
            opened = None
    return out


def last_sentence(response: str) -> str | None:
    """The response's final sentence: the last piece, split at line breaks and at . ! ? followed by a
    space, that holds a letter or a digit (a closing "$$" or "}" line is not a sentence); None if none.
    A display-math block ($$...$$, \\[...\\]) is never split: "\\[ S = n(n+1)2^{n-2}. \\]" is one sentence,
    not "\\[ S = n(n+1)2^{n-2}." and "\\]". Only the response's last 4 * MAX_CANDIDATE characters are read
    (bounded work; a longer final sentence is read by its last MAX_CANDIDATE characters anyway)."""
    tail = response[-4 * MAX_CANDIDATE:]
    spans = _display_spans(tail)
    parts, pos, k = [], 0, 0
    for m in _SENTENCE_SPLIT_RE.finditer(tail):
        while k < len(spans) and spans[k][1] <= m.start():
            k += 1
        if k < len(spans) and spans[k][0] < m.start() < spans[k][1]:
            continue      # inside display math
        parts.append(tail[pos:m.start()])
        pos = m.end()
    parts.append(tail[pos:])
    parts = [t.strip() for t in parts]
    parts = [t for t in parts if re.search(r"[A-Za-z0-9]", t)]
    return parts[-1] if parts else None


# ------------------------------------------------------------------ the answer a sentence states
# A sentence is read as a list of items: math ($...$, \(...\), \[...\] spans, and plain-text tokens that read as
# math: digits, operators, brackets, backslash commands, a letter next to an operator) and words, each with the
# punctuation that closes it. Consecutive math items with no punctuation between them are one run: one expression.
_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_MATHY_RE = re.compile(r"[0-9=+\-*/^<>()\[\]{}\\_|≤≥≠×·÷√π∞]")
_HYPHENATED_RE = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)+")
_PLAIN_MATH_NAMES = {"pi", "sqrt", "infty", "infinity"}
# Short English words: never a product of variables (longer words with a vowel are prose anyway; see _is_prose_word).
_SHORT_WORDS = {"a", "an", "as", "at", "be", "by", "do", "if", "in", "is", "it", "no", "of", "on", "or", "so", "to", "up",
                "we", "and", "are", "but", "can", "for", "has", "how", "its", "not", "one", "the", "two", "was", "yes",
                "all", "any", "few", "six", "ten", "way", "odd", "our", "get", "got", "let", "may", "use", "see", "too",
                "had", "did", "does", "each", "i"}
_NEGATIONS = {"not", "never", "cannot", "can't", "isn't", "aren't", "doesn't", "don't", "won't", "wasn't", "weren't",
              "neither", "nor", "nothing", "none", "impossible"}
_CLAUSE_WORDS = {"so", "thus", "hence", "therefore", "but", "then", "consequently"}
_LEADING_WORDS = {"so", "thus", "hence", "therefore", "consequently", "finally", "overall", "in", "conclusion",
                  "answer", "final", "the", "is"}
_FILLERS = {"exactly", "precisely", "just", "simply", "then", "therefore", "thus", "also", "still", "indeed", "now",
            "clearly", "finally", "that", "only", "always", "obviously", "really", "us"}
# Words that state a result right before a final "lhs = rhs" ("So $x = 5$", "we get $f(3) = 81$"); a premise
# ("such that a+b+c=99", "Suppose $k = 2$", "where", "with", "let") is none of them.
_RESULT_WORDS = {"so", "thus", "hence", "therefore", "consequently", "finally", "then", "get", "gets", "got",
                 "obtain", "obtains", "obtained", "find", "finds", "found", "have", "has", "had", "gives", "give",
                 "gave", "giving", "yields", "yield", "yielding", "shows", "means", "conclude", "concludes", "follows",
                 "is", "are", "becomes", "equals", "answer", "result", "total", "sum", "altogether", "overall",
                 "indeed", "clearly", "compute", "computes", "computed", "makes", "value", "values"}
# Verbs whose object is the result ("we get 12", "giving $\frac{5}{36}$", "the area equals 48").
_VERBS = {"get", "gets", "got", "obtain", "obtains", "obtained", "find", "finds", "found", "have", "has", "gives",
          "give", "gave", "giving", "yields", "yield", "yielding", "equals", "equal", "becomes", "totals", "makes",
          "is", "are", "was", "were", "be"}
_MODALS = {"must", "should", "will", "would", "to", "only", "always", "then"}
# After "is X", words that make X a bound, a comparison or one of several answers ("is at least 36", "is 8 or 9").
_BAD_FOLLOW = {"or", "more", "less", "than", "times", "greater", "smaller", "larger", "fewer", "higher", "lower",
               "plus", "minus", "divides", "divided", "percent", "apart", "away", "and", "if", "when", "whenever",
               "unless", "provided", "before", "after", "not"}
_SUPERLATIVES = {"only", "unique", "smallest", "largest", "least", "greatest", "minimum", "maximum", "minimal",
                 "maximal", "answer", "desired", "required", "correct", "final", "sought", "biggest", "lowest",
                 "highest", "one"}
_CHOICE_RE = re.compile(r"^\(([A-Ea-e])\)\s+\S")
# Words that offer another value beside the one stated ("5, unless n is odd", "either 5 or 7"): no single answer.
_HEDGE_WORDS = {"or", "unless", "otherwise", "except", "either"}


class _Item:
    __slots__ = ("kind", "text", "raw", "punct")

    def __init__(self, kind: str, text: str, raw: str, punct: str = ""):
        self.kind, self.text, self.raw, self.punct = kind, text, raw, punct

    @property
    def low(self) -> str:
        return self.text.lower() if self.kind == "w" else ""


def _plain_tokens(chunk: str) -> list[str]:
    """Whitespace tokens of plain text, a bracket left open joined with what follows up to its close."""
    out, cur, depth = [], "", 0
    for tok in chunk.split():
        cur = f"{cur} {tok}" if cur else tok
        depth += sum(tok.count(c) for c in "([{") - sum(tok.count(c) for c in ")]}")
        if depth <= 0:
            out.append(cur)
            cur, depth = "", 0
    if cur:
        out.append(cur)
    return out


def _add_plain(chunk: str, items: list) -> None:
    for tok in _plain_tokens(chunk):
        # "!" after a digit, a bracket or a lone letter is a factorial ("5!", "(n-1)!", "n!"), else punctuation
        m = re.match(r"^(.*?)([,.;:?]+|(?<![\d)!])(?<!\b[A-Za-z])!+)?$", tok, re.S)
        core, punct = m.group(1), m.group(2) or ""
        if not core:
            if items and punct:
                items[-1].punct += punct
            continue
        core = core.strip("\"'`")
        if not core:
            continue
        low = core.lower()
        if _HYPHENATED_RE.fullmatch(core) or (len(core) > 1 and low in _SHORT_WORDS):
            kind = "w"
        elif _MATHY_RE.search(core) or re.fullmatch(r"[A-Za-z]!+", core) or low in _PLAIN_MATH_NAMES or not re.search(r"[A-Za-z\u2013\u2014]", core):
            kind = "m"
        elif re.fullmatch(r"[A-Za-z]{1,3}", core):
            kind = "l"     # a letter (or 'xy'): math only beside an operator, else a word
        else:
            kind = "w"
        items.append(_Item(kind, core, core, punct))


def _items(sentence: str) -> list:
    """The items of a sentence (see above); markdown emphasis and \\text{}-style wrappers outside math dropped."""
    s = re.sub(r"\*\*|__|`", "", sentence)
    items: list = []
    pos = 0
    for m in _MATH_SPAN_RE.finditer(s):
        _add_plain(_TEXT_WRAP_RE.sub(r"\1", s[pos:m.start()]), items)
        body = next(g for g in m.groups() if g is not None).strip()
        punct = ""
        while body and body[-1] in ",.;:" and not body.endswith("\\."):
            punct, body = body[-1] + punct, body[:-1].rstrip()
        if body:
            items.append(_Item("m", body, m.group(0), punct))
        pos = m.end()
    _add_plain(_TEXT_WRAP_RE.sub(r"\1", s[pos:]), items)
    # a letter is math next to an operator ("x = 5"), or after math ("\sum_{i=1}^{3} i", "3 x 4") unless it is
    # the article or the pronoun ("is 5 a prime"); 'xy' and the like only next to an operator ("12 cm" is a word)
    for i, it in enumerate(items):
        if it.kind == "l":
            prev = items[i - 1] if i else None
            nxt = items[i + 1] if i + 1 < len(items) else None
            after = prev is not None and prev.kind == "m" and not prev.punct
            beside = ((after and prev.text[-1] in "=+-*/^<>(")
                      or (nxt is not None and nxt.kind == "m" and not it.punct and nxt.text[0] in "=+-*/^<>)")
                      or (after and len(it.text) == 1 and it.text not in "aAI"))
            it.kind = "m" if beside else "w"
    return items


def _runs(items: list) -> list[tuple[int, int]]:
    """(first, last) item indices of each run of consecutive math items with no punctuation inside."""
    out, i = [], 0
    while i < len(items):
        if items[i].kind == "m":
            j = i
            while j + 1 < len(items) and items[j + 1].kind == "m" and not items[j].punct:
                j += 1
            out.append((i, j))
            i = j + 1
        else:
            i += 1
    return out


def _run_text(items: list, a: int, b: int) -> str:
    return " ".join(items[k].text for k in range(a, b + 1))


def _listed(items: list, a: int, starts: dict) -> tuple[int, str]:
    """The run that starts at item `a` with the runs listed after it ("5, 7, 9", "5, 7 and 9", "a = 3 and b = -4",
    "0, 1, ..., 100"): (its last item, the list as "5, 7, 9"). One answer naming several values is read whole, so
    it is credited only where the gold is that list (a list read as its first item credited 5 for "5, 7, 9")."""
    b = starts[a]
    parts = [_run_text(items, a, b)]
    while True:
        punct, nxt = items[b].punct, b + 1
        if punct[-1:] == ",":
            if "..." in punct:
                parts.append("\\ldots")
            if nxt < len(items) and items[nxt].low == "and" and not items[nxt].punct:
                nxt += 1
        elif not punct and nxt < len(items) and items[nxt].low == "and" and not items[nxt].punct:
            nxt += 1
        else:
            break
        if nxt not in starts:
            break
        b = starts[nxt]
        parts.append(_run_text(items, nxt, b))
    return b, ", ".join(parts)


def _top_level_eq(text: str) -> bool:
    depth = 0
    for c in text:
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "=" and depth <= 0:
            return True
    return False


def _clause_negated(items: list, upto: int) -> bool:
    """A negation in the clause that ends at item `upto`: back to the last , ; : or so/thus/hence/but."""
    for k in range(upto, -1, -1):
        it = items[k]
        if k < upto and it.punct and it.punct[-1] in ",;:":
            return False
        if it.low in _NEGATIONS or it.low.endswith("n't"):
            return True
        if it.low in _CLAUSE_WORDS:
            return False
    return False


def _tail_ok(items: list, b: int, strict: bool) -> bool:
    """What follows the expression that ends at item `b` leaves it the answer: nothing, a remark after a comma,
    or words that neither negate it nor offer another ("$x = 1/2$ is not a solution", "is 8 or 9"); `strict`: nor
    compare it or add a second expression ("is 5 units", not "is 5 more than", "is 2 when n is odd")."""
    rest = items[b + 1:]
    if not rest:
        return True
    if items[b].punct:
        if items[b].punct[-1] in ",;" and rest[0].low in _HEDGE_WORDS:
            return False
        return not (items[b].punct[-1] in ",;" and rest[0].low in ("or", "and") and
                    any(it.kind == "m" for it in rest[1:3]))
    if rest[0].low in ("or", "nor") or (rest[0].low == "and" and len(rest) > 1 and rest[1].kind == "m"):
        return False
    clause = []
    for it in rest:
        clause.append(it)
        if it.punct:
            break
    if any(it.low in _NEGATIONS or it.low.endswith("n't") for it in clause):
        return False
    if not strict:
        return True
    if rest[0].low in _BAD_FOLLOW:
        return False
    return not any(it.kind == "m" for it in clause)


def _after(items: list, k: int, skip=_FILLERS) -> int:
    """Index of the first item after `k` that is not a filler word ("exactly", "then", ...)."""
    j = k + 1
    while j < len(items) and items[j].low in skip and not items[j - 1].punct:
        j += 1
    return j


def _explicit_answer(items: list) -> tuple[int, str] | None:
    """'the (final) answer is X', 'Answer: X', 'the answer to the question is: X': the last such X, as written up
    to the end of its clause (words kept: 'No', 'infinitely many', '12 cm'); None if negated or one of several."""
    found = None
    for k, it in enumerate(items):
        if it.low not in ("answer", "answers"):
            continue
        j = None
        if it.punct.endswith(":"):
            j = k + 1
        else:
            q = k + 1
            if q < len(items) and items[q].low == "to":   # "the answer to the question is"
                while q < len(items) and items[q].low not in ("is", "would", "must", "should", "will") and not items[q].punct:
                    q += 1
            if q < len(items) and items[q].low == "is":
                j = q + 1
            elif q + 1 < len(items) and items[q].low in ("would", "must", "should", "will") and items[q + 1].low == "be":
                j = q + 2
            elif q < len(items) and items[q].kind == "m" and items[q].text == "=":
                j = q + 1
        if j is None or j >= len(items) or _clause_negated(items, k):
            continue
        j = _after(items, j - 1, {"therefore", "then", "thus", "indeed", "clearly", "simply", "just", "exactly"})
        phrase = []
        for it2 in items[j:]:
            phrase.append(it2)
            if it2.punct and it2.punct[-1] in ",;.!?":
                break
        if not phrase or phrase[0].low in _NEGATIONS or phrase[0].low in ("either", "maybe", "perhaps", "probably"):
            continue
        if any(p.low in ("or", "nor") for p in phrase):
            continue
        text = " ".join(p.raw for p in phrase)
        end = j + len(phrase) - 1
        if items[j].kind == "m":
            starts = dict(_runs(items))
            if j in starts and starts[j] >= end:
                end, text = _listed(items, j, starts)
        if end + 1 < len(items) and items[end + 1].low in _HEDGE_WORDS:
            continue      # "The answer is 5, unless n is odd": no single answer
        found = (j, text)
    return found


def sentence_answer(sentence: str) -> str | None:
    """The answer a sentence states, or None when it states none. Read in this order:

    1. a \\boxed{...}: its content;
    2. an explicit answer: "the (final) answer is X", "Answer: X", "the answer to the question is: X" (X to the end of
       its clause, words kept, so "the answer is no" gives "No");
    3. a sentence that opens with Yes or No and a punctuation mark ("No, it is impossible.", "Thus, yes: ...");
    4. the last expression stated as a result: "there are X ..." ("there are 144 ways to fill a 2 x 11 rectangle"
       gives 144, not the rectangle), "in X ways", "X is the only/smallest/unique ...", "is (equal to) X", "equals X",
       "must be X", "comes out to X", "we get/find/have X", "gives/yields X", and an expression "lhs = X" that ends
       the sentence (or is followed only by its condition, "for all n >= 1") after a word that states a result
       (so, thus, hence, we get, a comma or colon) -- never after a premise ("such that a+b+c=99", "Suppose k = 2",
       "where f(3) = 81", "with x + y + z = 15");
    5. a sentence that is nothing but math ("$x = 5$", "42").

    Refused, so no answer: a negated statement ("The answer is not 5.", "does not equal 48", "3 is not the only
    value"), one of several values ("is 8 or 9", "x = 5/2 or x = -1"), a bound or a comparison ("is at least 36",
    "is 5 more than"), and a fact stated in passing ("since 5 divides n."). The math is returned as written inside its
    $...$ (math-verify reads "f(3) = 81" as 81 against a number gold)."""
    rest = answers.after_retraction(sentence)
    if rest is not None:      # "Actually, 7.", "Wait, it's 7.", "Correction: 7.": what follows is the answer
        return sentence_answer(rest) if re.search(r"[A-Za-z0-9]", rest) else None
    if "\\boxed" in sentence:
        b = answers.outer_boxed(sentence)
        if b and b[2]:
            return b[2]
    items = _items(sentence)
    if not items:
        return None
    words = {it.low for it in items}
    if words & {"unless", "otherwise"} or ("either" in words and "or" in words):
        return None     # "The answer is 5, unless n is odd, then it is 7.": no single answer
    exp = _explicit_answer(items)
    if exp:
        return exp[1]
    lead = 0
    while lead < len(items) - 1 and items[lead].low in _LEADING_WORDS:
        lead += 1
    if items[lead].low in ("yes", "no") and (items[lead].punct or lead == len(items) - 1):
        return items[lead].text
    best: tuple[int, str] | None = None

    def offer(a: int, b: int, text: str | None = None):
        nonlocal best
        if best is None or a >= best[0]:
            best = (a, text if text is not None else _run_text(items, a, b))

    runs = _runs(items)
    starts = {a: b for a, b in runs}
    ends = {b: a for a, b in runs}
    n = len(items)
    for k, it in enumerate(items):
        w = it.low
        # there are X ..., there exist(s) X ...
        if w == "there" and k + 1 < n and items[k + 1].low in ("are", "is", "were", "exist", "exists") and not it.punct:
            j = _after(items, k + 1, _FILLERS | {"a", "total", "of", "in", "altogether", "overall"})
            e, listed = _listed(items, j, starts) if j in starts else (None, None)
            if j < n and j in starts and not _clause_negated(items, k) and _tail_ok(items, e, strict=False):
                offer(j, e, listed)
            elif (j + 1 < n and items[j].low == "infinitely" and items[j + 1].low == "many"
                  and not _clause_negated(items, k)):
                best = (j, "infinitely many") if best is None or j >= best[0] else best
        # in X ways
        elif w == "in" and k + 1 in starts and not it.punct:
            b = starts[k + 1]
            if b + 1 < n and items[b + 1].low in ("ways", "different", "distinct") and not items[b].punct:
                if not _clause_negated(items, k):
                    offer(k + 1, b)
        # X is the only / smallest / unique ... ; X is the answer
        elif (w in ("is", "are") and k - 1 in ends and not items[k - 1].punct and k + 2 < n
              and items[k + 1].low in ("the", "our") and (items[k + 2].low in _SUPERLATIVES)):
            a = ends[k - 1]
            if a == 0 or not _clause_negated(items, a - 1):
                offer(a, k - 1)
        # is X, equals X, we get X, gives X, must be X, is equal to X, comes out to X
        if w in _VERBS or (w == "to" and k and items[k - 1].low in ("equal", "out", "amounts", "comes", "adds", "up")):
            if it.punct or (w == "be" and not (k and items[k - 1].low in _MODALS)):
                continue
            if w == "equal" and k + 1 < n and items[k + 1].low == "to":
                continue      # "is equal to X": the 'to' carries it
            j = _after(items, k)
            if j < n and items[j].low == "equal" and j + 1 < n and items[j + 1].low == "to":
                j = _after(items, j + 1)
            e, listed = _listed(items, j, starts) if j in starts else (None, None)
            if j in starts and not _clause_negated(items, k) and _tail_ok(items, e, strict=True):
                if not (k and items[k - 1].low in _NEGATIONS):
                    offer(j, e, listed)
    # lhs = X ending the sentence, after a result word
    eq_runs = [(a, b) for a, b in runs if _top_level_eq(_run_text(items, a, b))]
    listed = None
    if eq_runs:
        a, b = eq_runs[-1]
        for a0, _ in runs:      # the last equation closes a list of them: read from the list's first one
            if a0 < a and _listed(items, a0, starts)[0] == b:
                a, listed = a0, _listed(items, a0, starts)[1]
                break
        later_math = any(items[q].kind == "m" for q in range(b + 1, n))
        cond_after = b + 1 < n and items[b + 1].low in ("for", "when", "where", "if", "since", "as", "because",
                                                       "with", "whenever", "provided")
        prev = a - 1     # the word that introduces it, fillers ("that", "finally") skipped
        while prev >= 0 and items[prev].low in _FILLERS and not items[prev].punct:
            prev -= 1
        purpose = prev >= 0 and items[prev].low == "so" and items[prev + 1].low == "that"     # "so that x = 5"
        if prev < 0:
            stated = True
        elif items[prev].punct and items[prev].punct[-1] in ",:":
            stated = items[prev].low not in ("where", "if", "when", "with", "let", "suppose", "assume")
        else:
            stated = items[prev].low in _RESULT_WORDS and not purpose
        if stated and (not later_math or cond_after) and not _clause_negated(items, a - 1 if a else 0) \
                and _tail_ok(items, b, strict=False):
            offer(a, b, listed)
    if best is not None:
        return best[1]
    if all(it.kind == "m" for it in items[lead:]) and runs:
        return " ".join(it.text + it.punct for it in items[lead:]).rstrip(",.;:!? ")
    return None


def _math_answer(text: str, depth: int = 0) -> str | None:
    """The math an answer candidate states, for math-verify: a text with no prose (`_has_prose`) as it is (its
    $...$ delimiters dropped), so every purely mathematical answer reaches math-verify as before; a text with prose
    reduced to the answer found in it (`sentence_answer`: "3 is the only possible value" -> 3, "The number of
    solutions is 8" -> 8) or to the expression it opens with before words that neither negate it nor offer another
    ("8 solutions"; not "5 or 7", "5 is not possible"). A multiple-choice letter before its value ("(B) 12") is
    the letter. A number in words is its digits ("exactly one" -> 1), a count of times its count ("n times" -> n),
    and a gloss in brackets after the answer is dropped ("100 (all values)" -> 100; not "5 (or 7)"). None when it
    states no math ("No, it is impossible", "I am not sure")."""
    out: str | None
    said = answers.number_words(text)
    if said is not None and " " not in said:
        return said
    text = _times_unit(text)
    cut = answers.parenthetical(text, _has_prose)
    if len(cut) > 1 and cut[0] and not any(answers.hedges(g) for g in cut[1:]):
        text = cut[0]
    if not _has_prose(text):
        out = text.strip()
        if "$" in out or "\\(" in out or "\\[" in out:
            out = " ".join(it.text + it.punct for it in _items(out)).rstrip(",;:. ")
        out = out or None
    else:
        out = None
        items = _items(text)
        sa = sentence_answer(text) if depth < 2 else None
        if sa is not None and sa.strip() != text.strip():
            return _math_answer(sa, depth + 1)
        runs = _runs(items)
        if runs and runs[0][0] == 0:
            a, b = runs[0]
            rest = items[b + 1:]
            if (not any(it.low in _NEGATIONS or it.low.endswith("n't") for it in rest)
                    and _tail_ok(items, b, strict=False)
                    and not (rest and rest[0].low in _BAD_FOLLOW)):
                out = _run_text(items, a, b)
    if out is None:
        return None
    c = _CHOICE_RE.match(out)
    return f"({c.group(1)})" if c else out


_TIMES_RE = re.compile(r"^(.*?\S)\s*(?:\\text\s*\{\s*times\s*\}|\btimes)\s*\.?$")


def _times_unit(text: str) -> str:
    """The word "times" read as math-verify cannot (it reads "n times" as n·t·i·m·e·s): a count of times without
    its unit ("n times" -> "n"), a product in words as a product ("2 times 3" -> "2 \\times 3")."""
    m = _TIMES_RE.match(str(text).strip())
    if m:
        return m.group(1)
    return re.sub(r"(?<=[\w)}])\s+times\s+(?=[\w(\\])", r" \\times ", text)


def extract_answers(response: str, mode: str = FILE_MODE) -> list[tuple[str, str]]:
    """What a response states as an answer under extraction `mode` (not 'auto'): (extractor, text) pairs,
    at most one per extractor of the mode, in the order they appear in the response (the last is its final
    answer, `final_answer`). answer_line: the last "Answer: ..." line, surrounding $, ** and a final period
    removed (a boxed answer on it is taken from its box); boxed: the last \\boxed{}'s content;
    last_sentence: the answer the final sentence states (`sentence_answer`), and no candidate when it states
    none, so a closing "Done." or "since 5 divides n." is no answer and coverage counts only answers found.
    The boxed candidate is the last outermost box, boxes inside it unwrapped (`answers.outer_boxed`). In a mode that
    reads prose (with last_sentence), a retraction after the last answer line or box ("Actually, 7.", "Wait",
    "Correction: ...", `answers.RETRACTION_RE`) withdraws it: the value the retraction states is the answer; with
    none stated, a bare one ("Wait.") or one that says the answer was wrong leaves the response no answer (no
    candidate), and one that confirms it ("Actually, this matches the estimate") leaves it."""
    parts = mode.split("+")
    out = []   # (position in the response, extractor, text)
    end = -1   # where the last answer line or box ends
    if "answer_line" in parts:
        lines = list(_ANSWER_LINE_RE.finditer(response))
        if lines:
            text = lines[-1].group(1).strip().rstrip(".").strip().strip("*$").strip()
            if "\\boxed{" in text:
                # an "Answer: \boxed{x}" line: the boxed candidate covers it when the mode has one
                text = "" if "boxed" in parts else ((answers.outer_boxed(text) or (0, 0, ""))[2])
            if text:
                out.append((lines[-1].start(), "answer_line", text))
                end = max(end, lines[-1].end())
    if "boxed" in parts:
        boxed = answers.outer_boxed(response)
        if boxed and boxed[2]:
            out.append((boxed[0], "boxed", boxed[2]))
            end = max(end, boxed[1])
    if "last_sentence" in parts:
        sent = last_sentence(response)
        if sent and len(sent) > MAX_CANDIDATE:   # bounded work: a run-on "sentence" is read by its last part
            sent = sent[-MAX_CANDIDATE:].split(None, 1)[-1]
        found = sentence_answer(sent) if sent else None
        said = _ANSWER_LINE_RE.match(sent.lstrip("*# ")) if sent and not found else None
        if said and said.group(1).strip():
            found = said.group(1).strip()     # "Answer: ???": an answer, unreadable, and still the final one
        at = response.rfind(sent) if sent else -1
        if found:
            out.append((at, "last_sentence", found))
        if end >= 0 and (not found or at < end):
            back = None
            for back in answers.RETRACTION_RE.finditer(response, end):
                pass
            if back is not None:
                said_in = _SENTENCE_SPLIT_RE.split(response[back.start():back.start() + MAX_CANDIDATE].strip(), 1)[0]
                said = sentence_answer(said_in)
                if said:
                    out.append((back.start(), "last_sentence", said))
                elif answers.withdraws(said_in):
                    return []       # the answer was taken back ("Wait.", "that is wrong") and no other given
    return [(k, t) for _, k, t in sorted(out, key=lambda x: x[0])]


def final_answer(response: str, mode: str = FILE_MODE) -> tuple[str, str] | None:
    """The response's one final answer under `mode`: the candidate that comes last in the response (as
    verl's DAPO scorer takes the last "Answer:" and math-verify one final answer), or None. A response
    that states several answers is graded by its last one only: an earlier one is never credited."""
    cands = extract_answers(response, mode)
    return cands[-1] if cands else None


def answer_candidates(response: str, mode: str = FILE_MODE) -> list[str]:
    """What a response claims as its answer, as math-verify is handed it: each candidate wrapped in \\boxed{}
    for its LaTeX parser (the last sentence's is the answer found in it); empty when the response has none
    (see `extract_answers`)."""
    return [f"\\boxed{{{t}}}" for _, t in extract_answers(response, mode)]


# Words that are math when a gold is read as text (so "pi" or "\\infty" stay math, "No" does not).
_MATH_WORDS = {"pi", "infty", "inf", "infinity", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp",
               "sqrt", "frac", "dfrac", "cdot", "times", "le", "ge", "leq", "geq", "ne", "neq", "in", "cup", "cap",
               "mathbb", "left", "right", "pm", "mp", "circ", "deg", "emptyset", "varnothing", "arcsin", "arccos",
               "arctan", "sinh", "cosh", "tanh", "max", "min", "gcd", "lcm", "mod", "bmod", "pmod"}
_TEXT_WRAP_RE = re.compile(r"\\(?:text|mathrm|textbf|textit|mbox|operatorname)\s*\{([^{}]*)\}")
# Names that are math in plain text too ("sum_(k=1)^n", "lim", "binom"): no prose.
_PLAIN_MATH = _MATH_WORDS | {"sum", "prod", "lim", "binom", "choose", "det", "arg", "floor", "ceil", "to", "dx", "dy",
                             "dt", "mathrm", "text", "quad", "qquad", "ldots", "cdots", "dots", "int", "infty"}
# Short words that make a gold a sentence (longer ones: any word of 4+ letters with a vowel that is no math name).
_PROSE_SHORT = {"is", "are", "the", "of", "be", "it", "we", "not", "its", "was", "has", "can", "all", "any",
                "yes", "no", "odd", "one", "two", "six", "ten", "way", "our", "but", "if", "so", "by", "as", "at"}


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


def text_answer(text: str) -> str:
    """Text normalised for comparison as words: its words (lower case) and numbers in order, \\text{}-style
    wrappers, $, markdown and punctuation dropped ('2 \\text{inequalities}.' -> '2 inequalities')."""
    t = _TEXT_WRAP_RE.sub(r"\1", str(text))
    return " ".join(w.lower() for w in re.findall(r"[A-Za-z]+|\d+(?:\.\d+)?", t))


def _is_prose_word(w: str) -> bool:
    low = w.lower()
    if low in _PLAIN_MATH:
        return False
    return low in _PROSE_SHORT or (len(low) >= 4 and re.search(r"[aeiou]", low) is not None)


def _has_prose(text: str) -> bool:
    """Whether a text is (partly) an English sentence: a word that is no math name and no product of variables
    ('xy', 'xyz'): 'is', 'the', ... or a word of four letters or more with a vowel ('inequalities', 'equivalently').
    Backslash commands (\\frac, \\sqrt) and \\text{}-style contents beside math do not count: those are units
    ("10\\text{ inches}"), which math-verify drops itself."""
    t = re.sub(r"\\[A-Za-z]+", " ", _TEXT_WRAP_RE.sub(" ", str(text)))
    return any(_is_prose_word(w) for w in re.findall(r"[A-Za-z]+", t))


def gold_forms(gold: str) -> list[str]:
    """The math texts a gold is credited by. A gold with no prose: itself. A gold that is (partly) a sentence: its
    short forms -- each alternative it names ("C(10, 5), or equivalently 252" -> C(10, 5) and 252) and the answer
    its sentence states (`sentence_answer`: "The limit exists and is equal to 2/3" -> 2/3, "3 is the only possible
    value" -> 3); [] when it states none ("2 inequalities": compared as text, `text_answer`). A gloss keeps the
    value it glosses, in brackets or not ("100 (i.e., all values)", "100, that is, all of them", "100 (all values)"
    -> 100; `answers.parenthetical`, `answers.GLOSS_RE`); a number in words is its digits ("Exactly one" -> 1)."""
    said = answers.number_words(gold)
    if said is not None and " " not in said:
        return [said]
    pieces = [q for p in answers.parenthetical(str(gold), _has_prose) for q in answers.GLOSS_RE.split(p)]
    if len(pieces) == 1 and not _has_prose(gold):
        return [_times_unit(gold)]
    forms = []
    for part in pieces:
        part = part.strip().strip(",;").strip()
        if part.endswith(".") and not part.endswith("\\."):
            part = part[:-1].strip()
        if not part:
            continue
        if not _has_prose(part):
            forms.append(part)
            continue
        said = sentence_answer(part)
        m = _math_answer(said) if said else None
        if m and not _has_prose(m):
            forms.append(m)
    return list(dict.fromkeys(forms))


def _says_words(text: str, words: str, anywhere: bool = False) -> bool:
    """A final answer that states the text gold `words` (normalised, `text_answer`/`word_answer`): its words are
    `words`; or it opens with them, followed by punctuation or its end for a one-word gold ("No, it is impossible"
    for "no"; not "No matter what, ...") and by anything for a gold of several words ("2 inequalities hold"); or it
    ends with "is/are/answer <words>" ("So the answer is No."). `anywhere` (a whole final sentence): also
    "is/are <words>" inside it for a gold of several words ("there are 2 inequalities here")."""
    t = _TEXT_WRAP_RE.sub(r"\1", str(text)).replace("**", "").strip().strip("$").strip()
    n = text_answer(t)
    if not n or not words:
        return False
    if n == words or n.endswith((f" is {words}", f" are {words}", f" answer {words}")):
        return True
    several = " " in words
    body = r"\W+".join(map(re.escape, words.split()))
    if re.match(r"^\W*" + body + (r"\b" if several else r"(?=\s*(?:[,.;:!?(\u2014\u2013-]|$))"), t, re.I):
        return True
    return anywhere and several and re.search(r"\b(?:is|are|answer)\W+" + body + r"\b", t, re.I) is not None


def _negated(text: str) -> bool:
    """Whether a text holds a negation word ("not", "never", "isn't", ...)."""
    return any(w in _NEGATIONS or w.endswith("n't") for w in re.findall(r"[a-z']+", str(text).lower()))


def _is_constant(parsed: list) -> bool:
    try:
        c = parsed[0].doit() if hasattr(parsed[0], "doit") else parsed[0]
        return bool(getattr(c, "is_number", False))
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input; then no claim
        return False


def _free_letters(text: str) -> set[str]:
    """Letters of a math text that name a free variable: not a command or math name (\\frac, sqrt, sum, pi), not a
    constant (e, i), not bound ("k=" of a sum's index, "n\\to" of a limit) and not named on the left of a top-level
    "=" ("f(x) = 1")."""
    t = re.sub(r"\\(?:text|mathrm|textbf|mbox|operatorname)\s*\{[^{}]*\}", " ", str(text))
    depth, cut = 0, -1
    for i, c in enumerate(t):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "=" and depth <= 0:
            cut = i
    bound = set(re.findall(r"([A-Za-z])\s*(?:=|\\to\b|\\in\b)", t))
    rhs = t[cut + 1:] if cut >= 0 else t
    rhs = re.sub(r"\\[A-Za-z]+", " ", rhs)
    rhs = re.sub(r"[A-Za-z]{2,}", lambda m: " " if m.group(0).lower() in _PLAIN_MATH else m.group(0), rhs)
    return set(re.findall(r"[A-Za-z]", rhs)) - bound - {"e", "i"}


def _misread(text: str, parsed: list) -> bool:
    """math-verify's parse of a gold that drops what the gold says: a number, from a text with prose or with a free
    variable ("sum_(k=1)^n 1/k" -> 1: `Answer: 1` would be credited and the true answer, which depends on n, not)."""
    return bool(parsed) and _is_constant(parsed) and (_has_prose(text) or bool(_free_letters(text)))


MAX_CANDIDATE = 2000   # characters of one answer candidate handed to math-verify (longer: no answer, 'too_long')


class MathVerifier:
    """Reward by math-verify for real math data: 1.0 if the response's answer equals the gold one.

    A response is graded by its one final answer under its extraction `mode` (of the candidates the mode finds --
    default answer_line+boxed: its DAPO "Answer:" line and its last \\boxed{} -- the one that comes last among those
    that read as an answer, as `final_answer` orders them); an earlier, hedged answer is never credited. A candidate
    with words is reduced to the math it states (`_math_answer`: "3 is the only possible value" -> 3, "12 cm" -> 12).

    Golds (`gold_spec`): a gold with no prose is parsed as \\boxed{answer} (falling back to the raw text), cached
    per answer string; a parse that drops what the gold says (`_misread`: "sum_(k=1)^n 1/k" read as 1) is refused,
    so nothing is credited against it and `gold_check` flags it. A gold that is (partly) a sentence is graded by its
    short forms (`gold_forms`: "C(10, 5), or equivalently 252" by C(10, 5) and 252). A gold that is words
    (`word_answer`: "Yes", "No", "infinitely many") or words and numbers with no short form ("2 inequalities") is
    compared as normalised text, not by math-verify (which reads "No" as N·o and rewards "On"): a final answer that
    opens with a yes/no gold's word counts ("No, it is impossible"); `stats` counts those responses under
    'as_words'. Unparseable gold or response, and any math-verify error, give 0.0 and are counted in `stats`; a call
    never raises.
    """
    # grading rules beyond math-verify's own (cache keys hold it: value.verifier_id, the gold check's stage key).
    # final-1: the final answer only. answers-2: last_sentence reads the answer its sentence states (no candidate
    # when none; negations refused); golds with prose graded by their short forms or as text; misread golds
    # refused; a final answer opening with a yes/no gold's word credited; candidates with words reduced to their math.
    # answers-3 (issue 62): one committed value (a list, an alternative or two differing values joined by "=" is
    # credited only where the gold names the same; the outermost box; the last candidate final, parsed or not; a
    # retraction after the last answer withdraws it in prose modes); golds keep the value a gloss glosses; the form
    # a problem asks for and the prompt's own expressions; negative sentences, lists of assignments, n!, display
    # math, number words and counts.
    REVISION = "answers-3"

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
        self._spec: dict[str, tuple] = {}
        self._gold_texts: dict[str, list[str]] = {}     # gold -> the texts of its forms, beside their parses
        self._prompts: dict[str, tuple] = {}            # prompt -> (forms it asks for, its expressions)

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
        """math-verify's own parse of a gold text (cached): \\boxed{answer}, else the raw text."""
        if answer not in self._gold:
            self._gold[answer] = self._parsed(f"\\boxed{{{answer}}}") or self._parsed(answer)
        return self._gold[answer]

    def gold_spec(self, answer: str) -> tuple[str, object]:
        """How a gold is graded (cached): ('text', normalised words) for a word gold and a words-and-numbers gold
        with no short form; else ('math', [parse, ...]): the parses of its forms (`gold_forms`) that read it
        (`_misread` ones dropped), [] when none does (an unparseable gold)."""
        if answer not in self._spec:
            said = answers.number_words(answer)      # "Exactly one" is the number 1, not words
            words = word_answer(answer) if said is None or " " in said else None
            forms = [] if words is not None else gold_forms(answer)
            if words is None and not forms:
                words = text_answer(answer)
            if words is not None:
                self._spec[answer] = ("text", words)
            else:
                parses, texts = [], []
                for f in forms:
                    p = self._gold_for(f)
                    if p and not _misread(f, p):
                        parses.append(p)
                        texts.append(f)
                self._spec[answer] = ("math", parses)
                self._gold_texts[answer] = texts
        return self._spec[answer]

    def _prompt(self, prompt: str) -> tuple[set, set]:
        """(the forms a prompt asks for, the normalised texts of its expressions and their "="-sides), cached."""
        if prompt not in self._prompts:
            items = _items(answers.superscripts(prompt[:20_000]))
            exprs = set()
            for a, b in _runs(items):
                run = _run_text(items, a, b)
                exprs.update(answers.normal_math(x) for x in [run, *answers.eq_sides(run)] if x)
            self._prompts[prompt] = (answers.asked_forms(prompt), exprs)
        return self._prompts[prompt]

    def _commits(self, text: str, math: str, golds: list[str]) -> bool:
        """Whether a final answer commits to one value, or to the several its gold names: no alternative the gold
        has not ("5 (or 7)", "5 \\lor 7", "\\pm 3", "either ... or"), no list where the gold is one value ("5, 7",
        "0, 1, ..., 100"), and no two differing numbers joined by "=" ("5 = 7", "x = 5 = 7"; "3^4 = 81" is one value,
        and in "\\binom{5}{4} + 1 = 31" the computation is no second answer)."""
        if (answers.hedges(text) | answers.hedges(math)) - set().union(*map(answers.hedges, golds)):
            return False
        if len(answers.top_level_items(math)) > 1 and max(map(answers.n_values, golds)) < 2:
            return False
        values = [self._parsed(f"\\boxed{{{x}}}") for x in answers.eq_sides(math) if answers.is_plain_value(x)]
        t = self._timeout()
        return all(a and b and self._verify(a, b, timeout_seconds=t) for a, b in zip(values, values[1:]))

    def _words(self, problem: Problem, response: str, cands: list, words: str) -> float:
        """The grade against a gold compared as text (`word_answer`, `text_answer`): the final answer states its
        words (`_says_words`); or, for a count ("98 values", "two solutions"), its number with the same noun or
        with none where the question asks for that noun ("How many values ..." -> `Answer: 98`); or, in a mode
        that reads prose, the final sentence as a whole states them ("So there are 2 inequalities.", "The sequence
        is not periodic." for that gold) with no negation the gold does not have."""
        final = cands[-1][1] if cands else None
        if final is not None and _says_words(final, words):
            return 1.0
        count = answers.count(problem.answer) or answers.count(answers.number_words(problem.answer) or "")
        if count and final is not None:
            said = answers.count(final) or answers.count(answers.number_words(final) or "")
            bare = re.fullmatch(r"\$?\s*(-?\d+)\s*\$?\.?", final.strip())
            if said and said[0] == count[0] and answers.same_noun(said[1], count[1]):
                return 1.0
            if bare and bare.group(1) == count[0] and re.search(r"\b" + re.escape(answers.noun_stem(count[1])),
                                                                problem.prompt, re.I):
                return 1.0
        if "last_sentence" in self.mode.split("+"):
            sent = last_sentence(response) or ""
            if _says_words(sent, words, anywhere=True) and (_negated(words) or not _negated(sent)):
                return 1.0
        if not cands:
            self.stats["unparsed_response"] += 1
        return 0.0

    def __call__(self, problem: Problem, response: str) -> float:
        self.stats["graded"] += 1
        try:
            kind, gold = self.gold_spec(problem.answer)
            cands = extract_answers(response, self.mode)
            if kind == "text":
                self.stats["as_words"] += 1
                return self._words(problem, response, cands, gold)
            if not gold:
                self.stats["unparsed_gold"] += 1
                return 0.0
            # the final answer: the last candidate, parsed or not (an "Answer: ???" after a box is no answer, and
            # the box before it is not the final one)
            text = cands[-1][1] if cands else ""
            if len(text) > MAX_CANDIDATE:
                self.stats["too_long"] += 1
            math = _math_answer(text) if text and len(text) <= MAX_CANDIDATE else None
            final = self._parsed(f"\\boxed{{{math}}}") if math else []
            if not final:
                self.stats["unparsed_response"] += 1
                return 0.0
            golds = self._gold_texts[problem.answer]
            if not self._commits(text, math, golds):
                return 0.0
            forms, exprs = self._prompt(problem.prompt)
            if (answers.is_expression(math) and answers.normal_math(math) in exprs
                    and not any(answers.normal_math(g) in exprs for g in golds)):
                return 0.0      # the question's own expression restated ("Factor x^4+x^2+1": x^4+x^2+1)
            t = self._timeout()
            return float(any(self._verify(g, final, timeout_seconds=t)
                             and (not forms or answers.has_form(forms, math, final[0], gt, g[0]))
                             for g, gt in zip(gold, golds)))
        except self._failures:  # a reward must never stop a run
            self.stats["errors"] += 1
            return 0.0


# ---------------------------------------------------------------------------------------------
# Problem files. Three shapes, detected per row from its columns:
#   DAPO-Math-17k (verl parquet): prompt = [{"role": "user", "content": ...}], reward_model.ground_truth
#   MATH-500: problem + answer, or problem + solution with a \boxed{} answer
#   plain: prompt (text or chat messages) + answer

def gold_responses(gold: str) -> list[str]:
    """The responses of a gold's own form: `Answer: g` and `\\boxed{g}`, then the same for each short form."""
    out = [f"Answer: {gold}", f"\\boxed{{{gold}}}"]
    if _has_prose(gold):
        for f in gold_forms(gold):
            out += [f"Answer: {f}", f"\\boxed{{{f}}}"]
    return list(dict.fromkeys(out))


def gold_check(answers: list[str], verifier: "MathVerifier | None" = None) -> dict:
    """Grade every distinct gold by the grader itself before a run: what the reward can never credit.

    A gold is flagged exactly when none of the responses of its own form (`gold_responses`: `Answer: g`,
    `\\boxed{g}` and the same for its short forms, "C(10, 5), or equivalently 252" -> `Answer: 252`) is credited
    by `verifier` (a MathVerifier in the default mode, whose gold reading is the one every mode uses). Returns
    {'n': distinct golds, 'words': golds compared as text (words, or words and numbers with no short form), and
    the flagged golds by why: 'constant' (math-verify reads the gold as written as a number its text does not
    state: "sum_(k=1)^n 1/k" -> 1, a sentence read as 1; the grader refuses that reading), 'unparseable' (no form
    of it parses), 'reject_short' (a gold with prose whose short forms are not credited) or 'reject_themselves'
    (the rest)}. Each listed gold can never be rewarded as its text means."""
    v = verifier or MathVerifier()
    out = {"n": 0, "words": 0, "unparseable": [], "reject_themselves": [], "constant": [], "reject_short": []}
    for g in dict.fromkeys(answers):
        out["n"] += 1
        try:
            kind, _ = v.gold_spec(g)
        except v._failures:
            kind = "math"
        if kind == "text":
            out["words"] += 1
        q = Problem("gold check", g)
        if any(v(q, r) for r in gold_responses(g)):
            continue
        try:
            raw = v._gold_for(g)
        except v._failures:
            raw = []
        forms = gold_forms(g) if kind == "math" else []
        if raw and _misread(g, raw):
            out["constant"].append(g)
        elif kind == "math" and not any(v._gold_for(f) for f in forms):
            out["unparseable"].append(g)
        elif kind == "math" and _has_prose(g):
            out["reject_short"].append(g)
        else:
            out["reject_themselves"].append(g)
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
            f"{len(check['reject_short'])} reject their short form"
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
