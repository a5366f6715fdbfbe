"""KV-cached greedy decoding (prefill + decode_step) equals recomputing the full sequence."""

from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model
import pytest
from reference import reference_text_logits
import torch

NUM_NEW = 6


@pytest.fixture(scope='module', params=list(PrefixAttention))
def model(request):
    torch.manual_seed(0)
    cfg = get_preset('tiny').model.with_overrides(prefix_attention=request.param)
    return Pi05Model(cfg).eval()


def _inputs(model, seed=1):
    """Two samples: 2 cameras + 10 prompt tokens, and 1 camera (slot 2) + 4 tokens."""
    gen = torch.Generator().manual_seed(seed)
    size = model.cfg.vision.image_size
    images = torch.rand(2, 3, 3, size, size, generator=gen) * 2 - 1
    embeds = model.encode_images(images)
    image_mask = torch.tensor([[True, True, False], [False, False, True]])
    tokens = torch.randint(3, 2000, (2, 12), generator=gen)
    token_mask = torch.zeros(2, 12, dtype=torch.bool)
    token_mask[0, :10] = True
    token_mask[1, :4] = True
    return embeds, image_mask, tokens, token_mask


def _greedy(model, prefix, num_new, first_slot):
    """Greedy loop: row b writes its i-th generated token at ``first_slot[b] + i``."""
    b = prefix.batch_size
    logits = [model.lm_logits(prefix.last_hidden)]
    ctx_slots, ctx_mask, tokens = prefix.slots, prefix.mask, []
    for i in range(num_new):
        token = logits[-1].argmax(-1)
        tokens.append(token)
        write = first_slot + i
        logits.append(model.decode_step(token, prefix.num_tokens + i, prefix.cache, write,
                                        ctx_slots, ctx_mask))
        ctx_slots = torch.cat([ctx_slots, write[:, None]], 1)
        ctx_mask = torch.cat([ctx_mask, torch.ones(b, 1, dtype=torch.bool)], 1)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def test_cached_greedy_decoding_matches_full_recompute(model):
    embeds, image_mask, tokens, token_mask = _inputs(model)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                           reserve=NUM_NEW)
    p = prefix.slots.shape[1]
    assert prefix.num_tokens.tolist() == [2 * 64 + 10, 64 + 4]  # different prefix lengths
    first_slot = torch.arange(2) * (p + NUM_NEW) + p
    generated, logits = _greedy(model, prefix, NUM_NEW, first_slot)
    # Each step's recompute feeds the tokens generated so far: teacher-forcing the cached
    # tokens gives exactly those recomputations when every argmax agrees (checked below).
    want = reference_text_logits(model, embeds, image_mask, tokens, token_mask, generated)
    assert torch.allclose(logits, want, atol=1e-5), (logits - want).abs().max()
    assert torch.equal(want[:, :NUM_NEW].argmax(-1), generated)
    assert logits.dtype == torch.float32 and logits.shape == (2, NUM_NEW + 1, 257_152)


def test_rows_of_different_frames_and_lengths_in_one_decode_step(model):
    """Rows from two prefills in one cache, at different steps, share one decode_step call."""
    embeds, image_mask, tokens, token_mask = _inputs(model, seed=2)
    cache = KVCache(model.cfg.vlm, 1000)
    pa = model.prefill(tokens[:1], token_mask[:1], image_embeds=embeds[:1],
                       image_mask=image_mask[:1], cache=cache,
                       slots=torch.arange(0, 300)[None])
    pb = model.prefill(tokens[1:], token_mask[1:], image_embeds=embeds[1:],
                       image_mask=image_mask[1:], cache=cache,
                       slots=torch.arange(500, 800)[None])
    assert pa.slots.shape[1] != pb.slots.shape[1]
    # Row A decodes two tokens alone (slots 400, 401), then joins row B at its first step.
    gen_a, logits_a = _greedy(model, pa, 2, torch.tensor([400]))
    next_a = logits_a[:, -1].argmax(-1)
    next_b = model.lm_logits(pb.last_hidden).argmax(-1)
    ctx_a = torch.cat([pa.slots, torch.tensor([[400, 401]])], 1)
    c = max(ctx_a.shape[1], pb.slots.shape[1])
    ctx_slots = torch.zeros(2, c, dtype=torch.int64)  # padding points at slot 0
    ctx_mask = torch.zeros(2, c, dtype=torch.bool)
    ctx_slots[0, :ctx_a.shape[1]], ctx_mask[0, :ctx_a.shape[1]] = ctx_a[0], True
    ctx_slots[1, :pb.slots.shape[1]], ctx_mask[1, :pb.slots.shape[1]] = pb.slots[0], pb.mask[0]
    logits = model.decode_step(torch.cat([next_a, next_b]),
                               torch.cat([pa.num_tokens + 2, pb.num_tokens]), cache,
                               torch.tensor([402, 900]), ctx_slots, ctx_mask)
    want_a = reference_text_logits(model, embeds[:1], image_mask[:1], tokens[:1],
                                   token_mask[:1], torch.cat([gen_a, next_a[:, None]], 1))
    want_b = reference_text_logits(model, embeds[1:], image_mask[1:], tokens[1:],
                                   token_mask[1:], next_b[:, None])
    assert torch.allclose(logits[0], want_a[0, -1], atol=1e-5)
    assert torch.allclose(logits[1], want_b[0, -1], atol=1e-5)
    assert torch.allclose(logits_a[0], want_a[0, :3], atol=1e-5)


def test_decode_step_writes_only_its_slots(model):
    embeds, image_mask, tokens, token_mask = _inputs(model, seed=3)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask,
                           reserve=1)
    p = prefix.slots.shape[1]
    before_k, before_v = prefix.cache.k.clone(), prefix.cache.v.clone()
    write = torch.tensor([p, 2 * p + 1])
    model.decode_step(torch.tensor([5, 6]), prefix.num_tokens, prefix.cache, write,
                      prefix.slots, prefix.mask)
    changed = (prefix.cache.k != before_k).any(-1).any(-1).any(0)
    assert changed.nonzero().flatten().tolist() == write.tolist()
    assert ((prefix.cache.v != before_v).any(-1).any(-1).any(0)).sum() == 2
