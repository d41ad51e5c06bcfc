"""make report: the static site of the tiny profile's executed notebooks and figures (cancellation.report).

The site is built once into tmp from the committed outputs; the checks read the repository on their own
(the notebook sources, figures/tiny/, the claims registry with pandas) and parse the pages with their own
HTML parser, so none of them reuses the builder's lists or its link checker."""
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pandas as pd
import pytest

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
