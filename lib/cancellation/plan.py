"""The planner: each notebook's peak accelerator memory and wall time, before anything runs.

A plan is (what the notebook runs) x (what each building block costs on this device):

- `workload(P, shape, lengths)`, each figure module's own (the manifest names the module) (declared beside its
  `compute`, from `cancellation.workload`'s blocks), counts the building blocks a notebook runs at its Params (approximations are stated where they are made):
  positions through analysis forwards, full-parameter and lm_head steps, sampled rows and
  tokens, pairs of the coupling kernel, per-token full gradients, and the largest batch.
- `Shape` is the model's architecture from its `config.json` (parameter count in closed form).
- Unit costs are *measured*, never typed here: `python -m cancellation.scale --out
  data/scale/<device kind>.json` times each block at one shape and records seconds per
  parameter-token (and per call), so `seconds = unit x tokens x parameters + per-call x calls`
  transfers across shapes. Without a file for the device kind the plan gives memory only and
  names the command that measures it.
- Memory is closed forms of the shape and the Compute knobs: weights, gradients and Adam state
  by dtype, activations (one layer's working set under gradient checkpointing, every layer's
  without), the (token_chunk, V) logits chunk, the sampler's KV cache, vLLM's share.

On CUDA the peak is what the first GPU holds (`card_terms`): beside those terms, a CUDA context per process on
it (the kernel's; with --procs N rank 0's, and its isolated child's), and rank 0's float policy beside its
sampler. With --procs N each process's time adds every fan-out's launch, model load and vLLM engine start
(`fan_out_seconds`). A notebook whose newest committed dry run on this device kind (data/scale/measured/)
measured above its plan carries that factor (`measured.measured_factor`) until a newer dry run replaces it.

`check(plans, device)` turns a plan over the device's memory into one error line naming the
knob to turn; the runner refuses to start on it (exit 2) unless --no-plan-check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import manifest, measured, sources, tasks
from . import workload as W
from .policy import TOKENIZER_FILES, load_tokenizer
from .procs import BUILT, FAN_OUTS, ISOLATED, POLICY_RANKS, WHOLE_RUNS
from .profiles import INJECTED
from .decode_common import bucket_rows
from .shapes import Shape, device_kind, device_memory, known_shape
from .standins import build_tokenizer
from .workload import BYTES, Sizes, Work, ceil

ROOT = Path(__file__).resolve().parents[2]
GiB = 2 ** 30


# ----------------------------------------------------------------------------- the model's shape
class ConfigError(ValueError):
    """A model's config.json that cannot shape a plan: unreadable, not a JSON object, or a size field
    missing, of the wrong type or not positive. One line naming the file (and the field and value)."""


_SIZE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
_OPTIONAL_SIZE_FIELDS = ("num_key_value_heads", "head_dim")


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def read_config(path: str | Path) -> dict:
    """A config.json as a dict whose size fields are positive integers; ConfigError naming the file otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the model's config.json ({type(e).__name__}: {e})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: the model's config.json is not valid JSON ({e.msg} at line {e.lineno} column "
                          f"{e.colno}); a truncated or corrupt download? fetch the model again") from None
    except RecursionError:
        raise ConfigError(f"{path}: the model's config.json is nested too deeply to read") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: the model's config.json holds a JSON {type(cfg).__name__}, not an object of "
                          "model settings")
    for k in _SIZE_FIELDS:
        if k not in cfg:
            raise ConfigError(f"{path}: the model's config.json has no {k} (a Qwen2/Qwen3/Llama-style decoder "
                              f"config has {', '.join(_SIZE_FIELDS)})")
    for k in _SIZE_FIELDS + _OPTIONAL_SIZE_FIELDS:
        v = cfg.get(k)
        if (k in _SIZE_FIELDS or v is not None) and not _positive_int(v):
            raise ConfigError(f"{path}: {k} is {json.dumps(v)[:60]} in the model's config.json; expected a positive "
                              "integer")
    return cfg


def shape_of(model_path: str, root: Path = ROOT) -> Shape | None:
    """The shape of a local model directory, a hub model in the local HF cache, or a paper model by
    name; None when nothing says (the plan then gives no numbers)."""
    p = Path(os.path.expanduser(str(model_path)))
    p = p if p.is_absolute() else root / p
    if (p / "config.json").is_file():
        return Shape.from_config(read_config(p / "config.json"), str(p / "config.json"))
    try:  # a hub name already in the HF cache (never downloads)
        from huggingface_hub import try_to_load_from_cache
        hit = try_to_load_from_cache(str(model_path), "config.json")
    except Exception:  # noqa: BLE001 - no hub library, a malformed name: fall through
        hit = None
    if isinstance(hit, str):
        return Shape.from_config(read_config(hit), hit)
    kw = known_shape(model_path)
    if kw:
        kw = dict(kw)
        arch = kw.pop("arch")
        return Shape.from_config({**kw, "model_type": arch}, f"cancellation.scale.SHAPES ({model_path})")
    return None


# ----------------------------------------------------------------------------- lengths
def _local(path: str, root: Path = ROOT) -> str:
    """A path as the notebooks resolve it (they run in the repository), or a hub name as is."""
    p = Path(os.path.expanduser(str(path)))
    return str(p if p.is_absolute() or not (root / p).exists() else root / p)


def tokenizer_for(model_path: str):
    """The model's tokenizer; under a dry run without one, the stand-in tokenizer (policy.load_tokenizer)."""
    if Path(model_path).is_dir() and not any((Path(model_path) / f).exists() for f in TOKENIZER_FILES):
        return build_tokenizer()
    if not Path(model_path).is_dir():  # a hub name: only a tokenizer already in the HF cache (never the network)
        from huggingface_hub import try_to_load_from_cache
        if not isinstance(try_to_load_from_cache(str(model_path), "tokenizer_config.json"), str):
            raise FileNotFoundError(f"{model_path}: no tokenizer here (not a directory, not in the HF cache)")
    return load_tokenizer(model_path)


DEFAULT_PROMPT = {"generated": 48, "file": 256}  # only when the tokenizer or the file cannot be read


def prompt_lengths(P, root: Path = ROOT) -> tuple[int, int, str]:
    """(mean, max) prompt tokens of the notebook's problems, rendered as its runs render them (first
    512 problems of a file; 256 generated ones), and how they were found."""
    path = P.problems_path
    try:
        tok = tokenizer_for(_local(P.model_path, root))
        src = sources.ProblemSource(path=_local(path, root) if path else "", prompt_format=P.prompt_format)
        probs = src.load()[:512] if path else tasks.sample_problems(256, seed=0)
        n = [len(tok(src.render(p, tok), add_special_tokens=False)["input_ids"]) for p in probs]
        return int(round(sum(n) / len(n))), max(n), "tokenized"
    except Exception:  # noqa: BLE001 - a hub tokenizer not cached, a missing file: a stated default
        d = DEFAULT_PROMPT["file" if path else "generated"]
        return d, d, "default (tokenizer or problems not readable here)"


# ----------------------------------------------------------------------------- the HF sampler's calls
CALLS_SHAPE = "data/shapes/qwen3-1.7b-base"   # the architecture a workload is counted at when P.model_path has none here
_recording = threading.RLock()


@contextmanager
def recorded_samples():
    """Every `workload.sample` call this thread makes inside, as a list of (rows, chunk_rows_decode, times, Sizes).

    The figures' workloads call `W.sample(...)` through the module (and `workload.delta_run` its own `sample`), and
    a Work keeps only the sums of its blocks, so the calls are seen where they are made: `workload.sample` is
    replaced, for the `with` block only, by a wrapper that records the calls of this thread and passes every call
    (any thread's) to the real function unchanged -- what the planner counts stays as it was, and another thread
    planning meanwhile is neither recorded nor changed. A lock makes recorders take turns (a nested one, in the
    same thread, wraps the outer), and the real function is put back on any exit. (Cleaner, and left for
    workload.py's owner: `workload.sample` appending its arguments to the Work it is given.)"""
    with _recording:
        real, me, seen = W.sample, threading.get_ident(), []

        def record(w, rows, z, chunk_rows_decode=None, times=1):
            if threading.get_ident() == me:
                seen.append((int(rows), chunk_rows_decode, int(times), z))
            return real(w, rows, z, chunk_rows_decode=chunk_rows_decode, times=times)
        W.sample = record
        try:
            yield seen
        finally:
            W.sample = real


def sampling_calls(P, prompt: int | None = None) -> list[dict]:
    """A notebook's HF sampler calls at its Params `P` (a figure's Params), from its figure's planner workload
    (`workload(P, shape, sizes)`: every `workload.sample` it counts, `recorded_samples`; Monte Carlo continuations
    left out -- those whose rows per call are P.rows_per_chunk: they stay on ours). Each counted sample of R rows,
    rows per call c (its chunk_rows_decode, else R) and `times` makes times x R // c calls of c rows and one of
    R % c; calls are grouped by the sampler's row bucket (`decode_common.bucket_rows`: both paths pad rows to it) and new
    tokens. `prompt`: the longest prompt in tokens (default: `prompt_lengths`, the notebook's problems rendered and
    tokenized). Returns [{"rows", "new", "prompt", "calls"}], largest first: what `sampling_path.choose` costs
    (`FigureParams.hf_path` on a CUDA card; gpu-check's sampler step measures at these shapes). One compile (ours:
    one capture) per shape is counted: batches whose longest prompts fall in other buckets compile again, so
    transformers' count is a lower bound."""
    mod = sys.modules[type(P).__module__]   # the figure module of these Params: its planner workload
    shape = shape_of(P.model_path) or shape_of(str(ROOT / CALLS_SHAPE))
    if prompt is None:
        prompt = prompt_lengths(P)[1]
    z = Sizes(prompt, prompt, P.max_new_tokens)
    cont = getattr(P, "rows_per_chunk", None)
    with recorded_samples() as seen:
        mod.workload(P, shape, z)
    out: dict = {}
    for rows, chunk, times, zz in seen:
        if rows <= 0 or (cont is not None and chunk == cont and chunk != W.sample_rows(P)):
            continue
        per = min(rows, int(chunk or rows))
        full, rest = divmod(rows, per)
        for r, n in ((per, full * times), (rest, times if rest else 0)):
            if n:
                key = (bucket_rows(r), int(zz.new))
                out[key] = out.get(key, 0) + n
    return [dict(rows=r, new=new, prompt=int(prompt), calls=n) for (r, new), n in
            sorted(out.items(), key=lambda kv: -kv[0][0] * kv[0][1])]



# What to turn when a term is too big (named in the refusal)
KNOBS = {"weights": "dtype (a smaller model_path)", "grads": "dtype", "adam": "dtype (or an lm_head-scope notebook)",
         "activations": "chunk_rows, gradient_checkpointing", "logits": "token_chunk",
         "kv_cache": "n_prompts / G, max_new_tokens (rows_per_chunk for continuations)",
         "extra": "grad_chunk / n_full_tokens / n_prompts / G", "vllm": "gpu_memory_utilization",
         "ranks": "gpu_memory_utilization / sample_dtype (rank 0's sampler shares GPU 0 with the kernel), or --procs 1",
         "cuda_contexts": "--procs 1 (each process on GPU 0 holds a CUDA context)",
         "rank0_policy": "dtype (rank 0's float policy beside its sampler on GPU 0), or --procs 1"}


# ----------------------------------------------------------------------------- memory
def memory(P, shape: Shape, w: Work, device_total: int | None = None) -> dict:
    """Peak accelerator bytes by term (closed forms of the shape, the dtypes and the knobs)."""
    b = BYTES[P.dtype]
    cr = min(P.chunk_rows, max(w.largest[0], 1))
    L = max(w.largest[1], 1)
    ckpt = bool(getattr(P, "gradient_checkpointing", False))
    d, hd = shape.hidden, shape.head_dim
    # one layer's working set per row and position: its input, q/k/v/o, the MLP's three
    # intermediates, norms; attention scores (H x L per position) as eager attention would hold them
    per_layer = cr * L * (4 * d + (shape.heads + 2 * shape.kv_heads) * hd + 3 * shape.intermediate) * b \
        + cr * shape.heads * L * L * b
    kept = cr * L * d * b * shape.layers if ckpt else per_layer * shape.layers  # what the backward needs
    if not w.full_grads:  # lm_head-only steps: the frozen body runs without a graph, nothing is kept
        kept = 0
    terms = {
        "weights": shape.params * b,
        "grads": (shape.params if w.full_grads else shape.head) * b,
        "adam": 2 * shape.params * b if w.adam else 0,
        "activations": kept + per_layer,
        # logits, log-softmax and its gradient of one token chunk
        "logits": 3 * min(P.token_chunk, max(w.largest[0] * L, 1)) * shape.vocab * b,
        "kv_cache": w.kv_rows * w.kv_len * shape.layers * 2 * shape.kv_heads * hd
        * BYTES[getattr(P, "sample_dtype", "") or P.dtype],
        "extra": w.extra_bytes,
    }
    if getattr(P, "backend", "hf") == "vllm":
        terms["kv_cache"] = 0                        # vLLM's KV cache lives in its own share
        terms["vllm"] = int(P.gpu_memory_utilization * device_total) if device_total else 0
    return terms


# A block a device kind's file has no measurement for (TRL's, measured on the CPU stand-ins only so far)
# is timed with the unit of the block it stands in for, and the plan says so; one with no stand-in is
# left out of the time, and the plan says that too (`unmeasured`): never a number typed here.
STAND_IN_UNITS = {"trl_generate": "sample", "trl_logp": "analysis", "trl_step": "full_step"}
ADAM_BLOCKS = ("full_step", "trl_step")   # blocks whose `steps` are Adam updates of every parameter


def unmeasured(blocks: dict, u: dict) -> dict:
    """The blocks of a Work this device's units do not measure: block -> the block whose unit times it
    instead, or None (left out of the time)."""
    return {name: (STAND_IN_UNITS.get(name) if STAND_IN_UNITS.get(name) in u else None)
            for name in blocks if name not in u}


def _block_seconds(blocks: dict, shape: Shape, u: dict) -> dict:
    out = {}
    stand_in = unmeasured(blocks, u)
    for name, b in blocks.items():
        if name == "kernel":
            out[name] = u["kernel"]["s_per_pair_vocab"] * b["pairs"] + u["kernel"]["s_per_call"] * b["calls"]
            continue
        if name in stand_in and stand_in[name] is None:
            continue
        unit = u[stand_in.get(name) or name]
        t = unit["s_per_param_token"] * (b["positions"] * shape.body + b["head"] * shape.head)
        t += unit["s_per_call"] * b["calls"]
        if name in ADAM_BLOCKS:
            t += u["adam_update"]["s_per_param"] * shape.params * b["steps"]
        out[name] = t
    return out


def seconds(w: Work, shape: Shape, units: dict) -> tuple[float, dict]:
    """Predicted wall time and its share per block: the notebook's start (kernel, imports, plots:
    measured once per device) plus, per block, unit x parameter-tokens + per-call x calls
    (+ Adam's per-parameter update per optimizer step). A block the device's units lack is timed by
    its stand-in's unit or left out (`unmeasured`; the plan's lines name both)."""
    u = units["units"]
    out = {"start": u["start"]["seconds"], **_block_seconds(w.blocks, shape, u)}
    return sum(out.values()), out


def seconds_per_process(w: Work, shape: Shape, units: dict, procs: int, stem: str | None = None) -> float:
    """Wall time of each of `procs` processes (one per device) when they divide the work's splittable
    parts (`Work.split`: ceil(units / procs) of each part's units apiece); the start, every other block
    and (with `stem`) every part whose split is not built yet (`procs.BUILT`) run in full on one process."""
    total, _ = seconds(w, shape, units)
    for part in w.parts:
        if stem is not None and (stem, part["what"]) not in BUILT:
            continue   # planned, not split yet: one process does it all
        t = sum(_block_seconds(part["blocks"], shape, units["units"]).values())
        n = part["units"]
        total -= t * (1 - ceil(n, procs) / n)
    return total


def rank_memory(P, shape: Shape, mem: dict, procs: int, whole: bool = False) -> int:
    """What the ranks of a fanned-out stage (procs.fan_out) add beside the kernel's own models: each rank
    rebuilds the sampler: the weights in the sampling dtype and its KV cache, or with vLLM its own engine's
    share (gpu_memory_utilization of the device, its weights inside). On CUDA a rank has a GPU to itself,
    but rank 0 shares the first with the kernel: the peak there is the kernel's plus rank 0's one copy. On
    the CPU every rank shares the host's memory: procs copies. `whole` (procs.WHOLE_RUNS: 01's runs, 04's
    batches, 07's TRL runs): each rank does whole units, each as the one-process plan does, while the kernel
    holds no model: nothing more on a GPU, procs - 1 more units side by side on the CPU."""
    cuda = str(P.device).startswith("cuda")
    if whole:
        return 0 if cuda else (procs - 1) * sum(mem.values())
    copy = mem["vllm"] if "vllm" in mem else \
        shape.params * BYTES[getattr(P, "sample_dtype", "") or P.dtype] + mem.get("kv_cache", 0)
    return copy * (1 if cuda else procs)


# A CUDA context: what a process holds on a GPU before its first tensor (the driver's state, the kernels it loads,
# cuBLAS handles), outside torch's allocator, so outside every term of `memory` and of a dry run's measured peak
# (torch.cuda.max_memory_allocated). About 300-400 MB with CUDA >= 11.7's lazy module loading, PyTorch's default
# (PyTorch's maintainers in pytorch/pytorch#107667 and #109888), more on cards with more SMs; 0.5 GiB here, for the
# cuBLAS workspace and NCCL's buffers a rank adds: a stated estimate until a device kind's scale file records a
# measured `cuda_context_bytes` (torch.cuda.mem_get_info before and after the first CUDA call), which replaces it.
CUDA_CONTEXT = GiB // 2


def context_bytes(units: dict | None) -> tuple[int, str]:
    """(bytes of one CUDA context, where the number comes from): the kind's measured `cuda_context_bytes`, else
    CUDA_CONTEXT."""
    if units and units.get("cuda_context_bytes"):
        return int(units["cuda_context_bytes"]), "measured"
    return CUDA_CONTEXT, "estimate"


def _fanned(stem: str, w: Work, procs: int) -> list[dict]:
    """The parts of `w` that --procs really divides (procs.BUILT), when procs > 1."""
    return [p for p in w.parts if (stem, p["what"]) in BUILT] if procs > 1 else []


def _isolated(stem: str, P) -> bool:
    field_, value = ISOLATED.get(stem, (None, None))
    return field_ is not None and getattr(P, field_, None) == value


def card_terms(P, shape: Shape, w: Work, mem: dict, procs: int, stem: str, context: int = CUDA_CONTEXT) -> dict:
    """What the first GPU holds beyond `memory`'s terms and `rank_memory`'s copy, on CUDA (nothing on a CPU):

    - cuda_contexts: one CUDA context per process on it: the kernel's; with a built split over procs > 1 rank 0's,
      and the child rank 0 runs an isolated unit in (procs.ISOLATED: 07's TRL runs, 01's vLLM runs);
    - rank0_policy: rank 0's float policy (P.dtype) beside the sampler `rank_memory` counts, where the ranks rebuild
      the sampler (sampler.load_sampler: the policy first): with vLLM the engine keeps it as its hf_model; with the
      HF sampler it is there until cast to sample_dtype, before the KV cache (max(float - KV, 0) more); where the
      ranks take GRPO steps (procs.POLICY_RANKS: 06's settings x seeds), rank 0 holds the policy, its gradients,
      activations and logits instead of the sampler: what that adds to the copy. The largest over the fanned parts
      (they run one after another). Whole-run notebooks (procs.WHOLE_RUNS): rank 0 is the one-process plan."""
    if not str(P.device).startswith("cuda"):
        return {}
    parts = _fanned(stem, w, procs)
    out = {"cuda_contexts": context * (1 + (1 if parts else 0) + (1 if parts and _isolated(stem, P) else 0))}
    if parts and stem not in WHOLE_RUNS:
        b = BYTES[P.dtype]
        policy = shape.params * b
        extra = 0
        for part in parts:
            if (stem, part["what"]) in POLICY_RANKS:   # an SGD step of every parameter from the rebuilt policy
                need = policy + shape.params * b + mem.get("activations", 0) + mem.get("logits", 0) - mem.get("ranks", 0)
            elif getattr(P, "backend", "hf") == "vllm":
                need = policy
            else:
                need = max(policy - mem.get("kv_cache", 0), 0)
            extra = max(extra, need)
        if extra > 0:
            out["rank0_policy"] = int(extra)
    return out


# ----------------------------------------------------------------------------- a fan-out's start (per process)
# Per fan_out call (procs.FAN_OUTS), every rank pays, before its first unit: the launcher and its interpreter with
# the imports (`launch`), the policy's load onto its device (`load`) and with vLLM the engine's start (`engine`).
# From the device kind's units where they measure them (`launch` {seconds}, `load` {s_per_byte}, `vllm_engine`
# {seconds}); `launch` without its own entry is the kind's measured notebook `start` (a fresh interpreter importing
# torch, transformers and ours, as a rank does); else these stated estimates:
LOAD_BYTES_PER_S = 1e9   # the policy's weights (P.dtype) read and placed at 1 GB/s (from the page cache: the kernel read them)
VLLM_ENGINE_S = 60.0     # vllm.LLM at ~2B parameters: weights, the profile run, torch.compile and CUDA-graph capture


def fan_out_costs(P, shape: Shape, units: dict) -> dict:
    """Each cost a rank pays per fan-out: name -> (seconds, where it comes from); `engine` only with vLLM (and
    paid only by fan-outs whose ranks build a sampler or whole runs: not procs.POLICY_RANKS')."""
    u = units["units"]
    out = {}
    if "launch" in u:
        out["launch"] = (u["launch"]["seconds"], "measured")
    else:
        out["launch"] = (u["start"]["seconds"], "measured notebook start")
    nbytes = shape.params * BYTES[P.dtype]
    out["load"] = (u["load"]["s_per_byte"] * nbytes, "measured") if "load" in u else \
        (nbytes / LOAD_BYTES_PER_S, f"estimate: {nbytes / 1e9:.1f} GB at {LOAD_BYTES_PER_S / 1e9:.0f} GB/s")
    if getattr(P, "backend", "hf") == "vllm":
        out["engine"] = (u["vllm_engine"]["seconds"], "measured") if "vllm_engine" in u else (VLLM_ENGINE_S, "estimate")
    return out


def fan_outs(stem: str, P, w: Work, procs: int) -> tuple[int, int]:
    """(fan_out calls of the run's built parts, those whose ranks start a vLLM engine) when procs > 1: one call a
    part unless procs.FAN_OUTS says otherwise; an engine with backend vllm, except where the ranks rebuild only
    the policy (procs.POLICY_RANKS)."""
    calls = engines = 0
    for p in _fanned(stem, w, procs):
        n = FAN_OUTS.get((stem, p["what"]), lambda P: 1)(P)
        calls += n
        engines += n if getattr(P, "backend", "hf") == "vllm" and (stem, p["what"]) not in POLICY_RANKS else 0
    return calls, engines


def fan_out_seconds(stem: str, P, w: Work, shape: Shape, units: dict, procs: int) -> float:
    """Seconds each process spends starting fan-outs: every call's launch and load, and each engine's start."""
    calls, engines = fan_outs(stem, P, w, procs)
    if not calls:
        return 0.0
    c = fan_out_costs(P, shape, units)
    return calls * (c["launch"][0] + c["load"][0]) + engines * c.get("engine", (0.0, ""))[0]


# ----------------------------------------------------------------------------- a plan
UNSCALED = ("vllm", "ranks")   # memory terms a measured factor leaves as they are (Plan.terms)


@dataclass
class Plan:
    stem: str
    device: str
    kind: str
    shape: Shape | None
    work: Work | None
    mem: dict = field(default_factory=dict)
    total_memory: int | None = None
    seconds: float | None = None
    by_block: dict = field(default_factory=dict)
    why_no_time: str = ""
    prompt: str = ""
    procs: int = 1
    proc_seconds: float | None = None   # each process's wall time when --procs divides the splittable work
    missing: dict = field(default_factory=dict)   # blocks this kind's units lack -> the stand-in timing them, or None
    card: dict = field(default_factory=dict)      # what GPU 0 holds beyond `mem` (card_terms): CUDA contexts, rank 0's policy
    context: tuple = (0, "")                      # (bytes of one CUDA context, 'estimate' / 'measured')
    dtype: str = ""                               # the policy's dtype (P.dtype)
    factor: dict | None = None                    # measured above plan (measured_factor): memory, seconds, report, date
    fan_out: dict = field(default_factory=dict)   # with --procs: fan_outs, costs {name: (seconds, source)}, seconds

    @property
    def terms(self) -> dict:
        """The peak's terms, bytes: `mem`'s closed forms of one process times the measured memory factor (a dry run
        measures one process's torch allocations), vLLM's share (a reservation the engine keeps to), rank 0's copy
        (`ranks`) and `card` as they are."""
        f = self.factor["memory"] if self.factor else 1.0
        return {**{k: (v * f if k not in UNSCALED else v) for k, v in self.mem.items()}, **self.card}

    @property
    def peak(self) -> int:
        """The memory `check` holds against the device's: on CUDA the first GPU's."""
        return int(round(sum(self.terms.values())))

    @property
    def closed_peak(self) -> int:
        """`mem`'s closed forms alone (no context, no measured factor): what a dry run's measured peak compares with."""
        return sum(self.mem.values())

    def lines(self) -> list[str]:
        if self.shape is None:
            return [f"[plan] {self.stem}: model shape unknown (no config.json for {self.why_no_time}); no estimate"]
        w = self.work
        mem = f"peak memory {self.peak / GiB:.2f} GiB" + (
            f" of {self.total_memory / GiB:.0f} GiB ({self.kind})" if self.total_memory else f" ({self.kind})")
        t = f"time {_fmt_s(self.seconds)}" if self.seconds is not None else f"time: {self.why_no_time}"
        if self.seconds is not None and self.procs > 1:
            t += f" ({_fmt_s(self.proc_seconds)} per process on {self.procs})"
        top = sorted(((k, v) for k, v in self.terms.items() if v), key=lambda kv: -kv[1])[:4]
        out = [f"[plan] {self.stem}: {mem}; {t}",
               f"         params {self.shape.params / 1e9:.3g} B; memory " + ", ".join(
                   f"{k} {v / GiB:.2f}" for k, v in top) + " GiB",
               f"         tokens: analysis {w.blocks.get('analysis', {}).get('positions', 0):,}, full steps "
               f"{w.blocks.get('full_step', {}).get('positions', 0):,}, lm_head steps "
               f"{w.blocks.get('sgd_lm_head', {}).get('positions', 0):,}, sampled {w.sampled_tokens:,} in "
               f"{w.sampled_rows:,} rows; largest batch {w.largest[0]} x {w.largest[1]} ({self.prompt})"]
        if "trl_step" in w.blocks:
            out.append(f"         TRL: loss steps {w.blocks['trl_step']['positions']:,} tokens in "
                       f"{w.blocks['trl_optimizer_step']['calls']:,} optimizer steps, log-prob forwards "
                       f"{w.blocks.get('trl_logp', {}).get('positions', 0):,}, generated "
                       f"{w.blocks['trl_generate']['head']:,} tokens, {w.blocks['trl_run']['calls']} runs")
        out += [f"         note: {n}" for n in w.notes]
        if self.card:
            each, src = self.context
            n = self.card["cuda_contexts"] // each
            who = ["the kernel", "rank 0", "its isolated child"][:n]
            ctx = (f"{n} CUDA context{'s' if n != 1 else ''} ({', '.join(who)}) "
                   f"{self.card['cuda_contexts'] / GiB:.2f} GiB, {each / GiB:.2f} GiB each ("
                   + ("measured on " + self.kind if src == "measured" else
                      f"a stated estimate, plan.CUDA_CONTEXT: no measurement on {self.kind}") + ")")
            pol = (f"; rank 0's {self.dtype} policy beside its sampler {self.card['rank0_policy'] / GiB:.2f} GiB"
                   if "rank0_policy" in self.card else "")
            out.append(f"         GPU 0 also holds: {ctx}{pol}")
        if self.factor:
            f = self.factor
            sizes = ", ".join(f"{k} {v}" for k, v in f["sizes"].items() if k not in ("model_path", "device", "models"))
            said = " and ".join(f"{k} x{f[v]:.2f}" for k, v in (("memory", "memory"), ("time", "seconds")) if f[v] > 1)
            out.append(f"         measured above plan: {said}, carried here (the dry run "
                       f"of {f['date']} on {self.kind}{', at ' + sizes if sizes else ''}: {f['report']}) until a newer "
                       "gpu-check dry run replaces it")
        if self.fan_out.get("fan_outs"):
            fo, c = self.fan_out, self.fan_out["costs"]
            eng = (f"; vLLM engine start {_fmt_s(c['engine'][0])} ({c['engine'][1]}) in {fo['engines']}"
                   if fo["engines"] else "")
            out.append(f"         each process starts {fo['fan_outs']} fan-out{'s' if fo['fan_outs'] != 1 else ''}: "
                       f"launch {_fmt_s(c['launch'][0])} ({c['launch'][1]}), model load {_fmt_s(c['load'][0])} "
                       f"({c['load'][1]}) each{eng}: {_fmt_s(fo['seconds'])} in the time per process")
        if self.missing:
            timed = [f"{k} as {v}" for k, v in self.missing.items() if v]
            left = [k for k, v in self.missing.items() if not v]
            out.append(f"         no measurement on {self.kind} for " + "; ".join(
                ([f"{', '.join(timed)} (timed with that block's unit)"] if timed else [])
                + ([f"{', '.join(left)} (left out of the time: it is low by their share)"] if left else []))
                + f"; measure them with `python -m cancellation.scale --only {' '.join(_scale_only(self.missing))}`")
        if self.procs > 1:
            split = "; ".join(f"{p['what']} ({p['units']:,} units; "
                              + (f"built, {BUILT[(self.stem, p['what'])]}" if (self.stem, p["what"]) in BUILT
                                 else "planned, not split yet") + ")" for p in w.parts)
            out.append(f"         split over {self.procs} processes: " + (split or "nothing (one process does it all)"))
        return out

    def as_dict(self) -> dict:
        f = self.factor or {}
        # peak_gib and predicted_seconds stay the closed forms (a dry run's measured / planned is taken against them)
        return dict(notebook=self.stem, device_kind=self.kind, peak_gib=self.closed_peak / GiB if self.shape else None,
                    predicted_seconds=self.seconds / f.get("seconds", 1.0) if self.seconds is not None else None,
                    memory_gib={k: v / GiB for k, v in self.mem.items()},
                    seconds_by_block=self.by_block, procs=self.procs, seconds_per_process=self.proc_seconds,
                    unmeasured_blocks=self.missing, checked_peak_gib=self.peak / GiB if self.shape else None,
                    card_gib={k: v / GiB for k, v in self.card.items()}, planned_seconds=self.seconds,
                    measured_factor=self.factor, fan_out_seconds=self.fan_out.get("seconds"))


def _scale_only(blocks) -> list[str]:
    """`cancellation.scale --only` names of blocks: TRL's Trainer costs are measured together (trl_overhead)."""
    return sorted({"trl_overhead" if b in ("trl_run", "trl_optimizer_step", "trl_log") else b for b in blocks})


def _fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def make(stem: str, params: dict, root: Path = ROOT, scale_dir: Path | None = None, total_memory: int | None = None,
         units: dict | None = None, kind: str | None = None, procs: int = 1, measured_dir: Path | None = None) -> Plan:
    """The plan of one notebook at its resolved parameters (what `resolve.resolve_params` returns), on this
    host's device, or with `kind` on a device of that kind (data/scale/<kind>.json: its unit costs and
    total memory) wherever the plan is made; `procs` processes divide the splittable work. The newest committed
    dry run of the notebook on that kind (`measured_dir`, default <scale dir>/measured) that measured above
    plan multiplies it (`measured_factor`)."""
    # each figure declares its own workload beside its compute() (the manifest names the module): a new
    # Params field reaches the plan there
    mod = manifest.get(stem).load()
    P = mod.Params(**{k: v for k, v in params.items() if k not in INJECTED})   # the runner's names are not Params'
    device = P.device
    if kind is None:
        kind = device_kind(device)
        total = total_memory if total_memory is not None else device_memory(device)
    else:
        units = units if units is not None else measured.load_units(kind, scale_dir)
        if units is None:
            raise ValueError(f"unknown device kind {kind!r}: no {Path(scale_dir or measured.SCALE_DIR) / (kind + '.json')}; known kinds: "
                             f"{', '.join(measured.known_kinds(scale_dir))}")
        total = total_memory if total_memory is not None else measured.kind_memory(kind, units)
    shape = shape_of(P.model_path, root)
    plan = Plan(stem, device, kind, shape, None, total_memory=total, procs=max(int(procs), 1), dtype=P.dtype)
    if shape is None:
        plan.why_no_time = str(P.model_path)
        return plan
    pm, px, how = prompt_lengths(P, root)
    plan.prompt = f"prompts {pm} tokens on average, {px} at most: {how}"
    z = Sizes(pm, px, P.max_new_tokens)
    plan.work = mod.workload(P, shape, z)
    plan.mem = memory(P, shape, plan.work, plan.total_memory)
    if _fanned(stem, plan.work, plan.procs):
        plan.mem["ranks"] = rank_memory(P, shape, plan.mem, plan.procs, whole=stem in WHOLE_RUNS)
    units = units if units is not None else measured.load_units(kind, scale_dir)
    plan.context = context_bytes(units)
    plan.card = card_terms(P, shape, plan.work, plan.mem, plan.procs, stem, plan.context[0])
    plan.factor = measured.measured_factor(stem, kind, measured_dir if measured_dir is not None
                                           else Path(scale_dir or measured.SCALE_DIR) / measured.MEASURED)
    ft = plan.factor["seconds"] if plan.factor else 1.0
    if units is None:
        plan.why_no_time = (f"no measurement for this device kind ({kind}); run `python -m cancellation.scale "
                            f"--device {device.split(':')[0]} --out data/scale/<kind>.json` on it")
    else:
        plan.seconds, plan.by_block = seconds(plan.work, shape, units)
        plan.seconds *= ft
        plan.missing = unmeasured(plan.work.blocks, units["units"])
        calls, engines = fan_outs(stem, P, plan.work, plan.procs)
        start = fan_out_seconds(stem, P, plan.work, shape, units, plan.procs)
        if calls:
            plan.fan_out = dict(fan_outs=calls, engines=engines, costs=fan_out_costs(P, shape, units), seconds=start)
        # the measured factor multiplies the closed forms (the dry run measured one process); the fan-outs' starts
        # are their own measurements or estimates
        plan.proc_seconds = seconds_per_process(plan.work, shape, units, plan.procs, plan.stem) * ft + start
    return plan


def total_lines(plans: list[Plan]) -> list[str]:
    """The plan's total: the notebooks' times summed on one process, and with --procs N the wall time of
    each of the N processes (notebooks one after another, each dividing its splittable work)."""
    timed = [p for p in plans if p.seconds is not None]
    if not plans:
        return []
    kinds = ", ".join(dict.fromkeys(p.kind for p in plans))
    head = f"[plan] total, {len(plans)} notebooks ({kinds}): "
    if not timed:
        return [head + "no time (no measurement for this device kind; see above)"]
    one = sum(p.seconds for p in timed)
    line = head + f"{_fmt_s(one)} on one process"
    procs = max(p.procs for p in plans)
    if procs > 1:
        each = sum(p.proc_seconds for p in timed)
        line += f"; {_fmt_s(each)} per process on {procs} processes ({_fmt_s(each * procs)} of device time in all)"
    if len(timed) < len(plans):
        line += f" (the {len(timed)} notebooks with a time; {len(plans) - len(timed)} without)"
    short = [p.stem[:2] for p in timed if any(v is None for v in p.missing.values())]
    if short:
        line += f"; low for {', '.join(short)}: blocks with no measurement on this kind are left out (see above)"
    return [line]


def check(plan: Plan) -> str | None:
    """One error line when the plan's peak exceeds the device's memory, naming the knob to turn."""
    if plan.shape is None or not plan.total_memory or plan.peak <= plan.total_memory:
        return None
    terms = plan.terms
    worst = max(terms, key=terms.get)
    where = []
    if plan.card:
        where.append(f"GPU 0's, {plan.card['cuda_contexts'] // plan.context[0]} CUDA contexts included")
    if plan.factor and plan.factor["memory"] > 1:
        where.append(f"x{plan.factor['memory']:.2f} as measured on {plan.factor['date']}")
    return (f"{plan.stem}: planned peak memory {plan.peak / GiB:.1f} GiB{' (' + '; '.join(where) + ')' if where else ''} "
            f"exceeds the device's {plan.total_memory / GiB:.1f} GiB ({plan.kind}); the largest term is {worst} "
            f"({terms[worst] / GiB:.1f} GiB): turn {KNOBS[worst]} (or pass --no-plan-check)")


USAGE = """\
usage: python -m cancellation.plan [NOTEBOOK ...] [--profile PROFILE] [--device-kind KIND] [-p NAME VALUE ...] [--procs N]

Each notebook's planned peak accelerator memory and wall time at PROFILE's parameters (default: every notebook,
profile tiny), on this host's device or on KIND's measured unit costs (data/scale/KIND.json); runs nothing.
The same as `python -m cancellation.run NOTEBOOK ... --plan` (`make plan PROFILE=paper-quick DEVICE=KIND`).
Known kinds: {kinds}.
  e.g. python -m cancellation.plan --profile paper-quick --device-kind nvidia-h100-80gb-hbm3 --procs 8"""


if __name__ == "__main__":   # the runner's --plan, with its argument checks and output (a process of its own:
    import subprocess        # run imports this module, so importing run here would close a circle)
    import sys

    _argv = sys.argv[1:]
    if not _argv or _argv[0] in ("-h", "--help") or "--help" in _argv or "-h" in _argv:
        print(USAGE.format(kinds=", ".join(measured.known_kinds()) or "none measured"))
        sys.exit(0)
    _nbs = ["all"] if _argv[0].startswith("-") else []
    sys.exit(subprocess.call([sys.executable, "-m", "cancellation.run", *_nbs, *_argv, "--plan"]))
