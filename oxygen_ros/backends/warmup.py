"""
The fast path's warm-up: build, capture and gate every graph, kernel source by source.

``CompiledModel.warmup`` (:class:`FastPathWarmup`) sets up the compile caches, the graph
builder and the parity probe, then calls :func:`warm_step` per step with the kernel sources
to try in order: the compiler's kernels compiled ahead of time (``precompile.py``: loaded from
disk on a warm start, no Dynamo trace), the same compiled just in time, then PyTorch's eager
kernels in graphs where graphs are captured. The first source whose every graph builds,
captures and passes the parity gate wins; a source that fails is logged with its reason and
the next is tried; none left: the step runs eagerly (the decode of k steps: step by step, on
the decode graphs), recorded in ``fallbacks``. Functions
loaded from disk that fail are deleted and compiled again once; a step that cannot be
compiled ahead of time is recorded as such in the store (WARNING) and compiled just in time
from then on.

The gate's tolerances come from a float32 copy of the model, or, on a start whose
configuration and weights a full gate has seen, from that gate's record (``gate_record.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import importlib.metadata
import logging
import time
from typing import Any, Callable

from oxygen_ros.backends.compile_cache import cache_root, CompileCache
from oxygen_ros.backends.config import max_autotune_steps, Step
from oxygen_ros.backends.gate_record import GateRecord, weights_fingerprint
from oxygen_ros.backends.graph_builder import GraphBuilder, Kernels
from oxygen_ros.backends.parity import ParityResult
from oxygen_ros.backends.parity_probe import float32_copy, ParityProbe
from oxygen_ros.backends.precompile import ArtifactStore
from oxygen_ros.backends.precompile import available as precompile_available
from oxygen_ros.backends.static_graph import GraphCapture, StaticCall
from oxygen_ros.model.folding import fold_adapter, fold_layers
from oxygen_ros.model.fp8 import describe_quantization
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.paged_attention import decode_attention, load_kernel
from oxygen_ros.model.pi05 import Pi05Model
import torch

_LOG = logging.getLogger('oxygen_ros.backends.compiled')

JUST_IN_TIME = {Step.GUIDED_DENOISE: 'torch 2.13 cannot compile the vector-Jacobian product of '
                                     'the guided step ahead of time in inference mode ("Cannot '
                                     'set version_counter for inference tensor")'}
"""Steps never compiled ahead of time, and why (each start traces them, with a WARNING)."""


@dataclass
class StepOutcome:
    """
    How a step's warm-up ended.

    :ivar kernels: the kernel source its graphs use, or None (the step runs eagerly).
    :ivar worst: the gate's closest call (largest error / tolerance) of those graphs.
    :ivar compiles: Dynamo graphs traced meanwhile (just in time or ahead of time).
    :ivar reasons: why each kernel source tried before (or instead of) it failed.
    """

    kernels: Kernels | None = None
    worst: ParityResult | None = None
    compiles: int = 0
    reasons: list[str] = field(default_factory=list)


def graphs_compiled() -> int:
    """Return Dynamo's count of graphs traced in this process (``aot_compile`` included)."""
    from torch._dynamo.utils import counters
    return int(counters['stats']['unique_graphs'])


def warm_step(step: Step, keys: list[tuple[int, ...]], attempts: list[Kernels], *,
              build: Callable[[tuple[int, ...], Kernels], StaticCall], probe: Any,
              graphs: dict[Step, dict[tuple[int, ...], StaticCall]], bar: Any,
              name: Callable[[Kernels], str],
              on_failure: Callable[[Kernels, str], bool] | None = None) -> StepOutcome:
    """
    Build and gate ``step`` at every shape of ``keys`` with the first kernels that work.

    :param build: makes the graph of a shape with the given kernels.
    :param probe: ``ParityProbe``: ``probe.run(step.value, key)`` gates a shape.
    :param graphs: the model's graphs by step; the step's are registered there while probed
        (the probes call through the fast path) and removed when its kernels fail.
    :param bar: progress bar, one tick per graph gated.
    :param name: the name of a kernel source in logs and reasons.
    :param on_failure: told of each failed source and its reason; True: try it again.
    """
    out, before = StepOutcome(), graphs_compiled()
    i = 0
    while i < len(attempts):
        kernels = attempts[i]
        try:
            graphs[step] = built = {}
            worst = None
            for key in keys:
                built[key] = build(key, kernels)
                result = probe.run(step.value, key)
                if not result.passed:
                    raise RuntimeError(f'parity gate failed: {result.describe()}')
                if worst is None or result.error / max(result.tolerance, 1e-30) > \
                        worst.error / max(worst.tolerance, 1e-30):
                    worst = result
                bar.update()
        except Exception as exc:  # noqa: B902 - any compile/capture/gate failure
            graphs.pop(step, None)
            reason = f'{name(kernels)} kernels: {type(exc).__name__}: {exc}'
            out.reasons.append(reason)
            _LOG.error('fast path: %s with %s', step.value, reason)
            if on_failure is None or not on_failure(kernels, reason):
                i += 1
            continue
        out.kernels, out.worst = kernels, worst
        break
    out.compiles = graphs_compiled() - before
    return out


def _device_name(device: torch.device) -> str:
    if device.type != 'cuda':
        return 'cpu'
    major, minor = torch.cuda.get_device_capability(device)
    return f'{torch.cuda.get_device_name(device)} sm_{major}{minor}'


def _triton() -> str:
    try:
        return importlib.metadata.version('triton')
    except importlib.metadata.PackageNotFoundError:
        return 'none'


class FastPathWarmup:
    """``CompiledModel``'s warm-up (its ``model``, ``shapes``, ``_graphs``, ``steps``...)."""

    model: Pi05Model

    def warmup(self, pool: KVCache, *, progress: bool = True,
               reference: Pi05Model | None = None) -> float:
        """
        Compile (or load), capture and gate every graph on ``pool``; fall back step by step.

        Errors writing the compile caches are logged (ERROR), never raised: they cost the
        next start its cache, not this one its fast path.

        :param pool: the backend's KV pool (graphs read and write it by address; zeroed
            after the gate's probes).
        :param progress: draw a tqdm bar (one tick per graph).
        :param reference: the gate's float32 copy of the model when the caller holds one
            already (``parity_probe.float32_copy``; a full-size copy is 13.4 GB); default:
            one is made for the warm-up and dropped after it, unless the gate's tolerances
            for these weights were recorded (``gate_record.py``).
        :returns: seconds spent, also in ``compile_seconds``.
        """
        from tqdm import tqdm

        t0 = time.perf_counter()
        self._pool, self.fallbacks, self._graphs, self.parity = pool, {}, {}, {}
        self.compiles, self.loaded, self.seconds, self.gate = {}, {}, {}, ''
        steps = self.steps()
        try:
            builder, probe, record = self._set_up(pool, reference, steps)
            capture = GraphCapture() if self.cuda_graphs else None   # one stream, one pool
        except Exception as exc:  # noqa: B902 - no fast path is no reason to stop the robot
            reason = f'fast path set-up failed: {type(exc).__name__}: {exc}; running EAGERLY'
            _LOG.error('%s', reason)
            self.fallbacks = {step.value: reason for step in steps}
            pool.k.zero_()
            pool.v.zero_()
            return time.perf_counter() - t0
        bar = tqdm(total=sum(len(keys) for keys in steps.values()), unit='graph',
                   desc=f'fast path ({self.mode.value})', disable=not progress)
        try:
            with torch.inference_mode(), torch._dynamo.config.patch(
                    recompile_limit=512, accumulated_recompile_limit=8192):
                for step, keys in steps.items():
                    self._warm_step(step, keys, builder, probe, capture, bar)
        finally:
            bar.close()
            pool.k.zero_()
            pool.v.zero_()
        if record is not None:
            record.save(probe.measured)
        del reference, probe
        if self.cache is not None:
            try:
                self.cache.save()
            except Exception as exc:  # noqa: B902 - torch raises more than OSError here
                _LOG.error('cannot write the compile cache (the next start compiles afresh): '
                           '%s: %s', type(exc).__name__, exc)
        self.compile_seconds = time.perf_counter() - t0
        counts = self.cache.counts() if self.cache is not None else None
        _LOG.info('fast path (%s, %s kernels%s) ready in %.1f s: %d graphs, %d traced, %d '
                  'loaded%s; gate: %s%s', self.mode.value, self._kernel_name(self.kernels),
                  ', CUDA graphs' if self.cuda_graphs else '', self.compile_seconds,
                  sum(len(g) for g in self._graphs.values()), sum(self.compiles.values()),
                  sum(self.loaded.values()),
                  f'; compile cache {counts.hits} hits, {counts.misses} misses'
                  if counts else '', self.gate,
                  f'; EAGER: {", ".join(self.fallbacks)}' if self.fallbacks else '')
        return self.compile_seconds

    def _set_up(self, pool: KVCache, reference: Pi05Model | None,
                steps: dict[Step, list[tuple[int, ...]]]
                ) -> tuple[GraphBuilder, ParityProbe, GateRecord | None]:
        """Return the graph builder, the probe and the gate record to write (or None)."""
        if pool.device.type == 'cuda':   # AUTO's paged decode attention: part of the key
            load_kernel(required=False)
        key = self.cache_key()
        if self.kernels is Kernels.INDUCTOR and self._backend == 'inductor':
            self.cache = CompileCache(key)   # before anything of Dynamo fixes Inductor's dir
            self.cache.activate()
        layers, adapter = self.model.vlm.layers, self.adapter
        if self.fold_norms:
            layers = fold_layers(self.model.vlm.layers)
            if adapter is not None:
                adapter = fold_adapter(adapter, self.model.vlm.layers)
        builder = GraphBuilder(self.model, layers, pool, compiler=self._backend,
                               adapter=adapter)
        record, tolerances, why = None, None, ''
        if self.precompile and not precompile_available():
            _LOG.warning('fast path: torch %s cannot load functions compiled ahead of time: '
                         'every step is traced at every start', torch.__version__)
            self.precompile = False
        if self.precompile:
            self.store = builder.store = ArtifactStore(cache_root(), key)
            if self.dtype != torch.float32:     # float32: the floor is the tolerance
                t0 = time.perf_counter()
                record = GateRecord(self.store.dir, weights_fingerprint(self.model))
                self.seconds['fingerprint'] = time.perf_counter() - t0
            if record is not None and reference is None:
                labels = {ParityProbe.label(s.value, k) for s, keys in steps.items()
                          for k in keys}
                tolerances, why = record.tolerances(labels)
        if tolerances is not None:
            record = None                              # nothing new to record
            self.gate = (f'compiled vs eager in {self.dtype} against the tolerances {why}; '
                         f'no float32 copy')
        else:
            if reference is None:
                t0 = time.perf_counter()
                reference = float32_copy(self.model)
                self.seconds['reference'] = time.perf_counter() - t0
            self.gate = 'compiled vs eager against eager in float32' + \
                (f' ({why})' if why else '')
        _LOG.info('fast path: parity gate: %s', self.gate)
        probe = ParityProbe(self, self.model, reference, pool, self.shapes, self.block_size,
                            adapter=self.adapter, tolerances=tolerances)
        return builder, probe, record

    def cache_key(self) -> str:
        """
        Return what the compiled code of this configuration depends on (the caches' key).

        Model config, dtype, quantization, device and GPU (name, capability), compile mode,
        shapes, folded norms, the adapter's rank, the compiler, Triton's version and how
        attention is traced (the attention backend, paged or gathered decode, the SDPA kernels
        enabled) and the steps compiled with ``max_autotune``.
        """
        dev = self.device
        sdpa = ''.join(str(int(f())) for f in (
            torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
            torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled))
        compiler = self._backend if isinstance(self._backend, str) else \
            getattr(self._backend, '__name__', 'custom')
        return (f'{self.cfg!r}|{self.dtype}|{describe_quantization(self.model)}|{dev}|'
                f'{_device_name(dev)}|{self.mode}|{self.shapes}|{self.fold_norms}|adapter rank '
                f'{self.adapter.rank if self.adapter else 0}|{compiler}|triton {_triton()}|'
                f'attention {self.attention.value} decode '
                f'{decode_attention(dev, self.kernels is Kernels.INDUCTOR)} sdpa {sdpa}|'
                f'max_autotune {sorted(s.value for s in max_autotune_steps())}')

    def _warm_step(self, step: Step, keys: list[tuple[int, ...]], builder: GraphBuilder,
                   probe: ParityProbe, capture: GraphCapture | None, bar: Any) -> None:
        t0, store = time.perf_counter(), self.store
        attempts = [self.kernels]
        if self.kernels is Kernels.INDUCTOR:
            refused = store.refused(step.value) if store is not None else None
            if store is not None and step in JUST_IN_TIME:
                refused = JUST_IN_TIME[step]
            if store is not None and refused is None:
                attempts.insert(0, Kernels.PRECOMPILED)
            elif refused is not None:
                _LOG.warning('fast path: %s is compiled just in time (traced at every start): '
                             '%s', step.value, refused)
            if self.cuda_graphs:
                attempts.append(Kernels.EAGER)     # graphs of eager kernels still pay
        retried = False

        def failed(kernels: Kernels, reason: str) -> bool:
            nonlocal retried
            builder.forget(step)
            if kernels is not Kernels.PRECOMPILED or store is None:
                return False
            if store.loaded.get(step.value) and not retried:
                retried = True
                store.drop(step.value)
                _LOG.warning('fast path: %s: the functions loaded from %s failed; compiling '
                             'them again', step.value, store.dir)
                return True
            store.refuse(step.value, reason)
            _LOG.warning('fast path: %s cannot be compiled ahead of time: compiling it just '
                         'in time (traced at every start)', step.value)
            return False

        out = warm_step(step, keys, attempts, probe=probe, graphs=self._graphs, bar=bar,
                        build=lambda key, k: builder.build(step, key, k, capture=capture),
                        name=self._kernel_name, on_failure=failed)
        self.compiles[step.value] = out.compiles
        # the decode of k steps runs the decode step's function (loaded for DECODE)
        source = Step.DECODE if step is Step.DECODE_STEPS else step
        loaded = store.loaded.get(source.value, 0) if store is not None and not retried and \
            out.kernels is Kernels.PRECOMPILED else 0
        self.loaded[step.value] = loaded
        self.seconds[step.value] = time.perf_counter() - t0
        if out.worst is not None:
            self.parity[step.value] = out.worst
        if out.kernels is None:
            steps = step is Step.DECODE_STEPS   # its fallback: the decode graphs, k times
            self.fallbacks[step.value] = '; '.join(out.reasons) + (
                '; decoding step by step' if steps else '; running EAGERLY')
            _LOG.error('fast path: %s %s: %s', step.value, 'decodes step by step' if steps
                       else 'runs EAGERLY (slow)', self.fallbacks[step.value])
            return
        if out.kernels is Kernels.EAGER and self.kernels is not Kernels.EAGER:
            self.fallbacks[step.value] = '; '.join(out.reasons) + \
                '; running eager kernels in graphs'
        _LOG.info('fast path: %s, %d graph(s) with %s kernels in %.1f s (%d traced, %d '
                  'loaded); worst %s', step.value, len(keys), self._kernel_name(out.kernels),
                  self.seconds[step.value], out.compiles, loaded,
                  out.worst.describe() if out.worst else '-')

    def _kernel_name(self, kernels: Kernels) -> str:
        """Return ``eager`` or the compiler's name (``inductor``; tests: ``aot_eager``)."""
        if kernels is Kernels.EAGER:
            return kernels.value
        name = self._backend if isinstance(self._backend, str) else \
            getattr(self._backend, '__name__', 'custom')
        return f'{name} ahead-of-time' if kernels is Kernels.PRECOMPILED else name


__all__ = ['FastPathWarmup', 'JUST_IN_TIME', 'StepOutcome', 'graphs_compiled', 'warm_step']
