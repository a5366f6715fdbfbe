"""The memory adapter parameter: named on /diagnostics; a bad file is refused at configure."""

import signal

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_adapter import oxygen_arrays, write_oxygen_adapter
from oxygen_ros.config import get_preset
from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import Level, status_values
import pytest

pytestmark = pytest.mark.ros

NODE = 'oxygen_ros.ros.node'
START_TIMEOUT_S = 60.0


def start_node(ros_processes, *params):
    args = ['--ros-args', '--params-file', str(config_file('test'))]
    for p in params:
        args += ['-p', p]
    return ros_processes.start(NODE, *args)


def test_the_loaded_adapter_and_the_text_contexts_are_on_diagnostics(ros_node, ros_processes,
                                                                     tmp_path):
    path = write_oxygen_adapter(tmp_path / 'memory.npz', oxygen_arrays(get_preset('tiny').model))
    proc = start_node(ros_processes, f'memory_adapter:={path}', 'memory_adapter_alpha:=8.0')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 10)

    def configured():
        return any(status_values(d.status[0]).get('memory adapter', 'none') != 'none'
                   for d in diagnostics.msgs)

    assert ros_node.spin_until(configured, START_TIMEOUT_S), proc.output()
    values = status_values(diagnostics.msgs[-1].status[0])
    assert values['memory adapter'] == f'{path} (rank 4, alpha 8)'
    assert values['text contexts'] == ('subtask: own_prompt, answer: action_prefix, '
                                       'memory: action_prefix')
    assert f'memory adapter {path} (rank 4, alpha 8)' in proc.output()
    assert proc.stop(signal.SIGINT) == 0, proc.output()


def test_an_adapter_of_another_model_fails_configure(ros_node, ros_processes, tmp_path):
    path = write_oxygen_adapter(tmp_path / 'small.npz', oxygen_arrays(get_preset('small').model))
    proc = start_node(ros_processes, f'memory_adapter:={path}')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 10)

    def failed():
        return any(d.status[0].message.startswith('engine failed: configure failed')
                   for d in diagnostics.msgs)

    assert ros_node.spin_until(failed, START_TIMEOUT_S), proc.output()
    status = diagnostics.msgs[-1].status[0]
    assert status.level == Level.ERROR.octet
    assert 'AdapterFormatError' in status.message and 'expected' in status.message
    assert proc.stop(signal.SIGINT) == 0, proc.output()
