"""The token-level clipped policy loss and one GRPO step.

Loss (docs/methods.md, "The update"; verl `compute_policy_loss_vanilla`, loss_agg_mode="token-mean"):
per token  -min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A), with the dual clip for A < 0 (loss capped at
-A·c), summed over response tokens and divided by the number of response tokens of the
(mini-)batch. Token weights (reweightings, masks) multiply a token's loss; the denominator
stays the mini-batch's token count, so a masked step differs from the full step exactly by the
masked tokens' share of the gradient.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from types import MappingProxyType

import torch

from . import guard, measure
from .guard import check_update, knob
from .measure import forward_logits, token_logp, token_stats

# The reweightings of docs/methods.md ("The update"): name -> the per-rollout weight from the advantages A
# (float64) and the rewards r. A new one is one entry here (UpdateConfig validates against these keys).
REWEIGHTS = MappingProxyType({
    "grpo": lambda A, r: A,                            # the GRPO update itself
    "positive_only": lambda A, r: A * (r > 0.5),       # the rewarded rollouts' share of it
    "negative_only": lambda A, r: A * (r <= 0.5),      # the unrewarded rollouts' share
})
SCOPES = ("full", "lm_head")
OPTIMIZERS = ("adam", "sgd")


@dataclass
class UpdateConfig:
    """One GRPO update: optimizer, scope, reweighting and mini-batching."""
    optimizer: str = "adam"       # 'adam' (training runs) or 'sgd' (plain, no momentum: causal analyses)
    lr: float = 1e-4              # learning rate
    scope: str = "full"           # 'full' (all parameters) or 'lm_head' (unembedding only)
    reweight: str = "grpo"        # 'grpo', 'positive_only' (A·1[r=1]) or 'negative_only' (A·1[r=0])
    n_minibatches: int = 1        # optimizer steps per rollout batch
    clip_low: float = 0.2         # ε_low
    clip_high: float = 0.28       # ε_high (clip-higher)
    clip_ratio_c: float = 3.0     # dual-clip constant for A < 0
    # the memory knobs (guard.KNOB_FIELDS: default and doc declared there); Compute.update fills them from the run's
    chunk_rows: int = knob("chunk_rows")
    token_chunk: int = knob("token_chunk")
    gradient_checkpointing: bool = knob("gradient_checkpointing")
    trim_padding: bool = knob("trim_padding")

    def __post_init__(self):
        for name, allowed in (("optimizer", OPTIMIZERS), ("scope", SCOPES), ("reweight", REWEIGHTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"UpdateConfig.{name}={getattr(self, name)!r}; allowed: {', '.join(allowed)}")
        check_update(self)  # with the Compute guard on (tests): the knobs must be the profile's


def policy_loss(logp, old_logp, advantage, mask, weight=None, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0,
                n_tokens=None):
    """Token-mean clipped PG loss. All arguments (b, L); `n_tokens` overrides the denominator."""
    ratio = torch.exp(logp - old_logp)
    pg1 = -advantage * ratio
    pg2 = -advantage * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip1 = torch.maximum(pg1, pg2)
    clip2 = torch.minimum(-advantage * clip_ratio_c, clip1)
    per_token = torch.where(advantage < 0, clip2, clip1)
    m = mask.bool()
    if weight is not None:
        per_token = per_token * weight
    denom = m.sum() if n_tokens is None else n_tokens
    # verl's masked_sum: `where`, so an off-mask token whose ratio overflows (inf · 0) gives no NaN
    return torch.where(m, per_token, torch.zeros_like(per_token)).sum() / denom


def clip_binds(ratio, advantage, clip_low=0.2, clip_high=0.28):
    """Tokens where the clip binds, verl's `pg_clipfrac` numerator: −A·clip(ρ) > −A·ρ, i.e.
    A > 0 with ρ > 1 + ε_high or A < 0 with ρ < 1 − ε_low (A = 0 never)."""
    return (-advantage * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)) > (-advantage * ratio)


def reweight_advantage(batch, how: str = "grpo") -> torch.Tensor:
    """Per-rollout weight A_i under a reweighting of docs/methods.md ("The update")."""
    if how not in REWEIGHTS:
        raise ValueError(f"unknown reweighting {how!r}; allowed: {', '.join(REWEIGHTS)}")
    return REWEIGHTS[how](batch.advantage.to(torch.float64), batch.reward)


_UNTIED = "_cancellation_untied"   # model attribute: (original head Parameter, config flag) while untied


def is_tied(model) -> bool:
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return head.weight is emb.weight or head.weight.data_ptr() == emb.weight.data_ptr()


def lm_head_param(model) -> torch.nn.Parameter:
    """The unembedding matrix; with tied embeddings, a separate copy of it (docs/methods.md, "The update").

    Untying keeps the original shared Parameter on the model (attribute `_cancellation_untied`),
    so `restore(model, snapshot(model, ...))` re-ties the model exactly as it was (same Parameter
    object in embedding and head, `config.tie_word_embeddings` back): optimizers built over the
    tied model stay valid. The copy persists (and is returned by later calls) until then.
    """
    head = model.get_output_embeddings()
    if is_tied(model):
        object.__setattr__(model, _UNTIED, (head.weight, getattr(model.config, "tie_word_embeddings", None)))
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
        model.config.tie_word_embeddings = False
    return head.weight


def retie(model) -> bool:
    """Undo `lm_head_param`'s untying (the copy is dropped); True if the model was untied by it."""
    saved = model.__dict__.pop(_UNTIED, None)
    if saved is None:
        return False
    param, flag = saved
    model.get_output_embeddings().weight = param
    if flag is not None:
        model.config.tie_word_embeddings = flag
    return True


def scope_params(model, scope: str):
    if scope == "lm_head":
        return [lm_head_param(model)]
    if scope == "full":
        return [p for p in model.parameters()]
    raise ValueError(f"unknown scope {scope!r}; allowed: {', '.join(SCOPES)}")


def make_optimizer(model, cfg: UpdateConfig):
    params = scope_params(model, cfg.scope)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=0.0)


@contextlib.contextmanager
def only_grad_for(model, params):
    """Temporarily freeze every parameter not in `params` (saves the backward through the body)."""
    keep = {id(p) for p in params}
    saved = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in saved:
        p.requires_grad_(id(p) in keep)
    try:
        yield
    finally:
        for p, r in saved:
            p.requires_grad_(r)


def snapshot(model, scope: str = "full") -> dict:
    """Copies of the parameters an update of `scope` can change (restore with `restore`).

    Also records whether the head is an untied copy (`lm_head_param`) at this point, so that
    `restore` brings back the tie state as well: a tied model is tied again after restore.
    """
    untied = _UNTIED in model.__dict__
    if scope == "lm_head":
        head = model.get_output_embeddings().weight
        return {"__lm_head__": head.detach().clone(), "__untied__": untied}
    return {"__untied__": untied, **{k: v.detach().clone() for k, v in model.state_dict().items()}}


@torch.no_grad()
def restore(model, snap: dict):
    snap = dict(snap)
    untied = snap.pop("__untied__", None)
    if untied is False:
        retie(model)
    elif untied is True:
        lm_head_param(model)
    if "__lm_head__" in snap:
        model.get_output_embeddings().weight.copy_(snap["__lm_head__"])
    else:
        model.load_state_dict(snap)


def random_plan(n_rows: int, n_minibatches: int, seed: int = 0) -> list[torch.Tensor]:
    """Default mini-batching: shuffle rows, split into `n_minibatches` near-equal parts."""
    if n_minibatches == 1:
        return [torch.arange(n_rows)]
    perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed))
    return [c for c in torch.tensor_split(perm, n_minibatches) if len(c)]


def _loss_terms(logp, old, adv, tw, mask, cfg: UpdateConfig, n_tok):
    """policy_loss of a chunk (its share of the mini-batch's token mean) and clip statistics."""
    loss = policy_loss(logp, old, adv, mask, tw, cfg.clip_low, cfg.clip_high, cfg.clip_ratio_c, n_tokens=n_tok)
    ratio = torch.exp(logp.detach() - old)
    clipped = float((clip_binds(ratio, adv.detach(), cfg.clip_low, cfg.clip_high) & mask.bool()).sum())  # verl pg_clipfrac
    ratio_dev = float(torch.where(mask.bool(), (ratio - 1).abs(), torch.zeros_like(ratio)).sum())  # mean |ρ - 1|: 0 on an iteration's first step
    return loss, clipped, ratio_dev


def accumulate_grad(model, batch, rows, old_logp, weight, cfg: UpdateConfig, token_weight=None) -> dict:
    """Backward of the mini-batch loss over `rows`; grads accumulate in .grad. Memory-bounded.

    Per chunk of `cfg.chunk_rows` rows the body runs once (final hidden states h, no logits; with
    `cfg.trim_padding` over the chunk's real columns only, rows shortest first: `measure.chunks`).
    The token-mean loss is a sum over response tokens with a fixed denominator N, so it splits
    exactly over chunks of `cfg.token_chunk` positions: each chunk computes its logits from a
    detached copy of h, its loss term and that term's backward (into the LM head's .grad and
    h's .grad), and frees its (token_chunk, V) activations; one backward of h with the
    accumulated gradient then runs through the body. No (rows, L, V) tensor exists.
    """
    rows = torch.as_tensor(rows)
    n_tok = batch.response_mask[rows].sum().clamp(min=1)
    acc = [0.0, 0.0, 0.0]   # loss, clipped tokens, Σ|ρ - 1|, summed in the order of the token chunks
    # A frozen body (lm_head scope) runs without a graph: no activations kept, no backward through it,
    # whatever hooks make the embeddings' output require grad (gradient checkpointing adds one).
    body_grad = any(p.requires_grad for p in model.get_decoder().parameters())
    for r, cols in measure.chunks(batch.attention_mask, rows, cfg):
        with torch.set_grad_enabled(body_grad and torch.is_grad_enabled()):
            h = measure.forward_hidden(model, batch, r, cols)
        _chunk_backward(model, batch, r, cols, h, old_logp, weight, cfg, token_weight, n_tok, acc)
    return _info(acc, n_tok)


def _info(acc, n_tok) -> dict:
    total, clipped, ratio_dev = acc
    return {"loss": total, "clipfrac": clipped / float(n_tok), "n_tokens": int(n_tok),
            "ratio_dev": ratio_dev / float(n_tok)}


def _chunk_backward(model, batch, r, cols, h, old_logp, weight, cfg: UpdateConfig, token_weight, n_tok, acc: list,
                    retain_graph: bool = False) -> None:
    """One chunk's share of `accumulate_grad` from its final hidden states h (rows r, column slice cols): the
    loss terms per `cfg.token_chunk` positions, each with its backward into the LM head's .grad and a detached
    copy of h, then one backward of h through the body (`retain_graph`: keep h's graph for another update
    from the same forward, `Trials`). Adds each token chunk's loss, clipped tokens and Σ|ρ - 1| to `acc`."""
    dev, dt = h.device, h.dtype
    rr, cc = measure.response_positions(batch.response_mask[r][:, cols])
    ids = batch.input_ids[r][:, cols][rr, cc].to(dev)
    adv = weight.detach()[r.to(weight.device)][rr.to(weight.device)].to(dev, dt)
    cb = cc + cols.start   # the batch's columns of the chunk's response positions
    old = old_logp[r.to(old_logp.device)][rr.to(old_logp.device), cb.to(old_logp.device)].to(dev, dt)
    tw = None if token_weight is None else \
        token_weight[r.to(token_weight.device)][rr.to(token_weight.device), cb.to(token_weight.device)].to(dev, dt)
    hd = h.detach().requires_grad_(h.requires_grad)
    rd, cd = rr.to(dev), cc.to(dev)
    n = n_tok.to(dev)
    for t in range(0, len(rr), cfg.token_chunk):
        k = slice(t, t + cfg.token_chunk)
        lsm = torch.log_softmax(measure.head_logits(model, hd[rd[k], cd[k] - 1]), dim=-1)
        logp = lsm.gather(-1, ids[k, None]).squeeze(-1)
        del lsm
        mask = torch.ones_like(logp, dtype=torch.bool)
        loss, c, d = _loss_terms(logp, old[k], adv[k], None if tw is None else tw[k], mask, cfg, n)
        if loss.requires_grad:
            loss.backward()
        acc[0] += float(loss.detach())
        acc[1] += c
        acc[2] += d
    if h.requires_grad and hd.grad is not None:
        h.backward(hd.grad, retain_graph=retain_graph)


def accumulate_grad_unchunked(model, batch, rows, old_logp, weight, cfg: UpdateConfig, token_weight=None) -> dict:
    """The old way (reference for tests and `make bench`): full (rows, L, V) logits per row chunk."""
    rows = torch.as_tensor(rows)
    n_tok = batch.response_mask[rows].sum().clamp(min=1)
    total, clipped, ratio_dev = 0.0, 0.0, 0.0
    for s in range(0, len(rows), cfg.chunk_rows):
        r = rows[s:s + cfg.chunk_rows]
        logits = forward_logits(model, batch, r)
        dev = logits.device
        logp = token_logp(logits, batch.input_ids[r])
        mask = batch.response_mask[r].to(dev)
        adv = weight.detach()[r.to(weight.device)].to(dev, logp.dtype)[:, None] * mask.to(logp.dtype)
        tw = None if token_weight is None else token_weight[r.to(token_weight.device)].to(dev, logp.dtype)
        old = old_logp[r.to(old_logp.device)].to(dev, logp.dtype)
        loss, c, d = _loss_terms(logp, old, adv, tw, mask, cfg, n_tok.to(dev))
        loss.backward()
        total += float(loss.detach())
        clipped += c
        ratio_dev += d
    return {"loss": total, "clipfrac": clipped / float(n_tok), "n_tokens": int(n_tok),
            "ratio_dev": ratio_dev / float(n_tok)}


@contextlib.contextmanager
def checkpointing(model, on: bool):
    """HF activation (gradient) checkpointing of the body for the duration, if `on`; the previous
    state is restored after. HF checkpoints a layer only in training mode, so the checkpointed
    layers (not their submodules: dropout stays off) are flagged as training meanwhile."""
    if not on:
        yield
        return
    was = any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    # transformers' enable also hooks the input embeddings so their output requires grad, and its
    # disable leaves that hook in place: every later forward in grad mode would then build the body's
    # graph (an lm_head step would backpropagate through all layers: 2x its time on an H100). Removed
    # on exit when this context added it.
    hooked = bool(getattr(model, "_require_grads_hooks", None))
    if hasattr(model, "activation_checkpointing_enable"):    # transformers >= 5
        enable = lambda: model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # noqa: E731
        disable = model.activation_checkpointing_disable
    else:
        enable = lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # noqa: E731
        disable = model.gradient_checkpointing_disable
    if not was:
        enable()
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) and not m.training]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False
        if not was:
            disable()
        if not hooked and hasattr(model, "disable_input_require_grads"):
            model.disable_input_require_grads()


def grpo_step(model, batch, cfg: UpdateConfig, optimizer=None, plan=None, token_weight=None, old_logp=None,
              seed: int = 0, unchunked: bool = False, grad_norm: bool = False) -> list[dict]:
    """One GRPO step on a rollout batch: one optimizer step per mini-batch of `plan`.

    `plan`: list of row-index tensors (default: `random_plan` with cfg.n_minibatches).
    `old_logp`: the iteration's log-probs under θ_old (computed here if None); ρ = 1 on the
    first mini-batch and ρ ≠ 1 after it. `token_weight`: optional (B, L) multiplier (masks).
    `unchunked`: the old full-logits way (reference for tests and `make bench` only).
    `grad_norm`: also record each mini-batch's index, row count and gradient norm (training runs).
    Returns one info dict per mini-batch.
    """
    params = scope_params(model, cfg.scope)
    optimizer = optimizer or make_optimizer(model, cfg)
    if old_logp is None:
        old_logp = measure.token_stats_unchunked(model, batch, cfg).logp if unchunked else \
            token_stats(model, batch, cfg).logp
    weight = reweight_advantage(batch, cfg.reweight)
    plan = plan if plan is not None else random_plan(len(batch), cfg.n_minibatches, seed)
    acc = accumulate_grad_unchunked if unchunked else accumulate_grad
    infos = []
    with only_grad_for(model, params), checkpointing(model, cfg.gradient_checkpointing):
        for rows in plan:
            optimizer.zero_grad(set_to_none=True)
            info = acc(model, batch, rows, old_logp, weight, cfg, token_weight)
            if grad_norm:
                norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None))
                info.update(minibatch=len(infos), rows=len(rows), grad_norm=float(norm))
            optimizer.step()
            infos.append(info)
    return infos


class _ClearOnly:
    """An optimizer that clears gradients and never steps: `grpo_step` with it measures every
    mini-batch's gradient at the same θ."""

    def __init__(self, params):
        self.params = list(params)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    def step(self):
        pass


def minibatch_grads(model, batch, plan, cfg: UpdateConfig, old_logp=None) -> list[dict]:
    """Each mini-batch of `plan` as `grpo_step` records it (loss, n_tokens, grad_norm, ...), every one
    at the current θ: no step is taken, so ρ = 1 throughout and only the split differs between plans.
    With ρ = 1 no clip binds and the token-mean loss is linear in its rows, so the token-weighted mean
    of the mini-batch gradients is the whole batch's gradient (notebook 07's Eq. 14 test uses this)."""
    params = scope_params(model, cfg.scope)
    infos = grpo_step(model, batch, cfg, optimizer=_ClearOnly(params), plan=plan, old_logp=old_logp, grad_norm=True)
    model.zero_grad(set_to_none=True)
    return infos


@contextlib.contextmanager
def trial(model, scope: str = "full"):
    """snapshot → (the body: step, measure) → restore, also on error: a single-step experiment
    leaves θ exactly as it found it (tie state included, see `snapshot`)."""
    snap = snapshot(model, scope)
    try:
        yield snap
    finally:
        restore(model, snap)
        model.zero_grad(set_to_none=True)


def trial_delta(model, batch, cfg: UpdateConfig, before_logp: torch.Tensor, measure_batch=None,
                **step_kw) -> torch.Tensor:
    """Δlog p (B, L) of `measure_batch` (default: `batch`) after one `grpo_step` on `batch` from θ,
    θ restored after. `before_logp`: log-probs of `measure_batch` under θ; it is also θ_old of the
    step (ρ = 1) when the step is on the measured batch and no `old_logp` is given."""
    mb = batch if measure_batch is None else measure_batch
    if measure_batch is None:
        step_kw.setdefault("old_logp", before_logp)
    with trial(model, cfg.scope):
        grpo_step(model, batch, cfg, **step_kw)
        return token_stats(model, mb, cfg).logp - before_logp


class Trials:
    """Single updates from one θ₀ on one batch, Δlog p of the whole batch after each, θ₀ back after each
    (Algorithm 2: notebook 04 takes nine per batch).

    `shared=False` is the old way, one `trial_delta` per update: the "before" forward (`token_stats`), and per
    update a forward with a graph, its backward, the step, the "after" forward and the restore; the restore is
    checked at the end by one more forward (`restore_error`: max |Δlog p| against "before").

    `shared=True` runs the forward from θ₀ once, with a graph: the "before" statistics are read from it (the same
    ops as `token_stats`, so the same bits), and every update is a backward of it (`retain_graph`) into the
    gradients, with the same token chunks and the same order of accumulation as `grpo_step`. The step and the
    "after" forward run on a copy of the model reset to θ₀ before each step (the graph holds θ₀'s parameters,
    which must not move). The restore is checked by comparing the parameters with a snapshot of θ₀. With
    `hidden`, "before" also holds θ₀'s final hidden states (`token_stats(hidden=True)`; shared way only: the
    old way's "before" has none), for `coupling.features` to read instead of its own forward. Every
    Δ is bit for bit the old way's (tests/test_trials.py; `make bench` prints both, `trials`).
    It needs what makes the updates' forwards the one from θ₀: one optimizer step (`n_minibatches` 1), one
    chunk of rows (`chunk_rows` ≥ the batch; the tiny profile's), no gradient checkpointing, the same memory
    knobs, and batches that differ in rewards and advantages only; with more than one row chunk (the graph of
    every chunk would be kept: the paper's batches) it falls back to the old way. Memory: one copy of the
    parameters more than the old way.
    """

    def __init__(self, model, batch, knobs, scope: str = "full", shared: bool = True, hidden: bool = False):
        self.model, self.batch, self.knobs, self.scope = model, batch, knobs, scope
        parts = list(measure.chunks(batch.attention_mask, torch.arange(len(batch)), knobs))
        self.shared = shared and len(parts) == 1 and not knobs.gradient_checkpointing
        self._copy = self._h = None
        if not self.shared:
            self.before = token_stats(model, batch, knobs)
            return
        self.snap = snapshot(model, scope)             # before the untying below: `restore` re-ties, as `trial` does
        self.params = scope_params(model, scope)       # (unties an lm_head scope's tied head, as a step would)
        self._rows, self._cols = parts[0]
        B, L = batch.input_ids.shape
        guard.tally_batch(B * L)
        with only_grad_for(model, self.params):
            body_grad = any(p.requires_grad for p in model.get_decoder().parameters())
            with torch.set_grad_enabled(body_grad and torch.is_grad_enabled()):
                self._h = measure.forward_hidden(model, batch, self._rows, self._cols)
        self.before = measure.stats_of_chunk(model, batch, self._rows, self._cols, self._h, knobs.token_chunk,
                                             hidden=hidden)

    def delta(self, cfg: UpdateConfig, batch=None, token_weight=None) -> torch.Tensor:
        """Δlog p (B, L) of the batch after one `grpo_step` from θ₀ on `batch` (default: the trials' batch; another
        must hold the same tokens: a permutation of its advantages), ρ = 1 against "before"."""
        b = self.batch if batch is None else batch
        if not self.shared:
            return trial_delta(self.model, b, cfg, self.before.logp, token_weight=token_weight)
        self._check(cfg, b)
        if self._copy is None:   # the model the steps run on (its parameters θ₀ again after each)
            self._copy = copy.deepcopy(self.model)
            self._params2 = scope_params(self._copy, self.scope)
        for p in self.params:
            p.grad = None
        acc = [0.0, 0.0, 0.0]
        n_tok = b.response_mask.sum().clamp(min=1)
        with only_grad_for(self.model, self.params):
            _chunk_backward(self.model, b, self._rows, self._cols, self._h, self.before.logp,
                            reweight_advantage(b, cfg.reweight), cfg, token_weight, n_tok, acc, retain_graph=True)
        for p, q in zip(self.params, self._params2):
            q.grad, p.grad = p.grad, None
        make_optimizer(self._copy, cfg).step()
        out = token_stats(self._copy, b, cfg).logp - self.before.logp
        self._copy.zero_grad(set_to_none=True)
        with torch.no_grad():
            for q, p in zip(self._params2, self.params):
                q.copy_(p)
        return out

    def _check(self, cfg: UpdateConfig, b) -> None:
        if cfg.scope != self.scope or cfg.n_minibatches != 1:
            raise ValueError(f"Trials(scope={self.scope!r}): an update of scope {cfg.scope!r} with "
                             f"{cfg.n_minibatches} mini-batches does not start from the shared forward")
        moved = [k for k in guard.KNOBS if getattr(cfg, k) != getattr(self.knobs, k)]
        if moved:
            raise ValueError(f"Trials: the update's memory knobs {moved} differ from the shared forward's")
        if b is not self.batch and not all(torch.equal(getattr(b, k), getattr(self.batch, k))
                                           for k in ("input_ids", "attention_mask", "response_mask")):
            raise ValueError("Trials: an update's batch must hold the shared forward's tokens")

    def restore_error(self) -> float:
        """0.0 when θ₀ is back exactly; ends the trials (the shared graph and the copy are freed).
        Old way: max |Δlog p| of one more forward against "before". Shared: the parameters against θ₀'s
        snapshot (the largest |difference|), the model's tie state restored as `trial` restores it."""
        if not self.shared:
            again = token_stats(self.model, self.batch, self.knobs)
            return float((again.logp - self.before.logp)[self.batch.response_mask].abs().max())
        self._h = self._copy = None
        now = self.model.state_dict()
        keys = [k for k in self.snap if not k.startswith("__")]
        if self.scope == "lm_head":
            pairs = [(self.model.get_output_embeddings().weight, self.snap["__lm_head__"])]
        else:
            pairs = [(now[k], self.snap[k]) for k in keys]
        err = max((float((a.detach() - b).abs().max()) for a, b in pairs if not torch.equal(a, b)), default=0.0)
        restore(self.model, self.snap)
        self.model.zero_grad(set_to_none=True)
        return err
