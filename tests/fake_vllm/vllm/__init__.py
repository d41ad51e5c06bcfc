"""A fake `vllm` for the CPU tests of the vLLM seam (tests/test_rollout.py puts it on sys.path).

`LLM` loads the HF model at its path with transformers and samples with it (plain ancestral
sampling, no cache: the test models are tiny), so rewards are real; every call is recorded on
the instance (`init_kwargs`, `calls`, `loaded`) for the tests to check arguments, stop ids and
seeds. Like vLLM, a response ends at its first stop id (included) or at max_tokens, and
`llm.llm_engine.model_executor.driver_worker.worker.model_runner.model.load_weights` copies
(name, tensor) pairs into the model.
"""
from __future__ import annotations

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


@dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list


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
            outs.append(RequestOutput(ids, [CompletionOutput(i, s) for i, s in enumerate(self._sample(ids, sp))]))
        return outs

    def _sample(self, ids, sp):
        gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else 0)
        stop = set(sp.stop_token_ids or [])
        seqs = []
        for _ in range(sp.n):
            seq = []
            while len(seq) < sp.max_tokens:
                logits = self.model(input_ids=torch.tensor([ids + seq])).logits[0, -1].double()
                if sp.temperature == 0:
                    tok = int(logits.argmax())
                else:
                    tok = int(torch.multinomial(torch.softmax(logits / sp.temperature, -1), 1, generator=gen))
                seq.append(tok)
                if tok in stop:
                    break
            seqs.append(seq)
        return seqs
