"""
The ``compile_steps`` parameter: compiled decode off alone, the other steps still compiled.

OxyGen's own Jetson Thor runs keep the one-token text decode eager and compile the rest
(docs/gpu.md#compiled-decode-off-alone). The node here runs the fast path on the CPU with
``aot_eager`` (Dynamo's full-graph capture without code generation, as the fast-path tests
do), decode and decode_steps left out, against a node that runs everything eagerly.
"""

import logging
import time

import numpy as np
from oxygen_ros.backends.config import Step
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.engine.config import CompileMode
from oxygen_ros.resources import config_file
from oxygen_ros.ros.node import OxygenNode
from oxygen_ros.ros.node_config import build_configs
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.ros.params import SPECS
import pytest
from rclpy.lifecycle import TransitionCallbackReturn
from ros_inputs import image, joint_state

STABLE = ['vision', 'prefill', 'text_prefill', 'suffix', 'denoise', 'seed', 'guided_denoise']
"""Every step but decode and decode_steps (OxyGen's stable mode)."""


def test_default_is_every_step_and_names_map_to_the_backend():
    assert SPECS['compile_steps'].default == ['all'] and SPECS['compile_steps'].read_only
    engine, _ = build_configs({'preset': 'tiny'})
    assert engine.backend.compile_steps is None
    engine, _ = build_configs({'preset': 'tiny', 'compile_steps': STABLE})
    assert engine.backend.compile_steps == frozenset(Step(s) for s in STABLE)
    assert Step.DECODE not in engine.backend.compile_steps


@pytest.mark.parametrize('steps, reason', [
    (['decode_steps'], "'decode_steps' replays the compiled decode step k times in one graph: "
                       "name 'decode' too, or neither"),
    (['all', 'decode'], "'all' stands alone"),
    (['vison'], r"unknown step\(s\) \['vison'\]; name some of vision, prefill"),
    ([], 'names no step'),
])
def test_a_bad_list_is_refused_by_name(steps, reason):
    with pytest.raises(ParameterError, match=f'compile_steps.*{reason}'):
        build_configs({'preset': 'tiny', 'compile_steps': steps})


def _node(context, *params):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false',
        '-p', 'memory_period:=0.0', *(a for p in params for a in ('-p', p))])
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    return node


def _run(node, frames):
    """Drive ``frames`` cycles by hand, one question at the first; return chunks and answers."""
    chunks, answers = [], []
    node._robots[0].pubs['action'].publish = chunks.append
    node._robots[0].pubs['answer'].publish = answers.append
    node._robots[0].cache.set_instruction('pick up the cup')
    for f in range(frames):
        stamp = node._now_ns()
        node._robots[0].cache.put_image('base_0_rgb', image(stamp, seed=2 * f)[1], stamp)
        node._robots[0].cache.put_image('left_wrist_0_rgb', image(stamp, seed=2 * f + 1)[1], stamp)
        node._robots[0].cache.put_joint_state(joint_state(stamp), stamp)
        if f == 0:
            node._robots[0].texts.ask_topic('what is on the table?', time.monotonic())
        node._control_tick()
        node._publish_texts()
    # later ticks may act on the last frame
    node._robots[0].pubs['action'].publish = lambda msg: None
    for _ in range(40):                       # the answer decodes to its end without frames
        if answers:
            break
        node._control_tick()
        node._publish_texts()
    return [trajectory_from_msg(c).positions for c in chunks], [a.data for a in answers]


def test_a_node_with_only_decode_eager_equals_the_eager_node(rclpy_context, monkeypatch,
                                                             caplog):
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    eager = _node(rclpy_context)
    with caplog.at_level(logging.INFO, logger='oxygen_ros.backends.fast_path.model'):
        stable = _node(rclpy_context, f'compile_mode:={CompileMode.DEFAULT.value}',
                       f'compile_steps:=[{",".join(STABLE)}]')
    try:
        engine = stable._engine
        compiled = engine.backend.fast_path
        assert engine.fallbacks == {}
        assert set(compiled.graph_counts()) == {'vision', 'prefill', 'suffix', 'denoise', 'seed'}
        assert Step.DECODE not in compiled.steps() and Step.DECODE_STEPS not in compiled.steps()
        assert type(eager._engine.backend).__name__ == 'TorchBackend'
        assert any('compile_steps: vision, prefill, suffix, denoise, seed compiled' in
                   r.getMessage() for r in caplog.records)
        want, got = _run(eager, 3), _run(stable, 3)
        assert len(got[0]) == len(want[0]) == 3
        for a, b in zip(want[0], got[0]):
            np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
        assert got[1] == want[1] and len(got[1]) == 1 and got[1][0]
        graphs = compiled._graphs
        assert sum(g.num_calls for g in graphs[Step.DENOISE].values()) >= 3
        assert sum(g.num_calls for g in graphs[Step.SUFFIX].values()) >= 1
    finally:
        stable.destroy_node()
        eager.destroy_node()
