"""The memory guard: the rule every model call keeps (no call computes logits for more than
`token_chunk` positions), made checkable. Bottom layer: it imports nothing of ours.

With `CANCELLATION_COMPUTE_GUARD` set to a JSON object of knobs (the tests set it, e.g.
`{"token_chunk": 64, "chunk_rows": 4, "gradient_checkpointing": true}`), every model loaded by
`policy.load_policy` raises `MemoryBoundError` when its LM head is called on more than `token_chunk`
positions (TRL's fused LM head, which reads the head's weight without calling it, included: counted as
the completion positions it scores), and every `grpo.UpdateConfig` (and sampling or value config)
whose knobs differ from the guard's raises `KnobError`: a forward or an update that bypassed the
profile's Compute (`compute.Compute`) fails loudly instead of allocating (positions, V) logits in one
piece. A `"log": path` key makes the guard tally the positions it sees into that JSON file (`_tally`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

GUARD_ENV = "CANCELLATION_COMPUTE_GUARD"
KNOBS = ("chunk_rows", "token_chunk", "gradient_checkpointing", "trim_padding")  # what an UpdateConfig carries from Compute
# The memory knobs' defaults, declared here once (the bottom layer, so every config can read them): Compute,
# UpdateConfig, SampleConfig, ValueConfig, the figures' Params and every signature that still defaults one
# read these names; tests/test_knobs.py fails on a number written anywhere else.
TOKEN_CHUNK = 4096   # positions per LM-head call: bounds every (positions, V) logits tensor
CHUNK_ROWS = 64      # rows per body forward (gradient accumulation inside a mini-batch)

# Each knob declared once: its default, its one-line doc and the runner's rules (figures/base.param's format).
# Every config that carries a knob (Compute, UpdateConfig, SampleConfig, ValueConfig, a figure's Params)
# declares that field as `knob(name)`, so a changed default or doc reaches all of them (tests/test_knobs.py).
KNOB_FIELDS = {
    "chunk_rows": (CHUNK_ROWS, "rows per body forward (gradient accumulation inside a mini-batch)", {"min": 1}),
    "token_chunk": (TOKEN_CHUNK, "positions per LM-head call: bounds every (positions, vocabulary) logits tensor",
                    {"min": 1}),
    "gradient_checkpointing": (False, "recompute the body's activations in the backward (large models)", {}),
    "trim_padding": (False, "forward each chunk of rows over its real columns only, rows shortest first: "
                     "less work where responses differ in length (paper), round-off-level other numbers", {}),
}


def knob(name: str, doc: str | None = None):
    """The dataclass field of memory knob `name`: its default and rules from KNOB_FIELDS, and its doc (a
    figure may say what the knob does in it, `doc`; the default it cannot change)."""
    default, doc0, rules = KNOB_FIELDS[name]
    return dataclasses.field(default=default, metadata={"doc": doc or doc0, "rules": dict(rules)})


class MemoryBoundError(RuntimeError):
    """A logits computation over more positions than the Compute config's `token_chunk`."""


class KnobError(RuntimeError):
    """An update config built with other memory knobs than the profile's Compute config."""


# ----------------------------------------------------------------------------- the guard (tests, debugging)
def guard_knobs() -> dict | None:
    """The knobs of $CANCELLATION_COMPUTE_GUARD, or None when the guard is off."""
    raw = os.environ.get(GUARD_ENV)
    return json.loads(raw) if raw else None


_TALLY = {"head_positions": 0, "head_calls": 0, "head_max": 0, "head_projected_max": 0, "body_positions": 0, "body_calls": 0, "body_max": 0,
          "batch_max": 0, "vocab": 0}


def _tally(log: str | None, **new) -> None:
    """Add one call to the guard's tally and rewrite it to `log` (JSON): what the paper-vocab test
    reads back from the notebook's kernel: positions through the LM head (total, largest call), positions
    through the body (total: what the planner's workload is held against, tests/test_plan_tally.py), and
    the largest body forward in positions, whose logits would have been built whole without chunking."""
    if not log:
        return
    _TALLY["head_positions"] += new.get("head", 0)
    _TALLY["head_calls"] += 1 if "head" in new else 0
    # the largest call under the bound (TRL's fused head: its labelled positions, what it projects with Triton
    # on a GPU); head_projected_max: what a call projected here (on a CPU TRL's fused head projects every position)
    _TALLY["head_max"] = max(_TALLY["head_max"], new.get("head_bounded", new.get("head", 0)))
    _TALLY["head_projected_max"] = max(_TALLY["head_projected_max"], new.get("head", 0))
    _TALLY["body_positions"] += new.get("body", 0)
    _TALLY["body_calls"] += 1 if "body" in new else 0
    _TALLY["body_max"] = max(_TALLY["body_max"], new.get("body", 0))
    _TALLY["batch_max"] = max(_TALLY["batch_max"], new.get("batch", 0))
    _TALLY["vocab"] = max(_TALLY["vocab"], new.get("vocab", 0))
    tmp = f"{log}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(_TALLY, f)
    os.replace(tmp, log)


def tally_batch(positions: int) -> None:
    """Record an analysed batch's rows × length in the guard's tally (its logits, built whole, are
    positions × V: what the chunking avoids). A no-op unless the guard has a log."""
    knobs = guard_knobs()
    if knobs and knobs.get("log"):
        _tally(knobs["log"], batch=int(positions))


def _fused_compact(device) -> bool:
    """Whether TRL's fused LM head scores only the labelled positions on `device` (its `_use_triton`: Triton on
    a CUDA/XPU device) rather than every position of the rows."""
    if device.type not in ("cuda", "xpu"):
        return False
    return importlib.util.find_spec("triton") is not None


def guard_lm_head(model, token_chunk: int, log: str | None = None):
    """Make `model`'s LM head raise MemoryBoundError on more than `token_chunk` positions (idempotent);
    with `log`, tally every head call and body forward there (`_tally`)."""
    head = model.get_output_embeddings()
    if getattr(head, "_cancellation_guard", None) == token_chunk:
        return model
    vocab = head.weight.shape[0]

    def count_body(module, args, kwargs):
        x = kwargs.get("input_ids")
        x = x if x is not None else kwargs.get("inputs_embeds")
        x = x if x is not None else (args[0] if args else None)
        if x is not None:
            _tally(log, body=int(x.shape[0] * x.shape[1]))

    def check(module, args):
        x = args[0]
        n = x.numel() // x.shape[-1]
        _tally(log, head=n, vocab=vocab)
        if n > token_chunk:
            raise MemoryBoundError(f"LM head called on {n} positions at once; token_chunk is {token_chunk} "
                                   f"(a logits tensor of {n} x {module.weight.shape[0]})")

    def check_fused(module, args, kwargs):
        # TRL's fused LM head (`model(..., labels=..., fused_lm_head=True)`, its loss and log-prob
        # forwards) projects hidden states through lm_head.weight itself, never calling the head
        # module: count the positions it scores, rows × the completion columns that carry a label
        labels = kwargs.get("labels")
        if kwargs.get("fused_lm_head") and labels is not None:
            lab = labels[:, 1:] if kwargs.get("shift_labels") is None else kwargs["shift_labels"]
            n = int((lab != -100).any(0).sum()) * lab.shape[0]
            # what the head projects: on a CUDA/XPU device with Triton only the labelled positions, elsewhere
            # (a CPU) every position of the rows (TRL's `_use_triton`): the tally counts those; the bound, the labels
            _tally(log, head=n if _fused_compact(lab.device) else lab.numel(), head_bounded=n, vocab=vocab)
            if n > token_chunk:
                raise MemoryBoundError(f"fused LM head (TRL) called on {n} positions at once; token_chunk is "
                                       f"{token_chunk} ({lab.shape[0]} rows x {n // max(lab.shape[0], 1)} positions)")

    head.register_forward_pre_hook(check)
    model.register_forward_pre_hook(check_fused, with_kwargs=True)
    if log:
        model.get_decoder().register_forward_pre_hook(count_body, with_kwargs=True)
    head._cancellation_guard = token_chunk
    return model


def apply_guard(model):
    """Install the LM-head guard on `model` when $CANCELLATION_COMPUTE_GUARD names a token_chunk."""
    knobs = guard_knobs()
    if knobs and "token_chunk" in knobs:
        guard_lm_head(model, int(knobs["token_chunk"]), knobs.get("log"))
    return model


def check_update(cfg) -> None:
    """Raise KnobError when the guard is on and the memory knobs `cfg` carries (an UpdateConfig,
    a SampleConfig, a ValueConfig) differ from the guard's."""
    knobs = guard_knobs()
    if not knobs:
        return
    bad = {k: (getattr(cfg, k), v) for k, v in knobs.items()
           if k in KNOBS and hasattr(cfg, k) and getattr(cfg, k) != v}
    if bad:
        raise KnobError(f"a {type(cfg).__name__} was built without the profile's Compute: "
                        + ", ".join(f"{k}={got!r} (profile: {want!r})" for k, (got, want) in bad.items()))
