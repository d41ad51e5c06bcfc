"""make report: the static site of the tiny profile's executed notebooks and figures (cancellation.report).

The site is built once into tmp from the committed outputs; the checks read the repository on their own
(the notebook sources, figures/tiny/, the claims registry with pandas) and parse the pages with their own
HTML parser, so none of them reuses the builder's lists or its link checker. One check opens the claims page
in headless chromium where one is on PATH (skipped, with the reason, where none is)."""
import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pandas as pd
import pytest

from cancellation import findings as F
from cancellation import report

ROOT = Path(__file__).resolve().parents[1]
PROFILE = "tiny"


class Page(HTMLParser):
    def __init__(self, text):
        super().__init__()
        self.refs, self.ids, self.imgs = [], set(), []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("href", "src"):
            if a.get(k) is not None:
                self.refs.append(a[k])
        if tag == "img" and a.get("src"):
            self.imgs.append(a["src"])
        if a.get("id"):
            self.ids.add(a["id"])


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "site"
    report.build(PROFILE, out, log=lambda *_: None)
    return out


def _pages(site):
    return {p.resolve(): Page(p.read_text(encoding="utf-8")) for p in site.rglob("*.html")}


def test_every_notebook_has_its_page(site):
    sources = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
    assert len(sources) >= 8
    for src in sources:
        page = site / "notebooks" / f"{src.stem}.html"
        assert page.is_file(), page
        title = re.search(r"^# # (.+)$", src.read_text(), re.M).group(1)   # the notebook's own heading
        words = [w for w in re.findall(r"[A-Za-z]{4,}", title)][:3]
        text = page.read_text(encoding="utf-8")
        assert all(w in text for w in words), (src.stem, words)
        assert f'href="notebooks/{src.stem}.html"' in (site / "index.html").read_text()


def test_every_figure_is_copied_and_shown(site):
    pngs = sorted((ROOT / "figures" / PROFILE).glob("*.png"))
    assert pngs
    shown = set(Page((site / "index.html").read_text(encoding="utf-8")).imgs)
    for p in pngs:
        copy = site / "figures" / p.name
        assert copy.read_bytes() == p.read_bytes(), p.name
        assert f"figures/{p.name}" in shown, p.name


def test_every_relative_link_resolves(site):
    pages = _pages(site)
    assert {(site / "index.html").resolve(), (site / "claims.html").resolve()} <= set(pages)
    checked, bad = 0, []
    root = site.resolve()
    for page, parsed in pages.items():
        for ref in parsed.refs:
            u = urlsplit(ref)
            if u.scheme or u.netloc or not u.path:      # web links, data: URIs, #fragments of the page itself
                continue
            target = (page.parent / unquote(u.path)).resolve()
            checked += 1
            if root not in target.parents or not target.is_file():
                bad.append(f"{page.name}: {ref}")
            elif u.fragment and target in pages and u.fragment not in pages[target].ids:
                bad.append(f"{page.name}: {ref} (no such id)")
    assert not bad, bad[:20]
    assert checked > 100   # the index alone links every figure twice and every claim


def test_verdicts_beside_the_figures_are_the_registry_s(site):
    reg = pd.read_parquet(ROOT / "data" / "results" / PROFILE / "claims.parquet")
    text = (site / "index.html").read_text(encoding="utf-8")
    claims_page = Page((site / "claims.html").read_text(encoding="utf-8"))
    rows = re.findall(r'<a href="claims.html#claim-([^"]+)">.*?<span class="verdict[^"]*">([^<]+)</span>', text)
    assert rows
    want = {re.sub(r"[^A-Za-z0-9_-]", "-", c): v for c, v in zip(reg.claim, reg.verdict)}
    for cid, verdict in rows:
        assert want[cid] == verdict.replace("&#x27;", "'"), cid
        assert f"claim-{cid}" in claims_page.ids
    assert len(claims_page.ids & {f"claim-{c}" for c in want}) == len(reg)   # every row has its anchor
    # the thesis rows sit beside the thesis figure, not beside the category-shift figure
    figs = dict(re.findall(r'<figure id="([^"]+)">(.*?)</figure>', text, re.S))
    thesis = [c for c in reg.claim if c.startswith("fig04_thesis")]
    assert thesis and all(f"#claim-{c}\"" in figs["fig04_thesis"] for c in thesis)
    assert "fig04_thesis" not in figs["fig04_category_shift"]


def test_claims_go_to_the_longest_matching_figure():
    got = report.figure_claims(["fig04_category_shift", "fig04_thesis", "fig05_value_gap", "fig05c_strata",
                                "fig08_training_curves"],
                               ["fig04_thesis_verdict", "fig04_shift", "fig05a_gap", "fig05c_x", "fig050_no",
                                "table2_QB", "eq14_x"])
    assert got == {"fig04_category_shift": ["fig04_shift"], "fig04_thesis": ["fig04_thesis_verdict"],
                   "fig05_value_gap": ["fig05a_gap"], "fig05c_strata": ["fig05c_x"],
                   "fig08_training_curves": ["table2_QB"]}


def test_a_broken_link_is_reported(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html#x">b</a><img src="gone.png"><a href="https://x.org/y">w</a>')
    (tmp_path / "b.html").write_text('<p id="y">b</p>')
    assert sorted(report.broken_links(tmp_path)) == ["a.html: b.html#x (no id 'x')", "a.html: gone.png"]


def _sentence(text: str) -> str:
    """The summary sentence ('N rows: ... .') of a page or of README's findings block."""
    m = re.search(r"(\d+ rows: .+?\)\.)", html.unescape(re.sub(r"<[^>]+>", "", text)))
    assert m, text[:300]
    return m.group(1)


def test_the_site_prints_readme_s_summary(site):
    """README's first screen, docs/claims.md and the site print one sentence: the counts by kind, notebook 07
    counted once from its full `make table2` run."""
    block = F.readme_table(ROOT / "README.md", F.FINDINGS_BEGIN, F.FINDINGS_END)
    want = _sentence(block)
    assert want.startswith(f"{len(F.findings_registry(ROOT))} rows: ")
    for name in ("index.html", "claims.html"):
        text = (site / name).read_text(encoding="utf-8")
        got = re.findall(r'<span class="sentence">(.*?)</span>', text, re.S)
        assert [html.unescape(g) for g in got] == [want], name


def test_the_full_table2_run_is_on_the_claims_page(site):
    """The 10-seed Table 2 test (data/results/tiny-table2/) has its rows on the claims page, apart from the light
    run's rows of the same ids, each with its verdict; the index links to them from notebook 07."""
    t2 = pd.read_parquet(ROOT / "data" / "results" / "tiny-table2" / "claims.parquet")
    text = (site / "claims.html").read_text(encoding="utf-8")
    start = text.index('id="rows-tiny-table2"')
    section = text[start:]
    rows = re.findall(r'<tr id="([^"]+)"><td><code>([^<]+)</code>.*?<span class="verdict[^"]*">([^<]+)</span>',
                      section)
    assert {(html.unescape(c), v.replace("&#x27;", "'")) for _, c, v in rows} == set(zip(t2.claim, t2.verdict))
    ids = [i for i, _, _ in rows]
    assert len(set(ids)) == len(t2) and all("tiny-table2" in i for i in ids)
    assert "Table 2 (10 seeds x 64 iterations)" in section
    light = pd.read_parquet(ROOT / "data" / "results" / PROFILE / "claims.parquet")
    assert len(re.findall(r'<tr id="claim-', text)) == len(light) + len(t2)   # both runs, every row once
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="claims.html#rows-tiny-table2"' in index


def test_the_index_opens_with_contents_and_findings(site):
    text = (site / "index.html").read_text(encoding="utf-8")
    page = Page(text)
    toc = text[text.index('<nav class="toc">'):text.index("</nav>")]
    links = re.findall(r'href="([^"]+)"', toc)
    for src in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        assert f"#nb-{src.stem[:2]}" in links, src.stem
    for p in sorted((ROOT / "figures" / PROFILE).glob("*.png")):
        assert f"#{p.stem}" in links and p.stem in page.ids, p.stem
    assert "claims.html" in links and "#findings" in links
    assert text.index('id="findings"') < text.index('id="nb-01"')
    # the thesis in words, as README's first screen gives it, with its markdown rendered
    readme = F.readme_table(ROOT / "README.md", F.FINDINGS_BEGIN, F.FINDINGS_END)
    lines = [ln[2:] for ln in readme.splitlines() if ln.startswith("- ")]
    assert lines
    plain = html.unescape(re.sub(r"<[^>]+>", "", text))
    for ln in lines:
        assert ln.replace("**", "") in plain, ln[:80]
    assert "**" not in text and "<b>'Shared' = the same token id" in html.unescape(text)


def test_every_notebook_page_links_back(site):
    pages = sorted((site / "notebooks").glob("*.html"))
    assert pages
    for p in pages:
        parsed = Page(p.read_text(encoding="utf-8"))
        assert "../index.html" in parsed.refs and "../claims.html" in parsed.refs, p.name
        assert parsed.refs.index("../index.html") < 5, p.name   # at the top of the page


_PROBE = """<script>addEventListener("load", () => {
  const right = sel => Math.max(0, ...[...document.querySelectorAll(sel)].map(e => e.getBoundingClientRect().right));
  document.title = "probe " + JSON.stringify({inner: innerWidth, scroll: document.documentElement.scrollWidth,
    verdict: right("table.claims .verdict"), table: right("table.claims"), n: document.querySelectorAll(".verdict").length});
});</script>"""


def test_the_claims_table_fits_1400_px_in_chromium(site, tmp_path):
    """claims.html at 1,400 px in a real browser: nothing scrolls sideways and every verdict is in the viewport."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium on PATH: the layout check needs a headless browser (apt-get install chromium)")
    page = site / "claims_probe.html"
    page.write_text((site / "claims.html").read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"),
                    encoding="utf-8")
    try:
        out = subprocess.run([exe, "--headless", "--disable-gpu", "--no-sandbox", "--window-size=1400,900",
                              f"--user-data-dir={tmp_path}", "--virtual-time-budget=5000", "--dump-dom",
                              page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    finally:
        page.unlink()
    m = re.search(r"<title>probe (\{.*?\})</title>", out)
    assert m, out[:500]
    got = json.loads(html.unescape(m.group(1)))
    rows = len(pd.read_parquet(ROOT / "data" / "results" / PROFILE / "claims.parquet"))
    assert got["n"] > rows, got                               # the page laid out every row
    assert got["scroll"] <= got["inner"], got                 # no horizontal scroll
    assert 0 < got["verdict"] <= got["inner"], got            # the verdict column inside the viewport
    assert got["table"] <= got["inner"], got


def test_another_profile_counts_its_own_registry(tmp_path):
    """For a profile other than tiny the site's rows and its sentence are that profile's registry alone."""
    (tmp_path / "data" / "results" / "other").mkdir(parents=True)
    (tmp_path / "data" / "results" / "tiny-table2").mkdir(parents=True)
    shutil.copyfile(ROOT / "data" / "results" / PROFILE / "claims.parquet",
                    tmp_path / "data" / "results" / "other" / "claims.parquet")
    shutil.copyfile(ROOT / "data" / "results" / "tiny-table2" / "claims.parquet",
                    tmp_path / "data" / "results" / "tiny-table2" / "claims.parquet")
    regs = report.registries("other", tmp_path)
    assert [(s, len(r)) for s, _, r in regs] == [("other", len(pd.read_parquet(ROOT / "data/results/tiny/claims.parquet")))]
    page = report.claims_page(regs, report.findings("other", tmp_path), "other")
    assert "tiny-table2" not in page
    assert html.unescape(re.search(r'<span class="sentence">(.*?)</span>', page).group(1)) \
        == F.summary_sentence(regs[0][2])
