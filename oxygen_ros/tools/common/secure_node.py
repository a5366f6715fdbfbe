"""
Start a tool's rclpy node as ``oxygen_node`` starts: secured as asked, or not at all.

``oxygen_ask``, ``oxygen_bag replay`` and ``oxygen_bag record`` refuse, with one line on stderr,
where DDS security is asked for and would not hold (``SecuritySettings.problem``: a value rcl
reads as off, a Permissive strategy, no keystore or enclave) or where the middleware cannot
create a secure participant (no security plugins): never an unsecured start the user did not
ask for (docs/security.md).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from oxygen_ros.ros.security import SecuritySettings
import rclpy
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


def start_node(tool: str, node_name: str, argv: Sequence[str], enclave: str) -> Node | None:
    """
    Init rclpy with ``argv`` and return the tool's node, or None after printing why not.

    :param tool: the prefix of the message (``oxygen_bag replay``).
    :param node_name: the node's name.
    :param argv: the tool's arguments, ROS arguments included (``--ros-args --enclave E``).
    :param enclave: the enclave the message suggests (the tool's role).
    :raises RuntimeError: rclpy's ``RCLError`` where security is off (a failure that is not
        about security).
    """
    security = SecuritySettings.from_environment(argv, os.environ)
    problem = security.problem(enclave)
    if problem is not None:  # before rclpy.init: no participant joins the domain
        print(f'{tool}: {problem}', file=sys.stderr)
        return None
    try:
        rclpy.init(args=[node_name, *argv], signal_handler_options=SignalHandlerOptions.NO)
        return Node(node_name)
    except _rclpy.RCLError as exc:
        if not security.enabled:
            raise
        print(f'{tool}: {security.middleware_failure(exc)}', file=sys.stderr)
        rclpy.try_shutdown()
        return None


__all__ = ['start_node']
