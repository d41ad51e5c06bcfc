"""Every figure pins torch's CPU threads (`threads`, one by default) before it computes anything.

A float sum can be split differently with another thread count: at 3 threads a float64 Adam step on a
tiny-m batch moves every parameter tensor by round-off against 1 thread (measured 2026-11-27; at 2 they
agree). Unpinned, a notebook's numbers would follow the machine's core count, and `make figures`'s pool
(`pool.run_pool`, one thread per notebook) would compute something else than a notebook run alone.
"""
import importlib

import pytest
import torch

from cancellation import manifest
from cancellation.figures import base

FIGURES = [f"{f.package}.{f.module}" for f in manifest.FIGURES]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("name", FIGURES)
def test_compute_pins_the_threads_before_it_loads_anything(name, monkeypatch):
    mod = importlib.import_module(name)

    def stop(P):
        raise _Stop

    monkeypatch.setattr(base, "problem_source", stop)   # the first thing every compute() loads
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with pytest.raises(_Stop):
            mod.compute(mod.Params(threads=3))
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        with pytest.raises(_Stop):
            mod.compute(mod.Params(threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_an_accelerator_run_leaves_the_cpu_threads_alone():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        base.pin_threads(base.FigureParams(device="cuda", threads=1))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
