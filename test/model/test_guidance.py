"""RTC guided sampling against plain Euler and an explicit Jacobian (a small toy denoiser)."""

import numpy as np
from oxygen_ros.control.rtc import soft_mask
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.guidance import guidance_weight, guided_sample, RtcGuidance
import pytest
import torch

B, H, A = 1, 6, 3


def toy_velocity(seed=0):
    """Return a nonlinear flow coupling every point and dim (its Jacobian is not diagonal)."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(H * A, H * A, generator=gen) * 0.3

    def velocity(x, step):
        flat = x.reshape(B, -1)
        return torch.tanh(flat @ m.T + 0.1 * step).reshape(B, H, A) + x
    return velocity


def plain_euler(velocity, noise, n):
    x, dt = noise.clone(), torch.tensor(-1.0 / n, dtype=torch.float32).item()
    for step in range(n):
        x = x + dt * velocity(x, step)
    return x


def test_no_guidance_and_zero_weights_are_plain_euler():
    velocity = toy_velocity()
    noise = torch.randn(B, H, A, generator=torch.Generator().manual_seed(1))
    want = plain_euler(velocity, noise, 10)
    assert torch.equal(guided_sample(velocity, noise, 10, None), want)
    zero = RtcGuidance(torch.full((B, H, A), 5.0), torch.zeros(H))
    assert torch.equal(guided_sample(velocity, noise, 10, zero), want)


def test_one_guided_step_is_the_vector_jacobian_product_of_the_error():
    velocity = toy_velocity()
    noise = torch.randn(B, H, A, generator=torch.Generator().manual_seed(2))
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(3))
    weights = torch.tensor(soft_mask(H, delay=2, overlap=5), dtype=torch.float32)
    got = guided_sample(velocity, noise, 1, RtcGuidance(target, weights, max_guidance_weight=5.0))
    t = float(euler_times(1)[0])

    def x1(x):
        return x - t * velocity(x, 0)
    jac = torch.autograd.functional.jacobian(x1, noise).reshape(H * A, H * A)
    err = (weights[None, :, None] * (target - x1(noise))).reshape(-1)
    u = velocity(noise, 0) - guidance_weight(t, 5.0) * (jac.T @ err).reshape(B, H, A)
    torch.testing.assert_close(got, noise - u, rtol=1e-5, atol=1e-6)


def test_guidance_pulls_the_frozen_points_toward_the_previous_chunk():
    velocity = toy_velocity(4)
    noise = torch.randn(B, H, A, generator=torch.Generator().manual_seed(5))
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(6))
    free = guided_sample(velocity, noise, 10, None)
    weights = torch.tensor(soft_mask(H, delay=2, overlap=4), dtype=torch.float32)
    guided = guided_sample(velocity, noise, 10, RtcGuidance(target, weights, 5.0))
    gap_free = (free - target)[:, :2].abs().mean()
    gap_guided = (guided - target)[:, :2].abs().mean()
    assert gap_guided < 0.5 * gap_free
    assert torch.isfinite(guided).all()


def test_guidance_weight_schedule():
    assert guidance_weight(1.0, 5.0) == 5.0 and guidance_weight(0.0, 5.0) == 5.0
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0)  # (0.25 + 0.25) / 0.25
    assert guidance_weight(0.5, 1.5) == 1.5


def test_guided_sample_runs_inside_inference_mode_and_checks_shapes():
    velocity = toy_velocity()
    noise = torch.zeros(B, H, A)
    guidance = RtcGuidance(torch.ones(B, H, A), torch.ones(H))
    with torch.inference_mode():
        out = guided_sample(velocity, noise, 3, guidance)
    assert np.isfinite(out.numpy()).all()
    with pytest.raises(ValueError, match='do not fit noise'):
        guided_sample(velocity, noise, 3, RtcGuidance(torch.ones(B, H - 1, A), torch.ones(H)))


# ------------------------------------------------------ Jacobian on the first k steps only

def explicit_sample(velocity, noise, n, target, weights, beta, jacobian_steps):
    """Euler with the full Jacobian ``d x1 / d x`` on steps < k and the identity after."""
    x, dt = noise.clone(), torch.tensor(-1.0 / n, dtype=torch.float32).item()
    for step, t in enumerate(euler_times(n).tolist()):
        def x1(z, step=step, t=t):
            return z - t * velocity(z, step)
        err = (weights[None, :, None] * (target - x1(x))).reshape(-1)
        jac = torch.autograd.functional.jacobian(x1, x).reshape(H * A, H * A) \
            if step < jacobian_steps else torch.eye(H * A)
        u = velocity(x, step) - guidance_weight(t, beta) * (jac.T @ err).reshape(B, H, A)
        x = x + dt * u
    return x


@pytest.mark.parametrize('k', [0, 1, 4, 10])
def test_the_steps_past_jacobian_steps_guide_by_the_error_alone(k):
    velocity = toy_velocity(7)
    noise = torch.randn(B, H, A, generator=torch.Generator().manual_seed(8))
    target = torch.randn(B, H, A, generator=torch.Generator().manual_seed(9))
    weights = torch.tensor(soft_mask(H, delay=2, overlap=5), dtype=torch.float32)
    got = guided_sample(velocity, noise, 10, RtcGuidance(target, weights, 5.0, k))
    want = explicit_sample(velocity, noise, 10, target, weights, 5.0, k)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    exact = guided_sample(velocity, noise, 10, RtcGuidance(target, weights, 5.0))
    assert torch.equal(got, exact) == (k == 10)     # None is every step, the paper's RTC


def test_jacobian_steps_outside_the_euler_steps_are_refused():
    velocity, noise = toy_velocity(), torch.zeros(B, H, A)
    for k in (-1, 4):
        with pytest.raises(ValueError, match=rf'jacobian_steps must be in 0\.\.3 \(the Euler '
                                             rf'steps\), got {k}'):
            guided_sample(velocity, noise, 3, RtcGuidance(torch.ones(B, H, A), torch.ones(H),
                                                          jacobian_steps=k))


# ----------------------------------------------------------- the action expert as a Velocity

@pytest.fixture(scope='module')
def tiny_prefix():
    from oxygen_ros.config import get_preset
    from oxygen_ros.model.pi05 import Pi05Model
    torch.manual_seed(0)
    model = Pi05Model(get_preset('tiny').model).eval()
    gen = torch.Generator().manual_seed(1)
    size = model.cfg.vision.image_size
    with torch.inference_mode():  # as the backend runs it
        embeds = model.encode_images(torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1)
        tokens = torch.randint(3, 5000, (1, 9), generator=gen)
        prefix = model.prefill(tokens, torch.ones(1, 9, dtype=torch.bool), image_embeds=embeds)
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen)
    return model, prefix, noise


def model_velocity(model, prefix, horizon, n):
    """Return the model's velocity as a ``Velocity`` (as the torch backend builds it)."""
    with torch.inference_mode(False):
        ctx = model.denoise_context(prefix, horizon)
    times = euler_times(n).tolist()
    return lambda x, step: model.velocity(ctx, x, times[step])


def test_the_models_velocity_sampled_unguided_is_its_denoise(tiny_prefix):
    model, prefix, noise = tiny_prefix
    n = model.cfg.num_denoise_steps
    with torch.inference_mode():
        want = model.denoise(prefix, noise)
        got = guided_sample(model_velocity(model, prefix, noise.shape[1], n), noise, n, None)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_guided_denoise_of_the_model_follows_the_previous_chunk(tiny_prefix):
    model, prefix, noise = tiny_prefix
    n, horizon = model.cfg.num_denoise_steps, model.cfg.action_horizon
    target = torch.randn(noise.shape, generator=torch.Generator().manual_seed(7))
    weights = torch.tensor(soft_mask(horizon, delay=1, overlap=3), dtype=torch.float32)
    with torch.inference_mode():
        velocity = model_velocity(model, prefix, horizon, n)
        free = guided_sample(velocity, noise, n, None)
        guided = guided_sample(velocity, noise, n, RtcGuidance(target, weights, 5.0))
    assert (guided - target)[:, 0].abs().mean() < 0.5 * (free - target)[:, 0].abs().mean()
    assert torch.isfinite(guided).all()
