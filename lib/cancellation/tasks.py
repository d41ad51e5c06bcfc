"""The tiny profile's task: generated column arithmetic, its vocabulary and its exact reward.

The tiny profile's task is synthetic column arithmetic with a chain-of-thought answer, written
one token per word/digit, e.g.

    Q: 4 7 + 3 8 = ? A: First ones digit : 7 + 8 = 1 5 , write 5 carry 1 . Next tens digit :
    4 + 3 + 1 = 8 , write 8 no carry . So the answer is \\boxed{ 8 5 } <eos>

Three kinds of token appear, as in real math rollouts: template/scaffold words (First, Next,
digit, write, So the answer is ...), whose wording is drawn at random because it never affects
correctness (a scaffold emitted with p ~ 1 carries no gradient); numbers and operators; and
decision words (carry / no carry, borrow) whose choice decides correctness. Pretraining traces
contain deliberate slips (see `make_trace`) so the base policy stays uncertain where it matters.

`Problem` (one question and its gold answer) is every task's problem, and `CoinFlip` the dry run's reward.
The paper profile reads real problem files instead through `sources.ProblemSource` (DAPO-Math-17k,
MATH-500-style or plain prompt/answer files), renders prompts with the tokenizer's chat template
and grades responses with math-verify (`grader.MathVerifier`), reading a response's answer as
`extract` does.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from . import seeds

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
    `grader.MathVerifier` (math-verify) instead.
    """
    got = extract_boxed(response)
    return float(got is not None and got == problem.answer.replace(" ", ""))

class CoinFlip:
    """The dry run's reward: a seeded coin flip per (problem, response), not a grade."""
    REPORT = "DRY RUN: random weights; every reward is a seeded coin flip, not a grade (timings and memory only)"

    def __init__(self, seed: int = 0):
        # one seeded stream per source, drawn in call order: random weights often decode to the same
        # (empty) text for every rollout, so a flip keyed on the text would never mix a group
        self.rng = random.Random(seed)

    def __call__(self, problem: Problem, response: str) -> float:
        return float(self.rng.random() < 0.5)
