"""
Peak memory bandwidth and dense bf16 tensor throughput of GPUs, for roofline bounds (pure).

Vendor figures, dense (NVIDIA's datasheets quote bf16 "with sparsity", twice the dense rate;
the dense rate is what a GEMM of ours can reach). Matched against
``torch.cuda.get_device_name()`` by the first pattern it contains (case-insensitive).

==========================  =========  ============  =========================================
GPU                         GB/s       bf16 TFLOP/s  source
==========================  =========  ============  =========================================
H100 SXM5 80 GB (HBM3)      3350       989           H100 datasheet (1979 sparse)
H100 NVL 94 GB              3900       835           H100 datasheet (1671 sparse)
H100 PCIe 80 GB             2000       756           H100 datasheet (1513 sparse)
H200 SXM 141 GB             4800       989           H200 datasheet (1979 sparse)
A100 SXM4 80 GB             2039       312           A100 datasheet
A100 PCIe 80 GB             1935       312           A100 datasheet
A100 40 GB                  1555       312           A100 datasheet
L40S                        864        362           L40S datasheet (733 sparse)
L4                          300        121           L4 datasheet (242 sparse)
GeForce RTX 4090            1008       165           Ada whitepaper (FP32 accumulate)
Jetson AGX Thor (T5000)     273        258           Jetson Thor spec: 273 GB/s LPDDR5X;
                                                     2070 FP4 TFLOP/s sparse / 8 (FP4 = 2x
                                                     FP8 = 4x bf16, sparse = 2x dense)
==========================  =========  ============  =========================================
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """
    One GPU's peaks.

    :ivar bandwidth: bytes/s of device memory.
    :ivar bf16_flops: dense bf16 tensor FLOP/s (float32 accumulate).
    """

    name: str
    bandwidth: float
    bf16_flops: float
    source: str


def _spec(name: str, gb_s: float, tflops: float, source: str) -> GpuSpec:
    return GpuSpec(name, gb_s * 1e9, tflops * 1e12, source)


JETSON_AGX_THOR = _spec('Jetson AGX Thor (T5000)', 273, 258.5,
                        'NVIDIA Jetson Thor spec (273 GB/s; 2070 FP4 TFLOP/s sparse / 8)')

GPU_SPECS: tuple[tuple[str, GpuSpec], ...] = (
    ('h100 nvl', _spec('H100 NVL', 3900, 835, 'NVIDIA H100 datasheet')),
    ('h100 pcie', _spec('H100 PCIe 80GB', 2000, 756, 'NVIDIA H100 datasheet')),
    ('h100', _spec('H100 SXM5 80GB HBM3', 3350, 989, 'NVIDIA H100 datasheet')),
    ('h200', _spec('H200 SXM 141GB', 4800, 989, 'NVIDIA H200 datasheet')),
    ('a100 80gb pcie', _spec('A100 PCIe 80GB', 1935, 312, 'NVIDIA A100 datasheet')),
    ('a100-sxm4-80gb', _spec('A100 SXM4 80GB', 2039, 312, 'NVIDIA A100 datasheet')),
    ('a100', _spec('A100 40GB', 1555, 312, 'NVIDIA A100 datasheet')),
    ('l40s', _spec('L40S', 864, 362, 'NVIDIA L40S datasheet')),
    ('l4', _spec('L4', 300, 121, 'NVIDIA L4 datasheet')),
    ('rtx 4090', _spec('GeForce RTX 4090', 1008, 165.2, 'NVIDIA Ada architecture whitepaper')),
    ('thor', JETSON_AGX_THOR),
)
"""(lower-case pattern of the device name, spec), most specific first."""


def lookup_gpu(device_name: str) -> GpuSpec | None:
    """Return the spec of ``torch.cuda.get_device_name()``, or None for an unknown GPU."""
    name = device_name.lower()
    return next((spec for pattern, spec in GPU_SPECS if pattern in name), None)


__all__ = ['GPU_SPECS', 'GpuSpec', 'JETSON_AGX_THOR', 'lookup_gpu']
