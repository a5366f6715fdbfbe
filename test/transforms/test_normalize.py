"""Norm stats files and quantile normalization (transforms/norm_stats.py, normalize.py)."""

import json

import numpy as np

from oxygen_ros.config import get_preset
from oxygen_ros.policies import TEST_ARM
from oxygen_ros.transforms.norm_stats import (
    identity_norm_stats, load_norm_stats, NormStats, save_norm_stats)
from oxygen_ros.transforms.normalize import (
    normalize_quantile, Normalizer, NormMode, pad_to, QuantityNorm, unnormalize_quantile)
import pytest


def _stats(q01, q99):
    q01, q99 = np.asarray(q01, float), np.asarray(q99, float)
    return NormStats(mean=(q01 + q99) / 2, std=(q99 - q01) / 4, q01=q01, q99=q99)


STATS = _stats([0.0, -2.0, 0.5], [10.0, 2.0, 0.5])


# --- formula ---------------------------------------------------------------------------------

def test_normalize_by_hand():
    x = np.array([[5.0, 0.0, 0.5], [0.0, -2.0, 1.5], [10.0, 2.0, 0.5]])
    expected = np.array([
        [5 / (10 + 1e-6) * 2 - 1, 2 / (4 + 1e-6) * 2 - 1, -1.0],
        [-1.0, -1.0, 1 / 1e-6 * 2 - 1],
        [10 / (10 + 1e-6) * 2 - 1, 4 / (4 + 1e-6) * 2 - 1, -1.0],
    ])
    out = normalize_quantile(x, STATS)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, expected, rtol=1e-14, atol=0)
    assert out[2, 0] == pytest.approx(0.99999980000002, rel=1e-13)


def test_unnormalize_by_hand():
    x = np.array([-1.0, 1.0, 0.0])
    np.testing.assert_allclose(unnormalize_quantile(x, STATS),
                               [0.0, 2.0 + 1e-6, 0.5 + 0.5e-6], rtol=1e-14, atol=1e-15)


def test_round_trip_and_no_clipping():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 15, 3)) * 20  # far outside [q01, q99] too
    back = unnormalize_quantile(normalize_quantile(x, STATS), STATS)
    np.testing.assert_allclose(back, x, rtol=1e-9, atol=1e-9)
    assert np.abs(normalize_quantile(x, STATS)).max() > 1.0


def test_padded_dims_pass_through_and_shorter_inputs_use_the_first_stats():
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for fn in (normalize_quantile, unnormalize_quantile):
        out = fn(x, STATS)
        np.testing.assert_array_equal(out[:, 3:], x[:, 3:])
        np.testing.assert_array_equal(out[:, :3], fn(x[:, :3], STATS))
        np.testing.assert_array_equal(fn(x[:, :2], STATS), out[:, :2])
    assert not np.shares_memory(normalize_quantile(x, STATS), x)


def test_scalar_is_rejected():
    with pytest.raises(ValueError, match='scalar'):
        normalize_quantile(np.float64(1.0), STATS)
    with pytest.raises(ValueError, match='scalar'):
        unnormalize_quantile(1.0, STATS)


def test_identity_stats_are_almost_identity():
    stats = identity_norm_stats(4)
    assert stats.dim == 4
    x = np.linspace(-1, 1, 4)
    np.testing.assert_allclose(normalize_quantile(x, stats), x, atol=1e-6)
    with pytest.raises(ValueError, match='dim must be >= 1, got 0'):
        identity_norm_stats(0)


def test_pad_to():
    x = np.array([[1, 2, 3]], np.float32)
    out = pad_to(x, 5)
    np.testing.assert_array_equal(out, [[1, 2, 3, 0, 0]])
    assert out.dtype == np.float32
    assert pad_to(x, 3) is x
    with pytest.raises(ValueError, match='size 3 down to 2'):
        pad_to(x, 2)
    with pytest.raises(ValueError, match='scalar'):
        pad_to(np.float32(1), 2)


@pytest.mark.parametrize('fields,message', [
    ({'mean': [0, 0], 'std': [1, 1], 'q01': [0], 'q99': [1, 2]}, 'same length'),
    ({'mean': [0], 'std': [1], 'q01': [np.nan], 'q99': [1]}, r'q01 has NaN/Inf at dims \[0\]'),
    ({'mean': [0, 0], 'std': [1, -1], 'q01': [0, 0], 'q99': [1, 1]}, r'std < 0 at dims \[1\]'),
    ({'mean': [0, 0], 'std': [1, 1], 'q01': [0, 3], 'q99': [1, 2]}, r'q99 < q01 at dims \[1\]'),
    ({'mean': ['a'], 'std': [1], 'q01': [0], 'q99': [1]}, 'mean must be a list of numbers'),
    ({'mean': [[0]], 'std': [1], 'q01': [0], 'q99': [1]}, 'non-empty 1-D'),
    ({'mean': [], 'std': [], 'q01': [], 'q99': []}, 'non-empty 1-D'),
])
def test_norm_stats_validation(fields, message):
    with pytest.raises(ValueError, match=message):
        NormStats(**fields)


# --- norm_stats.json -------------------------------------------------------------------------

def test_save_load_round_trip_is_exact(tmp_path):
    stats = {'state': _stats([0.1, -0.3], [0.7, 1.0 / 3.0]), 'actions': STATS}
    file = save_norm_stats(tmp_path / 'ckpt', stats, asset_id='physical-intelligence/libero')
    assert file == tmp_path / 'ckpt/assets/physical-intelligence/libero/norm_stats.json'
    loaded = load_norm_stats(tmp_path / 'ckpt', 'physical-intelligence/libero')
    assert loaded.keys() == stats.keys()
    for key in stats:
        for field in ('mean', 'std', 'q01', 'q99'):
            np.testing.assert_array_equal(getattr(loaded[key], field),
                                          getattr(stats[key], field))
    assert load_norm_stats(file).keys() == stats.keys()  # the file itself
    assert load_norm_stats(file.parent).keys() == stats.keys()  # the asset folder
    assert not list(file.parent.glob('*.tmp'))
    direct = save_norm_stats(tmp_path / 'x.json', stats)
    assert direct == tmp_path / 'x.json' and json.loads(direct.read_text())['norm_stats']


def test_loads_the_openpi_layout(tmp_path):
    # As openpi's pydantic serializer writes it (extra keys inside an entry are ignored).
    text = """{
      "norm_stats": {
        "state": {"mean": [0.5, 1.0], "std": [0.1, 0.2], "q01": [0.0, 0.5], "q99": [1.0, 1.5]},
        "actions": {"mean": [0.0], "std": [1.0], "q01": [-2.0], "q99": [2.0],
                    "num_transitions": 100}
      }
    }"""
    path = tmp_path / 'norm_stats.json'
    path.write_text(text)
    stats = load_norm_stats(path)
    np.testing.assert_array_equal(stats['state'].q99, [1.0, 1.5])
    assert stats['actions'].dim == 1 and stats['state'].q01.dtype == np.float64


def test_missing_file_lists_the_asset_ids(tmp_path):
    stats = {'state': STATS, 'actions': STATS}
    save_norm_stats(tmp_path / 'ckpt', stats, asset_id='droid')
    save_norm_stats(tmp_path / 'ckpt', stats, asset_id='physical-intelligence/libero')
    with pytest.raises(FileNotFoundError,
                       match=r"asset id 'trossen'.*droid, physical-intelligence/libero"):
        load_norm_stats(tmp_path / 'ckpt', 'trossen')
    with pytest.raises(FileNotFoundError, match='no asset id given.*droid'):
        load_norm_stats(tmp_path / 'ckpt')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(FileNotFoundError, match='holds no norm_stats.json'):
        load_norm_stats(tmp_path / 'empty', 'droid')
    with pytest.raises(FileNotFoundError, match='no such file or directory'):
        load_norm_stats(tmp_path / 'nope', 'droid')


GOOD = {'mean': [0.0, 0.0], 'std': [1.0, 1.0], 'q01': [-1.0, -1.0], 'q99': [1.0, 1.0]}


@pytest.mark.parametrize('content,message', [
    ('{"norm_stats": {"state": ', 'malformed JSON'),
    ('[1, 2]', 'at the top level'),
    ('{"stats": {}}', 'at the top level'),
    (json.dumps({'norm_stats': {'state': GOOD}}), r"lacks \['actions'\]; has \['state'\]"),
    (json.dumps({'norm_stats': {'state': GOOD, 'actions': [1, 2]}}),
     r"norm_stats\['actions'\] must be an object"),
    (json.dumps({'norm_stats': {'state': GOOD, 'actions': {**GOOD, 'q01': None}}}),
     r"norm_stats\['actions'\] lacks \['q01'\] \(quantile"),
    (json.dumps({'norm_stats': {'state': {'mean': [0], 'std': [1]}, 'actions': GOOD}}),
     r"lacks \['q01', 'q99'\]"),
    (json.dumps({'norm_stats': {'state': {**GOOD, 'q99': [1.0]}, 'actions': GOOD}}),
     r"norm_stats\['state'\]: mean/std/q01/q99 must have the same length"),
    ('{"norm_stats": {"state": {"mean": [NaN, 0], "std": [1, 1], "q01": [0, 0], '
     '"q99": [1, 1]}, "actions": {"mean": [0], "std": [1], "q01": [0], "q99": [1]}}}',
     r"norm_stats\['state'\]: mean has NaN/Inf at dims \[0\]"),
    (json.dumps({'norm_stats': {'state': GOOD, 'actions': {**GOOD, 'q01': [0.0, 2.0]}}}),
     r"norm_stats\['actions'\]: q99 < q01 at dims \[1\]"),
])
def test_bad_files_are_rejected(tmp_path, content, message):
    path = tmp_path / 'norm_stats.json'
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_norm_stats(path)


def test_save_errors(tmp_path):
    with pytest.raises(ValueError, match='no norm stats'):
        save_norm_stats(tmp_path, {})
    with pytest.raises(ValueError, match=r"norm_stats\['state'\] is dict, not NormStats"):
        save_norm_stats(tmp_path, {'state': GOOD})


# --- Normalizer -------------------------------------------------------------------------------

def _tiny_normalizer():
    cfg = get_preset('tiny').model  # action_dim 32; its robot: state_dim 8, robot_action_dim 7
    state = _stats(np.arange(8.0), np.arange(8.0) + 2)
    actions = _stats(-np.ones(7), np.arange(1.0, 8.0))
    return cfg, Normalizer.from_config(cfg, TEST_ARM, {'state': state, 'actions': actions})


def test_state_to_model_and_prompt_state():
    cfg, norm = _tiny_normalizer()
    state = np.arange(8.0, dtype=np.float32) + 1  # the midpoint of every [q01, q99]
    normalized = norm.normalize_state(state)
    assert normalized.dtype == np.float64 and normalized.shape == (8,)
    np.testing.assert_allclose(normalized, 0.0, atol=1e-6)
    padded = norm.state_to_model(state)
    assert padded.dtype == np.float32 and padded.shape == (cfg.action_dim,)
    np.testing.assert_array_equal(padded[:8], normalized.astype(np.float32))
    assert (padded[8:] == 0).all()


def test_actions_to_robot():
    cfg, norm = _tiny_normalizer()
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, size=(cfg.action_horizon, cfg.action_dim)).astype(np.float32)
    robot = norm.actions_to_robot(actions)
    assert robot.shape == (cfg.action_horizon, 7) and robot.dtype == np.float64
    q01, q99 = -np.ones(7), np.arange(1.0, 8.0)
    expected = (actions[:, :7].astype(np.float64) + 1) / 2 * (q99 - q01 + 1e-6) + q01
    np.testing.assert_allclose(robot, expected, rtol=1e-12)
    batched = norm.actions_to_robot(np.stack([actions, actions]))
    assert batched.shape == (2, cfg.action_horizon, 7)
    np.testing.assert_array_equal(batched[1], robot)


def test_normalizer_errors():
    cfg, norm = _tiny_normalizer()
    with pytest.raises(ValueError, match=r'state must have shape \(8,\), got \(7,\)'):
        norm.normalize_state(np.zeros(7))
    with pytest.raises(ValueError, match=r'state has NaN/Inf at dims \[2\]'):
        norm.state_to_model(np.array([0, 0, np.nan, 0, 0, 0, 0, 0.0]))
    with pytest.raises(ValueError, match=r'actions must have shape \[..., H, 32\], got \(4, 7\)'):
        norm.actions_to_robot(np.zeros((4, 7)))
    with pytest.raises(ValueError, match='1 NaN/Inf'):
        bad = np.zeros((4, 32))
        bad[1, 3] = np.inf
        norm.actions_to_robot(bad)
    with pytest.raises(ValueError, match='state norm stats have 3 dims, the robot state has 8'):
        Normalizer.from_config(cfg, TEST_ARM, {'state': STATS, 'actions': identity_norm_stats(7)})
    with pytest.raises(ValueError, match='action norm stats have 3 dims, the robot takes 7'):
        Normalizer.from_config(cfg, TEST_ARM, {'state': identity_norm_stats(8), 'actions': STATS})
    with pytest.raises(ValueError, match=r"lack \['actions'\]"):
        Normalizer.from_config(cfg, TEST_ARM, {'state': identity_norm_stats(8)})


def test_identity_normalizer():
    cfg = get_preset('tiny').model
    norm = Normalizer.identity(cfg, TEST_ARM)
    actions = np.linspace(-1, 1, cfg.action_horizon * 32).reshape(cfg.action_horizon, 32)
    np.testing.assert_allclose(norm.actions_to_robot(actions), actions[:, :7], atol=1e-6)
    np.testing.assert_allclose(norm.normalize_state(np.full(8, 0.25)), 0.25, atol=1e-6)


# --- LeRobot's modes (processor/normalize_processor.py, _apply_transform) ---------------------

@pytest.mark.parametrize('mode', list(NormMode))
def test_lerobot_formulas_by_hand_and_round_trip(mode):
    rng = np.random.default_rng(3)
    lo, hi = rng.uniform(-2, 0, 4), rng.uniform(0.5, 3, 4)
    lo[2] = hi[2] = 0.25   # a zero range: LeRobot puts eps in its place
    stats = NormStats(mean=(lo + hi) / 2, std=hi - lo, q01=lo, q99=hi, minimum=lo, maximum=hi,
                      q10=lo, q90=hi)
    norm = QuantityNorm(stats, mode, quantile_eps=0.0, eps=1e-8)
    x = rng.normal(size=(5, 6))
    d = np.where(hi - lo == 0, 1e-8, hi - lo)
    want = {NormMode.QUANTILES: 2 * (x[:, :4] - lo) / d - 1,
            NormMode.QUANTILE10: 2 * (x[:, :4] - lo) / d - 1,
            NormMode.MIN_MAX: 2 * (x[:, :4] - lo) / d - 1,
            NormMode.MEAN_STD: (x[:, :4] - (lo + hi) / 2) / (hi - lo + 1e-8),
            NormMode.IDENTITY: x[:, :4]}[mode]
    out = norm.normalize(x)
    np.testing.assert_allclose(out[:, :4], want, rtol=1e-12)
    np.testing.assert_array_equal(out[:, 4:], x[:, 4:])
    inverse = {NormMode.MEAN_STD: x[:, :4] * (hi - lo) + (lo + hi) / 2,
               NormMode.IDENTITY: x[:, :4]}.get(mode, (x[:, :4] + 1) * d / 2 + lo)
    np.testing.assert_allclose(norm.unnormalize(x)[:, :4], inverse, rtol=1e-12)


def test_openpi_quantile_eps_is_added_and_modes_check_their_stats():
    assert QuantityNorm(STATS).quantile_eps == 1e-6
    np.testing.assert_array_equal(QuantityNorm(STATS).normalize(np.ones(3)),
                                  normalize_quantile(np.ones(3), STATS))
    with pytest.raises(ValueError, match=r"MIN_MAX normalization needs \['minimum', "
                                         r"'maximum'\], the stats lack \['minimum', 'maximum'\]"):
        QuantityNorm(STATS, NormMode.MIN_MAX)
    with pytest.raises(ValueError, match='epsilons must be >= 0'):
        QuantityNorm(STATS, quantile_eps=-1.0)
    assert QuantityNorm(None, NormMode.IDENTITY).dim is None
    with pytest.raises(ValueError, match='maximum < minimum at dims'):
        NormStats(minimum=[1.0], maximum=[0.0])
