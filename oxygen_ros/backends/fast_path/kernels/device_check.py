"""
Whether the installed Triton builds the model's kernels for this machine's GPU, checked apart.

The fast path's warm-up asks :func:`check_device` before it compiles a step with the paged
attention kernel, and ``oxygen_doctor`` asks it for the configured preset: one check, one home.
It builds every kernel launch of the model (``builds.check_target``) for the device's target,
in a child process: an older Triton does not always fail with an error for a GPU newer than
itself, its LLVM can abort the whole process (Triton 3.3 and 3.4 for Jetson Thor's sm_110,
seen on the CPU), and the node must outlive that. The GPU is never touched by the child: a
target is all a build needs.

Run as ``python -m oxygen_ros.backends.fast_path.kernels.device_check '<json>'`` it is that
child: it prints the check as one JSON line.
"""

from __future__ import annotations

from dataclasses import asdict, replace
import functools
import json
import os
from pathlib import Path
import subprocess
import sys
from typing import Any

from oxygen_ros.backends.fast_path.kernels.builds import DeviceBuildCheck
from oxygen_ros.config import GemmaConfig, get_preset, ModelConfig
import torch

TIMEOUT_S = 600.0
"""The most the child may take (cold, a full-size model: ~10 s on an x86 core)."""
PTXAS_HINT = ('Triton before 3.7 bundles a ptxas without sm_110: install the Triton the CUDA '
              "13 torch requires (>= 3.7), or point TRITON_PTXAS_BLACKWELL_PATH at CUDA 13's "
              'ptxas (docs/gpu.md#jetson-agx-thor)')
"""What to do where the bundled ptxas rejects a Blackwell-family target (Thor: sm_110a)."""


def device_target(device: torch.device | str) -> tuple[str, int, int]:
    """
    Return the Triton target of a CUDA ``device``: ``('cuda', 90, 32)`` on an H100.

    :raises ValueError: ``device`` is not a CUDA device.
    """
    device = torch.device(device)
    if device.type != 'cuda':
        raise ValueError(f'{device} has no CUDA target')
    major, minor = torch.cuda.get_device_capability(device)
    return ('cuda', major * 10 + minor, 32)


def check_device(device: torch.device | str, cfg: ModelConfig | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> DeviceBuildCheck:
    """
    Return whether the installed Triton builds the model's kernels for ``device``.

    Once per process, target, model and dtype (a failed build is not tried again in the same
    start); Triton keeps what it built in its own cache, so a second start builds nothing
    new. Never raises: a check that cannot run answers not ok, with its reason.

    :param device: ``cuda``, ``cuda:N``; anything else answers not ok (no CUDA target).
    :param cfg: the model whose kernel launches to build (default ``pi05_droid``).
    :param dtype: the model's dtype (float32 or bfloat16).
    """
    device = torch.device(device)
    if device.type != 'cuda':
        return DeviceBuildCheck(ok=False, target=device.type,
                                reason=f'{device.type}: no CUDA device; the kernels run there '
                                       f"only in Triton's interpreter (TRITON_INTERPRET=1)")
    try:
        target = device_target(device)
    except Exception as exc:  # noqa: B902 - no driver, no device: the answer, not an error
        return DeviceBuildCheck(ok=False, target=str(device),
                                reason=f'{type(exc).__name__}: {exc}')
    return check_target_apart(target, cfg or get_preset('pi05_droid').model, dtype)


@functools.lru_cache(maxsize=None)
def check_target_apart(target: tuple[str, int, int], cfg: ModelConfig,
                       dtype: torch.dtype, timeout: float = TIMEOUT_S) -> DeviceBuildCheck:
    """Run ``builds.check_target`` in a child process (:func:`check_device`, any target)."""
    name = f'{target[0]} sm_{target[1]}'
    spec = json.dumps({'target': list(target), 'dtype': str(dtype).removeprefix('torch.'),
                       **_model_spec(cfg)})
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    root = str(Path(__file__).resolve().parents[4])        # the package's parent folder
    env['PYTHONPATH'] = os.pathsep.join([root, env.get('PYTHONPATH', '')])
    try:
        proc = subprocess.run([sys.executable, '-m', __name__, spec], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return DeviceBuildCheck(ok=False, target=name,
                                reason=f'building the kernels for {name} took over '
                                       f'{timeout:g} s')
    last = proc.stdout.strip().splitlines()[-1:] or ['']
    try:
        out = DeviceBuildCheck(**json.loads(last[0]))
    except (ValueError, TypeError):
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ['no output']
        return DeviceBuildCheck(ok=False, target=name, reason=(
            f'the Triton compiler crashed building the kernels for {name} (exit '
            f'{proc.returncode}): {err[0][:300]}'
            + (f'; {PTXAS_HINT}' if target[1] >= 100 else '')))
    if not out.ok and target[1] >= 100 and 'ptxas' in (out.reason or '').lower():
        out = replace(out, reason=f'{out.reason}; {PTXAS_HINT}')
    return out


def _model_spec(cfg: ModelConfig) -> dict[str, Any]:
    """Return what of ``cfg`` the kernels' launches depend on, as JSON-able data."""
    return {'preset': cfg.name, 'vlm': asdict(cfg.vlm), 'expert': asdict(cfg.expert),
            'action_horizon': cfg.action_horizon}


def main(argv: list[str] | None = None) -> int:
    """Build for the target the JSON argument names; print the check as JSON (the child)."""
    from oxygen_ros.backends.fast_path.kernels.builds import check_target
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    cfg = get_preset(spec['preset']).model.with_overrides(
        vlm=GemmaConfig(**spec['vlm']), expert=GemmaConfig(**spec['expert']),
        action_horizon=spec['action_horizon'])
    out = check_target(tuple(spec['target']), cfg, getattr(torch, spec['dtype']))
    print(json.dumps({'ok': out.ok, 'target': out.target, 'lines': out.lines,
                      'reason': out.reason}), flush=True)
    return 0


__all__ = ['PTXAS_HINT', 'TIMEOUT_S', 'check_device', 'check_target_apart', 'device_target']

if __name__ == '__main__':
    sys.exit(main())
