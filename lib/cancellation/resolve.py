"""A notebook's parameters, resolved and checked: the notebook's defaults, the profile's `common:` and its
section, then -p overrides (later wins); each value checked for its type (YAML 1.2 numbers), its figure
module's rule (ranges, choices, paths), the absurd seeds and learning rates, the device and the Params'
cross-parameter constraints, one line per error (`ParameterError`). Also where a run writes
(`output_dirs`) and which selected notebook takes which override (`per_notebook`).
"""
from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import math
import os
import re
from pathlib import Path

import yaml

from .profiles import (INJECTED, Checkout, ParameterError, YamlInputError, figure_params, here, load_profile,
                       notebook_defaults, profile_errors, short, yaml_load)


def _schema_for(nb_path: Path) -> tuple[dict, list]:
    """(rules, constraints) of a notebook: its figure module's Params (field metadata and
    CONSTRAINTS); a notebook without a figure module gets type checks only."""
    P = figure_params(nb_path)
    return (P.rules(), list(P.CONSTRAINTS)) if P is not None else ({}, [])


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



_DEVICE = re.compile(r"cpu|mps|cuda(:[0-9]+)?")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def _resolve_path(value: str, kind: str, base: Path, check: bool, choices=(),
                  checkout: Checkout | None = None) -> tuple[str, str | None]:
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
        return here(checkout).show(full), None
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


def _check_rule(value, rule: dict, base: Path, check_paths: bool, default=None,
                checkout: Checkout | None = None) -> tuple[object, list[str]]:
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
                x, e = _resolve_path(x, rule["path"], base, check_paths, rule.get("choices", ()), checkout)
                if e:
                    errs.append(el(x0) + e)
            out.append(x)
        value = out if isinstance(value, list) else out[0]
    return value, errs


SEED_MAX = 2**31 - 1   # seeds are mixed into others (seeds.derive: seed * 104_729 + it, ...) that stay in int64/uint32
LR_MAX = 1e3           # a step this large diverges to NaN; no figure uses more than 10
_ABSURD = [
    (re.compile(r"(?!n_)(?:[a-z]+_)?seeds?"), lambda x: isinstance(x, int) and 0 <= x <= SEED_MAX,
     f"an integer seed >= 0 and <= {SEED_MAX}"),
    (re.compile(r"(?:[a-z]+_)?lrs?"), lambda x: x <= LR_MAX, f"a learning rate <= {LR_MAX:g} (larger ones diverge)"),
]


def _override_value(v, default):
    """A -p value: YAML (1.2 numbers) unless the parameter is a string."""
    if isinstance(v, str) and not isinstance(default, str):
        try:
            out = yaml_load(v) if v.strip() else None
            if isinstance(out, str) and isinstance(default, float) and out.strip().lower().lstrip("+-") in ("inf", "nan", "infinity"):
                return float(out)  # reported as not finite, not as a string
            return out
        except YamlInputError as e:
            raise ParameterError(f"cannot use {short(repr(v), 100)}: {e}") from None
        except yaml.YAMLError as e:
            raise ParameterError(f"cannot parse {v!r} as YAML ({str(e).splitlines()[0]})") from None
    return v


def overrides_hash(overrides: dict) -> str:
    """The directory name of a run with these (validated) overrides."""
    blob = json.dumps(overrides, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def output_dirs(profile: str, overrides: dict | None, out_root: Path | None = None, replace: bool = False,
                checkout: Checkout | None = None) -> dict:
    """fig_dir, results_dir and the executed-notebook dir of a run: the profile's canonical
    directories, or `.../runs/<hash of the overrides>/` for a run with overrides (unless `replace`)."""
    co = here(checkout)
    root = Path(out_root) if out_root else co.root
    sub = Path("runs") / overrides_hash(overrides) if overrides and not replace else Path()
    dirs = {"fig_dir": root / "figures" / profile / sub, "results_dir": root / "data" / "results" / profile / sub,
            "executed_dir": root / "notebooks" / "executed" / profile / sub}
    return {k: co.show(v) if out_root is None else str(v) for k, v in dirs.items()}


def resolve_params(nb_path: Path, profile: str = "tiny", overrides: dict | None = None,
                   out_root: Path | None = None, *, cwd: str | Path | None = None, check_paths: bool = False,
                   replace: bool = False, resolved_overrides: dict | None = None,
                   checkout: Checkout | None = None) -> dict:
    """The validated parameter dict a notebook runs with.

    Checks every parameter: its type against the notebook's default (no null unless the default
    is None; YAML 1.2 numbers), its rule in the figure module's Params (ranges, finiteness,
    choices, paths) and the notebook's cross-parameter constraints. Relative paths from
    `overrides` resolve against `cwd` (default: the working directory), those of profiles and
    defaults against the repository; `check_paths` makes a missing file an error. Raises
    ParameterError with one line per problem, each naming the notebook, parameter, value and
    what is allowed. `resolved_overrides` (a dict) receives the validated overrides. `checkout`: whose
    profiles and repository (default HERE).
    """
    co = here(checkout)
    stem = nb_path.stem
    defaults = notebook_defaults(nb_path)
    prof = load_profile(profile, co)
    prof_file = co.show(co.params / f"{profile}.yaml")
    params, origin, errs = dict(defaults), {k: "default" for k in defaults}, profile_errors(profile, prof, co)

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
        elif k in INJECTED:
            errs.append(f"{stem}: {prof_file}, section {stem}: parameter {k!r} is set by the runner")
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
    rules, constraints = _schema_for(nb_path)
    base_cwd = Path(cwd) if cwd else Path.cwd()
    for k, rule in rules.items():
        if k not in defaults or k in INJECTED or any(e.startswith(f"{stem}: parameter {k!r}") for e in errs):
            continue
        v, problems = _check_rule(params[k], rule or {}, base_cwd if origin[k] == "-p" else co.root, check_paths,
                                  defaults[k], co)
        params[k] = v
        errs += [f"{stem}: parameter {k!r} = {params[k]!r}: {p} (from {origin[k]})" for p in problems]
    for k, v in params.items():  # a device torch names, on any machine (available or not is the notebook's)
        if k == "device" and isinstance(v, str) and v and not _DEVICE.fullmatch(v):
            errs.append(f"{stem}: parameter {k!r} = {v!r}: not a device; allowed: cpu, cuda, cuda:N (N = 0, 1, ...), "
                        f"mps (from {origin[k]})")
    for k, v in params.items():  # finiteness of every number, with or without a rule
        if k not in rules and isinstance(v, float) and not math.isfinite(v):
            errs.append(f"{stem}: parameter {k!r} = {v!r}: not finite; allowed: a finite number (from {origin[k]})")
    for k, v in params.items():  # seeds and learning rates: values that pass a type check yet overflow or diverge
        if any(e.startswith(f"{stem}: parameter {k!r}") for e in errs):
            continue
        for rx, ok, allowed in _ABSURD:
            if rx.fullmatch(k):
                bad = [x for x in (v if isinstance(v, list) else [v])
                       if isinstance(x, (int, float)) and not isinstance(x, bool) and not ok(x)]
                if bad:
                    el = f"element {short(repr(bad[0]), 60)}: " if isinstance(v, list) else ""
                    errs.append(f"{stem}: parameter {k!r} = {short(repr(v), 80)}: {el}out of range; allowed: "
                                f"{allowed} (from {origin[k]})")
    if not errs:
        for check, message in constraints:
            reads = inspect.signature(check).parameters   # the parameters a check reads are its arguments
            names = [n for n in defaults if n in reads]
            try:
                ok = bool(check(**{n: params[n] for n in reads}))
            except Exception as e:  # noqa: BLE001 - a constraint that cannot be evaluated is a failed one
                ok, message = False, f"{message} ({type(e).__name__}: {e})"
            if not ok:
                vals = ", ".join(f"{n}={params[n]!r}" for n in names)
                errs.append(f"{stem}: {vals}: {message}")
    if errs:
        raise ParameterError("\n".join(errs))
    ov = {k: params[k] for k in (overrides or {})}
    if resolved_overrides is not None:
        resolved_overrides.update(ov)
    dirs = output_dirs(profile, ov, out_root, replace, co)
    injected = {"profile": profile, "fig_dir": dirs["fig_dir"], "results_dir": dirs["results_dir"], "replot": ""}
    params.update({k: v for k, v in injected.items() if k in defaults})
    return params


def per_notebook(paths: list[Path], overrides: dict) -> tuple[dict, list[str]]:
    """Each selected notebook's share of the overrides (the names it declares) and one error per name
    that no selected notebook declares. With one notebook every name goes to it (resolve_params
    names an unknown one)."""
    if len(paths) == 1:
        return {paths[0]: dict(overrides)}, []
    declared = {nb: set(notebook_defaults(nb)) for nb in paths}
    known = set().union(*declared.values()) - set(INJECTED)
    errs = []
    for k in overrides:
        if not any(k in d for d in declared.values()):
            close = difflib.get_close_matches(k, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            errs.append(f"unknown parameter {k!r}: no selected notebook declares it.{hint}")
    return {nb: {k: v for k, v in overrides.items() if k in declared[nb]} for nb in paths}, errs
