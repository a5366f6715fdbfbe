"""
Backends: what executes a scheduler's plan on tensors (the OxyGen engine loop is ``engine/``).

``interface.Backend`` is the contract the engine calls; ``torch_backend`` (eager PyTorch, CPU
or CUDA, with ``async_io``, ``attention`` and ``greedy``) and ``fast_path/`` (the same job
program at static shapes in CUDA graphs) implement it. ``factory`` picks one from a
``config.BackendConfig``; a backend beyond torch is a plugin it finds by entry point (the
experimental TensorRT backend, ``tools/tensorrt/``). ``parity`` and ``fp8_gate`` are the
accuracy rules the fast path's gate and the FP8 load share. Nothing is imported here.
"""
