"""
The package builds, tests and installs with colcon as an ament_python package.

Copies the tracked (and untracked, not ignored) files into ``<tmp>/ws/src/oxygen_ros``, then
runs ``colcon build``, ``colcon test`` on the lint tests and one unit module (the full suite
already runs outside colcon; running it twice would double CI time) and
``colcon test-result --verbose``. The interface package ``oxygen_ros_interfaces`` (ament_cmake,
rosidl) sits inside the repository, where colcon does not look (it stops at the root's
package.xml): the workspace gets the symlink README.md tells users to make, and colcon
builds both, the interfaces first; ``--base-paths`` finds both too.
Checks that every console script lands in ``install/oxygen_ros/lib/oxygen_ros/`` and runs, and
that after sourcing ``install/setup.bash`` the ament index finds the package share with its
``package.xml``, ``config/*.yaml`` and ``launch/*.launch.py``. The copy gets one probe file in
``config/`` and ``launch/`` (never in the repository) so that the ``data_files`` globs of
setup.py are exercised even while those folders are empty.
"""

import configparser
import json
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'oxygen_ros'
INTERFACES = 'oxygen_ros_interfaces'
# The lint tests, and one unit module that imports test/ros_inputs.py (pytest.ini's pythonpath).
COLCON_TESTS = ['test/test_flake8.py', 'test/test_pep257.py', 'test/test_xmllint.py',
                'test/ros/test_node_units.py']
PROBES = {
    'config/_colcon_probe.yaml': '# Written by test_colcon into its temporary copy only.\n',
    'launch/_colcon_probe.launch.py':
        '"""Probe written by test_colcon into its temporary copy only."""\n',
}
# What to leave out when the source is not a git checkout (mirrors .gitignore).
_NOT_SOURCE = {'.git', '.venv', 'build', 'install', 'log', '__pycache__', '.pytest_cache',
               '.hypothesis', 'out'}
_TIMEOUT_S = 300
# setup.py's console scripts (docs/tools.md): snake_case, one per group of what a user does.
SCRIPTS = ('oxygen_node', 'oxygen_sim', 'oxygen_serve', 'oxygen_ask', 'oxygen_demo', 'oxygen_bag',
           'oxygen_bench', 'oxygen_stress', 'oxygen_fetch', 'oxygen_export', 'oxygen_run_model',
           'oxygen_convert', 'oxygen_keystore', 'oxygen_doctor')


def _source_files():
    try:
        listed = subprocess.run(
            ['git', '-C', str(ROOT), 'ls-files', '-z', '--cached', '--others',
             '--exclude-standard'], check=True, capture_output=True).stdout
        return [Path(p) for p in listed.decode().split('\0') if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames
                           if d not in _NOT_SOURCE and not d.endswith('.egg-info')]
            files += [Path(dirpath, f).relative_to(ROOT) for f in filenames]
        return files


def _copy_package(dest):
    for rel in _source_files():
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for rel, text in PROBES.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)


def _colcon():
    venv_colcon = Path(sys.executable).parent / 'colcon'
    if venv_colcon.is_file():
        return str(venv_colcon)
    found = shutil.which('colcon')
    assert found, 'colcon is not installed (requirements/test.txt: colcon-common-extensions)'
    return found


def _run(args, cwd, env):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=_TIMEOUT_S)
    return proc.returncode, proc.stdout + proc.stderr


def _log(ws, verb, package=PACKAGE):
    log = ws / 'log' / f'latest_{verb}' / package / 'stdout_stderr.log'
    return log.read_text(errors='replace')[-4000:] if log.is_file() else '(no log)'


@pytest.mark.slow
def test_colcon_build_test_install(tmp_path):
    ws = tmp_path / 'ws'
    src = ws / 'src' / PACKAGE
    _copy_package(src)
    env = dict(os.environ)
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    # ament_cmake and the rosidl generators of the venv (a ROS 2 install: its setup.bash)
    env['CMAKE_PREFIX_PATH'] = os.pathsep.join(
        p for p in (sys.prefix, os.environ.get('CMAKE_PREFIX_PATH')) if p)
    env['COLCON_HOME'] = str(tmp_path / 'colcon_home')  # no user defaults or mixins
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    colcon = _colcon()

    rc, out = _run([colcon, 'list', '--names-only'], ws, env)
    assert (rc, out.split()) == (0, [PACKAGE]), out  # colcon stops at the root package.xml
    rc, out = _run([colcon, 'list', '--names-only', '--base-paths', 'src',
                    f'src/{PACKAGE}/{INTERFACES}'], ws, env)
    assert (rc, sorted(out.split())) == (0, [PACKAGE, INTERFACES]), out
    (ws / 'src' / INTERFACES).symlink_to(Path(PACKAGE) / INTERFACES)  # README "Running on a robot"
    rc, out = _run([colcon, 'build', '--cmake-args', f'-DPython3_EXECUTABLE={sys.executable}',
                    '-DBUILD_TESTING=OFF'], ws, env)
    assert rc == 0, f'colcon build failed:\n{out}\n{_log(ws, "build")}\n' \
                    f'{_log(ws, "build", INTERFACES)}'
    assert out.index(f'Finished <<< {INTERFACES} [') < out.index(f'Finished <<< {PACKAGE} ['), out

    rc, out = _run([colcon, 'test', '--packages-select', PACKAGE,
                    '--pytest-args', *COLCON_TESTS], ws, env)
    assert rc == 0, f'colcon test failed:\n{out}\n{_log(ws, "test")}'
    rc, out = _run([colcon, 'test-result', '--verbose'], ws, env)
    summary = re.search(r'Summary: (\d+) tests, (\d+) errors, (\d+) failures', out)
    assert summary, out
    assert int(summary.group(1)) > 0, (
        'colcon test ran no pytest tests: colcon picks pytest only when setup.py declares it '
        "as extras_require={'test': ['pytest']} (current setuptools drops tests_require), "
        f'and otherwise runs unittest, which finds nothing here.\n{_log(ws, "test")}')
    assert rc == 0 and summary.group(2, 3) == ('0', '0'), out

    # Console scripts: every entry point of setup.py, in lib/<pkg> (setup.cfg install_scripts).
    install = ws / 'install' / PACKAGE
    [entry_points] = install.glob(f'lib/python*/site-packages/{PACKAGE}-*/entry_points.txt')
    parser = configparser.ConfigParser()
    parser.read(entry_points)
    scripts = list(parser['console_scripts'])
    assert set(scripts) == set(SCRIPTS), 'console scripts: one snake_case name per group'
    for name in scripts:
        script = install / 'lib' / PACKAGE / name
        assert script.is_file() and os.access(script, os.X_OK), script

    # After sourcing the workspace: the ament index, data files, and the scripts run.
    probe = (
        'import json, os, oxygen_ros\n'
        'from ament_index_python.packages import get_package_share_directory\n'
        'from oxygen_ros import resources\n'
        'from oxygen_ros_interfaces.msg import DecodedText\n'
        'from rclpy.serialization import deserialize_message, serialize_message\n'
        'msg = DecodedText(request_id="answer-0", text="\\u20ac", is_final=True)\n'
        'assert deserialize_message(serialize_message(msg), DecodedText) == msg\n'
        f'share = get_package_share_directory({PACKAGE!r})\n'
        'print(json.dumps({"share": share, "module": oxygen_ros.__file__,\n'
        '                  "resources": str(resources.share_dir()),\n'
        f'                  "interfaces": get_package_share_directory({INTERFACES!r}),\n'
        '                  "msg_module": DecodedText.__module__,\n'
        '                  "msg_file": __import__("oxygen_ros_interfaces").__file__}))\n')
    lib = install / 'lib' / PACKAGE
    script = (
        '. install/setup.bash && "$PROBE_PY" -c "$PROBE" && '
        f'{lib}/oxygen_bag --help && {lib}/oxygen_bag make_demo --help && '
        f'{lib}/oxygen_bag replay --help && {lib}/oxygen_bag record --help && '
        f'{lib}/oxygen_doctor --help && {lib}/oxygen_serve --help')
    rc, out = _run(['bash', '-c', script], ws,
                   {**env, 'PROBE_PY': sys.executable, 'PROBE': probe})
    assert rc == 0, out
    found = json.loads(out.splitlines()[0])
    share = install / 'share' / PACKAGE
    assert Path(found['share']).resolve() == share.resolve()
    assert Path(found['resources']).resolve() == share.resolve()
    assert Path(found['module']).resolve().is_relative_to(install.resolve()), found
    # the generated interfaces come from the workspace, not from the venv's copy
    interfaces = ws / 'install' / INTERFACES
    assert Path(found['interfaces']).resolve() == (interfaces / 'share' / INTERFACES).resolve()
    assert Path(found['msg_file']).resolve().is_relative_to(interfaces.resolve()), found
    assert (interfaces / 'share' / INTERFACES / 'msg' / 'DecodedText.msg').is_file()
    assert (share / 'package.xml').read_bytes() == (ROOT / 'package.xml').read_bytes()
    assert (install / 'share' / 'ament_index' / 'resource_index' / 'packages' / PACKAGE).is_file()
    expected = [*PROBES, *(str(p.relative_to(ROOT)) for p in ROOT.glob('config/*.yaml')),
                *(str(p.relative_to(ROOT)) for p in ROOT.glob('launch/*.launch.py'))]
    missing = [rel for rel in expected if not (share / rel).is_file()]
    assert not missing, f'not installed into {share}: {missing}'
    for name in ('oxygen_bag {replay,record,make_demo}', 'oxygen_bag make_demo',
                 'oxygen_bag replay', 'oxygen_bag record', 'oxygen_doctor'):
        assert f'usage: {name}' in out
