r"""
What a LeRobot π0.5 checkpoint folder says about normalization and the prompt.

LeRobot (``processor/pipeline.py``) saves its processor pipelines next to ``model.safetensors``:
``policy_preprocessor.json`` / ``policy_postprocessor.json`` list the steps with their config,
and each stateful step's tensors sit in ``<pipeline>_step_<i>_<registry name>.safetensors``.
The normalizer step (``normalizer_processor``) and the post-processor's
``unnormalizer_processor`` hold the dataset statistics as flat keys ``<feature>.<stat>``
(``observation.state.q01``, ``action.q99``, ``mean``, ``std``, ``min``, ``max`` …); their
config holds ``norm_map`` (feature type → mode) and ``eps``. ``config.json`` repeats the
modes as ``normalization_mapping`` (LeRobot ``PI05Config``: QUANTILES for state and action).

LeRobot's pi05 prompt step (``Pi05PrepareStateTokenizerProcessorStep``) writes
``"Task: {task}, State: {bins};\nAction: "`` for every dataset, LIBERO included, unless
``include_state_in_prompt`` is off (then ``"Task: {task};\nAction: "``).
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import logging
from pathlib import Path

import numpy as np

from oxygen_ros.transforms.norm_stats import FILE_NAMES, NormStats
from oxygen_ros.transforms.normalize import LEROBOT_EPS, NormMode, QuantityNorm

from safetensors import SafetensorError
from safetensors.numpy import load_file

_LOG = logging.getLogger(__name__)

CONFIG_FILE = 'config.json'
PREPROCESSOR = 'policy_preprocessor.json'
POSTPROCESSOR = 'policy_postprocessor.json'
NORMALIZER = 'normalizer_processor'
UNNORMALIZER = 'unnormalizer_processor'
PROMPT_STEP = 'pi05_prepare_state_tokenizer_processor_step'
STATE_KEY = 'observation.state'
ACTION_KEY = 'action'
DEFAULT_NORM_MAP = {'STATE': NormMode.QUANTILES, 'ACTION': NormMode.QUANTILES}
"""LeRobot ``PI05Config.normalization_mapping`` (VISUAL is IDENTITY; images are not ours)."""
_STAT_NAMES = {FILE_NAMES.get(f, f): f for f in
               ('mean', 'std', 'q01', 'q99', 'minimum', 'maximum', 'q10', 'q90')}


def normalizer_pattern(registry_name: str) -> str:
    """Return the glob of a step's state file (``<pipeline>_step_<i>_<registry_name>``)."""
    return f'*_step_*_{registry_name}.safetensors'


@dataclass(frozen=True, slots=True)
class LerobotNormalization:
    """
    State and action normalization read from a LeRobot checkpoint folder.

    :ivar state: from the pre-processor's normalizer (``observation.state``).
    :ivar actions: from the post-processor's unnormalizer (``action``), as LeRobot applies it.
    :ivar files: the files read, in that order.
    """

    state: QuantityNorm
    actions: QuantityNorm
    files: tuple[Path, ...]

    def describe(self) -> str:
        """Return ``'state MODE, actions MODE from FILES'`` for the logs."""
        return (f'LeRobot normalization: state {self.state.mode.value}, actions '
                f'{self.actions.mode.value} (eps {self.actions.eps:g}, no +1e-6) from '
                + ', '.join(f.name for f in self.files))


def read_json(path: Path) -> dict:
    """
    Return the JSON object in ``path``.

    :raises ValueError: malformed JSON or not an object (the message names the file).
    """
    try:
        data = json.loads(path.read_text(encoding='utf-8'))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f'{path}: malformed JSON ({exc})') from None
    if not isinstance(data, dict):
        raise ValueError(f'{path}: expected a JSON object')
    return data


def is_lerobot_folder(folder: Path) -> bool:
    """Return whether ``folder`` holds LeRobot processor files or a LeRobot ``config.json``."""
    if (folder / PREPROCESSOR).is_file() or (folder / POSTPROCESSOR).is_file():
        return True
    if any(folder.glob(normalizer_pattern(NORMALIZER))) or \
            any(folder.glob(normalizer_pattern(UNNORMALIZER))):
        return True
    config = folder / CONFIG_FILE
    try:
        return config.is_file() and read_json(config).get('type') == 'pi05'
    except ValueError:
        return False


def _step(folder: Path, pipeline: str, registry_name: str) -> tuple[dict, Path | None]:
    """Return ``(config, state file)`` of a pipeline step (from its JSON, else by name)."""
    path = folder / pipeline
    if path.is_file():
        steps = read_json(path).get('steps', [])
        for step in steps if isinstance(steps, list) else []:
            if isinstance(step, dict) and step.get('registry_name') == registry_name:
                config = step.get('config') if isinstance(step.get('config'), dict) else {}
                state = step.get('state_file')
                return config, (folder / state if isinstance(state, str) else None)
    found = sorted(folder.glob(normalizer_pattern(registry_name)))
    if len(found) > 1:
        raise ValueError(f'{folder}: several {registry_name} files and no {pipeline} naming '
                         f'one: {", ".join(f.name for f in found)}')
    return {}, (found[0] if found else None)


def _read_stats(file: Path) -> dict[str, dict[str, np.ndarray]]:
    """Return ``{feature: {stat: array}}`` of a normalizer state file (flat keys)."""
    try:
        flat = load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f'{file}: not a readable safetensors file ({exc})') from None
    grouped: dict[str, dict[str, np.ndarray]] = {}
    for key, value in flat.items():
        feature, _, stat = key.rpartition('.')
        grouped.setdefault(feature, {})[stat] = value
    return grouped


def _norm_map(folder: Path, step_config: dict) -> dict[str, NormMode]:
    """Return the feature type -> mode that LeRobot applies (the processor's, else config)."""
    modes = dict(DEFAULT_NORM_MAP)
    config_file = folder / CONFIG_FILE
    from_config = read_json(config_file).get('normalization_mapping') \
        if config_file.is_file() else None
    from_step = step_config.get('norm_map')
    for source in (from_config, from_step):
        if isinstance(source, dict):
            modes.update({k: NormMode(v) for k, v in source.items() if k in modes})
    if isinstance(from_config, dict) and isinstance(from_step, dict):
        differ = {k: (from_config.get(k), from_step.get(k)) for k in DEFAULT_NORM_MAP
                  if from_config.get(k) != from_step.get(k)}
        if differ:
            _LOG.warning('%s: normalization_mapping %s differs from the processor norm_map %s; '
                         'using the processor (LeRobot applies it at inference)', config_file,
                         {k: v[0] for k, v in differ.items()},
                         {k: v[1] for k, v in differ.items()})
    return modes


def _quantity(file: Path, stats: dict[str, dict[str, np.ndarray]], feature: str,
              mode: NormMode, eps: float) -> QuantityNorm:
    entry = stats.get(feature)
    if entry is None:
        if mode is NormMode.IDENTITY:
            return QuantityNorm(None, mode)
        raise ValueError(f'{file}: no {feature!r} statistics (the {mode.value} normalization '
                         f'of {feature} needs them); features there: {sorted(stats)}')
    fields = {_STAT_NAMES[name]: np.asarray(value, dtype=np.float64).reshape(-1)
              for name, value in entry.items() if name in _STAT_NAMES}
    try:
        return QuantityNorm(NormStats(**fields), mode, quantile_eps=0.0, eps=eps)
    except ValueError as exc:
        raise ValueError(f'{file}: {feature}: {exc}') from None


def load_lerobot_normalization(folder: Path) -> LerobotNormalization | None:
    """
    Read LeRobot's normalizer/unnormalizer files of a checkpoint folder.

    State from the pre-processor's normalizer, actions from the post-processor's unnormalizer
    (each falls back to the other file, which mirrors the same dataset stats). Modes and
    ``eps`` from the step's config (else ``config.json``'s ``normalization_mapping``, else
    LeRobot's π0.5 defaults); quantiles without openpi's ``+ 1e-6`` (LeRobot's formula).

    :returns: None when the folder holds neither file.
    :raises ValueError: unreadable files, missing statistics for a mode, unknown modes,
        several candidate files and no pipeline JSON to choose.
    """
    pre_config, pre_file = _step(folder, PREPROCESSOR, NORMALIZER)
    post_config, post_file = _step(folder, POSTPROCESSOR, UNNORMALIZER)
    files = [f for f in (pre_file, post_file) if f is not None and f.is_file()]
    if not files:
        return None
    state_file = pre_file if pre_file in files else files[0]
    action_file = post_file if post_file in files else files[0]
    state_config = pre_config if state_file == pre_file else post_config
    action_config = post_config if action_file == post_file else pre_config
    try:
        state_modes = _norm_map(folder, state_config)
        action_modes = _norm_map(folder, action_config)
    except ValueError as exc:
        raise ValueError(f'{folder}: unknown normalization mode ({exc})') from None
    state = _quantity(state_file, _read_stats(state_file), STATE_KEY, state_modes['STATE'],
                      float(state_config.get('eps', LEROBOT_EPS)))
    actions = _quantity(action_file, _read_stats(action_file), ACTION_KEY,
                        action_modes['ACTION'], float(action_config.get('eps', LEROBOT_EPS)))
    return LerobotNormalization(state, actions, tuple(dict.fromkeys([state_file, action_file])))


@dataclass(frozen=True, slots=True)
class LerobotPrompt:
    """
    The prompt a LeRobot π0.5 checkpoint was trained with.

    :ivar include_state: the discretized state is in the prompt (LeRobot's default).
    :ivar max_length: tokenizer max length (``tokenizer_max_length``), None if not stated.
    :ivar chunk_size: actions per chunk it was trained with (LeRobot ``chunk_size``, openpi's
        action horizon), None if not stated.
    """

    include_state: bool = True
    max_length: int | None = None
    chunk_size: int | None = None


def lerobot_prompt(folder: Path) -> LerobotPrompt:
    """
    Return the prompt conventions of a LeRobot folder (processor JSON, then ``config.json``).

    :raises ValueError: a malformed JSON file.
    """
    step_config, _ = _step(folder, PREPROCESSOR, PROMPT_STEP)
    tokenizer_config, _ = _step(folder, PREPROCESSOR, 'tokenizer_processor')
    config = read_json(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
    include = step_config.get('include_state_in_prompt',
                              not config.get('use_proprioceptive_memory', False))
    length = tokenizer_config.get('max_length', config.get('tokenizer_max_length'))
    chunk = config.get('chunk_size')
    return LerobotPrompt(bool(include), length if isinstance(length, int) else None,
                         chunk if isinstance(chunk, int) else None)


__all__ = [
    'ACTION_KEY', 'LerobotNormalization', 'LerobotPrompt', 'NORMALIZER', 'POSTPROCESSOR',
    'PREPROCESSOR', 'STATE_KEY', 'UNNORMALIZER', 'is_lerobot_folder', 'lerobot_prompt',
    'load_lerobot_normalization', 'normalizer_pattern', 'read_json',
]
