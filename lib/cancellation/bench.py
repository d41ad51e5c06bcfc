"""`make bench`: every expensive computation against its naive way, measured in the same run.

    python -m cancellation.bench            # all benchmarks
    python -m cancellation.bench token_stats
"""
from __future__ import annotations

import copy
import sys
import time

import torch

from . import measure, policy, rollout, scale, tasks

BENCHES = {}


def bench(fn):
    BENCHES[fn.__name__] = fn
    return fn


def timed(fn, repeat: int = 3) -> float:
    """Best wall time of `repeat` calls (seconds)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _policy_batch(n_prompts=16, G=8, dtype="float64"):
    model, tok = policy.load_policy("data/policies/tiny-m", dtype=dtype)
    batch = rollout.sample_batch(model, tok, tasks.sample_problems(n_prompts, seed=5), G=G, seed=5)
    return model, tok, batch


@bench
def token_stats():
    """Token log-probs/entropies of a batch: batched forward (row chunks) vs one forward per sequence."""
    model, _, batch = _policy_batch()
    fast = timed(lambda: measure.token_stats(model, batch, chunk_rows=64))
    slow = timed(lambda: measure.token_stats_per_sequence(model, batch), repeat=1)
    m = batch.response_mask
    err = float((measure.token_stats(model, batch).logp - measure.token_stats_per_sequence(model, batch).logp)[m].abs().max())
    print(f"token_stats: {len(batch)} rollouts, {batch.n_tokens} response tokens, float64, tiny-m\n"
          f"  batched  {fast * 1e3:8.1f} ms\n  per-seq  {slow * 1e3:8.1f} ms\n"
          f"  speed-up {slow / fast:8.1f}x   (max |Δ logp| between them {err:.1e})")


@bench
def categories_tagging():
    """Fig. 4 tagging of 100k response tokens: word-level (detokenise, tag each distinct word once,
    map back) vs naive per-token tagging (every token alone through the NLTK tagger). Budget 10 s."""
    import random

    from . import categories as C
    tok = policy.load_policy("data/policies/tiny-m")[1]
    rng = random.Random(0)
    seqs, n = [], 0
    for p in tasks.sample_problems(4000, seed=0):
        ids = tok(tasks.make_trace(p, rng, error_rate=0.35), add_special_tokens=False).input_ids
        seqs.append(ids)
        n += len(ids)
        if n >= 100_000:
            break
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    pieces = [[vocab[i] for i in s] for s in seqs]
    special = frozenset(tok.all_special_tokens)
    fast = timed(lambda: C.Categorizer(tagger="shipped").tag_ids(seqs, tok), repeat=2)  # fresh caches each time
    cz = C.Categorizer(tagger="shipped")
    slow = timed(lambda: [C.tag_naive(p, "wordpiece", cz, special) for p in pieces], repeat=1)
    a = [c for cs, _ in cz.tag_ids(seqs, tok) for c in cs]
    b = [c for p in pieces for c in C.tag_naive(p, "wordpiece", cz, special)]
    agree = sum(x == y for x, y in zip(a, b)) / len(a)
    print(f"categories_tagging: {len(seqs)} tiny responses, {n} tokens, tagger=shipped (NLTK)\n"
          f"  word-level {fast:8.2f} s   (budget 10 s: {'ok' if fast <= 10 else 'OVER'})\n"
          f"  per-token  {slow:8.2f} s\n  speed-up   {slow / fast:8.1f}x   (labels agree on {100 * agree:.1f}% "
          f"of tokens; the rest need phrase/brace context the per-token way cannot see)")


def _peak_rss(fn):
    """(result, seconds, peak RSS increase in MB) of fn(): a thread polls /proc/self/statm every ms.

    Freed memory is handed back (gc + malloc_trim) first, so an earlier run's arena does not hide
    this one's allocations.
    """
    import ctypes
    import gc
    import os
    import threading

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * page

    base, peak, done = rss(), [0], threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    done.set()
    th.join()
    return out, dt, (max(peak[0], rss()) - base) / 2**20


def _coupling_features(n_tokens, seed=7):
    from . import coupling
    model, tok = policy.load_policy("data/policies/tiny-m", dtype="float64")
    n_prompts = max(4, n_tokens // 380)
    batch = rollout.sample_batch(model, tok, tasks.sample_problems(n_prompts, seed=seed), G=8, seed=seed)
    while batch.n_tokens < n_tokens:
        n_prompts *= 2
        batch = rollout.sample_batch(model, tok, tasks.sample_problems(n_prompts, seed=seed), G=8, seed=seed)
    f = coupling.features(model, batch)
    return model, batch, f, torch.arange(n_tokens)


@bench
def coupling_kernel():
    """Proxy kernel K (N×N): factorised + chunked vs autograd per-token LM-head gradients and their Gram."""
    from . import coupling
    _, _, f, idx = _coupling_features(8192)
    J = idx[:2048]
    K_fast, t_fast, m_fast = _peak_rss(lambda: coupling.kernel(f, J, J, chunk=512))

    def autograd_gram():
        W = f.W.clone().requires_grad_(True)
        grads = torch.empty(len(J), W.numel(), dtype=W.dtype)
        for i, j in enumerate(J.tolist()):   # one per-token V×d gradient each
            logp = torch.log_softmax(f.h[j] @ W.T, -1)[f.o[j]]
            grads[i] = torch.autograd.grad(logp, W)[0].flatten()
        return grads @ grads.T

    K_slow, t_slow, m_slow = _peak_rss(autograd_gram)
    err = float((K_fast - K_slow).abs().max() / K_slow.abs().max())
    del K_fast, K_slow
    a = f.A
    _, t_big, m_big = _peak_rss(lambda: coupling.kernel_matvec(f, a, chunk=1024))
    print(f"coupling_kernel: tiny-m float64, V={f.W.shape[0]}, d={f.h.shape[1]}\n"
          f"  N=2048 factorised+chunked  {t_fast:8.3f} s  peak +{m_fast:7.1f} MB (output 2048² float64 = 32 MB)\n"
          f"  N=2048 autograd per-token   {t_slow:8.3f} s  peak +{m_slow:7.1f} MB\n"
          f"  speed-up {t_slow / t_fast:8.1f}x   memory ratio {m_slow / max(m_fast, 1e-3):6.1f}x   (max rel. diff {err:.1e})\n"
          f"  N=8192 factorised Σ_k A_k K_jk (all N² pairs, nothing N×N stored)  {t_big:8.3f} s  peak +{m_big:7.1f} MB")


def _vocab_standin(rows=8, resp=4096, prompt=16, vocab=151_936, seed=0):
    """A random small Qwen3 (hidden 64, 1 layer, tied) with Qwen's 151,936-token vocabulary, float32,
    and a batch of `rows` rollouts of `prompt` + `resp` tokens (two groups, mixed advantages)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=prompt + resp, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    batch = scale.synthetic_batch(rows // 4, 4, prompt, resp, vocab, seed)
    return model, batch


@bench
def memory():
    """Peak extra memory of token_stats and of one grpo_step on a 151,936-token vocabulary at 4,096
    response tokens per row, 8 rows: token chunks from the final hidden states vs the unchunked way
    (full (rows, L, V) float32 logits), measured in the same run. Target ≥ 10x less, chunked ≤ 2 GB."""
    from . import grpo
    rows, resp = 8, 4096
    model, batch = _vocab_standin(rows, resp)
    V = model.config.vocab_size
    tc_stats, tc_step = 1024, 512
    budget = 12 * 2**30                      # this machine: 24 GB; the old backward holds ~2x the estimate
    est_row = 4 * 4 * (resp + 16) * V        # ~4 live (L, V) float32 tensors per row the old way
    n_old = rows if est_row * rows <= budget else max(1, budget // est_row)
    scale = rows / n_old
    old_batch = batch.select(list(range(n_old)))

    s_new, t_sn, m_sn = _peak_rss(lambda: measure.token_stats(model, batch, chunk_rows=64, token_chunk=tc_stats))
    s_old, t_so, m_so = _peak_rss(lambda: measure.token_stats_unchunked(model, old_batch, chunk_rows=64))
    m = old_batch.response_mask
    err_s = float((s_new.logp[:n_old][m] - s_old.logp[m]).abs().max())
    old_logp = s_new.logp
    del s_new, s_old

    cfg_new = grpo.UpdateConfig(optimizer="sgd", lr=0.1, chunk_rows=64, token_chunk=tc_step)
    cfg_old = grpo.UpdateConfig(optimizer="sgd", lr=0.1, chunk_rows=64)

    def step(b, cfg, unchunked):
        mdl = copy.deepcopy(model)
        # the step's own old_logp pass is left out: ρ = 1 from the given log-probs
        out = _peak_rss(lambda: grpo.grpo_step(mdl, b, cfg, old_logp=old_logp[:len(b)], unchunked=unchunked))
        return mdl, out

    new_model, (_, t_gn, m_gn) = step(batch, cfg_new, False)
    del new_model
    old_model, (_, t_go, m_go) = step(old_batch, cfg_old, True)
    del old_model
    note = (f"  (the unchunked way measured on {n_old} of {rows} rows and scaled x{scale:g} linearly: "
            f"8 rows would need ~{est_row * rows / 2**30:.0f} GB, more than this machine has)\n"
            if n_old < rows else "")
    ms_o, mg_o = m_so * scale, m_go * scale
    print(f"memory: random Qwen3 stand-in (hidden 64, 1 layer, tied), V={V}, float32, {rows} rows x "
          f"{resp} response tokens (+16 prompt), chunk_rows=64\n"
          f"  token_stats chunked (token_chunk={tc_stats})  peak +{m_sn:8.0f} MB  {t_sn:6.1f} s\n"
          f"  token_stats unchunked                  peak +{ms_o:8.0f} MB  {t_so * scale:6.1f} s"
          f"   ratio {ms_o / max(m_sn, 1):5.1f}x   (max |Δ logp| {err_s:.1e})\n"
          f"  grpo_step chunked (token_chunk={tc_step})     peak +{m_gn:8.0f} MB  {t_gn:6.1f} s\n"
          f"  grpo_step unchunked                    peak +{mg_o:8.0f} MB  {t_go * scale:6.1f} s"
          f"   ratio {mg_o / max(m_gn, 1):5.1f}x\n" + note +
          f"  target: >= 10x less and chunked <= 2048 MB: "
          f"{'ok' if min(ms_o / max(m_sn, 1), mg_o / max(m_gn, 1)) >= 10 and max(m_sn, m_gn) <= 2048 else 'MISSED'}")


@bench
def masked_updates():
    """Masking effect per candidate: shortcut (M's share of the gradient) vs re-running the masked step."""
    from . import coupling
    model, batch, f, _ = _coupling_features(5000, seed=3)
    cands, sets = coupling.masking_sets(f, 30, 8, 0.5, seed=0)
    M = sets["both"]
    n = 100
    c_many, M_many = cands.repeat(n // len(cands) + 1)[:n], M.repeat(n // len(cands) + 1, 1)[:n]
    t_lm = timed(lambda: coupling.masked_effects_lm_head(f, c_many, M_many, 0.1), repeat=1) / n
    coupling.masked_effects_full(model, batch, f, cands[:1], M[:1], 0.1)  # warm-up
    # per-candidate cost = slope between 1 and k candidates (the θ' step is paid once in both)
    t0 = time.perf_counter()
    coupling.masked_effects_full(model, batch, f, cands[:1], M[:1], 0.1)
    t_one = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast = coupling.masked_effects_full(model, batch, f, cands, M, 0.1)
    t_k = time.perf_counter() - t0
    t_full = max((t_k - t_one) / (len(cands) - 1), 1e-6)
    t_setup = t_one - t_full
    t0 = time.perf_counter()
    slow = [coupling.masked_effect_bruteforce(model, batch, int(c), m, f, 0.1) for c, m in zip(cands[:2], M[:2])]
    t_brute = (time.perf_counter() - t0) / 2
    t0 = time.perf_counter()
    slow_lm = coupling.masked_effect_bruteforce(model, batch, int(cands[0]), M[0], f, 0.1, scope="lm_head")
    t_brute_lm = time.perf_counter() - t0
    err = max(abs(float(fast[i]) - slow[i]) / abs(slow[i]) for i in range(2))
    print(f"masked_updates: tiny-m float64, {len(batch)} rollouts, {batch.n_tokens} tokens, |M| = 8, SGD lr 0.1\n"
          f"  full scope: shortcut {t_full:8.3f} s/candidate (+ {t_setup:.1f} s once for θ')   "
          f"re-run {t_brute:8.2f} s/candidate   speed-up {t_brute / t_full:6.1f}x (rel. diff {err:.1e})\n"
          f"  lm_head:    closed form {t_lm * 1e3:8.3f} ms/candidate   re-run {t_brute_lm:8.2f} s/candidate   "
          f"speed-up {t_brute_lm / t_lm:8.0f}x")


@bench
def value_continuations():
    """Monte Carlo continuations (value.py): shared-prefix batched sampling vs `generate` per continuation set."""
    from . import value
    model, tok, batch = _policy_batch(n_prompts=4, G=4, dtype="float32")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny decode steps: one thread is fastest, and both paths get the same
    M, prefixes, budgets = 16, [], []
    for row in range(len(batch)):
        prompt, resp = value.split_rollout(batch, row)
        for t in (0, len(resp) // 3, 2 * len(resp) // 3):
            prefixes.append(list(prompt + resp[:t]))
            budgets.append(96 - t)
    seeds = list(range(len(prefixes)))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    n = M * len(prefixes)

    def shared():
        for s in range(0, len(prefixes), 64):
            value.sample_continuations(model, prefixes[s:s + 64], M, budgets[s:s + 64], eos, pad, seeds[s:s + 64])

    def naive():  # one generate call per continuation set: the prefix copied M times, prefilled M times
        g = torch.Generator().manual_seed(0)
        for p, b in zip(prefixes, budgets):
            ids = torch.tensor([p] * M)
            rollout.generate(model, ids, torch.ones_like(ids), b, 1.0, eos, pad, generator=g)

    fast, slow = timed(shared, repeat=1), timed(naive, repeat=1)
    torch.set_num_threads(threads)
    print(f"value_continuations: {len(prefixes)} prefixes x M={M} = {n} continuations, tiny-m float32, 1 thread\n"
          f"  shared-prefix batched {n / fast:8.1f} continuations/s\n  generate per set      {n / slow:8.1f} "
          f"continuations/s\n  speed-up {slow / fast:8.1f}x")


@bench
def monitor():
    """CancellationMonitor on a TRL run: time per optimizer step with the monitor on vs off."""
    from . import engine
    engine.bench_monitor()


def main(argv=None):
    names = (argv if argv is not None else sys.argv[1:]) or list(BENCHES)
    torch.manual_seed(0)
    for n in names:
        if n not in BENCHES:
            sys.exit(f"unknown benchmark {n!r}; known: {', '.join(BENCHES)}")
        BENCHES[n]()


if __name__ == "__main__":
    main()
