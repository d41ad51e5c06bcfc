"""Load any Hugging Face causal LM and tokenizer; cast, fingerprint and count a policy.

Building and pretraining the tiny policies lives in `tiny.py` (so `policy` does not import
`rollout`); stand-ins of the paper's inputs are built by `standins.py`.
"""
from __future__ import annotations

import copy
import hashlib
import os
import types
from pathlib import Path

import torch

from .dryrun import dry_run
from .guard import apply_guard
from .standins import build_tokenizer


class PolicyLoadError(OSError):
    """A policy that cannot be loaded; the message names the directory or file and what is wrong."""


def is_hub_name(path: str | Path) -> bool:
    """Whether `path` can only mean a Hugging Face hub repo id ("org/name" or "name").

    Anything that exists here, is absolute or starts with '.', has more than one '/', or whose
    first component exists here is a local path; a local path that does not exist is an error,
    never a hub lookup.
    """
    s = str(path)
    p = Path(s)
    if not s or p.exists() or s.startswith((".", "/", "~")) or s.count("/") > 1 or "\\" in s:
        return False
    return not (s.count("/") == 1 and Path(s.split("/")[0]).exists())


def hub_offline() -> bool:
    """Whether the environment forbids hub downloads (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set true)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_kwargs(path: str | Path) -> dict:
    """from_pretrained's keywords for `path`: a hub name already in the local Hugging Face cache loads with
    local_files_only (no network call, no retries); one that is not, while offline, is refused here in one
    line naming it (instead of transformers' retries and a traceback in a notebook cell). A local directory,
    or a hub name online and not cached (downloaded as asked), gets none."""
    if not is_hub_name(path):
        return {}
    from huggingface_hub import try_to_load_from_cache
    if isinstance(try_to_load_from_cache(str(path), "config.json"), str):
        return {"local_files_only": True}
    if hub_offline():
        raise PolicyLoadError(f"{path}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set (no download): "
                              f"run `huggingface-cli download {path}` where there is network, or pass a local directory")
    endpoint = hub_unreachable()
    if endpoint:   # no network: one line now, not transformers' retries (65 s) and a traceback
        raise PolicyLoadError(f"{path}: not in the local Hugging Face cache, and the hub ({endpoint}) cannot be reached "
                              f"from here: run `huggingface-cli download {path}` where there is network, or pass a "
                              f"local directory")
    return {}


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """The hub's endpoint ($HF_ENDPOINT, default huggingface.co) when a TCP connection to it fails within
    `timeout` seconds, else None. Behind a proxy ($HTTPS_PROXY / $HTTP_PROXY set) nothing is probed (None): a
    direct connection says nothing about the proxied one."""
    import socket
    from urllib.parse import urlparse
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None
    url = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    u = urlparse(url)
    try:
        socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout=timeout).close()
        return None
    except OSError:
        return url


def _check_safetensors(f: Path):
    """Raise PolicyLoadError naming `f` when its header or size is inconsistent (truncated, garbled)."""
    import json
    import struct
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            if n > size - 8:
                raise ValueError(f"header of {n} bytes in a file of {size}")
            header = json.loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except Exception as e:  # struct/json/key errors: all mean a damaged file
        raise PolicyLoadError(f"{f}: not a readable safetensors file ({e}); re-create or re-download it") from None
    if 8 + n + end != size:
        raise PolicyLoadError(f"{f}: truncated or padded safetensors file ({size} bytes, header says {8 + n + end}); "
                              "re-create or re-download it")


_SHA: dict = {}


def file_sha256(f: str | Path) -> str:
    """sha256 of a file's bytes, memoised per (path, mtime, size) in this process."""
    f = Path(f)
    st = f.stat()
    k = (str(f.resolve()), st.st_mtime_ns, st.st_size)
    if k not in _SHA:
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _SHA[k] = h.hexdigest()
    return _SHA[k]


def verify_manifest(path: str | Path) -> int:
    """Check a local policy's weight files against the sha256 of its manifest.json.

    The manifest is `<path>/manifest.json` (a tiny policy: names relative to `path`) or the
    parent's (the stand-ins: names relative to the parent). Returns the number of files checked
    (0 without a manifest); raises PolicyLoadError naming the first file that differs.
    """
    import json
    p = Path(path)
    checked = 0
    for man in (p / "manifest.json", p.parent / "manifest.json"):
        if not man.is_file():
            continue
        try:
            sums = json.loads(man.read_text()).get("sha256") or {}
        except (ValueError, AttributeError) as e:
            raise PolicyLoadError(f"{man}: unreadable manifest ({e})") from None
        base = man.parent
        for name, want in sums.items():
            f = base / name
            if f.suffix != ".safetensors" or f.parent.resolve() != p.resolve():
                continue
            if not f.exists():
                raise PolicyLoadError(f"{f}: listed in {man} but missing")
            got = file_sha256(f)
            if got != want:
                raise PolicyLoadError(f"{f}: sha256 {got[:16]}... does not match {man.name} ({want[:16]}...); "
                                      "the weights changed since the manifest was written: re-create the policy "
                                      "(`make policy` / `make standins`) or restore the file")
            checked += 1
    return checked


def load_policy(path: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu", exact: bool = True):
    """(model, tokenizer) for a local directory or a hub name, in eval mode, in `dtype`.

    A local policy's weights are checked first: the safetensors headers, and their sha256
    against `manifest.json` when there is one. Every error names the directory or file.
    `exact` (default) makes a float64 model float64 throughout (`exact_norms`); False keeps
    transformers' stock float32 norms, for the precision check of notebook 03.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    p = Path(path)
    local = not is_hub_name(path)
    if local and dry_run() is None:
        if not (p / "config.json").exists():
            hint = " Run `make policy` to train the tiny policies." if "policies" in str(path) else ""
            where = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
            raise FileNotFoundError(f"model path {path!s}{where} has no config.json.{hint}")
        for f in sorted(p.glob("*.safetensors")):
            _check_safetensors(f)
        verify_manifest(p)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tok = load_tokenizer(path)
    if dry_run() is not None:  # the runner's --dry-run: the architecture of config.json, random weights
        model = random_model(path, dtype, device, dry_run()["seed"])
        if len(tok) > model.config.vocab_size:
            raise PolicyLoadError(f"{path}: the tokenizer has {len(tok)} tokens, more than the config's "
                                  f"vocab_size {model.config.vocab_size}")
    else:
        try:
            # use_kernels=False: transformers >= 5.25 turns hub kernels on by default when the `kernels` package is
            # installed (it is a dependency), and then re-kernelizes at every train()/eval() switch, which puts the
            # stock float32 RMSNorm back over exact_norms' float64 one (a 5.6e-7 blur in Δlog p of a float64 model
            # once a trainer calls model.train()). The hub's kernels also need the network the tiny profile lacks.
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_kernels=False,
                                                         **hub_kwargs(path)).to(device)
        except Exception as e:
            raise PolicyLoadError(f"{path}: cannot load the model ({type(e).__name__}: {_first_line(e)})") from e
    if exact:
        exact_norms(model)
    model.eval()
    apply_guard(model)  # only with $CANCELLATION_COMPUTE_GUARD set (tests): LM-head calls bounded by token_chunk
    return model, tok


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: str | Path):
    """The tokenizer of the policy at `path` as `load_policy` gives it (left padding, a pad token),
    without loading the model (tagging a cached run's tokens needs no weights). Under a dry run a
    directory without tokenizer files gets the stand-in tokenizer (`standins.build_tokenizer`)."""
    from transformers import AutoTokenizer
    if dry_run() is not None and Path(path).is_dir() and not any((Path(path) / f).exists() for f in TOKENIZER_FILES):
        tok = build_tokenizer()
    else:
        try:
            tok = AutoTokenizer.from_pretrained(str(path), **hub_kwargs(path))
        except PolicyLoadError:
            raise
        except Exception as e:
            raise PolicyLoadError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {_first_line(e)})") from e
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def random_model(path: str | Path, dtype="float32", device: str = "cpu", seed: int = 0):
    """A causal LM with the exact architecture of `path`'s config.json and seeded random weights
    (nothing downloaded: a local directory, or a hub name whose config is in the local cache)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:
        raise PolicyLoadError(f"{path}: no readable config.json for a random model ({type(e).__name__}: "
                              f"{_first_line(e)}); pass a directory holding the model's config.json") from e
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else ""


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


def _rope_forward64(self, x, position_ids):
    if x.dtype != torch.float64:
        return type(self).forward(self, x, position_ids)
    freqs = position_ids[..., None].double() * self.inv_freq.to(device=x.device, dtype=torch.float64)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def exact_rope(model):
    """Make the rotary tables of a float64 model float64 (default RoPE only; idempotent).

    transformers computes cos/sin of the rotary embedding in float32 on every device; CUDA's and the
    CPU's float32 cos differ by an ulp, which moves log p by up to 8e-7 between the devices (measured
    on tiny-s, H100; 3e-14 with float64 tables). The tables do not depend on the weights, so Δlog p
    on one device is unaffected: the notebooks keep the stock tables, the CPU-vs-CUDA tests use these.
    """
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding") and getattr(m, "rope_type", "default") == "default":
            m.forward = types.MethodType(_rope_forward64, m)
    return model


def cast(model, dtype: str | torch.dtype):
    """A deep copy of `model` in `dtype` (analysis passes of the tiny profile run in float64)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return exact_norms(copy.deepcopy(model).to(dtype))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def fingerprint(path: str | Path) -> str:
    """Short content hash of a local policy's weights (a hub name is its own fingerprint).

    Memoised per (file, mtime, size), so notebooks may call it freely; an edited file rehashes.
    """
    p = Path(path)
    if dry_run() is not None:  # random weights: never the key of a real checkpoint's results
        return f"dry-run:{dry_run()['seed']}:{path}"
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else []
    if not files:
        return str(path)
    k = tuple((str(f.resolve()), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    if k not in _FP:
        h = hashlib.sha256()
        for f in files:
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        _FP[k] = h.hexdigest()[:16]
    return _FP[k]


_FP: dict = {}
