"""
Triton kernels built for a Hopper GPU (sm_90) on a machine without one.

For the kernel tests' subprocesses (``TRITON_INTERPRET`` unset): :func:`use_hopper` makes
Triton's active driver report an sm_90 target (what the analysis of a traced kernel's writes
asks of it), :func:`resources` compiles one kernel for sm_90 with Triton's bundled ptxas and
reads its registers and spills back with the bundled ``cuobjdump -res-usage``.
"""

from pathlib import Path
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget('cuda', 90, 32)

KINDS = {'q_ptr': '*bf16', 'k_ptr': '*bf16', 'v_ptr': '*bf16', 'out_ptr': '*bf16',
         'slots_ptr': '*i64', 'index_ptr': '*i64', 'keep_ptr': '*i1', 'valid_ptr': '*i1',
         'cos_ptr': '*fp32', 'sin_ptr': '*fp32', 'acc_ptr': '*fp32', 'm_ptr': '*fp32',
         'l_ptr': '*fp32', 'scale': 'fp32', 'x_ptr': '*bf16', 'delta_ptr': '*bf16',
         'gate_ptr': '*fp32', 'mod_ptr': '*fp32', 'x_out_ptr': '*bf16', 'y_ptr': '*bf16',
         'eps': 'fp32'}
"""Argument types of the project's kernels by name (bf16 model, float32 modulations); any
other argument is an int32."""


class _Hopper:

    def get_current_target(self):
        return HOPPER

    def is_active(self):
        return True


def use_hopper():
    """Make Triton's active driver an sm_90 one (nothing runs: there is no GPU)."""
    triton.runtime.driver.set_active(_Hopper())


def resources(fn, consts, num_warps, num_stages):
    """
    Compile ``fn`` for sm_90 with ``consts`` (its constexprs); return its resource usage.

    :returns: ``{'REG': registers per thread, 'STACK': bytes, 'LOCAL': bytes}``: a spill
        shows as a stack frame or local memory.
    """
    signature = {a: 'constexpr' if a in consts else KINDS.get(a, 'i32') for a in fn.arg_names}
    compiled = triton.compile(
        ASTSource(fn=fn, signature=signature,
                  constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}),
        target=HOPPER, options={'num_warps': num_warps, 'num_stages': num_stages})
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(compiled.asm['cubin'])
        f.flush()
        tool = Path(triton.__file__).parent / 'backends/nvidia/bin/cuobjdump'
        usage = subprocess.run([str(tool), '-res-usage', f.name], capture_output=True,
                               text=True, check=True).stdout
    return {key: int(re.search(rf'{key}:(\d+)', usage).group(1))
            for key in ('REG', 'STACK', 'LOCAL')}
