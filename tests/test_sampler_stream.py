"""The sampler's stream, token for token: every pinned sampling call (tests/golden/sampler_stream.py:
the tiny policies in float64 and float32 through `rollout.sample`, Monte Carlo continuations,
the stand-in in float32) draws exactly the tokens committed in tests/golden/sampler_stream.json.
The committed tiny tables were computed from these draws, so a faster sampler must keep them. On a
machine class whose kernels round otherwise (AVX2 instead of AVX-512), that class's own pins replace the
cases that differ there (tests/golden/sampler_stream_machines.json)."""
import json

import pytest
import torch

from tests.golden import sampler_stream


@pytest.fixture(scope="module")
def pinned(canonical_standins):   # the stand-in cases read data/standins/model: built here on a fresh clone
    return sampler_stream.pins()


@pytest.mark.parametrize("name", list(sampler_stream.cases()))
def test_sampler_draws_the_pinned_tokens(pinned, name):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the notebooks sample (figures' `threads` parameter)
    try:
        got = sampler_stream.cases()[name]()
    finally:
        torch.set_num_threads(threads)
    want = pinned[name]
    assert len(got) == len(want), f"{name}: {len(got)} rows, pinned {len(want)}"
    for r, (g, w) in enumerate(zip(got, want)):
        assert g == w, (f"{name}: row {r} differs from the pinned stream ({sampler_stream.machine_class()}; a machine "
                        "class of its own is pinned with `python -m tests.golden.sampler_stream --write-machine` "
                        "from code that keeps the main pins)")


def test_every_pinned_case_is_tested(pinned):
    assert set(pinned) == set(sampler_stream.cases())
    for cls, own in json.loads(sampler_stream.MACHINE_PINS.read_text()).items():
        assert set(own) <= set(pinned), f"{cls}: pins of unknown cases"


def test_machine_pins_differ_from_the_main_pins():
    """A machine class holds only the cases its kernels draw otherwise (and, for the AVX2 class, the two
    padded stand-in cases seen on an AVX2-only EPYC): the main pins stay the reference."""
    main = json.loads(sampler_stream.PINS.read_text())
    table = json.loads(sampler_stream.MACHINE_PINS.read_text())
    assert "x86_64 AVX2 AuthenticAMD" in table
    for own in table.values():
        for name, rows in own.items():
            assert rows != main[name] and len(rows) == len(main[name])
