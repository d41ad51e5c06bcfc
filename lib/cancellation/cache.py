"""Content-addressed cache of expensive results, with atomic writes.

A key is the hash of the stage name, its parameters (JSON) and a code version string, so a
changed parameter recomputes and a rerun with the same parameters is instant. Values are
written to a temporary file and renamed, so an interrupted run never leaves a partial entry.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path

import pandas as pd

DEFAULT_DIR = Path(os.environ.get("CANCELLATION_CACHE", Path(__file__).resolve().parents[2] / "data" / "cache"))
CODE_VERSION = "3"  # 3: rewards on responses without special tokens; 2: float64 RMSNorm in float64 models  # bump when a cached computation changes meaning


def key(stage: str, params: dict, version: str = CODE_VERSION) -> str:
    blob = json.dumps({"stage": stage, "params": params, "version": version}, sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _atomic_write(path: Path, write):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def cached(stage: str, params: dict, compute, cache_dir: str | Path | None = None, version: str = CODE_VERSION):
    """Return compute() cached under (stage, params, version); DataFrames as parquet, else pickle."""
    d = Path(cache_dir or DEFAULT_DIR)
    k = key(stage, params, version)
    pq, pk = d / f"{k}.parquet", d / f"{k}.pkl"
    if pq.exists():
        return pd.read_parquet(pq)
    if pk.exists():
        with open(pk, "rb") as f:
            return pickle.load(f)
    value = compute()
    if isinstance(value, pd.DataFrame):
        _atomic_write(pq, lambda t: value.to_parquet(t, index=False))
    else:
        def w(t):
            with open(t, "wb") as f:
                pickle.dump(value, f)
        _atomic_write(pk, w)
    return value


def write_table(df: pd.DataFrame, path: str | Path):
    """Atomically write a result table (.parquet or .csv)."""
    path = Path(path)
    if path.suffix == ".csv":
        _atomic_write(path, lambda t: df.to_csv(t, index=False))
    else:
        _atomic_write(path, lambda t: df.to_parquet(t, index=False))
