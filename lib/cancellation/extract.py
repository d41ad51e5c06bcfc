"""What a response states as its answer (English and LaTeX), and the forms a gold answer is credited by.

The reward's named extraction modes (`ANSWER_MODES`: answer_line, boxed, last_sentence and their '+'
combinations; `check_answer_mode`), the candidates a mode finds in a response (`extract_answers`,
`final_answer`, `answer_candidates`), the answer a sentence states (`sentence_answer`, read over
`last_sentence`), the math an answer candidate states (`_math_answer`), golds read as words or text
(`word_answer`, `text_answer`) and a gold's short forms (`gold_forms`). Text only: nothing here grades
(that is `grader.MathVerifier`) and nothing here imports the task, the grader or the problem files; the
smaller text helpers of one committed answer are in `answers`.
"""
from __future__ import annotations

import re

from . import answers

MAX_CANDIDATE = 2000   # characters of one answer candidate handed to math-verify (longer: no answer, 'too_long')


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
