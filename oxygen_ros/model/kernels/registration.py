"""
How a launcher of Triton kernels becomes a PyTorch operator (``torch.library.triton_op``).

Dynamo and AOTAutograd trace through a ``triton_op``, Inductor calls its kernels from the
generated code (``wrap_triton``) and a CUDA graph captures them. Under ``TRITON_INTERPRET=1``
(CPU tests) the kernels are Triton's interpreter's, which a compiler cannot trace on fake
tensors: the operator is then opaque to the compiler (a shape function and a CPU kernel that
runs the interpreter); without the interpreter the CPU refuses with a clear error.
"""

from __future__ import annotations

from typing import Any, Callable

from torch.library import triton_op
from triton.runtime.interpreter import InterpretedFunction


def is_interpreted(kernel: object) -> bool:
    """Return whether ``kernel`` (a ``triton.jit`` function) runs in Triton's interpreter."""
    return isinstance(kernel, InterpretedFunction)


def kernel_operator(name: str, launch: Callable[..., Any], fake: Callable[..., Any], *,
                    interpreted: bool) -> Any:
    """
    Return ``launch`` registered as the operator ``name`` (``'oxygen_ros::...'``).

    :param launch: takes tensors, launches the kernels with ``wrap_triton`` and returns new
        tensors (it mutates none of its arguments).
    :param fake: the same signature, returns empty tensors of the outputs' shapes (checks
        the arguments as ``launch`` does); used only where ``interpreted``.
    :param interpreted: the kernels run in Triton's CPU interpreter.
    """
    op = triton_op(name, mutates_args=())(launch)

    @op.register_kernel('cpu')
    def _on_the_cpu(*args: Any, **kwargs: Any) -> Any:
        if not interpreted:
            raise ValueError(f'{name} runs on CUDA, or on the CPU under TRITON_INTERPRET=1 '
                             f'set before it is imported')
        return launch(*args, **kwargs)

    if interpreted:
        from torch._subclasses.functional_tensor import FunctionalTensorMode

        op.register_fake(fake)

        def _opaque(mode, func, types, args, kwargs):
            return mode.__torch_dispatch__(func, types, args, kwargs)
        op.register_torch_dispatch(FunctionalTensorMode, _opaque)
    return op


__all__ = ['is_interpreted', 'kernel_operator']
