"""
One static-shape call on buffers it owns: captured in a CUDA graph on CUDA, called on the CPU.

``StaticCall(fn, fixed, example)`` keeps ``fixed`` tensors by address (the KV pool, read and
written in place) and copies each call's other inputs into buffers of ``example``'s shapes.
An input smaller than its buffer (a batch or length below its bucket) is written into the
buffer's leading corner and the rest filled with its padding value, in place: no padded copy
is allocated per call, and a margin still holding that value from the last fill (a decode
context grown by a slot since, the same batch) is not filled again.
On CUDA a :class:`GraphCapture` warms ``fn`` up on its side stream (compilers and cuBLAS
allocate on first use), then captures one ``torch.cuda.CUDAGraph`` of ``fn`` on those
buffers: a call is then a few ``copy_`` into the buffers and one ``replay()``, however many
kernels ``fn`` launches. One ``GraphCapture`` serves every graph of a model: one warm-up side
stream, one memory pool (``torch.cuda.graph_pool_handle``; the graphs run one at a time on
one stream, so their intermediate memory can overlap). Outputs live in the graph's memory and
are overwritten by the next replay of the same graph: read or copy them first.

Capture safety:

- the capture runs with recompiles turned into errors (``torch.compiler.set_stance(
  'fail_on_recompile')``): a guard of a compiled ``fn`` that fails after the warm-up would
  make Dynamo and Inductor compile inside ``torch.cuda.graph``, whose allocations and
  synchronizations corrupt or abort the capture; it raises instead (the caller falls back);
- ``capture_error_mode='thread_local'``: another thread of the process that touches CUDA
  meanwhile (a node's executor threads) does not abort the capture; only this thread's
  unsafe calls do.

On the CPU (or with ``capture=None``) a call runs ``fn`` on the same buffers: the padding,
the buffer plumbing and the compiled kernels are the same, only the replay is not.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable, Sequence

import torch


def no_recompile() -> AbstractContextManager:
    """
    Return a context in which a compiled function that would recompile raises instead.

    ``RuntimeError('Detected recompile when torch.compile stance is ...')`` names the guard
    that failed. Functions never compiled, and eager code, run as usual.
    """
    return torch.compiler.set_stance('fail_on_recompile')


class GraphCapture:
    """
    How :class:`StaticCall` captures CUDA graphs: one side stream and memory pool for all.

    :param pool: CUDA graph memory pool to share (default: a new one).
    :param warmup: calls of ``fn`` on the side stream before its capture (first calls
        compile and allocate workspaces).
    """

    def __init__(self, pool: Any = None, *, warmup: int = 2) -> None:
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.warmup_calls = warmup
        self.stream = self._new_stream()
        self.num_captured = 0

    def _new_stream(self) -> Any:
        return torch.cuda.Stream()

    def _graph(self) -> Any:
        return torch.cuda.CUDAGraph()

    def _capturing(self, graph: Any) -> AbstractContextManager:
        return torch.cuda.graph(graph, pool=self.pool, capture_error_mode='thread_local')

    def _on_side_stream(self) -> AbstractContextManager:
        self.stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self.stream)

    def _join_side_stream(self) -> None:
        torch.cuda.current_stream().wait_stream(self.stream)

    def capture(self, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> tuple[Any, Any]:
        """
        Warm ``fn(*args)`` up on the side stream, then capture it; return (graph, outputs).

        :raises RuntimeError: the capture failed, or ``fn`` would recompile inside it.
        """
        with self._on_side_stream():
            for _ in range(self.warmup_calls):
                fn(*args)
        self._join_side_stream()
        graph = self._graph()
        with no_recompile(), self._capturing(graph):
            outputs = fn(*args)
        self.num_captured += 1
        return graph, outputs


class StaticCall:
    """
    ``fn(*fixed, *inputs)`` at one input shape, replayable.

    :param fn: the computation; must not sync with the host or change shapes.
    :param fixed: tensors passed by address (e.g. the KV pool), never copied.
    :param example: one tensor per other input: shape, dtype and device of its buffer.
    :param capture: capture a CUDA graph with it (CUDA devices only); None: call ``fn``.
    :param dynamic: ``{input index: dims}`` a compiler may keep symbolic (one compiled kernel
        for every bucket of those dims; ``torch._dynamo.maybe_mark_dynamic``).
    :raises RuntimeError: the capture failed, or would have recompiled (the caller falls
        back).
    """

    def __init__(self, fn: Callable[..., Any], fixed: Sequence[torch.Tensor],
                 example: Sequence[torch.Tensor], *, capture: GraphCapture | None = None,
                 dynamic: dict[int, tuple[int, ...]] | None = None) -> None:
        self.fn = fn
        self.fixed = tuple(fixed)
        self.inputs = tuple(t.clone() for t in example)
        for index, dims in (dynamic or {}).items():
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(self.inputs[index], dim)
        self.graph: Any = None
        self.outputs: Any = None
        self.num_calls = 0
        self._extent: list[tuple[tuple[int, ...], Any] | None] = [None] * len(self.inputs)
        """Per buffer: (the extent written since its margin was last filled, the fill)."""
        if capture is not None:
            self.graph, self.outputs = capture.capture(fn, self.fixed + self.inputs)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *inputs: torch.Tensor, pad: Sequence[Any] | None = None) -> Any:
        """
        Copy ``inputs`` into the buffers and run (replay).

        :param pad: per input, the value that fills its buffer beyond the input's size, or
            None (the input must have the buffer's shape); default: None for all.
        :raises ValueError: an input does not have its buffer's shape (or, padded, its rank
            or a larger size).
        """
        if len(inputs) != len(self.inputs):
            raise ValueError(f'expected {len(self.inputs)} inputs, got {len(inputs)}')
        for i, (buf, x) in enumerate(zip(self.inputs, inputs)):
            value = None if pad is None else pad[i]
            if buf.shape == x.shape:
                buf.copy_(x, non_blocking=True)
                self._extent[i] = None
            elif value is None or x.dim() != buf.dim() or \
                    any(n > m for n, m in zip(x.shape, buf.shape)):
                raise ValueError(f'static input {tuple(buf.shape)} got {tuple(x.shape)}')
            else:
                self._write_padded(i, buf, x, value)
        self.num_calls += 1
        if self.graph is None:
            return self.fn(*self.fixed, *self.inputs)
        self.graph.replay()
        return self.outputs

    def _write_padded(self, i: int, buf: torch.Tensor, x: torch.Tensor, value: Any) -> None:
        """Write ``x`` into ``buf``'s leading corner; fill the rest with ``value`` if needed."""
        shape = tuple(x.shape)
        buf[tuple(slice(0, n) for n in shape)].copy_(x, non_blocking=True)
        last = self._extent[i]
        if last is None or last[1] != value or any(n > m for n, m in zip(last[0], shape)):
            for d, n in enumerate(shape):   # the margin, dim by dim
                if n < buf.shape[d]:
                    buf[tuple(slice(0, m) for m in shape[:d]) + (slice(n, None),)].fill_(value)
        # else what was written since the last fill lies inside x's corner: the margin holds
        # ``value`` still
        self._extent[i] = (shape, value)


__all__ = ['GraphCapture', 'StaticCall', 'no_recompile']
