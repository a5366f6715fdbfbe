"""
``--max-robots``: every connection a robot of one engine, the frames queued together in one cycle.

Two of openpi's own clients over real sockets: each connection's chunks equal an engine
serving that robot alone (its noise is its own: its connection id, its own frame count), its
question is answered in its own updates from its own frames, and frames queued while a cycle
runs go into the next cycle together.
"""

from concurrent.futures import ThreadPoolExecutor
import threading

import numpy as np
from oxygen_ros.engine import Engine, EngineConfig, TextTask
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.serve.robot_driver import RobotsDriver
import pytest
from serve_helpers import (
    engine_observation, model_for, openpi_client, openpi_observation, PRESETS, running, SEED)

LAYOUT = Layout.LIBERO
FRAMES = 4


def engine(tokenizer, robots=('',)):
    cfg = EngineConfig.create(preset=PRESETS[LAYOUT], seed=SEED, max_robots=2,
                              tokens_per_cycle=5)
    return Engine(cfg, model=model_for(cfg), tokenizer=tokenizer, robots=robots)


def limits():
    return ServeLimits(max_message_bytes=4 * 2**20, max_connections=2)


def drive(client, seed, question, start):
    """Send FRAMES frames (a question with the first) once ``start`` is set; return replies."""
    replies = []
    for frame in range(FRAMES):
        obs = openpi_observation(LAYOUT, seed + frame)
        if frame == 0:
            obs['language_requests'] = [{'task': 'answer', 'question': question,
                                         'request_id': 'q', 'max_tokens': 8}]
        start.wait(30)
        replies.append(client.infer(obs))
    return replies


def test_each_connection_is_a_robot_served_as_alone(tokenizer):
    server_engine = engine(tokenizer)
    hold = threading.Event()
    with running(server_engine, LAYOUT, limits()) as srv, \
            openpi_client(srv.port) as first, openpi_client(srv.port) as second:
        driver = srv.server.driver
        assert isinstance(driver, RobotsDriver) and server_engine.robots == ('c1', 'c2')
        start = threading.Event()
        driver.executor.submit(hold.wait, 30)      # the driver busy: both first frames queue
        with ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(drive, first, 100, 'where is the cup?', start),
                    pool.submit(drive, second, 200, 'what is red?', start)]
            start.set()
            threading.Timer(1.0, hold.set).start()
            replies = [run.result(120) for run in runs]
    assert replies[0][0]['policy_timing']['robots'] == 2     # one cycle, both robots
    for robot, seed, question, got in (('c1', 100, 'where is the cup?', replies[0]),
                                       ('c2', 200, 'what is red?', replies[1])):
        alone = engine(tokenizer, robots=(robot,))
        ask = alone.submit_text(TextTask.ANSWER, question=question, max_tokens=8, robot=robot)
        answers = []
        for frame, reply in enumerate(got):
            want = alone.step({robot: engine_observation(LAYOUT, openpi_observation(
                LAYOUT, seed + frame))})
            np.testing.assert_allclose(reply['actions'], want.actions[0].actions, atol=1e-5,
                                       rtol=0)
            answers += [t for t in want.finished if t.req_id == ask]
        updates = sum((r['language_updates'] for r in got), [])
        assert [u['request_id'] for u in updates] == ['q'] * len(updates)
        assert updates[-1]['finished'] and updates[-1]['text'] == answers[0].text
        assert sum((u['tokens'] for u in updates), []) == list(answers[0].token_ids)
    assert not np.allclose(replies[0][0]['actions'], replies[1][0]['actions'])


def test_a_closed_connection_takes_its_robot_with_it(tokenizer):
    server_engine = engine(tokenizer)
    with running(server_engine, LAYOUT, limits()) as srv:
        with openpi_client(srv.port) as client:
            obs = openpi_observation(LAYOUT, 1)
            obs['language_requests'] = [{'task': 'answer', 'question': 'why?',
                                         'request_id': 'q', 'max_tokens': 8}]
            client.infer(obs)
            assert server_engine.robots == ('c1',) and server_engine.num_running == 1
        for _ in range(100):
            if not server_engine.robots:
                break
            threading.Event().wait(0.1)
        assert server_engine.robots == () and server_engine.num_running == 0


def test_more_connections_than_robots_is_refused(tokenizer):
    with pytest.raises(ValueError, match='--max-connections 4 is more than --max-robots 2'):
        with running(engine(tokenizer), LAYOUT, ServeLimits(max_message_bytes=4 * 2**20)):
            pass
