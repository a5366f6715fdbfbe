"""
launch/oxygen.launch.py: built with launch_ros where it is installed, else checked without it.

``launch`` / ``launch_ros`` are not on PyPI (``docs/running.md#ros-2-from-pypi-the-venv``). Without
them the file is parsed with ``ast`` (arguments, the Node, the params-file substitution, the
remappings) and also executed against small stand-ins of the launch classes that record what they
are given, so the logic of ``generate_launch_description`` runs here too.
"""

import ast
from pathlib import Path
import shutil
import subprocess
import sys

from launch_stand_ins import install_stand_ins, load_launch_file
from oxygen_ros.tools.bag.make_demo import DemoBagConfig, write_demo_bag
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC
import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'oxygen.launch.py'
ARGUMENTS = {'preset', 'checkpoint', 'tokenizer', 'bag', 'enclave', 'base_camera',
             'left_wrist_camera', 'right_wrist_camera', 'joint_states'}
INPUT_TOPICS = {*CAMERA_TOPICS.values(), JOINT_STATES_TOPIC}


def load_launch_module(name='oxygen_launch'):
    return load_launch_file(LAUNCH_FILE, name)


# ----------------------------------------------------------------------- with launch_ros

def test_launch_description_with_launch_ros():
    pytest.importorskip('launch_ros', reason='launch_ros is not on PyPI; a robot with a ROS 2 '
                                             'install runs this part')
    from launch import LaunchContext
    from launch.actions import DeclareLaunchArgument, ExecuteProcess
    from launch_ros.actions import Node
    module = load_launch_module()
    description = module.generate_launch_description()
    declared = {a.name: a for a in description.entities if isinstance(a, DeclareLaunchArgument)}
    assert set(declared) == ARGUMENTS
    context = LaunchContext()
    for name, arg in declared.items():
        context.launch_configurations[name] = ''.join(
            s.perform(context) for s in arg.default_value)
    context.launch_configurations.update(checkpoint='/ckpt', bag='/bags/demo')
    actions = module._actions(context)
    [node] = [a for a in actions if isinstance(a, Node)]
    assert (node.node_package, node.node_executable) == ('oxygen_ros', 'oxygen_node')
    assert [a for a in actions if isinstance(a, ExecuteProcess) and not isinstance(a, Node)]


# -------------------------------------------------------------------- without launch_ros

def call_name(node):
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, 'attr', '')


def calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and call_name(n) == name]


@pytest.fixture(scope='module')
def tree():
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def test_launch_file_structure(tree):
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert 'generate_launch_description' in functions
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for alias in n.names}
    assert {'Node', 'DeclareLaunchArgument', 'ExecuteProcess', 'FindPackageShare',
            'LaunchConfiguration', 'PathJoinSubstitution'} <= imported
    assert not calls(tree, 'eval') and 'PythonExpression' not in imported  # no eval
    [node] = calls(tree, 'Node')
    keywords = {k.arg: k.value for k in node.keywords}
    assert {k: ast.literal_eval(keywords[k]) if isinstance(keywords[k], ast.Constant) else None
            for k in ('executable', 'name')} == {'executable': 'oxygen_node', 'name': 'oxygen'}
    assert ast.unparse(keywords['package']) == 'PACKAGE'
    assert "PACKAGE = 'oxygen_ros'" in ast.unparse(tree)
    # Params file: <share>/config/<preset>.yaml.
    [join] = [c for c in calls(tree, 'PathJoinSubstitution')
              if 'FindPackageShare' in ast.unparse(c)]
    assert ast.unparse(join) == ("PathJoinSubstitution([FindPackageShare(PACKAGE), 'config', "
                                 "[LaunchConfiguration('preset'), '.yaml']])")
    # Remappings: every default input topic (the node's own names, ros.topics), from a launch
    # argument (the topics themselves: test_launch_logic_with_stand_ins).
    [remaps] = [n for n in tree.body if isinstance(n, ast.Assign)
                and ast.unparse(n.targets[0]) == 'REMAPS']
    remap_args = {ast.literal_eval(key) for key in remaps.value.keys}
    assert {ast.unparse(value) for value in remaps.value.values} == {
        *(f"CAMERA_TOPICS['{slot}']" for slot in CAMERA_TOPICS), 'JOINT_STATES_TOPIC'}
    assert ast.unparse(keywords['remappings']) == \
        '[(topic, LaunchConfiguration(arg)) for arg, topic in REMAPS.items()]'
    declared = {ast.literal_eval(c.args[0]) for c in calls(tree, 'DeclareLaunchArgument')
                if isinstance(c.args[0], ast.Constant)}
    assert declared | remap_args == ARGUMENTS
    [execute] = calls(tree, 'ExecuteProcess')
    assert ast.unparse(execute).startswith("ExecuteProcess(cmd=[oxygen_bag, 'replay', bag, ")
    assert any("'oxygen_bag'" in ast.unparse(c) for c in calls(tree, 'PathJoinSubstitution'))


def test_launch_logic_with_stand_ins(monkeypatch, tmp_path):
    install_stand_ins(monkeypatch)
    module = load_launch_module('oxygen_launch_fake')
    description = module.generate_launch_description()
    [entities] = description.args
    declared = {e.args[0]: e.kwargs['default_value'] for e in entities
                if type(e).__name__ == 'DeclareLaunchArgument'}
    assert set(declared) == ARGUMENTS and declared['preset'] == 'demo'
    assert {declared[arg] for arg in module.REMAPS} == INPUT_TOPICS
    [opaque] = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
    context = dict(declared)

    [node] = opaque.kwargs['function'](context)  # defaults: the params file only, no replay
    assert (node.kwargs['package'], node.kwargs['executable'], node.kwargs['name']) == \
        ('oxygen_ros', 'oxygen_node', 'oxygen')
    assert node.kwargs['ros_arguments'] is None  # no enclave
    [params_file] = node.kwargs['parameters']
    share, config, (preset, suffix) = params_file.args[0]
    assert (share.args, config, preset.args, suffix) == (('oxygen_ros',), 'config',
                                                         ('preset',), '.yaml')
    assert {(topic, arg.args[0]) for topic, arg in node.kwargs['remappings']} == \
        {(topic, arg) for arg, topic in module.REMAPS.items()}

    context.update(checkpoint='/ckpt/pi05_droid', bag='/bags/demo')
    node, replay = opaque.kwargs['function'](context)
    assert node.kwargs['parameters'][1] == {'checkpoint': '/ckpt/pi05_droid'}
    path, *args = replay.kwargs['cmd']
    assert path.args[0][1:] == ['lib', 'oxygen_ros', 'oxygen_bag']
    assert args == ['replay', '/bags/demo', '--loop', '--wait-for-subscribers', '20']

    # DDS security: the node and the replay in their enclaves; the robot's may not publish
    # the instruction, so the replay leaves it out and the node takes the bag's as a parameter
    bag = tmp_path / 'demo'
    write_demo_bag(bag, DemoBagConfig(duration_s=0.2, instruction='stack the red blocks'))
    context.update(enclave='/oxygen_ros/oxygen', bag=str(bag))
    node, replay = opaque.kwargs['function'](context)
    assert node.kwargs['ros_arguments'] == ['--enclave', '/oxygen_ros/oxygen']
    assert node.kwargs['parameters'][1] == {'checkpoint': '/ckpt/pi05_droid',
                                            'instruction': 'stack the red blocks'}
    assert replay.kwargs['cmd'][1:] == [
        'replay', str(bag), '--loop', '--wait-for-subscribers', '20', '--exclude-topics',
        INSTRUCTION_TOPIC, '--ros-args', '--enclave', '/oxygen_ros/robot']


@pytest.mark.skipif(shutil.which('openssl') is None, reason='oxygen_keystore needs openssl')
def test_launch_refuses_a_keystore_made_for_another_configuration(monkeypatch, tmp_path):
    keystore = tmp_path / 'keystore'
    zed = '/zed/left/image_rect_color'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.keystore', 'create',
                           str(keystore), '--domain-id', '7', '--preset', 'pi05_droid',
                           '--ros-args', '-r', f'{CAMERA_TOPICS["base_0_rgb"]}:={zed}'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    install_stand_ins(monkeypatch)
    module = load_launch_module('oxygen_launch_keystore')
    [entities] = module.generate_launch_description().args
    context = {e.args[0]: e.kwargs['default_value'] for e in entities
               if type(e).__name__ == 'DeclareLaunchArgument'}
    [opaque] = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
    for name, value in (('ROS_SECURITY_ENABLE', 'true'), ('ROS_SECURITY_STRATEGY', 'Enforce'),
                        ('ROS_SECURITY_KEYSTORE', str(keystore))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv('ROS_SECURITY_ENCLAVE_OVERRIDE', raising=False)
    # the configuration the keystore was made for starts
    context.update(preset='pi05_droid', enclave='/oxygen_ros/oxygen', base_camera=zed)
    [node] = opaque.kwargs['function'](context)
    assert node.kwargs['ros_arguments'] == ['--enclave', '/oxygen_ros/oxygen']
    # another one (the base camera under its default name) stops before anything starts
    context.update(base_camera=CAMERA_TOPICS['base_0_rgb'])
    with pytest.raises(RuntimeError) as refused:
        opaque.kwargs['function'](context)
    assert str(refused.value) == (
        f'the keystore {keystore} was made for another configuration of the node: enclave '
        '/oxygen_ros/oxygen lacks subscribe rt/camera/base/image_raw. Make it for this one: '
        f'oxygen_keystore create {keystore} --domain-id 7 --preset pi05_droid')


def test_every_documented_preset_has_a_params_file():
    for preset in ('pi05_droid', 'pi05_libero', 'pi05_base', 'demo'):
        assert (ROOT / 'config' / f'{preset}.yaml').is_file(), preset
