"""The claims registry: verdict rules on synthetic numbers, record(), and README == committed registry."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from cancellation import claims as C
from cancellation import findings as F
from cancellation import profiles

ROOT = Path(__file__).resolve().parents[1]
NAN = math.nan


def Claim(*a, **k):
    """A Claim with a stated estimator and resampling unit (required fields), unless the test gives them."""
    return C.Claim(*a, **{"estimator": "t over steps", "resampling": "step", **k})


@pytest.mark.parametrize("m, lo, hi, kw, want", [
    (0.2, 0.1, 0.3, {}, C.REPRODUCED),                          # CI excludes 0 in the paper's direction
    (-0.2, -0.3, -0.1, {}, C.NOT_REPRODUCED),                   # excludes 0 the other way
    (0.05, -0.1, 0.2, {}, C.INCONCLUSIVE),                      # covers 0
    (-0.05, -0.1, 0.02, dict(paper=0.24), C.NOT_REPRODUCED),    # wrong side, CI excludes the paper's value
    (-0.05, -0.1, 0.3, dict(paper=0.24), C.INCONCLUSIVE),       # wrong side but the paper's value is inside
    (-0.2, -0.3, -0.1, dict(sign=-1), C.REPRODUCED),            # the paper says "lower"
    (0.6, 0.55, 0.7, dict(ref=0.5), C.REPRODUCED),              # above a reference
    (0.4, 0.2, 0.6, dict(ref=0.5), C.INCONCLUSIVE),
    (0.99, NAN, NAN, dict(ref=0.9), C.INCONCLUSIVE),            # no interval, point not allowed
    (0.99, NAN, NAN, dict(ref=0.9, point_ok=True), C.REPRODUCED),
    (0.8, NAN, NAN, dict(ref=0.9, point_ok=True), C.NOT_REPRODUCED),
])
def test_direction_rule(m, lo, hi, kw, want):
    assert C.direction(m, lo, hi, **kw) == want


@pytest.mark.parametrize("m, lo, hi, kw, want", [
    (2.0, 1.0, 3.0, dict(tol=10), C.REPRODUCED),
    (10.2, 8.7, 11.8, dict(tol=10), C.INCONCLUSIVE),            # straddles the tolerance
    (0.53, 0.43, 0.63, dict(tol=0.3), C.NOT_REPRODUCED),        # entirely outside
    (0.72, 0.70, 0.74, dict(target=0.7, tol=0.1), C.REPRODUCED),
    (0.999, NAN, NAN, dict(target=1, tol=0.01, point_ok=True), C.REPRODUCED),
    (70, NAN, NAN, dict(target=40, tol=15), C.INCONCLUSIVE),    # a peak location without an interval
    (70, NAN, NAN, dict(target=40, tol=15, point_ok=True), C.NOT_REPRODUCED),
])
def test_similar_rule(m, lo, hi, kw, want):
    assert C.similar(m, lo, hi, **kw) == want


def test_record_replaces_a_notebooks_rows(tmp_path, capsys):
    a = Claim("x1", "Fig. X", "goes up", "yes", 0.2, 0.1, 0.3, n=5)
    b = Claim("y1", "Fig. Y", "similar", "similar", 1.0, -1, 2, n=3, rule="similar", params=dict(tol=5))
    C.record(tmp_path, "01", [a])
    C.record(tmp_path, "02", [b])
    out = C.record(tmp_path, "01", [Claim("x2", "Fig. X", "goes down", "yes", 0.2, 0.1, 0.3, n=5,
                                            params=dict(sign=-1))])
    reg = pd.read_parquet(tmp_path / "claims.parquet")
    assert list(reg.claim) == ["x2", "y1"] and list(reg.verdict) == [C.NOT_REPRODUCED, C.REPRODUCED]
    assert out.equals(reg)
    assert "NOT REPRODUCED" in capsys.readouterr().out
    with pytest.raises(ValueError, match="duplicate"):
        C.record(tmp_path, "03", [a, a])
    with pytest.raises(ValueError, match="unknown rule"):
        Claim("z", "F", "s", "p", 1.0, rule="bigger")


def test_update_readme_between_markers(tmp_path):
    reg = tmp_path / "r"
    C.record(reg, "01", [Claim("x1", "Fig. X", "goes up", "yes", 0.2, 0.1, 0.3, n=5)])
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{F.BEGIN}\nold\n{F.END}\nbottom\n")
    assert F.update_readme(readme, reg / "claims.parquet")
    text = readme.read_text()
    assert "\nold\n" not in text and "| Fig. X: goes up | yes |" in text and "| t over steps (step) |" in text and text.startswith("top\n") and text.endswith("bottom\n")
    assert not F.update_readme(readme, reg / "claims.parquet")


def test_committed_readme_table_matches_committed_registry():
    reg = F.readme_registry(ROOT)
    assert F.readme_table(ROOT / F.CLAIMS_DOC) == F.table_markdown(reg).strip(), \
        "docs/claims.md's table is stale: run `make claims`"
    summary = F.readme_table(ROOT / "README.md", F.SUMMARY_BEGIN, F.SUMMARY_END)
    assert summary == F.summary_markdown(ROOT).strip(), "README's claims summary is stale: run `make claims`"
    # the summary's counts, recounted here from the registry rows (an independent tally)
    last = next(ln for ln in summary.splitlines() if ln.startswith("| all")).split("|")
    every = reg[~((reg.notebook == "07") & ~reg.figure.str.endswith(F.README_REGISTRIES[1][1]))] \
        if (ROOT / F.README_REGISTRIES[1][0]).exists() else reg   # 07's light run left out beside its full run
    once = every[~every.verdict.isin(C.CONTROL_VERDICTS)]   # null controls are not claims
    assert int(last[2]) == len(once)
    assert [int(c.strip(" *")) for c in last[3:3 + len(C.VERDICTS)]] == [int((once.verdict == v).sum()) for v in C.VERDICTS]
    findings = F.readme_table(ROOT / "README.md", F.FINDINGS_BEGIN, F.FINDINGS_END)
    assert findings == F.findings_markdown(ROOT).strip(), "README's first screen is stale: run `make claims`"
    assert f"{len(every)} rows: " in findings and "No result on the paper's models" in findings
    # the one summary: README's first screen and docs/claims.md print the same sentence, from the same registry
    assert F.summary_sentence(F.findings_registry(ROOT)) in findings
    paper = every[every.apply(F.kind_of, axis=1) == F.PAPER]
    assert f"the paper's claims: {len(paper)} (" in findings
    for _, r in paper[paper.verdict == C.NOT_REPRODUCED].iterrows():   # every claim of the paper that did not reproduce
        assert f"| {r.statement.replace('|', chr(92) + '|')} |" in findings, r.claim
    tiny = C.read_registry(ROOT / F.README_REGISTRIES[0][0])
    thesis = tiny[tiny.claim.isin([C.THESIS_PREFIX + k for k in C.THESIS_README])]
    assert len(thesis) == len(C.THESIS_README)  # the hypothesis rows exist and README lists each with its verdict
    for _, r in thesis.iterrows():
        assert f"| {r.statement.replace('|', chr(92) + '|')} | " in summary and f"**{r.verdict}** |" in summary, r.claim
    for _, r in reg.iterrows():  # every stored verdict follows from its rule and numbers
        assert C.verdict_of(r) == r.verdict, r.claim
    assert set(reg.verdict) <= set(C.VERDICTS + C.CONTROL_VERDICTS)
    tiny = pd.read_parquet(ROOT / "data" / "results" / "tiny" / "claims.parquet")
    assert set(tiny.notebook) == {p.stem[:2] for p in profiles.all_notebooks()}  # every notebook records its claims


# ------------------------------------------------------------------ robustness: concurrent writers, damaged registry
def _record_many(results_dir, notebook, barrier, times):
    import contextlib
    import io
    barrier.wait()
    with contextlib.redirect_stdout(io.StringIO()):
        for i in range(times):  # the last call leaves 3 rows whose measured value says which call wrote them
            C.record(results_dir, notebook, [Claim(f"{notebook}_{k}", "Fig. X", "up", "yes", i + k / 10, n=2)
                                             for k in range(3)])


@pytest.mark.parametrize("attempt", range(3))
def test_concurrent_records_of_different_notebooks_keep_every_row(tmp_path, attempt):
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    nbs, times = [f"{i:02d}" for i in range(1, 6)], 6
    barrier = ctx.Barrier(len(nbs))
    ps = [ctx.Process(target=_record_many, args=(tmp_path, nb, barrier, times)) for nb in nbs]
    [p.start() for p in ps]
    [p.join(120) for p in ps]
    assert [p.exitcode for p in ps] == [0] * len(nbs)  # no writer crashed
    reg = pd.read_parquet(tmp_path / "claims.parquet")
    assert sorted(reg.claim) == sorted(f"{nb}_{k}" for nb in nbs for k in range(3))  # no writer's rows lost
    assert sorted(reg.measured) == sorted(times - 1 + k / 10 for _ in nbs for k in range(3))  # each one's last call
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def _write_registry(d):
    C.record(d, "01", [Claim("x1", "Fig. X", "goes up", "yes", 0.2, 0.1, 0.3, n=5)])
    return d / "claims.parquet"


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty", "not_a_registry"])
def test_readme_on_a_damaged_registry_is_one_line_naming_the_file(tmp_path, damage, capsys):
    reg = _write_registry(tmp_path / "data" / "results" / "tiny")
    data = reg.read_bytes()
    if damage == "truncate":
        reg.write_bytes(data[:len(data) // 2])
    elif damage == "garble":
        reg.write_bytes(data[:100] + b"\0" * (len(data) - 200) + data[-100:])
    elif damage == "empty":
        reg.write_bytes(b"")
    else:
        pd.DataFrame({"a": [1]}).to_parquet(reg)
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{F.BEGIN}\nold\n{F.END}\n")
    for argv in (["readme", "--readme", str(readme)], ["readme", "--readme", str(readme), "--registry", str(reg)],
                 ["show", "--registry", str(reg)]):
        with pytest.raises(SystemExit) as e:
            F.main(argv)
        msg = str(e.value.code)
        assert e.value.code != 0 and str(reg) in msg and "\n" not in msg, msg
        assert ("not a claims registry" if damage == "not_a_registry" else "unreadable claims registry") in msg
    assert readme.read_text().endswith(f"{F.BEGIN}\nold\n{F.END}\n")  # left as it was
    with pytest.raises(C.ClaimsError, match=str(reg)):  # and record() refuses to build on it
        C.record(reg.parent, "02", [Claim("y1", "Fig. Y", "up", "yes", 0.2, n=2)])


def test_readme_cli_on_a_truncated_registry_prints_no_traceback(tmp_path):
    import os
    import subprocess
    import sys
    reg = _write_registry(tmp_path / "r")
    reg.write_bytes(reg.read_bytes()[:300])
    readme = tmp_path / "README.md"
    readme.write_text(f"{F.BEGIN}\n{F.END}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    p = subprocess.run([sys.executable, "-m", "cancellation.findings", "readme", "--readme", str(readme),
                        "--registry", str(reg)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and f"{reg}: unreadable claims registry" in p.stderr
    missing = subprocess.run([sys.executable, "-m", "cancellation.findings", "show", "--registry", str(tmp_path / "no.parquet")],
                             capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert missing.returncode != 0 and "Traceback" not in missing.stderr and "no.parquet: no such" in missing.stderr


# ----------------------------------------------------------------------------- rules that can decide at their n
@pytest.mark.parametrize("n, ok", [(1, False), (35, False), (36, True)])
def test_a_clopper_pearson_upper_bound_below_a_rate_needs_enough_runs(n, ok):
    """'At most 10% of runs collapse' by a Clopper–Pearson bound below 0.1: even 0/n has upper bound
    1 − 0.025^(1/n), below 0.1 only from n = 36 (closed form)."""
    assert (1 - 0.025 ** (1 / n) < 0.1) == ok
    got, why = C.can_pass("direction", dict(sign=-1, ref=0.1), n, "Clopper–Pearson")
    assert got == ok and (ok or "needs at least 36" in why), why


def test_can_pass_by_estimator_kind():
    assert C.can_pass("direction", dict(sign=1, ref=0.1), 1, "Clopper–Pearson")[0] is False  # 1/1: lo = 0.025
    assert C.can_pass("direction", dict(sign=1, ref=0.1), 2, "Clopper–Pearson")[0] is True   # 2/2: lo = 0.158
    assert C.can_pass("similar", dict(target=0.5, tol=0.1), 44, "Clopper–Pearson")[0] is False
    assert C.can_pass("direction", dict(sign=1), 1, "paired t over seeds")[0] is False
    assert C.can_pass("direction", dict(sign=1), 2, "paired t over seeds")[0] is True
    assert C.can_pass("direction", dict(sign=1), 1, "percentile bootstrap over tokens")[0] is False
    assert C.can_pass("direction", dict(sign=1), 5, "point (every token)")[0] is False
    assert C.can_pass("direction", dict(sign=1, point_ok=True), 5, "point (every token)")[0] is True
    assert C.can_pass("construction", dict(why="x"), 1, "t over seeds")[0] is True  # never 'reproduced' anyway
    fisher = dict(k=0, n=3, k_ref=3, n_ref=3, sign=-1, alpha=0.05)
    assert C.can_pass("exact", fisher, 3, "Fisher's exact test")[0] is True       # 0/3 vs 3/3: p = 1/20
    assert C.can_pass("exact", {**fisher, "n": 2, "k_ref": 2, "n_ref": 2}, 2, "Fisher's exact test")[0] is False


def test_fisher_rule_against_scipy():
    """exact(): one-sided Fisher's exact test in the paper's direction (scipy's fisher_exact, an
    independent implementation), every pair of counts at 3 vs 3 and 4 vs 2 runs."""
    from scipy import stats
    for n, n_ref in ((3, 3), (4, 2)):
        for k in range(n + 1):
            for j in range(n_ref + 1):
                table = [[k, n - k], [j, n_ref - j]]
                lo_p = stats.fisher_exact(table, alternative="less")[1]
                hi_p = stats.fisher_exact(table, alternative="greater")[1]
                assert math.isclose(C.fisher_p(k, n, j, n_ref, lower=True), lo_p, rel_tol=1e-9)
                assert math.isclose(C.fisher_p(k, n, j, n_ref, lower=False), hi_p, rel_tol=1e-9)
                want = ("reproduced" if lo_p <= 0.05 + 1e-12 else "not reproduced" if hi_p <= 0.05 + 1e-12
                        else "inconclusive")
                assert C.exact(k / n - j / n_ref, NAN, NAN, k=k, n=n, k_ref=j, n_ref=n_ref, sign=-1) == want


def test_record_refuses_a_rule_that_cannot_pass_at_its_n(tmp_path, capsys):
    """Not recorded, and one printed line names the row and says why; the other rows are recorded."""
    out = C.record(tmp_path, "07", [
        Claim("stable", "T2", "no collapse", "yes", 0.0, 0.0, 0.7, n=3, rule="direction",
              params=dict(sign=-1, ref=0.1), estimator="Clopper–Pearson", resampling="run"),
        Claim("one_seed", "T2", "up", "yes", 1.0, n=1),
        Claim("fine", "T2", "up", "yes", 0.2, 0.1, 0.3, n=5)])
    assert list(out.claim) == ["fine"] and list(C.read_registry(tmp_path / "claims.parquet").claim) == ["fine"]
    printed = capsys.readouterr().out
    assert "not recorded: stable" in printed and "needs at least 36" in printed
    assert "not recorded: one_seed" in printed and "n = 1" in printed


@pytest.mark.parametrize("profile, claim", [
    (p.parent.name, c) for p in [ROOT / q for q, _ in F.README_REGISTRIES if (ROOT / q).exists()]
    for c in pd.read_parquet(p).claim])
def test_every_committed_rule_can_pass_at_its_n(profile, claim):
    """The registry check over the committed registries: no row whose rule cannot read 'reproduced'
    at its n with its estimator, whatever the data (`can_pass`)."""
    reg = pd.read_parquet(ROOT / "data" / "results" / profile / "claims.parquet").set_index("claim")
    r = reg.loc[claim]
    ok, why = C.can_pass(r.rule, json.loads(r.params), int(r.n), r.estimator)
    assert ok, f"{profile} {claim}: {why}"


def test_the_summary_counts_each_kind_apart():
    """kind_of against a hand tally: a null control, a fixed-scaffold control, related work, a reading the paper does
    not state, a check by construction, and the paper's claims; the sentence adds up to the rows."""
    rows = [("yes", "Fig. 1", "direction", C.REPRODUCED), ("yes (§3)", "Fig. 4", "direction", C.NOT_REPRODUCED),
            ("similar (control)", "Fig. 3", "similar", C.REPRODUCED), ("yes", "Fig. 4, fixed-scaffold control",
                                                                         "direction", C.INCONCLUSIVE),
            ("a control (not in the paper)", "§3", "null_control", C.NULL_PASSES),
            ("related work (x), not the paper", "§3", "direction", C.NOT_REPRODUCED),
            ("not the paper's reading", "§3", "all_of", C.INCONCLUSIVE),
            ("present", "§4", "construction", C.BY_CONSTRUCTION)]
    reg = pd.DataFrame([dict(paper=p, figure=f, rule=r, verdict=v) for p, f, r, v in rows])
    want = [F.PAPER, F.PAPER, F.CONTROLS, F.CONTROLS, F.CONTROLS, F.OTHERS, F.OTHERS, F.CONSTRUCTION]
    assert list(reg.apply(F.kind_of, axis=1)) == want
    t = F.summary_counts(reg)
    assert t.rows.to_dict() == {F.PAPER: 2, F.CONTROLS: 3, F.OTHERS: 2, F.CONSTRUCTION: 1}
    assert F.summary_sentence(reg).startswith("8 rows: the paper's claims: 2 (1 reproduced, 1 not reproduced); "
                                              "controls: 3 (1 reproduced, 1 inconclusive, 1 null passes)")
