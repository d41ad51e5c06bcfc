"""`make bench`'s benchmarks of the measurements: token statistics and GRPO steps (`token_stats`, `trim`, `pack`),
notebook 04's updates and its sign-shuffle null (`trials`, `thesis_null`), `--procs` ranks (`procs04`, `procs01`),
Fig. 4's tagging, the grader, the coupling kernel, the memory of the token chunks and the masking shortcut. Each
against its naive way, in the same run (`bench_timing.paired`); `python -m cancellation.bench NAME` runs one.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from . import cache, coupling, extract, grpo, measure, policy, procs, rollout, scale, seeds, tasks, thesis, train
from . import categories as C
from .bench_timing import KNOBS, RAW, bench, paired, peak_rss, policy_batch, ratios, spread
from .compute import Compute
from .figures import fig01, fig04
from .grader import MathVerifier   # by name: this module's `grader` is a bench
from .pack import padded


@bench
def token_stats(n_prompts: int = 16, G: int = 8, repeats: int = 3):
    """Token log-probs/entropies of a batch: batched forward (row chunks) vs one forward per sequence."""
    model, _, batch = policy_batch(n_prompts, G)
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
    model, _, batch = policy_batch(n_prompts, G)
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
    scfg = fig01.run_config(P, fig01.base.problem_source(P)).sample_config()   # its rounds' SampleConfig
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
            fig04.thesis_updates(P, b, t, df, bseed)
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
    res = _one_vs_ranks("procs04", lambda: tables(fig04.policy_loader(P)), ranks, n, repeats)
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
    _, t_big, m_big = peak_rss(lambda: coupling.kernel_matvec(f, a, chunk=1024))
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
