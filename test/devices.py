"""
Where the tests of ``test/gpu`` run: their bodies on the CPU in every ``make test``, on CUDA too.

A test of ``test/gpu`` takes ``device`` from :data:`DEVICES`: its ``cpu`` case runs in
``make test`` (so a changed argument or an outdated expected list fails in CI, not on a GPU
lease), its ``cuda`` case carries the ``gpu`` marker (``pytest -m gpu``, the GPU session's
second command) and skips without CUDA. On the CPU the test's subject runs as CI can run it:
Triton kernels in Triton's interpreter (``TRITON_INTERPRET=1``, set by ``test/conftest.py``
without CUDA; its ``tl.dot`` is wrong on bfloat16 operands, so the 16-bit cases take float16
there, :func:`half`), ``torch.compile`` with ``aot_eager`` instead of Inductor
(:func:`compiler`: Inductor's C++ builds take minutes per graph on the CI VM), no CUDA graphs
(the fast path's buffers, padding and routing are the GPU's; nothing is captured). What only
CUDA can run (CUDA graphs as such, ``torch.cuda.set_sync_debug_mode``, pinned uploads,
TensorRT) is :func:`cuda_only`, with the reason.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable, TypeVar

import pytest
import torch

CUDA = torch.cuda.is_available()
NO_CUDA = 'needs a CUDA GPU (torch.cuda.is_available() is False)'
DEVICES = (pytest.param('cpu', id='cpu'),
           pytest.param('cuda', id='cuda', marks=(pytest.mark.gpu,
                                                  pytest.mark.skipif(not CUDA, reason=NO_CUDA))))
"""``@pytest.mark.parametrize('device', DEVICES)``: the CPU case and the CUDA case."""

F = TypeVar('F', bound=Callable)


def cuda_only(why: str) -> Callable[[F], F]:
    """
    Mark a test that runs on CUDA only (``gpu`` marker; skipped without CUDA).

    :param why: what the CPU cannot run of it (docs: each such test says so).
    """
    def mark(test: F) -> F:
        test = pytest.mark.skipif(not CUDA, reason=f'{NO_CUDA}; CUDA only: {why}')(test)
        return pytest.mark.gpu(test)
    return mark


def compiler(device: str) -> str:
    """Return the ``torch.compile`` backend of the test on ``device``: Inductor on CUDA."""
    return 'inductor' if device == 'cuda' else 'aot_eager'


def half(device: str) -> torch.dtype:
    """Return the 16-bit dtype of the Triton kernels' checks: bfloat16 on CUDA, else float16."""
    return torch.bfloat16 if device == 'cuda' else torch.float16


def triton_kernels(device: str) -> ModuleType:
    """
    Return ``fast_path/kernels/paged_decode``, or skip unless its kernels run on ``device``.

    On the CPU they run interpreted, which ``test/conftest.py`` sets up only without CUDA; a
    process with a GPU builds them for the GPU and runs their ``cuda`` cases instead.
    """
    pytest.importorskip('triton', reason='the Triton kernels need triton (requirements/test.txt)')
    from oxygen_ros.backends.fast_path.paged_attention import load_kernel
    load_kernel()
    from oxygen_ros.backends.fast_path.kernels import paged_decode
    if device == 'cpu' and not paged_decode.INTERPRETED:
        pytest.skip('the kernels are built for the GPU in this process (TRITON_INTERPRET unset '
                    'where CUDA is available): their CPU case runs in CI')
    return paged_decode


__all__ = ['CUDA', 'DEVICES', 'compiler', 'cuda_only', 'half', 'triton_kernels']
