"""ament_pep257 over the whole package and its tests (the ROS 2 ament_python lint test)."""

from pathlib import Path

from ament_pep257.main import main
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.linter
def test_pep257(monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths and excludes below are relative to the package root
    rc = main(argv=['.', 'test', '--exclude', 'build', 'install', 'log'])
    assert rc == 0, 'Found code style errors / warnings'
