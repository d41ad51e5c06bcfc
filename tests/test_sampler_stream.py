"""The sampler's stream, token for token: every pinned sampling call (tests/golden/sampler_stream.py:
the tiny policies in float64 and float32 through `rollout.sample`, Monte Carlo continuations,
the stand-in in float32) draws exactly the tokens committed in tests/golden/sampler_stream.json.
The committed tiny tables were computed from these draws, so a faster sampler must keep them."""
import json

import pytest
import torch

from tests.golden import sampler_stream


@pytest.fixture(scope="module")
def pinned(canonical_standins):   # the stand-in cases read data/standins/model: built here on a fresh clone
    return json.loads(sampler_stream.PINS.read_text())


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
        assert g == w, f"{name}: row {r} differs from the pinned stream"


def test_every_pinned_case_is_tested(pinned):
    assert set(pinned) == set(sampler_stream.cases())
