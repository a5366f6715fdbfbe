"""
The node's control cycle driven by hand, and the executor (text requests: test_text_requests).

Nodes get their own rclpy context each and are never spun by an executor here, except in the
executor test.
"""

import math
import threading
import time

import numpy as np
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.resources import config_file
from oxygen_ros.ros.control_cycle import CYCLE_SLACK
from oxygen_ros.ros.diagnostics import Level, status_values
from oxygen_ros.ros.executor import NodeExecutor
from oxygen_ros.ros.node import OxygenNode
from oxygen_ros.transforms.prompt import TextTask
import pytest
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from ros_inputs import image, joint_state, JOINTS


@pytest.fixture
def context(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    yield ctx
    ctx.try_shutdown()


# ------------------------------------------------------- the node's cycle, driven by hand

@pytest.fixture
def tiny_node(context):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false'])
    yield node
    node.destroy_node()


def feed(node, stamp_ns, positions=None):
    node._robots[0].cache.put_image('base_0_rgb', image(stamp_ns, seed=1)[1], stamp_ns)
    node._robots[0].cache.put_image('left_wrist_0_rgb', image(stamp_ns, seed=2)[1], stamp_ns)
    node._robots[0].cache.put_joint_state(joint_state(stamp_ns, positions), stamp_ns)


def test_node_cycle_by_hand(tiny_node):
    node = tiny_node
    published = []
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    node._robots[0].pubs['action'].publish = published.append
    texts = []
    node._robots[0].pubs['answer'].publish = texts.append
    node._robots[0].cache.set_instruction('pick up the cup')
    feed(node, node._now_ns())
    node._robots[0].texts.ask_topic('what is on the table?', time.monotonic())
    node._robots[0].texts.ask_topic('   ', time.monotonic())  # refused on arrival: answered
    node._control_tick()
    [chunk] = published
    actions = trajectory_from_msg(chunk).positions
    assert actions.shape == (4, 7) and np.isfinite(actions).all()
    assert list(chunk.joint_names) == JOINTS[:7] and chunk.header.frame_id == 'base_link'
    assert [p.time_from_start.nanosec for p in chunk.points] == [0, 50_000_000, 100_000_000,
                                                                 150_000_000]
    assert list(node._robots[0].texts.live.values()) == [TextTask.ANSWER, TextTask.MEMORY]
    feed(node, node._now_ns(), positions=[math.nan] * 8)
    node._control_tick()  # refused: no chunk, the answer keeps decoding
    assert len(published) == 1
    for _ in range(20):
        node._control_tick()
        node._publish_texts()
    assert [t.data for t in texts][0] == 'no answer: empty question'
    assert len(texts) == 2 and not texts[1].data.startswith('no answer')  # decoded under NaNs
    values = status_values(node._diag.status(1e9, 10.0, 0.5))
    assert values['rejected: bad joints'] == '21' and values['action chunks published'] == '1'
    assert node.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
    assert node.finished.is_set() and node._engine is None


class _NextCall:
    """Stands in for the control timer: its next call is ``ns`` away (None: cancelled)."""

    def __init__(self, ns):
        self.ns = ns

    def time_until_next_call(self):
        return self.ns


def test_the_cycle_deadline_is_the_next_tick_less_the_slack(tiny_node):
    node = tiny_node
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    node._robots[0].cache.set_instruction('pick up the cup')
    deadlines = []
    begin = node._engine.begin

    def capture(obs, **kwargs):
        deadlines.append(kwargs['deadline'])
        return begin(obs, **kwargs)

    node._engine.begin = capture
    timer, period = node._timer, 0.1  # config/test.yaml: 10 Hz
    slack = CYCLE_SLACK * period
    try:
        # the next tick 60 ms away; overdue by 5 ms (started late: no text time left); not
        # scheduled (cancelled: a period); 5 s away (a sim clock): never beyond a period
        for next_ns, left in ((60_000_000, 0.06), (-5_000_000, 0.0), (None, period),
                              (5_000_000_000, period)):
            node._timer = _NextCall(next_ns)
            feed(node, node._now_ns())
            before = time.monotonic()
            node._control_tick()
            after = time.monotonic()
            assert before + left - slack <= deadlines[-1] <= after + left - slack, next_ns
    finally:
        node._timer = timer
    assert len(deadlines) == 4


def test_velocity_chunks_start_at_the_observed_joints_and_are_clipped(context):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false',
        '-p', 'action_space:=joint_velocity',
        '-p', 'velocity_limits:=[0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]'])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        published = []
        node._robots[0].pubs['action'].publish = published.append
        node._robots[0].cache.set_instruction('pick up the cup')
        joints = [0.5, -0.4, 0.3, -0.2, 0.1, 0.0, -0.1, 0.04]
        feed(node, node._now_ns(), positions=joints)
        node._control_tick()
        [chunk] = published
        positions = trajectory_from_msg(chunk).positions
        velocities = trajectory_from_msg(chunk).velocities
        np.testing.assert_allclose(positions[0], joints[:7])  # point 0: the observed joints
        np.testing.assert_allclose(np.diff(positions, axis=0), velocities[:-1] * 0.05)
        assert np.abs(velocities).max() <= 0.01 + 1e-12  # random weights: well above 0.01
        values = status_values(node._diag.status(node._now_s(), 10.0, 0.5))
        assert values['action space'] == 'joint_velocity'
        assert int(values['limit clips: velocity values']) > 0
        assert values['limit clips: chunks'] == '1'
    finally:
        node.destroy_node()


def test_rtc_guides_every_chunk_after_the_first_and_measures_the_delay_on_guided_ones(context):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false',
        '-p', 'chunk_smoothing:=rtc', '-p', 'rtc_jacobian_steps:=4'])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS  # guided warm-up
        assert node._engine.config.backend.rtc and \
            node._engine.config.backend.rtc_jacobian_steps == 4
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        node._robots[0].cache.set_instruction('pick up the cup')
        requests, cycles, begin = [], [], node._engine.begin

        def capture(obs, **kwargs):
            requests.append(kwargs['rtc'])
            cycles.append(begin(obs, **kwargs))
            return cycles[-1]
        node._engine.begin = capture
        for cycle in range(6):
            if cycle != 3:                    # cycle 3 sees the same camera frame again
                feed(node, node._now_ns())
            node._control_tick()
        # the node finished each cycle: finish() hands its output back again
        guided = [c.finish().action.guided for c in cycles]
        assert guided == [False, True, True, True, True, True]
        # not measured until the third guided chunk (two cold-start samples skipped): until
        # then every point the previous chunk covers is frozen
        assert [r.delay_steps for r in requests[:4]] == [None] * 4
        assert all(isinstance(r.delay_steps, int) for r in requests[4:])
        values = status_values(node._diag.status(node._now_s(), 10.0, 0.5))
        assert values['chunk smoothing'] == 'rtc (the Jacobian on 4 of 10 Euler steps)'
        assert int(values['inference delay (action steps)']) >= 1
    finally:
        node.destroy_node()


def test_every_dynamic_parameter_takes_effect_through_the_handler(tiny_node):
    node = tiny_node
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    published = []
    node._robots[0].pubs['action'].publish = published.append
    changes = {'frame_id': 'table', 'action_dt': 0.02, 'control_rate_hz': 4.0,
               'diagnostics_period': 0.25, 'max_waiting_requests': 3,
               'instruction': 'stack the cups', 'max_observation_age': 0.3,
               'subtask_period': 2.0, 'memory_period': 0.0}
    results = node.set_parameters([Parameter(name, value=v) for name, v in changes.items()])
    assert [r.successful for r in results] == [True] * len(changes)
    cfg = node._params.config
    own = {name: v for name, v in changes.items() if name != 'max_waiting_requests'}
    assert {name: getattr(cfg, name) for name in own} == own
    assert node._timer.timer_period_ns == 250_000_000              # retimed at once
    assert node._diag_timer.timer_period_ns == 250_000_000
    assert node._engine.config.scheduler.max_waiting_requests == 3  # where it lives
    assert node._engine.scheduler.config is node._engine.config.scheduler
    begin, deadlines = node._engine.begin, []

    def spy(*args, **kwargs):
        deadlines.append(kwargs['deadline'] - time.monotonic())
        return begin(*args, **kwargs)
    node._engine.begin = spy
    assert node._robots[0].text_out.frame_id == 'table'
    feed(node, node._now_ns())
    assert node._robots[0].cache.assemble(node._now_ns(), 0.5).prompt == 'stack the cups'
    node._control_tick()
    [chunk] = published                                            # the next cycle's chunk
    assert chunk.header.frame_id == 'table'
    assert [p.time_from_start.nanosec for p in chunk.points] == [0, 20_000_000, 40_000_000,
                                                                 60_000_000]
    # the cycle's deadline: the retimed timer's next tick (the engine holds no period)
    assert -CYCLE_SLACK * 0.25 <= deadlines[0] <= (1 - CYCLE_SLACK) * 0.25


def test_engine_failure_deactivates(tiny_node):
    node = tiny_node
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def boom(obs, **kwargs):
        raise RuntimeError('boom')

    node._engine.begin = boom
    node._control_tick()
    status = node._diag.status(0.0, 10.0, 0.5)
    assert (status.level, status.message) == (Level.ERROR.octet,
                                              'engine failed: RuntimeError: boom')
    assert status_values(status)['state'] == 'inactive' and node._timer is None
    assert node.trigger_activate() == TransitionCallbackReturn.FAILURE
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS  # a fresh engine
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS


def test_configure_fails_on_missing_checkpoint(context, tmp_path):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false',
        '-p', f'checkpoint:={tmp_path / "nope"}'])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        status = node._diag.status(0.0, 10.0, 0.5)
        assert status.level == Level.ERROR.octet
        assert status.message.startswith('engine failed: configure failed: cannot build the '
                                         'tiny engine: ')
        assert str(tmp_path / 'nope') in status.message
        assert node._engine is None and not node._robots[0].pubs
    finally:
        node.destroy_node()


# ---------------------------------------------------------------------------------- executor

def test_executor_submits_each_callback_once(context):
    node = Node('executor_test', context=context)
    executor = NodeExecutor(num_threads=3, context=context)
    executor.add_node(node)
    submits, runs = [], []
    pool_submit = executor._executor.submit
    executor._executor.submit = lambda *a: submits.append(1) or pool_submit(*a)
    slow_group, fast_group = MutuallyExclusiveCallbackGroup(), MutuallyExclusiveCallbackGroup()
    node.create_timer(0.1, lambda: time.sleep(0.08), slow_group)
    node.create_timer(0.01, lambda: runs.append(1), fast_group)
    thread = threading.Thread(target=executor.spin)
    thread.start()
    time.sleep(1.0)
    executor.shutdown()
    thread.join()
    node.destroy_node()
    assert len(runs) >= 50  # the fast timer ran beside the slow one
    assert len(submits) <= len(runs) + 15  # not thousands (rclpy#1452)
