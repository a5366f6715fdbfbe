"""Backends executing scheduler outputs on tensors, and the engine loop."""
