r"""
``oxygen_run_model``: one observation through the engine, no ROS: action chunk and texts.

Images are the photographs bundled in scikit-image (``coffee``, ``motorcycle_left``,
``motorcycle_right``) or image files; the state defaults to zeros. With a checkpoint this is
the quickest way to see what a real π0.5 policy answers on a picture::

    oxygen_run_model --preset pi05_droid --checkpoint ~/ckpt/pi05_droid \\
        --image base_0_rgb=kitchen.jpg --image left_wrist_0_rgb=wrist.png \\
        --prompt "put the cup in the sink" --ask "what is on the table?"
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import sys
import time

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, preset_names
from oxygen_ros.tools.bench.options import add_quantization_argument

_BUNDLED = ('coffee', 'motorcycle_left', 'motorcycle_right')


def load_image(spec: str) -> np.ndarray:
    """
    Return ``uint8 [h, w, 3]`` RGB of a bundled photograph name or an image file.

    :raises ValueError: unknown name or unreadable file.
    """
    if spec in _BUNDLED:
        from skimage import data
        if spec == 'coffee':
            return data.coffee()
        left, right, _ = data.stereo_motorcycle()
        return left if spec == 'motorcycle_left' else right
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f'{spec!r} is neither a bundled photograph {_BUNDLED} nor a file')
    from PIL import Image
    with Image.open(path) as img:
        return np.asarray(img.convert('RGB'))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_run_model', description=__doc__.split('\n\n')[0])
    p.add_argument('--preset', default='small', choices=preset_names())
    p.add_argument('--checkpoint', default=None, help='dir with model.safetensors + assets/')
    p.add_argument('--tokenizer', default=None, help='paligemma_tokenizer.model')
    p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
    add_quantization_argument(p)
    p.add_argument('--device', default='cpu')
    p.add_argument('--image', action='append', default=[], metavar='SLOT=IMAGE',
                   help=f'camera image (slots {", ".join(CAMERA_SLOTS)}; IMAGE is '
                        f'{"/".join(_BUNDLED)} or a file). Default: coffee as base, '
                        f'motorcycle_left/right as wrists')
    p.add_argument('--state', type=float, nargs='+', default=None, help='robot state')
    p.add_argument('--prompt', default='pick up the coffee cup')
    p.add_argument('--ask', default=None, help='also answer this question')
    p.add_argument('--max-tokens', type=int, default=None, help='text budget')
    p.add_argument('--seed', type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one observation; return the process exit code."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    from oxygen_ros.engine import Engine, EngineConfig, Observation, TextTask

    cfg = EngineConfig.create(preset=args.preset, checkpoint=args.checkpoint,
                              tokenizer=args.tokenizer, dtype=args.dtype,
                              quantization=args.quantization, device=args.device,
                              seed=args.seed)
    model_cfg, robot = cfg.model_config(), cfg.robot()
    defaults = dict(zip(CAMERA_SLOTS, ('coffee', 'motorcycle_left', 'motorcycle_right')))
    specs = {s: defaults[s] for s in robot.cameras}
    for item in args.image:
        slot, sep, spec = item.partition('=')
        if not sep or slot not in CAMERA_SLOTS:
            print(f'--image wants SLOT=IMAGE with SLOT in {CAMERA_SLOTS}, got {item!r}',
                  file=sys.stderr)
            return 2
        specs[slot] = spec
    try:
        images = {slot: load_image(spec) for slot, spec in specs.items()}
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    state = np.zeros(robot.state_dim, np.float32) if args.state is None else \
        np.asarray(args.state, np.float32)
    engine = Engine(cfg)
    obs = Observation(images=images, state=state, prompt=args.prompt)
    engine.submit_text(TextTask.SUBTASK, max_tokens=args.max_tokens)
    if args.ask:
        engine.submit_text(TextTask.ANSWER, question=args.ask, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    out = engine.step(obs)
    texts = list(out.finished)
    while engine.num_running:
        texts += engine.step(None).finished
    total = time.perf_counter() - t0
    np.set_printoptions(precision=4, suppress=True, linewidth=120)
    print(f'\naction chunk ({model_cfg.action_horizon} x {robot.robot_action_dim}, robot '
          f'units) from {", ".join(f"{s}={v}" for s, v in specs.items())}:')
    print(out.action.actions)
    for t in texts:
        print(f'{t.task.value:8} {t.text!r}  ({len(t.token_ids)} tokens, '
              f'{t.finish_reason.value if t.finish_reason else t.error})')
    print(f'weights {args.dtype}, quantization {engine.describe_quantization()}'
          + ''.join(f'; FALLBACK {k}: {v}' for k, v in engine.fallbacks.items()))
    print(f'first cycle {1e3 * out.stats.total_s:.0f} ms, all text done after '
          f'{1e3 * total:.0f} ms' + ('' if args.checkpoint else
                                     '  [random weights: meaningless output]'))
    return 0


if __name__ == '__main__':
    sys.exit(main())
