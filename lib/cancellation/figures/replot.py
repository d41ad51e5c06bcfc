"""Replot: redraw a figure from the tables its last run wrote, computing nothing (`make plots`, `run --replot`).

A figure fix (a label, a colour, a panel) or a claim's wording then needs no cold run: the notebook
reads its Result back from the results folder (`figNN.load(folder, P)`, the inverse of `R.write`),
redraws every figure and records its claims again from the same numbers.

What the tidy tables do not hold is written beside them by `save`, in `<results>/replot/`:
- `<notebook>.json`: the parameters the tables were computed with (`stage.canonical(P)`: what a cache
  key reads), and the Result's small fields (numbers, lists, dicts; numpy scalars and arrays as lists);
- `<notebook>.<field>.parquet`: its frames and series that no tidy table holds as they are (index kept).
`restore` refuses tables computed with other parameters than this run's (a profile edited since): the
figures would be labelled with values their numbers do not have. Large per-token intermediates are
not snapshotted: a figure derives what it plots from them in compute() and keeps the small result.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import cache, stage

FOLDER = "replot"


class ReplotError(ValueError):
    """Nothing to replot, or tables computed with other parameters: one line saying which and what to run."""


def _folder(results_dir) -> Path:
    return Path(results_dir) / FOLDER


def params_file(results_dir, notebook: str) -> Path:
    """Where `save` keeps a notebook's parameters and small fields (the runner checks it before a replot)."""
    return _folder(results_dir) / f"{notebook}.json"


def _jsonable(x):
    """x as JSON: numpy scalars as numbers, arrays as {'ndarray': list, 'dtype': str}, tuples as lists."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return {"ndarray": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    raise TypeError(f"replot: cannot keep a {type(x).__name__} as JSON: write it as a frame")


def _unjson(x):
    if isinstance(x, dict):
        if set(x) == {"ndarray", "dtype"}:
            return np.asarray(x["ndarray"], dtype=x["dtype"])
        return {k: _unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unjson(v) for v in x]
    return x


def params_of(P) -> dict:
    """What the tables depend on among the parameters, as a cache key reads them."""
    return json.loads(json.dumps(stage.canonical(P), sort_keys=True, default=str))


def save(results_dir, P, **fields) -> None:
    """Write the parameters and `fields` (a Result's values no tidy table holds) for `restore`."""
    d = _folder(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    name = P.notebook()
    small, frames = {}, {}
    for k, v in fields.items():
        if isinstance(v, pd.Series):
            frames[k] = v.to_frame(name="__series__" if v.name is None else v.name)
            small[k] = {"series": True, "name": v.name if v.name is None or isinstance(v.name, str) else str(v.name)}
        elif isinstance(v, pd.DataFrame):
            frames[k] = v
            small[k] = {"frame": True}
        else:
            small[k] = {"value": _jsonable(v)}
    for k, df in frames.items():
        cols = list(df.columns)
        if not all(isinstance(c, str) for c in cols):   # parquet names columns by strings: keep the labels apart
            small[k]["columns"] = _jsonable(cols)
            df = df.set_axis([str(i) for i in range(len(cols))], axis=1)
        path = d / f"{name}.{k}.parquet"
        cache.atomic_write(path, lambda t, df=df: df.to_parquet(t))
    doc = {"notebook": name, "code_version": cache.CODE_VERSION, "params": params_of(P), "fields": small}
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    cache.atomic_write(params_file(results_dir, name), lambda t: Path(t).write_text(text))


def restore(results_dir, P) -> dict:
    """The fields `save` wrote, after checking that the tables were computed with these parameters."""
    d = _folder(results_dir)
    name = P.notebook()
    path = params_file(results_dir, name)
    if not path.exists():
        raise ReplotError(f"nothing to replot for {name}: {path} is missing (its tables were never written by this "
                          f"version; run the notebook once, e.g. make fig{name[:2]})")
    doc = json.loads(path.read_text())
    have, want = doc["params"], params_of(P)
    moved = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    if moved:
        shown = "; ".join(f"{k}: tables {have.get(k)!r}, now {want.get(k)!r}" for k in moved[:6])
        raise ReplotError(f"{name}: the tables in {results_dir} were computed with other parameters ({shown}"
                          f"{' ...' if len(moved) > 6 else ''}); replotting them would label the figures with values "
                          f"their numbers do not have: run the notebook (make fig{name[:2]}) to recompute")
    print(f"redrawn from the tables in {results_dir} (make plots): nothing computed; any seconds below are those of "
          f"the run that wrote them", flush=True)
    out = {}
    for k, meta in doc["fields"].items():
        if "value" in meta:
            out[k] = _unjson(meta["value"])
            continue
        df = pd.read_parquet(d / f"{name}.{k}.parquet")
        if "columns" in meta:
            df = df.set_axis([tuple(c) if isinstance(c, list) else c for c in _unjson(meta["columns"])], axis=1)
        if meta.get("series"):
            s = df.iloc[:, 0]
            out[k] = s.rename(meta["name"])
        else:
            out[k] = df
    return out


def table(results_dir, name: str) -> pd.DataFrame:
    """A tidy table the run wrote (`<results>/<name>`), or ReplotError naming it."""
    path = Path(results_dir) / name
    if not path.exists():
        raise ReplotError(f"nothing to replot: {path} is missing; run the notebook first")
    return cache.read_table(path)
