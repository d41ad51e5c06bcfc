"""`make bench`'s harness: the registry of benchmarks (`@bench`), the fair timing of the ways of one computation
(`paired`), the printed spread of a measurement (`spread`, `ratios`), peak memory (`peak_rss`) and the inputs several
benchmarks share (`KNOBS`, `RAW`, `policy_batch`). The benchmarks are `bench_measure` and `bench_sampling`; the
command line is `bench`.

Every benchmark that compares ways of doing one thing times them with `paired`: one warm-up
call of each way (whichever ran first would otherwise pay for lazy imports, caches and the
allocator), then the ways alternate for `repeats` rounds (load drift on a shared machine hits
all ways alike); the printout gives the median and the spread (min–max) over the rounds.
"""
from __future__ import annotations

import statistics
import time

from . import policy, rollout, sources, tasks
from .compute import Compute

KNOBS = Compute()   # the default memory knobs of every timed call (a bench times the code, not a profile)


RAW = sources.ProblemSource(prompt_format="raw")  # the tiny policy's prompts as given, rewards by tasks.verify


BENCHES = {}


def bench(fn):
    BENCHES[fn.__name__] = fn
    return fn


def paired(ways: dict, repeats: int = 3, memory: bool = False) -> dict:
    """Time the `ways` (name -> zero-argument callable) of one computation fairly.

    One warm-up call of each, then `repeats` rounds calling every way once in turn. Returns per
    way {'s': seconds per round, 'mb': peak RSS increase per round (with `memory`, via
    `peak_rss`), 'out': the last call's result}.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for fn in ways.values():
        fn()
    res = {n: {"s": [], "mb": [], "out": None} for n in ways}
    for _ in range(repeats):
        for n, fn in ways.items():
            if memory:
                out, dt, mb = peak_rss(fn)
                res[n]["mb"].append(mb)
            else:
                t = time.perf_counter()
                out = fn()
                dt = time.perf_counter() - t
            res[n]["s"].append(dt)
            res[n]["out"] = out
    return res


def spread(xs, scale: float = 1.0, fmt: str = ".3f") -> str:
    """'median (min–max)' of a list of measurements, each multiplied by `scale`."""
    xs = sorted(x * scale for x in xs)
    med = statistics.median(xs)
    return f"{med:{fmt}} ({xs[0]:{fmt}}–{xs[-1]:{fmt}})"


def ratios(a, b) -> list[float]:
    """Per-round ratios a/b of two ways measured in the same rounds (their spread is the ratio's)."""
    return [x / y for x, y in zip(a, b)]


def peak_rss(fn):
    """(result, seconds, peak RSS increase in MB) of fn(): a thread polls /proc/self/statm every ms.

    Freed memory is handed back (gc + malloc_trim) first, so an earlier run's arena does not hide
    this one's allocations.
    """
    import ctypes
    import gc
    import os
    import threading

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * page

    base, peak, done = rss(), [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    done.set()
    th.join()
    return out, dt, (max(peak[0], rss()) - base) / 2**20


def policy_batch(n_prompts=16, G=8, dtype="float64"):
    model, tok = policy.load_policy("data/policies/tiny-m", dtype=dtype)
    batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=n_prompts, G=G, source=RAW),
                           problems=tasks.sample_problems(n_prompts, seed=5), seed=5)
    return model, tok, batch
