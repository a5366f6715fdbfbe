"""
The manifest of an ONNX export (``manifest.json``) and the weights hash that keys it.

A consumer (the TensorRT backend, a deployment script) reads the manifest instead of
guessing: which graphs exist, their exact signatures (``load_manifest`` checks them against
the ONNX files), the model config they were traced from and the SHA-256 of the weights,
which keys every cache built from them (TensorRT engines).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import hashlib
import json
from pathlib import Path

import onnx
from oxygen_ros.config import ModelConfig
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.tools.tensorrt.onnx_graphs import (
    dtype_name, GraphName, GraphSpec, TensorSpec)
import torch

MANIFEST_FILE = 'manifest.json'
MANIFEST_FORMAT = 'oxygen_ros.onnx_export/1'
ONNX_DTYPES = {
    'float32': onnx.TensorProto.FLOAT, 'float16': onnx.TensorProto.FLOAT16,
    'bfloat16': onnx.TensorProto.BFLOAT16, 'int64': onnx.TensorProto.INT64,
    'bool': onnx.TensorProto.BOOL,
}
"""Element types our graphs use, by torch dtype name."""


@dataclass(frozen=True, slots=True)
class GraphEntry:
    """One exported graph: its file (relative to the export directory) and signature."""

    file: str
    spec: GraphSpec


@dataclass(frozen=True, slots=True)
class ExportManifest:
    """
    What ``manifest.json`` records.

    :ivar weights_sha256: :func:`weights_sha256` of the exported weights.
    :ivar weights_file: the shared external-data file, or None (weights inside each graph).
    :ivar model_config: :func:`config_dict` of the ``ModelConfig`` traced.
    """

    preset: str
    dtype: str
    prefix_attention: str
    opset: int
    ir_version: int
    weights_sha256: str
    weights_file: str | None
    torch_version: str
    model_config: dict
    graphs: dict[GraphName, GraphEntry]

    def to_json(self) -> str:
        """Return the manifest as indented JSON."""
        graphs = {}
        for name, entry in self.graphs.items():
            graphs[name.value] = {
                'file': entry.file,
                'inputs': [_tensor_json(t) for t in entry.spec.inputs],
                'outputs': [_tensor_json(t) for t in entry.spec.outputs],
                'dynamic_dims': list(entry.spec.dynamic_dims),
            }
        doc = {'format': MANIFEST_FORMAT, 'preset': self.preset, 'dtype': self.dtype,
               'prefix_attention': self.prefix_attention, 'opset': self.opset,
               'ir_version': self.ir_version, 'weights_sha256': self.weights_sha256,
               'weights_file': self.weights_file, 'exporter': 'torch.onnx (TorchScript)',
               'torch_version': self.torch_version, 'model_config': self.model_config,
               'graphs': graphs}
        return json.dumps(doc, indent=2) + '\n'

    def matches(self, model_cfg: ModelConfig, dtype: torch.dtype) -> bool:
        """Return whether this export was traced from ``model_cfg`` in ``dtype``."""
        return self.model_config == config_dict(model_cfg) and self.dtype == dtype_name(dtype)


def _tensor_json(t: TensorSpec) -> dict:
    return {'name': t.name, 'shape': list(t.shape), 'dtype': t.dtype}


def config_dict(cfg: ModelConfig) -> dict:
    """Return ``cfg`` as plain JSON data (enums as their values, tuples as lists)."""
    return json.loads(json.dumps(asdict(cfg), default=lambda o: o.value))


def weights_sha256(model: Pi05Model) -> str:
    """
    Return the SHA-256 over the state dict: per key in sorted order, name, dtype, shape, bytes.

    Stable across processes and devices; the tied LM head is the embedding (hashed once).
    Full size: ~7 GB hashed, a few seconds.
    """
    digest = hashlib.sha256()
    state = model.state_dict()
    for key in sorted(state):
        t = state[key].detach()
        digest.update(f'{key}|{dtype_name(t.dtype)}|{list(t.shape)}\n'.encode())
        flat = t.contiguous().cpu().reshape(-1)
        if flat.numel():
            digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def read_signature(path: str | Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """
    Return the inputs and outputs an ONNX file declares (external weights are not read).

    :raises ValueError: an element type outside float32/16, bfloat16, int64, bool.
    """
    proto = onnx.load(str(path), load_external_data=False)
    names = {v: k for k, v in ONNX_DTYPES.items()}
    initializers = {i.name for i in proto.graph.initializer}

    def specs(values) -> list[TensorSpec]:
        out = []
        for v in values:
            if v.name in initializers:
                continue
            tt = v.type.tensor_type
            if tt.elem_type not in names:
                raise ValueError(f'{path}: {v.name} has unsupported ONNX type {tt.elem_type}')
            shape = tuple(d.dim_param if d.dim_param else d.dim_value for d in tt.shape.dim)
            out.append(TensorSpec(v.name, shape, names[tt.elem_type]))
        return out
    return specs(proto.graph.input), specs(proto.graph.output)


def _tensors(items: list[dict]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t['name'], tuple(t['shape']), t['dtype']) for t in items)


def load_manifest(export_dir: str | Path) -> ExportManifest:
    """
    Read ``manifest.json`` of an export directory and check it against the ONNX files.

    :raises FileNotFoundError: no manifest, or a file it names is missing.
    :raises ValueError: an unknown format, or a graph whose ONNX signature differs from
        the manifest (every difference listed).
    """
    export_dir = Path(export_dir)
    path = export_dir / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f'no {MANIFEST_FILE} in {export_dir} (run oxygen_export)')
    doc = json.loads(path.read_text())
    if doc.get('format') != MANIFEST_FORMAT:
        raise ValueError(f'{path}: format {doc.get("format")!r}, expected {MANIFEST_FORMAT!r}')
    if doc['weights_file'] and not (export_dir / doc['weights_file']).is_file():
        raise FileNotFoundError(f'{path} names {doc["weights_file"]}, which does not exist')
    graphs = {}
    problems = []
    for key, g in doc['graphs'].items():
        name = GraphName(key)
        spec = GraphSpec(name, _tensors(g['inputs']), _tensors(g['outputs']))
        file = export_dir / g['file']
        if not file.is_file():
            raise FileNotFoundError(f'{path} names {file}, which does not exist')
        ins, outs = read_signature(file)
        if tuple(ins) != spec.inputs:
            problems.append(f'{key} inputs: onnx {ins} != manifest {list(spec.inputs)}')
        if tuple(outs) != spec.outputs:
            problems.append(f'{key} outputs: onnx {outs} != manifest {list(spec.outputs)}')
        graphs[name] = GraphEntry(g['file'], spec)
    if problems:
        raise ValueError(f'{path} does not match its ONNX files:\n  ' + '\n  '.join(problems))
    return ExportManifest(
        preset=doc['preset'], dtype=doc['dtype'], prefix_attention=doc['prefix_attention'],
        opset=doc['opset'], ir_version=doc['ir_version'],
        weights_sha256=doc['weights_sha256'], weights_file=doc['weights_file'],
        torch_version=doc['torch_version'], model_config=doc['model_config'], graphs=graphs)


__all__ = [
    'ExportManifest', 'GraphEntry', 'MANIFEST_FILE', 'MANIFEST_FORMAT', 'ONNX_DTYPES',
    'config_dict', 'load_manifest', 'read_signature', 'weights_sha256',
]
