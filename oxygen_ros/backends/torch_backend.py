"""
The PyTorch backend: runs a ``SchedulerOutput`` on ``Pi05Model`` over one preallocated KV pool.

All K/V lives in one ``KVCache`` allocated at start-up (``[L, num_slots, Hkv, D]``); every job
reads and writes it through slot indices derived from the block ids of the plan (slot =
block_id * block_size + offset). Nothing is stacked, split or reallocated per request or per
step: a decode batch of requests from different frames and lengths is one ``decode_step``
call per token whose K/V goes straight into each request's own blocks.

Attention reads of a decode step gather the rows' context slots (one ``index_select`` per
layer inside the model); a fused paged-attention kernel (TensorRT, FlashInfer) reads the
blocks in place instead.
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Callable

from oxygen_ros.kv.block_pool import NULL_BLOCK_ID
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.output import (
    DecodeJob, DenoiseJob, JobKind, JobTiming, NewRequestData, PrefillJob, RunnerOutput,
    SchedulerOutput, SeedJob, SegmentKind, VisionJob)
import torch


@dataclass(frozen=True, slots=True)
class FrameInputs:
    """
    Model inputs of one frame (the engine builds them from an ``Observation``).

    :ivar images: ``[1, N, 3, S, S]`` valid cameras only, in ``CAMERA_SLOTS`` order, [-1, 1].
    :ivar noise: ``float32 [1, H, A]`` initial flow-matching noise of the action chunk.
    """

    frame_id: int
    images: torch.Tensor
    noise: torch.Tensor


@dataclass(slots=True)
class _RowState:
    """A running text request: where its tokens go and what it feeds next."""

    slots: torch.Tensor            # int64 [P + max_tokens - 1]: prefix slots, then decode slots
    num_prefix_tokens: int
    num_fed: int                   # generated tokens already fed (their K/V is cached)
    last_token: torch.Tensor       # int64 [] on device: the token to feed next


@dataclass(frozen=True, slots=True)
class BackendOutput:
    """A ``RunnerOutput`` plus the action chunk (normalized, padded) and forward time."""

    runner: RunnerOutput
    actions: torch.Tensor | None
    forward_seconds: float


def block_slots(block_ids: tuple[int, ...], num_tokens: int, block_size: int,
                device: torch.device | str = 'cpu') -> torch.Tensor:
    """
    Return the slot of each of ``num_tokens`` tokens stored in ``block_ids``.

    :returns: ``int64 [num_tokens]``.
    """
    blocks = torch.tensor(block_ids, dtype=torch.int64, device=device)
    offsets = torch.arange(block_size, dtype=torch.int64, device=device)
    return (blocks[:, None] * block_size + offsets).flatten()[:num_tokens]


class TorchBackend:
    """
    Executes plans on a ``Pi05Model`` with one ``KVCache`` pool of ``num_blocks`` blocks.

    :param sync: called before reading a timer (``torch.cuda.synchronize`` on CUDA) so that
        job times are real; defaults to a no-op on CPU.
    """

    def __init__(self, model: Pi05Model, num_blocks: int, block_size: int, *,
                 sync: Callable[[], None] | None = None) -> None:
        self.model = model
        self.device = model.device
        self.block_size = block_size
        self.cache = KVCache(model.cfg.vlm, num_blocks * block_size, dtype=model.dtype,
                             device=self.device)
        if sync is None and self.device.type == 'cuda':
            sync = torch.cuda.synchronize
        self._sync = sync or (lambda: None)
        self._segments: dict[int, PrefixKV] = {}
        self._rows: dict[str, _RowState] = {}
        self._embeds: dict[int, torch.Tensor] = {}
        self._new: dict[str, NewRequestData] = {}

    @property
    def num_live_segments(self) -> int:
        return len(self._segments)

    @property
    def num_live_rows(self) -> int:
        return len(self._rows)

    @property
    def fallbacks(self) -> dict[str, str]:
        """Return compiled steps that run eagerly instead (step -> reason); empty if none."""
        return dict(getattr(self.model, 'fallbacks', {}))

    def _timer(self) -> float:
        self._sync()
        return time.perf_counter()

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput, frame: FrameInputs | None, *,
                on_actions: Callable[[torch.Tensor], None] | None = None) -> BackendOutput:
        """
        Run every job of ``plan`` in order.

        :param frame: inputs of ``plan.frame_id`` (required when the plan has vision jobs).
        :param on_actions: called with the action chunk as soon as it is denoised, before
            the text jobs that follow it in the plan (so it can be published at once).
        :raises ValueError: the plan needs a frame it was not given.
        """
        for req_id in plan.finished_req_ids:
            self._rows.pop(req_id, None)
        for seg_id in plan.freed_seg_ids:
            self._segments.pop(seg_id, None)
        if plan.block_size != self.block_size:
            raise ValueError(f'plan block_size {plan.block_size} != backend {self.block_size}')
        self._new = {d.req_id: d for d in plan.new_requests}
        sampled: dict[str, list[torch.Tensor]] = {}
        timings: list[JobTiming] = []
        actions = None
        forward = 0.0
        for job in plan.jobs:
            if isinstance(job, VisionJob):
                if frame is None or frame.frame_id != job.frame_id:
                    raise ValueError(f'plan {plan.cycle_id} encodes frame {job.frame_id} but '
                                     f'got inputs of {frame.frame_id if frame else None}')
                t0 = self._timer()
                self._embeds[job.emb_id] = self.model.encode_images(
                    frame.images.to(self.cache.dtype))
                dt = self._timer() - t0
                timings.append(JobTiming(JobKind.VISION, dt, batch_size=frame.images.shape[1]))
            elif isinstance(job, PrefillJob):
                dt = self._prefill(job)
                timings.append(JobTiming(JobKind.PREFILL, dt, num_tokens=job.num_tokens))
            elif isinstance(job, DenoiseJob):
                assert frame is not None and frame.frame_id == job.frame_id
                prefix = self._segments[job.seg_ids[-1]]
                t0 = self._timer()
                actions = self.model.denoise(prefix, frame.noise)
                dt = self._timer() - t0
                timings.append(JobTiming(JobKind.DENOISE, dt,
                                         num_tokens=self.model.cfg.num_denoise_steps))
                if on_actions is not None:
                    on_actions(actions)
            elif isinstance(job, SeedJob):
                dt = self._seed(job, sampled)
                timings.append(JobTiming(JobKind.SEED, dt, batch_size=len(job.req_ids)))
            elif isinstance(job, DecodeJob):
                dt, steps = self._decode(job, sampled)
                timings.append(JobTiming(JobKind.DECODE, dt, batch_size=len(job.req_ids),
                                         num_tokens=steps))
            else:  # pragma: no cover - Job is a closed union
                raise TypeError(f'unknown job {job!r}')
            forward += dt
        self._embeds.clear()
        tokens = {req_id: tuple(torch.cat(parts).tolist()) for req_id, parts in sampled.items()}
        return BackendOutput(RunnerOutput(plan.cycle_id, tokens, tuple(timings)), actions,
                             forward)

    # -- jobs ----------------------------------------------------------------------------
    def _prefill(self, job: PrefillJob) -> float:
        dev = self.device
        slots = block_slots(job.block_ids, job.num_tokens, self.block_size, dev)[None]
        tokens = torch.tensor([job.prompt_token_ids], dtype=torch.int64, device=dev)
        token_mask = torch.ones_like(tokens, dtype=torch.bool)
        if job.segment_kind is SegmentKind.TEXT:
            assert job.parent_seg_id is not None
            kwargs = {'context': self._segments[job.parent_seg_id]}
        else:
            assert job.emb_id is not None
            embeds = self._embeds[job.emb_id]
            kwargs = {'image_embeds': embeds,
                      'image_mask': torch.ones(embeds.shape[:2], dtype=torch.bool, device=dev)}
        t0 = self._timer()
        prefix = self.model.prefill(tokens, token_mask, cache=self.cache, slots=slots, **kwargs)
        dt = self._timer() - t0
        self._segments[job.seg_id] = prefix
        return dt

    def _seed(self, job: SeedJob, sampled: dict[str, list[torch.Tensor]]) -> float:
        datas = [self._new[req_id] for req_id in job.req_ids]
        prefixes = [self._segments[d.seg_ids[-1]] for d in datas]
        t0 = self._timer()
        hidden = torch.cat([p.last_hidden for p in prefixes])
        first = self.model.lm_logits(hidden).argmax(dim=-1)
        dt = self._timer() - t0
        for i, (data, prefix) in enumerate(zip(datas, prefixes)):
            assert int(prefix.num_tokens[0]) == data.num_prefix_tokens
            decode = block_slots(data.block_ids, data.max_tokens - 1, self.block_size,
                                 self.device)
            self._rows[data.req_id] = _RowState(
                slots=torch.cat([prefix.slots[0, :data.num_prefix_tokens], decode]),
                num_prefix_tokens=data.num_prefix_tokens, num_fed=0, last_token=first[i])
            sampled.setdefault(data.req_id, []).append(first[i:i + 1])
        return dt

    def _decode(self, job: DecodeJob,
                sampled: dict[str, list[torch.Tensor]]) -> tuple[float, int]:
        dev = self.device
        rows = [self._rows[req_id] for req_id in job.req_ids]
        num_rows = len(rows)
        steps = torch.tensor(job.num_steps, dtype=torch.int64, device=dev)
        # context length of each row before this job: prefix + tokens already fed
        lengths = [r.num_prefix_tokens + r.num_fed for r in rows]
        base = torch.tensor(lengths, dtype=torch.int64, device=dev)
        longest = max(lengths)
        width = max(n + s for n, s in zip(lengths, job.num_steps))
        all_slots = torch.zeros(num_rows, width, dtype=torch.int64, device=dev)
        for i, r in enumerate(rows):
            n = min(width, r.slots.numel())
            all_slots[i, :n] = r.slots[:n]
        cols = torch.arange(width, device=dev)
        row_idx = torch.arange(num_rows, device=dev)
        tokens = torch.stack([r.last_token for r in rows])
        out = torch.empty(num_rows, job.max_steps, dtype=torch.int64, device=dev)
        done = torch.zeros(num_rows, dtype=torch.bool, device=dev)
        null_slots = torch.full((num_rows,), NULL_BLOCK_ID * self.block_size, dtype=torch.int64,
                                device=dev)
        eos = job.eos_token_id
        t0 = self._timer()
        steps_run = 0
        for s in range(job.max_steps):
            active = s < steps                               # [B] rows with a step left
            pos = base + s                                   # rope position = context length
            write = torch.where(active, all_slots[row_idx, pos.clamp(max=width - 1)], null_slots)
            ctx_len = longest + s
            ctx_slots = all_slots[:, :ctx_len]
            ctx_mask = cols[None, :ctx_len] < pos[:, None]
            logits = self.model.decode_step(tokens, pos, self.cache, write, ctx_slots, ctx_mask)
            tokens = logits.argmax(dim=-1)
            out[:, s] = tokens
            steps_run = s + 1
            if eos is not None:
                done |= tokens == eos
                if bool((done | ~(s + 1 < steps)).all()):
                    break
        dt = self._timer() - t0
        for i, (req_id, r, n) in enumerate(zip(job.req_ids, rows, job.num_steps)):
            n = min(n, steps_run)
            r.num_fed += n
            r.last_token = out[i, n - 1]
            sampled.setdefault(req_id, []).append(out[i, :n])
        return dt, steps_run
