"""
``oxygen_sim`` entry point: run ``oxygen_sim`` until SIGINT/SIGTERM or ``sim_duration``.

Sets ``MUJOCO_GL=egl`` when unset, before MuJoCo is imported (MuJoCo picks its OpenGL backend
at import; ``render.py``); ``MUJOCO_GL=osmesa`` works too.

With DDS security (docs/security.md) it runs in the robot's enclave (``--ros-args --enclave
/oxygen_ros/robot``) and, as the node does, refuses to start with one FATAL line where the
security settings would not hold (``SecuritySettings.problem``) or the middleware cannot
create a secure participant.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the simulator; return 0 after a clean stop.

    :returns: 1 if it cannot start (model files missing, no OpenGL context, bad parameter,
        DDS security asked for and not holding).
    """
    os.environ.setdefault('MUJOCO_GL', 'egl')
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
    from rclpy.signals import SignalHandlerOptions
    from oxygen_ros.ros.security import ROBOT_ENCLAVE, SecuritySettings
    from oxygen_ros.sim.endpoints import NODE_NAME
    from oxygen_ros.signals import stop_event_on_signals

    args = [NODE_NAME, *(sys.argv[1:] if argv is None else argv)]
    log = rclpy.logging.get_logger(NODE_NAME)
    security = SecuritySettings.from_environment(args, os.environ)
    problem = security.problem(ROBOT_ENCLAVE)
    if problem is not None:  # before rclpy.init: no participant joins the domain
        log.fatal(f'not starting: {problem}')
        return 1
    from oxygen_ros.sim.node import SimNode, summary_line
    stop = stop_event_on_signals()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = SimNode()
    except (FileNotFoundError, RuntimeError, ValueError,
            rclpy.exceptions.InvalidParameterValueException,
            rclpy.exceptions.InvalidParameterTypeException) as exc:
        secure = security.enabled and isinstance(exc, _rclpy.RCLError)
        log.fatal(f'not starting: {security.middleware_failure(exc)}' if secure
                  else f'cannot start: {exc}')
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, name='ros', daemon=True)
    spinner.start()
    try:
        node.run(stop)
        node.get_logger().info(summary_line(node))
    finally:
        executor.shutdown(timeout_sec=2.0)
        node.close()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
