"""
The ROS 2 node: the only package that imports rclpy (``node.py`` is its entry point).

Importing this package turns off MKL's per-thread buffer cache for the process
(``MKL_DISABLE_FAST_MM``, unless set already; MKL reads it when torch loads it, so it holds
where this package is imported before torch, as in ``oxygen_node``): the cache kept a buffer
for each GEMM shape a thread had met, in use, so every new decode batch or context length
raised RSS for good (``docs/robustness.md#soak``). MKL then allocates through malloc, whose
free pages the node gives back (``heap``).
"""

import os

os.environ.setdefault('MKL_DISABLE_FAST_MM', '1')
