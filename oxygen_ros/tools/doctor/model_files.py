"""
``oxygen_doctor``'s file checks: the tokenizer, the checkpoint and its norm stats, loadable.

Each is read as the engine reads it at configure: the tokenizer through ``PaligemmaTokenizer``
(SentencePiece, the PaliGemma layout checked), the checkpoint's keys and shapes against the
preset from the safetensors header (``checkpoint.weights.inspect_checkpoint``; ``--load``
loads every tensor as the node would) and its norm stats and prompt conventions through
``transforms.conventions.resolve_conventions``.
"""

from __future__ import annotations

from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.tools.doctor.findings import Finding, Level


def check_tokenizer(config: EngineConfig) -> Finding:
    """Return where the tokenizer is and whether it loads (vocabulary size)."""
    from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer
    try:
        tokenizer = PaligemmaTokenizer(config.tokenizer)
    except FileNotFoundError as exc:
        return Finding('tokenizer', Level.ERROR, str(exc).split('. ')[0],
                       'ros2 run oxygen_ros oxygen_fetch tokenizer (or the tokenizer:=PATH '
                       'parameter)')
    except ValueError as exc:
        return Finding('tokenizer', Level.ERROR, f'{config.tokenizer}: {exc}',
                       'point tokenizer:= at a paligemma_tokenizer.model, or run '
                       'oxygen_fetch tokenizer --force')
    return Finding('tokenizer', Level.OK, f'{tokenizer.path}: loads, {tokenizer.vocab_size} '
                   'pieces')


def check_checkpoint(config: EngineConfig, load: bool = False) -> Finding:
    """
    Return whether the configured checkpoint fits the preset and has norm stats.

    :param load: also load every tensor (as the node does at configure), on the CPU.
    """
    from oxygen_ros.checkpoint.weights import CheckpointError, inspect_checkpoint
    from oxygen_ros.config import get_preset
    from oxygen_ros.transforms.conventions import resolve_conventions
    cfg = config.model_config()
    if not config.checkpoint:
        return Finding('checkpoint', Level.WARN, f'none: preset {cfg.name} runs seeded RANDOM '
                       'weights (meaningless actions and texts)',
                       'checkpoint:=/path/to/the/checkpoint (docs/checkpoints.md)')
    try:
        file, layout = inspect_checkpoint(config.checkpoint, cfg)
    except CheckpointError as exc:
        return Finding('checkpoint', Level.ERROR, ' '.join(str(exc).split()),
                       'a model.safetensors of this preset (oxygen_convert turns an openpi '
                       'JAX checkpoint into one; docs/checkpoints.md)')
    try:
        conventions = resolve_conventions(config, get_preset(config.preset))
    except (FileNotFoundError, ValueError) as exc:
        return Finding('checkpoint', Level.ERROR, f'{file} ({layout.value} layout) fits '
                       f'preset {cfg.name}, but: {" ".join(str(exc).split())}',
                       "the checkpoint's assets/<asset_id>/norm_stats.json, or norm_stats:=")
    summary = (f'{file}: {layout.value} layout, fits preset {cfg.name}; '
               f'{conventions.describe()}')
    if load:
        from oxygen_ros.checkpoint.weights import load_checkpoint
        from oxygen_ros.engine.loading import torch_dtype
        try:
            model = load_checkpoint(file, cfg, dtype=torch_dtype(config.dtype))
        except (CheckpointError, RuntimeError, MemoryError) as exc:
            return Finding('checkpoint', Level.ERROR, f'{file}: does not load: {exc}')
        count = sum(p.numel() for p in model.parameters())
        summary += f'; loaded: {count / 1e9:.2f} G parameters in {config.dtype}'
    return Finding('checkpoint', Level.OK, summary)


__all__ = ['check_checkpoint', 'check_tokenizer']
