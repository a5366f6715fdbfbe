"""
A simulated Franka Emika Panda that closes the loop with the node over ROS 2 topics.

Small pieces: ``assets`` (where the Menagerie model files are), ``scene`` (the
scene built with ``mujoco.MjSpec``), ``physics`` (fixed steps, position servos, gripper
mapping), ``render`` (offscreen cameras), ``params`` and ``reports`` (the node's parameters and
diagnostics) and ``node`` (the thin rclpy wrapper; ``app.main`` is ``oxygen_sim``). Chunks are
executed by ``oxygen_ros.control.ChunkExecutor``, the same class a real robot can use.
"""
