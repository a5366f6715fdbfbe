"""The robot layouts: openpi's keys to the engine's observation, and every bad key refused."""

import numpy as np
from oxygen_ros.policies import preset_robot, RobotPolicy
from oxygen_ros.policies.aloha import ALOHA
from oxygen_ros.serve.errors import BadValue, MissingKey, UnknownKey
from oxygen_ros.serve.layouts import (
    check_layout, default_layout, Layout, message_bytes, observation_keys, to_observation)
import pytest
from serve_helpers import engine_observation, openpi_observation, PRESETS

SIDE = 1920


def read(layout, obs, preset=None, **kwargs):
    return to_observation(layout, obs, preset_robot(preset or PRESETS[layout]),
                          max_image_side=SIDE, **kwargs)


def test_presets_name_their_robot_and_fit_it():
    assert default_layout(preset_robot('pi05_libero')) is Layout.LIBERO
    assert default_layout(preset_robot('pi05_droid')) is Layout.DROID
    assert default_layout(preset_robot('pi05_base')) is Layout.ALOHA
    assert default_layout(preset_robot('tiny_aloha')) is Layout.ALOHA
    assert default_layout(preset_robot('tiny')) is None
    for preset in ('pi05_libero', 'pi05_droid', 'pi05_base'):
        check_layout(default_layout(preset_robot(preset)), preset_robot(preset))
    check_layout(Layout.DROID, preset_robot('tiny'))


@pytest.mark.parametrize('layout, preset, match', [
    (Layout.ALOHA, 'pi05_droid', 'sends a state of 14 dims; robot droid takes 8'),
    (Layout.DROID, 'pi05_base', r"also needs \['right_wrist_0_rgb'\]"),
    (Layout.LIBERO, 'pi05_base', r"also needs \['right_wrist_0_rgb'\]"),
])
def test_a_layout_that_cannot_feed_the_preset_is_refused(layout, preset, match):
    with pytest.raises(ValueError, match=match):
        check_layout(layout, preset_robot(preset))


def test_aloha_needs_the_aloha_transforms():
    plain = RobotPolicy('plain', ALOHA.cameras, 14, 14, ALOHA.action_space, ALOHA.gripper_dims,
                        ALOHA.prompt_format)           # ALOHA's data, no transforms
    with pytest.raises(ValueError, match='needs the ALOHA robot policy'):
        check_layout(Layout.ALOHA, plain)


@pytest.mark.parametrize('layout', list(Layout))
def test_each_key_feeds_its_slot_as_openpis_policies_read_it(layout):
    obs = openpi_observation(layout, 1)
    got, want = read(layout, obs), engine_observation(layout, obs)
    assert set(got.images) == set(want.images)
    for slot, img in want.images.items():
        np.testing.assert_array_equal(got.images[slot], img)
        assert got.images[slot].flags.c_contiguous
    np.testing.assert_array_equal(got.state, want.state)
    assert got.state.dtype == np.float64 and got.prompt == want.prompt


def test_droid_gripper_may_be_a_scalar_and_the_prompt_bytes():
    obs = openpi_observation(Layout.DROID, 2)
    obs['observation/gripper_position'] = np.float32(0.25)
    obs['prompt'] = 'wipe the table'.encode()
    got = read(Layout.DROID, obs)
    assert got.state[-1] == np.float32(0.25) and got.prompt == 'wipe the table'


def test_aloha_without_a_prompt_takes_the_default_one():
    obs = openpi_observation(Layout.ALOHA, 3, prompt=None)
    assert read(Layout.ALOHA, obs, default_prompt='fold the towel').prompt == 'fold the towel'
    with pytest.raises(MissingKey, match='prompt is missing .*--default-prompt'):
        read(Layout.ALOHA, obs)


@pytest.mark.parametrize('layout, change, error, match', [
    (Layout.LIBERO, {'observation/wrist_img': np.zeros((4, 4, 3), np.uint8)}, UnknownKey,
     'observation/wrist_img not in a libero observation; its keys: language_requests, '
     'observation/image, observation/state, observation/wrist_image, prompt'),
    (Layout.DROID, {'observation/image': None}, UnknownKey, 'not in a droid observation'),
    (Layout.DROID, {'observation/joint_position': ...}, MissingKey,
     'observation/joint_position is missing'),
    (Layout.LIBERO, {'observation/image': ...}, MissingKey, 'observation/image is missing'),
    (Layout.ALOHA, {'images': {'cam_high': np.zeros((3, 4, 4), np.uint8)}}, MissingKey,
     'images/cam_left_wrist is missing'),
    (Layout.ALOHA, {'images': {'cam_top': np.zeros((3, 4, 4), np.uint8)}}, UnknownKey,
     'cam_top not in images; its keys: cam_high, cam_left_wrist, cam_low, cam_right_wrist'),
    (Layout.ALOHA, {'images': [1]}, BadValue, 'images: expected a map'),
    (Layout.LIBERO, {'observation/state': np.zeros(7)}, BadValue,
     r'observation/state: expected shape \(8,\), got \(7,\)'),
    (Layout.LIBERO, {'observation/state': np.array([np.nan] * 8)}, BadValue,
     'NaN/Inf at dims'),
    (Layout.LIBERO, {'observation/state': 'zeros'}, BadValue, 'expected a numeric array'),
    (Layout.LIBERO, {'observation/state': np.zeros(8, bool)}, BadValue,
     'expected a numeric array, got bool'),
    (Layout.LIBERO, {'observation/image': np.zeros((224, 224, 4), np.uint8)}, BadValue,
     r'expected 3 \(RGB\) channels'),
    (Layout.LIBERO, {'observation/image': np.zeros((224, 224), np.uint8)}, BadValue,
     'expected a 3-dim image'),
    (Layout.LIBERO, {'observation/image': np.zeros((2000, 10, 3), np.uint8)}, BadValue,
     r'10x2000 pixels; each side must be in 1..1920 \(--max-image-side\)'),
    (Layout.LIBERO, {'observation/image': np.zeros((0, 10, 3), np.uint8)}, BadValue,
     'each side must be'),
    (Layout.LIBERO, {'observation/image': np.zeros((4, 4, 3), np.int16)}, BadValue,
     'dtype int16 refused'),
    (Layout.LIBERO, {'observation/image': np.full((4, 4, 3), 2.0, np.float32)}, BadValue,
     r'a float image must be finite and in \[0, 1\]'),
    (Layout.ALOHA, {'images/cam_high': np.zeros((4, 4, 3), np.uint8)}, BadValue,
     r'expected \[3, H, W\] \(channels first\)'),
    (Layout.DROID, {'prompt': 5}, BadValue, 'prompt: expected a string, got int'),
    (Layout.DROID, {'prompt': b'\xff'}, BadValue, 'not UTF-8'),
])
def test_bad_keys_and_values_are_refused_with_their_reason(layout, change, error, match):
    obs = openpi_observation(layout, 4)
    for key, value in change.items():
        target, name = (obs['images'], key.split('/', 1)[1]) if key.startswith('images/') \
            else (obs, key)
        if value is ...:
            del target[name]
        else:
            target[name] = value
    with pytest.raises(error, match=match):
        read(layout, obs)


def test_metadata_lists_each_key_and_the_message_bound_holds_the_images():
    keys = observation_keys(Layout.ALOHA, preset_robot('pi05_base'))
    assert keys['images/cam_low'].endswith('-> unused')
    assert keys['images/cam_high'].endswith('-> base_0_rgb') and keys['state'] == 'float [14]'
    assert message_bytes(Layout.DROID, 224) == 2 * 224 * 224 * 3 + 2**20
