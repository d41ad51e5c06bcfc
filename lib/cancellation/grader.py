"""The grader of real math data: `MathVerifier` (math-verify on the final answer a response states), the gold
check before a run (`gold_check`, `gold_responses`, `gold_line`) and the line on how a run's rewards were graded
(`grading_report`). What a response states is read by `extract`; the task's own exact check is `tasks.verify`.
"""
from __future__ import annotations

import logging
import re
import threading

from . import answers
from .extract import (_NEGATIONS, _PLAIN_MATH, _TEXT_WRAP_RE, FILE_MODE, MAX_CANDIDATE, _has_prose, _items,
                      _math_answer, _run_text, _runs, check_answer_mode, extract_answers, gold_forms, last_sentence,
                      text_answer, word_answer)
from .tasks import CoinFlip, Problem

log = logging.getLogger(__name__)


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
