"""Load any Hugging Face causal LM and tokenizer; cast, fingerprint and count a policy.

Building and pretraining the tiny policies lives in `tiny.py` (so `policy` does not import
`rollout`); stand-ins of the paper's inputs are built by `standins.py`.
"""
from __future__ import annotations

import copy
import hashlib
import types
from pathlib import Path

import torch


def load_policy(path: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu", exact: bool = True):
    """(model, tokenizer) for a local directory or a hub name, in eval mode, in `dtype`.

    `exact` (default) makes a float64 model float64 throughout (`exact_norms`); False keeps
    transformers' stock float32 norms, for the precision check of notebook 03.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = Path(path)
    looks_local = str(path).startswith((".", "/")) or p.parts[:1] == ("data",)
    if looks_local and not (p / "config.json").exists():
        hint = " Run `make policy` to train the tiny policies." if "policies" in str(path) else ""
        raise FileNotFoundError(f"model path {path!s} has no config.json.{hint}")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tok = AutoTokenizer.from_pretrained(str(path))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    if exact:
        exact_norms(model)
    model.eval()
    return model, tok


def _rmsnorm_forward(self, x):
    dt = torch.promote_types(x.dtype, torch.float32)  # float64 stays float64; half precision upcasts as stock
    y = x.to(dt)
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * y.to(x.dtype)


def exact_norms(model):
    """Make every RMSNorm compute in the model's dtype when that is float64 (idempotent).

    transformers' Qwen2/Llama RMSNorm upcasts to float32 *only*, so a float64 model would still
    round every hidden state to float32 (~1e-7 relative) in each norm: invisible to a no-op
    update, but it blurs the Δlog p of small SGD steps and breaks the linearity of the gradient
    in the token weights that the masked-update shortcut relies on. Half precision is unchanged.
    """
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon"):
            m.forward = types.MethodType(_rmsnorm_forward, m)
    return model


def cast(model, dtype: str | torch.dtype):
    """A deep copy of `model` in `dtype` (analysis passes of the tiny profile run in float64)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return exact_norms(copy.deepcopy(model).to(dtype))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def fingerprint(path: str | Path) -> str:
    """Short content hash of a local policy's weights (a hub name is its own fingerprint)."""
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        return str(path)
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]

