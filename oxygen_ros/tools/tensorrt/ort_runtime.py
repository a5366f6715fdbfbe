"""
onnxruntime (CPU) as a ``GraphExecutor``: the exported graphs checked where TensorRT is absent.

It binds torch-owned CPU buffers by address (``IOBinding``), exactly as ``TrtExecutor``
binds device buffers with ``set_tensor_address``, so a ``GraphRunner`` on it exercises the
same shared-KV-pool logic that runs on TensorRT: everything but the TensorRT runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
from oxygen_ros.tools.tensorrt.onnx_graphs import dtype_name, GraphName
from oxygen_ros.tools.tensorrt.onnx_manifest import ExportManifest, load_manifest
import torch

_NUMPY = {'float32': np.float32, 'float16': np.float16, 'int64': np.int64, 'bool': np.bool_}


class OrtExecutor:
    """
    Runs the graphs of one export directory with onnxruntime's CPU execution provider.

    :param export_dir: an ``oxygen_export`` output (``manifest.json`` + graphs).
    :param graphs: the graphs to load (default: all in the manifest).
    :param threads: intra-op threads (default: onnxruntime's).
    :raises FileNotFoundError: / ValueError: see ``load_manifest``.
    """

    def __init__(self, export_dir: str | Path, *, graphs: tuple[GraphName, ...] | None = None,
                 threads: int | None = None) -> None:
        import onnxruntime as ort

        export_dir = Path(export_dir)
        self.manifest: ExportManifest = load_manifest(export_dir)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        names = graphs if graphs is not None else tuple(self.manifest.graphs)
        self.sessions = {
            name: ort.InferenceSession(str(export_dir / self.manifest.graphs[name].file),
                                       options, providers=['CPUExecutionProvider'])
            for name in names}

    def run(self, name: GraphName, inputs: Mapping[str, torch.Tensor],
            outputs: Mapping[str, torch.Tensor]) -> None:
        """
        Run graph ``name`` on caller-owned CPU tensors (bound by address, no copies).

        :raises ValueError: a tensor not on the CPU, or a dtype onnxruntime cannot bind.
        :raises KeyError: a graph that was not loaded.
        """
        binding = self.sessions[name].io_binding()
        for bind, tensors in ((binding.bind_input, inputs), (binding.bind_output, outputs)):
            for key, t in tensors.items():
                if t.device.type != 'cpu' or not t.is_contiguous():
                    raise ValueError(f'{name.value}.{key}: onnxruntime CPU needs a contiguous '
                                     f'CPU tensor, got {t.device} contiguous={t.is_contiguous()}')
                np_dtype = _NUMPY.get(dtype_name(t.dtype))
                if np_dtype is None:
                    raise ValueError(f'{name.value}.{key}: no onnxruntime binding for {t.dtype}')
                bind(key, 'cpu', 0, np_dtype, list(t.shape), t.data_ptr())
        self.sessions[name].run_with_iobinding(binding)


__all__ = ['OrtExecutor']
