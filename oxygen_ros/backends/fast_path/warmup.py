"""
The fast path's warm-up: build, capture and gate every graph, one feature dropped at a time.

``FastPathModel.warmup`` (:class:`FastPathWarmup`) checks which optional features the steps
would use (``features.py``; on CUDA the Triton kernels' build for the device first,
``kernels/device_check.py``), sets up the compile caches, the graph builder and the
parity probe, then calls ``attempts.warm_step`` per step. The first attempt is the
compiler's kernels compiled ahead of time (``precompile.py``: loaded from disk on a warm start,
no Dynamo trace), else just in time, without the features already dropped. After a failure
(:meth:`FastPathWarmup._next_attempt`): the feature the error names is dropped (from every
later step when it failed to build, from this step when it missed the gate); otherwise
functions loaded from disk are compiled again once, then just in time; just in time, the
step's features are dropped one at a time; then PyTorch's eager kernels in graphs where graphs
are captured; none left: the step runs eagerly (the decode of k steps: step by step, on the
decode graphs), recorded in ``fallbacks``. Each drop is said once (ERROR) and kept in
``dropped`` (feature -> reason) and ``without`` (step -> features). A step that cannot be
compiled ahead of time is recorded as such in the store (WARNING) and compiled just in time
from then on.

The gate's tolerances come from a float32 copy of the model, or, on a start whose
configuration and weights a full gate has seen, from that gate's record (``gate_record.py``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import time
from typing import Any

from oxygen_ros.backends.config import max_autotune_steps, Step
from oxygen_ros.backends.fast_path.attempts import Attempt, GateFailure, short, warm_step
from oxygen_ros.backends.fast_path.compile_cache import cache_root, CompileCache
from oxygen_ros.backends.fast_path.features import blame, describe, Feature, ORDER, STEP_FEATURES
from oxygen_ros.backends.fast_path.folding import fold_adapter, fold_layers
from oxygen_ros.backends.fast_path.gate_record import GateRecord, weights_fingerprint
from oxygen_ros.backends.fast_path.graph_builder import GraphBuilder, Kernels
from oxygen_ros.backends.fast_path.paged_attention import decode_attention, load_kernel
from oxygen_ros.backends.fast_path.parity_probe import ParityProbe
from oxygen_ros.backends.fast_path.precompile import ArtifactStore
from oxygen_ros.backends.fast_path.precompile import available as precompile_available
from oxygen_ros.backends.fast_path.static_graph import GraphCapture
from oxygen_ros.backends.parity import float32_copy
from oxygen_ros.model.fp8 import describe_quantization
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import Pi05Model
import torch

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')

JUST_IN_TIME = {Step.GUIDED_DENOISE: 'torch 2.13 cannot compile the vector-Jacobian product of '
                                     'the guided step ahead of time in inference mode ("Cannot '
                                     'set version_counter for inference tensor")'}
"""Steps never compiled ahead of time, and why (each start traces them, with a WARNING)."""


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
    """``FastPathModel``'s warm-up (its ``model``, ``shapes``, ``_graphs``, ``steps``...)."""

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
        self.dropped, self.without, self._global_off = {}, {}, set()
        steps = self.steps()
        try:
            self._in_use = self._features_in_use()
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
                  'loaded%s; gate: %s%s%s', self.mode.value, self._kernel_name(self.kernels),
                  ', CUDA graphs' if self.cuda_graphs else '', self.compile_seconds,
                  sum(len(g) for g in self._graphs.values()), sum(self.compiles.values()),
                  sum(self.loaded.values()),
                  f'; compile cache {counts.hits} hits, {counts.misses} misses'
                  if counts else '', self.gate,
                  f'; EAGER: {", ".join(self.fallbacks)}' if self.fallbacks else '',
                  f'; WITHOUT: {", ".join(self.dropped)}' if self.dropped else '')
        return self.compile_seconds

    def _features_in_use(self) -> set[Feature]:
        """
        Return the optional features the steps would use; check the paged kernel's build.

        On CUDA the model's Triton kernels are built first for the device as Inductor types
        them (``kernels/builds.py``): where the installed Triton cannot (an old Triton
        on Jetson Thor's sm_110, say), they are left out with one line, before any step
        spends a compile on them.
        """
        from oxygen_ros.model.flex import prefill_attention
        from oxygen_ros.model.fp8 import Fp8Kernel, fp8_kernel_of

        compiled = self.kernels is not Kernels.EAGER
        used = set()
        if self.device.type == 'cuda':
            load_kernel(required=False)
        if decode_attention(self.device, compiled) == 'paged':
            used.add(Feature.PAGED_ATTENTION)
        if prefill_attention(self.device, compiled) == 'flex':
            used.add(Feature.FLEX_ATTENTION)
        if fp8_kernel_of(self.model) is Fp8Kernel.SCALED_MM:
            used.add(Feature.FP8_MATMUL)
        if Feature.PAGED_ATTENTION in used and self.device.type == 'cuda':
            from oxygen_ros.backends.fast_path.kernels.device_check import check_device
            t0 = time.perf_counter()
            check = check_device(self.device, self.cfg, self.dtype)
            self.seconds['kernel_check'] = time.perf_counter() - t0
            if not check.ok:
                self._drop(Feature.PAGED_ATTENTION, f'kernel build check: {check.reason}')
                self._global_off.add(Feature.PAGED_ATTENTION)
        return used

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

    def _drop(self, feature: Feature, reason: str, step: Step | None = None) -> None:
        """Leave ``feature`` out of ``step`` (None: of every step from now on), said once."""
        if feature.value not in self.dropped:
            self.dropped[feature.value] = reason
            _LOG.error('fast path: %s left out%s: %s', feature.description,
                       f' of {step.value}' if step is not None else ' of every step', reason)

    def _first_attempt(self, step: Step) -> Attempt:
        """Return the step's first attempt: the configured kernels, without dropped features."""
        off = frozenset(f for f in STEP_FEATURES[step] if f in self._global_off
                        and f in self._in_use)
        store = self.store
        if self.kernels is Kernels.INDUCTOR and store is not None:
            refused = JUST_IN_TIME.get(step) or store.refused(step.value)
            if refused is None:
                return Attempt(Kernels.PRECOMPILED, off)
            _LOG.warning('fast path: %s is compiled just in time (traced at every start): %s',
                         step.value, refused)
        return Attempt(self.kernels, off)

    def _next_attempt(self, step: Step, attempt: Attempt, exc: BaseException,
                      builder: GraphBuilder, state: dict[str, bool]) -> Attempt | None:
        """
        Return what to try after ``attempt`` failed with ``exc`` (None: run eagerly).

        A failure that names a feature the step uses (``features.blame``) drops that feature
        and keeps the kernels: from every later step too when it failed to build, from this
        step only when it missed the gate. Otherwise: functions loaded from disk are compiled
        again once, then just in time; just in time, the step's features are dropped one at a
        time (``features.ORDER``); then eager kernels in graphs (with CUDA graphs), then none.
        """
        builder.forget(step)
        usable = [f for f in ORDER if f in STEP_FEATURES[step] and f in self._in_use
                  and f not in attempt.off]
        named = [f for f in blame(exc) if f in usable]
        gate = isinstance(exc, GateFailure)
        if named:
            feature = named[0]
            if not gate:                          # a build that failed is not tried again
                self._global_off.add(feature)
            self._drop(feature, f'{step.value}: {short(exc)}', step if gate else None)
            return Attempt(attempt.kernels, attempt.off | {feature})
        store = self.store
        if attempt.kernels is Kernels.PRECOMPILED and store is not None:
            if store.loaded.get(step.value) and not state.get('retried'):
                state['retried'] = True
                store.drop(step.value)
                _LOG.warning('fast path: %s: the functions loaded from %s failed; compiling '
                             'them again', step.value, store.dir)
                return attempt
            store.refuse(step.value, f'{short(exc)}')
            _LOG.warning('fast path: %s cannot be compiled ahead of time: compiling it just '
                         'in time (traced at every start)', step.value)
            return Attempt(Kernels.INDUCTOR, attempt.off)
        if attempt.kernels is not Kernels.EAGER and usable:   # a guess: for this step only
            self._drop(usable[0], f'{step.value}: {short(exc)}', step)
            return Attempt(attempt.kernels, attempt.off | {usable[0]})
        if attempt.kernels is not Kernels.EAGER and self.cuda_graphs:
            return Attempt(Kernels.EAGER, attempt.off)   # graphs of eager kernels still pay
        return None

    def _warm_step(self, step: Step, keys: list[tuple[int, ...]], builder: GraphBuilder,
                   probe: ParityProbe, capture: GraphCapture | None, bar: Any) -> None:
        t0, store, state = time.perf_counter(), self.store, {}
        out = warm_step(step, keys, self._first_attempt(step), probe=probe,
                        graphs=self._graphs, bar=bar,
                        build=lambda key, a: builder.build(step, key, a.kernels,
                                                           capture=capture, off=a.off),
                        name=self._attempt_name,
                        next_attempt=lambda a, exc: self._next_attempt(step, a, exc, builder,
                                                                       state))
        self.compiles[step.value] = out.compiles
        # the decode of k steps runs the decode step's function (loaded for DECODE)
        source = Step.DECODE if step is Step.DECODE_STEPS else step
        loaded = store.loaded.get(source.value, 0) if store is not None and \
            not state.get('retried') and out.kernels is Kernels.PRECOMPILED else 0
        self.loaded[step.value] = loaded
        self.seconds[step.value] = time.perf_counter() - t0
        if out.worst is not None:
            self.parity[step.value] = out.worst
        if out.off:
            self.without[step.value] = tuple(f.value for f in ORDER if f in out.off)
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
        _LOG.info('fast path: %s, %d graph(s) with %s kernels%s in %.1f s (%d traced, %d '
                  'loaded); worst %s', step.value, len(keys), self._kernel_name(out.kernels),
                  f' {describe(out.off)}' if out.off else '', self.seconds[step.value],
                  out.compiles, loaded, out.worst.describe() if out.worst else '-')

    def _attempt_name(self, attempt: Attempt) -> str:
        """Return ``inductor kernels`` or ``... without FlexAttention``, for logs."""
        text = f'{self._kernel_name(attempt.kernels)} kernels'
        return f'{text} {describe(attempt.off)}' if attempt.off else text

    def _kernel_name(self, kernels: Kernels) -> str:
        """Return ``eager`` or the compiler's name (``inductor``; tests: ``aot_eager``)."""
        if kernels is Kernels.EAGER:
            return kernels.value
        name = self._backend if isinstance(self._backend, str) else \
            getattr(self._backend, '__name__', 'custom')
        return f'{name} ahead-of-time' if kernels is Kernels.PRECOMPILED else name


__all__ = ['FastPathWarmup', 'JUST_IN_TIME']
