"""
``oxygen_sim`` entry point: run ``oxygen_sim`` until SIGINT/SIGTERM or ``sim_duration``.

Sets ``MUJOCO_GL=egl`` when unset, before MuJoCo is imported (MuJoCo picks its OpenGL backend
at import; ``render.py``); ``MUJOCO_GL=osmesa`` works too.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the simulator; return 0 after a clean stop.

    :returns: 1 if it cannot start (model files missing, no OpenGL context, bad parameter).
    """
    os.environ.setdefault('MUJOCO_GL', 'egl')
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions
    from oxygen_ros.sim.node import NODE_NAME, SimNode, summary_line
    from oxygen_ros.signals import stop_event_on_signals

    args = [NODE_NAME, *(sys.argv[1:] if argv is None else argv)]
    stop = stop_event_on_signals()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = SimNode()
    except (FileNotFoundError, RuntimeError, ValueError,
            rclpy.exceptions.InvalidParameterValueException,
            rclpy.exceptions.InvalidParameterTypeException) as exc:
        rclpy.logging.get_logger(NODE_NAME).fatal(f'cannot start: {exc}')
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
