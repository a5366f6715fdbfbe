"""OxyGen textual-memory adapters written as OxyGen's ``adapter.save`` does (``np.savez``)."""

from pathlib import Path

import numpy as np
from oxygen_ros.config import ModelConfig
from oxygen_ros.model.lora import oxygen_shapes


def oxygen_arrays(cfg: ModelConfig, rank: int = 4, *, seed: int = 0,
                  std: float = 0.05) -> dict[str, np.ndarray]:
    """Return random float32 arrays under OxyGen's keys for ``cfg``'s VLM expert."""
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0.0, std, shape).astype(np.float32)
            for name, shape in oxygen_shapes(cfg, rank).items()}


def write_oxygen_adapter(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Save ``arrays`` as an ``.npz`` (OxyGen: ``np.savez(path, **arrays)``)."""
    np.savez(path, **arrays)
    return path
