"""Every cache key the tiny notebooks look up, pinned before the key builder moved to stage.py (issue 34).

A refactor of how keys are built must not move one: a moved key is a cold cache (hours of recomputation
on the paper profile) and, worse, a silent change of what a stage reads. This reruns a notebook's
`compute(P)` in-process against a warm cache with `cache.key` instrumented, and records every
(stage, key) it asks for. Nothing is computed: a lookup that misses stops the run (a miss is a key
that moved, or a cache that is not warm). Two passes per notebook:

- `warm`: the notebook as it runs, so the figure-level stages (fig02, fig03, fig05, ...) hit;
- `deep` (notebooks whose figure stage wraps other stages): the figure-level stage is made to miss
  (and is not stored), so its compute runs and looks up every inner stage (masked_full, repeated_deltas,
  mc_rewards, budget_sweep_nested, delta_run, ...), which must all hit.

Per (notebook, pass, stage) the file holds the count of distinct keys, a sha256 over them sorted, and
the keys themselves when few. `python -m tests.golden.keys --write [NN ...]` (re)pins, `python -m
tests.golden.keys [NN ...]` compares (exit 1 on a difference); both need the tiny cache warm
(data/cache/, or $CANCELLATION_CACHE). test_keys.py holds the fast part: the figure-level keys
recomputed from the profiles without running anything.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path

from cancellation import cache, profiles, resolve

FILE = Path(__file__).with_name("keys.json")
PROFILE = "tiny"
# figure-level stages whose compute looks up other stages: the deep pass makes them miss
OUTER = {"03": {"fig03"}, "05": {"fig05"}, "06": {"fig06"}, "08": {"fig12"}}
LIST_MAX = 40   # keys listed in full up to this many per stage (else count and sha only)


class Miss(RuntimeError):
    """A lookup the warm cache could not answer: the key moved (or the cache is not warm)."""


def record(stem: str, outer: set[str] = frozenset()) -> dict[str, list[str]]:
    """{stage: sorted distinct keys} of one compute(P) of notebook `stem` on the tiny profile."""
    nb = next(p for p in profiles.all_notebooks() if p.stem.startswith(stem))
    mod = importlib.import_module(f"cancellation.figures.fig{stem}")
    P = mod.Params(**{k: v for k, v in resolve.resolve_params(nb, PROFILE).items() if k not in profiles.INJECTED})
    seen: dict[str, set] = {}
    orig_key, orig_load, orig_lock, orig_store = cache.key, cache.load, cache.lock, cache._store

    def key(stage, params, version=cache.CODE_VERSION):
        k = orig_key(stage, params, version)
        seen.setdefault(stage, set()).add(k)
        return k

    def load(stage, params, cache_dir=None, version=cache.CODE_VERSION):
        if stage in outer:
            key(stage, params, version)
            return cache.MISS
        v = orig_load(stage, params, cache_dir, version)
        if v is cache.MISS and stage == "mc_rewards":   # value.cached_rewards samples before it stores
            raise Miss(f"{stem}: no cache entry for {key(stage, params, version)}")
        return v

    @contextlib.contextmanager
    def lock(path):
        k = Path(path).name
        if k.rsplit("-", 1)[0] not in outer:
            raise Miss(f"{stem}: no cache entry for {k} (would compute it)")
        yield

    def store(d, k, value):
        if k.rsplit("-", 1)[0] not in outer:
            raise Miss(f"{stem}: would store {k}")

    cache.key, cache.load, cache.lock, cache._store = key, load, lock, store
    try:
        mod.compute(P)
    finally:
        cache.key, cache.load, cache.lock, cache._store = orig_key, orig_load, orig_lock, orig_store
    return {s: sorted(ks) for s, ks in sorted(seen.items())}


def summary(keys: dict[str, list[str]]) -> dict:
    out = {}
    for stage, ks in keys.items():
        e = {"n": len(ks), "sha": hashlib.sha256("\n".join(ks).encode()).hexdigest()[:16]}
        if len(ks) <= LIST_MAX:
            e["keys"] = ks
        out[stage] = e
    return out


def snapshot(stems=None) -> dict:
    out = {}
    for nb in profiles.all_notebooks():
        stem = nb.stem[:2]
        if stems and stem not in stems:
            continue
        t0 = time.time()
        out[f"{stem}/warm"] = summary(record(stem))
        if stem in OUTER:
            out[f"{stem}/deep"] = summary(record(stem, OUTER[stem]))
        print(f"{stem}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def compare(pinned: dict, now: dict) -> list[str]:
    bad = []
    for name, stages in now.items():
        if name not in pinned:
            bad.append(f"{name}: not pinned")
            continue
        for stage in sorted(set(stages) | set(pinned[name])):
            a, b = pinned[name].get(stage), stages.get(stage)
            if a != b:
                bad.append(f"{name} {stage}: pinned {a and {k: a[k] for k in ('n', 'sha')}}, "
                           f"now {b and {k: b[k] for k in ('n', 'sha')}}")
    return bad


if __name__ == "__main__":
    args = sys.argv[1:]
    write = "--write" in args
    stems = [a for a in args if a != "--write"] or None
    now = snapshot(stems)
    pinned = json.loads(FILE.read_text()) if FILE.exists() else {}
    if write:
        pinned.update(now)
        FILE.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FILE} ({', '.join(now)})")
    else:
        bad = compare(pinned, now)
        print("\n".join(bad) if bad else f"identical: {', '.join(now)}")
        sys.exit(1 if bad else 0)
