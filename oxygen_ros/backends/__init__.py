"""
Backends: what executes a scheduler's plan on tensors (the OxyGen engine loop is ``engine/``).

``interface.Backend`` is the contract the engine calls; ``torch_backend`` (eager PyTorch, CPU
or CUDA) and ``fast_backend`` (the same on the compiled fast path, ``compiled``) implement
it. ``experimental/`` holds the ONNX export and the TensorRT backend, never run on TensorRT
and imported only when selected. ``factory`` picks one from a ``config.BackendConfig``.
Nothing is imported here.
"""
