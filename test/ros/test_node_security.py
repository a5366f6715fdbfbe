"""
DDS security as the node, oxygen_ask and the demo start: never a silent unsecured start.

The refusals run everywhere. The secure domain itself (an operator reaches the node, an
unsecured participant never matches, an enclave without the grant cannot create the writer)
needs a middleware with the DDS security plugins: it is skipped, with the reason, where the
middleware has none (the ROS 2 wheels from PyPI; docs/security.md).
"""

from pathlib import Path
import re
import subprocess
import sys

from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.node import OxygenNode
from oxygen_ros.ros.security import (
    NO_PLUGINS_MARKER, NODE_ENCLAVE, OBSERVER_ENCLAVE, OPERATOR_ENCLAVE, ROBOT_ENCLAVE,
    SecuritySettings)
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, JOINT_STATES_TOPIC
from oxygen_ros.tools.keystore.keystore import keystore_domain_id
import pytest
import rclpy
from rclpy.context import Context
from rclpy.lifecycle import TransitionCallbackReturn
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

NODE = [sys.executable, '-m', 'oxygen_ros.ros.node', '--ros-args', '--params-file',
        str(config_file('test'))]
PERMISSIVE_MESSAGE = (
    'not starting: ROS_SECURITY_ENABLE=true but ROS_SECURITY_STRATEGY is unset (Permissive): '
    'with Permissive a missing or unusable enclave starts the node without security. Set '
    'ROS_SECURITY_STRATEGY=Enforce')
NO_PLUGINS_MESSAGE = (
    'DDS security is enabled but this middleware has no security plugins ("This Fast DDS '
    'version doesn\'t have the security libraries"): the ROS 2 wheels from PyPI are built '
    'without them. Install ROS 2 from the official packages (Fast DDS built with '
    '-DSECURITY=ON, e.g. apt install ros-jazzy-ros-base), or unset ROS_SECURITY_ENABLE to run '
    'unsecured (docs/security.md)')
PROBE = ('import rclpy\n'
         'rclpy.init()\n'
         'try:\n'
         '    rclpy.create_node("probe")\n'
         'except Exception as exc:\n'
         '    print(" ".join(str(exc).split()))\n'
         'else:\n'
         '    print("secure participant created")\n')


def fatal_lines(output: str) -> list[str]:
    """Return the FATAL log lines without their time stamps."""
    return [re.sub(r'^\[FATAL\] \[[\d.]+\] \[oxygen\]: ', '', line)
            for line in output.splitlines() if line.startswith('[FATAL]')]


@pytest.fixture(scope='module')
def keystore(tmp_path_factory) -> Path:
    """Return a keystore for the node with config/test.yaml (every role, domain from env)."""
    path = tmp_path_factory.mktemp('security') / 'keystore'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.keystore', 'create',
                           str(path), '--domain-id', '0', '--ros-args', '--params-file',
                           str(config_file('test'))], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return path


def secure_env(env: dict, keystore: Path, domain_id: int, strategy: str = 'Enforce') -> dict:
    """Return ``env`` with security on; the keystore is re-made for the test's domain."""
    subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.keystore', 'create', str(keystore),
                    '--domain-id', str(domain_id), '--ros-args', '--params-file',
                    str(config_file('test'))], capture_output=True, check=True, timeout=120)
    return {**env, 'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_STRATEGY': strategy,
            'ROS_SECURITY_KEYSTORE': str(keystore)}


@pytest.fixture
def plugins(keystore, ros_env, ros_domain_id) -> str:
    """Return what creating a secure participant here says (the rmw's words on failure)."""
    env = secure_env(ros_env, keystore, ros_domain_id)
    proc = subprocess.run([sys.executable, '-c', PROBE, '--ros-args', '--enclave',
                           OPERATOR_ENCLAVE], capture_output=True, text=True, env=env,
                          timeout=60)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr


def run(args, env, timeout_s=120.0) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_permissive_with_a_missing_enclave_does_not_start(ros_env, tmp_path):
    # seen before: rcl's Permissive strategy ran this node without security, silently
    env = {**ros_env, 'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_KEYSTORE': str(tmp_path)}
    proc = run([*NODE, '--enclave', '/missing'], env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert fatal_lines(proc.stdout + proc.stderr) == [PERMISSIVE_MESSAGE]
    assert 'engine' not in proc.stdout + proc.stderr                 # never configured


def test_enforce_without_an_enclave_does_not_start(ros_env, keystore):
    env = {**ros_env, 'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_STRATEGY': 'Enforce',
           'ROS_SECURITY_KEYSTORE': str(keystore)}
    proc = run(NODE, env)
    assert proc.returncode == 1
    assert fatal_lines(proc.stdout + proc.stderr) == [
        'not starting: ROS_SECURITY_ENABLE=true but no enclave was given: start with '
        '--ros-args --enclave /oxygen_ros/oxygen (launch: enclave:=/oxygen_ros/oxygen)']


def test_a_middleware_without_security_plugins_stops_the_node_with_the_fix(
        ros_env, ros_domain_id, keystore, plugins):
    if NO_PLUGINS_MARKER not in plugins:
        pytest.skip(f'this middleware has the security plugins ({plugins}): '
                    'test_secure_domain covers it')
    env = secure_env(ros_env, keystore, ros_domain_id)
    proc = run([*NODE, '--enclave', NODE_ENCLAVE], env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert fatal_lines(proc.stdout + proc.stderr) == [f'not starting: {NO_PLUGINS_MESSAGE}']
    ask = run([sys.executable, '-m', 'oxygen_ros.tools.ask', 'hello?', '--ros-args',
               '--enclave', OPERATOR_ENCLAVE], env)
    assert (ask.returncode, ask.stdout, ask.stderr.splitlines()[-1]) == (
        1, '', f'oxygen_ask: {NO_PLUGINS_MESSAGE}')
    demo = run([sys.executable, '-m', 'oxygen_ros.tools.demo', 'bag', '--keystore',
                str(keystore), '--out', str(keystore.parent / 'out')], ros_env)
    assert (demo.returncode, demo.stderr.splitlines()[-1]) == (
        1, f'oxygen_demo: {NO_PLUGINS_MESSAGE}'), demo.stdout + demo.stderr


def test_clients_refuse_as_the_node_does(ros_env, tmp_path):
    env = {**ros_env, 'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_STRATEGY': 'Enforce',
           'ROS_SECURITY_KEYSTORE': str(tmp_path)}
    ask = run([sys.executable, '-m', 'oxygen_ros.tools.ask', 'hello?'], env)
    assert (ask.returncode, ask.stdout, ask.stderr) == (
        1, '', 'oxygen_ask: ROS_SECURITY_ENABLE=true but no enclave was given: start with '
        '--ros-args --enclave /oxygen_ros/operator\n')
    demo = run([sys.executable, '-m', 'oxygen_ros.tools.demo', 'bag', '--keystore',
                str(tmp_path), '--out', str(tmp_path / 'out')], ros_env)
    folder = tmp_path / 'enclaves' / 'oxygen_ros' / 'operator'
    assert (demo.returncode, demo.stderr) == (1, (
        f'oxygen_demo: enclave /oxygen_ros/operator: {folder} does not exist in the keystore '
        f'{tmp_path}. Make it with oxygen_keystore create {tmp_path}, or start with --ros-args '
        '--enclave /oxygen_ros/operator\n'))
    assert not (tmp_path / 'out').exists()


def test_the_bag_tools_and_the_sim_refuse_as_the_node_does(ros_env, demo_bag, tmp_path):
    # seen before: replay and record started unsecured under a Permissive strategy
    permissive = {**ros_env, 'ROS_SECURITY_ENABLE': 'true', 'ROS_SECURITY_KEYSTORE': str(tmp_path)}
    reason = PERMISSIVE_MESSAGE.removeprefix('not starting: ')
    replay = run([sys.executable, '-m', 'oxygen_ros.tools.bag.replay', str(demo_bag.path),
                  '--ros-args', '--enclave', ROBOT_ENCLAVE], permissive)
    assert (replay.returncode, replay.stdout, replay.stderr) == (
        1, '', f'oxygen_bag replay: {reason}\n')
    record = run([sys.executable, '-m', 'oxygen_ros.tools.bag.record', str(tmp_path / 'bag'),
                  '/oxygen/action_chunk', '--ros-args', '--enclave', OBSERVER_ENCLAVE],
                 permissive)
    assert (record.returncode, record.stdout, record.stderr) == (
        1, '', f'oxygen_bag record: {reason}\n')
    assert not (tmp_path / 'bag').exists()
    enforce = {**permissive, 'ROS_SECURITY_STRATEGY': 'Enforce'}
    record = run([sys.executable, '-m', 'oxygen_ros.tools.bag.record', str(tmp_path / 'bag'),
                  '/oxygen/action_chunk'], enforce)
    assert (record.returncode, record.stderr) == (1, (
        'oxygen_bag record: ROS_SECURITY_ENABLE=true but no enclave was given: start with '
        '--ros-args --enclave /oxygen_ros/observer\n'))
    sim = run([sys.executable, '-m', 'oxygen_ros.sim.app'], enforce)
    assert sim.returncode == 1
    assert [re.sub(r'^\[FATAL\] \[[\d.]+\] \[oxygen_sim\]: ', '', line)
            for line in (sim.stdout + sim.stderr).splitlines()] == [
        'not starting: ROS_SECURITY_ENABLE=true but no enclave was given: start with '
        '--ros-args --enclave /oxygen_ros/robot']


def test_the_demo_refuses_a_keystore_made_for_another_configuration(ros_env, tmp_path):
    # what docs/security.md once showed: a keystore for pi05_droid's remapped cameras
    keystore = tmp_path / 'keystore'
    zed = '/zed/left/image_rect_color'
    made = run([sys.executable, '-m', 'oxygen_ros.tools.keystore', 'create', str(keystore),
                '--domain-id', '7', '--preset', 'pi05_droid', '--ros-args', '-r',
                f'{CAMERA_TOPICS["base_0_rgb"]}:={zed}'], ros_env)
    assert made.returncode == 0, made.stderr
    demo = run([sys.executable, '-m', 'oxygen_ros.tools.demo', 'bag', '--keystore',
                str(keystore), '--out', str(tmp_path / 'out')], ros_env)
    assert demo.returncode == 1, demo.stdout + demo.stderr
    [line] = demo.stderr.splitlines()
    assert line.startswith(f'oxygen_demo: the keystore {keystore} was made for another '
                           'configuration of the node: enclave /oxygen_ros/oxygen lacks ')
    for grant in ('enclave /oxygen_ros/oxygen lacks subscribe rt/camera/base/image_raw',
                  'enclave /oxygen_ros/robot lacks publish rt/camera/base/image_raw'):
        assert grant in line
    assert line.endswith(f'. Make it for this one: oxygen_keystore create {keystore} '
                         '--domain-id 7 --preset demo')
    assert not (tmp_path / 'out').exists()                    # nothing was started


def test_the_demo_runs_on_its_keystores_domain(ros_env, keystore, tmp_path):
    own = keystore_domain_id(keystore)
    other = 231 if own != 231 else 230
    demo = run([sys.executable, '-m', 'oxygen_ros.tools.demo', 'bag', '--keystore',
                str(keystore), '--domain-id', str(other), '--out', str(tmp_path)], ros_env)
    assert (demo.returncode, demo.stderr) == (1, (
        f'oxygen_demo: --domain-id {other}, but the keystore {keystore} is for domain {own} '
        f'(its permissions hold there only): leave --domain-id out or run oxygen_keystore '
        f'create {keystore} --domain-id {other}\n'))


def test_configure_fails_with_the_reason_where_security_would_not_hold(ros_domain_id):
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    try:
        node = OxygenNode(context=context, security=SecuritySettings('true', 'Permissive'),
                          cli_args=['--ros-args', '--params-file', str(config_file('test')),
                                    '-p', 'autostart:=false'])
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        status = node._diag.status(0.0, 10.0, 0.5)
        values = status_values(status)
        assert status.message == (
            'engine failed: configure failed: DDS security: ROS_SECURITY_ENABLE=true but '
            "ROS_SECURITY_STRATEGY is 'Permissive': with Permissive a missing or unusable "
            'enclave starts the node without security. Set ROS_SECURITY_STRATEGY=Enforce')
        assert values['DDS security'] == 'enforce, enclave /'
        assert node._engine is None                        # nothing was built
        node.destroy_node()
        off = OxygenNode(context=context, security=SecuritySettings(),
                         cli_args=['--ros-args', '-p', 'autostart:=false'])
        assert status_values(off._diag.status(0.0, 10.0, 0.5))['DDS security'] == 'off'
        off.destroy_node()
    finally:
        context.try_shutdown()


def test_secure_domain(ros_env, ros_domain_id, ros_node, keystore, plugins, demo_bag,
                       tmp_path):
    """An operator reaches the node; an unsecured participant and an intruder do not."""
    if NO_PLUGINS_MARKER in plugins:
        pytest.skip(f'this middleware has no DDS security plugins ("{NO_PLUGINS_MARKER}"): '
                    'the ROS 2 wheels from PyPI are built without them; this runs where ROS 2 '
                    'comes from the official packages (docs/security.md)')
    assert plugins == 'secure participant created', plugins
    env = secure_env(ros_env, keystore, ros_domain_id)
    logs = []

    def start(name, args, enclave):
        log = open(tmp_path / f'{name}.log', 'wb')
        logs.append(log)
        return subprocess.Popen([sys.executable, '-m', *args, '--ros-args', '--enclave',
                                 enclave], env=env, stdout=log, stderr=subprocess.STDOUT)
    node = start('node', ['oxygen_ros.ros.node', '--ros-args', '--params-file',
                          str(config_file('test')), '-p', 'instruction:=pick up the cup'],
                 NODE_ENCLAVE)
    robot = start('replay', ['oxygen_ros.tools.bag.replay', str(demo_bag.path), '--loop',
                             '--topics', CAMERA_TOPICS['base_0_rgb'],
                             CAMERA_TOPICS['left_wrist_0_rgb'], JOINT_STATES_TOPIC],
                  ROBOT_ENCLAVE)
    try:
        # the operator: a question answered through the ~/ask action
        ask = run([sys.executable, '-m', 'oxygen_ros.tools.ask', 'what is on the table?',
                   '--timeout', '90', '--ros-args', '--enclave', OPERATOR_ENCLAVE], env, 150)
        assert ask.returncode == 0, ask.stderr + (tmp_path / 'node.log').read_text()
        # an enclave with the grant reads chunks; one without it cannot create the writer
        script = (
            'import time, rclpy\n'
            'from std_msgs.msg import String\n'
            'from trajectory_msgs.msg import JointTrajectory\n'
            'rclpy.init()\n'
            'node = rclpy.create_node("intruder")\n'
            'chunks = []\n'
            'node.create_subscription(JointTrajectory, "/oxygen/action_chunk", chunks.append,'
            ' 10)\n'
            'end = time.monotonic() + 30\n'
            'while not chunks and time.monotonic() < end:\n'
            '    rclpy.spin_once(node, timeout_sec=0.1)\n'
            'print("chunks", len(chunks))\n'
            'try:\n'
            '    node.create_publisher(String, "/oxygen/instruction", 1)\n'
            '    print("writer created")\n'
            'except Exception as exc:\n'
            '    print("writer refused:", " ".join(str(exc).split()))\n')
        observer = run([sys.executable, '-c', script, '--ros-args', '--enclave',
                        OBSERVER_ENCLAVE], env, 90)
        lines = observer.stdout.splitlines()
        assert lines[0] != 'chunks 0', observer.stdout + observer.stderr
        assert lines[1].startswith('writer refused:'), observer.stdout + observer.stderr
        # an unsecured participant (this test's own node) never matches the secure node
        chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 10)
        intruder = ros_node.node.create_publisher(String, '/oxygen/instruction', 10)
        ros_node.spin_for(10.0)
        assert len(chunks) == 0
        assert ros_node.node.count_publishers('/oxygen/action_chunk') == 0
        assert intruder.get_subscription_count() == 0
        assert ('oxygen', '/') not in ros_node.node.get_node_names_and_namespaces()
    finally:
        for proc in (robot, node):
            proc.send_signal(2)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    assert node.returncode == 0, (tmp_path / 'node.log').read_text()
