"""Run a notebook with a profile: jupytext (.py percent) -> papermill -> executed .ipynb.

Parameters are merged in this order, later wins: the notebook's `parameters` cell, the profile's
`common:` section (only names the notebook declares), the profile's section for the notebook,
then command-line overrides (-p NAME VALUE, or --set 'NAME=VALUE; ...' as `make figNN P=...`
passes them). With several notebooks, a -p value goes to every one that declares the name. Every
selected notebook is validated before any runs: names (an override or `common` key that no
notebook declares, a misspelled section or key of the profile, each with a suggestion), types
(YAML 1.2 numbers: `010` is 10), the ranges, choices and paths of its figure module's Params,
its cross-parameter constraints and the device; one line per error, exit 2.

A run with -p overrides writes to its own directories, figures/<profile>/runs/<hash>/,
data/results/<profile>/runs/<hash>/ and notebooks/executed/<profile>/runs/<hash>/ (hash of the
overrides, recorded in the executed notebook's metadata), so the committed outputs change only
with --replace. Outputs are all or nothing (cancellation.staging): the notebook writes into
.run-staging/, whose figures, tables and executed notebook are moved into place only when it ran
through. A failing notebook prints its failing cell and the one-line cause, keeps
<name>.failed.ipynb, exit 1; Ctrl-C exits 130 (SIGTERM 143) with a two-line message.
--root DIR names the checkout (notebooks/, params, outputs) when the package is installed elsewhere.
--cores N runs CPU notebooks in a pool of N cores (`make figures` passes the machine's core count): each
in its own runner process, started while their threads fit, the widest first, then in notebook order
(every figure pins its torch threads, `threads`, one by default; 07 runs `workers` processes of
`threads` each); logs in
.run-staging/logs/, each running notebook's latest line every minute. The numbers are those of one at a
time. A notebook on an accelerator runs alone.

This module is the command line (its flags, --plan, --dry-run); the jobs live in rooms of their own:
`profiles` (the checkout, notebook lookup, the one YAML 1.2 reader of profiles), `resolve` (parameters merged
and checked, output directories), `execute` (one notebook through papermill, all or nothing) and `pool`
(--cores: notebooks side by side).

    python -m cancellation.run 01                      # notebooks/01_*.py on the tiny profile
    python -m cancellation.run 01 -p steps 5 -p seed 1 # -> figures/tiny/runs/<hash>/ ...
    python -m cancellation.run 01 -p steps 5 --replace # -> figures/tiny/ (the canonical outputs)
    python -m cancellation.run 07 --set 'eval_sets=[easy, medium]; tau=0.25'
    python -m cancellation.run all --profile tiny
    python -m cancellation.run all --cores 2           # two notebooks at a time, one thread each
    python -m cancellation.run 05 06 --procs 8         # 05's and 06's Monte Carlo continuations on 8 ranks (GPUs)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from . import cache, execute, measured, procs, staging
from .dryrun import DRY_RUN_ENV
from .execute import NotebookFailed, NotebookInterrupted
from .figures import replot
from .pool import run_pool, segments
from .profiles import Checkout, ParameterError, all_notebooks, find_notebook, here, short
from .resolve import per_notebook, resolve_params



_NAME_EQ = re.compile(r"[A-Za-z_]\w*=")


def parse_set(text: str) -> list[tuple[str, str]]:
    """`--set 'eval_sets=[easy, medium]; problems_path=a=b.jsonl'` -> [(name, value), ...].

    Pairs are separated by `;` (or by whitespace before the next `name=`, so `steps=5 lr=3e-4`
    still works), except inside brackets or quotes; each pair splits on its FIRST `=`, so values
    may contain `=`, spaces and commas. Values are parsed later, as -p values are."""
    pairs, cur, depth, quote = [], "", 0, None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"" and (cur.rstrip()[-1:] in ("=", "[", "{", ",", ":") or not cur.strip()):
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(depth - 1, 0)
        elif depth == 0 and (ch == ";" or (ch.isspace() and "=" in cur and _NAME_EQ.match(text, i + 1))):
            pairs.append(cur)
            cur = ""
            continue
        cur += ch
    pairs.append(cur)
    out = []
    for item in (p.strip() for p in pairs):
        if not item:
            continue
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ParameterError(f"--set/P: expected NAME=VALUE, got {item!r} (separate pairs with ';', e.g. "
                                 f"P='steps=5; eval_sets=[easy, medium]')")
        out.append((name.strip(), value.strip()))
    return out


def _print_errors(e: Exception):
    for line in dict.fromkeys(str(e).splitlines()):  # each line once: profile errors repeat per notebook
        print(f"error: {short(line, 500)}", file=sys.stderr)  # a huge value never floods the terminal


def _dash_values(argv: list[str]) -> list[str]:
    """`-p NAME VALUE` with a VALUE that starts with '-' (`-p temperature -.inf`, `-p seed -1`) as the
    equivalent `--set NAME=VALUE` (argparse would take the value for an
    option and answer "expected 2 arguments"); the value then meets the same checks as any other."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "-p" and i + 2 < len(argv) and argv[i + 2].startswith("-") and not argv[i + 1].startswith("-"):
            out += ["--set", f"{argv[i + 1]}={argv[i + 2]}"]
            i += 3
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv=None):
    """The command line: validate every selected notebook, then run them in order (see the module doc).
    Exit 0, 1 (a notebook failed), 2 (bad parameters or setup), 130/143 (Ctrl-C/SIGTERM)."""
    ap = argparse.ArgumentParser(description="Run figure notebooks with a parameter profile.")
    ap.add_argument("notebooks", nargs="+", help="'all', a number (01) or a notebook name")
    ap.add_argument("--profile", default="tiny", help="the name of a profile in notebooks/params/ (default tiny)")
    ap.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                    help="override one parameter (value parsed as YAML 1.2; relative paths from your working "
                         "directory); with several notebooks it goes to every one that declares NAME")
    ap.add_argument("--set", action="append", default=[], metavar="'NAME=VALUE; ...'",
                    help="overrides as one string, pairs separated by ';', each split on its first '=' "
                         "(what `make figNN P=...` passes)")
    ap.add_argument("--check", action="store_true", help="only validate and print the parameters")
    ap.add_argument("--replace", action="store_true",
                    help="with -p overrides, write the canonical outputs (figures/<profile>/ ...) instead of "
                         "figures/<profile>/runs/<hash>/ ...")
    ap.add_argument("--replot", action="store_true",
                    help="redraw every figure and record the claims again from the tables the last run wrote "
                         "(data/results/<profile>/, or runs/<hash>/ with overrides), computing nothing: a figure or "
                         "claim-text fix needs no cold run (make plots)")
    ap.add_argument("--plan", action="store_true",
                    help="print each notebook's planned peak memory and wall time (cancellation.plan), run nothing")
    ap.add_argument("--device-kind", metavar="KIND", default=None,
                    help="with --plan: plan for a device of this kind (data/scale/<KIND>.json: its measured unit costs "
                         "and total memory), from any host, e.g. nvidia-h100-80gb-hbm3 from a laptop")
    ap.add_argument("--procs", type=int, default=1, metavar="N",
                    help="N processes (accelerate launch: one rank per GPU with NCCL, gloo on CPU) divide a notebook's "
                         "independent work: built for 01 (its Δlog p runs), 04 (its batches), 05 and 06 (their Monte "
                         "Carlo continuations) and 07 on engine trl (whole TRL runs), the same tables as one process; "
                         "the others run on one; with --plan, each "
                         "process's planned wall time")
    ap.add_argument("--no-plan-check", action="store_true",
                    help="start even when the plan's peak memory exceeds the device's")
    ap.add_argument("--dry-run", action="store_true",
                    help="model_path's architecture from its config.json with seeded random weights, a coin-flip "
                         "reward; outputs only under dry-run/; records wall time and peak memory beside the plan")
    ap.add_argument("--cores", type=int, default=1, metavar="N",
                    help="run CPU notebooks in a pool of N cores, each in its own runner process on the threads it pins "
                         "(`threads` x `workers`), started while they fit, the widest first (logs in "
                         ".run-staging/logs/); same numbers as one at a time (default 1: one at a time, in this process)")
    ap.add_argument("--root", metavar="DIR",
                    help=f"the repository checkout whose notebooks/, notebooks/params/, figures/ and data/results/ "
                         f"are used (default: the checkout this module lives in, {here().root})")
    a = ap.parse_args(_dash_values(sys.argv[1:] if argv is None else list(argv)))
    checkout = Checkout.of(a.root) if a.root else here()   # passed down: no module state changes
    saved_procs = os.environ.get(procs.PROCS_ENV)
    try:
        if a.procs > 1 and not a.plan:  # the notebooks' kernels (and their fanned-out stages) read it
            os.environ[procs.PROCS_ENV] = str(a.procs)
        with staging.sigterm_raises():
            rc = _main(a, checkout)
    finally:  # main() called from Python (tests) leaves the environment as it found it
        if saved_procs is None:
            os.environ.pop(procs.PROCS_ENV, None)
        else:
            os.environ[procs.PROCS_ENV] = saved_procs
    if rc:
        sys.exit(rc)


def _replot_file(co: Checkout, results_dir: str, stem: str) -> Path:
    """Where `replot.save` put a notebook's parameters beside its tables (a relative results folder: the checkout's)."""
    d = Path(results_dir)
    return replot.params_file(d if d.is_absolute() else here(co).root / d, stem)


def _main(a, co: Checkout) -> int:
    if not co.notebooks.is_dir():
        where = f"--root {a.root}" if a.root else f"{co.root} (where this module lives)"
        print(f"error: no notebooks/ directory under {where}: the runner needs a checkout of the repository; "
              f"pass --root DIR, the checkout's directory", file=sys.stderr)
        return 2
    cwd = Path.cwd()
    stem = None
    err = _plan_flags_error(a, co) or cache.dir_problem()
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        try:  # every selected notebook is validated before any runs
            overrides = dict(a.p)
            for text in a.set:
                overrides.update(parse_set(text))
            refs = [p.stem for p in all_notebooks(co)] if a.notebooks == ["all"] else a.notebooks
            paths = [find_notebook(r, co) for r in refs]
            twice = sorted({p.stem for p in paths if paths.count(p) > 1})
            if twice:   # two kernels of one notebook would write the same outputs and the same log
                raise ParameterError(f"notebook {', '.join(twice)} named more than once; name each notebook once")
            share, errors = per_notebook(paths, overrides)
            resolved = []
            absent = []
            for nb in paths:
                try:
                    resolved.append((nb, resolve_params(nb, a.profile, share[nb], cwd=cwd, check_paths=True,
                                                        replace=a.replace, checkout=co)))
                except ParameterError as e:
                    try:  # --plan needs no data file: plan without the ones this host lacks, and say so
                        if not a.plan:
                            raise
                        resolved.append((nb, resolve_params(nb, a.profile, share[nb], cwd=cwd, check_paths=False,
                                                            replace=a.replace, checkout=co)))
                        absent += str(e).splitlines()
                    except ParameterError:
                        errors += str(e).splitlines()
            if a.replot:   # nothing to redraw: say so before a kernel starts (figures/replot.py writes this file)
                errors += [f"{nb.stem}: nothing to replot: {params['results_dir']} holds no tables of it from this version "
                           f"(no {replot.FOLDER}/{nb.stem}.json); run it first (make fig{nb.stem[:2]}, with the same P=...)"
                           for nb, params in resolved if not _replot_file(co, params["results_dir"], nb.stem).exists()]
            if errors:
                raise ParameterError("\n".join(errors))
            _print_absent(absent)
        except ParameterError as e:
            _print_errors(e)
            return 2
        # --procs N on CUDA needs N visible GPUs: say so now, not after a notebook's unsplit work (--plan plans for
        # any host)
        err = None if a.plan else procs.device_problem(a.procs, {nb.stem: params.get("device", "cpu")
                                                                 for nb, params in resolved if nb.stem in procs.SPLIT})
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        plans = {} if a.replot else _plans(resolved, a, co)   # a replot computes nothing: no plan to check
        if plans is None:
            return 2
        if a.plan:
            return 0
        groups = [[x] for x in resolved] if (a.check or a.dry_run or a.replot) else segments(resolved, a.cores)
        for group in groups:
            if len(group) > 1:
                stem = ", ".join(nb.stem for nb, _ in group)
                rc = run_pool(group, a, share, {k: p.seconds for k, p in plans.items() if p.seconds}, co)
                if rc:
                    return rc
                continue
            nb, params = group[0]
            stem = nb.stem
            if a.procs > 1 and not a.check and nb.stem not in procs.SPLIT:
                print(f"[run] {nb.stem}: nothing of it is split over processes yet (--procs {a.procs} splits "
                      f"{', '.join(procs.SPLIT)}); it runs on one", flush=True)
            if a.check:
                print(json.dumps(params, indent=1))
            elif a.dry_run:
                _dry_run(nb, a, share[nb], cwd, plans.get(nb.stem), co)
            else:
                execute.run_notebook(str(nb), a.profile, share[nb], replace=a.replace, cwd=cwd, replot=a.replot,
                                     checkout=co)
    except NotebookFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ParameterError as e:  # a file that vanished between the check and the run
        _print_errors(e)
        return 2
    except NotebookInterrupted as e:
        print(f"error: {e}", file=sys.stderr)
        return e.rc
    except KeyboardInterrupt as e:  # between notebooks, or while validating
        how = "terminated (SIGTERM)" if isinstance(e, staging.Terminated) else "interrupted (Ctrl-C)"
        print(f"error: {how}" + (f" after {stem} started" if stem else " before any notebook ran")
              + "; outputs of unfinished notebooks are unchanged", file=sys.stderr)
        return 143 if isinstance(e, staging.Terminated) else 130
    return 0


def _plans(resolved, a, co: Checkout | None = None) -> dict | None:
    """Each notebook's plan (cancellation.plan), printed with --plan, --dry-run and before a paper-profile
    run; None (after one error line per notebook) when a plan exceeds the device's memory."""
    from cancellation import plan
    co = here(co)
    plans, errors, bad_config = {}, [], []
    for nb, params in resolved:
        try:
            p = plan.make(nb.stem, params, root=co.root, kind=getattr(a, "device_kind", None),
                          procs=getattr(a, "procs", 1))
        except plan.ConfigError as e:   # a corrupt or absurd config.json: the model would not load either
            bad_config.append(f"{nb.stem}: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - a plan that cannot be made must not stop a run
            if a.plan or a.dry_run:  # asked for: say why there is none; otherwise a run stays quiet about it
                print(f"[plan] {nb.stem}: no plan ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        plans[nb.stem] = p
        if a.plan or a.dry_run or (a.profile.startswith("paper") and not a.check):
            print("\n".join(p.lines()), flush=True)
        err = plan.check(p)
        if err:
            errors.append(err)
    if a.plan and len(resolved) > 1:
        print("\n".join(plan.total_lines(list(plans.values()))), flush=True)
    if bad_config or (errors and not a.no_plan_check):   # --no-plan-check passes memory, not a corrupt config
        for e in bad_config + errors:
            print(f"error: {e}", file=sys.stderr)
        return None
    return plans


def _print_absent(lines: list[str]):
    """--plan on a host without the data: one line per missing value, with the notebooks that name it."""
    where: dict = {}
    for line in lines:
        m = re.match(r"(\S+): parameter '(\w+)' = (.+?): (element .+?: )?no such file", line)
        key = f"{m.group(2)} = {m.group(3)}" if m else line
        where.setdefault(key, []).append(m.group(1)[:2] if m else "")
    for key, stems in where.items():
        print(f"[plan] not on this host, planned without it (prompt lengths by default): {key} "
              f"({', '.join(s for s in dict.fromkeys(stems) if s)})", file=sys.stderr)


def _plan_flags_error(a, co: Checkout | None = None) -> str | None:
    """--device-kind and --procs plan only; an unknown kind names the known ones."""
    kind = getattr(a, "device_kind", None)
    if a.procs < 1:
        return f"--procs {a.procs}: expected a number of processes >= 1"
    if kind is not None and kind not in measured.known_kinds():
        return (f"unknown device kind {kind!r} (no {here(co).show(measured.SCALE_DIR / (kind + '.json'))}); known kinds: "
                f"{', '.join(measured.known_kinds())} (measure one with `python -m cancellation.scale --device cuda "
                f"--out data/scale/<kind>.json` on it)")
    if not a.plan and kind is not None:
        return "--device-kind plans for a device other than this host's: use it with --plan"
    if getattr(a, "replot", False) and (a.plan or a.dry_run or a.procs > 1):
        return "--replot computes nothing: it takes no --plan, --dry-run or --procs"
    if not a.plan and a.procs > 1 and getattr(a, "cores", 1) > 1:
        return ("--procs N (N ranks per notebook) and --cores N (notebooks side by side) both start processes "
                "on this host: use one of them")
    return None


DRY_ROOT = "dry-run"  # under the checkout; git-ignored


def _dry_run(nb: Path, a, overrides: dict, cwd: Path, planned, co: Checkout | None = None):
    """One notebook under --dry-run: random weights and a coin-flip reward in the kernel (environment
    read by policy.load_policy and sources.ProblemSource), its own cache, every output under dry-run/;
    wall time and peak memory recorded in dry-run/<profile>/measured.json beside the plan."""
    co = here(co)
    out_root = co.root / DRY_ROOT
    record = out_root / a.profile / "measured.json"
    peak = out_root / a.profile / f".{nb.stem}.peak.json"
    peak.parent.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in (DRY_RUN_ENV, "CANCELLATION_CACHE")}
    os.environ[DRY_RUN_ENV] = json.dumps({"seed": 0})
    os.environ["CANCELLATION_CACHE"] = str(out_root / "cache")  # never the key of a real checkpoint's results
    try:
        t0 = time.time()
        execute.run_notebook(str(nb), a.profile, overrides, out_root=out_root, replace=a.replace, cwd=cwd,
                             peak_file=peak, checkout=co)
        wall = time.time() - t0
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    got = json.loads(peak.read_text()) if peak.exists() else {}
    peak.unlink(missing_ok=True)
    row = dict(notebook=nb.stem, overrides=overrides, measured_seconds=round(wall, 2), **got,
               planned=planned.as_dict() if planned is not None else None)
    rows = json.loads(record.read_text()) if record.exists() else {}
    rows[nb.stem] = row
    record.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    mem = got.get("peak_cuda_gib") or got.get("peak_rss_gib") or float("nan")
    what = "GPU" if got.get("peak_cuda_gib") else "process RSS"
    pl = planned.as_dict() if planned is not None else {}
    print(f"[dry-run] {nb.stem}: measured {wall:.0f} s, peak {mem:.2f} GiB ({what}); planned "
          f"{_fmt(pl.get('predicted_seconds'), 's')}, {_fmt(pl.get('peak_gib'), 'GiB')} -> {co.show(record)}", flush=True)


def _fmt(x, unit):
    return "?" if x is None else f"{x:.0f} {unit}" if unit == "s" else f"{x:.2f} {unit}"


if __name__ == "__main__":
    main()
