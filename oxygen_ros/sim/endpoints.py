"""
Every topic the simulator node ``oxygen_sim`` creates, declared once.

``sim.node`` creates its publishers and its subscription from these names, and
``oxygen_keystore`` grants the robot's enclave what a simulator or a robot driver creates
besides the node's inputs and outputs (``DRIVER_OUTPUTS``: ``/clock``, ``/diagnostics`` and
its own topics), so the sim runs in ``/oxygen_ros/robot`` (docs/security.md). The rest faces
the ``oxygen`` node with its default names (remap them with the node's): the cameras and
``/joint_states`` it reads, ``/oxygen/action_chunk`` it writes.
"""

from __future__ import annotations

from oxygen_ros.ros.endpoint_types import Endpoint, EndpointKind
from oxygen_ros.ros.topics import CAMERA_TOPICS, IMAGE_TYPE, JOINT_STATE_TYPE, JOINT_STATES_TOPIC

NODE_NAME = 'oxygen_sim'
DIAGNOSTIC_ARRAY_TYPE = 'diagnostic_msgs/msg/DiagnosticArray'
CAMERA_SLOTS = ('base_0_rgb', 'left_wrist_0_rgb')
"""The node's camera slots the sim renders (its base and wrist cameras)."""
CLOCK = Endpoint(EndpointKind.PUBLISHER, '/clock', 'rosgraph_msgs/msg/Clock')
JOINT_COMMAND = Endpoint(EndpointKind.PUBLISHER, '~/joint_command', JOINT_STATE_TYPE)
CHUNK_EVENTS = Endpoint(EndpointKind.PUBLISHER, '~/chunk_events', DIAGNOSTIC_ARRAY_TYPE)
DIAGNOSTICS = Endpoint(EndpointKind.PUBLISHER, '/diagnostics', DIAGNOSTIC_ARRAY_TYPE)
DRIVER_OUTPUTS = (CLOCK, JOINT_COMMAND, CHUNK_EVENTS, DIAGNOSTICS)
"""What the sim publishes besides the node's inputs."""
CAMERAS = tuple(Endpoint(EndpointKind.PUBLISHER, CAMERA_TOPICS[slot], IMAGE_TYPE)
                for slot in CAMERA_SLOTS)
JOINT_STATES = Endpoint(EndpointKind.PUBLISHER, JOINT_STATES_TOPIC, JOINT_STATE_TYPE)
ACTION_CHUNK = Endpoint(EndpointKind.SUBSCRIPTION, '/oxygen/action_chunk',
                        'trajectory_msgs/msg/JointTrajectory')
"""The ``oxygen`` node's ``~/action_chunk`` under its default name."""
SIM_ENDPOINTS = (*DRIVER_OUTPUTS, *CAMERAS, JOINT_STATES, ACTION_CHUNK)
"""Every endpoint of the sim node (besides rclpy's own: ``/rosout``, parameters)."""

__all__ = ['ACTION_CHUNK', 'CAMERAS', 'CAMERA_SLOTS', 'CHUNK_EVENTS', 'CLOCK',
           'DIAGNOSTICS', 'DRIVER_OUTPUTS', 'JOINT_COMMAND', 'JOINT_STATES', 'NODE_NAME',
           'SIM_ENDPOINTS']
