"""
ONNX export of the five graphs of ``onnx_graphs.py``: one shared weights file and a manifest.

Exporter: the TorchScript-based ``torch.onnx.export(dynamo=False)``. The torch.export-based
exporter (the default since torch 2.9) needs ``onnxscript``, which the locked environment
does not ship; tracing is exact here because the graph modules have no data-dependent
control flow. Opset 17 (IR version 8): inside what TensorRT 10.x's ONNX parser (opset 9 and
up) and onnxruntime 1.31 take, and the first opset with ``LayerNormalization``.

Weights: the graphs are traced with the weights as inputs (constant folding then folds
shape arithmetic only, never a transposed copy of a weight), so every parameter stays one
initializer named as in the state dict. All graphs then point into ONE ``weights.bin`` (ONNX
external data: location, offset, length; offsets 4 KiB aligned so runtimes can mmap), written
once: the full-size model is 6.7 GB on disk in bfloat16, not once per graph, and no protobuf
hits its 2 GB cap.
Runtimes fold the weight transposes themselves (onnxruntime at session start, TensorRT at
build). ``WeightStorage.EMBEDDED`` instead writes self-contained ``.onnx`` files (< 2 GB).

``manifest.json`` names every graph input and output with its shape (dynamic dims named)
and dtype, the preset and model config, opset / IR version and the SHA-256 of the weights.
"""

from __future__ import annotations

import enum
import io
import logging
from pathlib import Path
import warnings

import onnx
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.tools.tensorrt.onnx_graphs import (
    dtype_name, GRAPH_MODULES, graph_specs, GraphName, GraphSpec)
from oxygen_ros.tools.tensorrt.onnx_manifest import (
    config_dict, ExportManifest, GraphEntry, MANIFEST_FILE, MANIFEST_FORMAT, ONNX_DTYPES,
    weights_sha256)
import torch
from torch import nn

_LOG = logging.getLogger(__name__)

ONNX_OPSET = 17
WEIGHTS_FILE = 'weights.bin'
ALIGN_BYTES = 4096
PROTOBUF_LIMIT_BYTES = 2 ** 31 - 1
_PARAM_PREFIX = 'model.'  # the graph modules hold the model as ``self.model``


class WeightStorage(enum.Enum):
    """Where exported graphs keep their weights."""

    SHARED = 'shared'
    """One ``weights.bin`` that every graph's initializers point into (default)."""
    EMBEDDED = 'embedded'
    """Inside each ``.onnx`` file (self-contained; only below protobuf's 2 GB)."""


def export_graphs(model: Pi05Model, out_dir: str | Path, *,
                  graphs: tuple[GraphName, ...] = tuple(GraphName),
                  storage: WeightStorage = WeightStorage.SHARED,
                  check: bool = True) -> ExportManifest:
    """
    Export ``graphs`` of ``model`` (in its dtype) into ``out_dir`` and write the manifest.

    :param model: the weights; traced on its device (trace the full-size model on the CPU
        if GPU memory is short: tracing holds one activation set).
    :param out_dir: created if needed; files of the same names are replaced.
    :param graphs: which graphs to export.
    :param storage: where the weights go.
    :param check: run ``onnx.checker`` (full check, with shape inference) on every graph.
    :returns: the manifest written to ``out_dir / manifest.json``.
    :raises ValueError: an empty ``graphs``, or EMBEDDED for a graph over 2 GB.
    """
    if not graphs:
        raise ValueError('graphs must name at least one graph')
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    specs = graph_specs(model)
    digest = weights_sha256(model)
    locations = None
    if storage is WeightStorage.SHARED:
        locations = _write_weights(state, out_dir / WEIGHTS_FILE)
    entries = {}
    ir_version = 0
    for name in graphs:
        proto = _trace(model, specs[name])
        _attach_weights(proto, state, locations, name)
        _set_signature(proto, specs[name])
        onnx.helper.set_model_props(proto, {
            'oxygen_ros.graph': name.value, 'oxygen_ros.preset': model.cfg.name,
            'oxygen_ros.weights_sha256': digest, 'oxygen_ros.format': MANIFEST_FORMAT})
        file = out_dir / f'{name.value}.onnx'
        if storage is WeightStorage.EMBEDDED and proto.ByteSize() > PROTOBUF_LIMIT_BYTES:
            raise ValueError(f'{name.value} graph is {proto.ByteSize() / 2**30:.1f} GiB, over '
                             f"protobuf's 2 GiB: use WeightStorage.SHARED")
        onnx.save_model(proto, str(file))
        ir_version = proto.ir_version
        if check:
            onnx.checker.check_model(str(file), full_check=True)
        entries[name] = GraphEntry(file.name, specs[name])
    manifest = ExportManifest(
        preset=model.cfg.name, dtype=dtype_name(model.dtype),
        prefix_attention=model.cfg.prefix_attention.value, opset=ONNX_OPSET,
        ir_version=ir_version, weights_sha256=digest,
        weights_file=WEIGHTS_FILE if locations is not None else None,
        torch_version=torch.__version__, model_config=config_dict(model.cfg), graphs=entries)
    (out_dir / MANIFEST_FILE).write_text(manifest.to_json())
    _LOG.info('exported %d graphs of %s (%s) to %s', len(entries), model.cfg.name,
              manifest.dtype, out_dir)
    return manifest


def example_inputs(model: Pi05Model, name: GraphName) -> tuple[torch.Tensor, ...]:
    """
    Return valid inputs for tracing ``name`` (every dynamic dim a distinct size > 1).

    Distinct sizes keep the tracer from tying unrelated dims together.
    """
    cfg, dev, dt = model.cfg, model.device, model.dtype
    gen = torch.Generator(device='cpu').manual_seed(0)
    vlm = cfg.vlm

    def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=dev, dtype=dtype)

    def ints(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=gen).to(dev)

    def ones(*shape: int) -> torch.Tensor:
        return torch.ones(shape, dtype=torch.bool, device=dev)

    num_slots, b, c = 37, 3, 7
    pool = (rand(vlm.depth, num_slots, vlm.num_kv_heads, vlm.head_dim, dtype=dt),
            rand(vlm.depth, num_slots, vlm.num_kv_heads, vlm.head_dim, dtype=dt))
    size, ti = cfg.vision.image_size, cfg.image_tokens_per_camera
    if name is GraphName.VISION:
        return (rand(2, 3, size, size),)
    if name is GraphName.PREFILL:
        return rand(1, 2, ti, vlm.width, dtype=dt), ones(1, 2), ints(100, 1, 5), ones(1, 5)
    if name is GraphName.DECODE:
        return pool + (ints(100, b, 2), ones(b, 2), ints(50, b), ints(num_slots, b, c),
                       ones(b, c))
    if name is GraphName.DENOISE:
        return pool + (ints(num_slots, b, c), ones(b, c),
                       rand(b, cfg.action_horizon, cfg.action_dim),
                       torch.full((b,), 0.7, device=dev), ints(50, b))
    if name is GraphName.LM_HEAD:
        return (rand(b, vlm.width, dtype=dt),)
    raise ValueError(f'unknown graph {name!r}')


class _WeightsAsInputs(nn.Module):
    """
    Trace wrapper: the graph module with its parameters swapped for extra forward inputs.

    The exporter then sees the weights as plain inputs (named by state key) instead of
    parameters, which keeps them out of its shape inference (it serializes parameters,
    seconds per graph for the 257k-row embedding, and protobuf's 2 GB cap at full size).
    Holds the module in a list so that the wrapper itself owns no parameters.
    """

    def __init__(self, module: nn.Module, names: list[str], num_inputs: int) -> None:
        super().__init__()
        self._module = [module]
        self.names = names
        self.num_inputs = num_inputs

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...] | torch.Tensor:
        module = self._module[0]
        saved = []
        for name, value in zip(self.names, args[self.num_inputs:]):
            path, _, attr = name.rpartition('.')
            owner = module.get_submodule(path)
            saved.append((owner, attr, owner._parameters[attr]))
            owner._parameters[attr] = value
        try:
            return module(*args[:self.num_inputs])
        finally:
            for owner, attr, param in saved:
                owner._parameters[attr] = param


def _trace(model: Pi05Model, spec: GraphSpec) -> onnx.ModelProto:
    """Trace one graph module; its weights become graph inputs named by their state key."""
    module = GRAPH_MODULES[spec.name](model).eval()
    dynamic_axes = {}
    for t in spec.inputs + spec.outputs:
        axes = {i: d for i, d in enumerate(t.shape) if isinstance(d, str)}
        if axes:
            dynamic_axes[t.name] = axes
    inputs = example_inputs(model, spec.name)
    names, weights = zip(*((n, p.detach()) for n, p in module.named_parameters()))
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')  # tracer and legacy-exporter deprecation notes
        torch.onnx.export(_WeightsAsInputs(module, list(names), len(inputs)),
                          inputs + weights, buffer, dynamo=False, opset_version=ONNX_OPSET,
                          do_constant_folding=True,
                          input_names=[t.name for t in spec.inputs] + list(names),
                          output_names=[t.name for t in spec.outputs],
                          dynamic_axes=dynamic_axes)
    return onnx.load_model_from_string(buffer.getvalue())


def _write_weights(state: dict[str, torch.Tensor],
                   path: Path) -> dict[str, tuple[int, int]]:
    """Write every tensor (sorted keys, 4 KiB aligned); return key -> (offset, length)."""
    locations = {}
    offset = 0
    with open(path, 'wb') as f:
        for key in sorted(state):
            raw = _raw_bytes(state[key])
            pad = -offset % ALIGN_BYTES
            f.write(b'\0' * pad)
            offset += pad
            f.write(raw)
            locations[key] = (offset, len(raw))
            offset += len(raw)
    return locations


def _raw_bytes(t: torch.Tensor) -> bytes:
    """Return the little-endian bytes of ``t`` (ONNX raw_data layout, bfloat16 included)."""
    flat = t.contiguous().cpu().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b''


def _attach_weights(proto: onnx.ModelProto, state: dict[str, torch.Tensor],
                    locations: dict[str, tuple[int, int]] | None, name: GraphName) -> None:
    """Turn the parameter inputs of a traced graph into initializers (raw or external)."""
    graph = proto.graph
    keep = []
    for value in graph.input:
        if not value.name.startswith(_PARAM_PREFIX):
            keep.append(value)
            continue
        key = value.name[len(_PARAM_PREFIX):]
        if key not in state:
            raise RuntimeError(f'{name.value} graph input {value.name!r} is no model weight')
        t = state[key]
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if dims != list(t.shape) or value.type.tensor_type.elem_type != ONNX_DTYPES[
                dtype_name(t.dtype)]:
            raise RuntimeError(f'{name.value} graph input {value.name!r} is {dims}, the '
                               f'weight is {list(t.shape)} {t.dtype}')
        init = onnx.TensorProto(name=value.name, dims=list(t.shape),
                                data_type=ONNX_DTYPES[dtype_name(t.dtype)])
        if locations is None:
            init.raw_data = _raw_bytes(t)
        else:
            offset, length = locations[key]
            init.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (('location', WEIGHTS_FILE), ('offset', str(offset)),
                         ('length', str(length))):
                entry = init.external_data.add()
                entry.key, entry.value = k, v
        graph.initializer.append(init)
    del graph.input[:]
    graph.input.extend(keep)


def _set_signature(proto: onnx.ModelProto, spec: GraphSpec) -> None:
    """Write the spec's exact shapes (named dynamic dims) into the graph inputs / outputs."""
    graph = proto.graph
    values = {v.name: v for v in list(graph.input) + list(graph.output)}
    for t in spec.inputs + spec.outputs:
        if t.name not in values:
            raise RuntimeError(f'exported {spec.name.value} graph lacks {t.name!r} '
                               f'(has {sorted(values)})')
        tensor_type = values[t.name].type.tensor_type
        if tensor_type.elem_type != ONNX_DTYPES[t.dtype]:
            raise RuntimeError(f'{spec.name.value}.{t.name}: exported as ONNX type '
                               f'{tensor_type.elem_type}, spec says {t.dtype}')
        tensor_type.ClearField('shape')
        for d in t.shape:
            dim = tensor_type.shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = d
    if len(graph.input) != len(spec.inputs) or len(graph.output) != len(spec.outputs):
        raise RuntimeError(f'{spec.name.value}: graph has inputs '
                           f'{[v.name for v in graph.input]}, outputs '
                           f'{[v.name for v in graph.output]}; spec differs')


__all__ = ['ALIGN_BYTES', 'ONNX_OPSET', 'WEIGHTS_FILE', 'WeightStorage', 'example_inputs',
           'export_graphs']
