"""prefill: packing, prefix attention modes, split prefill with a context, input checks."""

from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.model.prefix import padded_prefix
import pytest
from reference import joint_forward
import torch

TI = 64  # image tokens per camera in the tiny preset


def _model(attention):
    torch.manual_seed(0)
    return Pi05Model(get_preset('tiny').model.with_overrides(prefix_attention=attention)).eval()


@pytest.fixture(scope='module')
def causal():
    return _model(PrefixAttention.CAUSAL_TEXT)


@pytest.fixture(scope='module')
def bidirectional():
    return _model(PrefixAttention.BIDIRECTIONAL)


def _inputs(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = model.cfg.vision.image_size
    embeds = model.encode_images(torch.rand(2, 3, 3, size, size, generator=gen) * 2 - 1)
    image_mask = torch.tensor([[True, False, True], [True, True, False]])
    tokens = torch.randint(3, 5000, (2, 10), generator=gen)
    token_mask = torch.arange(10)[None, :] < torch.tensor([[7], [10]])
    return embeds, image_mask, tokens, token_mask


def _image_kv(prefix):
    """K/V of the 2 * TI image tokens of each sample, ``[L, B, 2 * TI, Hkv, D]``."""
    slots = prefix.slots[:, :2 * TI]
    return prefix.cache.k[:, slots], prefix.cache.v[:, slots]


def test_prefill_kv_and_hidden_match_joint_forward(bidirectional):
    model = bidirectional
    embeds, image_mask, tokens, token_mask = _inputs(model)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    assert prefix.num_tokens.tolist() == [2 * TI + 7, 2 * TI + 10]
    assert prefix.mask.sum(1).tolist() == prefix.num_tokens.tolist()
    pe, pv, pa = padded_prefix(model, tokens, token_mask, embeds, image_mask)
    hidden, _ = joint_forward(model, pe, pv, pa)
    for b in range(2):
        last = pv[b].nonzero().max()
        assert torch.allclose(prefix.last_hidden[b], hidden[b, last], atol=1e-5)


def test_causal_text_image_kv_ignores_the_prompt(causal):
    embeds, image_mask, tokens, token_mask = _inputs(causal)
    a = causal.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    b = causal.prefill(tokens[:, :3] + 7, token_mask[:, :3], image_embeds=embeds,
                       image_mask=image_mask)
    for x, y in zip(_image_kv(a), _image_kv(b)):
        assert torch.allclose(x, y, atol=1e-6)


def test_bidirectional_image_kv_depends_on_the_prompt(bidirectional):
    embeds, image_mask, tokens, token_mask = _inputs(bidirectional)
    a = bidirectional.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    b = bidirectional.prefill(tokens[:, :3] + 7, token_mask[:, :3], image_embeds=embeds,
                              image_mask=image_mask)
    ka, kb = _image_kv(a)[0], _image_kv(b)[0]
    assert torch.equal(ka[0], kb[0])  # layer 0 K is computed from the inputs alone
    assert (ka[1:] - kb[1:]).abs().max() > 1e-3


def test_causal_text_split_prefill_equals_one_shot(causal):
    embeds, image_mask, tokens, token_mask = _inputs(causal)
    one = causal.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    images = causal.prefill(tokens[:, :0], token_mask[:, :0], image_embeds=embeds,
                            image_mask=image_mask, reserve=10)
    assert images.num_tokens.tolist() == [2 * TI, 2 * TI]
    stride = 2 * TI + 10
    text_slots = torch.arange(2)[:, None] * stride + 2 * TI + torch.arange(10)
    split = causal.prefill(tokens, token_mask, context=images, slots=text_slots)
    assert torch.equal(split.num_tokens, one.num_tokens)
    assert torch.allclose(split.last_hidden, one.last_hidden, atol=1e-5)
    for b in range(2):
        s_one, s_split = one.slots[b][one.mask[b]], split.slots[b][split.mask[b]]
        assert s_one.numel() == s_split.numel()
        assert torch.allclose(split.cache.k[:, s_split], one.cache.k[:, s_one], atol=1e-5)
        assert torch.allclose(split.cache.v[:, s_split], one.cache.v[:, s_one], atol=1e-5)
    noise = torch.randn(2, causal.cfg.action_horizon, causal.cfg.action_dim)
    assert torch.allclose(causal.denoise(split, noise), causal.denoise(one, noise), atol=1e-5)
    assert torch.allclose(causal.lm_logits(split.last_hidden),
                          causal.lm_logits(one.last_hidden), atol=1e-5)


def test_two_prompts_share_one_image_prefix(causal):
    embeds, image_mask, tokens, token_mask = _inputs(causal)
    images = causal.prefill(tokens[:1, :0], token_mask[:1, :0], image_embeds=embeds[:1],
                            image_mask=image_mask[:1], reserve=20)
    image_k = images.cache.k.clone()
    first = causal.prefill(tokens[:1], token_mask[:1], context=images,
                           slots=2 * TI + torch.arange(10)[None])
    second = causal.prefill(tokens[1:], token_mask[1:], context=images,
                            slots=2 * TI + 10 + torch.arange(10)[None])
    assert torch.equal(images.cache.k[:, :2 * TI], image_k[:, :2 * TI])
    for prefix, row in ((first, 0), (second, 1)):
        alone = causal.prefill(tokens[row:row + 1], token_mask[row:row + 1],
                               image_embeds=embeds[:1], image_mask=image_mask[:1])
        assert torch.allclose(prefix.last_hidden, alone.last_hidden, atol=1e-5)


def test_context_errors(causal, bidirectional):
    embeds, image_mask, tokens, token_mask = _inputs(causal)
    images = bidirectional.prefill(tokens[:, :0], token_mask[:, :0], image_embeds=embeds,
                                   image_mask=image_mask, reserve=10)
    with pytest.raises(ValueError, match='BIDIRECTIONAL'):
        bidirectional.prefill(tokens, token_mask, context=images, slots=images.slots)
    images = causal.prefill(tokens[:, :0], token_mask[:, :0], image_embeds=embeds,
                            image_mask=image_mask, reserve=300)
    with pytest.raises(ValueError, match='first new token must have ar=1'):
        causal.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                       context=images, slots=images.slots + 1)
    with pytest.raises(ValueError, match='slots are required'):
        causal.prefill(tokens, token_mask, context=images)
    with pytest.raises(ValueError, match='overlap the context'):
        causal.prefill(tokens, token_mask, context=images, slots=images.slots)


def test_given_cache_writes_only_valid_tokens_at_their_slots(bidirectional):
    model = bidirectional
    embeds, image_mask, tokens, token_mask = _inputs(model)
    cache = KVCache(model.cfg.vlm, 400)
    slots = torch.stack([torch.arange(150), 399 - torch.arange(150)])
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                           cache=cache, slots=slots)
    p = prefix.slots.shape[1]
    assert p == 2 * TI + 10 and torch.equal(prefix.slots, slots[:, :p])
    written = (cache.k != 0).any(-1).any(-1).any(0)
    want = torch.zeros(400, dtype=torch.bool)
    want[prefix.slots[prefix.mask]] = True
    assert torch.equal(written, want)  # padding entries of row 0 are never written
    again = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    assert torch.allclose(prefix.last_hidden, again.last_hidden, atol=1e-6)


def test_input_errors(bidirectional):
    model = bidirectional
    embeds, image_mask, tokens, token_mask = _inputs(model)
    cache = KVCache(model.cfg.vlm, 400)
    with pytest.raises(ValueError, match=r'slots must be \[2, >= 138\]'):
        model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                      cache=cache, slots=torch.zeros(2, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r'slots out of range \[0, 400\)'):
        model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                      cache=cache, slots=torch.stack([torch.arange(300), torch.arange(300) + 300]))
    with pytest.raises(ValueError, match='must be distinct'):
        model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                      cache=cache, slots=torch.arange(300).expand(2, -1))
    with pytest.raises(ValueError, match=r'image_embeds must be \[2, N, 64, 16\]'):
        model.prefill(tokens, token_mask, image_embeds=embeds[:, :, :5])
    with pytest.raises(ValueError, match=r'image_mask must be \[2, 3\]'):
        model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask[:, :2])
    with pytest.raises(ValueError, match='image_mask given without image_embeds'):
        model.prefill(tokens, token_mask, image_mask=image_mask)
    with pytest.raises(ValueError, match='tokens and token_mask must both be'):
        model.prefill(tokens, token_mask[:, :3])
    with pytest.raises(ValueError, match='slots given without a cache'):
        model.prefill(tokens, token_mask, slots=torch.zeros(2, 10, dtype=torch.int64))
    with pytest.raises(ValueError, match='reserve must be >= 0, got -1'):
        model.prefill(tokens, token_mask, reserve=-1)
    with pytest.raises(ValueError, match='no valid token'):
        model.prefill(tokens, torch.zeros_like(token_mask))
    with pytest.raises(ValueError, match=r'images must be \[B, N, 3, 224, 224\]'):
        model.encode_images(torch.zeros(1, 3, 3, 112, 112))
