"""Run a notebook with a profile: jupytext (.py percent) -> papermill -> executed .ipynb.

Parameters are merged in this order, later wins: the notebook's `parameters` cell, the profile's
`common:` section (only names the notebook declares), the profile's section for the notebook,
then command-line overrides. Unknown names and wrong types are rejected before anything runs.

    python -m cancellation.run 01                      # notebooks/01_*.py on the tiny profile
    python -m cancellation.run 01 -p steps 5 -p seed 1
    python -m cancellation.run all --profile tiny
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"
INJECTED = ("profile", "fig_dir", "results_dir")  # set by the runner from the profile


class ParameterError(ValueError):
    pass


def find_notebook(ref: str) -> Path:
    """notebooks/NN_name.py from 'NN', 'NN_name' or a path."""
    p = Path(ref)
    if p.suffix == ".py" and p.exists():
        return p.resolve()
    hits = sorted(NOTEBOOKS.glob(f"{ref}*.py")) if ref else []
    if len(hits) != 1:
        known = ", ".join(x.stem for x in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")))
        raise ParameterError(f"no single notebook matches {ref!r}; known notebooks: {known}")
    return hits[0]


def all_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def notebook_defaults(nb_path: Path) -> dict:
    """Names and default values of the notebook's cell tagged `parameters`."""
    import jupytext
    nb = jupytext.read(nb_path)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            ns: dict = {}
            exec(cell.source, {}, ns)
            return {k: v for k, v in ns.items() if not k.startswith("_")}
    raise ParameterError(f"{nb_path.name} has no cell tagged 'parameters'")


def load_profile(profile: str) -> dict:
    path = PARAMS / f"{profile}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(PARAMS.glob("*.yaml")))
        raise ParameterError(f"unknown profile {profile!r} (no {path}); known profiles: {known}")
    return yaml.safe_load(path.read_text()) or {}


def _check_type(name: str, value, default):
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ParameterError(f"parameter {name!r} must be true/false, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, (int, float, str, list, dict)) and not isinstance(value, type(default)) \
            or (isinstance(value, bool) and not isinstance(default, bool)):
        raise ParameterError(f"parameter {name!r} must be of type {type(default).__name__} "
                             f"(default {default!r}), got {value!r} ({type(value).__name__})")
    return value


def _unknown(name: str, known) -> ParameterError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ParameterError(f"unknown parameter {name!r}.{hint} Known parameters: {', '.join(sorted(known))}")


def resolve_params(nb_path: Path, profile: str = "tiny", overrides: dict | None = None,
                   out_root: Path | None = None) -> dict:
    """The validated parameter dict a notebook runs with."""
    defaults = notebook_defaults(nb_path)
    prof = load_profile(profile)
    params = dict(defaults)
    for k, v in (prof.get("common") or {}).items():
        if k in defaults:
            params[k] = _check_type(k, v, defaults[k])
    for k, v in (prof.get(nb_path.stem) or {}).items():
        if k not in defaults:
            raise ParameterError(f"{PARAMS / (profile + '.yaml')}, section {nb_path.stem}: " + str(_unknown(k, defaults)))
        params[k] = _check_type(k, v, defaults[k])
    for k, v in (overrides or {}).items():
        if k not in defaults:
            raise _unknown(k, defaults)
        if isinstance(v, str) and not isinstance(defaults[k], str):
            v = yaml.safe_load(v)
            if isinstance(v, str) and isinstance(defaults[k], float) and not isinstance(defaults[k], bool):
                try:  # YAML 1.1 reads '1e-3' as a string
                    v = float(v)
                except ValueError:
                    pass
        params[k] = _check_type(k, v, defaults[k])
    root = Path(out_root) if out_root else ROOT
    injected = {"profile": profile, "fig_dir": str(root / "figures" / profile),
                "results_dir": str(root / "data" / "results" / profile)}
    params.update({k: v for k, v in injected.items() if k in defaults})
    return params


def _strip_volatile(path: Path):
    """Drop timing metadata papermill writes, so reruns diff only where results changed."""
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("papermill", None)
    for c in nb.get("cells", []):
        c.get("metadata", {}).pop("papermill", None)
        c.get("metadata", {}).pop("execution", None)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def run_notebook(ref: str, profile: str = "tiny", overrides: dict | None = None, out_root: Path | None = None,
                 log_output: bool = True) -> Path:
    """Execute one notebook; returns the executed .ipynb path (under out_root/notebooks/executed/<profile>)."""
    import jupytext
    import papermill as pm

    nb_path = find_notebook(ref)
    params = resolve_params(nb_path, profile, overrides, out_root)
    root = Path(out_root) if out_root else ROOT
    out = root / "notebooks" / "executed" / profile / f"{nb_path.stem}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / f"{nb_path.stem}.ipynb"
        nb = jupytext.read(nb_path)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        for i, cell in enumerate(nb.cells):  # stable cell ids: reruns diff only where outputs changed
            cell["id"] = f"cell-{i:03d}"
        jupytext.write(nb, src)
        t0 = time.time()
        print(f"[run] {nb_path.name} profile={profile} -> {out.relative_to(root) if out.is_relative_to(root) else out}",
              flush=True)
        pm.execute_notebook(str(src), str(out), parameters=params, kernel_name="python3", cwd=str(ROOT),
                            progress_bar=False, log_output=log_output, stdout_file=None)
        print(f"[run] {nb_path.name} done in {time.time() - t0:.0f} s", flush=True)
    _strip_volatile(out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run figure notebooks with a parameter profile.")
    ap.add_argument("notebooks", nargs="+", help="'all', a number (01) or a notebook name")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                    help="override one parameter (value parsed as YAML)")
    ap.add_argument("--check", action="store_true", help="only validate and print the parameters")
    a = ap.parse_args(argv)
    refs = [p.stem for p in all_notebooks()] if a.notebooks == ["all"] else a.notebooks
    overrides = dict(a.p)
    try:
        for ref in refs:
            if a.check:
                print(json.dumps(resolve_params(find_notebook(ref), a.profile, overrides), indent=1))
            else:
                run_notebook(ref, a.profile, overrides)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
