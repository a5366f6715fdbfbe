"""denoise on a cached prefix equals the uncached reference_sample_actions."""

from oxygen_ros.config import get_preset
from oxygen_ros.model.pi05 import Pi05Model
import pytest
from reference import reference_sample_actions
import torch


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return Pi05Model(get_preset('tiny').model).eval()


def _images(model, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    size = model.cfg.vision.image_size
    return torch.rand(batch, 3, 3, size, size, generator=gen) * 2 - 1


def _prompt(batch, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 5000, (batch, 16), generator=gen)
    mask = torch.arange(16)[None, :] < torch.tensor(lengths)[:, None]
    return tokens, mask


def _noise(model, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, model.cfg.action_horizon, model.cfg.action_dim, generator=gen)


@pytest.mark.parametrize('cams', [[True, False, False], [True, True, False],
                                  [True, True, True], [False, True, True]])
def test_denoise_matches_reference(model, cams):
    embeds = model.encode_images(_images(model, 1, 1))
    image_mask = torch.tensor([cams])
    tokens, token_mask = _prompt(1, [11], 2)
    noise = _noise(model, 1, 3)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    assert prefix.num_tokens.item() == 64 * sum(cams) + 11
    actions = model.denoise(prefix, noise)
    want = reference_sample_actions(model, embeds, image_mask, tokens, token_mask, noise)
    assert actions.dtype == torch.float32 and actions.shape == noise.shape
    assert torch.allclose(actions, want, atol=1e-5), (actions - want).abs().max()


@pytest.mark.parametrize('steps', [1, 3])
def test_denoise_step_counts(model, steps):
    embeds = model.encode_images(_images(model, 1, 4))
    tokens, token_mask = _prompt(1, [7], 5)
    noise = _noise(model, 1, 6)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds)
    actions = model.denoise(prefix, noise, num_steps=steps)
    want = reference_sample_actions(model, embeds, None, tokens, token_mask, noise,
                                    num_steps=steps)
    assert torch.allclose(actions, want, atol=1e-5)


def test_masked_camera_pixels_change_nothing(model):
    images = _images(model, 1, 7)
    image_mask = torch.tensor([[True, True, False]])
    tokens, token_mask = _prompt(1, [9], 8)
    noise = _noise(model, 1, 9)
    outputs = []
    for fill in (None, 0.0, 123.0):
        if fill is not None:
            images = images.clone()
            images[0, 2] = fill
        prefix = model.prefill(tokens, token_mask, image_embeds=model.encode_images(images),
                               image_mask=image_mask)
        outputs.append(model.denoise(prefix, noise))
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[0], outputs[2])


def test_batch_with_different_cameras_equals_one_by_one(model):
    embeds = model.encode_images(_images(model, 2, 10))
    image_mask = torch.tensor([[True, True, False], [True, False, True]])
    tokens, token_mask = _prompt(2, [12, 5], 11)
    noise = _noise(model, 2, 12)
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds, image_mask=image_mask)
    batched = model.denoise(prefix, noise)
    for b in range(2):
        single = model.prefill(tokens[b:b + 1], token_mask[b:b + 1],
                               image_embeds=embeds[b:b + 1], image_mask=image_mask[b:b + 1])
        assert torch.allclose(batched[b:b + 1], model.denoise(single, noise[b:b + 1]),
                              atol=1e-5)


def test_actions_depend_on_prefix_and_noise_and_cache_is_read_only(model):
    """Guards against a path that ignores the prefix (e.g. zero-initialised adaRMS)."""
    images = _images(model, 1, 13)
    tokens, token_mask = _prompt(1, [8], 14)
    noise = _noise(model, 1, 15)
    prefix = model.prefill(tokens, token_mask, image_embeds=model.encode_images(images))
    k, v = prefix.cache.k.clone(), prefix.cache.v.clone()
    actions = model.denoise(prefix, noise)
    assert torch.equal(prefix.cache.k, k) and torch.equal(prefix.cache.v, v)
    other_prompt = model.prefill(tokens + 1, token_mask,
                                 image_embeds=model.encode_images(images))
    other_image = model.prefill(tokens, token_mask,
                                image_embeds=model.encode_images(images.flip(-1)))
    assert (model.denoise(other_prompt, noise) - actions).abs().max() > 1e-3
    assert (model.denoise(other_image, noise) - actions).abs().max() > 1e-3
    assert (model.denoise(prefix, noise + 0.5) - actions).abs().max() > 1e-3


def test_bfloat16_model_stays_close_to_its_reference(model):
    bf16 = Pi05Model(model.cfg)
    bf16.load_state_dict(model.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    embeds = bf16.encode_images(_images(model, 1, 16))
    tokens, token_mask = _prompt(1, [10], 17)
    noise = _noise(model, 1, 18)
    prefix = bf16.prefill(tokens, token_mask, image_embeds=embeds)
    assert prefix.cache.dtype == torch.bfloat16
    actions = bf16.denoise(prefix, noise)
    want = reference_sample_actions(bf16, embeds, None, tokens, token_mask, noise)
    assert actions.dtype == torch.float32
    assert torch.allclose(actions, want, atol=2e-2), (actions - want).abs().max()
    fp32_prefix = model.prefill(tokens, token_mask, image_embeds=embeds.float())
    assert torch.allclose(actions, model.denoise(fp32_prefix, noise), atol=5e-2)


def test_denoise_rejects_bad_noise(model):
    tokens, token_mask = _prompt(1, [4], 19)
    prefix = model.prefill(tokens, token_mask)
    with pytest.raises(ValueError, match=r'noise must be \[1, H, 32\]'):
        model.denoise(prefix, torch.zeros(1, 4, 7))
    with pytest.raises(ValueError, match='num_steps must be >= 1, got 0'):
        model.denoise(prefix, torch.zeros(1, 4, 32), num_steps=0)


def test_bfloat16_keeps_the_four_heads_in_float32_and_casts_at_their_boundaries(model):
    # openpi (pi0_pytorch.py) builds action_in_proj, action_out_proj, time_mlp_in/out outside
    # paligemma_with_expert and never casts them: in a bfloat16 model they run in float32.
    bf16 = Pi05Model(model.cfg)
    bf16.load_state_dict(model.state_dict())
    bf16.set_precision(torch.bfloat16)
    heads = ('action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out')
    for head in heads:
        for name, param in getattr(bf16, head).named_parameters():
            assert param.dtype == torch.float32, f'{head}.{name}'
            assert torch.equal(param, getattr(model, head).get_parameter(name))
    assert {f'{h}.{n}' for h in heads for n in ('weight', 'bias')} <= bf16.float32_parameters()
    assert bf16.dtype == torch.bfloat16 and bf16.expert.layers[0].qkv.weight.dtype == \
        torch.bfloat16
    # The time MLP runs in float32 from the float32 sincos embedding: bit-equal to float32.
    t = torch.tensor([1.0, 0.7, 0.1])
    cond = bf16.time_condition(t)
    assert cond.dtype == torch.float32 and torch.equal(cond, model.time_condition(t))
    # action_in_proj reads the float32 x_t; its output enters the expert in bfloat16.
    x_t = _noise(model, 2, 21)
    tokens = bf16.embed_actions(x_t)
    assert tokens.dtype == torch.bfloat16
    assert torch.equal(tokens, model.embed_actions(x_t).to(torch.bfloat16))
    # The expert's bfloat16 output goes to the float32 action_out_proj.
    hidden = torch.randn(2, model.cfg.action_horizon, model.cfg.expert.width).bfloat16()
    velocity = bf16.project_actions(hidden)
    assert velocity.dtype == torch.float32
    assert torch.equal(velocity, model.project_actions(hidden.float()))
    # A whole chunk runs across these boundaries (float32 out; close to the reference).
    tokens, token_mask = _prompt(1, [9], 22)
    prefix = bf16.prefill(tokens, token_mask)
    actions = bf16.denoise(prefix, _noise(model, 1, 23))
    want = reference_sample_actions(bf16, None, None, tokens, token_mask, _noise(model, 1, 23))
    assert actions.dtype == torch.float32
    assert torch.allclose(actions, want, atol=2e-2), (actions - want).abs().max()
