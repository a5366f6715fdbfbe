"""Checkpoint conversion: openpi JAX (orbax) checkpoints to openpi-PyTorch folders, no JAX."""
