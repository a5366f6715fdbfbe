"""
The two install paths' pins: the robot path beside a ROS 2 install, the CPU/CI path of `make`.

The robot requirements (requirements/robot.txt) are resolved by pip's own resolver for a
Jetson AGX Thor (Linux aarch64, CPython 3.12: JetPack 7 is Ubuntu 24.04) and an x86-64
workstation, wheels only, and must pull no ROS wheel. PyTorch's index (download.pytorch.org)
is out of CI's reach: the resolution takes everything but the torch pin from PyPI, and the
torch / Triton pins are held to what each CUDA wheel requires (requirements/cuda_wheels.csv,
read from the wheels' METADATA).
"""

import csv
import json
from pathlib import Path
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.version import Version
import pytest

REQ = Path(__file__).resolve().parents[1] / 'requirements'
PLATFORMS = {'aarch64': 'Jetson AGX Thor', 'x86_64': 'x86-64 workstation'}
GLIBC = 39
"""Ubuntu 24.04's glibc 2.39: pip is given every manylinux tag it can run."""
NETWORK_ERRORS = ('NewConnectionError', 'Temporary failure in name resolution',
                  'Max retries exceeded', 'Network is unreachable')


def requirement_lines(path: Path) -> list[str]:
    """Return the requirement lines of a requirements file, ``-r`` files expanded, in order."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split(' #')[0].strip()
        if not line or line.startswith('#'):
            continue
        if line.startswith('-r '):
            out += requirement_lines(path.parent / line[3:].strip())
        elif not line.startswith('-'):
            out.append(line)
    return out


def options(path: Path) -> list[str]:
    """Return the option lines (``--extra-index-url ...``) of one requirements file."""
    return [line.strip() for line in path.read_text().splitlines()
            if line.startswith('--')]


def pins(path: Path, machine: str) -> dict[str, Version]:
    """Return ``{name: pinned version}`` of a requirements file on a Linux ``machine``."""
    env = {'platform_machine': machine, 'sys_platform': 'linux', 'platform_system': 'Linux',
           'python_version': '3.12'}
    out = {}
    for line in requirement_lines(path):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            [spec] = req.specifier
            assert spec.operator == '==', f'{path.name}: {line} is not a pin'
            assert req.name.lower() not in out, f'{path.name}: {req.name} pinned twice'
            out[req.name.lower()] = Version(spec.version)
    return out


def cuda_wheels() -> list[dict[str, str]]:
    """Return the rows of requirements/cuda_wheels.csv, each with its ``machine``."""
    lines = [line for line in (REQ / 'cuda_wheels.csv').read_text().splitlines()
             if not line.startswith('#')]
    rows = list(csv.DictReader(lines))
    for row in rows:
        row['machine'] = row['platform'].split('_', 3)[-1]   # manylinux_2_28_<machine>
    return rows


def test_the_robot_path_names_no_ros_wheel_and_the_ci_path_does():
    robot = [Requirement(line).name for line in requirement_lines(REQ / 'robot.txt')]
    ci = [Requirement(line).name for line in requirement_lines(REQ / 'runtime.txt')]
    assert not [n for n in robot if n.lower().startswith(('ros-', 'ros_'))]
    assert 'ros-jazzy-rclpy' in ci and 'torch' in ci and 'torch' in robot
    assert options(REQ / 'robot.txt') == [
        '--extra-index-url https://download.pytorch.org/whl/cu130']


@pytest.mark.parametrize('machine', PLATFORMS)
def test_the_cuda_pins_agree_with_each_other_and_with_the_ci_torch(machine):
    robot, ci = pins(REQ / 'robot.txt', machine), pins(REQ / 'runtime.txt', machine)
    torch = robot['torch']
    assert torch.local == 'cu130', f'{PLATFORMS[machine]}: torch {torch} is not the cu130 build'
    assert torch.public == str(ci['torch']), 'the robot runs the torch release CI tests'
    [row] = [r for r in cuda_wheels() if r['torch'] == torch.public and r['machine'] == machine]
    assert row['cuda_toolkit'].startswith('13.0.'), row
    triton = robot['triton']
    assert triton in Requirement(f'triton{row["triton"]}').specifier, \
        f'torch {torch} on {machine} requires triton{row["triton"]}, robot.txt pins {triton}'
    assert triton >= Version('3.7'), "Jetson Thor's sm_110a needs Triton's CUDA 13 ptxas"
    assert pins(REQ / 'test.txt', machine)['triton'] == Version('3.9.0')   # CI's, apart


def test_the_cuda_wheel_table_covers_both_platforms_of_each_release():
    rows = cuda_wheels()
    for release in {r['torch'] for r in rows}:
        assert sorted(r['machine'] for r in rows if r['torch'] == release) == \
            ['aarch64', 'x86_64'], release


@pytest.mark.slow
@pytest.mark.parametrize('machine', PLATFORMS)
def test_pip_resolves_the_robot_requirements_without_ros_wheels(machine, tmp_path):
    """Resolve with pip's resolver, wheels only, CPython 3.12 on Linux ``machine``."""
    lines = [line for line in requirement_lines(REQ / 'robot.txt')
             if Requirement(line).name != 'torch']
    (tmp_path / 'robot.txt').write_text('\n'.join(lines) + '\n')
    tags = [f'manylinux_2_{v}_{machine}' for v in range(17, GLIBC + 1)] + \
        [f'manylinux2014_{machine}']
    report = tmp_path / 'report.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed',
         '--disable-pip-version-check', '--quiet', '--target', str(tmp_path / 'target'),
         '--only-binary=:all:', '--python-version', '3.12', '--implementation', 'cp',
         *(a for tag in tags for a in ('--platform', tag)), '--report', str(report),
         '-r', str(tmp_path / 'robot.txt')], capture_output=True, text=True, timeout=600)
    if proc.returncode and any(e in proc.stderr for e in NETWORK_ERRORS):
        pytest.skip(f'PyPI is out of reach: {proc.stderr.strip().splitlines()[-1]}')
    assert proc.returncode == 0, proc.stderr
    resolved = {i['metadata']['name'].lower(): Version(i['metadata']['version'])
                for i in json.loads(report.read_text())['install']}
    assert not [n for n in resolved if n.startswith(('ros-', 'ros_', 'rclpy'))], resolved
    wanted = pins(REQ / 'robot.txt', machine)
    del wanted['torch']
    assert {n: resolved.get(n) for n in wanted} == wanted
    assert not [i for i in json.loads(report.read_text())['install']
                if not i['download_info']['url'].endswith('.whl')]
