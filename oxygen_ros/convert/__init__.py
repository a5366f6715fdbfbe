"""openpi JAX (orbax) checkpoints to oxygen_ros checkpoint folders without JAX: oxygen_convert."""
