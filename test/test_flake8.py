"""ament_flake8 over the whole package and its tests (the ROS 2 ament_python lint test)."""

from pathlib import Path
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
# colcon's build/install/log trees hold copies of the sources when colcon runs in the root.
EXCLUDES = ['--exclude', 'build', 'install', 'log']


@pytest.mark.linter
def test_flake8():
    # A fresh interpreter, not main_with_errors() in-process: flake8 forks a worker pool, and a
    # fork of this pytest process (torch's OpenMP threads, rclpy's DDS threads) once segfaulted
    # in the child's garbage collector and left the pool waiting for ever (CI, 2026-11-21).
    # ament_flake8 skips dot/underscore folders below the cwd only, hence cwd=ROOT.
    proc = subprocess.run([sys.executable, '-m', 'ament_flake8.main', *EXCLUDES], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f'ament_flake8 failed:\n{proc.stdout}\n{proc.stderr}'
