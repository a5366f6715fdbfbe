"""
TensorRT optimization profiles and engine cache keys for the exported graphs (no tensorrt).

Pure Python so that CI checks, without a GPU, that the profiles cover every shape the
engine's job program produces and that cache keys change with everything an engine
depends on.

Profiles (min / opt / max of each dynamic dim):

=============  ===============================================================================
graph          dims
=============  ===============================================================================
``vision``     num_images 1..3 (all camera slots), opt = the preset's cameras
``prefill``    num_cameras 1..3; num_tokens 1..max_token_len
``decode``     profile 0 (decode step): batch 1..max_batch, num_new 1, ctx_len 1..max_ctx;
               profile 1 (text prefill on an image prefix): batch 1, num_new 1..max_token_len,
               ctx_len 1..max_prefix. One engine, two profiles: the VLM weights once.
``denoise``    batch 1; ctx_len fixed at ``denoise_ctx_len`` (padded: one shape, CUDA graph)
``lm_head``    batch 1..max_batch
=============  ===============================================================================

``num_slots`` (the KV pool) is fixed per engine: it is part of the cache key. The limits are
the fast path's (``buckets.EngineLimits``), so both compile for the same largest shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import hashlib
import json

from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.config import CAMERA_SLOTS, ModelConfig
from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName, GraphSpec
from oxygen_ros.tools.tensorrt.onnx_manifest import ExportManifest


class TrtPrecision(enum.Enum):
    """How a TensorRT engine chooses its precisions."""

    GRAPH = 'graph'
    """
    Strongly typed network: every tensor keeps the exported graph's type (export in bfloat16
    or float16 for the fast engines; the float32 islands of the model stay float32). The
    only mode of TensorRT 11, and the default.
    """
    FP16 = 'fp16'
    """TensorRT 10 weak typing: a float32 graph with ``BuilderFlag.FP16`` (removed in 11)."""
    BF16 = 'bf16'
    """TensorRT 10 weak typing: a float32 graph with ``BuilderFlag.BF16`` (removed in 11)."""
    FP8 = 'fp8'
    """Later: needs explicit quantization (Q/DQ nodes from a calibration), not built yet."""


@dataclass(frozen=True, slots=True)
class DimRange:
    """Range of one dynamic dim in a profile: TensorRT's min / opt / max."""

    lo: int
    opt: int
    hi: int

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.opt <= self.hi:
            raise ValueError(f'need 1 <= min <= opt <= max, got {self.lo}, {self.opt}, '
                             f'{self.hi}')

    def contains(self, value: int) -> bool:
        return self.lo <= value <= self.hi


Profile = dict[str, DimRange]
"""Dynamic dim name -> range."""


def denoise_ctx_len(limits: EngineLimits) -> int:
    """Return the fixed (padded) prefix length of the denoise engine: the longest prefix."""
    return limits.max_prefix


def engine_profiles(limits: EngineLimits, cfg: ModelConfig
                    ) -> dict[GraphName, tuple[Profile, ...]]:
    """Return the optimization profiles of every graph (see the module doc)."""
    cams = len(CAMERA_SLOTS)
    opt_cams = min(limits.max_cameras, cams)
    opt_tokens = max(1, limits.max_token_len // 4)
    slots = {'num_slots': DimRange(limits.num_slots, limits.num_slots, limits.num_slots)}
    denoise = denoise_ctx_len(limits)
    return {
        GraphName.VISION: ({'num_images': DimRange(1, opt_cams, cams)},),
        GraphName.PREFILL: ({'num_cameras': DimRange(1, opt_cams, cams),
                             'num_tokens': DimRange(1, opt_tokens, limits.max_token_len)},),
        GraphName.DECODE: (
            {**slots, 'batch': DimRange(1, max(1, limits.max_batch // 2), limits.max_batch),
             'num_new': DimRange(1, 1, 1),
             'ctx_len': DimRange(1, limits.max_ctx // 2, limits.max_ctx)},
            {**slots, 'batch': DimRange(1, 1, 1),
             'num_new': DimRange(1, opt_tokens, limits.max_token_len),
             'ctx_len': DimRange(1, limits.max_prefix // 2, limits.max_prefix)}),
        GraphName.DENOISE: (
            {**slots, 'batch': DimRange(1, 1, 1),
             'ctx_len': DimRange(denoise, denoise, denoise)},),
        GraphName.LM_HEAD: ({'batch': DimRange(1, 1, limits.max_batch)},),
    }


def input_shapes(spec: GraphSpec, profile: Profile
                 ) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """
    Return (min, opt, max) shapes of every input of ``spec`` under ``profile``.

    :raises ValueError: an input dim the profile does not name.
    """
    out = {}
    for t in spec.inputs:
        shapes = []
        for pick in ('lo', 'opt', 'hi'):
            dims = []
            for d in t.shape:
                if isinstance(d, str):
                    if d not in profile:
                        raise ValueError(f'{spec.name.value}.{t.name}: profile lacks dim {d!r}')
                    dims.append(getattr(profile[d], pick))
                else:
                    dims.append(d)
            shapes.append(tuple(dims))
        out[t.name] = (shapes[0], shapes[1], shapes[2])
    return out


def profile_index(profiles: tuple[Profile, ...], dims: dict[str, int]) -> int:
    """
    Return the first profile containing every dim of ``dims``.

    :raises ValueError: none does (the message names the limits, and how to raise them).
    """
    for i, profile in enumerate(profiles):
        if all(profile[k].contains(v) for k, v in dims.items() if k in profile):
            return i
    limits = '; '.join(', '.join(f'{k} {r.lo}..{r.hi}' for k, r in p.items())
                       for p in profiles)
    raise ValueError(f'shape {dims} is outside every TensorRT optimization profile ({limits}); '
                     f'raise max_running_requests / decode_budget so that the engines are '
                     f'rebuilt for it')


def engine_cache_key(manifest: ExportManifest, name: GraphName, profiles: tuple[Profile, ...],
                     precision: TrtPrecision, *, trt_version: str, device_name: str,
                     compute_capability: tuple[int, int], optimization_level: int) -> str:
    """
    Return a SHA-256 naming one engine: everything the serialized engine depends on.

    Weights hash and model config (what was traced), the graph signature, opset, profiles,
    precision, builder optimization level, TensorRT version and the GPU (engines are not
    portable across TensorRT versions or GPU architectures).
    """
    spec = manifest.graphs[name].spec
    doc = {
        'weights_sha256': manifest.weights_sha256, 'model_config': manifest.model_config,
        'dtype': manifest.dtype, 'opset': manifest.opset, 'graph': name.value,
        'inputs': [[t.name, list(t.shape), t.dtype] for t in spec.inputs],
        'outputs': [[t.name, list(t.shape), t.dtype] for t in spec.outputs],
        'profiles': [{k: [r.lo, r.opt, r.hi] for k, r in sorted(p.items())}
                     for p in profiles],
        'precision': precision.value, 'optimization_level': optimization_level,
        'tensorrt': trt_version, 'device': device_name,
        'compute_capability': list(compute_capability),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


__all__ = ['DimRange', 'Profile', 'TrtPrecision', 'denoise_ctx_len', 'engine_cache_key',
           'engine_profiles', 'input_shapes', 'profile_index']
