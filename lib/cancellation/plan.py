"""The planner: each notebook's peak accelerator memory and wall time, before anything runs.

A plan is (what the notebook runs) x (what each building block costs on this device):

- `WORKLOADS[stem](P, shape, lengths)` counts the building blocks a notebook runs at its Params,
  read off its figure module's `compute` (approximations are stated where they are made):
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

`check(plans, device)` turns a plan over the device's memory into one error line naming the
knob to turn; the runner refuses to start on it (exit 2) unless --no-plan-check.
"""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCALE_DIR = ROOT / "data" / "scale"
BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "": 4}
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


@dataclass(frozen=True)
class Shape:
    """What costs depend on, from a Hugging Face config.json (Qwen2/Qwen3/Llama-style decoders)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    source: str = ""

    @classmethod
    def from_config(cls, cfg: dict, source: str = "") -> "Shape":
        heads = cfg["num_attention_heads"]
        mt = cfg.get("model_type", "")
        return cls(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   tied=bool(cfg.get("tie_word_embeddings", False)),
                   # Qwen2 always has q/k/v biases (no config key); others say so with attention_bias
                   qkv_bias=mt == "qwen2" or bool(cfg.get("attention_bias", False)),
                   qk_norm=mt == "qwen3", source=source)

    @property
    def layer_params(self) -> int:
        d, hd = self.hidden, self.head_dim
        attn = d * self.heads * hd + 2 * d * self.kv_heads * hd + self.heads * hd * d
        bias = (self.heads + 2 * self.kv_heads) * hd if self.qkv_bias else 0
        norms = 2 * d + (2 * hd if self.qk_norm else 0)
        return attn + bias + 3 * d * self.intermediate + norms

    @property
    def body(self) -> int:
        """Parameters every position runs through (the layers; the embedding is a lookup)."""
        return self.layers * self.layer_params + self.hidden

    @property
    def head(self) -> int:
        """The LM head's matmul parameters (run at response positions only)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Stored parameters (== sum(p.numel()) of the built model)."""
        return self.vocab * self.hidden + self.body + (0 if self.tied else self.head)


def _known_shape(name: str):
    """A hub name of the paper's models: the architecture cancellation.scale copied from its config.json."""
    from .scale import SHAPES
    key = str(name).lower().split("/")[-1].removesuffix("-base").replace("-instruct", "")
    return SHAPES.get(key)


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
    kw = _known_shape(model_path)
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
    from .policy import TOKENIZER_FILES, load_tokenizer
    if Path(model_path).is_dir() and not any((Path(model_path) / f).exists() for f in TOKENIZER_FILES):
        from .standins import build_tokenizer
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
    from . import tasks
    path = getattr(P, "problems_path", "")
    try:
        tok = tokenizer_for(_local(P.model_path, root))
        src = tasks.ProblemSource(path=_local(path, root) if path else "", prompt_format=getattr(P, "prompt_format", "auto"))
        probs = src.load()[:512] if path else tasks.sample_problems(256, seed=0)
        n = [len(tok(src.render(p, tok), add_special_tokens=False)["input_ids"]) for p in probs]
        return int(round(sum(n) / len(n))), max(n), "tokenized"
    except Exception:  # noqa: BLE001 - a hub tokenizer not cached, a missing file: a stated default
        d = DEFAULT_PROMPT["file" if path else "generated"]
        return d, d, "default (tokenizer or problems not readable here)"


# ----------------------------------------------------------------------------- workloads
@dataclass
class Work:
    """Counts of the building blocks one notebook runs. A block's entry: body `positions` (rows x
    padded length), `head` positions (response tokens through the LM head), `calls` (body forwards,
    decode steps or kernel blocks) and `steps` (optimizer steps, for Adam's per-parameter cost)."""
    blocks: dict = field(default_factory=dict)
    sampled_rows: int = 0
    sampled_tokens: int = 0
    largest: tuple = (0, 0)          # (rows, length) of the largest batch held at once
    full_grads: bool = False         # gradients of every parameter (else lm_head only)
    adam: bool = False               # Adam state of every parameter
    extra_bytes: int = 0             # copies of θ, per-token gradients: what the notebook holds beside
    extra_why: list = field(default_factory=list)
    kv_rows: int = 0                 # rows decoded at once (KV cache)
    kv_len: int = 0
    notes: list = field(default_factory=list)
    parts: list = field(default_factory=list)  # the work --procs divides: dict(what, units, blocks)

    @contextmanager
    def split(self, what: str, units: int):
        """The blocks added inside are `units` independent pieces of work (Monte Carlo continuations,
        valued tokens, seeds, batches, masks, runs) that N processes divide, ceil(units / N) each."""
        before = {k: dict(v) for k, v in self.blocks.items()}
        yield
        delta = {}
        for k, b in self.blocks.items():
            d = {f: b[f] - before.get(k, {}).get(f, 0) for f in b}
            if any(d.values()):
                delta[k] = d
        if delta and units > 0:
            self.parts.append(dict(what=what, units=int(units), blocks=delta))

    def add(self, block: str, positions=0, head=0, calls=0, steps=0, pairs=0):
        b = self.blocks.setdefault(block, dict(positions=0, head=0, calls=0, steps=0, pairs=0))
        for k, v in dict(positions=positions, head=head, calls=calls, steps=steps, pairs=pairs).items():
            b[k] += int(v)

    def batch(self, rows, L):
        if rows * L > self.largest[0] * self.largest[1]:
            self.largest = (int(rows), int(L))


class Sizes:
    """Lengths of one batch of `rows` rollouts: a response runs to max_new_tokens (an upper bound:
    rows stop at a stop id, but a batch decodes until its last row stops)."""

    def __init__(self, prompt_mean: int, prompt_max: int, new: int):
        self.prompt, self.prompt_max, self.new = prompt_mean, prompt_max, new
        self.L = prompt_mean + new


def _ceil(a, b):
    return -(-int(a) // max(int(b), 1))


def _sample_rows(P) -> int | None:
    """Rollouts per HF sampler call of a notebook that samples through base.sample_config (its KV cache rows)."""
    return getattr(P, "sample_rows", None)


def _sample(w: Work, rows: int, z: Sizes, chunk_rows_decode: int | None = None, times: int = 1):
    """HF KV-cache sampling of `rows` rows: prefill of the prompts, then one decode step per new token."""
    w.add("sample", positions=times * rows * (z.prompt + z.new), head=times * rows * z.new,
          calls=times * _ceil(rows, chunk_rows_decode or rows) * z.new)
    w.sampled_rows += times * rows
    w.sampled_tokens += times * rows * z.new
    # the static-cache sampler preallocates its cache for the whole bucket: rows padded to a power of
    # two, prompt + new tokens rounded up to a multiple of 256 (sampler.py)
    from .sampler import bucket_len, bucket_rows
    w.kv_rows = max(w.kv_rows, bucket_rows(min(rows, chunk_rows_decode or rows)))
    w.kv_len = max(w.kv_len, bucket_len(z.prompt_max + z.new))
    w.batch(rows, z.prompt_max + z.new)


def _analysis(w: Work, rows: int, z: Sizes, cr: int, times: int = 1):
    """measure.token_stats: the body on every position, chunk_rows rows a call; the head on responses."""
    w.add("analysis", positions=times * rows * z.L, head=times * rows * z.new, calls=times * _ceil(rows, cr))


def _step(w: Work, kind: str, rows: int, z: Sizes, cr: int, minibatches: int = 1, times: int = 1):
    """grpo.grpo_step over `rows` rows split into `minibatches` optimizer steps. kind: 'full' (body
    forward+backward; Adam's update counted per step) or 'lm_head' (body without graph, head fwd+bwd)."""
    block = "sgd_lm_head" if kind == "lm_head" else "full_step"
    w.add(block, positions=times * rows * z.L, head=times * rows * z.new,
          calls=times * max(_ceil(rows, cr), minibatches), steps=times * minibatches)


def _kernel(w: Work, pairs: float, shape: Shape, chunk: int, n_tokens: int):
    """Coupling-kernel blocks: per pair ⟨π_j,π_k⟩ over the vocabulary, plus the probabilities of both
    sides recomputed per block (2·d·V per token per block): V·(1 + 2d/c) per pair, c = block size."""
    c = max(min(chunk, n_tokens), 1)
    w.add("kernel", pairs=pairs * shape.vocab * (1 + 2 * shape.hidden / c), calls=_ceil(pairs, c * c))


def _run(w: Work, P, z: Sizes, rows: int, steps: int, minibatches: int, cr: int, analyses: int = 2):
    """train.delta_run: per step sample, analysis before (θ_old) and after, one Adam GRPO step."""
    _sample(w, rows, z, times=steps)
    _analysis(w, rows, z, cr, times=analyses * steps)
    _step(w, "full", rows, z, cr, minibatches, times=steps)
    w.full_grads = w.adam = True


def work01(P, shape, z):
    w, rows, cr = Work(), P.n_prompts * P.G, P.chunk_rows
    # noise floor: a probe batch, 2 analyses + a zero-weight Adam step + 1 analysis, 2 round-off analyses
    _sample(w, rows, z)
    _analysis(w, rows, z, cr, times=5)
    _step(w, "full", rows, z, cr)
    w.extra_bytes += shape.params * 8   # the float64 (or float32) copy of the round-off check
    w.extra_why.append("a float64 copy of θ (round-off check)")
    runs = 2 + (2 if P.control_model_path else 0) + (1 if getattr(P, "sgd_lr", 0) else 0)
    others = sum(1 for m in P.models if not (m == P.model_path and P.fig9_steps <= P.steps))
    with w.split("the model grid's GRPO runs", runs):
        _run(w, P, z, rows, runs * P.steps, P.n_minibatches, cr)
    # Fig. 9's other models are counted at this model's shape (they differ: an approximation)
    with w.split("Fig. 9's runs", others):
        _run(w, P, z, rows, others * P.fig9_steps, P.n_minibatches, cr)
    if others:
        w.notes.append(f"Fig. 9's {others} other model(s) counted at {Path(P.model_path).name}'s shape")
    return w


def _features(w: Work, P, shape, z, rows):
    """coupling.features: one analysis with hidden states kept for the whole batch, and the
    log-sum-exp of every response token over the vocabulary (an extra head pass)."""
    _analysis(w, rows, z, P.chunk_rows)
    w.add("analysis", head=rows * z.new)
    w.extra_bytes += rows * z.L * shape.hidden * BYTES[P.dtype]
    w.extra_why.append("hidden states of the whole batch")


def work02(P, shape, z):
    w, rows = Work(), P.n_prompts * P.G
    N = rows * z.new                                  # response tokens (upper bound: every row at the cap)
    _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
    _features(w, P, shape, z, rows)
    _kernel(w, 2 * P.n_pairs, shape, P.chunk, N)      # (a), (b): sampled pairs
    _kernel(w, 2 * N * N, shape, P.chunk, N)          # (c) entropy bins and the first-order δ: every pair, twice
    for _ in P.lrs:                                   # a real SGD lm_head step and a forward per lr
        _step(w, "lm_head", rows, z, P.chunk_rows)
        _analysis(w, rows, z, P.chunk_rows)
    return w


def work03(P, shape, z):
    w, rows, cr = Work(), P.n_prompts * P.G, P.chunk_rows
    _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
    _analysis(w, rows, z, cr)                         # features
    # precision check: per copy (stock norms, exact) an analysis, a full SGD step and an analysis
    _analysis(w, rows, z, cr, times=4)
    _step(w, "full", rows, z, cr, times=2)
    w.extra_bytes += shape.params * BYTES[P.dtype] * 3  # the stock-norms copy, θ and θ' of the masked steps
    w.extra_why.append("a second copy of the policy and two snapshots of θ")
    w.full_grads = True
    pools = len(P.pools)
    n_full = pools * 3 * min(P.n_cands_full, P.n_cands) + pools * len(P.topk_full_sizes) * P.n_cands_topk_full
    # masked full effects: per call a full step + analysis, then per candidate a backward over the rows
    # holding M (≈ mask_size rows, at most the batch) and a one-row forward
    m_rows = min(P.mask_size, rows)
    _step(w, "full", rows, z, cr, times=2 * pools)
    _analysis(w, rows, z, cr, times=4 * pools)
    with w.split("masks (candidates)", n_full):
        w.add("full_step", positions=n_full * m_rows * z.L, head=n_full * m_rows * z.new,
              calls=n_full * _ceil(m_rows, cr))
        w.add("analysis", positions=n_full * z.L, head=n_full * z.new, calls=n_full)
    N = rows * z.new
    with w.split("masks (proxy cosines)", pools * P.n_cands):
        _kernel(w, pools * (P.n_cands * 3 * P.mask_size + P.n_cands * N), shape, 1024, N)  # proxy cosines, top-coupled
    # Fig. 10 run: per step a sample, an analysis, an SGD lm_head and a full step with their analyses, an Adam step
    r10 = P.run_n_prompts * P.run_G
    _sample(w, r10, z, chunk_rows_decode=_sample_rows(P), times=P.run_steps)
    _analysis(w, r10, z, cr, times=3 * P.run_steps)
    _step(w, "lm_head", r10, z, cr, times=P.run_steps)
    _step(w, "full", r10, z, cr, times=2 * P.run_steps)
    w.adam = True
    _step(w, "full", rows, z, cr)                     # App. D.3: Adam's first step
    return w


def work04(P, shape, z):
    w, rows = Work(), P.n_prompts * P.G
    policies = 1 + (1 if P.control_model_path else 0)
    kind = "full" if P.scope == "full" else "lm_head"
    n = policies * P.n_batches
    with w.split("batches", n):
        _sample(w, rows, z, chunk_rows_decode=_sample_rows(P), times=n)
        # before, after each of the two updates, the restore check; the main policy's batches also take the
        # thesis rows' negative-only and copies-masked GRPO updates, each measured after
        _analysis(w, rows, z, P.chunk_rows, times=n * 4 + P.n_batches * 2)
        _step(w, kind, rows, z, P.chunk_rows, times=n * 2 + P.n_batches * 2)
    w.full_grads = kind == "full"
    w.extra_bytes += shape.params * BYTES[P.dtype] * (policies - 1)
    return w


def work05(P, shape, z):
    w, rows, cr = Work(), P.n_prompts * P.G, P.chunk_rows
    _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
    steps = len(P.sgd_lrs) + len(P.adam_lrs)          # repeated steps: K steps per optimizer and lr
    _step(w, "full", rows, z, cr, times=steps * P.repeat_steps + 1)
    _analysis(w, rows, z, cr, times=steps * P.repeat_steps + 3)
    w.full_grads, w.adam = True, bool(P.adam_lrs)
    # Monte Carlo values: per valued token and branch M continuations of up to max_new_tokens;
    # 4 cells x n_per_cell tokens, n_pool11 per sign again, 2 branches, each estimator
    valued = (4 * P.n_per_cell + 2 * P.n_pool11) * len(P.estimators)
    h = getattr(P, "heldout_per_cell", 0)
    if h:  # held-out states: a second batch, its forward before and after one step, 4 cells valued
        _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
        _analysis(w, rows, z, cr, times=3)
        _step(w, "full", rows, z, cr)
        valued += 4 * h
    cont = valued * 2 * P.M
    with w.split("valued tokens' Monte Carlo continuations", valued):
        _sample(w, cont, z, chunk_rows_decode=P.rows_per_chunk)
    w.notes.append("continuations counted at the full response cap (they start mid-response: an upper bound)")
    if P.sample_dtype and P.backend == "hf":
        w.extra_bytes += shape.params * BYTES[P.sample_dtype]
        w.extra_why.append(f"the {P.sample_dtype} sampler copy")
    return w


def work06(P, shape, z):
    w, cr = Work(), P.chunk_rows
    rows, crows = P.n_prompts * P.G, P.comp_prompts * P.comp_G
    _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
    _sample(w, crows, z, chunk_rows_decode=_sample_rows(P))
    _analysis(w, rows, z, cr)
    _analysis(w, P.comp_groups * P.G_comp, z, cr)
    # a real grpo_step per setting and seed (step_mode grpo), on the sub-batch of the setting
    settings = [(p * P.n_fixed) for p in P.prompt_sizes] + [P.prompts_fixed * g for g in P.rollout_sizes] + \
        [P.G_comp] * max(P.G_comp - 1, 0)
    with w.split("settings x seeds", len(settings) * P.n_seeds):
        for r in settings:
            _step(w, "full", r, z, cr, times=P.n_seeds)
            _analysis(w, r, z, cr, times=P.n_seeds)
    w.full_grads = True
    valued = P.n_seeds * (min(P.prompt_sizes) * P.valued_per_prompt + P.comp_groups * P.G_comp) * P.tokens_per_rollout
    with w.split("valued tokens' Monte Carlo continuations", valued):
        _sample(w, valued * 2 * P.M, z, chunk_rows_decode=P.rows_per_chunk)
    w.notes.append("valued tokens: every seed's counted (the cache shares prefixes across seeds: an upper bound)")
    if P.sample_dtype and P.backend == "hf":
        w.extra_bytes += shape.params * BYTES[P.sample_dtype]
    return w


def work07(P, shape, z):
    w, rows, cr = Work(), P.n_prompts * P.G, P.chunk_rows
    runs = len(P.strategies) * len(P.seeds) + len(P.probe_lrs) * len(P.probe_strategies) * len(P.probe_seeds)
    runs += len(getattr(P, "budget_strategies", [])) * len(P.seeds)   # equal-rollout arm: at most as many rounds
    if P.engine == "trl":
        runs = len(P.strategies) * len(P.seeds) + len(P.probe_lrs) * len(P.probe_strategies) * len(P.probe_seeds)
        w.notes.append("TRL runs counted as the small trainer's (the same blocks)")
    rb = any("RB" in s for s in P.strategies)
    rounds = P.iterations * (2 if rb else 1)          # RB samples extra rounds: about 2 per iteration
    with w.split("runs (strategy x seed)", runs):
        _sample(w, rows, z, times=runs * rounds)
        _analysis(w, rows, z, cr, times=runs * P.iterations)
        _step(w, "full", rows, z, cr, P.n_minibatches, times=runs * P.iterations)
        evals = runs * (P.iterations // P.eval_every + 1)
        _sample(w, len(P.eval_sets) * P.eval_n * P.eval_samples, z, times=evals)
    d = getattr(P, "imbalance_plans", 0)
    if d:  # Eq. 14: each seed's first batch, and 3 plans x d draws + the whole batch of gradients at θ0
        with w.split("Eq. 14's seeds", len(P.seeds)):
            _sample(w, rows, z, times=len(P.seeds))
            _analysis(w, rows, z, cr, times=len(P.seeds))
            _step(w, "full", rows, z, cr, P.n_minibatches, times=len(P.seeds) * (3 * d + 1))
        w.notes.append(f"Eq. 14: {len(P.seeds)} batches, {3 * d + 1} gradient passes each")
    w.full_grads = w.adam = True
    if rb:
        w.notes.append("RB: about two sampling rounds per iteration")
    return w


def work08(P, shape, z):
    w, rows, cr = Work(), P.n_prompts * P.G, P.chunk_rows
    _run(w, P, z, rows, P.steps, P.n_minibatches, cr)   # (a) notebook 01's run (read from the cache when 01 ran)
    w.notes.append("(a) counts notebook 01's GRPO run, which a previous run of 01 leaves in the cache")
    _sample(w, rows, z, chunk_rows_decode=_sample_rows(P))
    _features(w, P, shape, z, rows)
    N = rows * z.new
    _kernel(w, N * N / 2 + N * N, shape, P.chunk, N)   # cross-sign pairs, then the same-token pools
    n = P.n_full_tokens // 2
    # (b) per-token full gradients: J's once, K's again for every chunk of J; one backward each,
    # through its row (one forward per row; the backward dominates)
    grads = n + _ceil(n, P.grad_chunk) * n
    w.add("full_step", positions=grads * z.L, head=grads, calls=grads)
    w.extra_bytes += 2 * min(P.grad_chunk, n) * shape.params * BYTES[P.dtype]
    w.extra_why.append(f"2 x grad_chunk = {2 * min(P.grad_chunk, n)} flattened full gradients")
    return w


WORKLOADS = {"01_token_flipping": work01, "02_coupling_heatmaps": work02, "03_masked_updates": work03,
             "04_category_shift": work04, "05_value_gap": work05, "06_sampling_budget": work06,
             "07_batching": work07, "08_referee_controls": work08}

# What to turn when a term is too big (named in the refusal)
KNOBS = {"weights": "dtype (a smaller model_path)", "grads": "dtype", "adam": "dtype (or an lm_head-scope notebook)",
         "activations": "chunk_rows, gradient_checkpointing", "logits": "token_chunk",
         "kv_cache": "n_prompts / G, max_new_tokens (rows_per_chunk for continuations)",
         "extra": "grad_chunk / n_full_tokens / n_prompts / G", "vllm": "gpu_memory_utilization"}


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


# ----------------------------------------------------------------------------- units and devices
def device_kind(device: str) -> str:
    """'cpu', or the CUDA device's name as a file name ('nvidia-h100-80gb-hbm3'); 'cuda' when no CUDA
    device is visible here."""
    if not device.startswith("cuda"):
        return device.split(":")[0]
    import torch
    if not torch.cuda.is_available():
        return "cuda"
    idx = int(device.split(":")[1]) if ":" in device else 0
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(idx).lower()).strip("-")


def device_memory(device: str) -> int | None:
    """Bytes the device has: a CUDA device's total memory, the CPU's physical RAM (None: unknown here)."""
    if device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(int(device.split(":")[1]) if ":" in device else 0).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def load_units(kind: str, scale_dir: Path | None = None) -> dict | None:
    f = Path(scale_dir or SCALE_DIR) / f"{kind}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def known_kinds(scale_dir: Path | None = None) -> list[str]:
    """The device kinds with measured unit costs (data/scale/<kind>.json): what --device-kind takes."""
    return sorted(p.stem for p in Path(scale_dir or SCALE_DIR).glob("*.json"))


def kind_memory(kind: str, units: dict | None) -> int | None:
    """Bytes a device of this kind has: its scale file's `total_memory` (a GPU's, recorded where it was
    measured), else for 'cpu' this host's RAM; None when nothing says."""
    if units and units.get("total_memory"):
        return int(units["total_memory"])
    return device_memory("cpu") if kind == "cpu" else None


def _block_seconds(blocks: dict, shape: Shape, u: dict) -> dict:
    out = {}
    for name, b in blocks.items():
        if name == "kernel":
            out[name] = u["kernel"]["s_per_pair_vocab"] * b["pairs"] + u["kernel"]["s_per_call"] * b["calls"]
            continue
        unit = u[name]
        t = unit["s_per_param_token"] * (b["positions"] * shape.body + b["head"] * shape.head)
        t += unit["s_per_call"] * b["calls"]
        if name == "full_step":
            t += u["adam_update"]["s_per_param"] * shape.params * b["steps"]
        out[name] = t
    return out


def seconds(w: Work, shape: Shape, units: dict) -> tuple[float, dict]:
    """Predicted wall time and its share per block: the notebook's start (kernel, imports, plots:
    measured once per device) plus, per block, unit x parameter-tokens + per-call x calls
    (+ Adam's per-parameter update per optimizer step)."""
    u = units["units"]
    out = {"start": u["start"]["seconds"], **_block_seconds(w.blocks, shape, u)}
    return sum(out.values()), out


def seconds_per_process(w: Work, shape: Shape, units: dict, procs: int) -> float:
    """Wall time of each of `procs` processes (one per device) when they divide the work's splittable
    parts (`Work.split`: ceil(units / procs) of each part's units apiece); the start and every other
    block run in full on each process."""
    total, _ = seconds(w, shape, units)
    for part in w.parts:
        t = sum(_block_seconds(part["blocks"], shape, units["units"]).values())
        n = part["units"]
        total -= t * (1 - _ceil(n, procs) / n)
    return total


# ----------------------------------------------------------------------------- a plan
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

    @property
    def peak(self) -> int:
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
        top = sorted(((k, v) for k, v in self.mem.items() if v), key=lambda kv: -kv[1])[:4]
        out = [f"[plan] {self.stem}: {mem}; {t}",
               f"         params {self.shape.params / 1e9:.3g} B; memory " + ", ".join(
                   f"{k} {v / GiB:.2f}" for k, v in top) + " GiB",
               f"         tokens: analysis {w.blocks.get('analysis', {}).get('positions', 0):,}, full steps "
               f"{w.blocks.get('full_step', {}).get('positions', 0):,}, lm_head steps "
               f"{w.blocks.get('sgd_lm_head', {}).get('positions', 0):,}, sampled {w.sampled_tokens:,} in "
               f"{w.sampled_rows:,} rows; largest batch {w.largest[0]} x {w.largest[1]} ({self.prompt})"]
        out += [f"         note: {n}" for n in w.notes]
        if self.procs > 1:
            split = "; ".join(f"{p['what']} ({p['units']:,})" for p in w.parts)
            out.append(f"         split over {self.procs} processes: " + (split or "nothing (one process does it all)"))
        return out

    def as_dict(self) -> dict:
        return dict(notebook=self.stem, device_kind=self.kind, peak_gib=self.peak / GiB if self.shape else None,
                    predicted_seconds=self.seconds, memory_gib={k: v / GiB for k, v in self.mem.items()},
                    seconds_by_block=self.by_block, procs=self.procs, seconds_per_process=self.proc_seconds)


def _fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def make(stem: str, params: dict, root: Path = ROOT, scale_dir: Path | None = None, total_memory: int | None = None,
         units: dict | None = None, kind: str | None = None, procs: int = 1) -> Plan:
    """The plan of one notebook at its resolved parameters (what `run.resolve_params` returns), on this
    host's device, or with `kind` on a device of that kind (data/scale/<kind>.json: its unit costs and
    total memory) wherever the plan is made; `procs` processes divide the splittable work."""
    from .figures.base import FigureParams  # noqa: F401 - the figure modules' Params
    import importlib
    mod = importlib.import_module(f"cancellation.figures.fig{stem[:2]}")
    P = mod.Params(**{k: v for k, v in params.items() if k not in ("profile", "fig_dir", "results_dir")})
    device = getattr(P, "device", "cpu")
    if kind is None:
        kind = device_kind(device)
        total = total_memory if total_memory is not None else device_memory(device)
    else:
        units = units if units is not None else load_units(kind, scale_dir)
        if units is None:
            raise ValueError(f"unknown device kind {kind!r}: no {Path(scale_dir or SCALE_DIR) / (kind + '.json')}; known kinds: "
                             f"{', '.join(known_kinds(scale_dir))}")
        total = total_memory if total_memory is not None else kind_memory(kind, units)
    shape = shape_of(P.model_path, root)
    plan = Plan(stem, device, kind, shape, None, total_memory=total, procs=max(int(procs), 1))
    if shape is None:
        plan.why_no_time = str(P.model_path)
        return plan
    pm, px, how = prompt_lengths(P, root)
    plan.prompt = f"prompts {pm} tokens on average, {px} at most: {how}"
    z = Sizes(pm, px, P.max_new_tokens)
    plan.work = WORKLOADS[stem](P, shape, z)
    plan.mem = memory(P, shape, plan.work, plan.total_memory)
    units = units if units is not None else load_units(kind, scale_dir)
    if units is None:
        plan.why_no_time = (f"no measurement for this device kind ({kind}); run `python -m cancellation.scale "
                            f"--device {device.split(':')[0]} --out data/scale/<kind>.json` on it")
    else:
        plan.seconds, plan.by_block = seconds(plan.work, shape, units)
        plan.proc_seconds = seconds_per_process(plan.work, shape, units, plan.procs)
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
    return [line]


def check(plan: Plan) -> str | None:
    """One error line when the plan's peak exceeds the device's memory, naming the knob to turn."""
    if plan.shape is None or not plan.total_memory or plan.peak <= plan.total_memory:
        return None
    worst = max(plan.mem, key=plan.mem.get)
    return (f"{plan.stem}: planned peak memory {plan.peak / GiB:.1f} GiB exceeds the device's "
            f"{plan.total_memory / GiB:.1f} GiB ({plan.kind}); the largest term is {worst} "
            f"({plan.mem[worst] / GiB:.1f} GiB): turn {KNOBS[worst]} (or pass --no-plan-check)")
