"""The pinned sampler stream: the token ids a fixed set of sampling calls draws, one case per entry.

The committed tiny tables depend on exactly these draws (same seeds, same tokens), so a speed-up of
the sampler must reproduce them token for token. `python -m tests.golden.sampler_stream --write`
re-pins tests/golden/sampler_stream.json from the current code: only in a commit that says why the
stream moved (and regenerates every committed table with it). One CPU thread, as the notebooks run.

Machine classes. The pins were drawn on a 2-core AMD EPYC whose ATen and MKL took their AVX-512 paths
(class `x86_64 AVX512 AuthenticAMD`).
Another code path rounds float32 matmuls differently, and a draw that sits near a tie can flip: on an
AVX2-only EPYC (2026-11-27) the two padded stand-in float32 cases drew other tokens (a first draw between
two tokens at p = 0.45 and 0.42), every other case the same, and the lean step still drew the loop's
tokens there. `sampler_stream_machines.json` holds, per machine class (`machine_class()`: the
architecture and ATen's CPU capability), the cases whose tokens differ on that class, drawn by the code
that drew the main pins. `--write-machine` adds this machine's class from the current code: run it only
from a commit whose stream is unchanged on the main pins' class (say so in the commit).
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import torch

from cancellation import policy, rollout, sampler, sources, value
from cancellation.compute import Compute

KNOBS = Compute()   # the default memory knobs, passed whole to every model call

PINS = Path(__file__).with_name("sampler_stream.json")
MACHINE_PINS = Path(__file__).with_name("sampler_stream_machines.json")   # class -> {case: tokens} that differ
ROOT = Path(__file__).resolve().parents[2]
TINY_M, TINY_S, STANDIN = (str(ROOT / p) for p in ("data/policies/tiny-m", "data/policies/tiny-s",
                                                     "data/standins/model"))


def _load(path, dtype):
    return policy.load_policy(path, dtype=dtype)


def _batch(model, tok, seed, **cfg):
    """`rollout.sample`'s tokens (prompt ids and responses) for one SampleConfig, as the notebooks call it."""
    c = rollout.SampleConfig(source=sources.ProblemSource(), **cfg)
    b = rollout.sample(model, tok, c, seed=seed)
    return b.input_ids.tolist()


def _random_prompts(V, rows, P, seed, pad=True):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (rows, P), generator=g)
    mask = torch.ones_like(ids)
    if pad:   # left padding on every third row (no padding: attention runs without a mask)
        mask[1::3, : P // 2] = 0
        ids[1::3, : P // 2] = 0
    return ids, mask


def cases() -> dict:
    """name -> zero-argument callable returning the case's token ids (nested lists)."""
    out = {}
    for seed in (0, 202):   # 01's rounds and 02/08's batch seed
        out[f"tiny-m f64 sample T=1 seed={seed}"] = lambda s=seed: _batch(
            *_load(TINY_M, "float64"), s, n_prompts=6, G=8, temperature=1.0, max_new_tokens=96)
    # several sampler calls sharing one generator (chunk_size < rows)
    out["tiny-m f64 sample chunk_size=16"] = lambda: _batch(
        *_load(TINY_M, "float64"), 303, n_prompts=4, G=8, temperature=1.0, max_new_tokens=96, chunk_size=16)
    # tiny.sampled_accuracy's near-greedy temperature
    out["tiny-m f64 sample T=1e-4"] = lambda: _batch(
        *_load(TINY_M, "float64"), 5, n_prompts=16, G=1, temperature=1e-4, max_new_tokens=96)
    out["tiny-s f64 sample T=1 seed=7"] = lambda: _batch(
        *_load(TINY_S, "float64"), 7, n_prompts=6, G=8, temperature=1.0, max_new_tokens=96)
    out["tiny-m f32 sample T=1 seed=11"] = lambda: _batch(
        *_load(TINY_M, "float32"), 11, n_prompts=4, G=8, temperature=1.0, max_new_tokens=96)
    out["tiny-m f64 sample T=0.7 seed=13"] = lambda: _batch(
        *_load(TINY_M, "float64"), 13, n_prompts=4, G=8, temperature=0.7, max_new_tokens=48)

    def continuations():
        """value.sample_continuations (generate_static, inverse-CDF draws, repeats, budgets, bans)."""
        model, tok = _load(TINY_M, "float64")
        prefixes = [tok(sources.ProblemSource().render(p, tok), add_special_tokens=False)["input_ids"]
                    for p in sources.ProblemSource().draw(3, 9)]
        prefixes = [p + [5, 7][: i] for i, p in enumerate(prefixes)]
        outs = value.sample_continuations(model, prefixes, M=6, budgets=[30, 12, 40], eos_id=rollout.stop_ids(tok, model),
                                          pad_id=tok.pad_token_id, seeds=[1, 2, 3], bans=[None, 4, 6],
                                          token_chunk=KNOBS.token_chunk)
        return [o.tolist() for o in outs]
    out["tiny-m f64 continuations M=6"] = continuations

    for seed in (0, 1):
        def standin(s=seed):
            model, tok = _load(STANDIN, "float32")
            ids, mask = _random_prompts(model.config.vocab_size, 8, 16, s)
            g = torch.Generator().manual_seed(s)
            return sampler.generate(model, ids, mask, 40, 1.0, rollout.stop_ids(tok, model), 0, generator=g,
                                    token_chunk=KNOBS.token_chunk).tolist()
        out[f"stand-in f32 generate seed={seed}"] = standin
    # the bench's call: no stop ids, every row to the cap, the static-cache path eagerly
    out["stand-in f32 generate static=True no stop"] = lambda: sampler.generate(
        _load(STANDIN, "float32")[0], *_random_prompts(1088, 16, 24, 2), 24, 1.0, [-1], 0,
        generator=torch.Generator().manual_seed(2), static=True, token_chunk=KNOBS.token_chunk).tolist()
    # prompts of one length: no attention mask at all (and SDPA's grouped-query path on the stand-in)
    for path, dtype, V in ((TINY_M, "float64", 53), (STANDIN, "float32", 1088)):
        for static in (False, True):
            out[f"{Path(path).name} {dtype} unpadded static={static}"] = lambda p=path, d=dtype, v=V, st=static: \
                sampler.generate(_load(p, d)[0], *_random_prompts(v, 12, 10, 4, pad=False), 30, 1.0, [1, 1000], 0,
                                 generator=torch.Generator().manual_seed(4), static=st,
                                 token_chunk=KNOBS.token_chunk).tolist()
    return out


def cpu_vendor() -> str:
    """The CPU's vendor id (GenuineIntel, AuthenticAMD, ...; '' where /proc/cpuinfo has none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_class() -> str:
    """What decides the kernels' code paths here: the architecture, ATen's CPU capability and the CPU's
    vendor. The vendor counts: MKL picks its code paths by vendor as well as by instruction set, and an Intel
    Xeon with AVX-512 (2026-12-06) drew other tokens than the AMD EPYC with AVX-512 that drew the main pins,
    in the three padded or unmasked stand-in float32 cases, from the same code (the stream of the code before
    that day, rerun there, was the same)."""
    vendor = cpu_vendor()
    return f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}" + (f" {vendor}" if vendor else "")


def pins() -> dict:
    """case -> pinned tokens for this machine: the main pins, with this machine class's own where they differ."""
    main = json.loads(PINS.read_text())
    own = json.loads(MACHINE_PINS.read_text()).get(machine_class(), {}) if MACHINE_PINS.exists() else {}
    return main | own


def compute() -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: fn() for name, fn in cases().items()}
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    if "--write" in sys.argv:
        PINS.write_text(json.dumps(compute(), separators=(",", ":")) + "\n")
        print(f"wrote {PINS}")
    elif "--write-machine" in sys.argv:
        main, got = json.loads(PINS.read_text()), compute()
        table = json.loads(MACHINE_PINS.read_text()) if MACHINE_PINS.exists() else {}
        table[machine_class()] = {k: v for k, v in got.items() if v != main[k]}
        MACHINE_PINS.write_text(json.dumps(table, separators=(",", ":")) + "\n")
        print(f"wrote {MACHINE_PINS}: {machine_class()}: {sorted(table[machine_class()])} differ from the main pins")
    else:
        sys.exit("usage: python -m tests.golden.sampler_stream --write | --write-machine   (re-pins the sampler "
                 "stream | this machine class's cases that differ from it)")
