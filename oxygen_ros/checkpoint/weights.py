"""
Checkpoint load/save in the openpi-PyTorch and LeRobot key layouts (safetensors only).

This is the only place where checkpoint keys are renamed (both layouts:
``docs/checkpoints.md#key-layouts``). Our modules fuse Q/K/V and gate/up projections; a
checkpoint stores them separately, so each of our parameters maps to one or more checkpoint
tensors split along dim 0 by the sizes the preset implies (never assuming width = heads ×
head_dim). Loading never unpickles anything.
"""

from __future__ import annotations

import enum
import json
import logging
from pathlib import Path
import re

from oxygen_ros.checkpoint.keys import (
    checkpoint_dims, config_dims, key_map, LM_HEAD, VISION)
from oxygen_ros.config import get_preset, ModelConfig, preset_names
from oxygen_ros.model.fp8 import fp8_kernel_of
from oxygen_ros.model.pi05 import Pi05Model

from safetensors import safe_open, SafetensorError
from safetensors.torch import save_file
import torch


_log = logging.getLogger(__name__)

WEIGHTS_FILE = 'model.safetensors'
CONFIG_FILE = 'config.json'
LEROBOT_PREFIX = 'model.'
TIED_HEAD_KEY = LM_HEAD
EMBED_KEY = 'paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
EXPERT_HEAD_KEY = 'paligemma_with_expert.gemma_expert.lm_head.weight'
_LEROBOT_NORM = re.compile(
    r'paligemma_with_expert\.gemma_expert\.model\.'
    r'(layers\.\d+\.(input_layernorm|post_attention_layernorm)|norm)\.weight')
_LEROBOT_TIME = re.compile(r'action_time_mlp_(in|out)\.')
_TOWER = 'paligemma_with_expert.paligemma.model.vision_tower.'


class CheckpointLayout(str, enum.Enum):
    """Key layout of ``model.safetensors``."""

    OPENPI = 'openpi'
    """openpi ``convert_jax_model_to_pytorch.py`` output: ``paligemma_with_expert.…``."""
    LEROBOT = 'lerobot'
    """LeRobot ``PI05Policy``: the openpi keys prefixed with ``model.``."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the preset; the message says why."""


def save_checkpoint(model: Pi05Model, out_dir: str | Path, *,
                    layout: CheckpointLayout = CheckpointLayout.OPENPI,
                    dtype: torch.dtype | None = None) -> Path:
    """
    Write ``model.safetensors`` and ``config.json`` into ``out_dir`` (created if needed).

    The tied LM head is stored once, as ``…language_model.embed_tokens.weight``.
    ``config.json`` follows openpi's converter (action_dim, action_horizon, paligemma_variant,
    action_expert_variant, precision) plus our ``preset`` name.

    :param model: the model to save.
    :param out_dir: destination directory.
    :param layout: key layout.
    :param dtype: on-disk dtype (default: the model's); in 16 bits the parameters of
        ``Pi05Model.float32_parameters`` are written in float32, as openpi's converter does.
    :returns: the path of the weights file.
    :raises ValueError: a model with FP8 weights (quantized at load, never saved so).
    """
    if fp8_kernel_of(model) is not None:
        raise ValueError('the model has FP8 weights (quantized at load: model/fp8.py); save '
                         'the unquantized model')
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = LEROBOT_PREFIX if layout is CheckpointLayout.LEROBOT else ''
    state = model.state_dict()
    dtypes = model.parameter_dtypes(dtype) if dtype is not None else {}
    tensors: dict[str, torch.Tensor] = {}
    for entry in key_map(model.cfg, untied_lm_head=model.lm_head is not None):
        value = state[entry.ours].detach()
        if entry.ours in dtypes:
            value = value.to(dtypes[entry.ours])
        pieces = value.split(list(entry.sizes)) if len(entry.theirs) > 1 else (value,)
        for name, piece in zip(entry.theirs, pieces):
            tensors[prefix + name] = piece.contiguous().cpu()
    path = out_dir / WEIGHTS_FILE
    save_file(tensors, str(path), metadata={'format': 'pt'})
    config = openpi_config(model.cfg, str(dtype or model.dtype).removeprefix('torch.'), layout)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + '\n')
    return path


def openpi_config(cfg: ModelConfig, precision: str,
                  layout: CheckpointLayout = CheckpointLayout.OPENPI) -> dict[str, object]:
    """
    Return the ``config.json`` of a checkpoint folder.

    openpi's converter keys (action_dim, action_horizon, paligemma_variant,
    action_expert_variant, precision) plus our ``preset`` and ``layout``.
    """
    base = get_preset('pi05_base').model
    return {
        'action_dim': cfg.action_dim,
        'action_horizon': cfg.action_horizon,
        'paligemma_variant': 'gemma_2b' if cfg.vlm == base.vlm else f'{cfg.name}_vlm',
        'action_expert_variant': 'gemma_300m' if cfg.expert == base.expert
        else f'{cfg.name}_expert',
        'precision': precision,
        'preset': cfg.name,
        'layout': layout.value,
    }


def load_checkpoint(path: str | Path, cfg: ModelConfig, *, dtype: torch.dtype | None = None,
                    device: torch.device | str = 'cpu') -> Pi05Model:
    """
    Load a π0.5 checkpoint (openpi-PyTorch or LeRobot layout, detected from the keys).

    Handles the tied LM head (either key), drops the unused ``gemma_expert.lm_head``, and for
    LeRobot applies its renames (``action_time_mlp_*`` → ``time_mlp_*``) and drops
    (``state_proj.*``, non-adaptive action-expert norm weights). A checkpoint with both
    ``embed_tokens`` and a different ``lm_head`` gets an untied LM head (logged at INFO); a
    SigLIP tree without ``vision_model.`` (third-party LeRobot exports) is renamed (WARN). The
    model is built on the meta device and the tensors are assigned, so nothing is allocated
    twice.

    :param path: a directory holding ``model.safetensors``, or the file itself.
    :param cfg: the preset the weights must fit.
    :param dtype: model dtype (default: the on-disk dtype of the token embedding); in 16 bits
        the norms and embeddings of ``Pi05Model.float32_parameters`` are kept in float32.
    :param device: where the model lives.
    :returns: the model in eval mode.
    :raises CheckpointError: unreadable file, unknown layout, or missing / unexpected /
        misshapen keys (all listed in one message, with the disagreeing preset dimensions and
        the preset that matches, if any).
    """
    file = _weights_file(path)
    try:
        with safe_open(str(file), framework='pt', device='cpu') as reader:
            shapes = _shapes(reader)
            layout, names = _normalize_keys(file, shapes)
            untied = _untied_head(file, reader, names)
            shapes = {ours: shapes[theirs] for ours, theirs in names.items()}
            _check(file, layout, cfg, shapes, untied)
            tensors = {k: reader.get_tensor(names[k]) for k in names}
    except SafetensorError as exc:
        raise CheckpointError(f'{file}: not a readable safetensors file ({exc})') from None
    if dtype is None:
        dtype = tensors[EMBED_KEY].dtype
    with torch.device('meta'):
        model = Pi05Model(cfg, untied_lm_head=untied)
    dtypes = model.parameter_dtypes(dtype)
    state = {}
    for entry in key_map(cfg, untied_lm_head=untied):
        parts = [tensors.pop(name) for name in entry.theirs]
        value = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        state[entry.ours] = value.to(dtypes[entry.ours])
    model.load_state_dict(state, strict=True, assign=True)
    _log.info('loaded %s (%s layout, %s) into preset %r', file, layout.value, dtype, cfg.name)
    return model.to(device).eval()


def inspect_checkpoint(path: str | Path, cfg: ModelConfig) -> tuple[Path, CheckpointLayout]:
    """
    Check a checkpoint's keys and shapes against ``cfg`` from its header alone (no tensor read).

    What :func:`load_checkpoint` checks before it reads the tensors (``oxygen_doctor``'s
    check); an LM head stored beside the embedding is taken as a possibly untied head (its
    shape must fit).

    :returns: the ``model.safetensors`` file and its layout.
    :raises CheckpointError: as :func:`load_checkpoint` (no file, unreadable, unknown layout,
        missing / unexpected / misshapen keys).
    """
    file = _weights_file(path)
    try:
        with safe_open(str(file), framework='pt', device='cpu') as reader:
            shapes = _shapes(reader)
    except SafetensorError as exc:
        raise CheckpointError(f'{file}: not a readable safetensors file ({exc})') from None
    layout, names = _normalize_keys(file, shapes)
    _check(file, layout, cfg, {ours: shapes[theirs] for ours, theirs in names.items()},
           TIED_HEAD_KEY in names)
    return file, layout


def _weights_file(path: str | Path) -> Path:
    """Return ``model.safetensors`` of a checkpoint folder (or the file given)."""
    file = Path(path).expanduser()
    if file.is_dir():
        file = file / WEIGHTS_FILE
    if not file.is_file():
        raise CheckpointError(f'no checkpoint file at {file}')
    return file


def _shapes(reader) -> dict[str, tuple[int, ...]]:
    """Return every tensor's shape from an open safetensors file's header."""
    return {k: tuple(reader.get_slice(k).get_shape()) for k in reader.keys()}


def _normalize_keys(file: Path, shapes: dict[str, tuple[int, ...]]
                    ) -> tuple[CheckpointLayout, dict[str, str]]:
    """Return the layout and a map from openpi key to on-disk key (aliases resolved)."""
    if any(k.startswith(LEROBOT_PREFIX + 'paligemma_with_expert.') for k in shapes):
        layout = CheckpointLayout.LEROBOT
    elif any(k.startswith('paligemma_with_expert.') for k in shapes):
        layout = CheckpointLayout.OPENPI
    else:
        sample = ', '.join(sorted(shapes)[:5]) or 'no tensors'
        raise CheckpointError(f'{file}: unknown key layout (expected openpi '
                              f'"paligemma_with_expert.…" or LeRobot "model.…"; found {sample})')
    names: dict[str, str] = {}
    renamed = 0
    for key in shapes:
        name = key
        if layout is CheckpointLayout.LEROBOT:
            name = key.removeprefix(LEROBOT_PREFIX)
            if name.startswith('state_proj.') or _LEROBOT_NORM.fullmatch(name):
                continue
            name = _LEROBOT_TIME.sub(r'time_mlp_\1.', name)
        if name.startswith(_TOWER) and not name.startswith(VISION):
            name, renamed = VISION + name.removeprefix(_TOWER), renamed + 1
        if name != EXPERT_HEAD_KEY:
            names[name] = key
    if renamed:
        _log.warning('%s: %d SigLIP keys lack "vision_model." (%s…, as some third-party '
                     'LeRobot exports write them): renamed to %s…', file, renamed, _TOWER,
                     VISION)
    if TIED_HEAD_KEY in names and EMBED_KEY not in names:
        names[EMBED_KEY] = names.pop(TIED_HEAD_KEY)  # the tied head is the embedding
    return layout, names


def _untied_head(file: Path, reader, names: dict[str, str]) -> bool:
    """
    Return whether the checkpoint's LM head differs from its embedding (an untied head).

    Drops the head from ``names`` when it equals the embedding (both names of a tied weight).
    """
    if TIED_HEAD_KEY not in names:
        return False
    head = reader.get_tensor(names[TIED_HEAD_KEY])
    embed = reader.get_tensor(names[EMBED_KEY])
    if head.shape == embed.shape and torch.equal(head, embed.to(head.dtype)):
        del names[TIED_HEAD_KEY]
        return False
    _log.info('%s holds an LM head (%s) that differs from the token embedding: loaded as an '
              'untied head, text decoding uses it', file, names[TIED_HEAD_KEY])
    return True


def _check(file: Path, layout: CheckpointLayout, cfg: ModelConfig,
           shapes: dict[str, tuple[int, ...]], untied: bool) -> None:
    expected: dict[str, tuple[int, ...]] = {}
    for entry in key_map(cfg, untied_lm_head=untied):
        expected.update(zip(entry.theirs, entry.shapes))
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    misshapen = sorted(k for k in set(shapes) & set(expected) if shapes[k] != expected[k])
    if not (missing or unexpected or misshapen):
        return
    lines = [f'checkpoint {file} ({layout.value} layout) does not fit preset {cfg.name!r}:']
    lines += _preset_hint(cfg, shapes)
    if missing:
        lines.append(f'  missing keys ({len(missing)}): {", ".join(missing)}')
    if unexpected:
        lines.append(f'  unexpected keys ({len(unexpected)}): {", ".join(unexpected)}')
    if misshapen:
        lines.append(f'  misshapen keys ({len(misshapen)}): ' + ', '.join(
            f'{k} checkpoint {list(shapes[k])} expected {list(expected[k])}'
            for k in misshapen))
    raise CheckpointError('\n'.join(lines))


def _preset_hint(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    found = checkpoint_dims(shapes)
    ours = config_dims(cfg)
    diff = [f'{name}: checkpoint {value}, preset {cfg.name!r} {ours[name]}'
            for name, value in found.items() if ours.get(name) != value]
    if not diff:
        return []
    matches = [name for name in preset_names()
               if all(config_dims(get_preset(name).model).get(k) == v
                      for k, v in found.items())]
    hint = (f'the checkpoint matches preset {" / ".join(repr(m) for m in matches)}'
            if matches else 'no registered preset matches these dimensions')
    return [f'  wrong preset? {"; ".join(diff)}; {hint}']


__all__ = ['CheckpointError', 'CheckpointLayout', 'inspect_checkpoint', 'load_checkpoint',
           'openpi_config', 'save_checkpoint']
