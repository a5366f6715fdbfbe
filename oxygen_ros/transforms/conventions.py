"""
Per-checkpoint conventions: where the norm stats come from, how they apply, the prompt.

Three families of checkpoints reach the node (docs/checkpoints.md):

- **openpi** (PyTorch ``model.safetensors``, or converted by ``oxygen_convert``): stats in
  ``assets/<asset_id>/norm_stats.json``, quantile normalization with openpi's ``+ 1e-6``, the
  preset's prompt format (``pi05_libero`` without the state, the others with it), Pillow's
  image resize.
- **LeRobot** (``lerobot/pi05_*``): stats and modes in the processor files
  (``transforms/lerobot_processors.py``), LeRobot's formulas (no ``+ 1e-6``), the state always in
  the prompt, ``F.interpolate``'s image resize (``transforms/images.py``).
- **random weights** (no checkpoint): identity stats.

Explicit settings win: ``norm_stats`` (an openpi JSON), ``prompt_format``,
``quantile_eps``, ``image_resize``; ``state_prompt_pad`` has one default for all (0: LeRobot
>= v0.5.0 and openpi; checkpoints fine-tuned with LeRobot <= v0.4.4 need 32). The chosen
values and their origin are logged once at start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import enum
import logging
from pathlib import Path
from typing import Mapping, Protocol

from oxygen_ros.config import Preset, PromptFormat
from oxygen_ros.policies import get_robot
from oxygen_ros.transforms.images import ImageResize
from oxygen_ros.transforms.lerobot_processors import (
    is_lerobot_folder, lerobot_prompt, load_lerobot_normalization, NORMALIZER,
    normalizer_pattern, POSTPROCESSOR, PREPROCESSOR, UNNORMALIZER)
from oxygen_ros.transforms.norm_stats import (
    identity_norm_stats, known_asset_ids, load_norm_stats, NormStats, openpi_norm_stats_file)
from oxygen_ros.transforms.normalize import QuantityNorm

_LOG = logging.getLogger(__name__)


class ConventionSettings(Protocol):
    """
    The explicit settings that win over a checkpoint's conventions (``EngineConfig`` has them).

    :ivar checkpoint: the checkpoint folder or its ``model.safetensors``; None: random weights.
    :ivar norm_stats: an openpi ``norm_stats.json`` overriding the checkpoint's; None: none.
    :ivar prompt_format: the action prompt's format; None: the family's, else the preset's.
    :ivar state_prompt_pad: dims the state is zero-padded to before binning (0: none).
    :ivar quantile_eps: added to ``q99 - q01``; None: the stats' family's.
    :ivar image_resize: the resize-with-pad filter; None: the family's.
    """

    checkpoint: str | None
    norm_stats: str | None
    prompt_format: PromptFormat | None
    state_prompt_pad: int
    quantile_eps: float | None
    image_resize: ImageResize | None


class CheckpointFamily(str, enum.Enum):
    """Who wrote the checkpoint folder (it fixes the prompt and normalization defaults)."""

    OPENPI = 'openpi'
    LEROBOT = 'lerobot'
    RANDOM = 'random'
    """No checkpoint: seeded random weights."""


class NormStatsNotFound(FileNotFoundError):
    """No norm stats for a checkpoint; the message lists where it looked and the ways out."""


@dataclass(frozen=True, slots=True)
class Conventions:
    """
    What the engine applies around the model for one checkpoint.

    :ivar state: normalization of the robot state.
    :ivar actions: normalization of the actions.
    :ivar norm_origin: where the stats came from (logged).
    :ivar prompt_format: the action prompt's format.
    :ivar state_prompt_pad: dims the state is zero-padded to before binning (0: none).
    :ivar family: the checkpoint's family.
    :ivar image_resize: the resize-with-pad filter of the family (or the one set).
    """

    state: QuantityNorm
    actions: QuantityNorm
    norm_origin: str
    prompt_format: PromptFormat
    state_prompt_pad: int
    family: CheckpointFamily
    image_resize: ImageResize = ImageResize.OPENPI

    def describe(self) -> str:
        """Return one line for the start-up log."""
        return (f'{self.family.value} checkpoint conventions: prompt {self.prompt_format.value}'
                f' (state padded to {self.state_prompt_pad or "no"} dims), quantile eps '
                f'{self.actions.quantile_eps:g}, {self.image_resize.value} image resize; '
                f'{self.norm_origin}')


def checkpoint_folder(checkpoint: str | Path) -> Path:
    """Return the folder of a checkpoint given as a folder or as its ``model.safetensors``."""
    path = Path(checkpoint).expanduser()
    return path.parent if path.is_file() else path


def checkpoint_family(checkpoint: str | Path | None) -> CheckpointFamily:
    """Return the family of a checkpoint (LeRobot: processor files or a pi05 config.json)."""
    if not checkpoint:
        return CheckpointFamily.RANDOM
    folder = checkpoint_folder(checkpoint)
    return CheckpointFamily.LEROBOT if is_lerobot_folder(folder) else CheckpointFamily.OPENPI


def resolve_conventions(config: ConventionSettings, preset: Preset,
                        stats: Mapping[str, NormStats] | None = None) -> Conventions:
    """
    Return the normalization and prompt conventions of ``config``'s checkpoint.

    ``config`` is the engine's ``EngineConfig`` (any object with these settings), ``preset``
    its preset (the network's prompt slots and horizon, the robot's dims and prompt format,
    the checkpoint's asset id).

    Norm stats: ``stats`` if given (openpi quantiles), ``config.norm_stats`` if set; else, in
    a checkpoint folder, the family's own files first (LeRobot's processor files or openpi's
    ``assets/<asset_id>/norm_stats.json``), then the other family's; identity stats without a
    checkpoint.

    :raises NormStatsNotFound: a checkpoint without any norm stats (the message lists every
        place looked and the three ways out).
    :raises ValueError: malformed stats files.
    """
    family = checkpoint_family(config.checkpoint)
    if stats is not None:
        state, actions, origin = _openpi(stats, 'the norm stats given to the engine')
    else:
        state, actions, origin = _normalization(config, preset, family)
    if config.quantile_eps is not None:
        state = _with_eps(state, config.quantile_eps)
        actions = _with_eps(actions, config.quantile_eps)
        origin += f' (quantile_eps {config.quantile_eps:g} set)'
    cfg, fmt = preset.model, config.prompt_format
    if fmt is None:
        fmt = get_robot(preset.robot).prompt_format
        if family is CheckpointFamily.LEROBOT:
            folder = checkpoint_folder(config.checkpoint)
            prompt = lerobot_prompt(folder)
            fmt = PromptFormat.PI05_STATE if prompt.include_state else PromptFormat.PI05_NO_STATE
            if prompt.max_length is not None and prompt.max_length != cfg.max_token_len:
                _LOG.warning('%s: LeRobot tokenizer max length %d, preset %s has %d prompt '
                             'slots', folder, prompt.max_length, cfg.name, cfg.max_token_len)
            if prompt.chunk_size is not None and prompt.chunk_size != cfg.action_horizon:
                _LOG.warning('%s: trained with LeRobot chunk_size %d, preset %s denoises %d '
                             'actions per chunk (the action tokens attend each other: a '
                             'different horizon changes the actions)', folder,
                             prompt.chunk_size, cfg.name, cfg.action_horizon)
    resize = config.image_resize or (ImageResize.LEROBOT if family is CheckpointFamily.LEROBOT
                                     else ImageResize.OPENPI)
    return Conventions(state, actions, origin, fmt, config.state_prompt_pad, family, resize)


def _with_eps(norm: QuantityNorm, eps: float) -> QuantityNorm:
    return replace(norm, quantile_eps=eps)


def _normalization(config: ConventionSettings, preset: Preset, family: CheckpointFamily
                   ) -> tuple[QuantityNorm, QuantityNorm, str]:
    if config.norm_stats:
        stats = load_norm_stats(Path(config.norm_stats))
        return _openpi(stats, f'norm_stats {config.norm_stats}')
    if family is CheckpointFamily.RANDOM:
        robot = get_robot(preset.robot)
        return (QuantityNorm(identity_norm_stats(robot.state_dim)),
                QuantityNorm(identity_norm_stats(robot.robot_action_dim)),
                'identity norm stats (random weights)')
    folder = checkpoint_folder(config.checkpoint)
    readers = [_read_lerobot, _read_openpi]
    if family is CheckpointFamily.OPENPI:
        readers.reverse()
    for read in readers:
        found = read(folder, preset)
        if found is not None:
            return found
    raise NormStatsNotFound(not_found_message(folder, preset))


def _openpi(stats: Mapping[str, NormStats], origin: str) -> tuple[QuantityNorm, QuantityNorm, str]:
    for key in ('state', 'actions'):
        if key not in stats:
            raise ValueError(f'{origin}: norm stats lack {key!r}; have {sorted(stats)}')
    return QuantityNorm(stats['state']), QuantityNorm(stats['actions']), \
        f'openpi quantile norm stats from {origin}'


def _read_openpi(folder: Path, preset: Preset) -> tuple[QuantityNorm, QuantityNorm, str] | None:
    file = openpi_norm_stats_file(folder, preset.asset_id)
    return _openpi(load_norm_stats(file), str(file)) if file.is_file() else None


def _read_lerobot(folder: Path, preset: Preset
                  ) -> tuple[QuantityNorm, QuantityNorm, str] | None:
    found = load_lerobot_normalization(folder)
    return None if found is None else (found.state, found.actions, found.describe())


def not_found_message(folder: Path, preset: Preset) -> str:
    """Return the error text for a checkpoint folder without norm stats (every place looked)."""
    openpi = openpi_norm_stats_file(folder, preset.asset_id)
    known = known_asset_ids(folder)
    other = f' (asset ids with norm stats there: {", ".join(known)}: another preset?)' \
        if known else ''
    return '\n'.join([
        f'norm stats not found for checkpoint {folder} (preset {preset.name!r}, asset id '
        f'{preset.asset_id!r}); looked for:',
        f'  - openpi: {openpi}{other}',
        f'  - LeRobot normalizer: {folder / PREPROCESSOR} or '
        f'{folder / normalizer_pattern(NORMALIZER)}',
        f'  - LeRobot unnormalizer: {folder / POSTPROCESSOR} or '
        f'{folder / normalizer_pattern(UNNORMALIZER)}',
        'Three ways out:',
        f'  1. openpi checkpoint: copy its assets/ folder next to model.safetensors (assets/'
        f'{preset.asset_id}/norm_stats.json; oxygen_convert does this for an openpi JAX '
        "checkpoint; openpi's own converter copies the parent folder's assets/, "
        'Physical-Intelligence/openpi#638)',
        '  2. LeRobot checkpoint: download the whole hub folder (policy_preprocessor*.json/'
        '.safetensors and policy_postprocessor* next to model.safetensors)',
        '  3. name a norm_stats.json: norm_stats:=/path/to/norm_stats.json',
    ])


__all__ = ['CheckpointFamily', 'ConventionSettings', 'Conventions', 'NormStatsNotFound',
           'checkpoint_family', 'checkpoint_folder', 'not_found_message', 'resolve_conventions']
