"""Problem files and `ProblemSource`: where a run's problems come from, how prompts are rendered and graded.

Problem files. Three shapes, detected per row from its columns:
  DAPO-Math-17k (verl parquet): prompt = [{"role": "user", "content": ...}], reward_model.ground_truth
  MATH-500: problem + answer, or problem + solution with a \\boxed{} answer
  plain: prompt (text or chat messages) + answer
A source with no file is the generated arithmetic task (`tasks`), graded by its exact check; a file's responses are
graded by math-verify (`grader.MathVerifier`), its golds checked before a run (`grader.gold_check`).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

from . import cache, stage
from .dryrun import dry_run
from .extract import FILE_MODE, check_answer_mode, extract_answers, last_boxed
from .grader import MathVerifier, gold_check, gold_line, grading_report
from .tasks import KINDS, CoinFlip, Problem, sample_problems, verify


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
