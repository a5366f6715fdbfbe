"""
Executing action chunks on a robot: time in, joint command out (no rclpy, no simulator).

``action_chunk.Chunk`` is a chunk without ROS types and ``JointLimits`` a controller's limits;
``chunk_executor.ChunkExecutor`` samples the newest valid chunk at the controller's clock, as
ros2_control's ``joint_trajectory_controller`` samples a trajectory; ``trajectory_msg`` turns a
``trajectory_msgs/JointTrajectory`` into a ``Chunk`` without importing ROS;
``boundary_metrics`` measures the position jump and the jerk where chunks are switched. The
simulator (``oxygen_ros.sim``) wraps them, and so can a real robot's driver.
"""
