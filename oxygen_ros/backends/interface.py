"""
The contract between the engine and a backend: what ``Engine`` calls, with shapes and errors.

A backend runs the plan of one control cycle (``SchedulerOutput``, ``sched/output.py``: an
ordered program of vision, prefill, suffix, denoise, seed and decode jobs naming KV blocks)
on the model, over ONE KV pool allocated when it is built, and hands back what the
scheduler needs to go on (``RunnerOutput``: the sampled token ids, the job times) and the
action chunks, one per frame (a plan holds one frame per robot due). The engine owns the
scheduler; the backend holds only tensors: the pool, the
K/V of the live prefix segments (by segment id) and the decode state of the running text
requests (by request id), each released when a plan names it finished or freed. As in vLLM's
split of ``SchedulerInterface`` (``vllm/v1/core/sched/interface.py``) from the model runner,
nothing here plans and nothing in the scheduler touches a tensor.

Implementations: ``torch_backend.TorchBackend`` (eager PyTorch, CPU or CUDA),
``fast_path.backend.FastPathBackend`` (the same job program on the fast path: static shapes,
CUDA graphs) and ``tools/tensorrt/tensorrt_backend.TensorRTBackend`` (never run on TensorRT).
``factory.make_backend`` builds one; ``test/backends/test_interface.py`` checks that each
class has every member below with the same signature.

Threading: a backend is not thread-safe. One thread at a time calls it: the engine's caller
(in the node, the control cycle, under the node's engine lock). Backends made by
:meth:`Backend.sharing_pool` share the model, its graphs and the pool with their origin, so
they too run one at a time, interleaved on one thread (the benchmark's two engines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Mapping, Protocol, runtime_checkable, Sequence, TYPE_CHECKING

if TYPE_CHECKING:
    from oxygen_ros.backends.config import AttentionBackend
    from oxygen_ros.model.guidance import RtcGuidance
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.model.lora import SuffixLoRA
    from oxygen_ros.model.pi05 import Pi05Model
    from oxygen_ros.sched.output import RunnerOutput, SchedulerOutput
    import torch


@dataclass(frozen=True, slots=True)
class FrameInputs:
    """
    Model inputs of one frame (the engine makes them from an observation, ``FrameMaker``).

    A plan over several robots' frames is executed with one of these per frame.

    :ivar frame_id: the frame the plan's vision and denoise jobs name.
    :ivar images: ``float32 [1, N, 3, S, S]`` in [-1, 1] on the backend's device: the valid
        cameras in ``CAMERA_SLOTS`` order as the vision tower takes them (prepared, uploaded
        and resized already).
    :ivar noise: ``float32 [1, H, A]`` initial flow-matching noise of the action chunk
        (host or device).
    :ivar guidance: real-time chunking toward the previous chunk, or None.
    """

    frame_id: int
    images: torch.Tensor
    noise: torch.Tensor
    guidance: RtcGuidance | None = None


@dataclass(frozen=True, slots=True)
class BackendOutput:
    """
    What one :meth:`Backend.execute` produced.

    :ivar runner: the sampled token ids (host ints) and one ``JobTiming`` per backend call
        (a job, or a run of jobs batched), in plan order: what
        ``Scheduler.update_from_output`` takes.
    :ivar chunks: per frame id, ``float32 [1, H, A]`` on the host, its action chunk in the
        model's normalized, padded action space (``Normalizer.actions_to_robot`` maps it to
        the robot); empty when the plan had no denoise job.
    :ivar forward_seconds: the sum of the job times.
    """

    runner: RunnerOutput
    chunks: Mapping[int, torch.Tensor]
    forward_seconds: float

    @property
    def actions(self) -> torch.Tensor | None:
        """
        Return the chunk of a one-frame plan (one robot), None without a denoise job.

        :raises ValueError: the plan denoised several frames (read ``chunks``).
        """
        if len(self.chunks) > 1:
            raise ValueError(f'chunks of frames {sorted(self.chunks)}: read chunks')
        return next(iter(self.chunks.values()), None)


@dataclass(frozen=True, slots=True)
class CompileCacheUse:
    """
    How the fast path's warm-up used the on-disk compile caches (``compile_cache.py``).

    :ivar hits: Inductor FX graph cache hits since the warm-up began (torch's counters).
    :ivar misses: misses (graphs compiled afresh).
    :ivar loaded: the artifact file of this configuration was found and loaded.
    """

    hits: int
    misses: int
    loaded: bool


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """
    What a backend did before its first cycle, reported apart from the control cycles.

    Eager backends report nothing (every field empty, ``seconds`` 0).

    :ivar seconds: wall seconds of the warm-up: compile, capture and gate every graph (the
        fast path), or export, build or load the engines (TensorRT).
    :ivar graphs: fast-path CUDA graphs (or static calls, on the CPU) per step: ``Step``
        value -> number of compiled shapes. A step not named runs eagerly.
    :ivar compiles: Dynamo graphs traced per step at the warm-up (recompiles included; just
        in time or ahead of time).
    :ivar fallbacks: steps asked for on the fast path that run eagerly instead: step ->
        reason (the node shows each on ``/diagnostics``; ``oxygen_bench gpu`` fails on any).
    :ivar compile_cache: the on-disk compile caches' use (None: no Inductor warm-up).
    :ivar loaded: per step, functions compiled ahead of time that were loaded from disk
        instead of traced (``precompile.py``; 0: traced).
    :ivar gate: what the parity gate held the graphs to: eager in float32, or tolerances a
        full gate recorded for these weights (``gate_record.py``).
    :ivar phases: seconds per step, and of the gate's float32 copy (``reference``) or the
        weights' ``fingerprint``.
    :ivar dropped: optional features of the fast path left out (``features.Feature`` value ->
        the first reason): the steps stay compiled without them (the node shows each on
        ``/diagnostics``; ``oxygen_bench gpu`` fails on any).
    :ivar without: per step, the features its graphs run without.
    """

    seconds: float = 0.0
    graphs: Mapping[str, int] = field(default_factory=dict)
    compiles: Mapping[str, int] = field(default_factory=dict)
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    compile_cache: CompileCacheUse | None = None
    loaded: Mapping[str, int] = field(default_factory=dict)
    gate: str = ''
    phases: Mapping[str, float] = field(default_factory=dict)
    dropped: Mapping[str, str] = field(default_factory=dict)
    without: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@runtime_checkable
class Backend(Protocol):
    """
    What the engine, the benchmarks and the tests may use of a backend, and nothing else.

    Built by ``factory.make_backend(config, model, num_blocks)`` (which warms it up): the
    pool holds ``num_blocks`` blocks of ``block_size`` slots, block 0 being the null block
    that padded rows write to.
    """

    model: Pi05Model
    """
    The model calls the jobs run on: ``Pi05Model`` itself (eager), or an object with its
    ``encode_images``, ``prefill``, ``prefill_suffix``, ``denoise``, ``decode_step`` and
    ``lm_logits`` and their shapes (the fast path's ``fast_path.model.FastPathModel``, TensorRT's
    ``GraphRunner``). The benchmarks time these calls on the backend's pool between cycles.
    """
    cache: KVCache
    """The KV pool, ``[L, num_slots, Hkv, D]`` in the model's dtype; never reallocated."""
    device: torch.device
    """Where the pool and every job's tensors live."""
    block_size: int
    """Slots per KV block: a plan's ``block_size`` must equal it."""
    adapter: SuffixLoRA | None
    """OxyGen's memory adapter (suffix LoRA), active on the rows that ask for it; or None."""
    attention: AttentionBackend
    """The attention kernel every cycle runs with (``attention.sdpa_context``)."""

    @property
    def source_model(self) -> Pi05Model:
        """
        Return the ``Pi05Model`` this backend was built from (its weights and config).

        The engine accepts a backend built elsewhere only on its own model (by identity).
        """

    @property
    def num_blocks(self) -> int:
        """Return the blocks of the pool that plans may name (null block included)."""

    @property
    def num_live_segments(self) -> int:
        """Return the prefix segments whose K/V handles are held (released when freed)."""

    @property
    def num_live_rows(self) -> int:
        """Return the text requests whose decode state is held (released when finished)."""

    @property
    def guidance_unsupported(self) -> str | None:
        """
        Return why this backend cannot guide denoising (real-time chunking), or None.

        The engine refuses ``rtc`` up front with this reason, never mid-cycle.
        """

    @property
    def warmup_report(self) -> WarmupReport:
        """Return what the warm-up did (read afresh: compile cache counts move on)."""

    def execute(self, plan: SchedulerOutput,
                frames: FrameInputs | Sequence[FrameInputs] | None
                ) -> Generator[tuple[int, torch.Tensor], None, BackendOutput]:
        """
        Run every job of ``plan`` in order: a generator that yields the chunks, then returns.

        Called once per control cycle with the plan the scheduler just made, and run to its
        end by the caller. The state of ``plan.finished_req_ids`` and ``plan.freed_seg_ids``
        is dropped first. It yields ``(frame_id, chunk)`` for each denoised frame (the chunk
        as in ``BackendOutput.chunks``) as soon as the call that denoised it is done and the
        chunk is on the host, before the jobs that follow it in the plan, so that the caller
        can publish it at once and then resume the plan (nothing calls back up: the chunk
        comes back as a value; a robot's chunk never waits for another robot's guided
        denoise); a plan without a denoise job yields nothing. The frames' vision, prefills
        and denoise may run batched (``frame_batch.py``: the same results as one by one). On
        CUDA the torch backends make the host wait for the device at most once per denoise
        call (for its chunks) and, at the end, for the token ids.

        :param plan: the cycle's plan; its block ids are slots ``block_id * block_size +
            offset`` of the pool.
        :param frames: inputs of ``plan.frame_ids`` (one ``FrameInputs`` alone: one frame);
            required for a frame the plan encodes or denoises, else None.
        :returns: (the generator's return value) the sampled ids, job times and chunks (see
            :class:`BackendOutput`).
        :raises ValueError: a plan this backend cannot run: another ``block_size`` or a
            vision or denoise job without its frame's inputs (nothing has run then), or
            (TensorRT) a shape outside the engines' optimization profiles. The jobs before
            the failing one have run (their K/V is written); the cycle's tokens are lost.
        """

    def sharing_pool(self, block_offset: int) -> Backend:
        """
        Return a backend on the same model, graphs and pool for a second scheduler.

        Its plans' block ids (null block included) name pool blocks ``block_offset`` on; its
        job state is its own. The benchmark runs its isolated and OxyGen engines so, on one
        warm-up of the fast path, whose graphs read the pool by address.

        :raises ValueError: ``block_offset`` outside the pool (0 < offset < its blocks).
        """


__all__ = ['Backend', 'BackendOutput', 'CompileCacheUse', 'FrameInputs', 'WarmupReport']
