"""What every figure module shares: the Params base (one source of a notebook's parameters),
field helpers for the parameters most notebooks take, and the inputs of a figure-level stage (stage.py).

A figure's `Params` is a dataclass of `param(default, doc, **rules)` fields. The runner reads
its defaults, types, docs and rules to validate a profile and `-p` overrides before anything
runs; profiles only override values. The notebook gets the resolved values as one dict and builds
`P = figNN.Params(**params)`. The rules:

    min / max      inclusive bounds (numbers; for a list, every element)
    gt / lt        exclusive bounds
    choices        the allowed values (for a list, of every element)
    nonempty       a list or string must not be empty
    distinct       a list must not repeat an element
    path="file"    an existing file; "" (none) allowed when the default is "" or with optional=True
    path="model"   an existing local directory or a hub repo id ("org/name"); a relative path that
                   does not exist is an error, never sent to the hub
    path="file-or-choice"   an element of `choices` or an existing file (eval_sets)

Numbers are always finite. Relative paths given on the command line resolve against the working
directory; those in profiles and defaults against the repository. `CONSTRAINTS` holds
(check, message) pairs checked after the rules: `check` is a function whose arguments are the parameters it
reads (`lambda lr, lrs: lr in lrs`), called with their values; false or an exception fails it with `message`.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from .. import extract, grader, manifest, plan, policy, rollout, sampler, sampling_path, sources, stage
from ..compute import Compute
from ..dryrun import dry_run
from ..guard import knob


def param(default, doc: str, **rules):
    """A Params field: its default, a one-line doc and the runner's validation rules."""
    meta = {"doc": doc, "rules": rules}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


# ----------------------------------------------------------------------------- the parameters most figures take
# One helper per field: its rules and its usual doc, declared once. A figure passes its own default, and a doc
# only where it says more about what the field does there (`G: int = base.G(16, "rollouts per prompt in the base
# batch")`); the rules are the helper's. The field stays where the figure declares it (its Params' order).
DTYPES = ["float64", "float32", "bfloat16", "float16"]


def model_path(default: str = "data/policies/tiny-m",
               doc: str = "policy: a local Hugging Face model directory or a hub repo id"):
    return param(default, doc, path="model")


def dtype(default: str = "float64",
          doc: str = "precision of analysis forwards and updates (float64: SGD-size Δ are below float32 round-off)"):
    return param(default, doc, choices=list(DTYPES))


def sample_dtype(default: str = "", doc: str = "dtype of the sampler copy (batches, Monte Carlo continuations); "
                 "empty: the training model itself (paper: bfloat16)"):
    return param(default, doc, choices=["", *DTYPES])


def backend(doc: str = "sampler: 'hf' (our KV-cache sampler) or 'vllm' (GPU; weights pushed after every update)"):
    return param("hf", doc, choices=["hf", "vllm"])


def hf_sampler():
    return param("auto", "the hf backend's sampling path: 'ours' (our static-cache sampler), 'transformers' (its "
                 "generate, static cache + compile on CUDA) or 'auto' (ours on a CPU; on a CUDA card the cheaper end "
                 "to end at this notebook's own sampling calls, first calls included, from the card's gpu-check "
                 "report, ours where it measured neither: sampling_path.py)", choices=list(sampling_path.PATHS))


def gpu_memory_utilization():
    return param(rollout.GPU_MEMORY_UTILIZATION, "vLLM's share of GPU memory, beside the training model", gt=0, max=1)


def gradient_checkpointing(doc: str | None = None):
    return knob("gradient_checkpointing", doc)


def sample_rows():
    return param(256, "rollouts per HF sampler call: bounds the sampler's KV cache (rows x (prompt + max_new_tokens))",
                 min=1)


def seed(doc: str = "seeds prompts, sampling and every random draw of the figure"):
    return param(0, doc, min=0)


# the sizes of a sampled batch (base.sample_config, train.RunConfig / TrainConfig read them by these names)
def n_prompts(default: int, doc: str = "prompts per batch"):
    return param(default, doc, min=1)


def G(default: int = 8, doc: str = "rollouts per prompt (≥ 2: one rollout gives no advantage)"):
    return param(default, doc, min=2)


def temperature(default: float = 1.0, doc: str = "sampling temperature"):
    return param(default, doc, gt=0)


def max_new_tokens(default: int = 96, doc: str = "response length cap"):
    return param(default, doc, min=1)


# what the Δlog p figures share
def eps(default: float = 1e-6, doc: str = "boosted/suppressed threshold on Δlog p"):
    return param(default, doc, gt=0)


def tagger(doc: str = "POS tagger of the token categories"):
    return param("shipped", doc, choices=["shipped", "auto", "perceptron"])


@dataclass
class FigureParams:
    """Base of every figure's Params: the Compute config and the runner's view of the fields."""
    # (check, message): check(**the parameters named by its arguments) -> bool, run by the runner after the rules
    CONSTRAINTS: ClassVar[tuple] = ()
    # The fields every notebook takes, declared here once (a figure redeclares one only to change its default).
    device: str = param("cpu", "cpu, cuda or cuda:N", nonempty=True)
    threads: int = param(1, "torch CPU threads on the CPU, pinned: a float sum can split by the thread count, so "
                         "the numbers would follow the machine's cores (make figures runs notebooks side by side, "
                         "one thread each)", min=1)
    chunk_rows: int = knob("chunk_rows")      # the memory knobs: default, doc and rules in guard.KNOB_FIELDS
    token_chunk: int = knob("token_chunk")
    trim_padding: bool = knob("trim_padding")
    problems_path: str = param("", "real problems (DAPO-Math-17k / MATH-500 / prompt+answer file); empty: generated "
                               "arithmetic", path="file")
    prompt_format: str = param("auto", "'auto' (chat template when the tokenizer has one), 'chat' or 'raw'",
                               choices=["auto", "chat", "raw"])
    answer_mode: str = param("auto", "how the reward finds a response's answer: 'answer_line' (DAPO's last Answer: "
                             "line), 'boxed' (last \\boxed{}), 'last_sentence' (the answer the final sentence "
                             "states) or a '+' combination (the last candidate in the response is graded); 'auto': "
                             "the paper's (a file: answer_line+boxed; generated arithmetic: exact \\boxed{})",
                             choices=list(extract.ANSWER_MODES))
    unrewardable_golds: str = param("refuse", "a problem file with golds the reward can never credit (the gold "
                                    "check): 'refuse' it, 'skip' those problems, or 'allow' them (kept, never "
                                    "rewarded)", choices=list(sources.GOLD_POLICIES))
    hf_sampler: str = hf_sampler()

    def hf_path(self) -> str:
        """The path the hf backend samples with on this device ('auto' resolved: `sampling_path.resolve`): on a
        CPU ours, nothing counted; on a CUDA card the end-to-end choice at this notebook's own sampling calls
        (`plan.sampling_calls` of these Params, counted only there, through a function), printed in one line.
        Memoised per notebook and device kind (`sampling_path.notebook_choice`): the calls are counted and the
        line printed once in a process; every later hf_path of the notebook there -- each cache key, each batch --
        gets the same path, whatever Params instance asks."""
        return sampling_path.resolve(self.hf_sampler, str(self.device), calls=lambda: plan.sampling_calls(self),
                                     notebook=self.notebook())

    @classmethod
    def notebook(cls) -> str:
        """The name of the notebook these Params belong to: its stem in the manifest (`02_coupling_heatmaps`),
        else the Params' module's last name (a figure outside the manifest)."""
        mod = cls.__module__
        return next((f.notebook for f in manifest.FIGURES if f"{f.package}.{f.module}" == mod), mod.rsplit(".", 1)[-1])

    def compute(self) -> Compute:
        """The Compute config of these parameters (the knobs the figure declares; defaults for the rest)."""
        return Compute.from_params(dataclasses.asdict(self))

    def cache_params(self) -> dict:
        """Every parameter, for cache keys (a stage adds the content fingerprints of files and models);
        the fields stage.KEYLESS['params'] lists only when not at their defaults. hf_sampler as resolved
        (`hf_path`): in the key only when the batches were not sampled by ours."""
        return stage.without_defaults({**dataclasses.asdict(self), "hf_sampler": self.hf_path()}, "params")

    @classmethod
    def defaults(cls) -> dict:
        return dataclasses.asdict(cls())

    @classmethod
    def rules(cls) -> dict:
        return {f.name: dict(f.metadata.get("rules", {})) for f in fields(cls)}

    @classmethod
    def docs(cls) -> dict:
        return {f.name: f.metadata.get("doc", "") for f in fields(cls)}


# ------------------------------------------------------------------ what every compute() starts with
def pin_threads(P):
    """torch's CPU threads set to P.threads (on the CPU; an accelerator run leaves them): the first line of
    every compute(), so a notebook's numbers do not depend on how many cores the machine has."""
    if str(P.device) == "cpu":
        torch.set_num_threads(P.threads)


def problem_source(P) -> sources.ProblemSource:
    """The figure's problems, loaded now: a malformed problem file stops here, before any model loads."""
    source = sources.ProblemSource(path=P.problems_path, prompt_format=P.prompt_format, answer_mode=P.answer_mode,
                                   unrewardable_golds=P.unrewardable_golds)
    source.load()
    if source.path and dry_run() is None:   # what the reward can never credit, said (or refused) before the run
        print(source.admit(), flush=True)
    return source


def batch_facts(batch, n_prompts: int, source: sources.ProblemSource, **more) -> dict:
    """The numbers of a figure's line on its batch (Results hold numbers; each module's `summary(R)` writes
    the line): rollouts, accuracy, mixed-reward groups of `n_prompts`, how the rewards were graded, and `more`."""
    return dict(rollouts=len(batch), accuracy=float(batch.reward.mean()), mixed_groups=int(batch.mixed_groups()),
                n_prompts=n_prompts, grading=source.grading(), **more)


def with_grading(line: str, facts: dict) -> str:
    """`line`, then the grader's line (grader.grading_report) when the rewards were not the exact check."""
    report = grader.grading_report(facts.get("grading") or {})
    return line + ("\n" + report if report else "")


class NoSignal(ValueError):
    """A batch that carries no GRPO signal: no group mixes rewarded and unrewarded responses, so every
    advantage is 0. The runner prints its message as the notebook's one-line outcome."""


def require_signal(batch, source: sources.ProblemSource, what: str):
    """Stop with NoSignal, one line naming the cause and the knobs, when `batch` has no mixed-reward group."""
    A = batch.advantage
    if bool((A > 0).any()) and bool((A < 0).any()):
        return
    raise no_signal(what, int((batch.reward > 0).sum()), len(batch.reward), source)


def no_signal(what: str, rewarded: int, total: int, source: sources.ProblemSource | None, report: str = "") -> NoSignal:
    """The NoSignal error of `require_signal`, for callers that hold counts rather than a batch (source None:
    the grading happened elsewhere, e.g. in 07's run processes, whose `report` the caller gives instead)."""
    report = source.reward_report() if source is not None else report
    return NoSignal(f"{what}: no group mixes rewarded and unrewarded responses ({rewarded} of {total} "
                   "rewarded), so every advantage is 0 and there is nothing to measure; the problems are too hard "
                   "or too easy for this policy, or the answer column is wrong: use other problems (problems_path), "
                   "more rollouts (G, n_prompts) or another temperature"
                   + (f" [{report}]" if report else ""))


def inputs(P, source: sources.ProblemSource, model_path: str | None = None) -> dict:
    """The inputs of a figure-level stage (`stage.FIGURE`): every parameter (the Compute knobs among them),
    the policy's content fingerprint and the problems."""
    return dict(params=P, model=policy.fingerprint(model_path or P.model_path), source=source)


def cached(st: stage.Stage, P, source: sources.ProblemSource, fn, **extra):
    """fn() cached under the figure stage `st` of `inputs(P, source)` and `extra` (more inputs it declares)."""
    return st.cached(fn, **inputs(P, source), **extra)


def sample_config(P, source: sources.ProblemSource, sampler: bool = False, **over) -> rollout.SampleConfig:
    """The figure's SampleConfig: its sizes, temperature, device and token_chunk; with `sampler`, also
    the knobs of the sampler `load_sampler` builds (backend, sample_dtype, gpu_memory_utilization).
    Without it, rows are drawn from the float policy itself (the SampleConfig's defaults)."""
    kw = dict(n_prompts=P.n_prompts, G=P.G, temperature=P.temperature, max_new_tokens=P.max_new_tokens,
              device=P.device, source=source, token_chunk=P.token_chunk, chunk_size=P.sample_rows,
              hf_sampler=P.hf_path())
    if sampler:
        kw.update(backend=P.backend, dtype=P.sample_dtype, gpu_memory_utilization=P.gpu_memory_utilization)
    kw.update(over)
    return rollout.SampleConfig(**kw)


def load_sampler(P):
    """(model, tokenizer, sampler) for a figure that samples with `backend`/`sample_dtype`: the
    float policy it measures, and a `sample_dtype` copy (hf) or vLLM over the same checkpoint.
    Seeds torch with P.seed first (and sets P.threads CPU threads), so what follows is reproducible."""
    return sampler.load_sampler(dict(model_path=P.model_path, dtype=P.dtype, device=P.device, backend=P.backend,
                                     sample_dtype=P.sample_dtype, seed=P.seed,
                                     gpu_memory_utilization=P.gpu_memory_utilization, threads=P.threads))
