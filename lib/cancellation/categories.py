"""Token categories for Fig. 4: Math / Template / Reasoning / Other.

A response is detokenised to text (leading-space markers Ġ/▁, ## continuations, byte pieces of a
multi-byte character), the text is split into words (LaTeX commands and numbers kept whole), every
word gets one category, and every token takes the category of the word it belongs to:

    token pieces ['ĠThere', 'fore', ',', 'Ġ3', 'x'] -> text ' Therefore, 3x'
    -> words ['Therefore', ',', '3', 'x'] -> Reasoning, Template, Math, Math
    -> tokens Reasoning, Reasoning, Template, Math, Math

Word categories come from one editable table, data/categories/category_map.csv (phrase, word,
regex and POS-tag rules, and the lexicon of the shipped tagger; its header explains them). A table
can `include` another and add `span` (role) rules: data/categories/arithmetic_roles.csv tags the
tiny task by role -- numbers a column computes, carry/borrow = Reasoning; operands copied from
the prompt = Math -- on top of the word rules. POS
tags come from NLTK: `nltk.pos_tag` when its tagger data is installed, otherwise (and by default
on the tiny profile, for machine-independent tables) an NLTK UnigramTagger over the shipped
lexicon backed off to a RegexpTagger. Nothing is ever downloaded.
"""
from __future__ import annotations

import codecs
import csv
import itertools
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from . import stats

CATEGORIES = ("Math", "Template", "Reasoning", "Other")
RULES = ("phrase", "word", "regex", "pos", "lexicon", "span", "include")
DEFAULT_MAP = Path(__file__).resolve().parents[2] / "data" / "categories" / "category_map.csv"
# the tiny task tagged by role (computed digits, carry/borrow = Reasoning; operands = Math): Fig. 4 on tiny
ROLES_MAP = DEFAULT_MAP.with_name("arithmetic_roles.csv")
SCHEMES = ("bytelevel", "sentencepiece", "wordpiece")
TAGGERS = ("auto", "shipped", "perceptron")

SPECIAL = "\ue000"  # stands in for a special token (<eos>, <|im_end|>) in the detokenised text
# Words: a special token, a line break, a LaTeX command or escaped symbol, a number, a run of
# letters (with an apostrophe inside), or any other single visible character.
WORD_RE = re.compile(r"\ue000|\n\s*|\\[A-Za-z]+|\\.|\d+(?:\.\d+)*|[^\W\d_]+(?:'[^\W\d_]+)?|\S")
LATEX_CMD = re.compile(r"\\[A-Za-z]+")
# Back-off rules of the shipped tagger for words not in the lexicon (NLTK book style, Penn tags).
TAG_PATTERNS = [
    (r"^-?\d+(?:[.,]\d+)*$", "CD"), (r"^[.!?]$", "."), (r"^,$", ","), (r"^[:;]$", ":"),
    (r"^[^\w\s]+$", "SYM"), (r".*ing$", "VBG"), (r".*ed$", "VBD"), (r".*ly$", "RB"),
    (r".*s$", "NNS"), (r".*", "NN"),
]


# ----------------------------------------------------------------------------- the category map
@dataclass
class CategoryMap:
    """The rules of category_map.csv, ready to apply."""
    phrases: dict      # first word -> [(tuple of words, category)], longest first
    words: dict        # lower-case word -> category
    regexes: list      # [(compiled regex, category)] in file order
    pos: list          # [(tag prefix, category)], longest prefix first
    lexicon: dict      # lower-case word -> Penn tag (shipped tagger)
    spans: list = None  # [(open words, close words, category)] in file order: role rules
    path: str = ""


def _map_rows(path: Path, _seen=()):
    """(file, line number, row) of a category table, `include` rows expanded in place."""
    if not path.exists():
        raise FileNotFoundError(f"category map not found: {path}")
    if path.resolve() in _seen:
        raise ValueError(f"{path}: include cycle ({' -> '.join(str(p) for p in _seen)})")
    lines = [(i + 1, ln) for i, ln in enumerate(path.read_text(encoding="utf-8").splitlines())
             if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.reader([ln for _, ln in lines])
    header = next(reader, [])
    if header[:3] != ["rule", "key", "value"]:
        raise ValueError(f"{path}: header must start with rule,key,value; got {header}")
    for (lineno, _), row in zip(lines[1:], reader):
        if row and row[0].strip() == "include":
            if len(row) < 2 or not row[1].strip():
                raise ValueError(f"{path}:{lineno}: include needs a file name in the key column")
            yield from _map_rows(path.parent / row[1].strip(), (*_seen, path.resolve()))
        else:
            yield path, lineno, row


def load_map(path: str | Path | None = None) -> CategoryMap:
    """Read the category table; a bad row raises an error naming the file and line."""
    path = Path(path or DEFAULT_MAP)
    phrases, words, regexes, pos, lexicon, spans = {}, {}, [], [], {}, []
    for where, lineno, row in _map_rows(path):
        if len(row) < 3:
            raise ValueError(f"{where}:{lineno}: expected rule,key,value[,note]; got {row}")
        rule, key, value = row[0].strip(), row[1], row[2].strip()
        if rule not in RULES:
            raise ValueError(f"{where}:{lineno}: unknown rule {rule!r}; allowed: {', '.join(RULES)}")
        if rule != "lexicon" and value not in CATEGORIES:
            raise ValueError(f"{where}:{lineno}: unknown category {value!r}; allowed: {', '.join(CATEGORIES)}")
        if rule == "span":
            ends = re.split(r"\s+(?:…|\.\.\.)\s+", key.strip().lower())
            if len(ends) != 2 or not all(ends):
                raise ValueError(f"{where}:{lineno}: a span key is 'OPEN … CLOSE' (alternatives with |, "
                                 f"'...' also works); got {key!r}")
            spans.append((frozenset(ends[0].split("|")), frozenset(ends[1].split("|")), value))
        elif rule == "phrase":
            slots = [s.split("|") for s in key.lower().split()]
            for words_ in itertools.product(*slots):
                phrases.setdefault(words_[0], []).append((tuple(words_), value))
        elif rule == "word":
            words[key.lower()] = value
        elif rule == "regex":
            try:
                regexes.append((re.compile(key), value))
            except re.error as e:
                raise ValueError(f"{path}:{lineno}: bad regex {key!r}: {e}") from None
        elif rule == "pos":
            pos.append((key, value))
        else:
            lexicon[key.lower()] = value
    for k in phrases:
        phrases[k].sort(key=lambda p: -len(p[0]))
    pos.sort(key=lambda p: -len(p[0]))
    return CategoryMap(phrases, words, regexes, pos, lexicon, spans, str(path))


def apply_spans(low_words, cats, spans):
    """Role rules: the Math words strictly between an opening word and the next closing word
    take the span's category; a word covered by several spans takes the first rule's (file order)."""
    out, done = list(cats), [False] * len(cats)
    for opens, closes, cat in spans:
        inside = False
        for i, w in enumerate(low_words):
            if inside and w in closes:
                inside = False
            elif inside and cats[i] == "Math" and not done[i]:
                out[i], done[i] = cat, True
            if not inside and w in opens:
                inside = True
    return out


# ------------------------------------------------------------------------------------ tagging
def perceptron_available() -> bool:
    """True if nltk.pos_tag can run here (its tagger data is installed). Never downloads."""
    import nltk
    try:
        nltk.data.find("taggers/averaged_perceptron_tagger_eng/")
        return True
    except LookupError:
        return False


def shipped_tagger(lexicon: dict):
    """NLTK UnigramTagger over the shipped lexicon, backed off to a RegexpTagger."""
    import nltk
    back = nltk.RegexpTagger(TAG_PATTERNS)
    return nltk.UnigramTagger(model=lexicon, backoff=back) if lexicon else back  # NLTK refuses an empty model


@lru_cache(maxsize=None)
def _byte_decoder() -> dict:
    """GPT-2 byte-level BPE: printable stand-in character -> byte (inverse of bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def piece_bytes(piece: str, scheme: str) -> bytes:
    """The bytes a token piece contributes to the text (with its leading space, if it marks one)."""
    if scheme == "bytelevel":
        dec = _byte_decoder()
        if all(c in dec for c in piece):
            return bytes(dec[c] for c in piece)
        return piece.encode()  # an added token written in plain text
    if scheme == "sentencepiece":
        m = _SP_BYTE.fullmatch(piece)
        return bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode()
    if scheme == "wordpiece":  # also word-level vocabularies: every piece is a word of its own
        return piece[2:].encode() if piece.startswith("##") else (" " + piece).encode()
    raise ValueError(f"unknown piece scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")


def detect_scheme(vocab) -> str:
    """'bytelevel' (Ġ markers), 'sentencepiece' (▁ markers) or 'wordpiece' (## or whole words)."""
    vocab = list(vocab)
    n = max(len(vocab), 1)
    if sum(p.startswith("Ġ") for p in vocab) / n > 0.01:
        return "bytelevel"
    if sum(p.startswith("▁") for p in vocab) / n > 0.01:
        return "sentencepiece"
    return "wordpiece"


def detokenise(pieces, scheme: str, special=frozenset(), _cache=None):
    """(text, token start offsets, special pieces in order) of one token sequence.

    Bytes go through an incremental UTF-8 decoder, so a character split over two tokens
    belongs to the token that completes it (the first piece gets an empty span).
    """
    dec = codecs.getincrementaldecoder("utf-8")("replace")
    cache = {} if _cache is None else _cache  # (scheme, piece) -> bytes
    chunks, specials = [], []
    for p in pieces:
        if p in special:
            chunks.append(SPECIAL)
            specials.append(p)
            continue
        b = cache.get((scheme, p))
        if b is None:
            b = cache[(scheme, p)] = piece_bytes(p, scheme)
        chunks.append(dec.decode(b))
    starts = np.zeros(len(chunks), dtype=np.int64)
    if chunks:
        starts[1:] = np.cumsum([len(c) for c in chunks[:-1]])
    return "".join(chunks), starts, specials


def split_words(text: str, specials=()):
    """Words of `text` and, for every character, the index of its word (spaces -> next word)."""
    words, spans = [], []
    sp = iter(specials)
    for m in WORD_RE.finditer(text):
        w = m.group()
        words.append(next(sp, w) if w == SPECIAL else w)
        spans.append(m.span())
    n = len(text)
    owner = np.full(n + 1, -1, dtype=np.int64)
    for k, (a, b) in enumerate(spans):
        owner[a:b] = k
    # a space (leading-space marker) belongs to the word after it; trailing spaces to the last word
    idx = np.where(owner >= 0, np.arange(n + 1), n + 1)
    nxt = np.minimum.accumulate(idx[::-1])[::-1]
    filled = np.where(nxt <= n, owner[np.minimum(nxt, n)], len(words) - 1)
    return words, filled


class Categorizer:
    """Tags words and tokens with CATEGORIES using a CategoryMap and an NLTK tagger.

    tagger: 'auto' (nltk.pos_tag if its data is installed, else the shipped tagger),
    'shipped' (the NLTK lexicon/RegexpTagger built from the table) or 'perceptron'.
    """

    def __init__(self, cmap: CategoryMap | str | Path | None = None, tagger: str = "auto"):
        if tagger not in TAGGERS:
            raise ValueError(f"tagger={tagger!r}; allowed: {', '.join(TAGGERS)}")
        self.map = cmap if isinstance(cmap, CategoryMap) else load_map(cmap)
        if tagger == "auto":
            tagger = "perceptron" if perceptron_available() else "shipped"
        if tagger == "perceptron" and not perceptron_available():
            raise LookupError("tagger='perceptron' needs NLTK's tagger data, which is not installed here (this "
                              "product never downloads it); use tagger='shipped' or install "
                              "'averaged_perceptron_tagger_eng' with nltk.downloader yourself")
        self.tagger = tagger
        self._shipped = shipped_tagger(self.map.lexicon) if tagger == "shipped" else None
        self._word_cache: dict = {}   # word -> category (context-free rules; shipped tags too)
        self._piece_cache: dict = {}  # token piece -> bytes

    # -- words
    def rule_category(self, word: str, tag: str | None = None) -> str | None:
        """Category from word, regex, then POS rules; None if only a tag could decide."""
        cat = self.map.words.get(word.lower())
        if cat:
            return cat
        for rx, c in self.map.regexes:
            if rx.fullmatch(word):
                return c
        if tag is None:
            return None
        for prefix, c in self.map.pos:
            if tag.startswith(prefix):
                return c
        return "Other"

    def _context_free(self, words: set):
        """Fill the word cache for `words` (one tagger call for all unseen words: the batching)."""
        todo = [w for w in words if w not in self._word_cache]
        untagged = []
        for w in todo:
            c = self.rule_category(w)
            if c is None:
                untagged.append(w)
            else:
                self._word_cache[w] = c
        if untagged and self._shipped is not None:
            for w, (_, tag) in zip(untagged, self._shipped.tag([w.lower() for w in untagged])):
                self._word_cache[w] = self.rule_category(w, tag or "NN")
        return untagged

    def word_categories(self, seqs: list[list[str]]) -> list[list[str]]:
        """Category of every word of every sequence (phrases and LaTeX braces use context)."""
        self._context_free({w for ws in seqs for w in ws})
        if self.tagger == "perceptron":
            import nltk
            tags = nltk.pos_tag_sents([[w for w in ws] for ws in seqs])
            base = [[self._word_cache.get(w) or self.rule_category(w, t) for w, t in wt] for wt in tags]
        else:
            base = [[self._word_cache[w] for w in ws] for ws in seqs]
        return [self._context(ws, cs) for ws, cs in zip(seqs, base)]

    def _context(self, words, cats):
        cats = list(cats)
        low = [w.lower() for w in words]
        i = 0
        while i < len(words):  # phrases: longest match at each word
            for ph, c in self.map.phrases.get(low[i], ()):
                if tuple(low[i:i + len(ph)]) == ph:
                    cats[i:i + len(ph)] = [c] * len(ph)
                    i += len(ph) - 1
                    break
            i += 1
        stack = []  # braces right after a LaTeX command take its category; others keep their rule
        for i, w in enumerate(words):
            if w == "{":
                if i > 0 and LATEX_CMD.fullmatch(words[i - 1]):
                    cats[i] = cats[i - 1]
                stack.append(cats[i])
            elif w == "}" and stack:
                cats[i] = stack.pop()
        if self.map.spans:
            cats = apply_spans(low, cats, self.map.spans)
        return cats

    # -- tokens
    def tag_sequences(self, seqs, scheme: str, special=frozenset()):
        """For each sequence of token pieces: (categories, words), one entry per token."""
        parsed = []
        for pieces in seqs:
            text, starts, specials = detokenise(pieces, scheme, special, self._piece_cache)
            words, owner = split_words(text, specials)
            parsed.append((words, owner[np.minimum(starts, len(text))] if len(text) else np.zeros(0, int)))
        wcats = self.word_categories([w for w, _ in parsed])
        out = []
        for (words, tok_word), wc in zip(parsed, wcats):
            if not words:  # nothing visible (e.g. only empty pieces)
                out.append((["Other"] * len(tok_word), [""] * len(tok_word)))
                continue
            out.append(([wc[k] for k in tok_word], [words[k] for k in tok_word]))
        return out

    def tag_pieces(self, pieces, scheme: str, special=frozenset()):
        return self.tag_sequences([list(pieces)], scheme, special)[0]

    def tag_ids(self, id_seqs, tokenizer):
        """tag_sequences for sequences of token ids of `tokenizer` (scheme detected from its vocab)."""
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        scheme = detect_scheme(np.array(vocab, dtype=object))
        # a model's vocabulary can be padded past the tokenizer's (Qwen: 151,936 > 151,669); a sampled
        # padded id has no text: it becomes a special piece of its own
        top = max((int(np.max(ids)) + 1 for ids in id_seqs if len(ids)), default=0)
        padded = [f"<pad:{i}>" for i in range(len(vocab), top)]  # as measure.token_strings
        vocab = np.array(vocab + padded, dtype=object)
        special = frozenset(tokenizer.all_special_tokens) | frozenset(padded)
        return self.tag_sequences([vocab[np.asarray(ids)].tolist() for ids in id_seqs], scheme, special)

    def tag_batch(self, batch, tokenizer) -> pd.DataFrame:
        """category and word of every response token, row-aligned with measure.token_table."""
        m = batch.response_mask
        tagged = self.tag_ids([batch.input_ids[i][m[i]].numpy() for i in range(len(batch))], tokenizer)
        return pd.DataFrame({"category": [c for cs, _ in tagged for c in cs],
                             "word": [w for _, ws in tagged for w in ws]})

    def tag_table(self, df: pd.DataFrame, tokenizer, seq_cols=("rollout",)) -> pd.DataFrame:
        """category and word for a token table (one row per token; a response = rows sharing
        `seq_cols`, ordered by `position`), aligned with df's rows."""
        cols = list(seq_cols) + ["position"]
        srt = df.sort_values(cols, kind="stable")
        keys = srt[list(seq_cols)].to_numpy()
        cut = np.flatnonzero((keys[1:] != keys[:-1]).any(1)) + 1 if len(srt) else np.zeros(0, int)
        ids = np.split(srt["token_id"].to_numpy(), cut)
        tagged = self.tag_ids(ids, tokenizer) if len(srt) else []
        out = pd.DataFrame({"category": [c for cs, _ in tagged for c in cs],
                            "word": [w for _, ws in tagged for w in ws]}, index=srt.index)
        return out.reindex(df.index)


def tag_naive(pieces, scheme: str, cz: Categorizer, special=frozenset()) -> list[str]:
    """The naive reference for `make bench`: every token on its own through the NLTK tagger and
    the rules, with no word assembly and no caching (one tagger call per token).

    Right only where a token is a whole word and no phrase/brace context applies.
    """
    tagger = cz._shipped or shipped_tagger(cz.map.lexicon)
    out = []
    for p in pieces:
        words = [p] if p in special else WORD_RE.findall(piece_bytes(p, scheme).decode("utf-8", "replace")) or [""]
        tag = tagger.tag([words[0].lower()])[0][1]
        out.append(cz.rule_category(words[0], tag or "NN"))
    return out


# ------------------------------------------------------------------------------- aggregation
def category_mass(df: pd.DataFrame, delta: str = "delta", by=(), eps: float = 1e-6, trim: float = 0.0) -> pd.DataFrame:
    """Per `by` group and category (all categories listed): boosted mass Σ max(Δ,0), suppressed
    mass Σ max(−Δ,0), token counts (all, Δ > ε, Δ < −ε), and each category's share of all
    boosted / suppressed mass of its group. `trim`: leave out each `by` group's `trim` share of rows
    with the largest |Δ| first (those above the group's 1 − trim quantile of |Δ|)."""
    by = list(by)
    if trim:
        a = df[delta].abs()
        cut = a.groupby([df[b] for b in by]).transform(lambda x: x.quantile(1 - trim)) if by else a.quantile(1 - trim)
        df = df[a <= cut]
    d = df[delta].to_numpy()
    x = df[by + ["category"]].assign(boosted_mass=np.clip(d, 0, None), suppressed_mass=np.clip(-d, 0, None),
                                    n_tokens=1, n_boosted=(d > eps).astype(int), n_suppressed=(d < -eps).astype(int))
    g = x.groupby(by + ["category"]).sum()
    full = pd.MultiIndex.from_product([*(sorted(df[b].unique()) for b in by), list(CATEGORIES)],
                                      names=by + ["category"]) if by else pd.Index(list(CATEGORIES), name="category")
    g = g.reindex(full, fill_value=0)
    for kind in ("boosted", "suppressed"):
        tot = g.groupby(level=by)[f"{kind}_mass"].transform("sum") if by else g[f"{kind}_mass"].sum()
        g[f"{kind}_share"] = g[f"{kind}_mass"] / tot
    return g.reset_index()


def update_mass(tokens: pd.DataFrame, updates=("positive_only", "grpo"), eps: float = 1e-6,
                trim: float = 0.0) -> pd.DataFrame:
    """category_mass per update and batch of a token table with `category`, `batch` and one `delta_<update>`
    column per update, for the categories the table holds (`trim`: as category_mass's, per update and batch)."""
    long = pd.concat([tokens.assign(update=u, delta=tokens[f"delta_{u}"]) for u in updates], ignore_index=True)
    mass = category_mass(long, "delta", by=("update", "batch"), eps=eps, trim=trim)
    return mass[mass.category.isin(tokens.category.unique())].reset_index(drop=True)


def mass_summary(mass: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per update, category and measure of `update_mass`'s table: mean over batches with a t interval."""
    measures = [c for c in mass.columns if c not in ("update", "batch", "category")]
    return pd.DataFrame([dict(update=u, category=c, measure=m, **dict(zip(("mean", "lo", "hi"),
                                                                           stats.t_interval(d[m], level))))
                         for (u, c), d in mass.groupby(["update", "category"]) for m in measures])


def paired_shift(mass: pd.DataFrame, updates=("positive_only", "grpo")) -> pd.DataFrame:
    """Per batch and category of `update_mass`'s table: boosted share under updates[1] minus under updates[0]
    (NaN where a batch has no boosted mass under an update)."""
    shares = mass.pivot_table(index="batch", columns=["update", "category"], values="boosted_share", dropna=False)
    return shares[updates[1]] - shares[updates[0]]


def share_shift(tokens: pd.DataFrame, updates=("positive_only", "grpo"), eps: float = 1e-6, level: float = 0.95):
    """Fig. 4's statistics from a token table with `category`, `batch` and one `delta_<update>`
    column per update.

    Returns (mass, summary, shift):
      mass     category_mass per update and batch (boosted / suppressed mass, counts, shares): update_mass;
      summary  per update, category and measure: mean over batches with a t interval (mean, lo, hi): mass_summary;
      shift    per batch and category: boosted share under updates[1] minus under updates[0]
               (the paired shift; NaN where a batch has no boosted mass under an update): paired_shift.
    """
    mass = update_mass(tokens, updates, eps)
    return mass, mass_summary(mass, level), paired_shift(mass, updates)


def shift_summary(shift: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per category: mean paired shift over batches with its t interval, and the batch count."""

    return pd.DataFrame([dict(category=c, **dict(zip(("mean", "lo", "hi"), stats.t_interval(shift[c], level))),
                              n=int(shift[c].notna().sum())) for c in shift.columns])
