"""Per-checkpoint conventions: LeRobot normalizer files, openpi assets, prompt, clear errors."""

import json
import logging

from lerobot_files import dataset_stats, equivalent_openpi_stats, write_lerobot_processors
import numpy as np
from oxygen_ros.checkpoint.weights import CheckpointLayout, save_checkpoint
from oxygen_ros.config import get_preset, PromptFormat
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.observation import Observation
from oxygen_ros.policies import preset_robot
from oxygen_ros.transforms.conventions import (
    CheckpointFamily, NormStatsNotFound, resolve_conventions)
from oxygen_ros.transforms.images import ImageResize
from oxygen_ros.transforms.normalize import NormMode
import pytest
import torch

CFG = get_preset('tiny').model  # its robot: state_dim 8, robot_action_dim 7; asset id 'tiny'
CAMERAS = preset_robot('tiny').cameras


@pytest.fixture(scope='module')
def weights():
    torch.manual_seed(4)
    return build_model(CFG)


def _frames(stats, n=3):
    rng = np.random.default_rng(9)
    mean, std = stats['observation.state']['mean'], stats['observation.state']['std']
    for f in range(n):
        images = {slot: rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
                  for slot in CAMERAS}
        state = (mean + rng.uniform(-1.5, 1.5, 8) * std).astype(np.float64)
        yield Observation(images=images, state=state, prompt='put the bowl on the plate',
                          stamp_ns=f * 100_000_000)


def _run(checkpoint, tokenizer, stats, **config):
    engine = Engine(EngineConfig(preset='tiny', checkpoint=str(checkpoint), seed=2, **config),
                    tokenizer=tokenizer)
    prompts, actions = [], []
    for obs in _frames(stats):
        prompts.append(engine.prepare(obs).action_prompt_ids)
        actions.append(engine.step(obs).action.actions)
    return engine, prompts, np.stack(actions)


@pytest.mark.parametrize('mode', ['QUANTILES', 'MEAN_STD'])
def test_lerobot_normalizer_files_give_the_actions_of_the_equivalent_openpi_stats(
        weights, tokenizer, tmp_path, mode):
    stats = dataset_stats(np.random.default_rng(1))
    lerobot = tmp_path / 'lerobot'
    save_checkpoint(weights, lerobot, layout=CheckpointLayout.LEROBOT)
    write_lerobot_processors(lerobot, stats, mode)
    openpi = tmp_path / 'openpi'
    save_checkpoint(weights, openpi)
    (openpi / 'assets/tiny').mkdir(parents=True)
    (openpi / 'assets/tiny/norm_stats.json').write_text(
        json.dumps(equivalent_openpi_stats(stats, mode)))

    engine, prompts, actions = _run(lerobot, tokenizer, stats)
    conv = engine.conventions
    assert conv.family is CheckpointFamily.LEROBOT
    assert conv.prompt_format is PromptFormat.PI05_STATE
    assert conv.state.mode is NormMode(mode) and conv.actions.mode is NormMode(mode)
    assert conv.actions.quantile_eps == 0.0 and conv.actions.eps == 1e-8
    assert 'policy_preprocessor_step_3_normalizer_processor.safetensors' in conv.norm_origin
    assert conv.image_resize is ImageResize.LEROBOT              # the family's own filter
    # the openpi folder with LeRobot's image filter: only the normalization files differ
    ref_engine, ref_prompts, ref_actions = _run(openpi, tokenizer, stats,
                                                image_resize=ImageResize.LEROBOT)
    assert ref_engine.conventions.family is CheckpointFamily.OPENPI
    assert prompts == ref_prompts          # the same state bins in the prompt
    np.testing.assert_allclose(actions, ref_actions, rtol=1e-6, atol=1e-6)
    # LeRobot's formulas by hand (processor/normalize_processor.py), float64
    obs = next(_frames(stats))
    s = stats['observation.state']
    a = {k: v.astype(np.float64) for k, v in stats['action'].items()}
    if mode == 'QUANTILES':
        want = 2 * (obs.state - s['q01']) / (s['q99'].astype(np.float64) - s['q01']) - 1
        back = (0.5 + 1) * (a['q99'] - a['q01']) / 2 + a['q01']
    else:
        want = (obs.state - s['mean']) / (s['std'].astype(np.float64) + 1e-8)
        back = 0.5 * a['std'] + a['mean']
    np.testing.assert_allclose(engine.normalizer.normalize_state(obs.state), want, rtol=1e-12)
    chunk = np.full((CFG.action_horizon, CFG.action_dim), 0.5)
    np.testing.assert_allclose(engine.normalizer.actions_to_robot(chunk)[0], back, rtol=1e-12)


def _conventions(folder, preset='tiny', **config):
    return resolve_conventions(EngineConfig(preset=preset, checkpoint=str(folder), **config),
                               get_preset(preset))


def test_files_without_pipeline_json_and_with_one_file_only(tmp_path):
    stats = dataset_stats(np.random.default_rng(2))
    write_lerobot_processors(tmp_path / 'a', stats, 'MIN_MAX', pipeline_json=False, eps=1e-5)
    conv = _conventions(tmp_path / 'a')
    # no processor JSON: the modes come from config.json, eps is LeRobot's default
    assert conv.state.mode is NormMode.MIN_MAX and conv.actions.eps == 1e-8
    np.testing.assert_array_equal(conv.state.stats.minimum, stats['observation.state']['min'])
    write_lerobot_processors(tmp_path / 'b', stats, 'MEAN_STD', postprocessor=False, eps=1e-5)
    conv = _conventions(tmp_path / 'b')
    assert conv.actions.mode is NormMode.MEAN_STD and conv.actions.eps == 1e-5
    assert conv.norm_origin.endswith('from policy_preprocessor_step_3_normalizer_processor'
                                     '.safetensors')


def test_the_processor_norm_map_wins_over_config_json_with_a_warning(tmp_path, caplog):
    write_lerobot_processors(tmp_path, dataset_stats(np.random.default_rng(3)), 'MEAN_STD',
                             config_mode='QUANTILES')
    with caplog.at_level(logging.WARNING):
        conv = _conventions(tmp_path)
    assert conv.state.mode is NormMode.MEAN_STD
    assert "normalization_mapping {'STATE': 'QUANTILES', 'ACTION': 'QUANTILES'} differs from " \
        "the processor norm_map {'STATE': 'MEAN_STD', 'ACTION': 'MEAN_STD'}" in caplog.text


def test_lerobot_prompt_and_explicit_settings(tmp_path, caplog):
    stats = dataset_stats(np.random.default_rng(4))
    write_lerobot_processors(tmp_path, stats)
    # openpi's pi05_libero has no state in the prompt; LeRobot's pi05 always has it
    assert preset_robot('pi05_libero').prompt_format is PromptFormat.PI0
    with caplog.at_level(logging.WARNING):
        assert _conventions(tmp_path, 'pi05_libero').prompt_format is PromptFormat.PI05_STATE
    assert f'{tmp_path}: trained with LeRobot chunk_size 4, preset pi05_libero denoises 10 ' \
        'actions per chunk' in caplog.text
    assert f'{tmp_path}: LeRobot tokenizer max length 64, preset pi05_libero has 200' in \
        caplog.text
    conv = _conventions(tmp_path, 'pi05_libero', prompt_format=PromptFormat.PI0,
                        state_prompt_pad=32, quantile_eps=1e-6)
    assert conv.prompt_format is PromptFormat.PI0 and conv.state_prompt_pad == 32
    assert conv.state.quantile_eps == conv.actions.quantile_eps == 1e-6
    assert 'quantile_eps 1e-06 set' in conv.norm_origin
    write_lerobot_processors(tmp_path, stats, include_state=False)
    assert _conventions(tmp_path).prompt_format is PromptFormat.PI05_NO_STATE
    assert _conventions(tmp_path).image_resize is ImageResize.LEROBOT
    assert _conventions(tmp_path, image_resize='openpi').image_resize is ImageResize.OPENPI


def test_the_image_filter_changes_the_actions_of_a_lerobot_checkpoint(weights, tokenizer,
                                                                      tmp_path):
    """Use the resize LeRobot's checkpoints were trained with, not Pillow's."""
    stats = dataset_stats(np.random.default_rng(1))
    save_checkpoint(weights, tmp_path, layout=CheckpointLayout.LEROBOT)
    write_lerobot_processors(tmp_path, stats)
    own = _run(tmp_path, tokenizer, stats)
    pil = _run(tmp_path, tokenizer, stats, image_resize=ImageResize.OPENPI)
    assert 'lerobot image resize' in own[0].conventions.describe()
    assert np.abs(own[2] - pil[2]).max() > 1e-5              # the filter reaches the actions


def test_norm_stats_parameter_overrides_the_lerobot_files(tmp_path):
    stats = dataset_stats(np.random.default_rng(5))
    write_lerobot_processors(tmp_path / 'ckpt', stats, 'MEAN_STD')
    file = tmp_path / 'stats.json'
    file.write_text(json.dumps(equivalent_openpi_stats(stats, 'QUANTILES')))
    conv = _conventions(tmp_path / 'ckpt', norm_stats=str(file))
    assert conv.state.mode is NormMode.QUANTILES and conv.state.quantile_eps == 1e-6
    assert conv.norm_origin == f'openpi quantile norm stats from norm_stats {file}'
    assert conv.family is CheckpointFamily.LEROBOT   # the prompt stays LeRobot's


def test_a_checkpoint_file_path_finds_the_stats_of_its_folder(weights, tmp_path):
    path = save_checkpoint(weights, tmp_path)
    (tmp_path / 'assets/tiny').mkdir(parents=True)
    stats = dataset_stats(np.random.default_rng(6))
    (tmp_path / 'assets/tiny/norm_stats.json').write_text(
        json.dumps(equivalent_openpi_stats(stats, 'QUANTILES')))
    conv = _conventions(path)
    assert conv.family is CheckpointFamily.OPENPI and conv.prompt_format is PromptFormat.PI05_STATE
    assert conv.norm_origin.endswith('assets/tiny/norm_stats.json')


def test_missing_norm_stats_name_every_place_and_the_three_ways_out(weights, tmp_path):
    save_checkpoint(weights, tmp_path)
    (tmp_path / 'assets/droid').mkdir(parents=True)
    stats = dataset_stats(np.random.default_rng(7))
    (tmp_path / 'assets/droid/norm_stats.json').write_text(
        json.dumps(equivalent_openpi_stats(stats, 'QUANTILES')))
    with pytest.raises(NormStatsNotFound) as info:
        _conventions(tmp_path)
    assert str(info.value) == '\n'.join([
        f"norm stats not found for checkpoint {tmp_path} (preset 'tiny', asset id 'tiny'); "
        'looked for:',
        f'  - openpi: {tmp_path}/assets/tiny/norm_stats.json (asset ids with norm stats '
        'there: droid: another preset?)',
        f'  - LeRobot normalizer: {tmp_path}/policy_preprocessor.json or '
        f'{tmp_path}/*_step_*_normalizer_processor.safetensors',
        f'  - LeRobot unnormalizer: {tmp_path}/policy_postprocessor.json or '
        f'{tmp_path}/*_step_*_unnormalizer_processor.safetensors',
        'Three ways out:',
        '  1. openpi checkpoint: copy its assets/ folder next to model.safetensors (assets/tiny/'
        "norm_stats.json; oxygen_convert does this for an openpi JAX checkpoint; openpi's own "
        "converter copies the parent folder's assets/, Physical-Intelligence/openpi#638)",
        '  2. LeRobot checkpoint: download the whole hub folder (policy_preprocessor*.json/'
        '.safetensors and policy_postprocessor* next to model.safetensors)',
        '  3. name a norm_stats.json: norm_stats:=/path/to/norm_stats.json'])
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.parametrize('damage,message', [
    (lambda d: d['observation.state'].pop('q01'),
     r'policy_preprocessor_step_3_normalizer_processor.safetensors: observation.state: '
     r"QUANTILES normalization needs \['q01', 'q99'\], the stats lack \['q01'\]"),
    (lambda d: d.pop('action'),
     r'policy_postprocessor_step_0_unnormalizer_processor.safetensors: '
     r"no 'action' statistics "
     r'\(the QUANTILES normalization of action needs them\)'),
])
def test_lerobot_stats_that_do_not_fit_their_mode(tmp_path, damage, message):
    stats = dataset_stats(np.random.default_rng(8))
    damage(stats)
    write_lerobot_processors(tmp_path, stats)
    with pytest.raises(ValueError, match=message):
        _conventions(tmp_path)


def test_unknown_mode_and_ambiguous_files(tmp_path):
    stats = dataset_stats(np.random.default_rng(10))
    write_lerobot_processors(tmp_path / 'a', stats, 'PERCENTILES')
    with pytest.raises(ValueError, match="unknown normalization mode .*'PERCENTILES'"):
        _conventions(tmp_path / 'a')
    write_lerobot_processors(tmp_path / 'b', stats, pipeline_json=False)
    (tmp_path / 'b/policy_preprocessor_step_3_normalizer_processor.safetensors').rename(
        tmp_path / 'b/policy_preprocessor_step_2_normalizer_processor.safetensors')
    write_lerobot_processors(tmp_path / 'b', stats, pipeline_json=False)
    with pytest.raises(ValueError, match='several normalizer_processor files and no '
                                         'policy_preprocessor.json naming one'):
        _conventions(tmp_path / 'b')
