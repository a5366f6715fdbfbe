"""What the node, oxygen_ask and the demo make of the security environment: each message."""

from pathlib import Path

from oxygen_ros.ros.security import (
    enclave_argument, ENCLAVE_FILES, NODE_ENCLAVE, OPERATOR_ENCLAVE, SecuritySettings)
import pytest

KEYSTORE = '/ks'
NO_PLUGINS = ("error creating node: This Fast DDS version doesn't have the security libraries\n"
              'Please compile Fast DDS using the -DSECURITY=ON CMake option, at '
              '/project/src/participant.cpp:364, at /project/src/rcl/node.c:252')
"""What rclpy raised on these wheels (2026-11-25)."""


def settings(environ, *args):
    return SecuritySettings.from_environment(['oxygen', *args], environ)


def test_the_enclave_comes_from_the_override_then_the_ros_arguments_then_the_root():
    assert enclave_argument(['x', '--ros-args', '--enclave', '/a']) == '/a'
    assert enclave_argument(['x', '--ros-args', '-e', '/a', '--', '--ros-args',
                             '--enclave=/b']) == '/b'
    assert enclave_argument(['x', '--enclave', '/a']) is None      # not a ROS argument
    assert enclave_argument(['x', '--ros-args', '--', '-e', '/a']) is None
    s = settings({}, '--ros-args', '-e', '/a')
    assert (s.enclave, s.enclave_given) == ('/a', True)
    s = settings({'ROS_SECURITY_ENCLAVE_OVERRIDE': '/o'}, '--ros-args', '-e', '/a')
    assert (s.enclave, s.enclave_given) == ('/o', True)
    s = settings({})
    assert (s.enclave, s.enclave_given) == ('/', False)


@pytest.mark.parametrize('value', ['', 'false', 'False'])
def test_security_off_is_no_problem(value):
    s = settings({'ROS_SECURITY_ENABLE': value})
    assert not s.enabled and s.problem() is None and s.describe() == 'off'


@pytest.mark.parametrize('value', ['1', 'True', 'yes', ' true'])
def test_a_value_rcl_reads_as_off_is_refused(value):
    assert settings({'ROS_SECURITY_ENABLE': value}).problem() == (
        f'ROS_SECURITY_ENABLE={value!r}: rcl turns DDS security on only for the exact value '
        "'true' and would start this node without it. Set ROS_SECURITY_ENABLE=true (or unset "
        'it to run unsecured, docs/security.md)')


def test_permissive_is_refused():
    on = {'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_KEYSTORE': KEYSTORE}
    assert settings(on, '--ros-args', '-e', NODE_ENCLAVE).problem() == (
        'ROS_SECURITY_ENABLE=true but ROS_SECURITY_STRATEGY is unset (Permissive): with '
        'Permissive a missing or unusable enclave starts the node without security. Set '
        'ROS_SECURITY_STRATEGY=Enforce')
    assert "ROS_SECURITY_STRATEGY is 'enforce'" in settings(
        {**on, 'ROS_SECURITY_STRATEGY': 'enforce'}).problem()


def test_enforce_needs_a_keystore_and_an_enclave(tmp_path: Path):
    on = {'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_STRATEGY': 'Enforce'}
    assert settings(on).problem() == (
        'ROS_SECURITY_ENABLE=true but ROS_SECURITY_KEYSTORE is not set: make a keystore with '
        'oxygen_keystore create DIR and export ROS_SECURITY_KEYSTORE=DIR')
    on['ROS_SECURITY_KEYSTORE'] = str(tmp_path)
    assert settings(on).problem() == (
        'ROS_SECURITY_ENABLE=true but no enclave was given: start with --ros-args --enclave '
        '/oxygen_ros/oxygen (launch: enclave:=/oxygen_ros/oxygen)')
    assert settings(on).problem(OPERATOR_ENCLAVE) == (
        'ROS_SECURITY_ENABLE=true but no enclave was given: start with --ros-args --enclave '
        '/oxygen_ros/operator')
    folder = tmp_path / 'enclaves' / 'oxygen_ros' / 'oxygen'
    assert settings(on, '--ros-args', '-e', NODE_ENCLAVE).problem() == (
        f'enclave /oxygen_ros/oxygen: {folder} does not exist in the keystore {tmp_path}. '
        f'Make it with oxygen_keystore create {tmp_path}, or start with --ros-args --enclave '
        '/oxygen_ros/oxygen (launch: enclave:=/oxygen_ros/oxygen)')
    folder.mkdir(parents=True)
    for name in ENCLAVE_FILES[:3]:
        (folder / name).write_text('x')
    assert settings(on, '--ros-args', '-e', NODE_ENCLAVE).problem() == (
        f'enclave /oxygen_ros/oxygen: {folder} lacks permissions_ca.cert.pem, governance.p7s, '
        f'permissions.p7s. Make it again with oxygen_keystore create {tmp_path}')
    (folder / 'governance.p7s').symlink_to(tmp_path / 'nowhere')    # a dangling link counts
    for name in ENCLAVE_FILES[3:]:
        if not (folder / name).is_symlink():
            (folder / name).write_text('x')
    assert 'lacks governance.p7s.' in settings(on, '--ros-args', '-e', NODE_ENCLAVE).problem()
    (folder / 'governance.p7s').unlink()
    (folder / 'governance.p7s').write_text('x')
    s = settings(on, '--ros-args', '-e', NODE_ENCLAVE)
    assert s.problem() is None and s.describe() == 'enforce, enclave /oxygen_ros/oxygen'


def test_a_middleware_without_security_plugins_is_named_with_the_fix():
    s = SecuritySettings('true', 'Enforce', KEYSTORE, NODE_ENCLAVE, True)
    assert s.middleware_failure(RuntimeError(NO_PLUGINS)) == (
        'DDS security is enabled but this middleware has no security plugins ("This Fast DDS '
        'version doesn\'t have the security libraries"): the ROS 2 wheels from PyPI are built '
        'without them. Install ROS 2 from the official packages (Fast DDS built with '
        '-DSECURITY=ON, e.g. apt install ros-jazzy-ros-base), or unset ROS_SECURITY_ENABLE to '
        'run unsecured (docs/security.md)')
    assert s.middleware_failure(RuntimeError('bad\n  permissions')) == (
        'DDS security is enabled but the middleware could not create a secure participant for '
        'enclave /oxygen_ros/oxygen (/ks/enclaves/oxygen_ros/oxygen): bad permissions. Check '
        'the enclave with oxygen_keystore create /ks (docs/security.md)')
