"""
The fast path: the torch backend's per-cycle model calls at static shapes, in CUDA graphs.

``backend`` (the torch backend on the fast path) and ``model`` (every step at its static
shapes, parity-gated) are what the factory builds (``backends/factory.py``, when
``compile_mode`` is not ``none``); the rest builds and gates their graphs: ``buckets``
(the static shapes), ``graph_builder``, ``static_graph``, ``warmup``, ``attempts``,
``features``, ``parity_probe``, ``gate_record``, ``precompile``, ``compile_cache``, and two
steps of their own, ``decode_steps`` and ``guided_denoise`` (docs/gpu.md#the-fast-path).
Nothing is imported here.
"""
