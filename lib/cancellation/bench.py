"""`make bench`: every expensive computation against its naive way, measured in the same run.

    python -m cancellation.bench            # all benchmarks
    python -m cancellation.bench token_stats
    python -m cancellation.bench monitor steps=2 repeats=3   # key=value: that benchmark's arguments

Every benchmark that compares ways of doing one thing times them with `paired`: one warm-up
call of each way (whichever ran first would otherwise pay for lazy imports, caches and the
allocator), then the ways alternate for `repeats` rounds (load drift on a shared machine hits
all ways alike); the printout gives the median and the spread (min–max) over the rounds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import copy
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from . import cache, coupling, engine, extract, grpo, measure, policy, procs, rollout, scale, seeds, sources, standins, tasks, thesis, train, value
from . import categories as C
from .compute import Compute
from .decode_hf import generate_transformers
from .decode_lean import generate_lean
from .figures import fig01, fig04
from .grader import MathVerifier   # by name: this module's `grader` is a bench
from .pack import padded
from .sampler import generate

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
    `_peak_rss`), 'out': the last call's result}.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    for fn in ways.values():
        fn()
    res = {n: {"s": [], "mb": [], "out": None} for n in ways}
    for _ in range(repeats):
        for n, fn in ways.items():
            if memory:
                out, dt, mb = _peak_rss(fn)
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


def _policy_batch(n_prompts=16, G=8, dtype="float64"):
    model, tok = policy.load_policy("data/policies/tiny-m", dtype=dtype)
    batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=n_prompts, G=G, source=RAW),
                           problems=tasks.sample_problems(n_prompts, seed=5), seed=5)
    return model, tok, batch


@bench
def token_stats(n_prompts: int = 16, G: int = 8, repeats: int = 3):
    """Token log-probs/entropies of a batch: batched forward (row chunks) vs one forward per sequence."""
    model, _, batch = _policy_batch(n_prompts, G)
    r = paired({"batched": lambda: measure.token_stats(model, batch, Compute(chunk_rows=64)),
                "per-seq": lambda: measure.token_stats_per_sequence(model, batch)}, repeats)
    fast, slow = r["batched"], r["per-seq"]
    m = batch.response_mask
    err = float((fast["out"].logp - slow["out"].logp)[m].abs().max())
    print(f"token_stats: {len(batch)} rollouts, {batch.n_tokens} response tokens, float64, tiny-m; "
          f"median (min–max) of {repeats} alternating rounds\n"
          f"  batched  {spread(fast['s'], 1e3, '.1f')} ms\n  per-seq  {spread(slow['s'], 1e3, '.1f')} ms\n"
          f"  speed-up {spread(ratios(slow['s'], fast['s']), fmt='.1f')}x   (max |Δ logp| between them {err:.1e})")


@bench
def trim(n_prompts: int = 8, G: int = 8, repeats: int = 3, rows: str = "64,16"):
    """trim_padding on a sampled tiny-m batch (float64, fig04's size): token_stats and one full-scope SGD
    step over every column (the tiny profile's committed way) vs each chunk's real columns only, rows
    shortest first, at the chunk sizes `rows`; max |Δ| between the two ways beside the speed-up."""
    model, _, batch = _policy_batch(n_prompts, G)
    B, L = batch.input_ids.shape
    lengths = batch.attention_mask.sum(1).double()
    print(f"trim: tiny-m float64, {B} rollouts x {L} columns, real tokens per row {lengths.mean():.0f} mean, "
          f"{lengths.min():.0f}–{lengths.max():.0f} (a {lengths.sum() / (B * L):.0%} share of the positions); "
          f"median (min–max) of {repeats} alternating rounds, {torch.get_num_threads()} thread(s)")
    old = measure.token_stats(model, batch, KNOBS).logp

    def step(knobs):
        m = copy.deepcopy(model)
        grpo.grpo_step(m, batch, knobs.update(optimizer="sgd", lr=0.1, scope="full"), old_logp=old)
        return [p.detach() for p in m.parameters()]
    for cr in (int(x) for x in str(rows).split(",")):
        full, cut = Compute(chunk_rows=cr), Compute(chunk_rows=cr, trim_padding=True)
        positions = sum(len(r) * (c.stop - c.start) for r, c in measure.chunks(batch.attention_mask,
                                                                                 torch.arange(B), cut))
        r = paired({"full": lambda: measure.token_stats(model, batch, full),
                    "trim": lambda: measure.token_stats(model, batch, cut),
                    "step full": lambda: step(full), "step trim": lambda: step(cut)}, repeats)
        d_stats = float((r["full"]["out"].logp - r["trim"]["out"].logp).abs().max())
        d_step = max(float((a - b).abs().max()) for a, b in zip(r["step full"]["out"], r["step trim"]["out"]))
        print(f"  chunk_rows {cr}: forwards over {positions / (B * L):.0%} of the positions\n"
              f"    token_stats  full {spread(r['full']['s'], 1e3, '.0f')} ms   trim {spread(r['trim']['s'], 1e3, '.0f')} ms"
              f"   speed-up {spread(ratios(r['full']['s'], r['trim']['s']), fmt='.2f')}x   max |Δ logp| {d_stats:.1e}\n"
              f"    SGD step     full {spread(r['step full']['s'], 1e3, '.0f')} ms   trim "
              f"{spread(r['step trim']['s'], 1e3, '.0f')} ms   speed-up "
              f"{spread(ratios(r['step full']['s'], r['step trim']['s']), fmt='.2f')}x   max |Δθ| {d_step:.1e}")


@bench
def pack(repeats: int = 3, threads: int = 1, batches: str = "0,1"):
    """The padding pack (`pack.hidden`) on notebook 01's batches (its parameters: tiny-m float64, 16 x 8 rollouts of
    its problems, sampled with the seeds `batches`): token_stats (the analysis forward) and one Adam step over two
    mini-batches (the update), the body on the real positions only vs padded (the old way), alternating rounds;
    statistics and parameters compared bit for bit. `step f32`: the same step on a float32 copy (notebook 07's
    training dtype), whose weight gradients the pack sums in the padded layout where this CPU needs it."""
    P = fig01.Params()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype)
    scfg = fig01.base.sample_config(P, fig01.base.problem_source(P))
    cfg = P.compute().update(optimizer="adam", lr=P.lr, n_minibatches=P.n_minibatches)
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    print(f"pack: notebook 01's batches (tiny-m {P.dtype}, {P.n_prompts} x {P.G} rollouts), {threads} thread(s); "
          f"median (min–max) of {repeats} alternating rounds; outputs bit for bit")
    try:
        for seed in (int(x) for x in str(batches).split(",")):
            batch = rollout.sample(model, tok, scfg, seed=seed)
            old = measure.token_stats(model, batch, P.compute()).logp

            def way(fn, packed):
                def go():
                    with contextlib.nullcontext() if packed else padded():
                        return fn()
                return go

            def stats():
                return measure.token_stats(model, batch, P.compute(), hidden=True)

            def step(base=model, old=old):
                m = copy.deepcopy(base)
                grpo.grpo_step(m, batch, cfg, old_logp=old, seed=seed)
                return [p.detach() for p in m.parameters()]
            m32 = policy.cast(model, "float32")
            old32 = measure.token_stats(m32, batch, P.compute()).logp
            step32 = functools.partial(step, m32, old32)
            r = paired({"stats packed": way(stats, True), "stats padded": way(stats, False),
                        "step packed": way(step, True), "step padded": way(step, False),
                        "step f32 packed": way(step32, True), "step f32 padded": way(step32, False)}, repeats)
            a, b = r["stats packed"]["out"], r["stats padded"]["out"]
            rm = batch.response_mask
            if not (torch.equal(a.logp, b.logp) and torch.equal(a.entropy, b.entropy)
                    and torch.equal(a.hidden[rm], b.hidden[rm])):
                raise AssertionError("pack: token_stats differ between the packed and the padded forward")
            for name in ("step", "step f32"):
                if not all(torch.equal(x, y) for x, y in zip(r[name + " packed"]["out"], r[name + " padded"]["out"])):
                    raise AssertionError(f"pack: the Adam step's parameters differ between packed and padded ({name})")
            B, L = batch.input_ids.shape
            print(f"  seed {seed}: {B} rollouts x {L} columns, {batch.attention_mask.float().mean():.0%} real positions\n"
                  + "\n".join(f"    {name:<14} packed {spread(r[name + ' packed']['s'], 1e3, '.0f')} ms   padded "
                               f"{spread(r[name + ' padded']['s'], 1e3, '.0f')} ms   speed-up "
                               f"{spread(ratios(r[name + ' padded']['s'], r[name + ' packed']['s']), fmt='.2f')}x"
                               for name in ("stats", "step", "step f32")))
    finally:
        torch.set_num_threads(before_threads)


@bench
def trials(batch: int = 0, repeats: int = 3, threads: int = 1):
    """Notebook 04's updates on one of its batches (the tiny profile's batch `batch` of tiny-m: 8 x 8 rollouts,
    float64): the "before" statistics, the six single SGD steps from θ₀ (positive-only, GRPO, negative-only,
    copies-masked, two random masks) with their "after" forwards, and the restore check, with the forward from θ₀
    shared (`grpo.Trials`) vs one per update (the old way); then the batch's whole token table (with Eq. 9's
    first-order terms, which both ways compute alike). Tables compared bit for bit. The sign-shuffle null is left
    out here (null_shuffles = 0): its own line is `thesis_null`."""
    P = fig04.Params(null_shuffles=0)
    cc = P.compute()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype)
    bseed = seeds.derive(P.seed, "category_batch", batch)
    b = rollout.sample(model, tok, fig04.base.sample_config(P, fig04.base.problem_source(P)), seed=bseed)
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)

    def updates(shared):
        def go():
            t = grpo.Trials(model, b, cc, scope=P.scope, shared=shared)
            df = measure.token_table(b, t.before, tokenizer=tok)
            for rw in fig04.UPDATES:
                df[f"delta_{rw}"] = t.delta(cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight=rw))[
                    b.response_mask].double().numpy()
            fig04._thesis_updates(P, cc, b, t, df, bseed)
            df["restore_error"] = t.restore_error()
            return df
        return go

    def table(shared):
        return lambda: fig04.batch_table(P, model, tok, b, batch, bseed, True, shared_forward=shared)
    try:
        r = paired({"shared": updates(True), "old": updates(False)}, repeats)
        rt = paired({"shared": table(True), "old": table(False)}, repeats)
    finally:
        torch.set_num_threads(before_threads)
    for name, res in (("updates", r), ("batch table", rt)):
        if not res["shared"]["out"].equals(res["old"]["out"]):
            raise AssertionError(f"trials: the shared forward's {name} differs from the old way's")
    print(f"trials: notebook 04's batch {batch} (tiny-m float64, {len(b)} rollouts x {b.input_ids.shape[1]} columns, "
          f"{b.n_tokens} response tokens), {threads} thread(s); median (min–max) of {repeats} alternating rounds; "
          "tables bit for bit\n"
          f"  six updates + before + restore   shared {spread(r['shared']['s'], fmt='.2f')} s   old "
          f"{spread(r['old']['s'], fmt='.2f')} s   speed-up {spread(ratios(r['old']['s'], r['shared']['s']), fmt='.2f')}x\n"
          f"  whole batch table (+ Eq. 9)      shared {spread(rt['shared']['s'], fmt='.2f')} s   old "
          f"{spread(rt['old']['s'], fmt='.2f')} s   speed-up {spread(ratios(rt['old']['s'], rt['shared']['s']), fmt='.2f')}x")


@bench
def thesis_null(batch: int = 0, K: int = 4, repeats: int = 1, threads: int = 1):
    """The thesis's sign-shuffle null on one of notebook 04's batches (tiny-m float64, 8 x 8 rollouts): K within-
    group shuffles x the three updates (positive-only, negative-only, GRPO) as exact steps on the whole batch
    (`grpo.Trials.delta`: a backward of the shared forward, a step and an "after" forward each: the naive way) vs
    what notebook 04 runs (`thesis.null_batch`: the rollouts of mixed groups only, their per-rollout gradients
    once, then one matrix product and one forward per shuffle and update); the largest |difference| of their Δlog p
    on those rows. Scaled: the minutes of K = 39 shuffles on notebook 04's 40 batches, each way (one core)."""
    P = fig04.Params()
    cc = P.compute()
    model, tok = policy.load_policy(P.model_path, dtype=P.dtype)
    bseed = seeds.derive(P.seed, "category_batch", batch)
    b = rollout.sample(model, tok, fig04.base.sample_config(P, fig04.base.problem_source(P)), seed=bseed)
    seed = seeds.derive(bseed, "thesis_null")
    orders = thesis.shuffles(b, K, seed)
    updates = thesis.PERMUTED
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)

    def exact():
        t = grpo.Trials(model, b, cc, scope=P.scope)
        out = {u: torch.stack([t.delta(cc.update(optimizer="sgd", lr=P.lr, scope=P.scope, reweight=u),
                                       dataclasses.replace(b, reward=b.reward[o], advantage=b.advantage[o]))
                               for o in orders])[:, b.response_mask].numpy() for u in updates}
        t.restore_error()
        return out

    def null():
        return thesis.null_batch(model, b, cc, P.lr, K, seed, P.scope)
    try:
        r = paired({"exact": exact, "null_batch": null}, repeats)
        t0 = time.perf_counter()
        sub = b.select(thesis.mixed_rows(b))
        thesis.rollout_gradients(model, sub, cc, P.scope, n_tokens=b.response_mask.sum())
        grads = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before_threads)
    got = r["null_batch"]["out"]
    on = ~np.isnan(got["grpo"][0])
    err = max(float(np.abs(r["exact"]["out"][u][:, on] - got[u][:, on]).max()) for u in updates)
    ex, sc = statistics.median(r["exact"]["s"]), statistics.median(r["null_batch"]["s"])
    per_ex, per_sc = ex / (3 * K), (sc - grads) / (3 * K + 1)
    full = lambda per, fixed=0.0: 40 * (fixed + 3 * 39 * per) / 60   # noqa: E731 - minutes for K=39 on 40 batches
    print(f"thesis_null: notebook 04's batch {batch} (tiny-m float64, {len(b)} rollouts x {b.input_ids.shape[1]} "
          f"columns, {b.n_tokens} response tokens; {len(sub)} rollouts in mixed groups), {K} shuffles x 3 updates, "
          f"{threads} thread(s), {repeats} round(s); max |Δ exact - Δ null_batch| {err:.1e}\n"
          f"  exact steps   {spread(r['exact']['s'], fmt='.2f')} s   ({per_ex:.2f} s per shuffle-update)\n"
          f"  null_batch    {spread(r['null_batch']['s'], fmt='.2f')} s   (per-rollout gradients {grads:.2f} s once, then "
          f"{per_sc:.2f} s per shuffle-update)   speed-up {spread(ratios(r['exact']['s'], r['null_batch']['s']), fmt='.2f')}x\n"
          f"  K = 39 on 40 batches: exact {full(per_ex):.0f} min, null_batch {full(per_sc, grads):.0f} min (one core)")


def _one_vs_ranks(tag: str, one, ranks, n: int, repeats: int) -> dict:
    """Seconds of one() (every unit on this process) and ranks() (`run --procs n`: $CANCELLATION_PROCS = n while
    it runs), each from an empty cache of its own (this process's and the ranks', $CANCELLATION_CACHE), in
    `repeats` alternating rounds; their outputs (lists of tables) compared bit for bit."""
    saved = cache.DEFAULT_DIR, os.environ.get("CANCELLATION_CACHE"), os.environ.get(procs.PROCS_ENV)
    threads = torch.get_num_threads()
    res = {"one": [], "ranks": []}
    try:
        for _ in range(repeats):
            for name, fn, count in (("one", one, 1), ("ranks", ranks, n)):
                with tempfile.TemporaryDirectory(prefix=f"bench-{tag}-") as d:
                    cache.DEFAULT_DIR = Path(d)
                    os.environ["CANCELLATION_CACHE"] = d
                    os.environ[procs.PROCS_ENV] = str(count)
                    t = time.perf_counter()
                    out = fn()
                    res[name].append(time.perf_counter() - t)
                if name == "one":
                    first = out
                elif len(out) != len(first) or not all(a.equals(b) for a, b in zip(first, out)):
                    raise AssertionError(f"{tag}: a table from the ranks differs from one process's")
    finally:
        cache.DEFAULT_DIR = saved[0]
        torch.set_num_threads(threads)
        for k, v in (("CANCELLATION_CACHE", saved[1]), (procs.PROCS_ENV, saved[2])):
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return res


def _print_ranks(tag: str, what: str, res: dict, n: int, repeats: int):
    print(f"{tag}: {what}, empty cache; {os.cpu_count()} cores here; median (min–max) of {repeats} round(s); tables "
          f"bit for bit\n  one process {spread(res['one'], fmt='.1f')} s   {n} ranks {spread(res['ranks'], fmt='.1f')} s "
          f"(launcher and model loads included)   speed-up {spread(ratios(res['one'], res['ranks']), fmt='.2f')}x")


@bench
def procs04(batches: int = 4, n: int = 2, repeats: int = 1):
    """Notebook 04's batches of both policies (tiny profile, float64, one thread per process): one process,
    batch after batch (as `compute` does without --procs), vs `n` ranks (`fig04.fan_out_batches`, run --procs n:
    accelerate's launcher, each rank loading the policies itself). On fewer than `n` free cores the ranks share."""
    P = fig04.Params(n_batches=batches)
    source = fig04.base.problem_source(P)
    units = [(path, i) for i in range(batches) for path in (P.model_path, P.control_model_path)]
    fig04.base.pin_threads(P)

    def cached_only(path):
        raise AssertionError(f"procs04: the ranks left a batch of {path} uncomputed")

    def tables(load):
        return [fig04.batch_deltas(P, source, i, path, load) for path, i in units]

    def ranks():
        fig04.fan_out_batches(P, source)
        return tables(cached_only)   # every batch is in the cache now: nothing loads a model
    res = _one_vs_ranks("procs04", lambda: tables(fig04._loader(P)), ranks, n, repeats)
    _print_ranks("procs04", f"notebook 04's {batches} batches of each of its 2 policies (tiny profile, float64, 1 thread "
                 "per process)", res, n, repeats)


@bench
def procs01(steps: int = 2, n: int = 2, repeats: int = 1):
    """Notebook 01's Δlog p runs (tiny profile, float64, one thread per process: the GRPO, positive-only and SGD
    runs, the control policy's two, Fig. 9's second model), `steps` GRPO steps each (Fig. 9's: half): one process,
    run after run, vs `n` ranks (`train.cached_delta_runs`, run --procs n)."""
    P = fig01.Params(steps=steps, fig9_steps=max(1, steps // 2))
    specs = fig01.delta_runs(P, fig01.run_config(P, fig01.base.problem_source(P)))
    fig01.base.pin_threads(P)

    def runs():
        return list(train.cached_delta_runs(specs, P.dtype, P.device).values())
    res = _one_vs_ranks("procs01", runs, runs, n, repeats)
    _print_ranks("procs01", f"notebook 01's {len(specs)} Δlog p runs of {steps} steps (tiny profile, float64, 1 thread "
                 "per process)", res, n, repeats)


@bench
def categories_tagging(n_tokens: int = 100_000, repeats: int = 3):
    """Fig. 4 tagging of 100k response tokens: word-level (detokenise, tag each distinct word once,
    map back) vs naive per-token tagging (every token alone through the NLTK tagger). Budget 10 s."""
    import random

    tok = policy.load_policy("data/policies/tiny-m")[1]
    rng = random.Random(0)
    seqs, n = [], 0
    for p in tasks.sample_problems(4000, seed=0):
        ids = tok(tasks.make_trace(p, rng, error_rate=0.35), add_special_tokens=False).input_ids
        seqs.append(ids)
        n += len(ids)
        if n >= n_tokens:
            break
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    pieces = [[vocab[i] for i in s] for s in seqs]
    special = frozenset(tok.all_special_tokens)
    cz = C.Categorizer(tagger="shipped")
    r = paired({"word": lambda: C.Categorizer(tagger="shipped").tag_ids(seqs, tok),   # fresh caches each time
                "token": lambda: [C.tag_naive(p, "wordpiece", cz, special) for p in pieces]}, repeats)
    fast, slow = r["word"]["s"], r["token"]["s"]
    a = [c for cs, _ in r["word"]["out"] for c in cs]
    b = [c for p in r["token"]["out"] for c in p]
    agree = sum(x == y for x, y in zip(a, b)) / len(a)
    med = statistics.median(fast)
    print(f"categories_tagging: {len(seqs)} tiny responses, {n} tokens, tagger=shipped (NLTK); "
          f"median (min–max) of {repeats} alternating rounds\n"
          f"  word-level {spread(fast, fmt='.2f')} s   (budget 10 s: {'ok' if med <= 10 else 'OVER'})\n"
          f"  per-token  {spread(slow, fmt='.2f')} s\n  speed-up   {spread(ratios(slow, fast), fmt='.1f')}x   "
          f"(labels agree on {100 * agree:.1f}% of tokens; the rest need phrase/brace context the per-token way "
          f"cannot see)")


@bench
def grader(repeats: int = 3, rows: str = "tests/data/graded_responses.jsonl"):
    """The reward's grader (grader.MathVerifier) per answer mode on the hand-labelled responses: recall and
    precision against the labels beside grading speed (responses per second), with math-verify's default parse
    of the whole response (its own extraction, no mode) measured in the same rounds."""
    import json

    from math_verify import parse, verify

    path = Path(rows) if Path(rows).is_absolute() else Path(__file__).resolve().parents[2] / rows
    data = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    probs = [tasks.Problem(r.get("prompt", "q"), r["gold"]) for r in data]

    def ours(mode):
        def run():
            v = MathVerifier(mode=mode)     # fresh caches each round, as a new run starts
            return [v(p, r["response"]) for p, r in zip(probs, data)]
        return run

    def default():
        out = []
        for r in data:
            try:
                gold = parse(f"\\boxed{{{r['gold']}}}") or parse(r["gold"])
                out.append(float(bool(gold) and verify(gold, parse(r["response"]))))
            except Exception:  # noqa: BLE001 - a grader error is a zero, as MathVerifier counts it
                out.append(0.0)
        return out

    ways = {m: ours(m) for m in extract.ANSWER_MODES if m != "auto"}
    ways["math-verify default"] = default
    res = paired(ways, repeats)
    pos = sum(r["label"] for r in data)
    print(f"grader: {len(data)} labelled responses ({pos} correct by hand) from {rows}; MathVerifier.REVISION "
          f"{MathVerifier.REVISION}; responses per second: median (min–max) of {repeats} alternating rounds")
    print(f"  {'mode':34s} {'recall':>7s} {'precision':>9s}  responses/s")
    for name, r in res.items():
        got = r["out"]
        tp = sum(g == 1.0 and d["label"] for g, d in zip(got, data))
        credited = sum(g == 1.0 for g in got)
        prec = f"{tp / credited:.3f}" if credited else "-"
        rate = spread([len(data) / t for t in r["s"]], fmt=".0f")
        print(f"  {name:34s} {tp / pos:7.3f} {prec:>9s}  {rate}")


def _peak_rss(fn):
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


def _coupling_features(n_tokens, seed=7):
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float64")
    n_prompts = max(4, n_tokens // 380)
    batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=n_prompts, G=8, source=RAW),
                           problems=tasks.sample_problems(n_prompts, seed=seed), seed=seed)
    while batch.n_tokens < n_tokens:
        n_prompts *= 2
        batch = rollout.sample(model, tok, rollout.SampleConfig(n_prompts=n_prompts, G=8, source=RAW),
                               problems=tasks.sample_problems(n_prompts, seed=seed), seed=seed)
    f = coupling.features(model, batch, compute=KNOBS)
    return model, batch, f, torch.arange(n_tokens)


@bench
def coupling_kernel(n_tokens: int = 8192, n_pairs: int = 2048, repeats: int = 3):
    """Proxy kernel K (N×N): factorised + chunked vs autograd per-token LM-head gradients and their Gram."""
    _, _, f, idx = _coupling_features(n_tokens)
    J = idx[:n_pairs]

    def autograd_gram():
        W = f.W.clone().requires_grad_(True)
        grads = torch.empty(len(J), W.numel(), dtype=W.dtype)
        for i, j in enumerate(J.tolist()):   # one per-token V×d gradient each
            logp = torch.log_softmax(f.h[j] @ W.T, -1)[f.o[j]]
            grads[i] = torch.autograd.grad(logp, W)[0].flatten()
        return grads @ grads.T

    r = paired({"fast": lambda: coupling.kernel(f, J, J, chunk=512), "slow": autograd_gram}, repeats, memory=True)
    fast, slow = r["fast"], r["slow"]
    err = float((fast["out"] - slow["out"]).abs().max() / slow["out"].abs().max())
    del r, fast["out"], slow["out"]
    a = f.A
    _, t_big, m_big = _peak_rss(lambda: coupling.kernel_matvec(f, a, chunk=1024))
    N, out_mb = len(J), len(J) ** 2 * 8 / 2**20
    print(f"coupling_kernel: tiny-m float64, V={f.W.shape[0]}, d={f.h.shape[1]}; "
          f"median (min–max) of {repeats} alternating rounds\n"
          f"  N={N} factorised+chunked  {spread(fast['s'])} s  peak +{spread(fast['mb'], fmt='.1f')} MB "
          f"(output {N}² float64 = {out_mb:.0f} MB)\n"
          f"  N={N} autograd per-token   {spread(slow['s'])} s  peak +{spread(slow['mb'], fmt='.1f')} MB\n"
          f"  speed-up {spread(ratios(slow['s'], fast['s']), fmt='.1f')}x   memory ratio "
          f"{spread(ratios(slow['mb'], [max(m, 1e-3) for m in fast['mb']]), fmt='.1f')}x   (max rel. diff {err:.1e})\n"
          f"  N={n_tokens} factorised Σ_k A_k K_jk (all N² pairs, nothing N×N stored)  {t_big:8.3f} s  "
          f"peak +{m_big:7.1f} MB")


def _vocab_standin(rows=8, resp=4096, prompt=16, vocab=151_936, seed=0):
    """A random small Qwen3 (hidden 64, 1 layer, tied) with Qwen's 151,936-token vocabulary, float32,
    and a batch of `rows` rollouts of `prompt` + `resp` tokens (two groups, mixed advantages)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=prompt + resp, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    batch = scale.synthetic_batch(rows // 4, 4, prompt, resp, vocab, seed)
    return model, batch


@bench
def memory(rows: int = 8, resp: int = 4096, repeats: int = 3):
    """Peak extra memory of token_stats and of one grpo_step on a 151,936-token vocabulary at 4,096
    response tokens per row, 8 rows: token chunks from the final hidden states vs the unchunked way
    (full (rows, L, V) float32 logits), measured in the same run. Target ≥ 10x less, chunked ≤ 2 GB."""
    model, batch = _vocab_standin(rows, resp)
    V = model.config.vocab_size
    tc_stats, tc_step = 1024, 512
    budget = 12 * 2**30                      # this machine: 24 GB; the old backward holds ~2x the estimate
    est_row = 4 * 4 * (resp + 16) * V        # ~4 live (L, V) float32 tensors per row the old way
    n_old = rows if est_row * rows <= budget else max(1, budget // est_row)
    scale = rows / n_old
    old_batch = batch.select(list(range(n_old)))

    r = paired({"new": lambda: measure.token_stats(model, batch, Compute(chunk_rows=64, token_chunk=tc_stats)),
                "old": lambda: measure.token_stats_unchunked(model, old_batch, Compute(chunk_rows=64))},
               repeats, memory=True)
    s_new, s_old = r["new"].pop("out"), r["old"].pop("out")
    m = old_batch.response_mask
    err_s = float((s_new.logp[:n_old][m] - s_old.logp[m]).abs().max())
    old_logp = s_new.logp
    del s_new, s_old
    sn, so = r["new"], r["old"]

    cfg_new = grpo.UpdateConfig(optimizer="sgd", lr=0.1, chunk_rows=64, token_chunk=tc_step)
    cfg_old = grpo.UpdateConfig(optimizer="sgd", lr=0.1, chunk_rows=64)

    def step(b, cfg, unchunked):
        def run():   # a fresh copy each call (its step's optimizer state and grads are freed after)
            mdl = copy.deepcopy(model)
            # the step's own old_logp pass is left out: ρ = 1 from the given log-probs
            grpo.grpo_step(mdl, b, cfg, old_logp=old_logp[:len(b)], unchunked=unchunked)
        return run

    r = paired({"new": step(batch, cfg_new, False), "old": step(old_batch, cfg_old, True)}, repeats, memory=True)
    gn, go = r["new"], r["old"]
    note = (f"  (the unchunked way measured on {n_old} of {rows} rows and scaled x{scale:g} linearly: "
            f"8 rows would need ~{est_row * rows / 2**30:.0f} GB, more than this machine has)\n"
            if n_old < rows else "")
    med = statistics.median
    mem_s = ratios([x * scale for x in so["mb"]], [max(x, 1) for x in sn["mb"]])
    mem_g = ratios([x * scale for x in go["mb"]], [max(x, 1) for x in gn["mb"]])
    ok = min(med(mem_s), med(mem_g)) >= 10 and max(med(sn["mb"]), med(gn["mb"])) <= 2048
    print(f"memory: random Qwen3 stand-in (hidden 64, 1 layer, tied), V={V}, float32, {rows} rows x "
          f"{resp} response tokens (+16 prompt), chunk_rows=64; median (min–max) of {repeats} alternating rounds\n"
          f"  token_stats chunked (token_chunk={tc_stats})  peak +{spread(sn['mb'], fmt='.0f')} MB  "
          f"{spread(sn['s'], fmt='.1f')} s\n"
          f"  token_stats unchunked                  peak +{spread(so['mb'], scale, '.0f')} MB  "
          f"{spread(so['s'], scale, '.1f')} s   ratio {spread(mem_s, fmt='.1f')}x   (max |Δ logp| {err_s:.1e})\n"
          f"  grpo_step chunked (token_chunk={tc_step})     peak +{spread(gn['mb'], fmt='.0f')} MB  "
          f"{spread(gn['s'], fmt='.1f')} s\n"
          f"  grpo_step unchunked                    peak +{spread(go['mb'], scale, '.0f')} MB  "
          f"{spread(go['s'], scale, '.1f')} s   ratio {spread(mem_g, fmt='.1f')}x\n" + note +
          f"  target (medians): >= 10x less and chunked <= 2048 MB: {'ok' if ok else 'MISSED'}")


@bench
def masked_updates(n_tokens: int = 5000, repeats: int = 3):
    """Masking effect per candidate: shortcut (M's share of the gradient) vs re-running the masked step."""
    model, batch, f, _ = _coupling_features(n_tokens, seed=3)
    cands, sets = coupling.masking_sets(f, 30, 8, 0.5, seed=0)
    M = sets["both"]
    n, k = 100, len(cands)
    c_many, M_many = cands.repeat(n // k + 1)[:n], M.repeat(n // k + 1, 1)[:n]
    # full scope: the per-candidate cost is the slope between 1 and k candidates (the θ' step is
    # paid once in both); the re-run is one candidate's masked step
    full = paired({"one": lambda: coupling.masked_effects_full(model, batch, f, cands[:1], M[:1], 0.1, compute=KNOBS),
                   "all": lambda: coupling.masked_effects_full(model, batch, f, cands, M, 0.1, compute=KNOBS),
                   "rerun": lambda: coupling.masked_effect_bruteforce(model, batch, int(cands[0]), M[0], f, 0.1,
                                                                      compute=KNOBS)},
                  repeats)
    t_full = [max((ta - t1) / (k - 1), 1e-6) for ta, t1 in zip(full["all"]["s"], full["one"]["s"])]
    t_setup = [t1 - tf for t1, tf in zip(full["one"]["s"], t_full)]
    fast = full["all"]["out"]
    slow = [full["rerun"]["out"], coupling.masked_effect_bruteforce(model, batch, int(cands[1]), M[1], f, 0.1,
                                                                    compute=KNOBS)]
    err = max(abs(float(fast[i]) - slow[i]) / abs(slow[i]) for i in range(2))
    lm = paired({"closed": lambda: coupling.masked_effects_lm_head(f, c_many, M_many, 0.1),
                 "rerun": lambda: coupling.masked_effect_bruteforce(model, batch, int(cands[0]), M[0], f, 0.1,
                                                                    scope="lm_head", compute=KNOBS)}, repeats)
    t_lm = [t / n for t in lm["closed"]["s"]]
    print(f"masked_updates: tiny-m float64, {len(batch)} rollouts, {batch.n_tokens} tokens, |M| = 8, SGD lr 0.1; "
          f"median (min–max) of {repeats} alternating rounds\n"
          f"  full scope: shortcut {spread(t_full)} s/candidate (+ {statistics.median(t_setup):.1f} s once for θ')   "
          f"re-run {spread(full['rerun']['s'], fmt='.2f')} s/candidate   speed-up "
          f"{spread(ratios(full['rerun']['s'], t_full), fmt='.1f')}x (rel. diff {err:.1e})\n"
          f"  lm_head:    closed form {spread(t_lm, 1e3)} ms/candidate   re-run {spread(lm['rerun']['s'], fmt='.2f')} "
          f"s/candidate   speed-up {spread(ratios(lm['rerun']['s'], t_lm), fmt='.0f')}x")


@bench
def value_continuations(n_prompts: int = 4, G: int = 4, M: int = 16, repeats: int = 3):
    """Monte Carlo continuations (value.py): shared-prefix batched sampling (the lean decode step; and
    through the body's modules, as before it) vs `generate` per continuation set."""
    model, tok, batch = _policy_batch(n_prompts=n_prompts, G=G, dtype="float32")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny decode steps: one thread is fastest, and both paths get the same
    prefixes, budgets = [], []
    for row in range(len(batch)):
        prompt, resp = value.split_rollout(batch, row)
        for t in (0, len(resp) // 3, 2 * len(resp) // 3):
            prefixes.append(list(prompt + resp[:t]))
            budgets.append(96 - t)
    seeds = list(range(len(prefixes)))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    n = M * len(prefixes)

    def shared(lean=None):
        return [value.sample_continuations(model, prefixes[s:s + 64], M, budgets[s:s + 64], eos, pad, seeds[s:s + 64],
                                           token_chunk=KNOBS.token_chunk, lean=lean)
                for s in range(0, len(prefixes), 64)]

    def naive():  # one generate call per continuation set: the prefix copied M times, prefilled M times
        g = torch.Generator().manual_seed(0)
        for p, b in zip(prefixes, budgets):
            ids = torch.tensor([p] * M)
            generate(model, ids, torch.ones_like(ids), b, 1.0, eos, pad, generator=g, token_chunk=KNOBS.token_chunk)

    r = paired({"shared": shared, "body": lambda: shared(lean=False), "naive": naive}, repeats)
    torch.set_num_threads(threads)
    if not all(torch.equal(x, y) for a, b in zip(r["shared"]["out"], r["body"]["out"]) for x, y in zip(a, b)):
        raise AssertionError("value_continuations: the lean step drew other continuations than the body forward")
    fast, body, slow = r["shared"]["s"], r["body"]["s"], r["naive"]["s"]
    print(f"value_continuations: {len(prefixes)} prefixes x M={M} = {n} continuations, tiny-m float32, 1 thread; "
          f"median (min–max) of {repeats} alternating rounds\n"
          f"  shared-prefix batched, lean step     {spread([n / t for t in fast], fmt='.1f')} continuations/s\n"
          f"  shared-prefix batched, body modules  {spread([n / t for t in body], fmt='.1f')} continuations/s "
          "(before; the same continuations)\n"
          f"  generate per set                     {spread([n / t for t in slow], fmt='.1f')} continuations/s\n"
          f"  speed-up {spread(ratios(slow, fast), fmt='.1f')}x over generate per set, "
          f"{spread(ratios(body, fast), fmt='.2f')}x over the body modules")


def _copy_bandwidth(device) -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (GPU) or 256 MiB (CPU), read plus written."""
    n = (2 ** 30 if device == "cuda" else 2 ** 28) // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / scale._best(lambda: b.copy_(a), device, reps=5)


def _standin_model() -> str:
    """data/standins/model, built first on a fresh clone (cancellation.standins, without the slow
    paper-vocab model: about a minute on one core)."""
    root = standins.DEFAULT_DIR
    if not (root / "model" / "config.json").exists():
        print(f"sampler: building the stand-in model first ({root}; python -m cancellation.standins)", flush=True)
    return standins.ensure_model(root)


@bench
def sampler(device: str = "auto", shapes: str = "auto", compile: bool = True, eager_gpu: bool = False,
            dynamic: str = "all", repeats: int = 5, threads: int = 1):
    """Sampling tokens/s: ours (static KV cache; decode step captured as a CUDA graph on GPU) vs our eager
    DynamicCache loop vs transformers `generate` (dynamic cache; on GPU also static cache + torch.compile through
    `decode_hf.generate_transformers`, the call the notebooks make when gpu-check picks that path) vs
    the weight-read limit (parameter bytes over the device copy bandwidth measured here). GPU: Qwen3-1.7B's
    shape, bfloat16, random weights, 64 x 512 and 256 x 256 new tokens. CPU: `sampler_cpu` (the tiny
    policy in float64 and the stand-in in float32, ours = the lean step). No stop ids: every row runs to the cap.
    On a GPU the old eager loop is timed only with eager_gpu=True, and static + compile only at the
    first shape (each costs about a minute of device time). dynamic: the shapes ('64x512,...') at which
    transformers' dynamic-cache generate is timed, or 'all' (on an H100 it runs at ~430 tokens/s at
    64 x 512: 76 s a call). repeats, threads: `sampler_cpu`'s."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if device == "cpu":
        return sampler_cpu(shapes=shapes, repeats=repeats, threads=threads)
    model = scale.build("qwen3-1.7b", dtype=torch.bfloat16, device=device)
    dims = [(64, 512), (256, 256)]
    what = "Qwen3-1.7B shape, bfloat16, random weights"
    if shapes != "auto":
        dims = [tuple(int(x) for x in s.split("x")) for s in str(shapes).split(",")]
    model.eval()
    V = model.config.vocab_size
    bw = _copy_bandwidth(device)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = 64
    print(f"sampler: {what}, {device}; prompt {prompt} tokens; weight-read limit = rows / (parameter bytes "
          f"{param_bytes / 1e9:.3g} GB / copy bandwidth {bw / 1e12:.2f} TB/s measured here)")
    from transformers import GenerationConfig
    rows_out = []
    for rows, new in dims:
        g = torch.Generator(device=device).manual_seed(0)
        ids = torch.randint(0, V, (rows, prompt), generator=g, device=device)
        mask = torch.ones_like(ids)
        ours = lambda n=new: generate(model, ids, mask, n, 1.0, [-1], 0, generator=g, static=True,
                                       token_chunk=KNOBS.token_chunk)  # noqa: E731
        eager = lambda n=new: generate(model, ids, mask, n, 1.0, [-1], 0, generator=g, static=False,
                                        token_chunk=KNOBS.token_chunk)  # noqa: E731
        def hf(n=new):
            gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n,
                                  min_new_tokens=n, eos_token_id=None, pad_token_id=0)
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
        ways = {"ours (static cache" + (", CUDA graph)" if device == "cuda" else ", eager)"): ours}
        if device != "cuda" or eager_gpu:   # on an H100 the old loop runs at ~730 tok/s: 45 s a call
            ways["ours, eager DynamicCache (before)"] = eager
        if dynamic == "all" or f"{rows}x{new}" in str(dynamic).split(","):
            ways["transformers generate, dynamic cache"] = hf
        if device == "cuda" and compile and (rows, new) == dims[0]:  # first call compiles (about a minute)

            def hf_static(n=new):   # the notebooks' own call (prompts and rows bucketed as there): what auto picks
                return generate_transformers(model, ids, mask, n, 1.0, [-1], 0, generator=g)
            ways["transformers generate, static cache + torch.compile"] = hf_static
        tok = rows * new
        for name, fn in ways.items():
            if "eager" in name or "dynamic" in name:       # nothing to capture: warm up on 8 tokens, time once
                fn(n=8)
                first, steady = float("nan"), scale._timed(fn, device)[0]
            else:
                first = scale._timed(fn, device)[0]        # captures / compiles on its first call
                steady = scale._timed(fn, device)[0]
            rows_out.append((f"{rows} x {new}", name, tok / steady, first))
            print(f"  {rows} x {new}  {name}: {tok / steady:,.0f} tokens/s"
                  + ("" if first != first else f" (first call {first:.1f} s)"), flush=True)
        limit = rows / (param_bytes / bw)
        rows_out.append((f"{rows} x {new}", "weight-read limit", limit, float("nan")))
    width = max(len(r[1]) for r in rows_out)
    print(f"  {'rows x new':<11} {'way':<{width}} {'tokens/s':>10}  first call (s)")
    for d, name, tps, first in rows_out:
        f = "" if first != first else f"{first:.1f}"
        print(f"  {d:<11} {name:<{width}} {tps:>10,.0f}  {f}")
    for d in dict.fromkeys(r[0] for r in rows_out):
        r = {n: t for dd, n, t, _ in rows_out if dd == d}
        o = next(t for n, t in r.items() if n.startswith("ours (static"))
        parts = [f"ours / {label} {o / r[way]:.2f}x" for label, way in (
            ("transformers dynamic", "transformers generate, dynamic cache"),
            ("eager before", "ours, eager DynamicCache (before)"),
            ("static+compile", "transformers generate, static cache + torch.compile")) if way in r]
        print(f"  {d}: " + ", ".join(parts + [f"{100 * o / r['weight-read limit']:.1f}% of the weight-read limit"]))
    return rows_out


CPU_SHAPES = {   # name -> (policy, dtype, rows, new tokens); prompts as described in sampler_cpu
    "tiny": ("data/policies/tiny-m", "float64", 64, 96),        # 01-04, 08: batches from the float64 policy
    "tiny-f32": ("data/policies/tiny-m", "float32", 64, 96),    # 05, 06 (sample_dtype) and 07's runs sample in float32
    "stand-in": (None, "float32", 16, 64),
}


def _cpu_prompts(name, model, tok, rows):
    """The tiny profile's prompts (rendered problems, left-padded, 8 rollouts each, as an RB round of
    64 rollouts samples them) or, for the stand-in, random 64-token prompts (as before)."""
    if name.startswith("tiny"):
        problems = sources.ProblemSource().draw(rows // 8, 0)
        seqs = rollout.encode_prompts(tok, [sources.ProblemSource().render(p, tok) for p in problems])
        ids, mask = rollout._left_pad(seqs, tok.pad_token_id)
        return ids.repeat_interleave(8, 0), mask.repeat_interleave(8, 0)
    ids = torch.randint(0, model.config.vocab_size, (rows, 64), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def sampler_cpu(shapes: str = "auto", repeats: int = 5, threads: int = 1):
    """CPU sampling tokens/s at every shape, in one run: ours (`sampler.generate`: the lean decode step
    on a CPU), transformers' `generate` (dynamic cache, the same distribution: top_k 0, top_p 1) and our
    DynamicCache loop before the lean step. Shapes: the tiny policy (tiny-m) in float64 and in float32 (the
    copy 05, 06 and 07 sample from), 64 rows = 8 tiny prompts x 8, 96 new tokens (an RB round at the
    profile's cap), and the stand-in model in float32,
    16 x 64 new tokens after 64-token prompts. No stop ids: every row runs to the cap; then each shape with
    its stop ids (`_sampler_stops`: the live-rows lever on and off, transformers' generate). `threads` torch
    threads for every way (the notebooks sample on 1). Each way warms up once, then the ways alternate
    for `repeats` rounds (load drift on a shared machine hits them alike): median (min-max)."""
    from transformers import GenerationConfig
    names = list(CPU_SHAPES) if shapes == "auto" else str(shapes).split(",")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    print(f"sampler (CPU, {threads} thread{'s' * (threads != 1)}): tokens/s, median (min-max) of {repeats} "
          "alternating rounds after one warm-up call each; no stop ids (every row to the cap)")
    out = {}
    try:
        for name in names:
            path, dtype, rows, new = CPU_SHAPES[name]
            model, tok = policy.load_policy(path or _standin_model(), dtype=dtype)
            ids, mask = _cpu_prompts(name, model, tok, rows)
            g = torch.Generator()
            gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                  min_new_tokens=new, eos_token_id=None, pad_token_id=0)

            def ours(lean=True):
                return generate(model, ids, mask, new, 1.0, [-1], 0, generator=g.manual_seed(0), lean=lean,
                                token_chunk=KNOBS.token_chunk)
            ways = {"ours (lean step)": ours,
                    "transformers generate": lambda: model.generate(input_ids=ids, attention_mask=mask,
                                                                    generation_config=gc),
                    "ours before (DynamicCache loop)": lambda: ours(lean=False)}
            r = paired(ways, repeats)
            if not torch.equal(r["ours (lean step)"]["out"], r["ours before (DynamicCache loop)"]["out"]):
                raise AssertionError(f"sampler bench, {name}: the lean step drew other tokens than the loop before it")
            n = rows * new
            label = f"{name} ({Path(path).name + ' ' if path else ''}{dtype}), {rows} x {new}, prompt {ids.shape[1]}"
            print(f"  {label}")
            for way, res in r.items():
                print(f"    {way:<32} {spread([n / t for t in res['s']], fmt=',.0f')} tokens/s")
            ratio = ratios(r["transformers generate"]["s"], r["ours (lean step)"]["s"])
            vs_before = ratios(r["ours before (DynamicCache loop)"]["s"], r["ours (lean step)"]["s"])
            print(f"    ours / transformers generate {spread(ratio, fmt='.2f')}x   "
                  f"ours / before {spread(vs_before, fmt='.2f')}x", flush=True)
            out[name] = {way: [n / t for t in res["s"]] for way, res in r.items()} | {"ratio": ratio}
            out[name]["stops"] = _sampler_stops(name, model, tok, ids, mask, new, repeats)
    finally:
        torch.set_num_threads(before)
    return out


def _response_tokens(out: torch.Tensor, stop) -> int:
    """Tokens of (rows, T) new tokens up to and including each row's first stop id (rollout.assemble's rule)."""
    is_stop = torch.isin(out, torch.as_tensor(stop, dtype=out.dtype))
    return int(((is_stop.cumsum(1) - is_stop.long()) == 0).sum())


def _sampler_stops(name, model, tok, ids, mask, new, repeats) -> dict:
    """sampler_cpu's shape with the stop ids (rows stop as in a notebook, at most `new` tokens): ours with the
    live-rows lever (every op on the live rows: `generate_lean`, the CPU default) and without it (the rows
    that stopped leave the attention only), same tokens asserted, and transformers' `generate` with the same
    stop ids, seeded (it samples from torch's global generator). Tokens/s count each way's response tokens."""
    from transformers import GenerationConfig
    stop = rollout.stop_ids(tok, model)
    pad = rollout._pad_id(tok, stop)
    gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new, eos_token_id=stop,
                          pad_token_id=pad)

    def ours(live_rows=True):
        return generate_lean(model, ids, mask, new, 1.0, stop, pad, generator=torch.Generator().manual_seed(0),
                             token_chunk=KNOBS.token_chunk, live_rows=live_rows)

    def transformers_generate():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)[:, ids.shape[1]:]
    r = paired({"ours (live rows)": ours, "ours, all rows (before)": lambda: ours(False),
                "transformers generate": transformers_generate}, repeats)
    if not torch.equal(r["ours (live rows)"]["out"], r["ours, all rows (before)"]["out"]):
        raise AssertionError(f"sampler bench, {name}: the live-rows lever drew other tokens than the sampler "
                             "without it")
    tps = {way: [_response_tokens(res["out"], stop) / t for t in res["s"]] for way, res in r.items()}
    print(f"    with stop ids {stop} (at most {new} new tokens; response tokens/s):")
    for way, xs in tps.items():
        print(f"    {way:<32} {spread(xs, fmt=',.0f')} tokens/s")
    lever = ratios(r["ours, all rows (before)"]["s"], r["ours (live rows)"]["s"])
    vs_hf = ratios(tps["ours (live rows)"], tps["transformers generate"])
    print(f"    live rows / all rows {spread(lever, fmt='.2f')}x   "
          f"ours / transformers generate {spread(vs_hf, fmt='.2f')}x", flush=True)
    return tps | {"lever": lever, "ratio": vs_hf}


def bench_monitor(model_path="data/policies/tiny-s", steps: int = 4, n_prompts: int = 4, G: int = 4,
                  n_minibatches: int = 2, max_new_tokens: int = 24, repeats: int = 3, quiet: bool = False) -> dict:
    """Training time per optimizer step with the monitor on vs off (same run, same seed; a fresh
    policy each run), timed with `paired`. Prints and returns per-round lists {'off_s', 'on_s',
    'ratio', 'monitor_s'} (per step; `monitor_s` is the monitor's own time). Generation is
    included in the step time, as it is in a real run."""
    import tempfile

    monitor_s = []

    def run(on):
        def go():
            model, tok = policy.load_policy(model_path)
            with tempfile.TemporaryDirectory() as d:
                t = time.perf_counter()
                out = engine.train_trl(model_path, sources.ProblemSource(), "random", output_dir=d,
                                       iterations=steps // n_minibatches, n_prompts=n_prompts, G=G,
                                       n_minibatches=n_minibatches, max_new_tokens=max_new_tokens, monitor=on,
                                       model=model, tokenizer=tok)
                dt = time.perf_counter() - t
            if on:
                monitor_s.append(out["monitor_callback"].seconds / steps)
            return dt / steps
        return go

    r = paired({"off": run(False), "on": run(True)}, repeats)
    res = {"off_s": [x / steps for x in r["off"]["s"]], "on_s": [x / steps for x in r["on"]["s"]],
           "monitor_s": monitor_s[1:]}   # [0]: the warm-up run
    res["ratio"] = ratios(res["on_s"], res["off_s"])
    if not quiet:
        print(f"monitor: TRL GRPO step (tiny policy, {n_prompts}x{G} rollouts, {n_minibatches} mini-batches, "
              f"{steps} steps); median (min–max) of {repeats} alternating rounds\n"
              f"  monitor off {spread(res['off_s'])} s/step\n  monitor on  {spread(res['on_s'])} s/step\n"
              f"  ratio on/off {spread(res['ratio'], fmt='.2f')}   (monitor's own time "
              f"{spread(res['monitor_s'])} s/step)")
    return res


@bench
def monitor(**kw):
    """CancellationMonitor on a TRL run: time per optimizer step with the monitor on vs off."""
    bench_monitor(**kw)


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
