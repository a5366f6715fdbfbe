"""Causal suffixes on a cached root (OxyGen's language suffix) and the suffix-only LoRA."""

from oxygen_adapter import oxygen_arrays
from oxygen_ros.backends.fast_path.folding import fold_adapter, fold_layers
from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.lora import AdapterRows, from_oxygen_arrays, RowLoRA
from oxygen_ros.model.pi05 import Pi05Model
import pytest
from reference import reference_text_logits
import torch

NUM_NEW = 4
SUFFIX_LENGTHS = (3, 6)


@pytest.fixture(scope='module', params=list(PrefixAttention))
def model(request):
    torch.manual_seed(0)
    cfg = get_preset('tiny').model.with_overrides(prefix_attention=request.param)
    return Pi05Model(cfg).eval()


@pytest.fixture(scope='module')
def adapter(model):
    return from_oxygen_arrays(oxygen_arrays(model.cfg, rank=4, seed=7, std=0.2), model.cfg,
                              alpha=8.0)


def _root(model, cache, seed=1):
    """Two roots: 2 cameras + 10 prompt tokens, and 1 camera (slot 2) + 4 tokens."""
    gen = torch.Generator().manual_seed(seed)
    size = model.cfg.vision.image_size
    embeds = model.encode_images(torch.rand(2, 3, 3, size, size, generator=gen) * 2 - 1)
    image_mask = torch.tensor([[True, True, False], [False, False, True]])
    tokens = torch.randint(3, 2000, (2, 12), generator=gen)
    token_mask = torch.zeros(2, 12, dtype=torch.bool)
    token_mask[0, :10] = True
    token_mask[1, :4] = True
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                           cache=cache, slots=torch.arange(400).view(2, 200))
    suffix = torch.randint(3, 2000, (2, max(SUFFIX_LENGTHS)), generator=gen)
    suffix_mask = torch.arange(suffix.shape[1]) < torch.tensor(SUFFIX_LENGTHS)[:, None]
    return (embeds, image_mask, tokens, token_mask), prefix, suffix, suffix_mask


def _decode(model, prefix, adapter=None):
    """Greedy loop after ``prefix``: row b writes token i at slot 800 + 100 b + i."""
    b = prefix.batch_size
    logits = [model.lm_logits(prefix.last_hidden)]
    ctx_slots, ctx_mask, tokens = prefix.slots, prefix.mask, []
    for i in range(NUM_NEW):
        token = logits[-1].argmax(-1)
        tokens.append(token)
        write = 800 + 100 * torch.arange(b) + i
        logits.append(model.decode_step(token, prefix.num_tokens + i, prefix.cache, write,
                                        ctx_slots, ctx_mask, adapter))
        ctx_slots = torch.cat([ctx_slots, write[:, None]], 1)
        ctx_mask = torch.cat([ctx_mask, torch.ones(b, 1, dtype=torch.bool)], 1)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def _run(model, adapter=None, rows=(False, False)):
    cache = KVCache(model.cfg.vlm, 1200)
    inputs, root, suffix, suffix_mask = _root(model, cache)
    root_k, root_v = cache.k[:, :400].clone(), cache.v[:, :400].clone()
    lora = AdapterRows(adapter, torch.tensor(rows)) if adapter is not None else None
    slots = 600 + 100 * torch.arange(2)[:, None] + torch.arange(suffix.shape[1])
    full = model.prefill_suffix(suffix, suffix_mask, root, slots=slots, adapter=lora)
    generated, logits = _decode(model, full, lora)
    assert torch.equal(cache.k[:, :400], root_k) and torch.equal(cache.v[:, :400], root_v)
    return inputs, root, suffix, full, generated, logits


def _reference(model, inputs, suffix, generated, row, layers=None):
    embeds, image_mask, tokens, token_mask = inputs
    n = SUFFIX_LENGTHS[row]
    seq = torch.cat([suffix[row:row + 1, :n], generated[row:row + 1]], 1)
    want = reference_text_logits(model, embeds[row:row + 1], image_mask[row:row + 1],
                                 tokens[row:row + 1], token_mask[row:row + 1], seq,
                                 generated_layers=layers)
    return want[0, n:]          # from the last suffix token on


def test_suffix_on_the_root_equals_an_uncached_forward_with_the_same_mask(model):
    """Bidirectional (or causal-text) root, causal suffix, then decoding: one mask."""
    inputs, root, suffix, full, generated, logits = _run(model)
    assert full.num_tokens.tolist() == [r + n for r, n in zip(root.num_tokens.tolist(),
                                                              SUFFIX_LENGTHS)]
    for row in range(2):
        want = _reference(model, inputs, suffix, generated, row)
        assert torch.allclose(logits[row], want, atol=1e-5), (logits[row] - want).abs().max()
        assert torch.equal(want[:NUM_NEW].argmax(-1), generated[row])


def test_adapter_rows_equal_the_merged_weights_and_plain_rows_the_base_model(model, adapter):
    base = _run(model)
    inputs, _, suffix, _, generated, logits = _run(model, adapter, rows=(True, False))
    merged = adapter.merged(model.vlm.layers)
    want = _reference(model, inputs, suffix, generated, 0, merged)
    assert torch.allclose(logits[0], want, atol=1e-5), (logits[0] - want).abs().max()
    assert not torch.allclose(logits[0], base[5][0], atol=1e-3)   # the adapter matters
    # the plain row of a mixed batch is the base model's, bit for bit
    assert torch.equal(logits[1], base[5][1]) and torch.equal(generated[1], base[4][1])


def test_a_zeroed_adapter_gives_the_base_model_exactly(model):
    arrays = {k: v * 0 for k, v in oxygen_arrays(model.cfg, rank=4).items()}
    zero = from_oxygen_arrays(arrays, model.cfg)
    base = _run(model)
    with_zero = _run(model, zero, rows=(True, True))
    assert torch.equal(with_zero[5], base[5]) and torch.equal(with_zero[4], base[4])


def test_the_adapter_equals_oxygens_einsums():
    """Our fused deltas against openpi's ``lora.Einsum`` / ``lora.FeedForward`` equations."""
    cfg = get_preset('tiny').model
    arrays = {k.split('layers/')[1]: torch.from_numpy(v[1]).double()
              for k, v in oxygen_arrays(cfg, rank=3, seed=2).items()}
    alpha = 6.0
    s = alpha / 3
    lora = from_oxygen_arrays(oxygen_arrays(cfg, rank=3, seed=2), cfg, alpha=alpha,
                              dtype=torch.float64).layers[1]
    v = cfg.vlm
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, v.width, generator=gen, dtype=torch.float64)
    enc = torch.randn(2, 5, v.num_heads, v.head_dim, generator=gen, dtype=torch.float64)
    hid = torch.randn(2, 5, v.mlp_dim, generator=gen, dtype=torch.float64)
    row = RowLoRA(lora, torch.ones(2, 1, 1, dtype=torch.float64))
    a = arrays
    # q_einsum "BTD,NDH->BTNH": eqn_a "BTD,NDL->BTNL", eqn_b "BTNL,NLH->BTNH"
    down_q = torch.einsum('btd,ndl->btnl', x, a['attn/q_einsum/lora_a'])
    dq = torch.einsum('btnl,nlh->btnh', down_q, a['attn/q_einsum/lora_b']) * s
    # kv_einsum "BSD,2KDH->2BSKH": eqn_a "BSD,2KDL->2BSKL", eqn_b "2BSKL,2KLH->2BSKH"
    down_kv = torch.einsum('bsd,ckdl->cbskl', x, a['attn/kv_einsum/lora_a'])
    dkv = torch.einsum('cbskl,cklh->cbskh', down_kv, a['attn/kv_einsum/lora_b']) * s
    want_qkv = torch.cat([dq.flatten(2), dkv[0].flatten(2), dkv[1].flatten(2)], -1)
    assert torch.allclose(row.qkv(x), want_qkv, atol=1e-12)
    # attn_vec_einsum "BTNH,NHD->BTD": eqn_a "BTNH,NHL->BTL", eqn_b "BTL,NLD->BTD"
    do = torch.einsum('btl,nld->btd', torch.einsum('btnh,nhl->btl', enc,
                                                   a['attn/attn_vec_einsum/lora_a']),
                      a['attn/attn_vec_einsum/lora_b']) * s
    assert torch.allclose(row.o(enc.flatten(2)), do, atol=1e-12)
    # FeedForward._dot: x a b, no scale; gate rows first, then up
    ga, gb = a['mlp/gating_einsum_lora_a'], a['mlp/gating_einsum_lora_b']
    want_gu = torch.cat([x @ ga[0] @ gb[0], x @ ga[1] @ gb[1]], -1)
    assert torch.allclose(row.gate_up(x), want_gu, atol=1e-12)
    want_down = hid @ a['mlp/linear_lora_a'] @ a['mlp/linear_lora_b']
    assert torch.allclose(row.down(hid), want_down, atol=1e-12)


def test_folded_layers_take_the_folded_adapter(model, adapter):
    for layer in model.vlm.layers:
        assert float(layer.input_norm.weight.detach().abs().max()) > 0   # a scale to fold
    folded = fold_layers(model.vlm.layers)
    lora_f = fold_adapter(adapter, model.vlm.layers)
    x = torch.randn(2, 3, model.cfg.vlm.width)
    cos, sin = torch.ones(2, 3, model.cfg.vlm.head_dim // 2), torch.zeros(
        2, 3, model.cfg.vlm.head_dim // 2)
    mask = torch.tensor([True, False])
    for i, (plain, fold) in enumerate(zip(model.vlm.layers, folded)):
        rows = AdapterRows(adapter, mask).layers(x.dtype)[i]
        rows_f = AdapterRows(lora_f, mask).layers(x.dtype)[i]
        want = plain.project_qkv(x, cos, sin, lora=rows)[:3]
        got = fold.project_qkv(x, cos, sin, lora=rows_f)[:3]
        for w, g in zip(want, got):
            assert torch.allclose(w, g, atol=1e-5)
        attn = torch.randn(2, 3, model.cfg.vlm.num_heads * model.cfg.vlm.head_dim)
        assert torch.allclose(plain.finish(x, attn, None, lora=rows),
                              fold.finish(x, attn, None, lora=rows_f), atol=1e-5)


def test_bad_suffix_inputs_are_refused(model):
    cache = KVCache(model.cfg.vlm, 1200)
    _, root, suffix, _ = _root(model, cache)
    slots = 600 + torch.arange(12).view(2, 6)
    holes = torch.tensor([[True, False, True, False, False, False]] * 2)
    with pytest.raises(ValueError, match='suffix token_mask must be left-aligned'):
        model.prefill_suffix(suffix, holes, root, slots=slots)
    with pytest.raises(ValueError, match=r'suffix tokens must be \[2, T\]'):
        model.prefill_suffix(suffix[:1], None, root, slots=slots[:1])
    with pytest.raises(ValueError, match='slots of new tokens overlap the context'):
        model.prefill_suffix(suffix, None, root, slots=root.slots[:, :6])
