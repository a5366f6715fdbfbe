"""
Write LeRobot π0.5 checkpoint folders as LeRobot saves them (processor/pipeline.py).

``policy_preprocessor.json`` / ``policy_postprocessor.json`` list the steps (registry name,
config, state file); the normalizer and unnormalizer steps keep the dataset stats as flat
``<feature>.<stat>`` float32 tensors in ``<pipeline>_step_<i>_<registry name>.safetensors``;
``config.json`` holds ``type: pi05`` and ``normalization_mapping``.
"""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

FEATURES = {'observation.state': {'type': 'STATE', 'shape': [8]},
            'observation.images.base_0_rgb': {'type': 'VISUAL', 'shape': [3, 224, 224]},
            'action': {'type': 'ACTION', 'shape': [7]}}


def dataset_stats(rng: np.random.Generator, state_dim: int = 8, action_dim: int = 7) -> dict:
    """Return LeRobot-style stats: ``{feature: {stat: float32 array}}`` (images included)."""
    stats = {}
    for key, dim in (('observation.state', state_dim), ('action', action_dim)):
        mean = rng.uniform(-1, 1, dim)
        std = rng.uniform(0.2, 2.0, dim)
        stats[key] = {'mean': mean, 'std': std, 'min': mean - 3 * std, 'max': mean + 3 * std,
                      'q01': mean - 2 * std, 'q10': mean - std, 'q50': mean,
                      'q90': mean + std, 'q99': mean + 2.5 * std}
    stats['observation.images.base_0_rgb'] = {'mean': np.full((3, 1, 1), 0.5),
                                              'std': np.full((3, 1, 1), 0.25)}
    return {k: {s: np.asarray(v, np.float32) for s, v in d.items()} for k, d in stats.items()}


def _flat(stats: dict) -> dict:
    return {f'{key}.{stat}': value for key, entry in stats.items()
            for stat, value in entry.items()}


def write_lerobot_processors(folder: Path, stats: dict, mode: str = 'QUANTILES', *,
                             eps: float = 1e-8, config_mode: str | None = None,
                             pipeline_json: bool = True, postprocessor: bool = True,
                             include_state: bool | None = None) -> None:
    """
    Write LeRobot's processor files and ``config.json`` into ``folder``.

    :param mode: STATE and ACTION mode of the processors' ``norm_map``.
    :param config_mode: ``config.json``'s ``normalization_mapping`` mode (default ``mode``).
    :param pipeline_json: write the pipeline JSONs (else only the state files).
    :param include_state: the pi05 prompt step's ``include_state_in_prompt`` (None: absent,
        as LeRobot's ``get_config`` leaves it).
    """
    folder.mkdir(parents=True, exist_ok=True)
    norm_map = {'VISUAL': 'IDENTITY', 'STATE': mode, 'ACTION': mode}
    step_config = {'eps': eps, 'features': FEATURES, 'norm_map': norm_map}
    pre_file = 'policy_preprocessor_step_3_normalizer_processor.safetensors'
    save_file(_flat(stats), str(folder / pre_file))
    prompt_config = {} if include_state is None else {'include_state_in_prompt': include_state}
    pre = {'name': 'policy_preprocessor', 'steps': [
        {'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
        {'registry_name': 'to_batch_processor', 'config': {}},
        {'registry_name': 'relative_actions_processor', 'config': {'enabled': False}},
        {'registry_name': 'normalizer_processor', 'config': step_config,
         'state_file': pre_file},
        {'registry_name': 'pi05_prepare_state_tokenizer_processor_step',
         'config': prompt_config},
        {'registry_name': 'tokenizer_processor', 'config': {
            'max_length': 64, 'task_key': 'task', 'padding_side': 'right',
            'padding': 'max_length', 'truncation': True,
            'tokenizer_name': 'google/paligemma-3b-pt-224'}},
        {'registry_name': 'device_processor', 'config': {'device': 'cpu'}}]}
    if postprocessor:
        post_file = 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
        save_file(_flat(stats), str(folder / post_file))
        post = {'name': 'policy_postprocessor', 'steps': [
            {'registry_name': 'unnormalizer_processor', 'config': step_config,
             'state_file': post_file},
            {'registry_name': 'device_processor', 'config': {'device': 'cpu'}}]}
    if pipeline_json:
        (folder / 'policy_preprocessor.json').write_text(json.dumps(pre, indent=2))
        if postprocessor:
            (folder / 'policy_postprocessor.json').write_text(json.dumps(post, indent=2))
    cmode = config_mode or mode
    config = {'type': 'pi05', 'paligemma_variant': 'gemma_2b', 'chunk_size': 4,
              'max_state_dim': 32, 'max_action_dim': 32, 'tokenizer_max_length': 64,
              'normalization_mapping': {'VISUAL': 'IDENTITY', 'STATE': cmode,
                                        'ACTION': cmode}}
    (folder / 'config.json').write_text(json.dumps(config, indent=2))


def equivalent_openpi_stats(stats: dict, mode: str) -> dict:
    """
    Return openpi ``norm_stats.json`` content whose quantile formula equals LeRobot's ``mode``.

    openpi: ``(x - q01) / (q99 - q01 + 1e-6) * 2 - 1``. LeRobot QUANTILES has no ``+ 1e-6``
    (so q99 is lowered by it); MEAN_STD ``(x - mean) / (std + 1e-8)`` is the quantile formula
    with ``q01 = mean - s``, ``q99 = mean + s - 1e-6``, ``s = std + 1e-8``.
    """
    out = {}
    for key, name in (('observation.state', 'state'), ('action', 'actions')):
        entry = {k: v.astype(np.float64) for k, v in stats[key].items()}
        if mode == 'QUANTILES':
            q01, q99 = entry['q01'], entry['q99'] - 1e-6
        else:
            s = entry['std'] + 1e-8
            q01, q99 = entry['mean'] - s, entry['mean'] + s - 1e-6
        out[name] = {'mean': entry['mean'].tolist(), 'std': entry['std'].tolist(),
                     'q01': q01.tolist(), 'q99': q99.tolist()}
    return {'norm_stats': out}
