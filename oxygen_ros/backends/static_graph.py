"""
One static-shape call on buffers it owns: captured in a CUDA graph on CUDA, called on the CPU.

``StaticCall(fn, fixed, example)`` keeps ``fixed`` tensors by address (the KV pool, read and
written in place) and copies each call's other inputs into buffers of ``example``'s shapes.
On CUDA it warms ``fn`` up on a side stream (compilers and cuBLAS allocate on first use),
then captures one ``torch.cuda.CUDAGraph`` of ``fn`` on those buffers: a call is then a few
``copy_`` into the buffers and one ``replay()``, however many kernels ``fn`` launches. All
graphs of a model share one memory pool (``torch.cuda.graph_pool_handle``): they run one at
a time on one stream, so their intermediate memory can overlap. Outputs live in the graph's
memory and are overwritten by the next replay of the same graph: read or copy them first.

On the CPU (or with ``cuda_graph=False``) a call runs ``fn`` on the same buffers: the
padding, the buffer plumbing and the compiled kernels are the same, only the replay is not.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


class StaticCall:
    """
    ``fn(*fixed, *inputs)`` at one input shape, replayable.

    :param fn: the computation; must not sync with the host or change shapes.
    :param fixed: tensors passed by address (e.g. the KV pool), never copied.
    :param example: one tensor per other input: shape, dtype and device of its buffer.
    :param cuda_graph: capture a CUDA graph (CUDA devices only).
    :param pool: CUDA graph memory pool to share (``torch.cuda.graph_pool_handle()``).
    :param warmup: calls before the capture (first calls compile and allocate workspaces).
    :param dynamic: ``{input index: dims}`` a compiler may keep symbolic (one compiled kernel
        for every bucket of those dims; ``torch._dynamo.maybe_mark_dynamic``).
    :raises RuntimeError: the capture failed (the caller falls back).
    """

    def __init__(self, fn: Callable[..., Any], fixed: Sequence[torch.Tensor],
                 example: Sequence[torch.Tensor], *, cuda_graph: bool, pool: Any = None,
                 warmup: int = 2, dynamic: dict[int, tuple[int, ...]] | None = None) -> None:
        self.fn = fn
        self.fixed = tuple(fixed)
        self.inputs = tuple(t.clone() for t in example)
        for index, dims in (dynamic or {}).items():
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(self.inputs[index], dim)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self.num_calls = 0
        if cuda_graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fn(*self.fixed, *self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.outputs = fn(*self.fixed, *self.inputs)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *inputs: torch.Tensor) -> Any:
        """
        Copy ``inputs`` into the buffers and run (replay).

        :raises ValueError: an input does not have its buffer's shape.
        """
        if len(inputs) != len(self.inputs):
            raise ValueError(f'expected {len(self.inputs)} inputs, got {len(inputs)}')
        for buf, x in zip(self.inputs, inputs):
            if buf.shape != x.shape:
                raise ValueError(f'static input {tuple(buf.shape)} got {tuple(x.shape)}')
            buf.copy_(x, non_blocking=True)
        self.num_calls += 1
        if self.graph is None:
            return self.fn(*self.fixed, *self.inputs)
        self.graph.replay()
        return self.outputs


__all__ = ['StaticCall']
