"""The browsable report: a static site of the executed notebooks and the figures of one profile.

`python -m cancellation.report --profile tiny --out site/` (`make report`) writes

    site/index.html            per notebook of the manifest (in its order): its paper panels, a link to the
                               notebook as HTML, and each figure PNG beside the claims it tests, with their verdicts
    site/claims.html           every row of the profile's claims registry, one anchor per claim id
    site/notebooks/<nb>.html   the executed notebook (notebooks/executed/<profile>/<nb>.ipynb) by nbconvert
    site/figures/<name>.png    the figures of figures/<profile>/
    site/files/<path>          repository files the notebooks link to (docs, sources), so every link resolves

A figure's claims are the registry rows whose claim id starts with the figure's paper number
(`fig03b_...` beside `fig03_masked_updates.png`; the longest match wins, so `fig04_thesis_*` sit beside
`fig04_thesis.png` and not beside `fig04_category_shift.png`), plus RELATED: Fig. 8 plots Table 2's runs.
A notebook's rows beside no figure (tables, equations) are listed under its figures.
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
"""


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


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")


def _measured(r) -> str:
    ci = "" if C._nan(r.lo) else f" [{C._fmt(r.lo)}, {C._fmt(r.hi)}]"
    return f"{C._fmt(r.measured)}{ci} {r.unit}, n = {r.n}"


def _verdict(v: str) -> str:
    return f'<span class="verdict {VERDICT_CLASS.get(v, "")}">{_e(v)}</span>'


def anchor(claim_id: str) -> str:
    """The HTML id of a claim's row in claims.html (ids may hold '+')."""
    return "claim-" + re.sub(r"[^A-Za-z0-9_-]", "-", claim_id)


def _claim_rows(reg: pd.DataFrame, ids: list[str], link: str = "claims.html") -> str:
    rows = reg.set_index("claim").loc[ids].reset_index()
    out = ["<table><tr><th>claim (paper)</th><th>paper</th><th>measured [95% CI]</th><th>verdict</th></tr>"]
    for _, r in rows.iterrows():
        out.append(f'<tr><td><a href="{link}#{anchor(r.claim)}">{_e(r.figure)}</a>: {_e(r.statement)}</td>'
                   f"<td>{_e(r.paper)}</td><td>{_e(_measured(r))}</td><td>{_verdict(r.verdict)}</td></tr>")
    return "\n".join(out) + "</table>"


def claims_page(reg: pd.DataFrame, profile: str) -> str:
    counts = reg.verdict.value_counts()
    body = [f"<p><a href=\"index.html\">← the report</a></p><h1>Every claim of the {_e(profile)} profile</h1>",
            f"<p>{len(C.claims_only(reg))} claims: " + ", ".join(f"{counts.get(v, 0)} {_verdict(v)}" for v in C.VERDICTS)
            + f"; {len(reg) - len(C.claims_only(reg))} null controls apart. "
            "Each row: the paper's claim, the rule that decides it, the estimator and the unit it resamples.</p>",
            "<table><tr><th>claim id</th><th>claim (paper)</th><th>paper</th><th>measured [95% CI]; detail</th>"
            "<th>estimator (unit)</th><th>rule</th><th>verdict</th></tr>"]
    for _, r in reg.iterrows():
        nb = manifest.find(str(r.notebook))
        nb_link = f' <a href="notebooks/{nb.notebook}.html">notebook {_e(nb.key)}</a>' if nb else ""
        body.append(f'<tr id="{anchor(r.claim)}"><td><code>{_e(r.claim)}</code>{nb_link}</td>'
                    f"<td>{_e(r.figure)}: {_e(r.statement)}</td><td>{_e(r.paper)}</td>"
                    f"<td>{_e(_measured(r))}{'; ' + _e(r.detail) if r.detail else ''}</td>"
                    f"<td>{_e(r.estimator)} ({_e(r.resampling)})</td><td>{_e(r.rule_text)}</td>"
                    f"<td>{_verdict(r.verdict)}</td></tr>")
    return _page(f"Claims ({profile})", "\n".join(body) + "</table>")


def index_page(reg: pd.DataFrame, profile: str, pngs: list[str], notebooks: dict[str, bool]) -> str:
    counts = reg.verdict.value_counts()
    body = [f"<h1>The cancellation hypothesis in critic-free RL: the {_e(profile)} profile's results</h1>",
            f"<p>Every figure of <code>figures/{_e(profile)}/</code> beside the paper's claims it tests and their "
            f"verdicts (<a href=\"claims.html\">all {len(C.claims_only(reg))} claims</a>: "
            + ", ".join(f"{counts.get(v, 0)} {_verdict(v)}" for v in C.VERDICTS)
            + "). Each notebook links to its executed copy. Built by <code>make report</code>.</p>"]
    shown: set[str] = set()
    for f in manifest.FIGURES:
        mine = [p for p in pngs if manifest.owner(p) is f]
        shown.update(mine)
        nb = (f'<a href="notebooks/{f.notebook}.html">notebook {f.key}: <code>{f.notebook}</code></a>'
              if notebooks.get(f.notebook) else f"notebook {f.key}: <code>{f.notebook}</code> (not executed)")
        body.append(f'<h2 id="nb-{f.key}">{nb}</h2><p class="panels">{_e(", ".join(f.panels))} — {_e(f.about)}</p>')
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
        body.append("<h2>Other figures</h2>" + "".join(
            f'<figure><img src="figures/{_e(p)}.png" alt="{_e(p)}"><figcaption><code>{_e(p)}.png</code>'
            "</figcaption></figure>" for p in other))
    return _page(f"Report ({profile})", "\n".join(body))


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
        page.write_text(_carry_repo_links(page, out, root / "notebooks"), encoding="utf-8")
        done[stem] = True
        log(f"[report] {stem}.html ({time.time() - t0:.1f} s)")
    (out / "claims.html").write_text(claims_page(reg, profile), encoding="utf-8")
    index = out / "index.html"
    index.write_text(index_page(reg, profile, pngs, done), encoding="utf-8")
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
