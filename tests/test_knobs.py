"""The memory knobs are declared in one place: `guard.KNOB_FIELDS` (default, doc, rules; `guard.TOKEN_CHUNK`
and `guard.CHUNK_ROWS` the numbers).

Every config field named like a knob (Compute, UpdateConfig, SampleConfig, ValueConfig, a figure's Params)
is built by `guard.knob(name)`; a number written as such a default anywhere else in lib/ fails
here (the knob would stop following the profile the moment the two numbers part). No function defaults
one at all: a function that calls a model takes the run's Compute whole (`measure.token_stats(model, batch,
compute)`) or, in the sampler's primitives, the knob as a required keyword, so a call that forgets it is
a TypeError where it is written rather than a silent 4096.
"""
import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import cancellation
from cancellation import (budget, coupling, decode_hf, decode_lean, decode_static, grpo, guard, measure, rollout,
                          sampler, train, value)
from cancellation.compute import Compute
from cancellation.figures import fig01, fig02, fig03, fig04, fig05, fig06, fig07, fig08

LIB = Path(cancellation.__file__).parent
KNOBS = {"token_chunk": "TOKEN_CHUNK", "chunk_rows": "CHUNK_ROWS"}   # knob -> its one declaration in guard.py


def _number(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _literal_default(value) -> bool:
    """A default spelled as a number: `4096`, `field(default=4096, ...)` or `param(4096, ...)`."""
    if _number(value):
        return True
    if isinstance(value, ast.Call):
        return any(_number(a) for a in value.args[:1]) or \
            any(k.arg == "default" and _number(k.value) for k in value.keywords)
    return False


def numeric_defaults(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every numeric default of a knob in one module's syntax tree."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = n.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + \
                [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            out += [(n.lineno, f"parameter {x.arg}={ast.unparse(d)}") for x, d in pairs
                    if x.arg in KNOBS and _literal_default(d)]
            if getattr(n, "name", None) in KNOBS:   # figures/base.py's field makers: `def token_chunk(): return param(...)`
                out += [(r.lineno, f"{n.name}() returns {ast.unparse(r.value)}") for r in ast.walk(n)
                        if isinstance(r, ast.Return) and r.value is not None and _literal_default(r.value)]
        if isinstance(n, ast.ClassDef):
            for s in n.body:
                target = s.target if isinstance(s, ast.AnnAssign) else (s.targets[0] if isinstance(s, ast.Assign) else None)
                if isinstance(target, ast.Name) and target.id in KNOBS and s.value is not None \
                        and _literal_default(s.value):
                    out.append((s.lineno, f"field {n.name}.{target.id} = {ast.unparse(s.value)}"))
    return out


def test_no_numeric_knob_default_outside_guard():
    found = [f"{p.relative_to(LIB.parent)}:{line}: {what}" for p in sorted(LIB.rglob("*.py"))
             for line, what in numeric_defaults(ast.parse(p.read_text()))]
    assert not found, ("a memory knob defaulted to a number outside guard.py (read guard.TOKEN_CHUNK / "
                       "guard.CHUNK_ROWS, or take the value from the config passed in):\n" + "\n".join(found))


def test_knob_constants_declared_once():
    declared = {}
    for p in sorted(LIB.rglob("*.py")):
        for n in ast.parse(p.read_text()).body:
            if isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    if isinstance(t, ast.Name) and t.id in KNOBS.values():
                        declared.setdefault(t.id, []).append(p.name)
    assert declared == {c: ["guard.py"] for c in KNOBS.values()}


def test_scan_catches_a_numeric_default():
    src = ("def f(m, token_chunk: int = 4096): pass\n"
           "class C:\n    chunk_rows: int = field(default=64)\n    token_chunk: int = param(4096, 'doc')\n"
           "def token_chunk():\n    return param(4096, 'doc')\n"
           "def g(m, token_chunk: int = TOKEN_CHUNK, chunk_rows=None): pass\n")
    assert [line for line, _ in numeric_defaults(ast.parse(src))] == [1, 3, 4, 6]


def _dataclasses():
    """Every dataclass defined in lib/ (imported modules walked)."""
    for p in sorted(LIB.rglob("*.py")):
        mod = importlib.import_module("cancellation." + ".".join(p.relative_to(LIB).with_suffix("").parts)
                                      .removesuffix(".__init__"))
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if obj.__module__ == mod.__name__ and dataclasses.is_dataclass(obj):
                yield obj


def test_every_knob_field_is_declared_by_guard():
    """A config field named like a memory knob is `guard.knob(name)`: its default and rules are
    guard.KNOB_FIELDS's (one declaration), whichever config carries it."""
    carriers, wrong = set(), []
    for cls in _dataclasses():
        for f in dataclasses.fields(cls):
            if f.name in guard.KNOB_FIELDS:
                carriers.add(cls.__qualname__)
                default, _, rules = guard.KNOB_FIELDS[f.name]
                if f.default != default or f.metadata.get("rules") != rules or not f.metadata.get("doc"):
                    wrong.append(f"{cls.__module__}.{cls.__qualname__}.{f.name}")
    assert {"Compute", "UpdateConfig", "SampleConfig", "ValueConfig", "FigureParams"} <= carriers, carriers
    assert not wrong, "declare these as guard.knob(name):\n" + "\n".join(wrong)
    for cls in [Compute, grpo.UpdateConfig, rollout.SampleConfig, value.ValueConfig,
                *(m.Params for m in (fig01, fig02, fig03, fig04, fig05, fig06, fig07, fig08))]:
        for f in dataclasses.fields(cls):
            if f.name in KNOBS:
                assert f.default == getattr(guard, KNOBS[f.name]), (cls.__qualname__, f.name)
    assert (guard.TOKEN_CHUNK, guard.CHUNK_ROWS) == (4096, 64)   # moving either moves every cache key


def test_knob_fields_reach_a_param_like_the_runner_reads():
    """guard.knob's metadata is figures/base.param's format (doc, rules), so the runner validates it."""
    f = {f.name: f for f in dataclasses.fields(fig01.Params)}
    assert fig01.Params.rules()["token_chunk"] == {"min": 1}
    assert fig01.Params.docs()["chunk_rows"] == guard.KNOB_FIELDS["chunk_rows"][1]
    assert f["gradient_checkpointing"].default is False
    assert "Fig. 10" in fig03.Params.docs()["gradient_checkpointing"]   # a figure may say what it does there


def _functions():
    """Every function and method defined in lib/ (imported modules walked, not parsed)."""
    for p in sorted(LIB.rglob("*.py")):
        mod = importlib.import_module("cancellation." + ".".join(p.relative_to(LIB).with_suffix("").parts)
                                      .removesuffix(".__init__"))
        for _, obj in inspect.getmembers(mod):
            if inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                yield obj
            elif inspect.isclass(obj) and obj.__module__ == mod.__name__ and not dataclasses.is_dataclass(obj):
                yield from (f for _, f in inspect.getmembers(obj, inspect.isfunction) if f.__module__ == mod.__name__)


def _unbounded(fn, p) -> bool:
    """The TRL engine's public API (`grpo_config`, `BatchingGRPOTrainer`) is written for users of TRL who
    hold no Compute: there `token_chunk=None` means no bound (TRL's own micro-batches), not a number."""
    return fn.__module__.startswith("cancellation.engine.") and p.default is None


def test_no_function_defaults_a_knob():
    """A knob reaches a function from the config passed in, never from its signature."""
    found, seen = [], 0
    for fn in _functions():
        seen += 1
        for name, p in inspect.signature(fn).parameters.items():
            if name in KNOBS and p.default is not inspect.Parameter.empty and not _unbounded(fn, p):
                found.append(f"{fn.__module__}.{fn.__qualname__}({name}={p.default!r})")
    assert seen > 300, seen   # the walk found the library
    assert not found, "take the run's Compute (or the knob without a default):\n" + "\n".join(found)


def test_model_calls_take_the_config_whole():
    for fn in (measure.token_stats, measure.token_stats_unchunked, measure.noise_floor):
        assert list(inspect.signature(fn).parameters)[:3] == ["model", "batch", "knobs"], fn.__qualname__
    assert "knobs" in inspect.signature(budget.pool_logp).parameters
    for fn in (coupling.masked_effects_full, coupling.masked_effect_bruteforce, coupling.proxy_sign_consistency,
               coupling.adam_first_step_ratio):   # no `compute or Compute()` fallback: the run's knobs, always
        assert inspect.signature(fn).parameters["compute"].default is inspect.Parameter.empty, fn.__qualname__
    for fn in (sampler.generate, decode_static.generate_static, decode_lean.generate_lean, decode_hf.generate_eager,
               value.sample_continuations,
               train.evaluate):
        p = inspect.signature(fn).parameters["token_chunk"]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty, fn.__qualname__


def test_features_need_the_stats_or_the_compute(model64, batch):
    """coupling.features takes the batch's statistics, or the run's Compute to take them with: no default chunking."""
    import pytest
    with pytest.raises(TypeError, match="Compute"):
        coupling.features(model64, batch)
