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
publishes the cameras and joint states but not the instruction.
"""

import posixpath

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackagePrefix, FindPackageShare

PACKAGE = 'oxygen_ros'
# Default input topics of the node (oxygen_ros.ros.topics) and their remap arguments.
REMAPS = {
    'base_camera': '/camera/base/image_raw',
    'left_wrist_camera': '/camera/left_wrist/image_raw',
    'right_wrist_camera': '/camera/right_wrist/image_raw',
    'joint_states': '/joint_states',
}


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
    actions = [Node(
        package=PACKAGE, executable='oxygen_node', name='oxygen', output='screen',
        parameters=[params_file, overrides] if overrides else [params_file],
        remappings=[(topic, LaunchConfiguration(arg)) for arg, topic in REMAPS.items()],
        ros_arguments=['--enclave', enclave] if enclave else None)]
    bag = LaunchConfiguration('bag').perform(context)
    if bag:
        oxygen_bag = PathJoinSubstitution([FindPackagePrefix(PACKAGE), 'lib', PACKAGE,
                                           'oxygen_bag'])
        robot = ['--ros-args', '--enclave', posixpath.join(posixpath.dirname(enclave), 'robot')] \
            if enclave else []
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
