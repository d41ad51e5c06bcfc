"""Reading one committed answer (issue 62): text helpers of the grader (`grader.MathVerifier`) that need nothing
of it, so extract.py and grader.py import them and nothing here imports either.

- an answer commits to one value: a list ("5, 7", "0, 1, ..., 100"), alternatives ("5 (or 7)", "5 \\lor 7",
  "\\pm 3", "either ... or", "unless") or several boxes name several, and are credited only where the gold names
  the same (`several_values`, `hedges`);
- the last \\boxed{} is the outermost one (`outer_boxed`): "\\boxed{\\boxed{5} \\text{ or } \\boxed{7}}" states
  "5 or 7", not 7;
- a retraction ("Actually, 7.", "Wait", "Correction: ...") after the last answer withdraws it (`RETRACTION_RE`);
- golds with a gloss ("100 (i.e., all values)") keep the value before it (`parenthetical`, `GLOSS_RE`);
- number words ("Exactly one" -> 1) and counts ("98 values": 98 of the question's noun) (`number_words`, `count`);
- the form a problem asks for (factor, expand, simplify, lowest terms) and the prompt's own expressions
  (`asked_form`, `has_form`, `normal_math`).
"""
from __future__ import annotations

import re
from math import gcd

# ------------------------------------------------------------------------------ glosses of a gold
# Words that open a gloss: what follows restates the value before it ("100, i.e., all values").
GLOSS_RE = re.compile(r"\s*[,;]?\s*(?:\bor\s+equivalently\b|\bequivalently\b|\bi\.\s?e\.,?|\bthat\s+is,"
                      r"|\bnamely\b,?|\bin\s+other\s+words\b,?|\bor\s+simply\b)\s*", re.I)


def top_level_parens(text: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level "(...)" group of `text` (end exclusive); brackets of other kinds nest."""
    out, depth, start = [], 0, None
    for i, c in enumerate(text):
        if c in "([{":
            if depth == 0 and c == "(":
                start = i
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == ")" and start is not None:
                out.append((start, i + 1))
                start = None
            depth = max(depth, 0)
    return out


def parenthetical(text: str, is_prose) -> list[str]:
    """A text cut at its parenthesised glosses: [the text without them, each gloss's content]; [text] when it has
    none. A gloss is a top-level "(...)" whose content is prose (`is_prose`) or opens with a gloss word
    ("(i.e., all values)", "(that is, 252)", "(the only solution)"); a bracket of math ("f(x)", "(1, 2)") stays."""
    cuts = []
    for a, b in top_level_parens(text):
        inner = text[a + 1:b - 1]
        if is_prose(inner) or GLOSS_RE.match(inner):
            cuts.append((a, b))
    if not cuts:
        return [text]
    outside, pos = "", 0
    for a, b in cuts:
        outside += text[pos:a]
        pos = b
    outside += text[pos:]
    return [outside.strip()] + [text[a + 1:b - 1].strip() for a, b in cuts]


# ------------------------------------------------------------------------------ boxes
_BOX_TOKEN_RE = re.compile(r"\\boxed\s*\{|[{}]")


def _box_spans(text: str) -> list[tuple[int, int, int]]:
    """(start, content start, content end) of every top-level \\boxed{...} of `text`, one linear pass."""
    out, stack = [], []     # stack: for each open brace, the box it opens (start, content start) or None
    for m in _BOX_TOKEN_RE.finditer(text):
        tok = m.group(0)
        if tok == "}":
            if stack:
                opened = stack.pop()
                if opened is not None and not any(s is not None for s in stack):
                    out.append((opened[0], opened[1], m.start()))
        elif tok == "{":
            stack.append(None)
        else:
            stack.append((m.start(), m.end()))
    return out


def unbox(text: str) -> tuple[str, int]:
    """`text` with each \\boxed{X} inside it replaced by X, and how many boxes it held."""
    n = 0
    while True:
        spans = _box_spans(text)
        if not spans:
            return text, n
        n += len(spans)
        out, pos = "", 0
        for s, a, b in spans:
            out += text[pos:s] + text[a:b]
            pos = b + 1
        text = out + text[pos:]


def outer_boxed(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last outermost \\boxed{...}, boxes inside it unwrapped (so
    "\\boxed{\\boxed{5} \\text{ or } \\boxed{7}}" reads "5 \\text{ or } 7", a hedge, not 7, and "\\boxed{\\boxed{5}}"
    reads 5); None when there is none, or when a box after it is left unclosed (a cut-off final answer is no
    answer, and an earlier one is not the final)."""
    last = text.rfind("\\boxed")
    spans = _box_spans(text)
    if not spans or last >= spans[-1][2]:
        return None
    s, a, b = spans[-1]
    inner, _ = unbox(text[a:b])
    return s, b + 1, inner.strip()


# ------------------------------------------------------------------------------ several values in one answer
# Alternatives: a value offered beside another ("5 or 7", "5 \lor 7", "\pm 3", "either", "unless").
_HEDGE_RE = re.compile(r"\\lor\b|\\vee\b|∨|\\pm\b|\\mp\b|±|∓|\bor\b|\beither\b|\bunless\b|\botherwise\b", re.I)
_HEDGE_NAMES = {"\\lor": "or", "\\vee": "or", "∨": "or", "or": "or", "either": "or", "unless": "unless",
                "otherwise": "unless", "\\pm": "pm", "±": "pm", "\\mp": "mp", "∓": "mp"}


def hedges(text: str) -> set[str]:
    """The kinds of alternative a math text offers ('or', 'pm', 'mp', 'unless'); empty for one value. (An
    ellipsis is no alternative: "1 + 2 + \\cdots + 10" is one value, "0, 1, \\ldots, 100" a list.)"""
    return {_HEDGE_NAMES[m.group(0).lower()] for m in _HEDGE_RE.finditer(str(text))}


def top_level_items(text: str) -> list[str]:
    """The items of a math text at top level, split at commas and "and" outside brackets ("5, 7" -> [5, 7],
    "(1, 2)" -> one item, "a = 3 \\text{ and } b = 4" -> two); a comma between digit groups ("1,000") is a
    thousands separator, not a split."""
    t = re.sub(r"\\text\s*\{\s*and\s*\}|\band\b", ",", str(text))
    out, depth, cur = [], 0, ""
    for i, c in enumerate(t):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth <= 0 and not (re.search(r"(?<![\d.])\d{1,3}$", cur) and re.match(r"\d{3}(?!\d)", t[i + 1:])):
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    out.append(cur.strip())
    return [x for x in out if x]


def n_values(text: str) -> int:
    """How many values a math text lists: its top-level items, or the items inside the one bracket that encloses
    it ("(1, 2)", "\\{5, 7\\}": 2), so a gold tuple or set admits an answer that lists its values."""
    items = top_level_items(text)
    if len(items) != 1:
        return len(items)
    t = re.sub(r"\\left|\\right", "", items[0]).strip()
    if t.startswith("\\{") and t.endswith("\\}"):
        return len(top_level_items(t[2:-2]))
    if len(t) > 1 and t[0] in "([" and t[-1] in ")]" and top_level_parens("(" + t[1:-1] + ")") == [(0, len(t))]:
        return len(top_level_items(t[1:-1]))
    return 1


def eq_sides(text: str) -> list[str]:
    """The sides of a math text's top-level "=" signs ("x = 5 = 7" -> [x, 5, 7])."""
    out, depth, cur = [], 0, ""
    for c in str(text):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "=" and depth <= 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    out.append(cur.strip())
    return out


_PLAIN_VALUE_RE = re.compile(r"-?\d+(?:\.\d+)?|-?\\[dt]?frac\{\d+\}\{\d+\}|-?\d+\s*/\s*\d+")


def is_plain_value(text: str) -> bool:
    """A number as written, no operation on it ("7", "-2.5", "\\frac{3}{4}"): a side of "=" that states a value,
    where "\\binom{5}{4} + 1" is a computation (its slip does not make the value after it a second answer)."""
    return _PLAIN_VALUE_RE.fullmatch(str(text).strip()) is not None


# ------------------------------------------------------------------------------ retractions
# A sentence that takes back what came before it: after the last answer, it withdraws that answer.
RETRACTION_RE = re.compile(
    r"(?:^|(?<=[.!?])\s+|\n)[\s*]*(?:(?:no|oh|hmm+|um+|ah)\W{0,3}\s*)?"
    r"(?:actually|wait|correction|oops|scratch\s+that|on\s+second\s+thought|i\s+made\s+an?\s+(?:mistake|error)"
    r"|that(?:'s|\s+is)\s+(?:wrong|incorrect|not\s+right)|this\s+is\s+wrong|i\s+was\s+wrong)\b",
    re.I)
_RETRACTION_LEAD_RE = re.compile(
    r"^[\s*]*(?:(?:no|oh|hmm+|um+|ah)\W{0,3}\s*)?(?:actually|wait|correction|oops|scratch\s+that|on\s+second\s+thought)"
    r"\b[\s,:;!.\-\u2014]*(?:(?:it'?s|it\s+is|i\s+mean|i\s+meant|make\s+that|it\s+should\s+be|that\s+should\s+be)"
    r"\b[\s,:]*)?", re.I)


_ERROR_RE = re.compile(r"\b(?:wrong|mistake|error|incorrect|not\s+right|miscalculat\w*|mis-?counted|redo|recount)\b",
                       re.I)


def withdraws(sentence: str) -> bool:
    """Whether a retraction that states no value takes the answer back: it is the bare word ("Wait.", "Hmm,
    wait...") or says the answer was wrong ("that is wrong", "I made a mistake"); "Actually, this matches the
    estimate above" confirms it."""
    rest = after_retraction(sentence)
    return (rest is not None and not re.search(r"[A-Za-z0-9]", rest)) or _ERROR_RE.search(sentence) is not None


def after_retraction(sentence: str) -> str | None:
    """The rest of a sentence that opens with a retraction ("Actually, 7." -> "7.", "Wait, it's 7" -> "7");
    None when it opens with none."""
    m = _RETRACTION_LEAD_RE.match(sentence)
    return sentence[m.end():] if m else None


# ------------------------------------------------------------------------------ number words and counts
NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NUMBER_PHRASE_RE = re.compile(r"^(?:exactly|precisely|only|just)?\s*(" + "|".join(NUMBER_WORDS) + r")\b(.*)$", re.I)


def number_words(text: str) -> str | None:
    """The number a phrase of words names ("Exactly one" -> "1", "two solutions" -> "2"), with the words after it
    only when they are a plain noun phrase; None otherwise ("one of them is 5", "No")."""
    t = re.sub(r"\\(?:text|mathrm|textbf)\s*\{([^{}]*)\}", r"\1", str(text)).strip().strip("$*").strip().rstrip(".")
    m = _NUMBER_PHRASE_RE.match(t)
    if not m:
        return None
    rest = m.group(2).strip()
    if rest and not re.fullmatch(r"[A-Za-z]+(?:\s+[A-Za-z]+)?", rest):
        return None
    if rest and rest.lower().split()[0] in ("of", "is", "are", "or", "and", "more", "less", "fewer", "times"):
        return None
    return str(NUMBER_WORDS[m.group(1).lower()]) + (f" {rest}" if rest else "")


_COUNT_RE = re.compile(r"^\$?(-?\d+)\$?\s*(?:\\text\s*\{\s*)?([A-Za-z]+(?:[ -][A-Za-z]+)?)\s*\}?\.?$")


def count(text: str) -> tuple[str, str] | None:
    """A count: a number and the noun it counts ("98 values" -> ("98", "values"), "2 \\text{ inequalities}");
    None otherwise. The noun is a unit, not a statement: a verb or a connective after the number is none."""
    m = _COUNT_RE.match(str(text).strip())
    if not m:
        return None
    noun = m.group(2).lower()
    if noun.split()[0] in ("is", "are", "or", "and", "of", "times", "more", "less", "if", "when", "for", "to"):
        return None
    return m.group(1), noun


def noun_stem(noun: str) -> str:
    """A noun without its plural ending, for finding it in a question ("inequalities" -> "inequalit")."""
    w = noun.lower().split()[-1]
    for end, keep in (("ies", ""), ("es", "e"), ("s", ""), ("y", "")):
        if w.endswith(end) and len(w) > len(end) + 2:
            return w[: -len(end)] + keep if end != "es" else w[:-1]
    return w


def same_noun(a: str, b: str) -> bool:
    return noun_stem(a) == noun_stem(b)


# ------------------------------------------------------------------------------ the form a problem asks for
_FORM_RES = (
    ("factor", re.compile(r"(?:^|[.!?:]\s+|\n)\s*(?:completely\s+|fully\s+)?factor(?:ise|ize)?\b(?!\s+(?:of|is)\b)"
                          r"|\bfactor(?:ise|ize)?\s+(?:completely|fully)\b|\bin\s+factored\s+form\b"
                          r"|\bfactor(?:ise|ize)?\s+the\s+(?:following\s+)?(?:expression|polynomial)\b", re.I)),
    ("expand", re.compile(r"(?:^|[.!?:]\s+|\n)\s*expand\b|\bin\s+expanded\s+form\b", re.I)),
    ("lowest", re.compile(r"\blowest\s+terms\b|\bsimplest\s+form\b|\bcommon\s+fraction\b|\breduced\s+fraction\b",
                          re.I)),
    ("simplify", re.compile(r"(?:^|[.!?:]\s+|\n)\s*simplify\b|\bsimplest\s+(?:radical\s+)?form\b"
                            r"|\bsimplify\s+the\s+(?:following\s+)?expression\b", re.I)),
)


def asked_forms(prompt: str) -> set[str]:
    """The forms a problem asks its answer to take: 'factor', 'expand', 'simplify' (also for "simplest form"),
    'lowest' (lowest terms, a common fraction); empty when it asks none ("the largest prime factor of" is none)."""
    return {name for name, rx in _FORM_RES if rx.search(prompt or "")}


def _factors(expr) -> list:
    """The non-constant factors of a sympy expression as written, a power counted as its base that many times."""
    import sympy
    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    out = []
    for f in sympy.Mul.make_args(expr):
        if f.is_number:
            continue
        base, e = f.as_base_exp()
        if e.is_Integer and e > 0 and not base.is_number:
            out += [base] * int(e)
        else:
            out.append(f)
    return out


def _same_factor(a, b) -> bool:
    import sympy
    try:
        q = sympy.cancel(a / b)
        return bool(q.is_number) and q != 0
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input; then not the same
        return False


def _is_expanded(expr) -> bool:
    import sympy
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Mul) and sum(isinstance(a, sympy.Add) for a in node.args) and len(node.args) > 1:
            return False
        if isinstance(node, sympy.Pow) and isinstance(node.base, sympy.Add) and node.exp.is_Integer and node.exp > 1:
            return False
    return True


_FRACTION_RE = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}|(?<![\d.])(-?\d+)\s*/\s*(\d+)(?![\d.])")


def has_form(forms: set[str], cand_text: str, cand, gold_text: str, gold) -> bool:
    """Whether an answer (its text and sympy parse `cand`) has the forms a problem asks for, judged beside the
    gold's parse: 'factor' -- the gold's non-constant factors, each once (up to a constant), no more, no fewer
    (x^4+x^2+1 restated, or (x^2-1)(x^2+1) for (x-1)(x+1)(x^2+1), is not a factorisation); 'expand' -- no product
    or power of a sum left, where the gold has none; 'simplify' -- written no longer than the gold (two characters
    of slack, one spelling: `normal_math`), since math-verify's parse has already cancelled what the answer left
    uncancelled ("\\frac{(x-1)(x+1)}{x-1}" reads as x+1); 'lowest' -- every integer fraction written in lowest
    terms (6/8 is not, though math-verify reads it as 3/4)."""
    import sympy
    if "simplify" in forms and len(normal_math(cand_text)) > len(normal_math(gold_text)) + 2:
        return False
    if "lowest" in forms or "simplify" in forms:
        for m in _FRACTION_RE.finditer(cand_text):
            a, b = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
            if gcd(int(a), int(b)) > 1:
                return False
    try:
        c = cand.rhs if isinstance(cand, sympy.Equality) else cand
        g = gold.rhs if isinstance(gold, sympy.Equality) else gold
        if not isinstance(c, sympy.Basic) or not isinstance(g, sympy.Basic):
            return True
        if "factor" in forms:
            gf, cf = _factors(g), _factors(c)
            if len(gf) > 1:
                if len(cf) != len(gf):
                    return False
                rest = list(cf)
                for f in gf:
                    hit = next((k for k, x in enumerate(rest) if _same_factor(x, f)), None)
                    if hit is None:
                        return False
                    rest.pop(hit)
        if "expand" in forms and _is_expanded(g) and not _is_expanded(c):
            return False
    except Exception:  # noqa: BLE001 - a form we cannot judge is left to the equality check
        return True
    return True


# ------------------------------------------------------------------------------ the prompt's own expressions
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")


def superscripts(text: str) -> str:
    """Unicode superscripts as powers ("x⁴+x²" -> "x^4+x^2") and − as -, as a prompt may write them."""
    t = str(text).replace("−", "-")
    return re.sub(r"([⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+)", lambda m: "^" + m.group(1).translate(_SUPERSCRIPTS), t)


def normal_math(text: str) -> str:
    """A math text in one spelling, to find it in a prompt: no $, spaces, \\left/\\right, sizing or thin spaces;
    \\dfrac as \\frac, x^{2} as x^2, superscript digits as ^digits, − as -."""
    t = superscripts(text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    t = re.sub(r"\\left|\\right|\\[,;:!]|\\quad|\$|\s+", "", t)
    t = re.sub(r"\^\{(\w)\}", r"^\1", t)
    t = re.sub(r"\\frac\{(\w+)\}\{(\w+)\}", r"\1/\2", t)
    return t.replace("\\cdot", "*").replace("\\times", "*").rstrip(".")


def is_expression(text: str) -> bool:
    """A math text that is more than a number: it holds a letter or an operation (an answer that repeats it from
    the prompt may be the question restated; a number may be repeated because it is the answer)."""
    t = normal_math(text)
    return bool(re.search(r"[A-Za-z]|\d\s*[-+*/^!]|\\sqrt|\\frac", t)) and not re.fullmatch(r"-?\d+(\.\d+)?", t)
