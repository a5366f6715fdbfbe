"""
Every topic the simulator node ``oxygen_sim`` creates, declared once.

``sim.node`` creates its publishers and its subscription from these names, and
``oxygen_keystore`` grants the robot's enclave what a simulator or a robot driver creates
besides the node's inputs and outputs (``DRIVER_OUTPUTS``: ``/clock``, ``/diagnostics`` and
its own topics), so the sim runs in ``/oxygen_ros/robot`` (docs/security.md). The rest faces
the ``oxygen`` node with its default names (remap them with the node's): the cameras and
``/joint_states`` it reads, ``/oxygen/action_chunk`` it writes. With several arms (its
``robots`` parameter) each named arm has these under its namespace, as the node's robots do
(``arm_endpoints``); ``/clock`` and ``/diagnostics`` stay one for all.
"""

from __future__ import annotations

from dataclasses import replace

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
ARM_ENDPOINTS = (JOINT_COMMAND, CHUNK_EVENTS, *CAMERAS, JOINT_STATES, ACTION_CHUNK)
"""The endpoints each arm has (the one arm: these; a named arm: ``arm_endpoints``)."""


def arm_topic(name: str, arm: str) -> str:
    """
    Return arm ``arm``'s name of the sim's endpoint ``name`` (``''``: ``name``).

    The rule of the node's robots (``ros.endpoints.robot_topic``, which this module does not
    import: it would load the engine): an absolute ``/x`` becomes ``/<arm>/x``
    (``/left/joint_states``, ``/left/oxygen/action_chunk``); the sim's private ``~/x`` becomes
    ``<arm>/oxygen_sim/x``, resolved in the sim's namespace (``/left/oxygen_sim/chunk_events``
    in the root namespace).
    """
    if not arm:
        return name
    if name.startswith('~/'):
        return f'{arm}/{NODE_NAME}/{name[2:]}'
    return f'/{arm}{name}' if name.startswith('/') else f'{arm}/{name}'


def arm_endpoints(arm: str) -> tuple[Endpoint, ...]:
    """Return the endpoints of arm ``arm`` (``ARM_ENDPOINTS`` under its ``arm_topic``)."""
    return tuple(replace(ep, name=arm_topic(ep.name, arm)) for ep in ARM_ENDPOINTS)


def sim_endpoints(arms: tuple[str, ...] = ('',)) -> tuple[Endpoint, ...]:
    """Return every endpoint of a sim of ``arms``: ``/clock``, ``/diagnostics``, each arm's."""
    return (CLOCK, DIAGNOSTICS, *(ep for arm in arms for ep in arm_endpoints(arm)))


__all__ = ['ACTION_CHUNK', 'ARM_ENDPOINTS', 'CAMERAS', 'CAMERA_SLOTS', 'CHUNK_EVENTS', 'CLOCK',
           'DIAGNOSTICS', 'DRIVER_OUTPUTS', 'JOINT_COMMAND', 'JOINT_STATES', 'NODE_NAME',
           'SIM_ENDPOINTS', 'arm_endpoints', 'arm_topic', 'sim_endpoints']
