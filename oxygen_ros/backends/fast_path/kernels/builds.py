"""
The project's Triton kernels built as Inductor builds them, for a GPU target, with or without it.

Inductor does not launch a user-defined kernel (``wrap_triton``) the way Triton's own launcher
does: it types each argument itself (``torch/_inductor/codegen/triton_utils.py``,
``signature_of``, from ``define_user_defined_triton_kernel``), and since PyTorch PR
pytorch/pytorch#170289 a Python float becomes an ``fp64`` scalar, no longer ``fp32``. A kernel
that builds under Triton's launcher can then fail to build inside a compiled step (the loop
state of an online softmax promoted to fp64:
``docs/gpu.md#kernels-built-as-inductor-builds-them``).
So the check here takes each launch exactly as the callers make it, types it with torch's
own function for the installed torch, runs torch's mutation analysis of ``wrap_triton`` on
it (which tensors the kernel writes: the rest need no copy in a compiled graph) and compiles
it with ``triton.compile`` for a target: the device's, or any other without it (Triton's
bundled ptxas builds a cubin for ``GPUTarget('cuda', 90, 32)`` on a machine with no GPU).

- :func:`model_launches`: the launches of the model's callers of the kernels (a decode step,
  a causal suffix, the fused denoise) for a preset and dtype, recorded on the ``meta`` device
  (``registration.recorded_launches``: nothing allocated, nothing run; ~2 s at full size).
- :func:`inductor_signature`, :func:`mutated_arguments`, :func:`build`: one launch.
- :func:`check_target`: every kernel of a model for a target (``device_check.py`` runs it for
  the device in a child process, for the fast path's warm-up and ``oxygen_doctor``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
import logging
from pathlib import Path
import time
from typing import Any, Iterable, Iterator

from oxygen_ros.backends.fast_path.kernels.registration import Launch, recorded_launches
from oxygen_ros.config import ModelConfig
import torch

_LOG = logging.getLogger(__name__)

HOPPER = ('cuda', 90, 32)
"""The H100's and H200's target: compute capability 9.0 (``sm_90``), 32 threads a warp."""


@dataclass(frozen=True)
class KernelBuild:
    """
    One kernel launch built for one target.

    :ivar kernel: the kernel's name (``_context_partials``).
    :ivar variant: its constexprs that select code (``ROPE``, ``CAUSAL``...), as ``k=v`` text.
    :ivar signature: the argument types Inductor gives it (``{'scale': 'fp64', ...}``).
    :ivar target: ``sm_90``.
    :ivar error: None when it built; else the compiler's error, first line, with its class.
    :ivar registers: registers per thread of the built kernel (None where not built).
    :ivar spills: bytes spilled to local memory (None where not built).
    :ivar mutated: the tensor arguments torch's mutation analysis finds written (None where
        not analysed).
    :ivar seconds: time spent building it.
    """

    kernel: str
    variant: str
    signature: dict[str, str]
    target: str
    error: str | None = None
    registers: int | None = None
    spills: int | None = None
    mutated: tuple[str, ...] | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        """Return one line: kernel, variant, operand dtype, target and how it went."""
        dtypes = sorted({t for n, t in self.signature.items() if n.endswith('_ptr')
                         and t.lstrip('*') in ('bf16', 'fp16', 'fp32')})
        scalars = ', '.join(f'{n} {t}' for n, t in self.signature.items()
                            if t in ('fp32', 'fp64'))
        head = f'{self.kernel} [{self.variant}] {"/".join(d.lstrip("*") for d in dtypes)} ' \
            f'({scalars}) {self.target}'
        if self.ok:
            regs = f', {self.registers} registers' if self.registers is not None else ''
            spill = f', {self.spills} B spilled' if self.spills else ''
            return f'{head}: built in {self.seconds:.1f} s{regs}{spill}'
        return f'{head}: FAILED: {self.error}'


@dataclass
class DeviceBuildCheck:
    """
    Whether the installed Triton builds the model's kernels for a device.

    :ivar ok: every kernel built.
    :ivar target: ``cuda sm_90``, or the device where there is no CUDA target (``cpu``).
    :ivar lines: one per kernel built or failed (:meth:`KernelBuild.line`).
    :ivar reason: why not, in one line (None when ``ok``).
    :ivar builds: the builds themselves.
    """

    ok: bool
    target: str
    lines: list[str] = field(default_factory=list)
    reason: str | None = None
    builds: list[KernelBuild] = field(default_factory=list)


def _meta_inputs(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """Return a ``meta`` model, pool and inputs of the calls :func:`model_launches` makes."""
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.model.pi05 import Pi05Model
    with torch.device('meta'):
        model = Pi05Model(cfg).set_precision(dtype)
    batch, context, suffix = 2, 2 * cfg.image_tokens_per_camera, 8
    pool = KVCache(cfg.vlm, 4 * context, dtype=dtype, device='meta')
    i64, meta = torch.int64, {'device': 'meta'}
    return {'model': model, 'pool': pool, 'batch': batch, 'suffix': suffix,
            'slots': torch.zeros(batch, context, dtype=i64, **meta),
            'mask': torch.ones(batch, context, dtype=torch.bool, **meta),
            'ids': torch.zeros(batch, dtype=i64, **meta)}


def launch_kinds(launches: Iterable[Launch]) -> list[Launch]:
    """Return one launch of each kind (constexprs, argument types, options): the first."""
    kinds: dict[tuple, Launch] = {}
    for launch in launches:
        kinds.setdefault(_kind(launch), launch)
    return list(kinds.values())


def model_launches(cfg: ModelConfig, dtype: torch.dtype) -> list[Launch]:
    """
    Return the kernel launches of the model's callers for ``cfg`` in ``dtype``, one of each kind.

    The callers run on the ``meta`` device with the paged kernel chosen
    (``paged_attention.paged_kernel``): a decode step (``DecodeCall``: the paged attention,
    causal, no RoPE), a causal suffix of 8 tokens (``ExtendCall``) and a fused denoise
    (``DenoiseCall.fused_step``: RoPE on load, bidirectional action tokens, the adaRMS norms).
    Launches that differ only in sizes are one kind: the first is kept.

    :raises RuntimeError: the kernels are Triton's interpreter's (``TRITON_INTERPRET=1``).
    """
    from oxygen_ros.backends.fast_path.kernels import paged_decode
    from oxygen_ros.backends.fast_path.paged_attention import paged_kernel
    from oxygen_ros.backends.fast_path.static_calls import DecodeCall, DenoiseCall, ExtendCall

    if paged_decode.INTERPRETED:
        raise RuntimeError("the kernels are Triton's interpreter's (TRITON_INTERPRET=1 at "
                           'import): there is nothing to build')
    x = _meta_inputs(cfg, dtype)
    model, pool, b, t = x['model'], x['pool'], x['batch'], x['suffix']
    slots, mask, ids = x['slots'], x['mask'], x['ids']
    i64, layers = torch.int64, model.vlm.layers
    with paged_kernel(True), recorded_launches() as launches, torch.inference_mode():
        DecodeCall(model, layers)(pool.k, pool.v, ids, ids, slots, mask)
        ExtendCall(model, layers)(pool.k, pool.v, torch.zeros(b, t, dtype=i64, device='meta'),
                                  torch.ones(b, t, dtype=torch.bool, device='meta'), ids,
                                  slots, mask)
        denoise = DenoiseCall(model)
        denoise.use(True)
        noise = torch.zeros(1, cfg.action_horizon, cfg.action_dim, device='meta')
        denoise(pool.k, pool.v, slots[:1], mask[:1], ids[:1], noise)
    return launch_kinds(launches)


def _kind(launch: Launch) -> tuple:
    """Return what makes two launches build differently: constexprs and argument types."""
    def of(name: str, value: Any) -> Any:
        param = launch.kernel.params[launch.kernel.arg_names.index(name)]
        if param.is_constexpr:
            return value
        return str(value.dtype) if isinstance(value, torch.Tensor) else \
            (type(value).__name__, value == 1)
    return (launch.name, tuple((n, of(n, v)) for n, v in launch.args.items()),
            tuple(sorted(launch.options.items())))


def variant(launch: Launch) -> str:
    """Return the launch's constants as ``k=v`` text: constexprs, and ints equal to 1."""
    def constant(p: Any) -> bool:
        value = launch.args[p.name]
        return p.is_constexpr or (type(value) is int and value == 1)
    return ' '.join(f'{p.name}={launch.args[p.name]}' for p in launch.kernel.params
                    if constant(p))


def inductor_signature(launch: Launch) -> tuple[dict[str, str], dict[str, Any]]:
    """
    Return the argument types and constants Inductor compiles ``launch`` with.

    As ``define_user_defined_triton_kernel`` (``torch/_inductor/codegen/wrapper.py``) does for
    a ``wrap_triton`` kernel: constexprs and ``None`` are constants, an int equal to 1 is a
    constant too, every other argument is typed by torch's ``signature_to_meta`` (tensors by
    their dtype, Python floats as the installed torch types them) inside an Inductor graph
    whose device is CUDA.

    :returns: ``(signature {name: type}, constants {name: value})``.
    """
    from torch._inductor.codegen.common import ArgName, ConstexprArg, SizeArg, TensorArg
    from torch._inductor.codegen.triton_utils import signature_to_meta

    kernel = launch.kernel
    signature: list[Any] = []
    constants: dict[str, Any] = {}
    for i, param in enumerate(kernel.params):
        value = launch.args[param.name]
        if param.is_constexpr or value is None:
            signature.append(ConstexprArg(name=param.name))
            constants[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature.append(TensorArg(name=param.name, buffer=f'arg{i}', dtype=value.dtype))
        else:
            if isinstance(value, int) and not isinstance(value, bool) and value == 1:
                constants[param.name] = 1
            signature.append(SizeArg(param.name, value))
    with _inductor_graph():
        types = signature_to_meta(signature, size_dtype=None,
                                  argdefs=[ArgName(n) for n in kernel.arg_names])
    return types, constants


@contextmanager
def _inductor_graph() -> Iterator[None]:
    """Enter an (empty) Inductor graph whose current device is CUDA: what the typing reads."""
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    graph = GraphLowering(torch.fx.symbolic_trace(_identity))
    with V.set_graph_handler(graph), graph.set_current_device(torch.device('cuda')):
        yield


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class _TargetDriver:
    """Triton's active driver for a target this machine may not have (analysis only)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def is_active(self) -> bool:
        return True


@contextmanager
def active_target(target: Any) -> Iterator[None]:
    """
    Make Triton's active driver report ``target`` while inside (no GPU is touched).

    What torch's analysis of a ``wrap_triton`` kernel asks of the driver, on a machine
    without that GPU (a traced kernel's TTIR is generated for the active target).
    """
    import triton
    driver = triton.runtime.driver
    before = getattr(driver, '_active', None)
    driver.set_active(_TargetDriver(_target(target)))
    try:
        yield
    finally:
        driver.set_active(before)     # None: chosen again on the next use, as before


def mutated_arguments(launch: Launch, target: Any) -> tuple[str, ...]:
    """
    Return the tensor arguments torch's mutation analysis of ``wrap_triton`` finds written.

    The analysis (``torch/_higher_order_ops/triton_kernel_wrap.py``) reads the kernel's TTIR:
    a compiled graph clones exactly these before the launch. Where it cannot analyse a kernel
    it says so (a WARNING of torch's) and assumes every tensor written.
    """
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    kwargs = {n: torch.empty(2, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
              for n, v in launch.args.items()}
    with active_target(target):
        if hasattr(wrap, 'identify_accessed_tensors'):       # torch >= 2.12
            writes = wrap.identify_accessed_tensors(launch.kernel, dict(kwargs), {})
            names = [d.name for d in writes.read_writes.writes]
        else:
            names = wrap.identify_mutated_tensors(launch.kernel, dict(kwargs), {})
    return tuple(sorted(n for n in names if isinstance(launch.args.get(n), torch.Tensor)))


def _target(spec: Any) -> Any:
    from triton.backends.compiler import GPUTarget
    return spec if isinstance(spec, GPUTarget) else GPUTarget(*spec)


def target_name(target: Any) -> str:
    """Return ``sm_90`` for ``GPUTarget('cuda', 90, 32)``."""
    return f'sm_{_target(target).arch}'


def build(launch: Launch, target: Any, *, analyse: bool = True) -> KernelBuild:
    """
    Build ``launch`` for ``target`` as Inductor would; never raises for a failed build.

    :param target: a ``triton.backends.compiler.GPUTarget`` or its ``(backend, arch, warp)``.
    :param analyse: also run torch's mutation analysis (:func:`mutated_arguments`).
    """
    import triton
    from triton.compiler import ASTSource

    target = _target(target)
    types, constants = inductor_signature(launch)
    names = launch.kernel.arg_names
    consts = {(names.index(n),): v for n, v in constants.items()}
    t0 = time.perf_counter()
    out = {'kernel': launch.name, 'variant': variant(launch), 'signature': types,
           'target': target_name(target)}
    try:
        compiled = triton.compile(ASTSource(fn=launch.kernel, signature=types,
                                            constexprs=consts),
                                  target=target, options=dict(launch.options))
        mutated = mutated_arguments(launch, target) if analyse else None
    except Exception as exc:  # noqa: B902 - any compiler error is the finding itself
        first = str(exc).strip().splitlines()
        text = next((ln for ln in reversed(first) if ln.strip()), '') if first else ''
        return KernelBuild(**out, error=f'{type(exc).__name__}: {text[:300]}',
                           seconds=time.perf_counter() - t0)
    regs, spills = _resources(compiled.asm.get('cubin'))
    return KernelBuild(**out, registers=regs, spills=spills, mutated=mutated,
                       seconds=time.perf_counter() - t0)


def _resources(cubin: bytes | None) -> tuple[int | None, int | None]:
    """
    Return a cubin's registers per thread and bytes spilled (stack + local memory).

    Read with the ``cuobjdump -res-usage`` that Triton bundles (no GPU needed); (None, None)
    where it is missing.
    """
    import re
    import subprocess
    import tempfile

    import triton
    tool = Path(triton.__file__).parent / 'backends/nvidia/bin/cuobjdump'
    if not cubin or not tool.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), '-res-usage', f.name], capture_output=True,
                               text=True, check=False).stdout
    found = {k: re.search(rf'{k}:(\d+)', usage) for k in ('REG', 'STACK', 'LOCAL')}
    if found['REG'] is None:
        return None, None
    return int(found['REG'].group(1)), sum(int(m.group(1)) for k, m in found.items()
                                           if k != 'REG' and m is not None)


def check_target(target: Any, cfg: ModelConfig, dtype: torch.dtype, *,
                 analyse: bool = False) -> DeviceBuildCheck:
    """Build every kernel launch of ``cfg`` in ``dtype`` for ``target`` (:func:`build`)."""
    target = _target(target)
    builds = [build(launch, target, analyse=analyse) for launch in model_launches(cfg, dtype)]
    failed = [b for b in builds if not b.ok]
    name = f'{target.backend} {target_name(target)}'
    reason = None
    if failed:
        reason = (f'Triton {triton_version()} cannot build {failed[0].kernel} for {name} '
                  f'({failed[0].error})')
    return DeviceBuildCheck(ok=not failed, target=name, lines=[b.line() for b in builds],
                            reason=reason, builds=builds)


def triton_version() -> str:
    """Return the installed Triton's version, or ``'none'``."""
    try:
        import triton
        return triton.__version__
    except ImportError:
        return 'none'


__all__ = ['DeviceBuildCheck', 'HOPPER', 'KernelBuild', 'active_target', 'build', 'check_target',
           'inductor_signature', 'launch_kinds', 'model_launches',
           'mutated_arguments', 'target_name', 'triton_version', 'variant']
