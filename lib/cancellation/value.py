"""Monte Carlo counterfactual token value (paper §3, App. E.2).

For token o_t at state s_t = (q, o_<t) with p_t = π(o_t|s_t):

    Δ(o_t|s_t) = Q(s_t, o_t) − E_{a~π, a≠o_t} Q(s_t, a) = (Q(s_t, o_t) − V(s_t)) / (1 − p_t)

estimated from M complete continuations of s_t ⊕ o_t (mean reward avg₀) and M of s_t (avg₋₁):

    'paper'    Δ̂ = (avg₀ − avg₋₁) / (1 − p_t)                       (Eq. 20)
    'exclude'  Δ̂ = avg₀ − avg₋ₒ, the M continuations of s_t drawing their first token from π
               renormalised without o_t. Same target, but its standard error is not inflated by
               1/(1 − p_t), which for a token with p_t = 0.99 is a factor 100.

p_t comes from the training forward (measure.token_stats), never from the sampler. Tokens with
p_t > p_max (1 − 1e-3) are skipped: there the division amplifies Monte Carlo noise without bound.

Cost is 2M continuations per token, so sampling shares prefixes: one prefill per distinct
prefix, its KV cache copied into M rows of the static-cache sampler (`decode_static.py`; a
captured decode step on CUDA unless float64), many prefixes per batch. Every prefix draws
its uniforms from its own generator seeded by (seed, prefix), and tokens are drawn by inverse
CDF, so a prefix's continuations do not depend on which other prefixes share its batch: the
batched sampler returns the same samples as sampling that prefix alone. The rewards of every
(model, prefix, banned token, M, seed, ...) are cached with cache.py, so reruns are instant and
notebooks share them. On GPU, `backend='vllm'` samples with vLLM (n=M; build the LLM with
sampler.make_sampler: prefix caching on, the HF model attached); for 'exclude' the first token
comes from the HF model with o_t removed and vLLM continues from there. Continuations end at
any of rollout.stop_ids.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import cache, extract, grader, grpo, measure, procs, seeds, stage, tasks
from . import stats as _stats
from .decode_static import generate_static
from .guard import check_update, knob
from .rollout import left_pad, stop_ids
from .sampler import load_sampler
from .vllm_seam import sample_vllm_continuations

ESTIMATORS = ("paper", "exclude")


@dataclass
class ValueConfig:
    """Monte Carlo estimation of Δ̂ for a set of tokens."""
    M: int = 32                   # continuations per branch (paper: 256)
    seed: int = 0                 # seeds every prefix's sampler (with the prefix itself)
    temperature: float = 1.0      # sampling temperature of the continuations (p_t assumes 1.0)
    max_new_tokens: int = 96      # response cap of the rollouts: a continuation ends where the rollout would
    estimator: str = "paper"      # 'paper' (Eq. 20) or 'exclude' (see module docstring)
    p_max: float = 1 - 1e-3       # skip tokens with p_t above this
    rows_per_chunk: int = 1024    # continuation rows per sampler batch (prefixes per batch = this // M)
    token_chunk: int = knob("token_chunk")  # a decode step's LM-head calls: rows per call (guard.KNOB_FIELDS)
    backend: str = "hf"           # 'hf' (shared-prefix KV cache) or 'vllm'

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"ValueConfig.estimator={self.estimator!r}; allowed: {', '.join(ESTIMATORS)}")
        if self.backend not in ("hf", "vllm"):
            raise ValueError(f"ValueConfig.backend={self.backend!r}; allowed: hf, vllm")
        if self.M < 2:
            raise ValueError(f"ValueConfig.M={self.M}: need at least 2 continuations for a standard error")
        check_update(self)  # with the Compute guard on (tests): token_chunk must be the profile's


# --------------------------------------------------------------------------- sampling
def prefix_seed(seed: int, ids, ban: int | None) -> int:
    """The generator seed of one prefix: a hash of (seed, prefix ids, banned first token)."""
    blob = json.dumps([int(seed), [int(i) for i in ids], -1 if ban is None else int(ban)]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:7], "little")


@torch.no_grad()
def sample_continuations(model, prefixes, M: int, budgets, eos_id, pad_id: int, seeds, temperature: float = 1.0,
                         bans=None, share_prefill: bool = True, *, token_chunk: int,
                         lean: bool | None = None) -> list[torch.Tensor]:
    """M continuations of each prefix; returns one (M, max(budgets)) long tensor per prefix (on CPU),
    pad after the first stop id.

    prefixes: lists of token ids (prompt + response so far); budgets: max new tokens per prefix
    (≥ 1); eos_id: one stop id or a list (rollout.stop_ids); seeds: one per prefix; bans: per
    prefix a token id the *first* sampled token may not be (None: no ban). The sampler is
    `decode_static.generate_static` (repeats=M): one prefill per prefix, its KV cache copied
    into its M rows; on CUDA (weights other than float64) the decode step is a captured graph.
    share_prefill=False prefills the M copies of a prefix separately (the naive reference; same
    samples); lean=False runs the decode step through the body's modules instead of the lean step
    (`generate_static`'s reference; same samples). Every prefix draws its uniforms from its own generator on the model's device
    (reproducible per device); logits are computed for the last position only and for at most
    `token_chunk` rows at a time.
    """
    P = len(prefixes)
    bans = bans if bans is not None else [None] * P
    dev = next(model.parameters()).device
    stop = [eos_id] if isinstance(eos_id, int) else list(eos_id)
    ids, am = left_pad([list(p) for p in prefixes], pad_id)
    T = max(budgets)
    # uniforms per prefix from its own generator: samples independent of the batch composition
    U = torch.stack([torch.rand(T, M, generator=torch.Generator(device=dev).manual_seed(s), dtype=torch.float64,
                                device=dev) for s in seeds])                   # (P, T, M)
    U = U.permute(1, 0, 2).reshape(T, P * M)                                   # row p * M + m
    budget = torch.as_tensor(budgets, device=dev).repeat_interleave(M)
    ban = torch.tensor([-1 if b is None else b for b in bans], device=dev).repeat_interleave(M)
    rep = M if share_prefill else 1
    if not share_prefill:
        ids, am = ids.repeat_interleave(M, 0), am.repeat_interleave(M, 0)
    out = generate_static(model, ids.to(dev), am.to(dev), T, temperature, stop, pad_id, token_chunk=token_chunk,
                          draw="icdf", repeats=rep, uniforms=U, budgets=budget, bans=ban, lean=lean)
    out = torch.nn.functional.pad(out, (0, T - out.shape[1]), value=pad_id).cpu()
    return [out[i * M:(i + 1) * M] for i in range(P)]


# --------------------------------------------------------------------------- rewards of prefixes
@dataclass(frozen=True)
class Request:
    """Sample M continuations of `prompt + response` (first token never `ban`)."""
    prompt: tuple
    response: tuple
    ban: int | None
    group: int          # index of the problem in the batch


def _chunks(reqs: list[Request], cfg: ValueConfig, stops) -> tuple[list[int], list[list[int]]]:
    """(complete, batches): the requests whose response is complete already (a constant reward), and
    the sampler batches of the others: sorted by prefix length (similar lengths share a batch),
    rows_per_chunk // M prefixes each. The same batches for any number of processes (procs.py)."""
    done, todo = [], []
    for i, r in enumerate(reqs):
        if cfg.max_new_tokens - len(r.response) <= 0 or (r.response and r.response[-1] in stops):
            done.append(i)
        else:
            todo.append(i)
    todo.sort(key=lambda i: len(reqs[i].prompt) + len(reqs[i].response))  # similar lengths share a batch
    per = max(1, cfg.rows_per_chunk // cfg.M)
    return done, [todo[s:s + per] for s in range(0, len(todo), per)]


def _sample_chunk(model, tokenizer, problems, chunk: list[Request], cfg: ValueConfig, verifier, stops,
                  pad: int) -> list:
    """The rewards (np.uint8, length M) of one sampler batch of requests; `problems[r.group]` is the
    problem a request's continuations are graded against."""
    prefixes = [list(r.prompt + r.response) for r in chunk]
    budgets = [cfg.max_new_tokens - len(r.response) for r in chunk]
    seeds = [prefix_seed(cfg.seed, p, r.ban) for p, r in zip(prefixes, chunk)]
    bans = [r.ban for r in chunk]
    if cfg.backend == "vllm":
        conts = sample_vllm_continuations(model, prefixes, cfg.M, budgets, seeds, cfg.temperature, bans, stops)
    else:
        conts = sample_continuations(model, prefixes, cfg.M, budgets, stops, pad, seeds, cfg.temperature, bans,
                                     token_chunk=cfg.token_chunk)
    out = []
    for r, c, b in zip(chunk, conts, budgets):
        seqs = []
        for row in c[:, :b].tolist():  # the response is everything up to and including the first stop id
            row = [t for t in row if t >= 0]
            end = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
            seqs.append(list(r.response) + row[:end])
        texts = tokenizer.batch_decode(seqs, skip_special_tokens=True)
        out.append(np.array([verifier(problems[r.group], t) for t in texts], dtype=np.uint8))
    return out


def _rewards(model, tokenizer, batch, reqs: list[Request], cfg: ValueConfig, verifier, progress: bool,
             on_done=None, keys=None, cache_dir=None) -> list:
    """Reward of each of the M continuations of every request (np.uint8 arrays of length M).

    `on_done(i, rewards)` is called as each sampler batch finishes (the cache writes there, so an
    interrupted run resumes). With $CANCELLATION_PROCS = N > 1 (`run --procs N`) and a sampler
    built by sampler.load_sampler (it carries its recipe), the sampler batches are split over N
    ranks (procs.fan_out; `_rank_rewards`), which write the cache entries `keys` (one per request,
    in `cache_dir`) as their batches finish; the same batches as on one process, so the same
    rewards."""
    from tqdm import tqdm


    hf = getattr(model, "hf_model", model)  # a vllm.LLM from make_sampler carries its HF model
    stops = stop_ids(tokenizer, hf)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    out = [None] * len(reqs)
    done, chunks = _chunks(reqs, cfg, stops)
    for i in done:  # complete already: a constant reward
        text = tokenizer.decode(list(reqs[i].response), skip_special_tokens=True)
        out[i] = np.full(cfg.M, verifier(batch.problems[reqs[i].group], text), dtype=np.uint8)
    recipe = getattr(model, "cancellation_recipe", None)
    if procs.count() > 1 and len(chunks) > 1 and recipe is not None:
        groups = sorted({reqs[i].group for c in chunks for i in c})
        shared = dict(recipe=recipe, model_id=model_id(hf), cfg=cfg, verifier=verifier, cache_dir=cache_dir,
                      problems={g: batch.problems[g] for g in groups})
        units = [([reqs[i] for i in c], [keys[i] for i in c] if keys is not None else None) for c in chunks]
        results = procs.fan_out("cancellation.value:_rank_rewards", shared, units, cuda=_device_type(model) == "cuda",
                                what=f"MC continuations (M={cfg.M})")
        for c, (rewards, vstats) in zip(chunks, results):
            for k, v in vstats.items():  # the ranks' grading tallies (MathVerifier.stats) join this one's
                if isinstance(getattr(verifier, "stats", None), dict):
                    verifier.stats[k] = verifier.stats.get(k, 0) + v
            for i, v in zip(c, rewards):
                out[i] = v
                if on_done is not None:
                    on_done(i, v)
        return out
    for c in tqdm(chunks, desc=f"MC continuations (M={cfg.M})", disable=not progress):
        for i, v in zip(c, _sample_chunk(model, tokenizer, batch.problems, [reqs[i] for i in c], cfg, verifier,
                                         stops, pad)):
            out[i] = v
            if on_done is not None:
                on_done(i, v)
    return out


def _rank_rewards(shared: dict, units: list, local_rank: int | None) -> list:
    """One rank's share of `_rewards`' sampler batches (procs.fan_out): it rebuilds the sampler from
    its recipe (on the rank's own GPU for GPU ranks), checks it holds the caller's weights, samples
    each batch, writes its cache entries, and returns per batch (rewards, the verifier's tally)."""

    recipe = dict(shared["recipe"])
    if local_rank is not None:
        recipe["device"] = f"cuda:{local_rank}"  # its own GPU
    model, tok, sampler = load_sampler(recipe)
    hf = getattr(sampler, "hf_model", sampler)
    if hf is not model:
        del model
    if model_id(hf) != shared["model_id"]:
        raise RuntimeError(f"the sampler rebuilt from {recipe['model_path']} holds other weights than the caller's "
                           "(updated after loading?): its Monte Carlo values cannot be split over processes")
    stops = stop_ids(tok, hf)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    cfg, verifier, d = shared["cfg"], shared["verifier"], shared["cache_dir"]
    out = []
    for reqs, keys in units:
        before = dict(getattr(verifier, "stats", None) or {})
        rewards = _sample_chunk(sampler, tok, shared["problems"], reqs, cfg, verifier, stops, pad)
        for k, v in zip(keys or [], rewards):
            stage.MC_REWARDS.cached_params(k, lambda v=v: v, d)
        after = getattr(verifier, "stats", None) or {}
        out.append((rewards, {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float))}))
    return out


def model_id(model) -> str:
    """Content hash of a model's parameters (the cache key of values sampled from it)."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def verifier_id(verifier) -> str:
    """What grades the rewards, for cache keys: the exact arithmetic check, math-verify (with its
    version and timeout), or another callable by its qualified name."""
    if verifier is None or verifier is tasks.verify:
        return "exact"
    if isinstance(verifier, grader.MathVerifier):
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("math-verify")
        except PackageNotFoundError:  # pragma: no cover
            v = "?"
        mode = f" mode={verifier.mode}" if verifier.mode != extract.FILE_MODE else ""   # the default keeps its old keys
        return f"math-verify {v} timeout={verifier.timeout_s} {verifier.REVISION}{mode}"
    f = getattr(verifier, "__func__", verifier)
    return f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', type(verifier).__qualname__)}"


def _cache_params(mid: str, r: Request, cfg: ValueConfig, answer: str | None = None, verifier: str = "exact",
                  stops=None, device: str | None = None) -> dict:
    """Everything an entry's rewards depend on (stage.MC_REWARDS): the sampler's weights (`mid`), the prefix
    and banned token, the sampling settings and device (random streams differ by device), the stop ids that
    end a continuation, the gold answer and the verifier that grades against it (a changed problem
    file or grader recomputes)."""
    return stage.MC_REWARDS.params(
        model=mid, prompt=list(r.prompt), response=list(r.response), ban=r.ban, M=cfg.M, seed=cfg.seed,
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, backend=cfg.backend, answer=answer,
        verifier=verifier, stops=list(stops) if stops is not None else None, device=device)


def _device_type(model) -> str:
    try:
        return next(getattr(model, "hf_model", model).parameters()).device.type
    except (AttributeError, StopIteration, TypeError):
        return "?"


def cached_rewards(model, tokenizer, batch, reqs, cfg: ValueConfig, mid: str, verifier=None,
                   cache_dir: str | Path | None = None, progress: bool = True, stats: dict | None = None) -> list:
    """`_rewards` through the cache: one entry per (model, prefix, banned token, M, seed, answer, verifier, ...).

    `stats` (a dict) receives requests, cache hits, sampled continuations and seconds spent. An
    unreadable entry is moved aside and recomputed (cache.load).
    """
    import time


    t0 = time.perf_counter()
    verifier = verifier or tasks.verify
    d = Path(cache_dir or cache.DEFAULT_DIR)
    stops = stop_ids(tokenizer, getattr(model, "hf_model", model))
    vid = verifier_id(verifier)
    dev = _device_type(model)
    kp = lambda r: _cache_params(mid, r, cfg, batch.problems[r.group].answer, vid, stops, dev)  # noqa: E731
    found, missing = {}, []
    for i, r in enumerate(reqs):
        v = stage.MC_REWARDS.load_params(kp(r), d)
        if v is cache.MISS:
            missing.append(i)
        else:
            found[i] = v
    sampled = 0
    if missing:
        sub = [reqs[i] for i in missing]
        new = _rewards(model, tokenizer, batch, sub, cfg, verifier, progress,
                       on_done=lambda j, v: stage.MC_REWARDS.cached_params(kp(sub[j]), lambda: v, d),
                       keys=[kp(r) for r in sub], cache_dir=d)
        sampled = cfg.M * sum(cfg.max_new_tokens - len(r.response) > 0 and not (r.response and
                              r.response[-1] in stops) for r in sub)
        for i, v in zip(missing, new):
            found[i] = stage.MC_REWARDS.cached_params(kp(reqs[i]), lambda v=v: v, d)
    if stats is not None:
        stats.update(requests=len(reqs), cache_hits=len(reqs) - len(missing), continuations=int(sampled),
                     seconds=time.perf_counter() - t0)
    return [found[i] for i in range(len(reqs))]


# --------------------------------------------------------------------------- the estimator
def estimate(r0: np.ndarray, r1: np.ndarray, p: float, estimator: str = "paper") -> tuple[float, float]:
    """(Δ̂, standard error) from the rewards of the s⊕o branch (r0) and of the s branch (r1).

    'paper': r1 sampled from π at s, Δ̂ = (avg₀ − avg₋₁)/(1 − p). 'exclude': r1 sampled with
    o banned at s, Δ̂ = avg₀ − avg₋ₒ. SE from the two branches' sample variances (independent).
    """
    a0, a1 = r0.mean(), r1.mean()
    se = np.sqrt(r0.var(ddof=1) / len(r0) + r1.var(ddof=1) / len(r1))
    if estimator == "paper":
        return float((a0 - a1) / (1 - p)), float(se / (1 - p))
    return float(a0 - a1), float(se)


def split_rollout(batch, row: int):
    """(prompt ids, response ids) of one rollout, padding removed."""
    real = batch.attention_mask[row].bool()
    resp = batch.response_mask[row]
    ids = batch.input_ids[row]
    return tuple(ids[real & ~resp].tolist()), tuple(ids[resp].tolist())


def token_values(model, tokenizer, batch, tokens: pd.DataFrame, cfg: ValueConfig | None = None, mid: str | None = None,
                 verifier=None, cache_dir: str | Path | None = None, progress: bool = True,
                 stats: dict | None = None) -> pd.DataFrame:
    """Δ̂ and its standard error for the tokens of `tokens` (rows of measure.token_table: needs
    rollout, position, prob), sampled from `model` (any dtype; p_t is the table's `prob`).

    Returns `tokens` with columns avg0 (mean reward from s⊕o), avg1 (from s, or s without o for
    'exclude'), delta_hat, delta_se, skipped (p_t > p_max; those rows have NaN values). `mid`
    names the model in cache keys (default: a hash of its parameters); `stats` see cached_rewards.
    """
    cfg = cfg or ValueConfig()
    for col in ("rollout", "position", "prob"):
        if col not in tokens:
            raise KeyError(f"token_values: the token table needs a {col!r} column (measure.token_table)")
    mid = mid or model_id(model)
    df = tokens.copy()
    df["skipped"] = df["prob"] > cfg.p_max
    reqs, index = [], {}

    def req(r):
        if r not in index:
            index[r] = len(reqs)
            reqs.append(r)
        return index[r]

    pairs = []
    for row, pos, skip in zip(df["rollout"].to_numpy(), df["position"].to_numpy(), df["skipped"].to_numpy()):
        if skip:
            pairs.append(None)
            continue
        prompt, resp = split_rollout(batch, int(row))
        g = int(batch.group[int(row)])
        with_o = req(Request(prompt, resp[:pos + 1], None, g))
        without = req(Request(prompt, resp[:pos], resp[pos] if cfg.estimator == "exclude" else None, g))
        pairs.append((with_o, without))
    rewards = cached_rewards(model, tokenizer, batch, reqs, cfg, mid, verifier, cache_dir, progress, stats)
    cols = {k: np.full(len(df), np.nan) for k in ("avg0", "avg1", "delta_hat", "delta_se")}
    for n, (pr, p) in enumerate(zip(pairs, df["prob"].to_numpy())):
        if pr is None:
            continue
        r0, r1 = rewards[pr[0]], rewards[pr[1]]
        cols["avg0"][n], cols["avg1"][n] = r0.mean(), r1.mean()
        cols["delta_hat"][n], cols["delta_se"][n] = estimate(r0, r1, float(p), cfg.estimator)
    for k, v in cols.items():
        df[k] = v
    df["M"], df["estimator"] = cfg.M, cfg.estimator
    return df


def value_params(cfg: ValueConfig) -> dict:
    return asdict(cfg)


# --------------------------------------------------------------------------- analysis
def bootstrap_mean(x, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap interval of the mean of x (stats.bootstrap_mean)."""
    return _stats.bootstrap_mean(x, n_boot, seed, alpha)


def bootstrap_gap(b, s, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float, float]:
    """(mean(b) − mean(s), lo, hi): the value gap with a percentile bootstrap interval (stats.bootstrap_gap)."""
    return _stats.bootstrap_gap(b, s, n_boot, seed, alpha)


def balanced_sample(df: pd.DataFrame, by=("sign", "status"), seed: int = 0, n: int | None = None) -> pd.DataFrame:
    """Equal numbers of rows from every cell of `by` (the smallest cell's size, or `n`)."""
    groups = df.groupby(list(by))
    n = min(n or len(df), groups.size().min())
    return groups.sample(n=n, random_state=seed).reset_index(drop=True)


# --------------------------------------------------------------------------- Fig. 11: repeated steps
def repeated_deltas(model, batch, cfg: "grpo.UpdateConfig", K: int) -> np.ndarray:
    """(K, n_response_tokens): cumulative Δlog p = log π_θk − log π_θ0 of every response token
    (row-major over batch.response_mask) after each of K GRPO steps on the same batch with the
    same θ_old = θ0 (K epochs on one rollout batch; one optimizer, its state carried across the
    steps). θ is restored afterwards (grpo.trial)."""
    before = measure.token_stats(model, batch, cfg).logp
    out = []
    with grpo.trial(model, cfg.scope):
        opt = grpo.make_optimizer(model, cfg)
        for _ in range(K):
            grpo.grpo_step(model, batch, cfg, optimizer=opt, old_logp=before)
            after = measure.token_stats(model, batch, cfg).logp
            out.append((after - before)[batch.response_mask].double().cpu().numpy())
    return np.stack(out)


def heldout_deltas(model, batch, other, cfg: "grpo.UpdateConfig") -> np.ndarray:
    """Δlog p = log π_θ1 − log π_θ0 of every response token of `other` (row-major over its
    response_mask) after one GRPO step on `batch`: states the update never saw. θ is restored
    afterwards (grpo.trial)."""
    before = measure.token_stats(model, other, cfg).logp
    with grpo.trial(model, cfg.scope):
        grpo.grpo_step(model, batch, cfg, optimizer=grpo.make_optimizer(model, cfg))
        after = measure.token_stats(model, other, cfg).logp
    return (after - before)[other.response_mask].double().cpu().numpy()


def repeated_gap(values, sign, deltas: np.ndarray, eps: float, n_boot: int = 2000, seed: int = 0,
                 clusters=None) -> pd.DataFrame:
    """Fig. 11 on a fixed pool of valued tokens: after each step k (row k−1 of `deltas`, shape
    (K, n_pool), cumulative Δlog p of the pool's tokens), the pool split by status at step k, the
    sign-balanced value gap (stats.sign_balanced_gap) with a token-bootstrap interval, the share
    of tokens whose status differs from step 1, and gap(k) − gap(1) with a paired bootstrap (the
    same tokens split both ways in every replicate). One row per step. With `clusters` (a label per
    pool token, e.g. its query group) every interval resamples the clusters instead, each drawn
    cluster bringing all its tokens (stats' cluster engine; the same replicates at every step)."""
    values, sign = np.asarray(values, float), np.asarray(sign)
    status = [measure.classify(d, eps) for d in deltas]
    idx = list(_stats.resample_rows(len(values), n_boot, seed, clusters))
    rows = []
    for k, st in enumerate(status, start=1):
        g = _stats.sign_balanced_gap(values, sign, st)
        reps = np.array([_stats.sign_balanced_gap(values[i], sign[i], st[i]) for i in idx])
        reps = reps[np.isfinite(reps)]
        lo, hi = (np.quantile(reps, [0.025, 0.975]) if len(reps) >= n_boot // 2 else (np.nan, np.nan))
        ch, ch_lo, ch_hi = (_stats.paired_gap_change(values, sign, status[0], st, n_boot, seed, clusters=clusters)
                            if k > 1 else (0.0, 0.0, 0.0))
        rows.append(dict(step=k, gap=g, lo=float(lo), hi=float(hi), change=ch, change_lo=ch_lo, change_hi=ch_hi,
                         changed_status=float((st != status[0]).mean()),
                         n_boosted=int((st == "boosted").sum()), n_suppressed=int((st == "suppressed").sum())))
    return pd.DataFrame(rows)


def nonlinear_choice(changed: dict, share: float):
    """The smallest lr whose share of changed statuses (step 1 vs step K) is at least `share`:
    the run Fig. 11's claim reads (None if no lr of the grid gets there). `changed`: lr -> share."""
    ok = sorted(lr for lr, c in changed.items() if c >= share)
    return ok[0] if ok else None


def sign_gaps(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0, status_col: str = "status",
              value_col: str = "delta_hat", clusters=None) -> list[dict]:
    """Fig. 5's value gap of one token table: per rollout sign, mean value of boosted minus
    suppressed tokens (bootstrap, `seed`), and the sign-balanced gap over both signs (`seed + 1`).

    Rows: sign ('pos', 'neg', 'all'), gap, lo, hi, n_boosted, n_suppressed; NaN where a cell is empty.
    Tokens are resampled (within each cell); with `clusters` (a label per row of `df`, e.g. its query
    group) the clusters are resampled instead, each drawn cluster bringing all its tokens of the row's
    cells (stats.bootstrap_gap / balanced_gap with clusters), and each row also holds n_groups (the
    clusters its boosted and suppressed tokens come from).
    """
    cl = None if clusters is None else np.asarray(clusters).ravel()
    if cl is not None and len(cl) != len(df):
        raise ValueError(f"sign_gaps: {len(cl)} cluster labels for {len(df)} rows")
    sg, st, val = df.sign.to_numpy(), df[status_col].to_numpy(), df[value_col].to_numpy()
    rows, cells, labs = [], [], []
    for sign in ("pos", "neg"):
        mb, ms = (sg == sign) & (st == "boosted"), (sg == sign) & (st == "suppressed")
        b, s = val[mb].astype(float), val[ms].astype(float)
        cells.append((b, s))
        lab = None if cl is None else (cl[mb], cl[ms])
        labs.append(lab)
        g, lo, hi = _stats.bootstrap_gap(b, s, n_boot, seed, clusters=lab)
        rows.append(dict(sign=sign, gap=g, lo=lo, hi=hi, n_boosted=len(b), n_suppressed=len(s)))
        if cl is not None:
            rows[-1]["n_groups"] = len(np.unique(np.concatenate(lab)))
    g, lo, hi = _stats.balanced_gap(cells, n_boot, seeds.derive(seed, "balanced_gap"),
                                    clusters=None if cl is None else labs)
    rows.append(dict(sign="all", gap=g, lo=lo, hi=hi, n_boosted=sum(len(b) for b, _ in cells),
                     n_suppressed=sum(len(s) for _, s in cells)))
    if cl is not None:
        rows[-1]["n_groups"] = len(np.unique(np.concatenate([x for lab in labs for x in lab])))
    return rows
