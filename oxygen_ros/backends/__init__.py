"""
Backends: what executes a scheduler's plan on tensors (the OxyGen engine loop is ``engine/``).

``torch_backend`` (eager PyTorch, CPU or CUDA), ``compiled`` (torch.compile), the ONNX export
and its onnxruntime runner, and TensorRT (imported only when selected). ``factory`` picks one
from a ``config.BackendConfig``. Nothing is imported here.
"""
