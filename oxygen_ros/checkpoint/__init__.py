"""Checkpoints: openpi-PyTorch and LeRobot weights read and written (openpi JAX: tools/convert)."""
