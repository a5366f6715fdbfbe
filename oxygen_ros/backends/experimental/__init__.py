"""
EXPERIMENTAL: the ONNX export and the TensorRT backend. TensorRT has never run here.

No TensorRT engine has been built or executed by this project (``docs/limits.md``: PyPI's
``tensorrt-*`` packages are stubs that download from NVIDIA's index; the GPU runs so far
were of the torch backend). What CI does run, on the CPU, is everything up to the TensorRT
runtime: the ONNX graphs of the model (``onnx_graphs``, ``onnx_export``, ``onnx_manifest``)
executed in onnxruntime (``ort_runtime``) behind the same ``GraphRunner`` and the same job
program as the torch backend, checked against the torch model, and the optimization
profiles and engine cache keys (``trt_profiles``). The TensorRT calls themselves
(``trt_runtime``, ``tensorrt_backend``) are unverified.

Imported only when asked for: ``backend: tensorrt`` and the ``oxygen_export`` console script.
This package builds on the core backends (``TorchBackend``, ``buckets.EngineLimits``,
``errors``, ``config``), never the reverse: of the core, only ``factory.make_backend`` names
it, inside the branch that selects TensorRT (``test/test_import_boundaries.py`` holds both).
Nothing is imported here.
"""
