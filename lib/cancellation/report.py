"""The browsable report: a static site of the executed notebooks and the figures of one profile.

`python -m cancellation.report --profile tiny --out site/` (`make report`) writes

    site/index.html            a contents list; the findings in short (findings.summary_sentence, README's sentence,
                               and the thesis in words, claims.thesis_reading); then per notebook of the manifest
                               (in its order): its paper panels, a link to the notebook as HTML, and each figure PNG
                               beside the claims it tests, with their verdicts
    site/claims.html           every row of the profile's claims registry, one anchor per claim id; for tiny also
                               the full Table 2 run's rows (`make table2`, data/results/tiny-table2/), anchored
                               apart (`anchor(claim, source)`): the registries of README's table
    site/notebooks/<nb>.html   the executed notebook (notebooks/executed/<profile>/<nb>.ipynb) by nbconvert, with a
                               header linking back to the index and the claims page
    site/figures/<name>.png    the figures of figures/<profile>/
    site/files/<path>          repository files the notebooks link to (docs, sources), so every link resolves

A figure's claims are the registry rows whose claim id starts with the figure's paper number
(`fig03b_...` beside `fig03_masked_updates.png`; the longest match wins, so `fig04_thesis_*` sit beside
`fig04_thesis.png` and not beside `fig04_category_shift.png`), plus RELATED: Fig. 8 plots Table 2's runs.
A notebook's rows beside no figure (tables, equations) are listed under its figures.

The counts are README's: for tiny, `findings.findings_registry` (each claim once: notebook 07 from its full run);
for another profile, its registry alone. The figures' captions are the profile's own registry (the run that drew them).
"""
from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pandas as pd

from . import claims as C
from . import findings as F
from . import manifest

ROOT = manifest.ROOT
# a figure whose claims carry another paper number: Fig. 8's curves are Table 2's runs; Fig. 7(a) shows
# sign partitioning's accuracy and drift (§4's rows and its Table 2 row)
RELATED = {"fig08": ("table2",), "fig07a": ("sec4", "table2_sign_partitioned")}
VERDICT_CLASS = {C.REPRODUCED: "ok", C.NOT_REPRODUCED: "bad", C.INCONCLUSIVE: "unsure", C.BY_CONSTRUCTION: "built",
                 C.NOT_DECIDABLE: "unsure", C.ABOUT_HALF: "unsure", C.NULL_PASSES: "built", C.NULL_DIFFERS: "built"}
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}
h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em} .panels{color:#555}
figure{margin:1.2em 0;display:flex;gap:1.2em;align-items:flex-start;flex-wrap:wrap}
figure img{max-width:560px;width:100%;border:1px solid #eee} figcaption{flex:1;min-width:320px;font-size:.9em}
table{border-collapse:collapse;font-size:.85em} td,th{border:1px solid #ddd;padding:.2em .4em;vertical-align:top}
.verdict{font-weight:600;white-space:nowrap} .ok{color:#1a7f37} .bad{color:#cf222e} .unsure{color:#9a6700}
.built{color:#6e7781} .muted{color:#777;font-size:.85em}
.findings{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:.6em 1em}
.findings h2{margin-top:.3em} .findings ul{padding-left:1.2em} .findings li{margin:.3em 0} nav.toc ol{columns:2;column-gap:2em;font-size:.9em}
nav.toc li{break-inside:avoid;margin:.15em 0}
body.wide{max-width:1800px}
table.claims{table-layout:fixed;width:100%;font-size:.8em}
table.claims td{overflow-wrap:anywhere;word-break:break-word}
table.claims code{font-size:.95em} table.claims .verdict{white-space:normal}
table.claims .detail{color:#555;font-size:.9em}
table.claims col.id{width:13%} table.claims col.v{width:8%} table.claims col.c{width:21%}
table.claims col.p{width:9%} table.claims col.m{width:21%} table.claims col.e{width:12%} table.claims col.r{width:16%}
"""
# the header injected into each notebook page (nbconvert's own page otherwise has no way back)
NB_HEADER = ('<nav class="report-nav" style="font:14px system-ui,sans-serif;padding:.5em 1em;'
             'border-bottom:1px solid #ddd;background:#f6f8fa"><a href="../index.html" style="color:#0969da">← the report</a>'
             ' · <a href="../claims.html" style="color:#0969da">every claim</a> · notebook {key}: <code>{stem}</code></nav>')


# ----------------------------------------------------------------------------- matching figures and claims
def paper_prefix(stem: str) -> str:
    """'fig07a_sign_partition' -> 'fig07a'; 'table2_batching' -> 'table2' (the naming scheme of manifest.py)."""
    m = re.match(r"(fig\d+[a-z]?|table\d+)", stem)
    return m.group(1) if m else stem


def figure_claims(stems: list[str], claim_ids: list[str]) -> dict[str, list[str]]:
    """Figure stem -> the claim ids shown beside it. A claim goes to the figure whose stem (score: its length)
    or paper number (score: that length) its id starts with, the longest first; RELATED adds rows by prefix."""
    out = {s: [] for s in stems}
    for cid in claim_ids:
        best, score = None, 0
        for s in stems:
            for key in (s, paper_prefix(s)):
                if cid.startswith(key) and (len(cid) == len(key) or not cid[len(key)].isdigit()) and len(key) > score:
                    best, score = s, len(key)
        if best is not None:
            out[best].append(cid)
    for s in stems:
        for pre in RELATED.get(paper_prefix(s), ()):
            out[s] += [c for c in claim_ids if c.startswith(pre) and c not in out[s]]
    return out


# ----------------------------------------------------------------------------- pages
def _e(x) -> str:
    return html.escape(str(x))


def _md(text) -> str:
    """Inline markdown of the registry's and README's sentences as HTML: **bold**, `code`, [text](link) -> text."""
    t = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", str(text))
    t = _e(t)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", t)


def _page(title: str, body: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body{attr}>\n{body}\n</body></html>\n")


def _measured(r) -> str:
    ci = "" if C.is_nan(r.lo) else f" [{F.fmt(r.lo)}, {F.fmt(r.hi)}]"
    return f"{F.fmt(r.measured)}{ci} {r.unit}, n = {r.n}"


def _verdict(v: str) -> str:
    return f'<span class="verdict {VERDICT_CLASS.get(v, "")}">{_e(v)}</span>'


def anchor(claim_id: str, source: str = "") -> str:
    """The HTML id of a claim's row in claims.html (ids may hold '+'); `source`: the registry's folder when it is
    not the profile's own (tiny-table2 repeats notebook 07's claim ids)."""
    return "claim-" + (f"{source}--" if source else "") + re.sub(r"[^A-Za-z0-9_-]", "-", claim_id)


def _claim_rows(reg: pd.DataFrame, ids: list[str], link: str = "claims.html") -> str:
    rows = reg.set_index("claim").loc[ids].reset_index()
    out = ["<table><tr><th>claim (paper)</th><th>paper</th><th>measured [95% CI]</th><th>verdict</th></tr>"]
    for _, r in rows.iterrows():
        out.append(f'<tr><td><a href="{link}#{anchor(r.claim)}">{_e(r.figure)}</a>: {_e(r.statement)}</td>'
                   f"<td>{_e(r.paper)}</td><td>{_e(_measured(r))}</td><td>{_verdict(r.verdict)}</td></tr>")
    return "\n".join(out) + "</table>"


# ----------------------------------------------------------------------------- registries
def _is_readme_profile(profile: str) -> bool:
    """Whether `profile` is the one README's table and counts are of (tiny: findings.README_REGISTRIES)."""
    return Path(F.README_REGISTRIES[0][0]).parent.name == profile


def registries(profile: str, root: Path = ROOT) -> list[tuple[str, str, pd.DataFrame]]:
    """(source folder, path, registry) per registry of the claims page: for tiny README's registries that exist
    (findings.readme_registry: a later one's label appended to its figure column), else the profile's own alone."""
    root = Path(root)
    regs = F.README_REGISTRIES if _is_readme_profile(profile) else ((f"data/results/{profile}/claims.parquet", ""),)
    out = [(Path(path).parent.name, path, F.readme_registry(root, ((path, tag),)))
           for path, tag in regs if (root / path).exists()]
    if not out:
        raise FileNotFoundError(f"no claims registry of profile {profile!r} under {root}")
    return out


def findings(profile: str, root: Path = ROOT) -> pd.DataFrame:
    """The rows the counts are of: for tiny README's (findings.findings_registry: each claim once, notebook 07 from its
    full `make table2` run when it exists), else the profile's registry."""
    if _is_readme_profile(profile):
        return F.findings_registry(root)
    return C.read_registry(Path(root) / "data" / "results" / profile / "claims.parquet")


def summary_html(every: pd.DataFrame, several: bool) -> str:
    """The one summary sentence (findings.summary_sentence, as README prints it), with README's lead-in."""
    lead = "The rows (notebook 07 counted once, from its full <code>make table2</code> run): " if several else \
        "The rows: "
    return (f'<p class="summary">{lead}<span class="sentence">{_e(F.summary_sentence(every))}</span> '
            "Inconclusive: the interval straddles the paper's side at this profile's n; not decidable: the test cannot "
            "be made on this task.</p>")


def thesis_html(every: pd.DataFrame) -> str:
    """The thesis in words (claims.thesis_reading, README's lines), as a list; empty without thesis rows."""
    rows = {r.claim[len(C.THESIS_PREFIX):]: r for _, r in every.iterrows() if r.claim.startswith(C.THESIS_PREFIX)}
    if not rows:
        return ""
    lines = [_md(x[2:] if x.startswith("- ") else x) for x in C.thesis_reading(rows)]
    return ("<p><b>The thesis</b> (notebook 04; shared tokens are those that also occur in a rollout of the opposite "
            "sign in the same group):</p><ul>" + "".join(f"<li>{x}</li>" for x in lines) + "</ul>")


# ----------------------------------------------------------------------------- pages
_CLAIMS_COLS = (("id", "claim id"), ("v", "verdict"), ("c", "claim (paper)"), ("p", "paper"),
                ("m", "measured [95% CI]; detail"), ("e", "estimator (unit)"), ("r", "rule"))


def _claims_table(reg: pd.DataFrame, source: str) -> str:
    out = ['<table class="claims"><colgroup>' + "".join(f'<col class="{c}">' for c, _ in _CLAIMS_COLS)
           + "</colgroup><thead><tr>" + "".join(f"<th>{t}</th>" for _, t in _CLAIMS_COLS) + "</tr></thead><tbody>"]
    for _, r in reg.iterrows():
        nb = manifest.find(str(r.notebook))
        nb_link = f' <a href="notebooks/{nb.notebook}.html">notebook {_e(nb.key)}</a>' if nb else ""
        detail = f'<div class="detail">{_e(r.detail)}</div>' if r.detail else ""
        out.append(f'<tr id="{anchor(r.claim, source)}"><td><code>{_e(r.claim)}</code>{nb_link}</td>'
                   f"<td>{_verdict(r.verdict)}</td><td>{_md(r.figure)}: {_e(r.statement)}</td><td>{_e(r.paper)}</td>"
                   f"<td>{_e(_measured(r))}{detail}</td>"
                   f"<td>{_e(r.estimator)} ({_e(r.resampling)})</td><td>{_e(r.rule_text)}</td></tr>")
    return "\n".join(out) + "</tbody></table>"


def claims_page(regs: list[tuple[str, str, pd.DataFrame]], every: pd.DataFrame, profile: str) -> str:
    """Every row of `regs` (`registries`), one table per registry; the summary sentence of `every` (`findings`)."""
    body = [f"<p><a href=\"index.html\">← the report</a></p><h1>Every claim of the {_e(profile)} profile</h1>",
            summary_html(every, len(regs) > 1),
            "<p>Each row: the paper's claim, the rule that decides it, the estimator and the unit it resamples.</p>"]
    for i, (source, path, reg) in enumerate(regs):
        nbs = ", ".join(sorted(set(reg.notebook.astype(str))))
        what = (f"The {_e(profile)} profile's registry" if i == 0 else
                f"Notebook {_e(nbs)}'s full run (<code>make table2</code>)")
        note = ("" if len(regs) == 1 else "; its notebook 07 rows are the light run, counted in the summary by the full "
                "run's rows below instead" if i == 0 else
                f"; profile <code>{_e(source)}</code>, counted in the summary in place of the light run's rows above")
        body.append(f'<h2 id="rows-{_e(source)}">{what}: {len(reg)} rows</h2>'
                    f'<p class="muted"><code>{_e(path)}</code>{note}</p>' + _claims_table(reg, "" if i == 0 else source))
    return _page(f"Claims ({profile})", "\n".join(body), cls="wide")


def index_page(reg: pd.DataFrame, profile: str, pngs: list[str], notebooks: dict[str, bool],
               regs: list[tuple[str, str, pd.DataFrame]] | None = None, every: pd.DataFrame | None = None) -> str:
    """`reg`: the profile's registry (the captions); `regs` and `every` (default: `reg` alone): the claims page's
    registries and the rows the summary counts."""
    regs = regs if regs is not None else [(profile, f"data/results/{profile}/claims.parquet", reg)]
    every = every if every is not None else reg
    n_rows = sum(len(r) for _, _, r in regs)
    head = [f"<h1>The cancellation hypothesis in critic-free RL: the {_e(profile)} profile's results</h1>",
            f"<p>Every figure of <code>figures/{_e(profile)}/</code> beside the paper's claims it tests and their "
            f"verdicts; <a href=\"claims.html\">every row of the claims registry</a> with its rule and interval. "
            "Each notebook links to its executed copy. Built by <code>make report</code>.</p>",
            '<div class="findings"><h2 id="findings">The findings in short</h2>',
            summary_html(every, len(regs) > 1), thesis_html(every), "</div>"]
    toc = ['<li><a href="#findings">The findings in short</a></li>']
    body: list[str] = []
    shown: set[str] = set()
    for f in manifest.FIGURES:
        mine = [p for p in pngs if manifest.owner(p) is f]
        shown.update(mine)
        nb = (f'<a href="notebooks/{f.notebook}.html">notebook {f.key}: <code>{f.notebook}</code></a>'
              if notebooks.get(f.notebook) else f"notebook {f.key}: <code>{f.notebook}</code> (not executed)")
        toc.append(f'<li><a href="#nb-{f.key}">{f.key}: {_e(", ".join(f.panels))}</a>'
                   + (": " + ", ".join(f'<a href="#{_e(p)}">{_e(p)}</a>' for p in mine) if mine else "") + "</li>")
        body.append(f'<h2 id="nb-{f.key}">{nb}</h2><p class="panels">{_e(", ".join(f.panels))} — {_e(f.about)}</p>')
        for source, path, other in regs[1:]:
            if (other.notebook.astype(str) == f.key).any():
                body.append(f'<p>Its full run (profile <code>{_e(source)}</code>): <a href="claims.html#rows-'
                            f'{_e(source)}">{int((other.notebook.astype(str) == f.key).sum())} rows on the claims '
                            "page</a>, counted in the summary in place of the rows below.</p>")
        ids = reg[reg.notebook.astype(str) == f.key].claim.tolist()
        by_fig = figure_claims(mine, ids)
        for p in mine:
            cap = (_claim_rows(reg, by_fig[p]) if by_fig[p] else
                   '<p class="muted">No claim row of its own: the notebook\'s rows are listed below.</p>')
            body.append(f'<figure id="{_e(p)}"><a href="figures/{_e(p)}.png"><img src="figures/{_e(p)}.png" '
                        f'alt="{_e(p)}"></a><figcaption><p><code>{_e(p)}.png</code></p>{cap}</figcaption></figure>')
        rest = [c for c in ids if not any(c in v for v in by_fig.values())]
        if rest:
            body.append(f"<p>Claims of notebook {f.key} beside no figure (tables, equations):</p>"
                        + _claim_rows(reg, rest))
    other = [p for p in pngs if p not in shown]
    if other:
        toc.append('<li><a href="#other-figures">Other figures</a></li>')
        body.append('<h2 id="other-figures">Other figures</h2>' + "".join(
            f'<figure id="{_e(p)}"><img src="figures/{_e(p)}.png" alt="{_e(p)}"><figcaption><code>{_e(p)}.png</code>'
            "</figcaption></figure>" for p in other))
    toc.append(f'<li><a href="claims.html">Every claim ({n_rows} rows)</a></li>')
    nav = '<nav class="toc"><h2 id="contents">Contents</h2><ol>' + "".join(toc) + "</ol></nav>"
    return _page(f"Report ({profile})", "\n".join(head + [nav] + body))


def notebook_header(page_text: str, stem: str) -> str:
    """The notebook page with a header (NB_HEADER) right after its <body> tag: back to the index and the claims."""
    nav = NB_HEADER.format(key=_e(stem[:2]), stem=_e(stem))
    new, n = re.subn(r"(<body[^>]*>)", lambda m: m.group(1) + "\n" + nav, page_text, count=1)
    return new if n else nav + page_text


# ----------------------------------------------------------------------------- links
class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("href", "src") and v is not None:
                self.links.append(v)
            if k in ("id", "name") and v:
                self.ids.add(v)


def parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def local_target(page: Path, link: str) -> tuple[Path, str] | None:
    """(file, fragment) a relative link of `page` points to; None for an absolute URL, data: URI or
    a fragment within the page."""
    u = urlsplit(link)
    if u.scheme or u.netloc or link.startswith("//") or not u.path:
        return None
    return (page.parent / unquote(u.path)).resolve(), u.fragment


def broken_links(site: Path) -> list[str]:
    """'page: link' for every relative link of every .html page under `site` that names no file in the site
    (or, for a link into a page of the site with a fragment, no element with that id)."""
    site = Path(site).resolve()
    pages = {p.resolve(): parse(p) for p in site.rglob("*.html")}
    bad = []
    for page, parsed in pages.items():
        for link in parsed.links:
            t = local_target(page, link)
            if t is None:
                continue
            target, frag = t
            if not target.is_file() or site not in target.parents:
                bad.append(f"{page.relative_to(site)}: {link}")
            elif frag and target in pages and frag not in pages[target].ids:
                bad.append(f"{page.relative_to(site)}: {link} (no id {frag!r})")
    return bad


def _carry_repo_links(page: Path, site: Path, source_dir: Path) -> str:
    """The notebook page's text with each relative link that names a repository file (as seen from the
    notebook's source folder) pointed at a copy under site/files/; other relative links are left as they are."""
    text = page.read_text(encoding="utf-8")

    def fix(m):
        attr, link = m.group(1), html.unescape(m.group(2))
        u = urlsplit(link)
        if u.scheme or u.netloc or not u.path or (page.parent / unquote(u.path)).is_file():
            return m.group(0)
        src = (source_dir / unquote(u.path)).resolve()
        if not src.is_file() or ROOT not in src.parents:
            return m.group(0)
        rel = src.relative_to(ROOT)
        dst = site / "files" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        new = Path("..") / "files" / rel
        return f'{attr}="{html.escape(new.as_posix() + ("#" + u.fragment if u.fragment else ""))}"'

    return re.sub(r'(href|src)="([^"]*)"', fix, text)


# ----------------------------------------------------------------------------- build
def convert(ipynb: Path, out_html: Path):
    """One executed notebook as a standalone HTML page (nbconvert's lab template, outputs as executed)."""
    import nbformat
    from nbconvert import HTMLExporter
    nb = nbformat.read(str(ipynb), as_version=4)
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    out_html.write_text(body, encoding="utf-8")


def build(profile: str = "tiny", out: str | Path = "site", root: Path = ROOT, notebooks: list[str] | None = None,
          log=print) -> Path:
    """Write the site for `profile` into `out` (replaced); `notebooks`: the stems to convert (default: every
    notebook of the manifest that has an executed copy). Returns the index page."""
    out, root = Path(out), Path(root)
    fig_dir, exec_dir = root / "figures" / profile, root / "notebooks" / "executed" / profile
    reg_path = root / "data" / "results" / profile / "claims.parquet"
    if not fig_dir.is_dir():
        raise FileNotFoundError(f"{fig_dir}: no figures for profile {profile!r} (make figures PROFILE={profile})")
    reg = C.read_registry(reg_path)
    regs, every = registries(profile, root), findings(profile, root)
    if out.exists():
        shutil.rmtree(out)
    (out / "figures").mkdir(parents=True)
    (out / "notebooks").mkdir()
    pngs = sorted(p.stem for p in fig_dir.glob("*.png"))
    for p in pngs:
        shutil.copyfile(fig_dir / f"{p}.png", out / "figures" / f"{p}.png")
    wanted = notebooks if notebooks is not None else [f.notebook for f in manifest.FIGURES]
    done = {}
    for stem in wanted:
        src = exec_dir / f"{stem}.ipynb"
        if not src.is_file():
            log(f"[report] {stem}: no executed copy in {exec_dir}; skipped")
            continue
        t0 = time.time()
        page = out / "notebooks" / f"{stem}.html"
        convert(src, page)
        page.write_text(notebook_header(_carry_repo_links(page, out, root / "notebooks"), stem), encoding="utf-8")
        done[stem] = True
        log(f"[report] {stem}.html ({time.time() - t0:.1f} s)")
    (out / "claims.html").write_text(claims_page(regs, every, profile), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(reg, profile, pngs, done, regs, every), encoding="utf-8")
    return index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cancellation.report", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--out", default="site", help="the site's folder (replaced)")
    a = ap.parse_args(argv)
    t0 = time.time()
    index = build(a.profile, a.out)
    bad = broken_links(Path(a.out))
    print(f"[report] {index} in {time.time() - t0:.0f} s" + (f"; {len(bad)} broken links:" if bad else ""))
    print("\n".join(bad), end="\n" if bad else "")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
