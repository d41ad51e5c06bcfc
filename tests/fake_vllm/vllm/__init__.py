"""A fake `vllm` for the CPU tests of the vLLM seam (tests/test_rollout.py puts it on sys.path).

`LLM` loads the HF model at its path with transformers and samples with it (plain ancestral
sampling with a KV cache, one sequence at a time: the test models are tiny), so rewards are real;
every call is recorded on the instance (`init_kwargs`, `calls`, `outputs`, `loaded`) for the tests
to check arguments, stop ids and seeds. Like vLLM, a response ends at its first stop id (included)
or at max_tokens, and `llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights`
copies (name, tensor) pairs into the model.

Prefix caching (`enable_prefix_caching=True`) is modelled as vLLM does it: the keys and values of
every full block (`block_size` tokens, 16 by default) of a sequence are kept, keyed by the tokens up
to the block's end, as computed when that prefix was first seen; a later request reuses its longest
cached run of whole blocks (never its last prompt token, which is always computed) and computes only
the rest. Pushing new weights does not touch the cache: until `reset_prefix_cache()` a shared prefix
keeps the old weights' keys and values, as in vLLM. Each completion carries `sampled_logprobs` (the
fake's own field: the log-probability of each sampled token under the logits it was drawn from, before
temperature) and each request output `num_cached_tokens` (vLLM's field: prompt tokens served by the cache).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

__version__ = "0.0-fake"


@dataclass
class SamplingParams:
    """The subset of vllm.SamplingParams the artifact uses."""
    n: int = 1
    temperature: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list = field(default_factory=list)
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class CompletionOutput:
    index: int
    token_ids: list
    sampled_logprobs: list = field(default_factory=list)   # the fake's own record (see the module's docstring)


@dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list
    num_cached_tokens: int = 0


class _ModelHandle(torch.nn.Module):
    """What vLLM's model runner holds: here the HF model, with vLLM's load_weights."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf
        self.loaded = []   # names of every tensor pushed through load_weights

    def load_weights(self, weights):
        params = self.hf.state_dict()
        done = set()
        with torch.no_grad():
            for name, w in weights:
                params[name].copy_(w)   # a KeyError here is a name the real vLLM would not know either
                self.loaded.append(name)
                done.add(name)
        return done


class LLM:
    def __init__(self, model, dtype="auto", seed=0, enable_prefix_caching=False, gpu_memory_utilization=0.9, **kw):
        from transformers import AutoModelForCausalLM

        self.init_kwargs = dict(model=model, dtype=dtype, seed=seed, enable_prefix_caching=enable_prefix_caching,
                                gpu_memory_utilization=gpu_memory_utilization, **kw)
        torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
        self.handle = _ModelHandle(self.model)
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=self.handle))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=worker)))
        self.calls = []    # one dict per request: prompt_token_ids, n, max_tokens, temperature, seed, stop_token_ids
        self.outputs = []  # every RequestOutput returned, in order
        self.prefix_caching = bool(enable_prefix_caching)
        self.block_size = int(kw.get("block_size") or 16)   # vLLM's default block size on CUDA
        self.blocks = {}   # tuple of token ids (a multiple of block_size long) -> per layer (keys, values) of them
        self.resets = 0    # reset_prefix_cache() calls
        # transformers 5.x takes the KV cache as `cache` (and warns on the old name), earlier ones as `past_key_values`
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"

    def reset_prefix_cache(self, device=None) -> bool:
        self.blocks.clear()
        self.resets += 1
        return True

    @torch.no_grad()
    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        sampling_params = sampling_params or SamplingParams()
        if not isinstance(sampling_params, (list, tuple)):
            sampling_params = [sampling_params] * len(prompts)
        assert len(sampling_params) == len(prompts), "one SamplingParams per prompt"
        outs = []
        for prompt, sp in zip(prompts, sampling_params):
            ids = list(prompt["prompt_token_ids"])
            self.calls.append(dict(prompt_token_ids=ids, n=sp.n, max_tokens=sp.max_tokens, temperature=sp.temperature,
                                   seed=sp.seed, stop_token_ids=list(sp.stop_token_ids or [])))
            outs.append(self._request(ids, sp))
        self.outputs.extend(outs)
        return outs

    # ------------------------------------------------------------------ the KV cache and the prefix cache
    def _forward(self, ids, kv):
        """Logits at the last of `ids` with the current weights, on top of the cache `kv` (extended in place)."""
        out = self.model(input_ids=torch.tensor([ids]), use_cache=True, **{self._cache_kw: kv})
        return out.logits[0, -1].double()

    def _cache(self, layers):
        from transformers import DynamicCache

        kv = DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(layers):
            kv.update(k.clone(), v.clone(), i)
        return kv

    def _prefill(self, ids):
        """(logits at the prompt's last token, its per-layer keys and values, tokens served by the prefix cache)."""
        hit = 0
        if self.prefix_caching:   # the longest run of cached whole blocks, short of the last prompt token
            B = self.block_size
            hit = next((n for n in range((len(ids) - 1) // B * B, 0, -B) if tuple(ids[:n]) in self.blocks), 0)
        kv = self._cache(self.blocks[tuple(ids[:hit])] if hit else [])
        logits = self._forward(ids[hit:], kv)
        layers = [(layer.keys.clone(), layer.values.clone()) for layer in kv.layers]
        self._remember(ids, layers)
        return logits, layers, hit

    def _remember(self, ids, layers):
        """Keep every full block of `ids` not cached yet, with the keys and values computed now."""
        if not self.prefix_caching:
            return
        for n in range(self.block_size, len(ids) + 1, self.block_size):
            self.blocks.setdefault(tuple(ids[:n]), [(k[:, :, :n].clone(), v[:, :, :n].clone()) for k, v in layers])

    def _request(self, ids, sp):
        gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else 0)
        stop = set(sp.stop_token_ids or [])
        first, prompt_kv, hit = self._prefill(ids)
        completions = []
        for i in range(sp.n):
            kv, logits, seq, lps = self._cache(prompt_kv), first, [], []
            while len(seq) < sp.max_tokens:
                if sp.temperature == 0:
                    tok = int(logits.argmax())
                else:
                    tok = int(torch.multinomial(torch.softmax(logits / sp.temperature, -1), 1, generator=gen))
                seq.append(tok)
                lps.append(float(torch.log_softmax(logits, -1)[tok]))
                if tok in stop or len(seq) == sp.max_tokens:
                    break
                logits = self._forward([tok], kv)
            self._remember(ids + seq[:-1], [(layer.keys, layer.values) for layer in kv.layers])   # what was fed
            completions.append(CompletionOutput(i, seq, lps))
        return RequestOutput(ids, completions, hit)
