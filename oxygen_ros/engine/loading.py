"""
Building what an engine needs from its config: model weights and tokenizer.

With no checkpoint the model gets seeded random weights and identity norm stats: the
pipeline, timings and KV behaviour are real, the actions and texts are meaningless (logged).
"""

from __future__ import annotations

import logging

from oxygen_ros.config import ModelConfig
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.model.pi05 import build_model as build_random_model, Pi05Model
from oxygen_ros.model.tokenizer import PaligemmaTokenizer
import torch

_LOG = logging.getLogger(__name__)


def torch_dtype(name: str) -> torch.dtype:
    """
    Return the torch dtype called ``name`` (``float32`` or ``bfloat16``).

    :raises ValueError: any other name.
    """
    dtypes = {'float32': torch.float32, 'bfloat16': torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f'dtype must be one of {sorted(dtypes)}, got {name!r}')
    return dtypes[name]


def build_model(config: EngineConfig, model_cfg: ModelConfig) -> Pi05Model:
    """
    Load the checkpoint of ``config``, or build seeded random weights if it has none.

    :raises ValueError: checkpoint keys or shapes do not fit ``model_cfg`` (CheckpointError).
    :raises FileNotFoundError: the checkpoint does not exist.
    """
    dtype = torch_dtype(config.dtype)
    if config.checkpoint:
        from oxygen_ros.model.weights import load_checkpoint
        model = load_checkpoint(config.checkpoint, model_cfg, dtype=dtype, device=config.device)
        _LOG.info('loaded %s weights from %s', model_cfg.name, config.checkpoint)
        return model
    torch.manual_seed(config.seed)
    model = build_random_model(model_cfg, dtype=dtype, device=config.device)
    _LOG.warning('preset %s: RANDOM weights (seed %d), no checkpoint given: actions and text '
                 'are meaningless; pass a checkpoint for a real policy', model_cfg.name,
                 config.seed)
    return model


def load_tokenizer(config: EngineConfig) -> PaligemmaTokenizer:
    """
    Load the tokenizer of ``config`` (the fetched default when it names none).

    :raises FileNotFoundError: no tokenizer file (the message says how to fetch one).
    """
    return PaligemmaTokenizer(config.tokenizer)
