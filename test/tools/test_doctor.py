"""
``oxygen_doctor`` on this machine: each check's answer, and the exit status.

This machine is a CPU with the PyPI ROS 2 wheels and no Jetson; a configured node that asks for
what is not here (``device: cuda``) makes the doctor exit 1.

The device facts of a GPU come from the same calls on a GPU (torch, the middleware's
libraries, the files); what only a GPU or a Jetson can show is checked by its pure parts
(``kernel_arch`` on the architecture lists of PyTorch's cu128 and cu130 wheels).
"""

import json
import os
from pathlib import Path
import subprocess
import sys

from oxygen_ros.checkpoint.weights import save_checkpoint
from oxygen_ros.config import get_preset
from oxygen_ros.engine.config import BackendKind, EngineConfig
from oxygen_ros.model.pi05 import build_model
from oxygen_ros.resources import config_file, share_dir
from oxygen_ros.tools import doctor
from oxygen_ros.tools.doctor import jetson, kernel_checks, model_files, ros_checks
from oxygen_ros.tools.doctor import shared_memory as shm
from oxygen_ros.tools.doctor import torch_checks as tch
from oxygen_ros.tools.doctor.findings import exit_status, Finding, Level
from oxygen_ros.transforms.norm_stats import identity_norm_stats, save_norm_stats
import pytest
import torch

CU128 = ['sm_80', 'sm_90', 'sm_100', 'sm_120']
"""torch 2.9.1+cu128's get_arch_list() (OpenRAL/openral#167, measured on a Jetson Thor)."""
CU130 = ['sm_80', 'sm_90', 'sm_100', 'sm_110', 'sm_120']
"""The CUDA 13.0 builds' architectures, Thor's sm_110 among them (pytorch/pytorch#161257)."""


@pytest.mark.parametrize('arch_list, capability, want', [
    (CU128, (11, 0), None),                          # Jetson Thor under cu128: no kernel image
    (CU130, (11, 0), 'sm_110'),
    (CU128, (8, 6), 'sm_80'),                        # SASS runs on a later minor, same major
    (CU128, (12, 1), 'sm_120'),                      # DGX Spark's GB10 under cu128
    (['sm_90a'], (9, 0), 'sm_90a'),
    (['sm_100a'], (10, 3), None),                    # an 'a' cubin runs on its own device only
    (['sm_80', 'compute_90'], (12, 0), 'compute_90'),  # PTX, JIT-compiled for a later GPU
    (['sm_80', 'compute_90'], (8, 9), 'sm_80'),
    ([], (9, 0), None),
])
def test_kernel_arch_matches_what_a_device_can_run(arch_list, capability, want):
    assert tch.kernel_arch(arch_list, capability) == want


def test_python_torch_cuda_and_arch_on_this_cpu():
    assert tch.check_python().level is Level.OK
    assert f'{sys.version_info.major}.{sys.version_info.minor}' in tch.check_python().summary
    found = tch.check_torch('cpu')
    assert (found.level, found.summary) == (
        Level.OK, f'{torch.__version__}: a CPU build (no CUDA kernels); device cpu')
    cuda = tch.check_cuda('cpu')
    assert (cuda.level, cuda.summary) == (
        Level.INFO, 'no CUDA device (AssertionError: Torch not compiled with CUDA enabled)')
    arch = tch.check_arch('cpu')
    assert arch.level is Level.INFO and 'none: a CPU build' in arch.summary


def test_device_cuda_on_this_cpu_is_an_error_with_the_robot_install_as_fix():
    found = tch.check_torch('cuda')
    assert found.level is Level.ERROR and found.summary.endswith('device cuda cannot run')
    assert 'requirements/robot.txt' in found.fix and 'whl/cu130' in found.fix
    assert tch.check_cuda('cuda:0').level is Level.ERROR


def test_triton_against_what_torch_requires():
    found = kernel_checks.check_triton_pin({})
    assert kernel_checks.torch_requires_triton() is None        # the CPU build requires none
    assert (found.level, found.summary) == (Level.INFO, '3.9.0; torch requires none (a CPU build)')
    env = {'TRITON_PTXAS_BLACKWELL_PATH': '/usr/local/cuda/bin/ptxas'}
    assert kernel_checks.check_triton_pin(env).summary.endswith(
        '; TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda/bin/ptxas')


def test_tensorrt_is_absent_here_and_only_the_tensorrt_backend_needs_it():
    torch_backend = kernel_checks.check_tensorrt(EngineConfig(preset='tiny'), jetson=False)
    assert torch_backend.level is Level.INFO
    assert 'backend torch needs none' in torch_backend.summary
    trt = kernel_checks.check_tensorrt(
        EngineConfig.create(preset='tiny', backend=BackendKind.TENSORRT), jetson=False)
    assert trt.level is Level.ERROR and '--system-site-packages' in trt.fix


def test_the_pypi_wheels_have_no_dds_security_plugins(monkeypatch):
    env = {'AMENT_PREFIX_PATH': sys.prefix}
    found = ros_checks.check_dds_security(env)
    lib = Path(sys.prefix) / 'lib' / 'librmw_fastrtps_shared_cpp.so'
    assert found.level is Level.WARN and found.summary.startswith(
        f'rmw_fastrtps_cpp has no DDS security plugins ({lib}, libfastrtps.so')
    assert 'ros-jazzy-ros-base' in found.fix
    secured = ros_checks.check_dds_security({**env, 'ROS_SECURITY_ENABLE': 'true'})
    assert secured.level is Level.ERROR and 'refuses to start' in secured.summary
    cyclone = ros_checks.check_dds_security({**env, 'RMW_IMPLEMENTATION': 'rmw_cyclonedds_cpp'})
    assert cyclone.level is Level.WARN and 'no libdds_security_auth' in cyclone.summary


def test_rclpy_comes_from_the_wheels_here_and_two_ros_2s_are_named(tmp_path):
    here = ros_checks.check_ros({'AMENT_PREFIX_PATH': sys.prefix})
    assert here.level is Level.INFO and here.summary.startswith('rclpy 7.1.6 from the PyPI wheels')
    install = tmp_path / 'opt' / 'ros' / 'jazzy'          # a prefix with an rclpy package
    (install / 'share' / 'rclpy').mkdir(parents=True)
    env = {'ROS_DISTRO': 'jazzy', 'AMENT_PREFIX_PATH': f'{install}{os.pathsep}{sys.prefix}'}
    both = ros_checks.check_ros(env)
    assert both.level is Level.WARN and 'ros-jazzy-rclpy' in both.fix and 'two rclpys' in \
        both.summary
    venv = ros_checks.check_venv(env)                    # this venv: no system site packages
    assert venv.level is Level.WARN and '--system-site-packages' in venv.fix
    assert ros_checks.check_venv({}).level is Level.INFO


def test_shared_memory_against_the_cameras_image_size(tmp_path):
    cams = ['base_0_rgb', 'left_wrist_0_rgb']
    default = shm.check_shared_memory(cams, [], shm.CameraSize(640, 480), {})
    assert default.level is Level.WARN and default.summary.startswith(
        'one 640x480 rgb8 image is 921,600 B, more than 524,288 B')
    assert 'fastdds_large_shm.xml' in default.fix
    large = {'FASTRTPS_DEFAULT_PROFILES_FILE': str(share_dir() / shm.LARGE_SHM_PROFILE)}
    assert shm.shm_limit(large)[0] == 4 * 2**20
    assert shm.check_shared_memory(cams, [], shm.CameraSize(640, 480), large).level is Level.OK
    big = shm.CameraSize.parse('1280x1024:bgra8')
    assert big.nbytes == 5_242_880
    assert shm.check_shared_memory(cams, [], big, large).level is Level.WARN
    assert shm.check_shared_memory(cams, cams, big, {}).level is Level.OK   # all compressed
    segment_only = tmp_path / 'shm.xml'                 # maxMessageSize stays 512 KiB
    segment_only.write_text('<dds><profiles><transport_descriptors><transport_descriptor>'
                            '<transport_id>s</transport_id><type>SHM</type>'
                            '<segment_size>33554432</segment_size></transport_descriptor>'
                            '</transport_descriptors></profiles></dds>')
    assert shm.shm_limit({'FASTDDS_DEFAULT_PROFILES_FILE': str(segment_only)})[0] == 2**19
    with pytest.raises(ValueError, match='WxH or WxH:encoding'):
        shm.CameraSize.parse('640x480:yuv9')


def test_tokenizer_found_and_loadable_or_not(tmp_path):
    found = model_files.check_tokenizer(EngineConfig(preset='tiny'))
    assert found.level is Level.OK and found.summary.endswith(': loads, 257152 pieces')
    missing = model_files.check_tokenizer(EngineConfig(preset='tiny',
                                                       tokenizer=str(tmp_path / 'no.model')))
    assert missing.level is Level.ERROR and 'oxygen_fetch tokenizer' in missing.fix
    junk = tmp_path / 'junk.model'
    junk.write_bytes(b'not a sentencepiece model')
    assert model_files.check_tokenizer(EngineConfig(preset='tiny', tokenizer=str(junk))).level \
        is Level.ERROR


@pytest.fixture(scope='module')
def tiny_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp('ckpt')
    torch.manual_seed(1)
    save_checkpoint(build_model(get_preset('tiny').model), folder)
    return folder


def test_checkpoint_found_fits_and_loads_or_says_why(tiny_checkpoint, tmp_path):
    none = model_files.check_checkpoint(EngineConfig(preset='tiny'))
    assert none.level is Level.WARN and 'RANDOM weights' in none.summary
    missing = model_files.check_checkpoint(EngineConfig(preset='tiny',
                                                        checkpoint=str(tmp_path / 'x')))
    assert (missing.level, missing.summary) == (Level.ERROR,
                                                f'no checkpoint file at {tmp_path / "x"}')
    wrong = model_files.check_checkpoint(EngineConfig(preset='small',
                                                      checkpoint=str(tiny_checkpoint)))
    assert wrong.level is Level.ERROR and "matches preset 'tiny'" in wrong.summary
    stats = model_files.check_checkpoint(EngineConfig(preset='tiny',
                                                      checkpoint=str(tiny_checkpoint)))
    assert stats.level is Level.ERROR and 'fits preset tiny, but' in stats.summary
    save_norm_stats(tiny_checkpoint, {'state': identity_norm_stats(8),
                                      'actions': identity_norm_stats(7)}, asset_id='tiny')
    config = EngineConfig(preset='tiny', checkpoint=str(tiny_checkpoint))
    ok = model_files.check_checkpoint(config)
    assert ok.level is Level.OK and 'openpi layout, fits preset tiny' in ok.summary
    loaded = model_files.check_checkpoint(config, load=True)
    count = sum(p.numel() for p in build_model(get_preset('tiny').model).parameters())
    assert loaded.summary.endswith(f'loaded: {count / 1e9:.2f} G parameters in float32')


NVPMODEL_Q = 'NV Power Mode: MAXN\n0\n'
"""``nvpmodel -q`` prints the mode's name, then its number."""
JETSON_CLOCKS_SHOW = ('SOC family:tegra264  Machine:NVIDIA Jetson AGX Thor Developer Kit\n'
                      'GPU MinFreq=1575000000 MaxFreq=1575000000 CurrentFreq=1575000000\n'
                      'EMC MinFreq=204000000 MaxFreq=4266000000 CurrentFreq=4266000000\n')
"""``jetson_clocks --show``'s lines: one per engine with its MinFreq, MaxFreq, CurrentFreq."""


def test_jetson_power_does_not_apply_here_and_its_tools_output_parses():
    here = jetson.check_jetson_power()
    assert here.level is Level.INFO and here.summary.startswith('not a Jetson')
    assert jetson.jetson_model() is None
    assert jetson.parse_nvpmodel(NVPMODEL_Q) == ('MAXN', 0)
    assert jetson.parse_nvpmodel('NV Power Mode: 40W\n') == ('40W', None)
    assert jetson.parse_gpu_clocks(JETSON_CLOCKS_SHOW) == (1575000000,) * 3
    assert jetson.parse_gpu_clocks('EMC MinFreq=1 MaxFreq=2 CurrentFreq=1') is None


def test_the_report_and_the_exit_status():
    findings = [Finding('a', Level.OK, 'fine'), Finding('b', Level.WARN, 'slow', 'do x')]
    assert exit_status(findings) == 0
    assert exit_status([*findings, Finding('c', Level.ERROR, 'no')]) == 1


def _run(*args):
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.doctor', *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'AMENT_PREFIX_PATH': sys.prefix})
    return proc


def test_a_params_file_on_this_cpu_can_run_and_exits_0():
    proc = _run('--json', '--ros-args', '--params-file', str(config_file('test')))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {f['check']: f for f in json.loads(proc.stdout)}
    assert found['params']['summary'].startswith('preset tiny, device cpu, dtype float32')
    assert not [f for f in found.values() if f['level'] == 'ERROR']


def test_a_preset_asking_for_cuda_exits_1_naming_what_is_missing():
    proc = _run('--preset', 'pi05_droid')                 # device: cuda, dtype: bfloat16
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].endswith('the node CANNOT run as configured (torch, cuda)')
    assert any(line.startswith('ERROR torch') and 'device cuda cannot run' in line
               for line in lines)


def test_parameters_the_node_refuses_exit_1_and_a_usage_error_2():
    bad = _run('--json', '--ros-args', '-p', 'device:=gpu')
    assert bad.returncode == 1
    [params] = [f for f in json.loads(bad.stdout) if f['check'] == 'params']
    assert params['level'] == 'ERROR' and "device must be 'cpu', 'cuda'" in params['summary']
    assert _run('--camera-size', '640').returncode == 2


def test_main_in_process_matches_run_checks(capsys):
    assert doctor.main(['--ros-args', '--params-file', str(config_file('test'))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'oxygen_doctor: this machine, for the oxygen node as configured'
    assert out[-1].endswith('the node can run as configured')
