"""ament_flake8 over the whole package and its tests (the ROS 2 ament_python lint test)."""

from pathlib import Path

from ament_flake8.main import main_with_errors
import pytest

ROOT = Path(__file__).resolve().parents[1]
# colcon's build/install/log trees hold copies of the sources when colcon runs in the root.
EXCLUDES = ['--exclude', 'build', 'install', 'log']


@pytest.mark.linter
def test_flake8(monkeypatch):
    monkeypatch.chdir(ROOT)  # ament_flake8 skips dot/underscore folders below the cwd only
    rc, errors = main_with_errors(argv=EXCLUDES)
    assert rc == 0, f'Found {len(errors)} code style errors / warnings:\n' + '\n'.join(errors)
