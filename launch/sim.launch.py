"""
Launch the simulated Panda (``oxygen_sim``) and the ``oxygen`` node driving it, on sim time.

Usage::

    ros2 launch oxygen_ros sim.launch.py
    ros2 launch oxygen_ros sim.launch.py chunk_smoothing:=rtc real_time_factor:=0.5
    ros2 launch oxygen_ros sim.launch.py robots:=2

The node reads ``config/sim.yaml`` (demo preset, RANDOM weights: the motion is meaningless;
``use_sim_time``, joint-velocity actions, the Panda's limits) and
``config/sim_norm_stats.json``; ``chunk_smoothing`` overrides the file. The simulator publishes
``/clock``, the cameras and ``/joint_states`` and executes ``/oxygen/action_chunk``. It renders
offscreen with ``MUJOCO_GL=egl`` unless the environment sets ``MUJOCO_GL`` (e.g. ``osmesa``).
``robots:=N`` simulates N arms (``left`` and ``right`` for two; ``sim.arms``), each under its
namespace, and the one node serves them as its ``robots`` (``sim.arms.node_parameters``: each
robot's joint names, the rest of ``config/sim.yaml`` for all).
"""

from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare
from oxygen_ros.sim.arms import arm_names, node_parameters

PACKAGE = 'oxygen_ros'


def _actions(context: LaunchContext) -> list:
    """Return the simulator and the node for the launch arguments."""
    config = [FindPackageShare(PACKAGE), 'config']
    rtf = float(LaunchConfiguration('real_time_factor').perform(context))
    arms = arm_names(int(LaunchConfiguration('robots').perform(context)))
    sim = {'real_time_factor': rtf, **({} if arms == ('',) else {'robots': list(arms)})}
    overrides = {
        'norm_stats': PathJoinSubstitution([*config, 'sim_norm_stats.json']),
        'chunk_smoothing': LaunchConfiguration('chunk_smoothing'),
        **node_parameters(arms),
    }
    return [
        Node(package=PACKAGE, executable='oxygen_sim', name='oxygen_sim', output='screen',
             parameters=[sim]),
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
        DeclareLaunchArgument('robots', default_value='1',
                              description='simulated arms, served by the node as its robots '
                                          '(2: left and right)'),
        OpaqueFunction(function=_actions),
    ])
