"""Compute: where and how every model call runs, passed whole to every library function that
touches a model.

A profile's device, precision and memory knobs live in one frozen dataclass. Library functions
take it whole (`compute=`) instead of their own `chunk_rows=64`-style defaults, and build their
update configs with `compute.update(...)`, so a knob set in a profile reaches every forward
and every GRPO step (docs/methods.md, "Memory"). The memory rule it carries: no call computes
logits for more than `token_chunk` positions.

The rule is checked by the memory guard (`guard.py`, the bottom layer): with the guard on, an LM-head
call over `token_chunk` positions raises `guard.MemoryBoundError` and an update config built with other
knobs than the profile's raises `guard.KnobError`. `Compute.update` and `Compute.stats` apply the knobs to
a GRPO update (`grpo.UpdateConfig`) and to token statistics (`measure.token_stats`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

from . import grpo, measure, stage
from .guard import KNOBS, knob


@dataclass(frozen=True)
class Compute:
    """Device, precision and memory knobs of one run; the same object reaches every model call."""
    device: str = field(default="cpu", metadata={"doc": "cpu, cuda or cuda:N"})
    dtype: str = field(default="float64", metadata={"doc": "precision of analysis forwards and updates"})
    sample_dtype: str = field(default="", metadata={"doc": "dtype of the sampler copy; empty: the training model itself"})
    chunk_rows: int = knob("chunk_rows")
    token_chunk: int = knob("token_chunk")
    gradient_checkpointing: bool = knob("gradient_checkpointing")
    trim_padding: bool = knob("trim_padding")
    backend: str = field(default="hf", metadata={"doc": "sampler: 'hf' or 'vllm'"})
    gpu_memory_utilization: float = field(default=0.3, metadata={"doc": "vLLM's share of GPU memory"})

    def __post_init__(self):
        for name in ("chunk_rows", "token_chunk"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Compute.{name} must be ≥ 1, got {getattr(self, name)!r}")

    @classmethod
    def from_params(cls, params: Mapping) -> "Compute":
        """The Compute of a notebook's parameters (names it does not declare keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: params[k] for k in names if k in params})

    @classmethod
    def of_update(cls, cfg) -> "Compute":
        """The memory knobs an existing UpdateConfig carries, as a Compute (training loops hold one)."""
        return cls(**{k: getattr(cfg, k) for k in KNOBS})

    def update(self, **kw):
        """A `grpo.UpdateConfig` with this Compute's memory knobs (the only way the library builds one)."""
        return grpo.UpdateConfig(**{**{k: getattr(self, k) for k in KNOBS}, **kw})

    def stats(self, model, batch, hidden: bool = False):
        """`measure.token_stats` with this Compute's chunking."""
        return measure.token_stats(model, batch, self, hidden=hidden)

    def cache_params(self) -> dict:
        """The knobs that can change a result, for cache keys (stage.canonical); a knob added later
        (stage.KEYLESS['compute']) only while it is not at its default."""
        return stage.without_defaults(dataclasses.asdict(self), "compute")
