"""The checkout and its profiles: where notebooks/ and notebooks/params/ are (`Checkout`), which notebook a
reference names, a notebook's declared parameters, and the one reader of a profile's YAML (YAML 1.2 rules:
`010` is 10, `1e-3` a float, only true/false booleans; duplicate keys and alias bombs refused in one line).

Every reader of notebooks/params/*.yaml goes through `load_profile` (the runner, gpu-check, notebook 01).
A checkout is passed explicitly (`checkout=`); None means `HERE`, the checkout this module lives in (`python
-m cancellation.run --root DIR` passes `Checkout.of(DIR)`; nothing is rebound at run time).

This module's top imports the standard library and `manifest` only, pyyaml on the first YAML read: gpu-check
imports it on a bare GPU machine, where a missing pyyaml must reach gpu-check's one-line "missing package"
report (and reading a profile raises ImportError there).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
from pathlib import Path

from . import manifest

ROOT = Path(__file__).resolve().parents[2]
INJECTED = ("profile", "fig_dir", "results_dir", "replot")  # set by the runner from the profile (replot: --replot)


class ParameterError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Checkout:
    """A checkout of the repository: its root (outputs, relative paths), notebooks/ and their profiles."""
    root: Path
    notebooks: Path
    params: Path

    @classmethod
    def of(cls, root: str | Path) -> Checkout:
        root = Path(root).expanduser().resolve()
        return cls(root, root / "notebooks", root / "notebooks" / "params")

    def show(self, path: Path) -> str:
        """A resolved path as the notebooks get it: relative to the repository when inside it (they run
        there, and executed notebooks stay machine-independent), else absolute."""
        path = Path(os.path.normpath(path))
        return path.relative_to(self.root).as_posix() if path.is_relative_to(self.root) else str(path)


HERE = Checkout.of(ROOT)


def here(checkout: Checkout | None = None) -> Checkout:
    """`checkout`, or HERE (read when called: a test points it at a stand-in checkout)."""
    return HERE if checkout is None else checkout


def find_notebook(ref: str, checkout: Checkout | None = None) -> Path:
    """notebooks/NN_name.py from 'NN', 'NN_name' or a path."""
    p = Path(ref)
    if p.suffix == ".py" and p.exists():
        return p.resolve()
    notebooks = here(checkout).notebooks
    hits = sorted(notebooks.glob(f"{ref}*.py")) if ref else []
    if len(hits) != 1:
        known = ", ".join(x.stem for x in sorted(notebooks.glob("[0-9][0-9]_*.py")))
        raise ParameterError(f"no single notebook matches {ref!r}; known notebooks: {known}")
    return hits[0]


def all_notebooks(checkout: Checkout | None = None) -> list[Path]:
    return sorted(here(checkout).notebooks.glob("[0-9][0-9]_*.py"))


_DEFAULTS: dict = {}  # (path, mtime_ns, size) -> defaults: profile checks read every notebook
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

@functools.cache
def _loader():
    """The YAML 1.2 loader class, built on the first read (pyyaml imported then: see the module doc)."""
    import yaml

    class Yaml12Loader(yaml.SafeLoader):
        """YAML with YAML 1.2 core-schema scalars: `010` is 10 (not octal 8), `1e-3` is a float (not a
        string), only true/false are booleans (not yes/no/on/off); 0o17 and 0x1f still mean octal/hex."""

    Yaml12Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                                                      "tag:yaml.org,2002:bool")]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                        list("tTfF"))
    Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                        list("-+0123456789"))
    Yaml12Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))

    def _yaml12_int(loader, node):
        v = loader.construct_scalar(node)
        sign, v = (-1, v[1:]) if v[0] == "-" else (1, v.lstrip("+"))
        base = 8 if v.startswith("0o") else 16 if v.startswith("0x") else 10
        return sign * int(v[2:] if base != 10 else v, base)

    Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _yaml12_int)
    return Yaml12Loader


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
    import yaml

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
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_tree(node, name_keys_depth)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def short(text: str, n: int = 300) -> str:
    """`text` cut to `n` characters, saying how much was left out."""
    return text if len(text) <= n else f"{text[:n]}... [{len(text) - n} more characters]"




def read_yaml_file(path: Path, name_keys_depth: int = 0, checkout: Checkout | None = None):
    """The YAML data of `path`; ParameterError, one line naming the file (and line where known), for
    non-UTF-8 bytes, YAML errors (syntax, unsupported tags such as !!python/...), duplicate keys,
    non-string names and alias bombs. No traceback, no expanded values."""
    import yaml

    where = here(checkout).show(path)
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
                             + f"YAML error: {short(what, 200)}") from None
    except yaml.YAMLError as e:
        what = re.sub(r"\s+", " ", str(e))
        raise ParameterError(f"{where}: YAML error: {short(what, 200)}") from None
    except RecursionError:
        raise ParameterError(f"{where}: nested too deeply to read") from None


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def known_profiles(checkout: Checkout | None = None) -> list[str]:
    return [p.stem for p in sorted(here(checkout).params.glob("*.yaml")) if p.stem != "schema"]


def load_profile(profile: str, checkout: Checkout | None = None) -> dict:
    """The YAML of notebooks/params/<profile>.yaml; `profile` is a plain name of a file there, never a path."""
    co = here(checkout)
    known = ", ".join(known_profiles(co))
    if not _PROFILE_NAME.fullmatch(profile or "") or profile.endswith(".yaml") or profile == "schema":
        raise ParameterError(f"--profile takes the name of a profile in {co.show(co.params)}/ (e.g. tiny), not a "
                             f"path or file name: got {profile!r}; known profiles: {known}")
    path = co.params / f"{profile}.yaml"
    if not path.is_file():
        raise ParameterError(f"unknown profile {profile!r} (no {co.show(path)}); known profiles: {known}")
    prof = read_yaml_file(path, name_keys_depth=2, checkout=co) or {}
    if isinstance(prof, dict):   # `x-...` sections only hold YAML anchors for `<<: *name` merges (as in compose files)
        prof = {k: v for k, v in prof.items() if not str(k).startswith("x-")}
    if not isinstance(prof, dict) or not all(isinstance(v, dict) or v is None for v in prof.values()):
        raise ParameterError(f"{co.show(path)}: expected a mapping of sections (common, <notebook>) to "
                             f"mappings of parameter: value")
    return prof


def profile_errors(profile: str, prof: dict | None = None, checkout: Checkout | None = None) -> list[str]:
    """What is wrong with the profile as a whole (one line each): a section that names no notebook, a
    `common` key that no notebook declares (a common key applies to the notebooks that declare it),
    a name the runner sets. Section keys are checked per notebook by resolve_params."""
    co = here(checkout)
    prof = load_profile(profile, co) if prof is None else prof
    where = co.show(co.params / f"{profile}.yaml")
    stems = {nb.stem: nb for nb in all_notebooks(co)}
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
