"""The ``compile_mode`` parameter: the fast path by default on CUDA, eager on the CPU."""

from oxygen_ros.engine.config import CompileMode
from oxygen_ros.ros.node_config import build_configs
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.ros.params import SPECS
import pytest


def test_auto_is_the_default_and_means_the_fast_path_on_cuda_only():
    assert SPECS['compile_mode'].default == 'auto' and SPECS['compile_mode'].read_only
    cuda, _ = build_configs({'preset': 'tiny', 'device': 'cuda'})
    cpu, _ = build_configs({'preset': 'tiny'})
    cuda, cpu = cuda.backend, cpu.backend
    assert cuda.compile_mode is cpu.compile_mode is CompileMode.AUTO
    assert cuda.compile_mode.resolve(cuda.device) is CompileMode.REDUCE_OVERHEAD
    assert cpu.compile_mode.resolve(cpu.device) is CompileMode.NONE
    eager, _ = build_configs({'preset': 'tiny', 'device': 'cuda', 'compile_mode': 'none'})
    assert eager.backend.compile_mode is CompileMode.NONE


def test_a_bad_compile_mode_is_refused_by_name():
    with pytest.raises(ParameterError, match="compile_mode must be one of .*'cuda-graphs'"):
        build_configs({'preset': 'tiny', 'compile_mode': 'fast'})
