"""`make bench`: every expensive computation against its naive way, measured in the same run.

    python -m cancellation.bench            # all benchmarks
    python -m cancellation.bench token_stats
"""
from __future__ import annotations

import sys
import time

import torch

from . import measure, policy, rollout, tasks

BENCHES = {}


def bench(fn):
    BENCHES[fn.__name__] = fn
    return fn


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of `repeat` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _policy_batch(n_prompts=16, G=8, dtype="float64"):
    model, tok = policy.load_policy("data/policies/tiny-m", dtype=dtype)
    batch = rollout.sample_batch(model, tok, tasks.sample_problems(n_prompts, seed=5), G=G, seed=5)
    return model, tok, batch


@bench
def token_stats():
    """Token log-probs/entropies of a batch: batched forward (row chunks) vs one forward per sequence."""
    model, _, batch = _policy_batch()
    fast = timed(lambda: measure.token_stats(model, batch, chunk_rows=64))
    slow = timed(lambda: measure.token_stats_per_sequence(model, batch), repeat=1)
    m = batch.response_mask
    err = float((measure.token_stats(model, batch).logp - measure.token_stats_per_sequence(model, batch).logp)[m].abs().max())
    print(f"token_stats: {len(batch)} rollouts, {batch.n_tokens} response tokens, float64, tiny-m\n"
          f"  batched  {fast * 1e3:8.1f} ms\n  per-seq  {slow * 1e3:8.1f} ms\n"
          f"  speed-up {slow / fast:8.1f}x   (max |Δ logp| between them {err:.1e})")


def main(argv=None):
    names = (argv if argv is not None else sys.argv[1:]) or list(BENCHES)
    torch.manual_seed(0)
    for n in names:
        if n not in BENCHES:
            sys.exit(f"unknown benchmark {n!r}; known: {', '.join(BENCHES)}")
        BENCHES[n]()


if __name__ == "__main__":
    main()
