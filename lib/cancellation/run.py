"""Run a notebook with a profile: jupytext (.py percent) -> papermill -> executed .ipynb.

Parameters are merged in this order, later wins: the notebook's `parameters` cell, the profile's
`common:` section (only names the notebook declares), the profile's section for the notebook,
then command-line overrides. Every selected notebook is validated before any runs: unknown
names, types (YAML 1.2 numbers: `010` is 10), the ranges, choices and paths of
notebooks/params/schema.yaml and its cross-parameter constraints; one line per error, exit 2.

A run with -p overrides writes to its own directories, figures/<profile>/runs/<hash>/,
data/results/<profile>/runs/<hash>/ and notebooks/executed/<profile>/runs/<hash>/ (hash of the
overrides, recorded in the executed notebook's metadata), so the committed outputs change only
with --replace. Executed notebooks are written to a temporary name and renamed; a failing
notebook prints its failing cell and the one-line cause, keeps <name>.failed.ipynb, exit 1.

    python -m cancellation.run 01                      # notebooks/01_*.py on the tiny profile
    python -m cancellation.run 01 -p steps 5 -p seed 1 # -> figures/tiny/runs/<hash>/ ...
    python -m cancellation.run 01 -p steps 5 --replace # -> figures/tiny/ (the canonical outputs)
    python -m cancellation.run all --profile tiny
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"
SCHEMA = PARAMS / "schema.yaml"
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


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 core-schema scalars: `010` is 10 (not octal 8), `1e-3` is a float (not a
    string), only true/false are booleans (not yes/no/on/off); 0o17 and 0x1f still mean octal/hex."""


_Yaml12Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                                                  "tag:yaml.org,2002:bool")]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                    list("-+0123456789"))
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _yaml12_int(loader, node):
    v = loader.construct_scalar(node)
    sign, v = (-1, v[1:]) if v[0] == "-" else (1, v.lstrip("+"))
    base = 8 if v.startswith("0o") else 16 if v.startswith("0x") else 10
    return sign * int(v[2:] if base != 10 else v, base)


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _yaml12_int)


def yaml_load(text: str):
    """Parse YAML text with YAML 1.2 numbers and booleans (profiles, schema, -p values)."""
    return yaml.load(text, Loader=_Yaml12Loader)


def load_profile(profile: str) -> dict:
    path = PARAMS / f"{profile}.yaml"
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(PARAMS.glob("*.yaml")) if p.stem != "schema")
        raise ParameterError(f"unknown profile {profile!r} (no {path}); known profiles: {known}")
    return yaml_load(path.read_text()) or {}


def load_schema() -> dict:
    """notebooks/params/schema.yaml: name -> rule, with per-notebook sections (see the file)."""
    return (yaml_load(SCHEMA.read_text()) or {}) if SCHEMA.exists() else {}


def _schema_for(schema: dict, stem: str) -> tuple[dict, list]:
    rules = dict(schema.get("common") or {})
    sec = dict(schema.get(stem) or {})
    constraints = sec.pop("constraints", None) or []
    rules.update(sec)
    return rules, constraints


def _type_error(name, value, default) -> str:
    return (f"parameter {name!r} must be of type {type(default).__name__} (default {default!r}), "
            f"got {value!r} ({type(value).__name__})")


def _check_type(name: str, value, default):
    """`value` converted to the default's type (int -> float); ParameterError when it does not fit."""
    if default is None:
        return value
    if value is None:
        raise ParameterError(f"parameter {name!r} must not be empty/null; default {default!r}")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ParameterError(f"parameter {name!r} must be true/false, got {value!r}")
        return value
    if isinstance(value, bool):
        raise ParameterError(_type_error(name, value, default))
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, (int, float, str, list, dict)) and not isinstance(value, type(default)):
        raise ParameterError(_type_error(name, value, default))
    if isinstance(default, list) and default:
        proto = default[0]
        out = []
        for i, x in enumerate(value):
            try:
                out.append(_check_type(f"{name}[{i}]", x, proto))
            except ParameterError as e:
                raise ParameterError(f"{e} (elements of {name!r} are {type(proto).__name__}, default {default!r})") \
                    from None
        return out
    return value


def _unknown(name: str, known) -> ParameterError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ParameterError(f"unknown parameter {name!r}.{hint} Known parameters: {', '.join(sorted(known))}")


def _show(path: Path) -> str:
    """A resolved path as the notebooks get it: relative to the repository when inside it (they run
    there, and executed notebooks stay machine-independent), else absolute."""
    path = Path(os.path.normpath(path))
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _resolve_path(value: str, kind: str, base: Path, check: bool, choices=()) -> tuple[str, str | None]:
    """(value for the notebook, error or None) of one path-like parameter value."""
    if value == "" or (kind == "file-or-choice" and value in (choices or ())):
        return value, None
    full = Path(os.path.expanduser(value))
    full = full if full.is_absolute() else base / full
    if full.exists():
        if kind == "model" and not full.is_dir():
            return value, f"{full} is a file; expected a model directory or a hub repo id"
        if kind == "model" and not (full / "config.json").exists():
            return value, f"{full} has no config.json; expected a Hugging Face model directory"
        if kind != "model" and not full.is_file():
            return value, f"{full} is not a file"
        return _show(full), None
    if kind == "model" and _HUB_ID.fullmatch(value) and not (value.count("/") == 1 and (base / value.split("/")[0]).exists()):
        return value, None  # a hub repo id ("org/name"); nothing local claims the name
    if not check:
        return value, None
    allowed = {"model": "an existing model directory or a hub repo id 'org/name'",
               "file": "an existing file", "file-or-choice": f"one of {list(choices)} or an existing file"}[kind]
    return value, f"no such file or directory ({full}); expected {allowed}"


def _fmt_allowed(rule: dict) -> str:
    parts = []
    for k, op in (("min", ">="), ("gt", ">"), ("max", "<="), ("lt", "<")):
        if k in rule:
            parts.append(f"{op} {rule[k]}")
    return " and ".join(parts)


def _check_rule(value, rule: dict, base: Path, check_paths: bool, default=None) -> tuple[object, list[str]]:
    """(value, [what is wrong]) of one parameter under its schema rule; paths are resolved."""
    errs = []
    is_list = isinstance(value, list)
    items = value if is_list else [value]
    el = (lambda x: f"element {x!r}: ") if is_list else (lambda x: "")  # noqa: E731
    if rule.get("nonempty") and (value == [] or value == ""):
        errs.append("must not be empty")
    if rule.get("distinct") and isinstance(value, list):
        try:
            if len(set(map(json.dumps, value))) < len(value):
                errs.append("must not repeat an element")
        except TypeError:
            pass
    for x in items:
        if isinstance(x, bool):
            continue
        if isinstance(x, float) and not math.isfinite(x):
            errs.append(f"{el(x)}not finite; allowed: a finite number {_fmt_allowed(rule)}".rstrip())
            continue
        if isinstance(x, (int, float)):
            bad = (("min" in rule and x < rule["min"]) or ("max" in rule and x > rule["max"])
                   or ("gt" in rule and x <= rule["gt"]) or ("lt" in rule and x >= rule["lt"]))
            if bad:
                errs.append(f"{el(x)}out of range; allowed: {_fmt_allowed(rule)}")
        if "choices" in rule and rule.get("path") != "file-or-choice" and x not in rule["choices"]:
            errs.append(f"{el(x)}not allowed; allowed: {', '.join(map(repr, rule['choices']))}")
    if rule.get("path"):
        out = []
        for x in items:
            if isinstance(x, str) and x == "" and (is_list or (default != "" and not rule.get("optional"))):
                errs.append(f"{el(x)}must not be empty; expected {'a path' if rule['path'] == 'file' else 'a model'}")
            elif isinstance(x, str):
                x0 = x
                x, e = _resolve_path(x, rule["path"], base, check_paths, rule.get("choices", ()))
                if e:
                    errs.append(el(x0) + e)
            out.append(x)
        value = out if isinstance(value, list) else out[0]
    return value, errs


def _override_value(v, default):
    """A -p value: YAML (1.2 numbers) unless the parameter is a string."""
    if isinstance(v, str) and not isinstance(default, str):
        try:
            out = yaml_load(v) if v.strip() else None
            if isinstance(out, str) and isinstance(default, float) and out.strip().lower().lstrip("+-") in ("inf", "nan", "infinity"):
                return float(out)  # reported as not finite, not as a string
            return out
        except yaml.YAMLError as e:
            raise ParameterError(f"cannot parse {v!r} as YAML ({str(e).splitlines()[0]})") from None
    return v


def overrides_hash(overrides: dict) -> str:
    """The directory name of a run with these (validated) overrides."""
    blob = json.dumps(overrides, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def output_dirs(profile: str, overrides: dict | None, out_root: Path | None = None, replace: bool = False) -> dict:
    """fig_dir, results_dir and the executed-notebook dir of a run: the profile's canonical
    directories, or `.../runs/<hash of the overrides>/` for a run with overrides (unless `replace`)."""
    root = Path(out_root) if out_root else ROOT
    sub = Path("runs") / overrides_hash(overrides) if overrides and not replace else Path()
    dirs = {"fig_dir": root / "figures" / profile / sub, "results_dir": root / "data" / "results" / profile / sub,
            "executed_dir": root / "notebooks" / "executed" / profile / sub}
    return {k: _show(v) if out_root is None else str(v) for k, v in dirs.items()}


def resolve_params(nb_path: Path, profile: str = "tiny", overrides: dict | None = None,
                   out_root: Path | None = None, *, cwd: str | Path | None = None, check_paths: bool = False,
                   replace: bool = False, resolved_overrides: dict | None = None) -> dict:
    """The validated parameter dict a notebook runs with.

    Checks every parameter: its type against the notebook's default (no null unless the default
    is None; YAML 1.2 numbers), its rule in notebooks/params/schema.yaml (ranges, finiteness,
    choices, paths) and the notebook's cross-parameter constraints. Relative paths from
    `overrides` resolve against `cwd` (default: the working directory), those of profiles and
    defaults against the repository; `check_paths` makes a missing file an error. Raises
    ParameterError with one line per problem, each naming the notebook, parameter, value and
    what is allowed. `resolved_overrides` (a dict) receives the validated overrides.
    """
    stem = nb_path.stem
    defaults = notebook_defaults(nb_path)
    prof = load_profile(profile)
    prof_file = _show(PARAMS / f"{profile}.yaml")
    params, origin, errs = dict(defaults), {k: "default" for k in defaults}, []

    def put(k, v, where):
        try:
            params[k] = _check_type(k, v, defaults[k])
            origin[k] = where
        except ParameterError as e:
            errs.append(f"{stem}: {e} (from {where})")

    for k, v in (prof.get("common") or {}).items():
        if k in defaults and k not in INJECTED:
            put(k, v, f"{prof_file}, common")
    for k, v in (prof.get(stem) or {}).items():
        if k not in defaults:
            errs.append(f"{stem}: {prof_file}, section {stem}: {_unknown(k, defaults)}")
        else:
            put(k, v, f"{prof_file}, section {stem}")
    for k, v in (overrides or {}).items():
        if k not in defaults:
            errs.append(f"{stem}: {_unknown(k, defaults)}")
        elif k in INJECTED:
            errs.append(f"{stem}: parameter {k!r} is set by the runner (use --profile, or --replace for the "
                        f"canonical output directories)")
        else:
            try:
                put(k, _override_value(v, defaults[k]), "-p")
            except ParameterError as e:
                errs.append(f"{stem}: parameter {k!r}: {e} (from -p)")
    rules, constraints = _schema_for(load_schema(), stem)
    base_cwd = Path(cwd) if cwd else Path.cwd()
    for k, rule in rules.items():
        if k not in defaults or k in INJECTED or any(e.startswith(f"{stem}: parameter {k!r}") for e in errs):
            continue
        v, problems = _check_rule(params[k], rule or {}, base_cwd if origin[k] == "-p" else ROOT, check_paths,
                                  defaults[k])
        params[k] = v
        errs += [f"{stem}: parameter {k!r} = {params[k]!r}: {p} (from {origin[k]})" for p in problems]
    for k, v in params.items():  # finiteness of every number, with or without a rule
        if k not in rules and isinstance(v, float) and not math.isfinite(v):
            errs.append(f"{stem}: parameter {k!r} = {v!r}: not finite; allowed: a finite number (from {origin[k]})")
    if not errs:
        for check, message in constraints:
            try:
                ok = eval(check, {"__builtins__": {"max": max, "min": min, "len": len, "set": set}}, dict(params))
            except Exception as e:  # noqa: BLE001 - a constraint that cannot be evaluated is a failed one
                ok, message = False, f"{message} ({type(e).__name__}: {e})"
            if not ok:
                names = [n for n in defaults if re.search(rf"\b{re.escape(n)}\b", check)]
                vals = ", ".join(f"{n}={params[n]!r}" for n in names)
                errs.append(f"{stem}: {vals}: {message}")
    if errs:
        raise ParameterError("\n".join(errs))
    ov = {k: params[k] for k in (overrides or {})}
    if resolved_overrides is not None:
        resolved_overrides.update(ov)
    dirs = output_dirs(profile, ov, out_root, replace)
    injected = {"profile": profile, "fig_dir": dirs["fig_dir"], "results_dir": dirs["results_dir"]}
    params.update({k: v for k, v in injected.items() if k in defaults})
    return params


def _is_progress(out: dict) -> bool:
    """A stderr stream of progress-bar redraws (tqdm writes '\r...it/s]') or tqdm's IProgress notice."""
    if out.get("output_type") != "stream" or out.get("name") != "stderr":
        return False
    text = "".join(out.get("text", []))
    return text.startswith("\r") or "TqdmWarning: IProgress not found" in text or (
        "from .autonotebook import tqdm" in text)


def _strip_volatile(path: Path):
    """Drop timing metadata papermill writes and progress-bar redraws, so reruns diff only where
    results changed and a reader sees results, not hundreds of tqdm frames."""
    nb = json.loads(Path(path).read_text())
    nb.get("metadata", {}).pop("papermill", None)
    for c in nb.get("cells", []):
        c.get("metadata", {}).pop("papermill", None)
        c.get("metadata", {}).pop("execution", None)
        if "outputs" in c:
            c["outputs"] = [o for o in c["outputs"] if not _is_progress(o)]
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


class NotebookFailed(RuntimeError):
    """A notebook raised: the message names the notebook, the failing cell and the one-line cause."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _failure_summary(name: str, e, kept: Path | None) -> str:
    """Failing cell's head and the one-line cause of a papermill error (not the whole traceback)."""
    ename, evalue = getattr(e, "ename", type(e).__name__), _ANSI.sub("", str(getattr(e, "evalue", e)))
    cause = f"{ename}: {evalue.strip().splitlines()[0] if evalue.strip() else ''}".rstrip(": ")
    src = (getattr(e, "source", "") or "").splitlines()
    lines = [f"{name} failed" + (f" in cell {e.cell_index}" if getattr(e, "cell_index", None) is not None else "")
             + ":"]
    tb = "\n".join(_ANSI.sub("", t) for t in (getattr(e, "traceback", None) or []))
    at = re.search(r"^-*> ?(\d+)", tb, re.M)  # IPython marks the failing line of the cell with ---->
    head = [ln for ln in src if ln.strip()][:3]
    lines += [f"    | {ln}" for ln in head] + (["    | ..."] if len([ln for ln in src if ln.strip()]) > 3 else [])
    if at and 0 < int(at.group(1)) <= len(src):
        lines.append(f"  at line {at.group(1)}: {src[int(at.group(1)) - 1].strip()}")
    lines.append(f"  {cause}")
    if kept is not None:
        lines.append(f"  the notebook as far as it ran: {_show(kept)}")
    return "\n".join(lines)


def run_notebook(ref: str, profile: str = "tiny", overrides: dict | None = None, out_root: Path | None = None,
                 log_output: bool = True, *, replace: bool = False, cwd: str | Path | None = None) -> Path:
    """Execute one notebook; returns the executed .ipynb path.

    Outputs go to the profile's directories (figures/<profile>, data/results/<profile>,
    notebooks/executed/<profile>, under out_root when given), or, for a run with overrides, to
    `runs/<hash of the overrides>/` below each unless `replace`. The executed notebook is written
    to a temporary name and renamed when it ran through; a failed run keeps the canonical one and
    leaves `<name>.failed.ipynb` beside it, raising NotebookFailed with a short summary.
    """
    import jupytext
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    nb_path = find_notebook(ref)
    ov: dict = {}
    params = resolve_params(nb_path, profile, overrides, out_root, cwd=cwd, check_paths=True, replace=replace,
                            resolved_overrides=ov)
    root = Path(out_root) if out_root else ROOT
    out_dir = Path(output_dirs(profile, ov, out_root, replace)["executed_dir"])
    out_dir = out_dir if out_dir.is_absolute() else ROOT / out_dir
    out = out_dir / f"{nb_path.stem}.ipynb"
    failed = out_dir / f"{nb_path.stem}.failed.ipynb"
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{nb_path.stem}.", suffix=".tmp.ipynb")
    os.close(fd)
    tmp = Path(tmp)
    try:
        with tempfile.TemporaryDirectory() as td:
            src = Path(td) / f"{nb_path.stem}.ipynb"
            nb = jupytext.read(nb_path)
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            nb.metadata["cancellation"] = {"profile": profile, "overrides": ov, "replace": bool(replace and ov),
                                           "fig_dir": params.get("fig_dir"), "results_dir": params.get("results_dir")}
            for i, cell in enumerate(nb.cells):  # stable cell ids: reruns diff only where outputs changed
                cell["id"] = f"cell-{i:03d}"
            jupytext.write(nb, src)
            t0 = time.time()
            print(f"[run] {nb_path.name} profile={profile} -> {out.relative_to(root) if out.is_relative_to(root) else out}",
                  flush=True)
            try:
                pm.execute_notebook(str(src), str(tmp), parameters=params, kernel_name="python3", cwd=str(ROOT),
                                    progress_bar=False, log_output=log_output, stdout_file=None)
            except Exception as e:  # noqa: BLE001 - papermill, kernel death, Ctrl-C in the kernel
                kept = None
                if tmp.exists() and tmp.stat().st_size:
                    _strip_volatile(tmp)
                    os.chmod(tmp, 0o666 & ~_UMASK)
                    os.replace(tmp, failed)
                    kept = failed
                msg = _failure_summary(nb_path.stem, e, kept)
                if isinstance(e, PapermillExecutionError) or "Kernel" in type(e).__name__:
                    raise NotebookFailed(msg) from None
                raise NotebookFailed(msg) from e
            print(f"[run] {nb_path.name} done in {time.time() - t0:.0f} s", flush=True)
        _strip_volatile(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, out)  # atomic: the executed notebook is the old one or the complete new one
        if failed.exists():
            failed.unlink()
    finally:
        if tmp.exists():
            tmp.unlink()
    if ov and not replace:
        print(f"[run] a run with overrides {ov}: outputs in {_show(out_dir)}, {params.get('fig_dir')}, "
              f"{params.get('results_dir')} (--replace writes the canonical outputs)", flush=True)
    return out


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_UMASK = _umask()


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run figure notebooks with a parameter profile.")
    ap.add_argument("notebooks", nargs="+", help="'all', a number (01) or a notebook name")
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                    help="override one parameter (value parsed as YAML 1.2; relative paths from your working directory)")
    ap.add_argument("--check", action="store_true", help="only validate and print the parameters")
    ap.add_argument("--replace", action="store_true",
                    help="with -p overrides, write the canonical outputs (figures/<profile>/ ...) instead of "
                         "figures/<profile>/runs/<hash>/ ...")
    a = ap.parse_args(argv)
    overrides = dict(a.p)
    cwd = Path.cwd()
    try:  # every selected notebook is validated before any runs
        refs = [p.stem for p in all_notebooks()] if a.notebooks == ["all"] else a.notebooks
        paths = [find_notebook(r) for r in refs]
        errors, resolved = [], []
        for nb in paths:
            try:
                resolved.append((nb, resolve_params(nb, a.profile, overrides, cwd=cwd, check_paths=True,
                                                    replace=a.replace)))
            except ParameterError as e:
                errors += str(e).splitlines()
        if errors:
            raise ParameterError("\n".join(errors))
    except ParameterError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    try:
        for nb, params in resolved:
            if a.check:
                print(json.dumps(params, indent=1))
            else:
                run_notebook(str(nb), a.profile, overrides, replace=a.replace, cwd=cwd)
    except NotebookFailed as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except ParameterError as e:  # a file that vanished between the check and the run
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
