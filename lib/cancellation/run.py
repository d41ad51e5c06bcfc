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
import contextlib
import difflib
import errno
import hashlib
import inspect
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from cancellation import cache, manifest, procs, staging
from cancellation.dryrun import DRY_RUN_ENV

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PARAMS = NOTEBOOKS / "params"
INJECTED = ("profile", "fig_dir", "results_dir", "replot")  # set by the runner from the profile (replot: --replot)
ONE_LINE_STOPS = ("NoSignal", "UnrewardableGolds", "RankFailed")  # notebook errors whose message is the whole outcome


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


_DEFAULTS: dict = {}  # (path, mtime_ns, size) -> defaults: profile checks read every notebook


def figure_params(nb_path: Path):
    """The Params class of the notebook's figure module (the manifest's `module`), or None for a
    notebook the manifest does not list (its parameters live in its cell)."""
    fig = manifest.find(Path(nb_path).stem)
    return None if fig is None else getattr(fig.load(), "Params", None)


def notebook_defaults(nb_path: Path) -> dict:
    """Names and default values of the notebook's parameters (a fresh copy): its figure module's
    Params when it has one (the cell then holds only the runner's names and `params = {}`), else
    the cell tagged `parameters`."""
    import copy

    import jupytext
    st = Path(nb_path).stat()
    key = (str(Path(nb_path).resolve()), st.st_mtime_ns, st.st_size)
    if key not in _DEFAULTS:
        nb = jupytext.read(nb_path)
        for cell in nb.cells:
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                ns: dict = {}
                exec(cell.source, {}, ns)
                _DEFAULTS[key] = {k: v for k, v in ns.items() if not k.startswith("_")}
                break
        else:
            raise ParameterError(f"{nb_path.name} has no cell tagged 'parameters'")
        P = figure_params(nb_path)
        if P is not None:
            _DEFAULTS[key].pop("params", None)
            _DEFAULTS[key].update(P.defaults())
    return copy.deepcopy(_DEFAULTS[key])


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


MAX_YAML_VALUES = 100_000  # values a YAML text may expand to through its aliases (a profile has a few hundred)


class YamlInputError(ValueError):
    """A YAML text the runner refuses (duplicate key, non-string key, alias bomb); `line` is 1-based or None."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


def _check_yaml_tree(root, name_keys_depth: int = 0):
    """Refuse, before anything is constructed: a mapping with one key twice (the later would silently
    win), aliases expanding to more than MAX_YAML_VALUES values (a "billion laughs"), recursive
    aliases, and (in the first `name_keys_depth` levels of mappings: a profile's sections and their
    parameters) keys that are not plain strings."""
    size: dict[int, int] = {}
    busy: set[int] = set()
    stack = [(root, 0, False)]
    while stack:  # iterative post-order: nesting depth is no recursion here
        node, depth, done = stack.pop()
        if done:
            busy.discard(id(node))
            kids = [c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode) else \
                node.value if isinstance(node, yaml.SequenceNode) else []
            size[id(node)] = 1 + sum(size[id(c)] for c in kids)
            if size[id(node)] > MAX_YAML_VALUES:
                raise YamlInputError(f"aliases expand to more than {MAX_YAML_VALUES} values (nested anchors "
                                     f"and aliases); refused", node.start_mark.line + 1)
            continue
        if id(node) in size:
            continue
        if id(node) in busy:
            raise YamlInputError("an alias refers to the node that contains it (recursive); refused",
                                 node.start_mark.line + 1)
        busy.add(id(node))
        stack.append((node, depth, True))
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, _ in node.value:
                if depth < name_keys_depth and (not isinstance(k, yaml.ScalarNode) or k.tag not in (
                        "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge")):   # `<<: *anchor` merges: YAML's own
                    what = "section" if depth == 0 else "parameter"
                    shown = k.value if isinstance(k, yaml.ScalarNode) else type(k).__name__
                    raise YamlInputError(f"{what} name {str(shown)[:60]!r} is not a name (a string); "
                                         f"quote it or use a name", k.start_mark.line + 1)
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    ident = (k.tag, k.value)
                    if ident in seen:
                        what = "section" if depth == 0 and name_keys_depth else "key"
                        raise YamlInputError(f"duplicate {what} {k.value[:60]!r} (first at line {seen[ident]}); "
                                             f"the later one would silently win", k.start_mark.line + 1)
                    seen[ident] = k.start_mark.line + 1
            stack += [(c, depth + 1, False) for kv in reversed(node.value) for c in reversed(kv)]
        elif isinstance(node, yaml.SequenceNode):
            stack += [(c, depth + 1, False) for c in reversed(node.value)]


def yaml_load(text: str, name_keys_depth: int = 0):
    """Parse YAML text with YAML 1.2 numbers and booleans (profiles, schema, -p values). Duplicate keys,
    alias bombs and recursive aliases raise YamlInputError (see _check_yaml_tree); bad YAML raises
    yaml.YAMLError; nothing but plain data is constructed (a safe loader: `!!python/...` is an error)."""
    loader = _Yaml12Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_tree(node, name_keys_depth)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _short(text: str, n: int = 300) -> str:
    """`text` cut to `n` characters, saying how much was left out."""
    return text if len(text) <= n else f"{text[:n]}... [{len(text) - n} more characters]"


def read_yaml_file(path: Path, name_keys_depth: int = 0):
    """The YAML data of `path`; ParameterError, one line naming the file (and line where known), for
    non-UTF-8 bytes, YAML errors (syntax, unsupported tags such as !!python/...), duplicate keys,
    non-string names and alias bombs. No traceback, no expanded values."""
    where = _show(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ParameterError(f"{where}: line {line}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                             f"save it as UTF-8") from None
    try:
        return yaml_load(text, name_keys_depth)
    except YamlInputError as e:
        raise ParameterError(f"{where}: " + (f"line {e.line}: " if e.line else "") + str(e)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(x for x in (e.context, e.problem) if x) or type(e).__name__
        what = re.sub(r"\s+", " ", what)
        if "could not determine a constructor for the tag" in what:
            what = f"unsupported tag {what.split('tag', 1)[1].strip()} (a profile holds plain values only)"
        raise ParameterError(f"{where}: " + (f"line {mark.line + 1}, column {mark.column + 1}: " if mark else "")
                             + f"YAML error: {_short(what, 200)}") from None
    except yaml.YAMLError as e:
        what = re.sub(r"\s+", " ", str(e))
        raise ParameterError(f"{where}: YAML error: {_short(what, 200)}") from None
    except RecursionError:
        raise ParameterError(f"{where}: nested too deeply to read") from None


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def known_profiles() -> list[str]:
    return [p.stem for p in sorted(PARAMS.glob("*.yaml")) if p.stem != "schema"]


def load_profile(profile: str) -> dict:
    """The YAML of notebooks/params/<profile>.yaml; `profile` is a plain name of a file there, never a path."""
    known = ", ".join(known_profiles())
    if not _PROFILE_NAME.fullmatch(profile or "") or profile.endswith(".yaml") or profile == "schema":
        raise ParameterError(f"--profile takes the name of a profile in {_show(PARAMS)}/ (e.g. tiny), not a path "
                             f"or file name: got {profile!r}; known profiles: {known}")
    path = PARAMS / f"{profile}.yaml"
    if not path.is_file():
        raise ParameterError(f"unknown profile {profile!r} (no {_show(path)}); known profiles: {known}")
    prof = read_yaml_file(path, name_keys_depth=2) or {}
    if isinstance(prof, dict):   # `x-...` sections only hold YAML anchors for `<<: *name` merges (as in compose files)
        prof = {k: v for k, v in prof.items() if not str(k).startswith("x-")}
    if not isinstance(prof, dict) or not all(isinstance(v, dict) or v is None for v in prof.values()):
        raise ParameterError(f"{_show(path)}: expected a mapping of sections (common, <notebook>) to "
                             f"mappings of parameter: value")
    return prof


def profile_errors(profile: str, prof: dict | None = None) -> list[str]:
    """What is wrong with the profile as a whole (one line each): a section that names no notebook, a
    `common` key that no notebook declares (a common key applies to the notebooks that declare it),
    a name the runner sets. Section keys are checked per notebook by resolve_params."""
    prof = load_profile(profile) if prof is None else prof
    where = _show(PARAMS / f"{profile}.yaml")
    stems = {nb.stem: nb for nb in all_notebooks()}
    errs = []
    for sec in prof:
        if sec != "common" and sec not in stems:
            close = difflib.get_close_matches(str(sec), ["common", *stems], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            errs.append(f"{where}: unknown section {sec!r}.{hint} Sections: common, {', '.join(sorted(stems))}")
    declared = set().union(*(notebook_defaults(nb) for nb in stems.values())) if stems else set()
    for k in prof.get("common") or {}:
        if k in INJECTED:
            errs.append(f"{where}, common: parameter {k!r} is set by the runner (from the profile's name and "
                        f"the output directories)")
        elif k not in declared:
            close = difflib.get_close_matches(str(k), sorted(declared - set(INJECTED)), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            errs.append(f"{where}, common: unknown parameter {k!r}: no notebook declares it.{hint}")
    return errs


def _schema_for(stem: str) -> tuple[dict, list]:
    """(rules, constraints) of a notebook: its figure module's Params (field metadata and
    CONSTRAINTS); a notebook without a figure module gets type checks only."""
    P = figure_params(NOTEBOOKS / f"{stem}.py")
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


def _show(path: Path) -> str:
    """A resolved path as the notebooks get it: relative to the repository when inside it (they run
    there, and executed notebooks stay machine-independent), else absolute."""
    path = Path(os.path.normpath(path))
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


_DEVICE = re.compile(r"cpu|mps|cuda(:[0-9]+)?")
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
            raise ParameterError(f"cannot use {_short(repr(v), 100)}: {e}") from None
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
    is None; YAML 1.2 numbers), its rule in the figure module's Params (ranges, finiteness,
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
    params, origin, errs = dict(defaults), {k: "default" for k in defaults}, profile_errors(profile, prof)

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
    rules, constraints = _schema_for(stem)
    base_cwd = Path(cwd) if cwd else Path.cwd()
    for k, rule in rules.items():
        if k not in defaults or k in INJECTED or any(e.startswith(f"{stem}: parameter {k!r}") for e in errs):
            continue
        v, problems = _check_rule(params[k], rule or {}, base_cwd if origin[k] == "-p" else ROOT, check_paths,
                                  defaults[k])
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
                    el = f"element {_short(repr(bad[0]), 60)}: " if isinstance(v, list) else ""
                    errs.append(f"{stem}: parameter {k!r} = {_short(repr(v), 80)}: {el}out of range; allowed: "
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
    dirs = output_dirs(profile, ov, out_root, replace)
    injected = {"profile": profile, "fig_dir": dirs["fig_dir"], "results_dir": dirs["results_dir"], "replot": ""}
    params.update({k: v for k, v in injected.items() if k in defaults})
    return params


def _is_progress(out: dict) -> bool:
    """A stderr stream of progress-bar redraws (tqdm writes '\r...it/s]'), tqdm's IProgress notice, or the bare
    newline a closed bar leaves (a run that computed shows it, one that read the cache does not)."""
    if out.get("output_type") != "stream" or out.get("name") != "stderr":
        return False
    text = "".join(out.get("text", []))
    return text.startswith("\r") or not text.strip() or _is_tqdm_notice(text)


def _renamed(x, renames: dict):
    """`x` (a notebook's JSON) with every string's staging paths replaced by the final ones."""
    if isinstance(x, str):
        for a, b in renames.items():
            x = x.replace(a, b)
        return x
    if isinstance(x, list):
        return [_renamed(v, renames) for v in x]
    if isinstance(x, dict):
        return {k: _renamed(v, renames) for k, v in x.items()}
    return x


def _strip_volatile(path: Path, renames: dict | None = None):
    """Make an executed notebook depend on results only: drop the timing metadata papermill writes and
    progress-bar redraws (a reader sees results, not hundreds of tqdm frames), number the cells
    `cell-000`, `cell-001`, ... (papermill gives its injected-parameters cell a random id), and
    replace staging paths by the final ones (`renames`), so a rerun leaves git clean."""
    nb = json.loads(Path(path).read_text())
    nb.get("metadata", {}).pop("papermill", None)
    for i, c in enumerate(nb.get("cells", [])):
        c.get("metadata", {}).pop("papermill", None)
        c.get("metadata", {}).pop("execution", None)
        if "outputs" in c:
            c["outputs"] = [o for o in c["outputs"] if not _is_progress(o)]
        if "id" in c or nb.get("nbformat", 4) > 4 or nb.get("nbformat_minor", 0) >= 5:
            c["id"] = f"cell-{i:03d}"
    if renames:
        nb = _renamed(nb, dict(sorted(renames.items(), key=lambda kv: -len(kv[0]))))  # longest (absolute) first
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


# The dry run's last cell: the kernel's own peak memory, for the runner's record (dry runs only).
_PEAK_CELL = """# dry run: this process's peak memory, for the runner's record
import json as _json, resource as _resource, torch as _torch
_json.dump({"peak_rss_gib": _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "peak_cuda_gib": _torch.cuda.max_memory_allocated() / 2**30 if _torch.cuda.is_available() else None},
           open(%r, "w"))"""


def _prepare(nb_path: Path, dest: Path, meta: dict, peak_file: Path | None = None):
    """The .ipynb papermill executes: jupytext's conversion of the .py notebook, a python3 kernelspec,
    the run's metadata and cell ids numbered from the cell's index (deterministic, unlike jupytext's);
    with `peak_file` (a dry run) a last cell that writes the kernel's peak memory there."""
    import jupytext
    import nbformat
    nb = jupytext.read(nb_path)
    if peak_file is not None:
        nb.cells.append(nbformat.v4.new_code_cell(_PEAK_CELL % str(peak_file)))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["cancellation"] = meta
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:03d}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    jupytext.write(nb, dest)


class NotebookFailed(RuntimeError):
    """A notebook raised: the message names the notebook, the failing cell and the one-line cause."""


class NotebookInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a notebook: the message says which and where its partial notebook is."""

    def __init__(self, message: str, rc: int = 130):
        super().__init__(message)
        self.rc = rc


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


def _interrupt_summary(name: str, e: BaseException, kept: Path | None) -> str:
    how = "terminated (SIGTERM)" if isinstance(e, staging.Terminated) else "interrupted (Ctrl-C)"
    lines = [f"{name} {how}; its figures, tables and executed notebook are unchanged"]
    if kept is not None:
        lines.append(f"  the notebook as far as it ran: {_show(kept)}")
    return "\n".join(lines)


class _DropTeardownNoise(logging.Filter):
    """What nbclient's teardown logs when a run ends in a dead kernel or an interrupt, which Python's
    last-resort handler prints bare on stderr: "Kernel died while waiting for execute reply." (papermill's
    logger, before nbclient raises) and asyncio's "Task exception was never retrieved" with a traceback
    (one of nbclient's tasks, collected later). The runner reports both outcomes itself: a dead kernel's
    summary with the kernel's own stderr, or the interrupt's two lines. Seen on a slow 2-core machine
    under a second pytest worker: the Ctrl-C test got one or the other on top of its two lines."""
    NOISE = ("Kernel died while waiting for execute reply", "Task exception was never retrieved")

    def filter(self, record):
        return not record.getMessage().startswith(self.NOISE)


TEARDOWN_NOISE = _DropTeardownNoise()


@contextlib.contextmanager
def _quiet_teardown_noise():
    """The teardown noise dropped while a notebook runs; after a run that raised (a dead kernel, an
    interrupt) asyncio's stays dropped for the rest of this process, since nbclient's tasks are reported
    when they are collected, which can be later."""
    papermill_log, asyncio_log = logging.getLogger("papermill"), logging.getLogger("asyncio")
    papermill_log.addFilter(TEARDOWN_NOISE)
    asyncio_log.addFilter(TEARDOWN_NOISE)
    ok = False
    try:
        yield
        ok = True
    finally:
        papermill_log.removeFilter(TEARDOWN_NOISE)
        if ok:
            asyncio_log.removeFilter(TEARDOWN_NOISE)


def _disk_full(e: BaseException | None) -> OSError | None:
    """The 'no space left on device' error in `e`'s chain of causes, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
        e = e.__cause__ or e.__context__
    return None


def _disk_full_line(name: str, e: OSError, where: Path) -> str:
    return (f"{name} stopped: the disk is full (no space left writing {getattr(e, 'filename', None) or where}); "
            "its figures, tables and executed notebook are unchanged: free some space and run it again")


def _keep_failed(tmp: Path, failed: Path, renames: dict) -> Path | None:
    """The partial executed notebook moved to `failed` (None when papermill wrote nothing, or wrote a
    notebook cut off part way, e.g. on a full disk: nothing readable to keep)."""
    if not (tmp.exists() and tmp.stat().st_size):
        return None
    try:
        _strip_volatile(tmp, renames)
    except (ValueError, OSError):   # json's JSONDecodeError is a ValueError: a half-written file
        return None
    os.chmod(tmp, 0o666 & ~_UMASK)
    staging.replace_file(tmp, failed)
    return failed


# glibc malloc in the kernel: blocks up to 1 GiB come from the heap and stay there when freed. By default a
# block over 32 MiB is mmap'ed and unmapped on free, so a loop over (token_chunk x vocabulary) logits chunks
# (156 MB each at Qwen's 151,936-wide head and 256 positions) faults every page in afresh on every call.
# Measured on 2 cores (test_paper_vocab): 07 177 s -> 118 s (sys 80 s -> 20 s), 02 52 s -> 42 s; no change
# on the tiny profile, whose tensors are small. A value the user set wins; other C libraries ignore them.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def kernel_env() -> dict:
    """The environment a notebook's kernel starts with: this process's, plus MALLOC_ENV where unset."""
    return {**MALLOC_ENV, **os.environ}


def _kernel_manager(stderr):
    """jupyter_client's AsyncKernelManager, with the kernel process's own stderr (IPKernelApp's log:
    its TCP warning, teardown tracebacks after Ctrl-C, a crash's last words) going to the open file
    `stderr` instead of the terminal, and `kernel_env()` as its environment. Cell outputs come through
    the notebook as before."""
    from jupyter_client import AsyncKernelManager

    class KernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stderr", stderr)
            kw.setdefault("env", kernel_env())
            return await super().start_kernel(**kw)

    return KernelManager


# jupyter_client picks a kernel's ports free, then the kernel binds them: a kernel another process starts
# at the same moment (05 and 06 side by side) can take one in between. Nothing has run then: start again.
PORT_RETRIES = 3


def _port_taken(klog: Path) -> bool:
    """The kernel died binding a port another process took (its stderr says so)."""
    try:
        return "Address already in use" in klog.read_text(errors="replace")
    except OSError:
        return False


def _kernel_log_tail(path: Path, n: int = 5) -> list[str]:
    """The last lines of a kernel's stderr worth showing (not IPKernelApp's TCP warning)."""
    try:
        lines = [ln.rstrip() for ln in path.read_text(errors="replace").splitlines()]
    except OSError:
        return []
    return [ln for ln in lines if ln.strip() and "without encryption" not in ln][-n:]


def run_notebook(ref: str, profile: str = "tiny", overrides: dict | None = None, out_root: Path | None = None,
                 log_output: bool = True, *, replace: bool = False, cwd: str | Path | None = None,
                 peak_file: Path | None = None, replot: bool = False) -> Path:
    """Execute one notebook; returns the executed .ipynb path.

    `replot`: the notebook reads its Result back from the tables of its results folder (the one this run would
    write) and computes nothing (`figures/replot.py`): figures, claims and the executed notebook are redrawn,
    the tables are left as they are.

    Outputs go to the profile's directories (figures/<profile>, data/results/<profile>,
    notebooks/executed/<profile>, under out_root when given), or, for a run with overrides, to
    `runs/<hash of the overrides>/` below each unless `replace`. All or nothing: the notebook writes
    into a staging folder (staging.Staging, passed as its fig_dir/results_dir), whose figures, tables
    and executed notebook are moved into place only when it ran through. A failed run leaves the
    outputs as they were plus `<name>.failed.ipynb` and raises NotebookFailed with a short summary;
    Ctrl-C / SIGTERM raise NotebookInterrupted. The staging folder is removed on every exit.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    nb_path = find_notebook(ref)
    ov: dict = {}
    params = resolve_params(nb_path, profile, overrides, out_root, cwd=cwd, check_paths=True, replace=replace,
                            resolved_overrides=ov)
    root = Path(out_root) if out_root else ROOT
    final = {k: Path(v) if Path(v).is_absolute() else ROOT / v
             for k, v in output_dirs(profile, ov, out_root, replace).items()}
    out = final["executed_dir"] / f"{nb_path.stem}.ipynb"
    failed = final["executed_dir"] / f"{nb_path.stem}.failed.ipynb"
    staging.clear_stale(root)
    with staging.sigterm_raises(), staging.Staging(root, nb_path.stem, final) as st:
        run_params, renames = dict(params), {}
        if figure_params(nb_path) is not None:  # the notebook builds figNN.Params(**params)
            run_params = {k: v for k, v in params.items() if k in INJECTED}
            run_params["params"] = {k: v for k, v in params.items() if k not in INJECTED}
        for k in ("fig_dir", "results_dir"):
            if k in params:  # the notebook writes into the staging folder; its record names the final one
                run_params[k] = _show(st.dirs[k]) if out_root is None else str(st.dirs[k])
                renames.update({run_params[k]: params[k], str(st.dirs[k]): str(final[k])})
        if replot:   # the tables it reads: the final folder's (the staging folder holds only the claims registry)
            if "replot" not in params:
                raise NotebookFailed(f"{nb_path.stem} has no `replot` parameter: it cannot be redrawn without "
                                     f"recomputing")
            run_params["replot"] = str(params["results_dir"])
        src, tmp = st.dir / "source" / f"{nb_path.stem}.ipynb", st.dirs["executed_dir"] / f"{nb_path.stem}.ipynb"
        try:
            _prepare(nb_path, src, {"profile": profile, "overrides": ov, "replace": bool(replace and ov),
                                    "fig_dir": params.get("fig_dir"), "results_dir": params.get("results_dir"),
                                    **({"replot": True} if replot else {})},
                     peak_file)
        except OSError as e:
            if _disk_full(e) is None:
                raise
            raise NotebookFailed(_disk_full_line(nb_path.stem, e, st.dir)) from None
        t0 = time.time()
        # where it really goes: a dry run's (or another out_root's) notebook is not under notebooks/executed/
        print(f"[run] {nb_path.name} profile={profile} -> {_show(out)}", flush=True)
        klog = st.dir / "kernel.stderr"
        try:
            for attempt in range(PORT_RETRIES + 1):
                klog.write_bytes(b"")
                try:
                    with open(klog, "ab") as kernel_stderr, _quiet_teardown_noise():
                        pm.execute_notebook(str(src), str(tmp), parameters=run_params, kernel_name="python3",
                                            cwd=str(ROOT), progress_bar=False, log_output=log_output,
                                            stdout_file=None, kernel_manager_class=_kernel_manager(kernel_stderr))
                    break
                except Exception as e:  # noqa: BLE001
                    if attempt == PORT_RETRIES or isinstance(e, PapermillExecutionError) or not _port_taken(klog):
                        raise
                    print(f"[run] {nb_path.stem}: another process took the kernel's port as it started; starting "
                          f"it again ({attempt + 1}/{PORT_RETRIES})", flush=True)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (staging.Terminated)
            kept = _keep_failed(tmp, failed, renames)
            raise NotebookInterrupted(_interrupt_summary(nb_path.stem, e, kept),
                                      143 if isinstance(e, staging.Terminated) else 130) from None
        except Exception as e:  # noqa: BLE001 - papermill, kernel death
            full = _disk_full(e)
            if full is not None:   # one line, not papermill's traceback and a JSONDecodeError on the cut-off file
                raise NotebookFailed(_disk_full_line(nb_path.stem, full, st.dir)) from None
            if isinstance(e, PapermillExecutionError) and getattr(e, "ename", "") in ONE_LINE_STOPS:
                _keep_failed(tmp, failed, renames)   # no reward signal, golds refused, a rank died: one line is the outcome
                raise NotebookFailed(f"{nb_path.stem} stopped: {_ANSI.sub('', str(e.evalue)).strip()}") from None
            msg = _failure_summary(nb_path.stem, e, _keep_failed(tmp, failed, renames))
            if isinstance(e, PapermillExecutionError):
                raise NotebookFailed(msg) from None
            tail = _kernel_log_tail(klog)  # a dead kernel's cause is in its own stderr
            msg += "".join(f"\n  kernel: {ln}" for ln in tail)
            raise NotebookFailed(msg) from (None if "Kernel" in type(e).__name__ else e)
        print(f"[run] {nb_path.name} done in {time.time() - t0:.0f} s", flush=True)
        _strip_volatile(tmp, renames)
        os.chmod(tmp, 0o666 & ~_UMASK)
        try:
            st.promote()  # figures, tables, then the executed notebook: the old outputs or all the new ones
        except staging.PromotionError as e:
            raise NotebookFailed(f"{nb_path.stem} ran through but its outputs could not be promoted: {e}; its "
                                 f"figures, tables and executed notebook are unchanged") from None
        failed.unlink(missing_ok=True)
    if ov and not replace:
        print(f"[run] a run with overrides {ov}: outputs in {_show(final['executed_dir'])}, {params.get('fig_dir')}, "
              f"{params.get('results_dir')} (--replace writes the canonical outputs)", flush=True)
    return out


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_UMASK = _umask()


def set_root(root: str | Path):
    """Point the runner at a checkout: its notebooks/, notebooks/params/ and output directories."""
    global ROOT, NOTEBOOKS, PARAMS
    ROOT = Path(root).expanduser().resolve()
    NOTEBOOKS = ROOT / "notebooks"
    PARAMS = NOTEBOOKS / "params"


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


def _per_notebook(paths: list[Path], overrides: dict) -> tuple[dict, list[str]]:
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


def _print_errors(e: Exception):
    for line in dict.fromkeys(str(e).splitlines()):  # each line once: profile errors repeat per notebook
        print(f"error: {_short(line, 500)}", file=sys.stderr)  # a huge value never floods the terminal


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
                         f"are used (default: the checkout this module lives in, {ROOT})")
    a = ap.parse_args(_dash_values(sys.argv[1:] if argv is None else list(argv)))
    saved = (ROOT, NOTEBOOKS, PARAMS)
    saved_procs = os.environ.get(procs.PROCS_ENV)
    try:
        if a.root:
            set_root(a.root)
        if a.procs > 1 and not a.plan:  # the notebooks' kernels (and their fanned-out stages) read it
            os.environ[procs.PROCS_ENV] = str(a.procs)
        with staging.sigterm_raises():
            rc = _main(a)
    finally:  # main() called from Python (tests) leaves the module as it found it
        globals().update(zip(("ROOT", "NOTEBOOKS", "PARAMS"), saved))
        if saved_procs is None:
            os.environ.pop(procs.PROCS_ENV, None)
        else:
            os.environ[procs.PROCS_ENV] = saved_procs
    if rc:
        sys.exit(rc)


def _main(a) -> int:
    if not NOTEBOOKS.is_dir():
        where = f"--root {a.root}" if a.root else f"{ROOT} (where this module lives)"
        print(f"error: no notebooks/ directory under {where}: the runner needs a checkout of the repository; "
              f"pass --root DIR, the checkout's directory", file=sys.stderr)
        return 2
    cwd = Path.cwd()
    stem = None
    err = _plan_flags_error(a) or cache.dir_problem()
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        try:  # every selected notebook is validated before any runs
            overrides = dict(a.p)
            for text in a.set:
                overrides.update(parse_set(text))
            refs = [p.stem for p in all_notebooks()] if a.notebooks == ["all"] else a.notebooks
            paths = [find_notebook(r) for r in refs]
            twice = sorted({p.stem for p in paths if paths.count(p) > 1})
            if twice:   # two kernels of one notebook would write the same outputs and the same log
                raise ParameterError(f"notebook {', '.join(twice)} named more than once; name each notebook once")
            share, errors = _per_notebook(paths, overrides)
            resolved = []
            absent = []
            for nb in paths:
                try:
                    resolved.append((nb, resolve_params(nb, a.profile, share[nb], cwd=cwd, check_paths=True,
                                                        replace=a.replace)))
                except ParameterError as e:
                    try:  # --plan needs no data file: plan without the ones this host lacks, and say so
                        if not a.plan:
                            raise
                        resolved.append((nb, resolve_params(nb, a.profile, share[nb], cwd=cwd, check_paths=False,
                                                            replace=a.replace)))
                        absent += str(e).splitlines()
                    except ParameterError:
                        errors += str(e).splitlines()
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
        plans = {} if a.replot else _plans(resolved, a)   # a replot computes nothing: no plan to check
        if plans is None:
            return 2
        if a.plan:
            return 0
        groups = [[x] for x in resolved] if (a.check or a.dry_run or a.replot) else segments(resolved, a.cores)
        for group in groups:
            if len(group) > 1:
                stem = ", ".join(nb.stem for nb, _ in group)
                rc = _run_pool(group, a, share, {k: p.seconds for k, p in plans.items() if p.seconds})
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
                _dry_run(nb, a, share[nb], cwd, plans.get(nb.stem))
            else:
                run_notebook(str(nb), a.profile, share[nb], replace=a.replace, cwd=cwd, replot=a.replot)
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


def cpu_threads(params: dict) -> int | None:
    """The CPU cores a notebook keeps busy: its `threads` (every figure pins them: base.pin_threads) x
    `workers` on the CPU; None (it runs alone) on an accelerator or without a `threads` parameter."""
    if str(params.get("device", "cpu")) != "cpu" or "threads" not in params:
        return None
    workers = params.get("workers", 1) if params.get("engine", "small") == "small" else 1
    return int(params["threads"]) * int(workers)


def segments(resolved: list, cores: int) -> list[list]:
    """`resolved` (notebook, params) pairs in order, cut into what runs together: with `cores` > 1, each
    run of consecutive CPU notebooks is one pool (`_run_pool`: started while their threads,
    `cpu_threads`, fit in `cores`); a notebook on an accelerator, and every notebook with `cores` 1, is a
    segment of its own and runs in the runner's process (its output live in the terminal)."""
    out: list[list] = []
    for nb, params in resolved:
        pooled = cores > 1 and cpu_threads(params) is not None
        if pooled and out and out[-1][0][2]:
            out[-1].append((nb, params, True))
        else:
            out.append([(nb, params, pooled)])
    return [[(nb, params) for nb, params, _ in seg] for seg in out]


STAGGER_S = 5.0    # between two starts: kernels that start apart do not race for ports (run_notebook retries)
HEARTBEAT_S = 60.0  # how often a pool prints where each running notebook is


def _last_line(log: Path) -> str:
    """The last non-blank line of a child's log, a progress bar's latest state included (tqdm ends its
    updates with a carriage return, not a newline)."""
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        tail = f.read().decode(errors="replace")
    lines = [ln.strip() for ln in re.split(r"[\r\n]", tail) if ln.strip() and not _is_tqdm_notice(ln)]
    return lines[-1][:120] if lines else ""


def _is_tqdm_notice(line: str) -> bool:
    """A line of tqdm's IProgress notice (two lines every kernel prints once on importing tqdm.auto)."""
    return "TqdmWarning: IProgress not found" in line or "from .autonotebook import tqdm" in line


def pool_order(group: list, expected: dict) -> list:
    """The order a pool starts `group`'s (notebook, params) pairs in: the widest first (a notebook that needs
    every core can start only on an empty pool, so waiting for it later would leave cores idle while the pool
    drains), then the longest first by the planner's `expected` seconds (the long ones do not start last and
    run alone at the end), ties and notebooks without an estimate in notebook order."""
    return sorted(group, key=lambda x: (-cpu_threads(x[1]), -expected.get(x[0].stem, 0.0)))


def _run_pool(group: list, a, share: dict, expected: dict | None = None) -> int:
    """The notebooks of `group`, each in its own `python -m cancellation.run` process, started while their
    threads (`cpu_threads`) fit in `a.cores`, in `pool_order` (the widest, then the longest by the plans'
    `expected` seconds, first).
    Each writes its log to .run-staging/logs/<notebook>.log; every HEARTBEAT_S the pool prints each running
    notebook's latest line; a finished one prints its last line, a failed one its log's tail, and no
    further notebook starts. Returns the first failure's exit status (1, 130, 143), 0 when all ran through.
    Each child runs in a session of its own, so a signal reaches it once, from the runner: Ctrl-C in the
    terminal or `kill -INT <runner's pid>` is passed on as SIGINT, SIGTERM as SIGTERM. Either way every
    child restores its own outputs before the runner returns, and none outlives it."""
    logs = ROOT / staging.STAGING / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # an owner record keeps staging.clear_stale (in the children) from removing the logs of a live run
    (logs / "owner.json").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    queue = pool_order(group, expected or {})
    running, rc, t0 = {}, 0, time.time()
    threads = ", ".join(f"{nb.stem[:2]} {cpu_threads(p)}" for nb, p in group)
    print(f"[run] {len(group)} notebooks in a pool of {a.cores} cores, started while their threads fit, the widest "
          f"first ({threads}), then the longest by the plan: {', '.join(nb.stem[:2] for nb, _ in queue)}; logs in "
          f"{_show(logs)}/", flush=True)
    beat = time.time()
    try:
        while queue or running:
            used = sum(need for _, need, _, _ in running.values())
            if queue and not rc and (not running or used + cpu_threads(queue[0][1]) <= a.cores):
                nb, params = queue.pop(0)
                if running:
                    time.sleep(STAGGER_S)
                cmd = [sys.executable, "-m", "cancellation.run", nb.stem, "--profile", a.profile, "--root",
                       str(ROOT), "--no-plan-check"]  # every plan was checked above
                for k, v in share[nb].items():
                    cmd += ["-p", k, v if isinstance(v, str) else json.dumps(v)]  # as typed (JSON is YAML 1.2)
                if a.replace:
                    cmd.append("--replace")
                log = open(logs / f"{nb.stem}.log", "w")
                print(f"[run] {nb.stem} started ({cpu_threads(params)} of {a.cores} cores)", flush=True)
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                running[nb.stem] = (proc, cpu_threads(params), log, time.time())
                continue
            if queue and rc:
                print(f"[run] not started after the failure: {', '.join(nb.stem for nb, _ in queue)}",
                      file=sys.stderr, flush=True)
                queue = []
            time.sleep(0.5)
            if time.time() - beat >= HEARTBEAT_S:
                beat = time.time()
                for stem, (_, _, _, since) in running.items():
                    print(f"[run] {stem} running {time.time() - since:.0f} s: {_last_line(logs / f'{stem}.log')}",
                          flush=True)
            for stem, (proc, _, log, _) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[stem]
                text = (logs / f"{stem}.log").read_text(errors="replace").splitlines()
                if proc.returncode:
                    rc = rc or proc.returncode
                    print(f"[run] {stem} FAILED (exit {proc.returncode}); the end of its log "
                          f"({_show(logs / f'{stem}.log')}):\n  " + "\n  ".join(text[-15:]), file=sys.stderr, flush=True)
                else:
                    done = [ln for ln in text if ln.startswith("[run]") and " done in " in ln]
                    print(done[-1] if done else f"[run] {stem} done", flush=True)
    except KeyboardInterrupt:  # the children are in sessions of their own: pass the signal on, once each
        sig = signal.SIGTERM if isinstance(sys.exc_info()[1], staging.Terminated) else signal.SIGINT
        for proc, _, _, _ in running.values():
            if proc.poll() is None:
                proc.send_signal(sig)
        for proc, _, log, _ in running.values():
            proc.wait()
            log.close()
        raise
    print(f"[run] {len(group)} notebooks in {time.time() - t0:.0f} s on {a.cores} cores", flush=True)
    return rc


def _plans(resolved, a) -> dict | None:
    """Each notebook's plan (cancellation.plan), printed with --plan, --dry-run and before a paper-profile
    run; None (after one error line per notebook) when a plan exceeds the device's memory."""
    from cancellation import plan
    plans, errors, bad_config = {}, [], []
    for nb, params in resolved:
        try:
            p = plan.make(nb.stem, params, root=ROOT, kind=getattr(a, "device_kind", None),
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


def _plan_flags_error(a) -> str | None:
    """--device-kind and --procs plan only; an unknown kind names the known ones."""
    from cancellation import plan
    kind = getattr(a, "device_kind", None)
    if a.procs < 1:
        return f"--procs {a.procs}: expected a number of processes >= 1"
    if kind is not None and kind not in plan.known_kinds():
        return (f"unknown device kind {kind!r} (no {_show(plan.SCALE_DIR / (kind + '.json'))}); known kinds: "
                f"{', '.join(plan.known_kinds())} (measure one with `python -m cancellation.scale --device cuda "
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


def _dry_run(nb: Path, a, overrides: dict, cwd: Path, planned):
    """One notebook under --dry-run: random weights and a coin-flip reward in the kernel (environment
    read by policy.load_policy and sources.ProblemSource), its own cache, every output under dry-run/;
    wall time and peak memory recorded in dry-run/<profile>/measured.json beside the plan."""
    out_root = ROOT / DRY_ROOT
    record = out_root / a.profile / "measured.json"
    peak = out_root / a.profile / f".{nb.stem}.peak.json"
    peak.parent.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in (DRY_RUN_ENV, "CANCELLATION_CACHE")}
    os.environ[DRY_RUN_ENV] = json.dumps({"seed": 0})
    os.environ["CANCELLATION_CACHE"] = str(out_root / "cache")  # never the key of a real checkpoint's results
    try:
        t0 = time.time()
        run_notebook(str(nb), a.profile, overrides, out_root=out_root, replace=a.replace, cwd=cwd, peak_file=peak)
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
          f"{_fmt(pl.get('predicted_seconds'), 's')}, {_fmt(pl.get('peak_gib'), 'GiB')} -> {_show(record)}", flush=True)


def _fmt(x, unit):
    return "?" if x is None else f"{x:.0f} {unit}" if unit == "s" else f"{x:.2f} {unit}"


if __name__ == "__main__":
    main()
