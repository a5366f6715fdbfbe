"""The paged attention kernel for CPU tests: Triton's interpreter, or a skip saying why."""

import importlib

import pytest


def interpreted_kernel():
    """
    Return ``paged_decode`` with its kernels in Triton's CPU interpreter, or skip.

    ``test/conftest.py`` sets ``TRITON_INTERPRET=1`` without CUDA; a process with a GPU runs
    the compiled kernels and skips these CPU checks (``test/gpu`` has its own).
    """
    pytest.importorskip('triton', reason='the paged attention kernel needs triton '
                                         '(requirements/test.txt)')
    module = importlib.import_module('oxygen_ros.model.kernels.paged_decode')
    if not module.INTERPRETED:
        pytest.skip('the kernels are compiled for the GPU in this process (TRITON_INTERPRET '
                    'unset: the CPU checks run in the interpreter)')
    return module
