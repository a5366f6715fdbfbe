"""
Peak memory bandwidth and dense bf16 / FP8 tensor throughput of GPUs, for roofline bounds (pure).

Vendor figures, dense (NVIDIA's datasheets quote bf16 and FP8 "with sparsity", twice the dense
rate; the dense rate is what a GEMM of ours can reach). Matched against
``torch.cuda.get_device_name()`` by the first pattern it contains (case-insensitive).

==========================  =========  ============  ===========  ============================
GPU                         GB/s       bf16 TFLOP/s  FP8 TFLOP/s  source
==========================  =========  ============  ===========  ============================
H100 SXM5 80 GB (HBM3)      3350       989           1979         H100 datasheet (1979 / 3958
                                                                  sparse)
H100 NVL 94 GB              3900       835           1670         H100 datasheet (1671 / 3341)
H100 PCIe 80 GB             2000       756           1513         H100 datasheet (1513 / 3026)
H200 SXM 141 GB             4800       989           1979         H200 datasheet (1979 / 3958)
A100 SXM4 80 GB             2039       312           -            A100 datasheet (no FP8)
A100 PCIe 80 GB             1935       312           -            A100 datasheet
A100 40 GB                  1555       312           -            A100 datasheet
L40S                        864        362           733          L40S datasheet (733 / 1466)
L4                          300        121           242          L4 datasheet (242 / 485)
GeForce RTX 4090            1008       165           330          Ada whitepaper (FP32
                                                                  accumulate)
Jetson AGX Thor (T5000)     273        258           517          Jetson Thor spec: 273 GB/s
                                                                  LPDDR5X; 2070 FP4 TFLOP/s
                                                                  sparse / 8 (bf16), / 4 (FP8):
                                                                  FP4 = 2x FP8 = 4x bf16
==========================  =========  ============  ===========  ============================
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """
    One GPU's peaks.

    :ivar bandwidth: bytes/s of device memory.
    :ivar bf16_flops: dense bf16 tensor FLOP/s (float32 accumulate).
    :ivar fp8_flops: dense FP8 (E4M3) tensor FLOP/s (float32 accumulate); None: no FP8 cores.
    """

    name: str
    bandwidth: float
    bf16_flops: float
    source: str
    fp8_flops: float | None = None


def _spec(name: str, gb_s: float, tflops: float, source: str,
          fp8_tflops: float | None = None) -> GpuSpec:
    return GpuSpec(name, gb_s * 1e9, tflops * 1e12, source,
                   fp8_tflops * 1e12 if fp8_tflops else None)


JETSON_AGX_THOR = _spec('Jetson AGX Thor (T5000)', 273, 258.75,
                        'NVIDIA Jetson Thor spec (273 GB/s; 2070 FP4 TFLOP/s sparse: / 8 bf16, '
                        '/ 4 FP8)', 517.5)

GPU_SPECS: tuple[tuple[str, GpuSpec], ...] = (
    ('h100 nvl', _spec('H100 NVL', 3900, 835, 'NVIDIA H100 datasheet', 1670.5)),
    ('h100 pcie', _spec('H100 PCIe 80GB', 2000, 756, 'NVIDIA H100 datasheet', 1513)),
    ('h100', _spec('H100 SXM5 80GB HBM3', 3350, 989, 'NVIDIA H100 datasheet', 1979)),
    ('h200', _spec('H200 SXM 141GB', 4800, 989, 'NVIDIA H200 datasheet', 1979)),
    ('a100 80gb pcie', _spec('A100 PCIe 80GB', 1935, 312, 'NVIDIA A100 datasheet')),
    ('a100-sxm4-80gb', _spec('A100 SXM4 80GB', 2039, 312, 'NVIDIA A100 datasheet')),
    ('a100', _spec('A100 40GB', 1555, 312, 'NVIDIA A100 datasheet')),
    ('l40s', _spec('L40S', 864, 362, 'NVIDIA L40S datasheet', 733)),
    ('l4', _spec('L4', 300, 121, 'NVIDIA L4 datasheet', 242.5)),
    ('rtx 4090', _spec('GeForce RTX 4090', 1008, 165.2, 'NVIDIA Ada architecture whitepaper',
                       330.3)),
    ('thor', JETSON_AGX_THOR),
)
"""(lower-case pattern of the device name, spec), most specific first."""


def lookup_gpu(device_name: str) -> GpuSpec | None:
    """Return the spec of ``torch.cuda.get_device_name()``, or None for an unknown GPU."""
    name = device_name.lower()
    return next((spec for pattern, spec in GPU_SPECS if pattern in name), None)


__all__ = ['GPU_SPECS', 'GpuSpec', 'JETSON_AGX_THOR', 'lookup_gpu']
