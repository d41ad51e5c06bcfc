"""The claims registry in words and tables: README's first screen, docs/claims.md's table, the site's summary.

Everything here reads registries (`claims.read_registry`) and writes text; the rules, the Claim record and the
registry itself are claims.py's. `python -m cancellation.findings readme` (`make claims`) writes the tiny profile's
table (and the full Table 2 run's, `make table2`) into docs/claims.md between `<!-- claims:begin -->` and
`<!-- claims:end -->`, the counts per notebook into README.md between `<!-- claims-summary:begin -->` and
`<!-- claims-summary:end -->`, and README's first screen between `<!-- findings:begin -->` and `<!-- findings:end -->`.
The one summary (`summary_sentence`: rows per kind and verdict) is printed by README, docs/claims.md and the site.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from .claims import (BY_CONSTRUCTION, CONTROL_VERDICTS, NOT_DECIDABLE, NOT_REPRODUCED, REPRODUCED, THESIS_PREFIX,
                     THESIS_README, VERDICTS, ClaimsError, deciding_part, is_nan, judge, read_registry, thesis_reading)

CLAIMS_DOC = "docs/claims.md"
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"  # the full table (docs/claims.md)
SUMMARY_BEGIN, SUMMARY_END = "<!-- claims-summary:begin -->", "<!-- claims-summary:end -->"  # counts (README.md)
FINDINGS_BEGIN, FINDINGS_END = "<!-- findings:begin -->", "<!-- findings:end -->"  # README's first screen


def fmt(x) -> str:
    """A number as the tables print it (signed, 3 significant digits; — for none)."""
    return "—" if is_nan(x) else f"{x:+.3g}"


def table_markdown(df: pd.DataFrame) -> str:
    """The README table of a registry."""
    lines = ["| claim (paper) | paper | measured [95% CI], n | estimator (resampled unit) | rule | verdict |",
             "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        ci = "" if is_nan(r.lo) else f" [{fmt(r.lo)}, {fmt(r.hi)}]"
        meas = f"{fmt(r.measured)}{ci} {r.unit}, n = {r.n}".replace("|", "\\|")
        if r.detail:
            meas += f"; {r.detail}".replace("|", "\\|")
        cells = [f"{r.figure}: {r.statement}", r.paper, meas, f"{r.estimator} ({r.resampling})", r.rule_text,
                 f"**{r.verdict}**"]
        cells = [c.replace("\\|", "|").replace("|", "\\|").replace("\n", " ") for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(summary_sentence(df))
    return "\n".join(lines)


# The README's table: the tiny profile's registry, then the claims of the full Table 2 run
# (`make table2`, profile tiny-table2) when it has been run, labelled by how to reproduce them.
README_REGISTRIES = (("data/results/tiny/claims.parquet", ""),
                     ("data/results/tiny-table2/claims.parquet", " (`make table2`)"))


def readme_registry(root=".", registries=README_REGISTRIES) -> pd.DataFrame:
    """The registries of the README table that exist under `root`, concatenated; a label is
    appended to the figure column of the rows of each later registry."""
    frames = [read_registry(Path(root) / path).assign(figure=lambda d, t=tag: d.figure + t)
              for path, tag in registries if (Path(root) / path).exists()]
    if not frames:
        raise FileNotFoundError(f"no claims registry under {root}: {[p for p, _ in registries]}")
    return pd.concat(frames, ignore_index=True)


def summary_markdown(root=".", registries=README_REGISTRIES) -> str:
    """README's summary: claims per notebook and verdict, one row per notebook of each registry; the total
    counts each claim once (`findings_registry`: notebook 07's light run left out when its full run exists);
    then the thesis rows of THESIS_README (their reading in words is on the first screen, `findings_markdown`)."""
    lines = ["| notebook | claims | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * (len(VERDICTS) + 1)]
    for path, tag in registries:
        if not (Path(root) / path).exists():
            continue
        reg = read_registry(Path(root) / path)
        for nb, g in claims_only(reg).groupby("notebook", sort=True):
            counts = g.verdict.value_counts().reindex(list(VERDICTS), fill_value=0)
            lines.append(f"| {nb}{tag} | {len(g)} | " + " | ".join(str(counts[v]) for v in VERDICTS) + " |")
    once = claims_only(findings_registry(root, registries)).verdict.value_counts().reindex(list(VERDICTS), fill_value=0)
    label = "all (07 counted once: its full run)" if len(registries) > 1 and (Path(root) / registries[1][0]).exists() \
        else "all"
    lines.append(f"| {label} | {int(once.sum())} | " + " | ".join(f"**{once[v]}**" for v in VERDICTS) + " |")
    every = [r for path, _ in registries[:1] if (Path(root) / path).exists()
             for _, r in read_registry(Path(root) / path).iterrows() if r.claim.startswith(THESIS_PREFIX)]
    thesis = [r for r in every if r.claim[len(THESIS_PREFIX):] in THESIS_README]
    if thesis:  # the paper's thesis itself, row by row: what a reader looks for first
        lines += ["", "The thesis itself (notebook 04, Algorithm 2: each batch's updates taken from the same starting policy; "
                  "what would refute it is in each row's rule; every thesis row is in docs/claims.md):", "",
                  "| claim | measured [95% CI] | verdict |", "|---|---|---|"]
        for r in thesis:
            ci = "" if is_nan(r.lo) else f" [{fmt(r.lo)}, {fmt(r.hi)}]"
            cells = [r.statement, f"{fmt(r.measured)}{ci}", f"**{r.verdict}**"]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def decided_by(row) -> str:
    """Which clause of its rule decided a row's verdict, in words (the did-not-reproduce table's last column)."""
    p = json.loads(row["params"]) if isinstance(row["params"], str) else dict(row["params"])
    rule, lo, hi = row["rule"], row["lo"], row["hi"]
    if row["verdict"] == NOT_DECIDABLE:
        return "the test cannot be made here"
    if rule == "direction":
        s, ref = (1 if p.get("sign", 1) >= 0 else -1), p.get("ref", 0.0)
        if not (is_nan(lo) or is_nan(hi)) and max(s * (lo - ref), s * (hi - ref)) < 0:
            return f"the interval lies on the refuting side of {ref:g}"
        if p.get("paper") is not None:
            return f"the point on the wrong side of {ref:g}, the interval excluding the paper's {p['paper']:g}"
        return "the point on the wrong side (no interval)"
    if rule == "similar":
        return f"the interval lies outside {p.get('target', 0.0):g} ± {p['tol']:g}"
    if rule == "thesis_verdict":
        return f"its {deciding_part(p)} part"
    if rule == "all_of":
        bad = [name for name, r, pm, plo, phi, pp in p["parts"] if judge(r, pm, plo, phi, pp) == NOT_REPRODUCED]
        return "its part " + ", ".join(bad)
    if rule == "null_test":
        return "the real value inside its sign-shuffle null's central 95% (or beyond it on the other side)"
    if rule == "majority":
        return "the interval below a half"
    if rule == "exact":
        return "Fisher's test the other way"
    return rule


def claims_only(reg: pd.DataFrame) -> pd.DataFrame:
    """The rows that are claims (of the paper, or of what it implies): a null control's row is not one."""
    return reg[~reg.verdict.isin(CONTROL_VERDICTS)]


# what a row is, for the counts (`kind_of`): the paper's claims are counted apart from the rest
PAPER, CONTROLS, OTHERS, CONSTRUCTION = ("the paper's claims", "controls", "related work and other readings",
                                         "checks by construction")
KINDS = (PAPER, CONTROLS, OTHERS, CONSTRUCTION)


def kind_of(row) -> str:
    """A row's kind: a check that holds by construction; a control (a null control, a fixed-scaffold or regression
    control: the paper's column or the figure says so); related work or a reading the paper does not state (the
    paper's column starts "related work", "not the paper", "not stated"); else one of the paper's claims."""
    paper, figure = str(row["paper"]).lower(), str(row["figure"]).lower()
    if row["rule"] == "construction" or row["verdict"] == BY_CONSTRUCTION:
        return CONSTRUCTION
    if row["rule"] == "null_control" or row["verdict"] in CONTROL_VERDICTS or "control" in paper or "control" in figure:
        return CONTROLS
    if paper.startswith(("related work", "not the paper", "not stated")):
        return OTHERS
    return PAPER


def summary_counts(reg: pd.DataFrame) -> pd.DataFrame:
    """Per kind (KINDS, rows) and verdict (columns, those that occur): the number of rows; column 'rows' the total."""
    k = reg.apply(kind_of, axis=1) if len(reg) else pd.Series([], dtype=str)
    verdicts = [v for v in VERDICTS + CONTROL_VERDICTS if (reg.verdict == v).any()]
    t = pd.crosstab(k, reg.verdict).reindex(index=list(KINDS), columns=verdicts, fill_value=0)
    return t.assign(rows=t.sum(axis=1))


def summary_sentence(reg: pd.DataFrame) -> str:
    """The one summary of a registry, in words (README, docs/claims.md and the site print this sentence): the rows,
    then per kind its count and its verdicts."""
    t = summary_counts(reg)
    parts = []
    for kind, r in t.iterrows():
        if r.rows:
            vs = ", ".join(f"{int(r[v])} {v}" for v in t.columns if v != "rows" and r[v])
            parts.append(f"{kind}: {int(r.rows)} ({vs})")
    return f"{int(t.rows.sum())} rows: " + "; ".join(parts) + "."


def reproduced_line(reg: pd.DataFrame) -> str:
    """The first screen's line on what reproduced: per figure of the paper (the figure column up to its first comma or
    parenthesis), how many of its claim rows reproduced, of the paper's claims only, in the registry's order."""
    paper = reg[reg.apply(kind_of, axis=1) == PAPER] if len(reg) else reg
    key = paper.figure.str.replace(r"\s*[,(].*$", "", regex=True)
    parts = []
    for fig in dict.fromkeys(key):
        d = paper[key == fig]
        k = int((d.verdict == REPRODUCED).sum())
        if k:
            parts.append(f"{fig} {k} of {len(d)}")
    return ("**Reproduced** (the paper's claims, rows reproduced of those tested, per figure): " + "; ".join(parts)
            + ". The rest are inconclusive at this profile's n, not decidable, or below.")


def findings_registry(root=".", registries=README_REGISTRIES) -> pd.DataFrame:
    """Every claim counted once: the tiny registry, with notebook 07's rows taken from its full run
    (`make table2`, the later registry) when that exists instead of the light run the notebook calls a smoke test."""
    frames = [read_registry(Path(root) / p) for p, _ in registries if (Path(root) / p).exists()]
    if not frames:
        raise FileNotFoundError(f"no claims registry under {root}")
    if len(frames) > 1:
        full = set(frames[1].notebook)
        frames[0] = frames[0][~frames[0].notebook.isin(full)]
    return pd.concat(frames, ignore_index=True)


def findings_markdown(root=".", registries=README_REGISTRIES) -> str:
    """README's first screen, generated from the registries: where the results come from, the counts (each
    claim once), the thesis in words (`thesis_reading`) and every claim that did not reproduce."""
    every = findings_registry(root, registries)
    rows = {r.claim[len(THESIS_PREFIX):]: r for _, r in every.iterrows() if r.claim.startswith(THESIS_PREFIX)}
    out = ["**What was found, and on what.** Every result below is on the `tiny` profile: policies of 1.06M and 0.2M "
           "parameters that this repository trains on column arithmetic, on a CPU. **No result on the paper's models "
           "(Qwen3-1.7B/4B-Base, Qwen2.5-Math-7B) exists yet**: the paper profiles are built, tested on stand-ins and "
           "planned ([the paper profile](#the-paper-profile)), not run.", "",
           f"The rows (notebook 07 counted once, from its full `make table2` run): {summary_sentence(every)} "
           "Inconclusive: the 95% interval reaches both sides of the rule's reference value at this profile's n; not "
           "decidable: the test cannot be made on this task. Every row, its rule and its interval: "
           "[docs/claims.md](docs/claims.md).", "", reproduced_line(every), ""]
    if rows:
        out += ["**The thesis** (notebook 04; shared tokens are those that also occur in a rollout of the opposite "
                "sign in the same group):", "", *thesis_reading(rows), ""]
    bad = every[(every.verdict == NOT_REPRODUCED) & (every.apply(kind_of, axis=1) == PAPER)] if len(every) else every
    if len(bad):
        out += ["**Did not reproduce** (the paper's claims only; controls and related work are in "
                "[docs/claims.md](docs/claims.md)):", "",
                "| paper | claim | the paper says | measured [95% CI] | decided by |", "|---|---|---|---|---|"]
        for _, r in bad.iterrows():
            ci = "" if is_nan(r.lo) else f" [{fmt(r.lo)}, {fmt(r.hi)}]"
            meas = "a verdict of its parts" if is_nan(r.measured) else f"{fmt(r.measured)}{ci} {r.unit}".strip()
            cells = [str(r.figure), str(r.statement), str(r.paper), meas, decided_by(r)]
            out.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(out)


def _between(text: str, begin: str, end: str, body: str) -> str:
    return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: f"{begin}\n{body}\n{end}", text, flags=re.S)


def update_readme(readme="README.md", registry=None, root=None) -> bool:
    """Write the full table between BEGIN/END, the summary between SUMMARY_BEGIN/SUMMARY_END and the
    first screen between FINDINGS_BEGIN/FINDINGS_END, whichever
    markers `readme` has (of `registry`, a claims.parquet path, or by default the README's registries
    under `root`, default the file's folder); returns True when the file changed."""
    readme = Path(readme)
    root = Path(root) if root is not None else readme.resolve().parent
    text = readme.read_text()
    full, summary = BEGIN in text and END in text, SUMMARY_BEGIN in text and SUMMARY_END in text
    findings = FINDINGS_BEGIN in text and FINDINGS_END in text
    if not (full or summary or findings):
        raise ClaimsError(f"{readme}: markers {BEGIN} / {END} not found")
    new = text
    if full:
        reg = read_registry(registry) if registry else readme_registry(root)
        new = _between(new, BEGIN, END, table_markdown(reg))
    if summary:
        regs = ((str(Path(registry).resolve()), ""),) if registry else README_REGISTRIES
        new = _between(new, SUMMARY_BEGIN, SUMMARY_END, summary_markdown(root, regs))
    if findings:
        regs = ((str(Path(registry).resolve()), ""),) if registry else README_REGISTRIES
        new = _between(new, FINDINGS_BEGIN, FINDINGS_END, findings_markdown(root, regs))
    if new != text:
        readme.write_text(new)
    return new != text


def readme_table(readme="README.md", begin=BEGIN, end=END) -> str:
    text = Path(readme).read_text()
    return text[text.index(begin) + len(begin):text.index(end)].strip()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m cancellation.findings")
    ap.add_argument("command", choices=["readme", "show"])
    ap.add_argument("--registry", default=None, help="one claims.parquet (default: the README's registries)")
    ap.add_argument("--readme", default="README.md")
    a = ap.parse_args(argv)
    try:
        if a.command == "readme":
            root = Path(a.readme).resolve().parent
            src = a.registry or ", ".join(p for p, _ in README_REGISTRIES if (root / p).exists())
            targets = [Path(a.readme)] + ([root / CLAIMS_DOC] if a.registry is None and (root / CLAIMS_DOC).exists() else [])
            for t in targets:
                changed = update_readme(t, a.registry, root)
                print(f"{t}: claims {'updated' if changed else 'unchanged'} from {src}")
        else:
            print(table_markdown(read_registry(a.registry) if a.registry else readme_registry()))
    except (ClaimsError, FileNotFoundError) as e:  # one line naming the file, no traceback
        raise SystemExit(f"python -m cancellation.findings {a.command}: {e}") from None


if __name__ == "__main__":
    main()
