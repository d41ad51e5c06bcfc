"""Model shapes: what the planner's costs depend on, from a config.json, and the paper's models' shapes.

`SHAPES` holds the architectures of Qwen3-1.7B-Base, Qwen3-4B-Base and Qwen2.5-Math-7B (copied from their
hub config.json files): `cancellation.scale` builds random models of them, the planner plans for them by
name. `Shape` reads any Qwen2/Qwen3/Llama-style config.json; `device_kind`/`device_memory` name the device
a plan is for. A bottom-layer module: the planner and the unit-cost measurement both read it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Architectures copied from the models' hub config.json files (Qwen3-1.7B-Base, Qwen3-4B-Base, Qwen2.5-Math-7B).
SHAPES = {
    "qwen3-1.7b": dict(arch="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(arch="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen2.5-math-7b": dict(arch="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                            num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                            tie_word_embeddings=False),
}


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


def known_shape(name: str):
    """A hub name of the paper's models: the architecture cancellation.scale copied from its config.json."""
    key = str(name).lower().split("/")[-1].removesuffix("-base").replace("-instruct", "")
    return SHAPES.get(key)


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
