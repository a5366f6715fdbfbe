"""Requests and the per-cycle scheduler: stdlib only, no torch, no rclpy."""  # noqa: A005
