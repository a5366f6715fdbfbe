"""
How a launcher of Triton kernels becomes a PyTorch operator (``torch.library.triton_op``).

Dynamo and AOTAutograd trace through a ``triton_op``, Inductor calls its kernels from the
generated code (``wrap_triton``) and a CUDA graph captures them. Under ``TRITON_INTERPRET=1``
(CPU tests) the kernels are Triton's interpreter's, which a compiler cannot trace on fake
tensors: the operator is then opaque to the compiler (a shape function and a CPU kernel that
runs the interpreter); without the interpreter the CPU refuses with a clear error.

Every launcher starts its kernels through :func:`launch`, so that :func:`recorded_launches`
can collect what a caller passes (kernel, grid, each argument by name) without running
anything: ``kernels/builds.py`` builds each kernel with exactly those arguments, typed as
Inductor types them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from torch.library import triton_op, wrap_triton
from triton.runtime.interpreter import InterpretedFunction

_recording: list[Launch] | None = None


@dataclass(frozen=True)
class Launch:
    """
    One kernel launch as a launcher asks for it.

    :ivar kernel: the ``triton.jit`` function (``kernel.fn`` is the Python function).
    :ivar grid: the launch grid.
    :ivar args: every argument by the kernel's parameter name, constexprs included.
    :ivar options: launch options (``num_warps``, ``num_stages``).
    """

    kernel: Any
    grid: tuple[int, ...]
    args: dict[str, Any]
    options: dict[str, int]

    @property
    def name(self) -> str:
        """Return the Python name of the kernel (``_context_partials``)."""
        return self.kernel.fn.__name__ if hasattr(self.kernel, 'fn') else self.kernel.__name__


_OPTIONS = ('num_warps', 'num_stages', 'num_ctas')


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
    """
    Launch ``kernel`` on ``grid`` with the arguments through ``wrap_triton`` (or record it).

    Inside :func:`recorded_launches` nothing runs: the launch is appended to its list.
    """
    if _recording is None:
        wrap_triton(kernel)[grid](*args, **kwargs)
        return
    names = list(kernel.arg_names)
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k not in _OPTIONS})
    missing = [n for n in names if n not in bound]
    if missing:
        raise TypeError(f'{kernel.fn.__name__}: no value for {missing}')
    _recording.append(Launch(kernel, tuple(grid), bound,
                             {k: v for k, v in kwargs.items() if k in _OPTIONS}))


@contextmanager
def recorded_launches() -> Iterator[list[Launch]]:
    """
    Collect the launches of the kernels inside this context instead of running them.

    The launchers still return their (empty) outputs, so a caller runs on as usual: with
    tensors on the ``meta`` device a whole model call runs without memory or a GPU.
    """
    global _recording
    before, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = before


def is_interpreted(kernel: object) -> bool:
    """Return whether ``kernel`` (a ``triton.jit`` function) runs in Triton's interpreter."""
    return isinstance(kernel, InterpretedFunction)


def kernel_operator(name: str, launcher: Callable[..., Any], fake: Callable[..., Any], *,
                    interpreted: bool) -> Any:
    """
    Return ``launcher`` registered as the operator ``name`` (``'oxygen_ros::...'``).

    :param launcher: takes tensors, launches the kernels with :func:`launch` and returns new
        tensors (it mutates none of its arguments).
    :param fake: the same signature, returns empty tensors of the outputs' shapes (checks
        the arguments as ``launcher`` does); used only where ``interpreted``.
    :param interpreted: the kernels run in Triton's CPU interpreter.
    """
    op = triton_op(name, mutates_args=())(launcher)

    @op.register_kernel('cpu')
    def _on_the_cpu(*args: Any, **kwargs: Any) -> Any:
        if not interpreted:
            raise ValueError(f'{name} runs on CUDA, or on the CPU under TRITON_INTERPRET=1 '
                             f'set before it is imported')
        return launcher(*args, **kwargs)

    if interpreted:
        from torch._subclasses.functional_tensor import FunctionalTensorMode

        op.register_fake(fake)

        def _opaque(mode, func, types, args, kwargs):
            return mode.__torch_dispatch__(func, types, args, kwargs)
        op.register_torch_dispatch(FunctionalTensorMode, _opaque)
    return op


__all__ = ['Launch', 'is_interpreted', 'kernel_operator', 'launch', 'recorded_launches']
