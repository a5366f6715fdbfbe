"""
What ``oxygen_bench engine`` builds and measures below the engine's door.

The benchmark drives its two engines through the engine's public API only
(``tools/bench/engine.py``); the parts it needs beneath it are here, as the other tools that
measure the model's components do: the one backend both engines share (one warm-up of the
fast path, narrowed to the workload by its options), a random or loaded memory adapter, the
attention kernel the probes call the model with, and the component probe on the engine's
frame (``probe.ComponentProbe``: the model's calls timed alone).
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.tools.bench.options import fast_path_options


def memory_adapter(name: str | None, model, seed: int):
    """Return the memory adapter of ``--memory-adapter`` (None, a path, or 'random')."""
    from oxygen_ros.model.lora import from_oxygen_arrays, load_oxygen_adapter, oxygen_shapes

    if not name:
        return None
    if name != 'random':
        return load_oxygen_adapter(name, model.cfg, dtype=model.dtype, device=model.device)
    rng = np.random.default_rng(seed)
    arrays = {k: rng.normal(0.0, 0.02, shape).astype(np.float32)
              for k, shape in oxygen_shapes(model.cfg, 16).items()}
    return from_oxygen_arrays(arrays, model.cfg, dtype=model.dtype, device=model.device)


def shared_backend(args: argparse.Namespace, config, model, num_blocks: int, adapter,
                   reference=None):
    """Return the backend both engines run on (the fast path warmed up once)."""
    from oxygen_ros.engine.loading import make_backend_for

    options = fast_path_options(args, progress=not args.no_progress)
    if args.rtc and args.rtc_jacobian_steps is not None:   # exact RTC timed beside it
        options['extra_jacobian_steps'] = (None,)
    return make_backend_for(config, model, num_blocks, adapter=adapter, reference=reference,
                            **options)


def attention_context(backend) -> AbstractContextManager:
    """Return the attention kernel's context of ``backend`` (the probes call the model)."""
    from oxygen_ros.backends.attention import sdpa_context

    return sdpa_context(backend.attention)


def component_probe(engine, observation, args: argparse.Namespace, batch: int, on_root: bool):
    """
    Return the component probe of ``engine``'s model on ``observation``'s frame.

    It probes what the engine runs (the compiled model or the TensorRT runner), not the eager
    model, and times the model calls alone: the images resized on the host, as the vision
    graph takes them (where the engine resizes on its device, its cameras are still uint8).

    :param batch: the decode batch to time.
    :param on_root: text requests read the action prefix and a causal suffix.
    """
    import torch

    from oxygen_ros.tools.bench.probe import ComponentProbe
    from oxygen_ros.transforms.inputs import prepare_camera
    from oxygen_ros.transforms.prompt import TextTask, tokenize_text_prompt, tokenize_text_suffix

    model_cfg, tok = engine.model_cfg, engine.tokenizer
    prepared = engine.prepare(observation)
    max_len = model_cfg.max_token_len
    text_ids = tuple(tokenize_text_prompt(tok, observation.prompt, TextTask.SUBTASK,
                                          max_len=max_len).ids)
    suffix_ids = tuple(tokenize_text_suffix(tok, TextTask.SUBTASK, max_len=max_len).ids)
    prefix_len = prepared.num_cameras * model_cfg.image_tokens_per_camera + (
        len(prepared.action_prompt_ids) + len(suffix_ids) if on_root else len(text_ids))
    slots = [s for s in CAMERA_SLOTS if s in engine.robot.cameras]
    host_images = np.stack([
        prepare_camera(slot, c, model_cfg, engine.conventions.image_resize).pixels
        if c.dtype == np.uint8 else c for slot, c in zip(slots, prepared.cameras)])
    return ComponentProbe(engine.backend.model, torch.from_numpy(host_images)[None],
                          prepared.action_prompt_ids, text_ids,
                          prefix_len + args.decode_budget // 2, batch, suffix_ids=suffix_ids,
                          adapter=engine.adapter, jacobian_steps=args.rtc_jacobian_steps)


__all__ = ['attention_context', 'component_probe', 'memory_adapter', 'shared_backend']
