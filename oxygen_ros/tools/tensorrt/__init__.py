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

It lives beside ``oxygen_export`` (``tools/export.py``), outside the runtime package, and
builds on the core backends (``TorchBackend``, ``fast_path.buckets.EngineLimits``,
``errors``, ``config``), never the reverse: ``backend: tensorrt`` reaches it as a plugin, the
entry point ``tensorrt`` of group ``oxygen_ros.backends`` (``setup.py``) that
``backends.factory.make_backend`` loads; no runtime module imports it
(``test/test_import_boundaries.py`` holds both). Nothing is imported here.
"""
