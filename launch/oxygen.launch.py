"""
Launch the ``oxygen`` node with a preset's params file (for robots with a ROS 2 install).

Usage::

    ros2 launch oxygen_ros oxygen.launch.py preset:=pi05_droid checkpoint:=/ckpt/droid
    ros2 launch oxygen_ros oxygen.launch.py preset:=pi05_droid base_camera:=/exterior/image
    ros2 launch oxygen_ros oxygen.launch.py preset:=demo bag:=/path/to/demo_bag
    ros2 launch oxygen_ros oxygen.launch.py preset:=pi05_droid enclave:=/oxygen_ros/oxygen

``preset`` selects ``config/<preset>.yaml`` from the package's share directory;
``checkpoint:=`` and ``tokenizer:=`` override the file's values when given. The camera and
joint-state arguments remap the node's default input topics. ``bag:=`` also starts
``oxygen_bag replay --loop`` on that bag (it publishes the bag's own topic names, so leave the
remappings at their defaults then). Camera drivers publishing large images should load
``config/fastdds_large_shm.xml`` (see that file).

``enclave:=`` runs the node in that DDS security enclave (``--ros-args --enclave``; a keystore
from ``oxygen_keystore create``, with ``ROS_SECURITY_ENABLE=true``,
``ROS_SECURITY_STRATEGY=Enforce`` and ``ROS_SECURITY_KEYSTORE`` set; docs/security.md); the
replay of ``bag:=`` then runs in the robot's enclave beside it (``<root>/robot``), which
publishes the cameras and joint states but may not publish the instruction: the replay leaves
``/oxygen/instruction`` out and the node takes the bag's first instruction as its
``instruction`` parameter (as ``oxygen_demo --keystore`` does). Before anything starts, the
enclave's permissions are compared with what the node will create for this preset and these
remappings: a keystore made for another configuration stops the launch with one message
naming the missing grants and the ``oxygen_keystore create`` command for this one.
"""

import os
from pathlib import Path
import posixpath

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare
from oxygen_ros.ros.security import NODE_ENCLAVE, SecuritySettings
from oxygen_ros.ros.topics import CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC

PACKAGE = 'oxygen_ros'
# Default input topics of the node (oxygen_ros.ros.topics) and their remap arguments.
REMAPS = {
    'base_camera': CAMERA_TOPICS['base_0_rgb'],
    'left_wrist_camera': CAMERA_TOPICS['left_wrist_0_rgb'],
    'right_wrist_camera': CAMERA_TOPICS['right_wrist_0_rgb'],
    'joint_states': JOINT_STATES_TOPIC,
}


def _check_keystore(context: LaunchContext, enclave: str) -> None:
    """
    Stop the launch when the keystore does not grant what the node will create.

    Only with security on and the enclave in place (otherwise the node refuses at start with
    the reason, ``SecuritySettings.problem``).

    :raises RuntimeError: the missing grants and the command that makes the keystore for
        this preset and these remappings (``coverage.keystore_problem``).
    """
    settings = SecuritySettings.from_environment(['--ros-args', '--enclave', enclave],
                                                 os.environ)
    if not settings.enabled or settings.problem(NODE_ENCLAVE) is not None:
        return
    from oxygen_ros.tools.keystore.coverage import keystore_problem
    from oxygen_ros.tools.keystore.policy import Role
    remaps = [(topic, LaunchConfiguration(arg).perform(context))
              for arg, topic in REMAPS.items()]
    ros_args = [part for topic, name in remaps if name != topic
                for part in ('-r', f'{topic}:={name}')]
    problem = keystore_problem(Path(settings.keystore),
                               LaunchConfiguration('preset').perform(context),
                               ['--ros-args', *ros_args] if ros_args else [],
                               {Role.NODE: settings.enclave})
    if problem is not None:
        raise RuntimeError(problem)


def _actions(context: LaunchContext) -> list:
    """Return the node (and the replay when ``bag`` is set) for the launch arguments."""
    params_file = PathJoinSubstitution([
        FindPackageShare(PACKAGE), 'config', [LaunchConfiguration('preset'), '.yaml']])
    overrides = {}
    for name in ('checkpoint', 'tokenizer'):
        value = LaunchConfiguration(name).perform(context)
        if value:
            overrides[name] = value
    enclave = LaunchConfiguration('enclave').perform(context)
    bag = LaunchConfiguration('bag').perform(context)
    if enclave:
        _check_keystore(context, enclave)
        if bag:  # the robot's enclave may not publish the instruction: the node takes it
            from oxygen_ros.tools.bag.topics import bag_instruction
            instruction = bag_instruction(Path(bag))
            if instruction:
                overrides['instruction'] = instruction
    actions = [Node(
        package=PACKAGE, executable='oxygen_node', name='oxygen', output='screen',
        parameters=[params_file, overrides] if overrides else [params_file],
        remappings=[(topic, LaunchConfiguration(arg)) for arg, topic in REMAPS.items()],
        ros_arguments=['--enclave', enclave] if enclave else None)]
    if bag:
        oxygen_bag = PathJoinSubstitution([FindPackagePrefix(PACKAGE), 'lib', PACKAGE,
                                           'oxygen_bag'])
        robot = ['--exclude-topics', INSTRUCTION_TOPIC, '--ros-args', '--enclave',
                 posixpath.join(posixpath.dirname(enclave), 'robot')] if enclave else []
        actions.append(ExecuteProcess(
            cmd=[oxygen_bag, 'replay', bag, '--loop', '--wait-for-subscribers', '20', *robot],
            output='screen'))
    return actions


def generate_launch_description() -> LaunchDescription:
    """Return the launch description (arguments, then the node and optional replay)."""
    arguments = [
        DeclareLaunchArgument('preset', default_value='demo',
                              description='params file config/<preset>.yaml: pi05_droid, '
                                          'pi05_libero, pi05_base, demo'),
        DeclareLaunchArgument('checkpoint', default_value='',
                              description="checkpoint directory ('' = the params file's)"),
        DeclareLaunchArgument('tokenizer', default_value='',
                              description="paligemma_tokenizer.model ('' = the params "
                                          "file's)"),
        DeclareLaunchArgument('bag', default_value='',
                              description="also replay this rosbag2 in a loop ('' = no)"),
        DeclareLaunchArgument('enclave', default_value='',
                              description='DDS security enclave of the node, e.g. '
                                          "/oxygen_ros/oxygen ('' = none; docs/security.md)"),
    ]
    arguments += [DeclareLaunchArgument(arg, default_value=topic,
                                        description=f'topic the node reads as {topic}')
                  for arg, topic in REMAPS.items()]
    return LaunchDescription([*arguments, OpaqueFunction(function=_actions)])
