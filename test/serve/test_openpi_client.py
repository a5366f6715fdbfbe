"""
openpi's own client from PyPI (``openpi-client``, unmodified) drives oxygen_serve.

For the LIBERO, DROID and ALOHA layouts: the metadata on connect, ``/healthz``, and every
reply's actions equal to what the engine gives for the same observation and noise (fp32, the
same random weights, the frames in the same order), and a question asked over the wire
answered in ``language_updates`` with the engine's own text and tokens.
"""

import urllib.request

import numpy as np
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.transforms.prompt import TextTask
import pytest
from serve_helpers import (
    engine_for, engine_observation, openpi_client, openpi_observation, PRESETS, running)

QUESTION = 'what is on the table?'


@pytest.mark.parametrize('layout', list(Layout))
def test_openpi_client_gets_the_engines_actions_and_answer(layout, tokenizer):
    reference = engine_for(layout, tokenizer)
    with running(engine_for(layout, tokenizer), layout) as srv, \
            openpi_client(srv.port) as client:
        meta = client.get_server_metadata()
        cfg = reference.model_cfg
        assert (meta['server'], meta['preset'], meta['layout']) == \
            ('oxygen_serve', PRESETS[layout], layout.value)
        assert (meta['action_horizon'], meta['action_dim']) == \
            (cfg.action_horizon, reference.robot.robot_action_dim)
        assert meta['random_weights'] is True and meta['language']['tokens_per_frame'] == 5
        assert meta['limits']['max_connections'] == 4
        assert set(meta['observation_keys']) >= set(openpi_observation(layout, 0)) - {'images'}

        ref_id = reference.submit_text(TextTask.ANSWER, question=QUESTION)
        updates, ref_texts, stamps = [], [], []
        for frame in range(4):
            obs = openpi_observation(layout, frame)
            if frame == 0:
                obs['language_requests'] = [{'task': 'answer', 'question': QUESTION,
                                             'request_id': 'q1'}]
            reply = client.infer(obs)
            want = reference.step(engine_observation(layout, obs))
            assert reply['actions'].dtype == np.float32
            assert reply['actions'].shape == (cfg.action_horizon,
                                              reference.robot.robot_action_dim)
            np.testing.assert_array_equal(reply['actions'], want.action.actions)
            assert set(reply['policy_timing']) >= {'infer_ms', 'action_ms', 'queue_ms'}
            assert ('prev_total_ms' in reply['server_timing']) == (frame > 0)
            updates += reply['language_updates']
            ref_texts += [t for t in want.finished if t.req_id == ref_id]
            stamps.append(want.action.stamp_ns)

        answer = ref_texts[0]
        assert [u['request_id'] for u in updates] == ['q1'] * len(updates)
        assert [u['finished'] for u in updates] == [False] * (len(updates) - 1) + [True]
        assert updates[-1]['text'] == answer.text
        assert updates[-1]['finish_reason'] == answer.finish_reason.value
        assert updates[-1]['error'] is None
        assert sum((u['tokens'] for u in updates), []) == list(answer.token_ids)
        assert len(updates) == -(-len(answer.token_ids) // 5)   # k tokens per served frame

        with urllib.request.urlopen(f'http://localhost:{srv.port}/healthz', timeout=10) as r:
            assert (r.status, r.read()) == (200, b'OK\n')


def test_float_channels_first_images_are_read_as_openpi_parses_them(tokenizer):
    """LeRobot-style float [3, H, W] images in [0, 1]: openpi's ``(255 * x).astype(uint8)``."""
    layout = Layout.LIBERO
    reference = engine_for(layout, tokenizer)
    obs = openpi_observation(layout, 7)
    rng = np.random.default_rng(8)
    obs['observation/wrist_image'] = rng.uniform(0, 1, (3, 180, 240)).astype(np.float32)
    want_obs = engine_observation(layout, obs)
    wrist = (255 * obs['observation/wrist_image']).astype(np.uint8).transpose(1, 2, 0)
    want_obs.images['left_wrist_0_rgb'] = np.ascontiguousarray(wrist)
    with running(engine_for(layout, tokenizer), layout) as srv, openpi_client(srv.port) as c:
        reply = c.infer(obs)
    np.testing.assert_array_equal(reply['actions'], reference.step(want_obs).action.actions)
