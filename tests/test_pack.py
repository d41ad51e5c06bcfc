"""pack: the body forward on the real positions only (issue 52, "padding pack") gives bit for bit the model's own
forward at every real position, and bit for bit its parameters' gradients, so token statistics and GRPO steps
are the padded way's bits (a real tiny-m batch, a row without padding, a heavily padded one, B·L not a multiple of
the matmul tile, float32 with its weight gradients in the padded layout, Qwen3); other models are refused and take
the padded forward."""
import contextlib
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from cancellation import grpo, measure, pack, policy
from cancellation.compute import Compute

CC = Compute()   # the tiny profile's knobs


@pytest.fixture(scope="module")
def uneven_batch(real_batch):
    """The real batch with row 0 real at every column (no padding) and row 1 down to its last prompt token and
    first two response tokens (the rest padding)."""
    b = copy.deepcopy(real_batch)
    first = int(b.response_mask[0].float().argmax())
    b.attention_mask[0] = 1
    b.response_mask[0, first:] = True
    s = int(b.response_mask[1].float().argmax())
    b.attention_mask[1] = 0
    b.attention_mask[1, s - 1:s + 2] = 1
    b.response_mask[1] = False
    b.response_mask[1, s:s + 2] = True
    return b


def _need_tile(model):
    """Skip where this CPU's matmuls keep no row tile the probe tries: packing is off there (the fallback's test
    runs everywhere)."""
    with torch.no_grad():
        if pack.tile(model) is None:
            pytest.skip(f"this CPU's {next(model.parameters()).dtype} matmuls keep none of the row tiles {pack.TILES}")


def _way(packed: bool):
    return contextlib.nullcontext() if packed else pack.padded()


def _body(model, batch, rows=None, cols=None):
    """The model's own body forward (the reference) and the packed one; the real positions."""
    ids, am, pos = measure._inputs(model, batch, rows, cols)
    own = model.get_decoder()(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).last_hidden_state
    keep = pack.positions(am, pack.tile(model))
    assert keep is not None and pack.on(model)
    return own, pack.hidden(model, ids, am, pos, keep), am.bool()


def _grads(model, batch, rows=None, cols=None):
    """The parameters' gradients of a sum over response positions of the final hidden states, padded and packed."""
    out = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        with _way(packed):
            h = measure.forward_hidden(model, batch, rows, cols)
        rm = batch.response_mask if rows is None else batch.response_mask[rows]
        rm = rm if cols is None else rm[:, cols]
        w = torch.randn(h.shape, generator=torch.Generator().manual_seed(0), dtype=h.dtype) * rm[..., None]
        (h * w).sum().backward()
        out.append([p.grad.clone() for p in model.get_decoder().parameters()])
    model.zero_grad(set_to_none=True)
    return out


def _assert_same(model, batch, rows=None, cols=None):
    _need_tile(model)
    with torch.no_grad():
        own, got, real = _body(model, batch, rows, cols)
    assert torch.equal(got[real], own[real])
    assert (got[~real] == 0).all()            # positions not computed (all but a few) are zeros
    padded, packed = _grads(model, batch, rows, cols)
    assert all(torch.isfinite(g).all() for g in packed)
    assert sum(int((g != 0).any()) for g in padded) == len(padded)   # every body parameter gets a gradient
    for (name, _), a, b in zip(model.get_decoder().named_parameters(), padded, packed):
        assert torch.equal(a, b), (name, float((a - b).abs().max() / a.abs().max()))


def _assert_same_step(model, batch):
    """An Adam step over two mini-batches moves θ to the same parameters (and step statistics) packed and padded."""
    cfg = CC.update(optimizer="adam", lr=1e-3, n_minibatches=2)
    theta = []
    for packed in (False, True):
        mm = copy.deepcopy(model)
        with _way(packed):
            infos = grpo.grpo_step(mm, batch, cfg, seed=3, grad_norm=True)
        theta.append(([p.detach() for p in mm.parameters()], infos))
    (pa, ia), (pb, ib) = theta
    assert ia == ib and ia[0]["grad_norm"] > 0
    assert all(torch.equal(a, b) for a, b in zip(pa, pb))
    assert not all(torch.equal(a, b) for a, b in zip(pa, model.parameters()))   # the steps moved θ


@pytest.mark.parametrize("threads", [1, 2])
def test_forward_and_gradients_are_the_models_own(tiny_m, real_batch, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _assert_same(tiny_m[0], real_batch)
    finally:
        torch.set_num_threads(before)


def test_a_row_without_padding_and_one_almost_all_padding(tiny_m, uneven_batch):
    b = uneven_batch
    assert b.attention_mask[0].all() and b.attention_mask[1].sum() == 3
    _assert_same(tiny_m[0], b)


def test_rows_and_columns_off_the_tile(tiny_m, real_batch):
    """7 rows x an odd number of columns: B·L mod 4 = 1 or 3, the padded matmul's last rows in its edge tile."""
    L = real_batch.input_ids.shape[1]
    cols = slice(0, L if L % 2 else L - 1)
    rows = torch.tensor([0, 2, 3, 5, 7, 8, 11])
    assert (len(rows) * (cols.stop - cols.start)) % (pack.tile(tiny_m[0]) or pack.TILE)
    _assert_same(tiny_m[0], real_batch, rows, cols)


def test_token_stats_and_grpo_steps_bit_for_bit(tiny_m, real_batch, uneven_batch):
    """The consumers: token statistics (hidden states included, at the response) and Adam steps over two
    mini-batches, packed vs padded."""
    model = tiny_m[0]
    for b in (real_batch, uneven_batch):
        with pack.padded():
            old = measure.token_stats(model, b, CC, hidden=True)
        new = measure.token_stats(model, b, CC, hidden=True)
        assert torch.equal(new.logp, old.logp) and torch.equal(new.entropy, old.entropy)
        assert torch.equal(new.hidden[b.response_mask], old.hidden[b.response_mask])
    _assert_same_step(model, real_batch)


def test_float32_forward_and_gradients(tiny_m, real_batch):
    """float32 (notebook 07's training): forward and every gradient bit for bit; where this CPU's float32 matmul
    sums a weight's gradient over a row subset otherwise (the AVX2 CPU), it is summed in the padded layout."""
    model = policy.cast(tiny_m[0], "float32")
    _need_tile(model)
    with torch.enable_grad():
        assert pack.refusal(model) is None
    _assert_same(model, real_batch)
    _assert_same_step(model, real_batch)


def test_weight_gradients_in_the_padded_layout(tiny_m, real_batch, monkeypatch):
    """The padded-layout weight gradient (`_PaddedWeightGrad`) is the padded forward's in float64 too, and its
    probe rule holds at the probed tile: a zero product adds nothing to the padded sum."""
    monkeypatch.setattr(pack, "weight_grads_packed", lambda model: False)
    _assert_same(tiny_m[0], real_batch)
    with torch.no_grad():
        for dtype in (torch.float64, torch.float32):
            T = pack._probe(dtype, torch.get_num_threads(), ((128, 128),), True)
            if T is not None:
                assert pack._holds(T, dtype, 128, 128, 1031, True, torch.Generator().manual_seed(5))


def test_stock_norms(real_batch):
    """transformers' own RMSNorm (float32 inside) on a float64 model: notebook 03's precision check loads one."""
    model = policy.load_policy("data/policies/tiny-m", dtype="float64", exact=False)[0]
    assert pack._norm_kind(model.get_decoder().norm) == "stock"
    _assert_same(model, real_batch)


def _qwen3(seed=0):
    """A random small Qwen3 (per-head q/k norms, grouped-query attention) in float64."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=256, attention_bias=True)
    return policy.exact_norms(Qwen3ForCausalLM(cfg).to(torch.float64)).eval()


def test_qwen3(real_batch):
    model = _qwen3()
    assert pack.refusal(model) is None
    _assert_same(model, real_batch)


def test_refusals_fall_back_to_the_padded_forward(tiny_m, real_batch):
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=256)).double().eval()
    assert "llama" in pack.refusal(llama) and not pack.on(llama)
    ids, am, pos = measure._inputs(llama, real_batch)
    with pytest.raises(ValueError, match="padded forward only"):
        pack.hidden(llama, ids, am, pos, pack.positions(am))
    with torch.no_grad():
        want = llama.get_decoder()(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
        assert torch.equal(measure.forward_hidden(llama, real_batch), want)
    model = copy.deepcopy(tiny_m[0])
    hook = model.get_decoder().layers[0].register_forward_hook(lambda *a: None)
    assert pack.refusal(model) == "hooks on the body"
    hook.remove()
    with pack.padded():
        assert not pack.on(model)
    assert pack.on(model)


def test_a_cpu_without_a_tile_packs_nothing(tiny_m, real_batch, monkeypatch):
    """Where the probe finds no tile (another CPU's kernels), the padded forward runs: refusal names the probe and
    forward_hidden is the model's own forward, bit for bit."""
    model = tiny_m[0]
    monkeypatch.setattr(pack, "_probe", lambda *a: None)
    assert "row tiles" in pack.refusal(model) and not pack.on(model)
    ids, am, pos = measure._inputs(model, real_batch)
    with torch.no_grad():
        want = model.get_decoder()(input_ids=ids, attention_mask=am, position_ids=pos).last_hidden_state
        assert torch.equal(measure.forward_hidden(model, real_batch), want)


def test_the_probe_checks_the_rule_it_packs_by():
    """`_holds` is the rule `positions` applies: it holds at the probed tile for a Linear shape of the tiny policy,
    and the kept rows are the real ones, the edge tile and the leading pads that fill a tile."""
    g = torch.Generator().manual_seed(1)
    real = torch.rand(1031, generator=g) < 0.6
    for T in pack.TILES:
        keep = pack._keep(real, T)
        assert real[keep].sum() == real.sum() and len(keep) % T == 1031 % T and keep[-(1031 % T):].tolist() == \
            list(range(1031 - 1031 % T, 1031))
    with torch.no_grad():
        T = pack._probe(torch.float64, torch.get_num_threads(), ((128, 128),), False)
        if T is not None:
            assert pack._holds(T, torch.float64, 128, 128, 258, False, torch.Generator().manual_seed(5))


def test_positions():
    am = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]] * 8)   # 24 x 6: B·L ≡ 0 (mod 4)
    keep = pack.positions(am)
    flat = am.reshape(-1).bool()
    assert len(keep) % pack.TILE == 0 and flat[keep].sum() == flat.sum() and len(keep) - flat.sum() < pack.TILE
    odd = am[:, :5][:23]                                                                  # 23 x 5: B·L ≡ 3 (mod 4)
    keep = pack.positions(odd)
    assert len(keep) % pack.TILE == 3 and keep[-3:].tolist() == [112, 113, 114]           # the padded edge tile
    assert pack.positions(torch.ones(24, 6, dtype=torch.long)) is None                    # nothing to pack
    assert pack.positions(am[:4]) is None                                                  # too few rows


def test_small_or_unpadded_batches_skip_the_probe(tiny_m, real_batch, monkeypatch):
    """A batch that would not be packed (fewer than MIN_ROWS real positions, or no padding) takes the padded
    forward without probing (the probe costs more than such a forward at a large model's shapes)."""
    model = tiny_m[0]

    def probe(*a):
        raise AssertionError("probed")
    monkeypatch.setattr(pack, "_probe", probe)
    am = real_batch.attention_mask
    small = am[:, -(pack.MIN_ROWS // len(am)):]
    assert small.sum() < pack.MIN_ROWS and pack.packed_rows(model, small) is None
    assert pack.packed_rows(model, torch.ones_like(am)) is None
    with pytest.raises(AssertionError, match="probed"):
        pack.packed_rows(model, am)
