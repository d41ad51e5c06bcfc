"""`make bench`'s benchmarks of sampling: the Monte Carlo continuations (`value_continuations`), the sampler's
tokens/s against transformers' `generate` and the weight-read limit (`sampler`; on a CPU `sampler_cpu`, with the
stop ids `sampler_stops`), and a TRL run with the monitor on and off (`monitor`, its steps sample). Timed as
`bench_timing.paired` times; `python -m cancellation.bench NAME` runs one.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from . import engine, policy, rollout, scale, sources, standins, value
from .bench_timing import KNOBS, bench, paired, policy_batch, ratios, spread
from .decode_hf import generate_transformers
from .decode_lean import generate_lean
from .sampler import generate


@bench
def value_continuations(n_prompts: int = 4, G: int = 4, M: int = 16, repeats: int = 3):
    """Monte Carlo continuations (value.py): shared-prefix batched sampling (the lean decode step; and
    through the body's modules, as before it) vs `generate` per continuation set."""
    model, tok, batch = policy_batch(n_prompts=n_prompts, G=G, dtype="float32")
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
    return 2 * a.numel() * 4 / scale.best_time(lambda: b.copy_(a), device, reps=5)


def standin_model() -> str:
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
                first, steady = float("nan"), scale.timed(fn, device)[0]
            else:
                first = scale.timed(fn, device)[0]        # captures / compiles on its first call
                steady = scale.timed(fn, device)[0]
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


def cpu_prompts(name, model, tok, rows):
    """The tiny profile's prompts (rendered problems, left-padded, 8 rollouts each, as an RB round of
    64 rollouts samples them) or, for the stand-in, random 64-token prompts (as before)."""
    if name.startswith("tiny"):
        problems = sources.ProblemSource().draw(rows // 8, 0)
        seqs = rollout.encode_prompts(tok, [sources.ProblemSource().render(p, tok) for p in problems])
        ids, mask = rollout.left_pad(seqs, tok.pad_token_id)
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
            model, tok = policy.load_policy(path or standin_model(), dtype=dtype)
            ids, mask = cpu_prompts(name, model, tok, rows)
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
    pad = rollout.pad_token_id(tok, stop)
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
