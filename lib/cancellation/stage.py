"""The one cache-key builder: every cached stage is declared here, once, with its version and its inputs.

A `Stage` names what it reads; its key is `cache.key(name, params)` over the canonical form of those
inputs, the content fingerprints among them (a policy's `policy.fingerprint`, a problem file's hash in
`ProblemSource.params()`), plus the stage's version; `cache.CODE_VERSION` is added to every key by the
cache. No other code builds a key: a module calls `stage.FIG02.cached(fn, params=P, model=fp, source=src)`
(or `.load`, `.key`), and the stage checks that exactly its declared inputs came.

Canonical form (`canonical`): numbers, strings, None, lists and dicts as they are (recursively); any
object with a `cache_params()` method by what that returns (a figure's Params: every field; a
ProblemSource: its path, kinds, format and content hash; Compute, SampleConfig, RunConfig and
TrainConfig: their fields, nested configs included); any other dataclass is refused (declare its
`cache_params`). An input named `**x` in `reads` is a mapping merged into the key at its top level (a
figure's Params: one key field per parameter; a named input of the same name overrides that field, as
03's inner stages read `n_cands`, `lr`, ... beside the Params); `x?` is left out when None (a knob that
only enters the key when it binds).

Versions: `version` (0: none) is written into the key as `version_field: version`; bump it when the
stage's result changes meaning (a new column, a corrected estimator) and only that stage recomputes.
The field names are the ones each stage's keys were first stored under (`revision`, `effects_columns`,
`shared`, `record`), so the keys of today's cache stay valid. `fixed` holds constant key fields of the
same kind (compatibility with keys written before the declaration). `KEYLESS`: fields of a config
left out of keys at their default values (fields added after entries were cached under keys that
did not have them); `without_defaults` applies it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from . import cache

# fields of a config dropped from keys while at these values (added after entries were cached without them)
KEYLESS = MappingProxyType({
    # a figure's Params (base.FigureParams.cache_params): the grader's knobs also enter through the source
    "params": MappingProxyType({"answer_mode": "auto", "unrewardable_golds": "refuse", "trim_padding": False,
                                "fo_tokens": 0, "hf_sampler": "ours"}),
    # a Compute (Compute.cache_params) and the update config inside a run's (train.run_params)
    "compute": MappingProxyType({"trim_padding": False}),
    "update": MappingProxyType({"trim_padding": False}),
    # a training run's config (train.run_params: RunConfig, TrainConfig)
    "run": MappingProxyType({"run_rounds": 0, "sample_rows": 256, "dynamic_sampling": False, "hf_sampler": "ours"}),
    # a SampleConfig (rollout.config_params)
    "sample": MappingProxyType({"hf_sampler": "ours"}),
})


def without_defaults(d: dict, kind: str) -> dict:
    """`d` without the fields KEYLESS[kind] lists while they hold their listed default (in place; returned)."""
    for k, default in KEYLESS[kind].items():
        if k in d and d[k] == default:
            del d[k]
    return d


def canonical(value):
    """The JSON-able form of a stage input (see the module doc)."""
    if hasattr(value, "cache_params") and not isinstance(value, type):
        return canonical(value.cache_params())
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        raise TypeError(f"{type(value).__name__} is a stage input without cache_params(): declare what of it "
                        "a key holds")
    return value


@dataclass(frozen=True)
class Stage:
    """A cached stage: its name (the cache file's prefix), the inputs its key reads and its version."""
    name: str
    reads: tuple[str, ...]
    version: object = 0              # bump when the result changes meaning; 0: no version field in the key
    version_field: str = "revision"  # the key field the version is written under
    fixed: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # constant key fields
    omit: tuple[str, ...] = ()       # fields of merged (**) inputs left out of the key
    doc: str = ""

    def params(self, **inputs) -> dict:
        """The key's parameters: the canonical form of exactly the declared inputs, the fixed fields and
        the version. A missing or undeclared input is an error naming the stage."""
        names = {r.lstrip("*").rstrip("?"): r for r in self.reads}
        extra = set(inputs) - set(names)
        missing = {n for n, r in names.items() if n not in inputs and not r.endswith("?")}
        if extra or missing:
            raise TypeError(f"stage {self.name!r} reads {', '.join(names)}; "
                            + "; ".join(s for s in (extra and f"undeclared: {', '.join(sorted(extra))}",
                                                    missing and f"missing: {', '.join(sorted(missing))}") if s))
        out: dict = {}

        def put(k, v):
            if k in out:
                raise ValueError(f"stage {self.name!r}: key field {k!r} comes from two inputs")
            out[k] = v
        for n, r in names.items():   # merged inputs first: a named input of the same name then overrides
            if r.startswith("**"):
                for k, x in canonical(inputs[n]).items():
                    if k not in self.omit:
                        put(k, x)
        for n, r in names.items():
            if not r.startswith("**") and not (r.endswith("?") and inputs.get(n) is None):
                out[n] = canonical(inputs[n])
        for k, v in self.fixed.items():
            put(k, v)
        if self.version:
            put(self.version_field, self.version)
        return out

    def key(self, **inputs) -> str:
        """The cache key (file stem) of these inputs."""
        return cache.key(self.name, self.params(**inputs))

    def cached(self, fn, cache_dir=None, **inputs):
        """fn() cached under this stage's key of `inputs` (cache.cached)."""
        return cache.cached(self.name, self.params(**inputs), fn, cache_dir)

    def load(self, cache_dir=None, **inputs):
        """The cached value of these inputs, or cache.MISS."""
        return cache.load(self.name, self.params(**inputs), cache_dir)

    def is_cached(self, cache_dir=None, **inputs) -> bool:
        return self.load(cache_dir, **inputs) is not cache.MISS

    # a key's parameters built once (`params`) and handed on, e.g. to the ranks of --procs N
    def cached_params(self, params: dict, fn, cache_dir=None):
        return cache.cached(self.name, params, fn, cache_dir)

    def load_params(self, params: dict, cache_dir=None):
        return cache.load(self.name, params, cache_dir)


FIGURE = ("**params", "model", "source")   # a figure's Params, the policy's fingerprint, its ProblemSource


def _fixed(**kw) -> MappingProxyType:
    return MappingProxyType(kw)


# ------------------------------------------------------------------------------------------- the registry
# Figure-level stages: one notebook's whole Result (its inner stages stay cached when a version moves).
FIG01_NOISE_FLOOR = Stage("fig01_noise_floor", FIGURE, version=1,
                          doc="01: the repeat and zero-update noise floor (1: the probe batch as numbers, not a line)")
FIG02 = Stage("fig02", FIGURE, version=3, doc="02's Result (2: `terms`; 3: the batch as numbers, not a line)")
FIG03 = Stage("fig03", FIGURE, version=5, version_field="effects_columns",
              doc="03's Result (2: mask_adv_sum; 3: topk_effects; 4: top-k ties in token order; 5: the batch as "
                  "numbers, not a line)")
CATEGORY_SHIFT = Stage("category_shift", FIGURE + ("i", "main"), version=1,
                       doc="04: Algorithm 2 on batch i (main: the thesis rows; 1: random masks, permuted advantages and "
                           "first-order terms)")
FIG05 = Stage("fig05", FIGURE + ("categories", "tagger_used"), version=4,
              doc="05's Result (2: Fig. 5(b)'s peak at the pool's end reads 100%, a rule that can fail; 3: its "
                  "summary as numbers, not lines; 4: intervals resample query groups)")
FIG06 = Stage("fig06", FIGURE, version=3, doc="06's Result (2: groups resampled; 3: its summary as numbers, not lines)")
FIG12 = Stage("fig12", FIGURE, version=4,
              doc="08's Result, the paper's Fig. 12 (2: matched per conf bin; 3: two-way rollout intervals; 4: its "
                  "summaries as numbers, not lines)")

# Stages inside a figure, and the ones several notebooks share.
MASKED_FULL = Stage("masked_full", FIGURE + ("compute", "pool", "n_cands", "n_full", "mask_size", "low_quantile",
                                             "lr", "seed"), doc="03: Table 1's full-scope masked steps of a pool")
MASKED_TOPK_FULL = Stage("masked_topk_full", FIGURE + ("compute", "pool", "sizes", "n", "n_cands", "low_quantile",
                                                       "max_k", "lr", "seed"), version=2,
                         doc="03: Fig. 3(c)'s full-scope top-coupled masked steps of a pool (2: ties in token order)")
SIGN_CONSISTENCY_RUN = Stage("sign_consistency_run", FIGURE + ("run",), doc="03: Fig. 10's training run")
REPEATED_DELTAS = Stage("repeated_deltas", ("model", "dtype", "sample", "optimizer", "lr", "K"),
                        doc="05: K steps' cumulative Δlog p on the value batch")
VALUE_NULL = Stage("value_null", ("model", "dtype", "sample", "lr", "K", "seed"),
                   doc="05: one plain-SGD GRPO step's Δlog p on the value batch under the real advantages (row 0) and "
                       "K within-group sign shuffles of them (the value gap's null)")
BUDGET_SWEEP_NESTED = Stage("budget_sweep_nested", (
    "model", "dtype", "sample", "comp", "lr", "p_max", "prompt_sizes", "n_fixed", "valued_per_prompt", "rollout_sizes",
    "prompts_fixed", "tokens_per_rollout", "G_comp", "comp_groups", "n_seeds", "step_mode", "score_dtype", "seed"),
    doc="06: the sampling-budget sweep of steps")
MC_REWARDS = Stage("mc_rewards", ("model", "prompt", "response", "ban", "M", "seed", "temperature", "max_new_tokens",
                                  "backend", "answer", "verifier", "stops", "device"),
                   doc="05/06: the Monte Carlo rewards of one prefix (value.cached_rewards)")
DELTA_RUN = Stage("delta_run", ("model", "dtype", "device", "**run"), doc="01/08: a GRPO run's per-token Δlog p")
TRAIN_RUN = Stage("train_run", ("model", "dtype", "device", "threads", "**run"),
                  doc="07: one small-trainer run (checkpointed under ckpt/<key>.pt)")
INITIAL_EVAL = Stage("initial_eval", ("model", "dtype", "device", "threads", "sets", "n", "samples", "temperature",
                                      "max_new_tokens", "source", "files"),
                     doc="07: iteration 0's held-out evaluation, shared by every run from one policy")
TRAIN_TRL = Stage("train_trl", ("model", "dtype", "device", "strategy", "**run", "trl_micro_rows?"),
                  version="steps", version_field="record", fixed=_fixed(engine="trl"), omit=("plan",),
                  doc="07: one TRL run (record 'steps': the per-step record; trl_micro_rows only when token_chunk binds)")
LOCAL_IMBALANCE = Stage("local_imbalance", ("model", "dtype", "device", "threads", "draws", "plans", "runs"),
                        version=2, version_field="shared", fixed=_fixed(cross_sign=1),
                        doc="07: Eq. 14 on real batches (2: shared_sq; cross_sign 1: the cross-sign share columns)")
GOLD_CHECK = Stage("gold_check", ("fingerprint", "grader"), doc="a problem file's golds the reward can never credit")

STAGES = MappingProxyType({s.name: s for s in globals().values() if isinstance(s, Stage)})
