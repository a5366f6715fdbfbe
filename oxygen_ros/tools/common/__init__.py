"""Helpers shared by the console scripts: child processes, observing the node, workloads."""
