"""
Launch the simulated Panda (``oxygen_sim``) and the ``oxygen`` node driving it, on sim time.

Usage::

    ros2 launch oxygen_ros sim.launch.py
    ros2 launch oxygen_ros sim.launch.py chunk_smoothing:=rtc real_time_factor:=0.5

The node reads ``config/sim.yaml`` (demo preset, RANDOM weights: the motion is meaningless;
``use_sim_time``, joint-velocity actions, the Panda's limits) and
``config/sim_norm_stats.json``; ``chunk_smoothing`` overrides the file. The simulator publishes
``/clock``, the cameras and ``/joint_states`` and executes ``/oxygen/action_chunk``. It renders
offscreen with ``MUJOCO_GL=egl`` unless the environment sets ``MUJOCO_GL`` (e.g. ``osmesa``).
"""

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = 'oxygen_ros'


def _actions(context: LaunchContext) -> list:
    """Return the simulator and the node for the launch arguments."""
    config = [FindPackageShare(PACKAGE), 'config']
    rtf = float(LaunchConfiguration('real_time_factor').perform(context))
    overrides = {
        'norm_stats': PathJoinSubstitution([*config, 'sim_norm_stats.json']),
        'chunk_smoothing': LaunchConfiguration('chunk_smoothing'),
    }
    return [
        Node(package=PACKAGE, executable='oxygen_sim', name='oxygen_sim', output='screen',
             parameters=[{'real_time_factor': rtf}]),
        Node(package=PACKAGE, executable='oxygen_node', name='oxygen', output='screen',
             parameters=[PathJoinSubstitution([*config, 'sim.yaml']), overrides]),
    ]


def generate_launch_description() -> LaunchDescription:
    """Return the launch description (arguments, then the simulator and the node)."""
    return LaunchDescription([
        DeclareLaunchArgument('chunk_smoothing', default_value='none',
                              description="the node's chunk_smoothing: none, ensemble, rtc"),
        DeclareLaunchArgument('real_time_factor', default_value='1.0',
                              description='sim seconds per wall second'),
        OpaqueFunction(function=_actions),
    ])
