"""`make bench`: every expensive computation against its naive way, measured in the same run.

    python -m cancellation.bench            # all benchmarks
    python -m cancellation.bench token_stats
    python -m cancellation.bench monitor steps=2 repeats=3   # key=value: that benchmark's arguments

The benchmarks are registered (`bench_timing.bench`) by subject: the measurements' in `bench_measure` (forwards,
steps, notebook 04's updates and null, --procs, tagging, grading, the coupling kernel, memory), sampling's in
`bench_sampling` (Monte Carlo continuations, the sampler, the monitor's TRL run); the timing harness (`paired`:
one warm-up call of each way, then the ways alternate for `repeats` rounds; the printout gives the median and
the spread, min–max, over the rounds) is `bench_timing`.
"""
from __future__ import annotations

import sys

import torch

from . import bench_measure, bench_sampling
from .bench_timing import BENCHES

SUBJECTS = (bench_measure, bench_sampling)   # their @bench functions fill BENCHES, in this order


def _value(v: str):
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def main(argv=None):
    args = argv if argv is not None else sys.argv[1:]
    names = [a for a in args if "=" not in a] or list(BENCHES)
    kw = {k: _value(v) for k, v in (a.split("=", 1) for a in args if "=" in a)}
    torch.manual_seed(0)
    for n in names:
        if n not in BENCHES:
            sys.exit(f"unknown benchmark {n!r}; known: {', '.join(BENCHES)}")
        BENCHES[n](**kw)


if __name__ == "__main__":
    main()
