"""The quantization parameter: FP8 weights held to their check at configure, on /diagnostics."""

import signal

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.engine.config import Quantization
from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import Level, status_values
from oxygen_ros.ros.node_config import build_configs
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.ros.params import SPECS
import pytest

NODE = 'oxygen_ros.ros.node'
START_TIMEOUT_S = 60.0


def test_the_parameter_maps_to_the_engine_and_bad_values_are_refused_by_name():
    assert SPECS['quantization'].default == 'none' and SPECS['quantization'].read_only
    engine, _ = build_configs({'preset': 'tiny', 'quantization': 'fp8'})
    assert engine.quantization is Quantization.FP8
    with pytest.raises(ParameterError, match="quantization must be one of 'none', 'fp8'"):
        build_configs({'preset': 'tiny', 'quantization': 'fp4'})
    with pytest.raises(ParameterError, match="on CUDA needs dtype 'bfloat16'"):
        build_configs({'preset': 'tiny', 'quantization': 'fp8', 'device': 'cuda'})


@pytest.mark.ros
def test_fp8_refused_by_the_action_check_is_a_named_fallback_on_diagnostics(ros_node,
                                                                            ros_processes):
    """Random tiny weights fail the FP8 action check: the node runs float32 weights, says so."""
    proc = ros_processes.start(NODE, '--ros-args', '--params-file', str(config_file('test')),
                               '-p', 'quantization:=fp8')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 10)

    def configured():
        return any('fallback: quantization' in status_values(d.status[0])
                   for d in diagnostics.msgs)

    assert ros_node.spin_until(configured, START_TIMEOUT_S), proc.output()
    status = next(d.status[0] for d in diagnostics.msgs
                  if 'fallback: quantization' in status_values(d.status[0]))
    values = status_values(status)
    assert status.level >= Level.WARN.octet             # WARN, or ERROR: no camera images
    assert values['quantization'] == 'none'
    assert values['fallback: quantization'].startswith(
        'FP8 weights (dequant kernel) refused by the action check: fp8 action error vs float32')
    assert 'refused by the action check' in proc.output()
    assert proc.stop(signal.SIGINT) == 0, proc.output()
