"""
The PyTorch backend: runs a ``SchedulerOutput`` on ``Pi05Model`` over one preallocated KV pool.

All K/V lives in one ``KVCache`` allocated at start-up (``[L, num_slots, Hkv, D]``); every job
reads and writes it through slot indices derived from the block ids of the plan (slot =
block_id * block_size + offset). Nothing is stacked, split or reallocated per request or per
step: a decode batch of requests from different frames and lengths is one ``decode_step``
call per token (on the fast path with no early stop, one graph replay for the job's k tokens:
``decode_steps.py``) whose K/V goes straight into each request's own blocks.

Attention reads of a decode step: the eager model gathers the rows' context slots (one
``index_select`` per layer); the fast path on CUDA reads them in place with the paged Triton
kernel (``backends/fast_path/paged_attention.py``).

A plan may hold the frames of several robots: their vision, prefills and denoise run batched
where shapes agree (``frame_batch.py``), and each chunk is handed over as soon as the call
that made it is done.

On CUDA a cycle does not wait for the GPU between jobs: index tensors go up through pinned
memory without blocking, job times are CUDA events read at the end of the cycle, and the
host waits only for the action chunks (once per denoise call: once for one robot) and for the
sampled token ids at the end, each copied into pinned memory behind an event it waits for.
The camera images come on the device already (the engine's frame inputs,
``engine/frame_inputs.py``). ``execute`` is a generator: it yields each frame's action chunk
the moment it is on the host and goes on with the plan when the caller resumes it, so the
chunk goes up as a value, never through a callback. Models that decode greedily on the device
(``decode_greedy`` / ``lm_greedy``, the compiled fast path) return token ids instead of logits.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
import time
from typing import Callable, cast, Generator, Sequence

from oxygen_ros.backends.async_io import (
    block_slots, ChunkDelivery, JobClock, to_device, TokenCopy)
from oxygen_ros.backends.attention import in_each_step
from oxygen_ros.backends.config import AttentionBackend
from oxygen_ros.backends.frame_batch import plan_calls, prefill_rows, stack_prefixes
from oxygen_ros.backends.greedy import greedy_calls
from oxygen_ros.backends.interface import BackendOutput, FrameInputs, WarmupReport
from oxygen_ros.kv.block_pool import NULL_BLOCK_ID
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.output import (
    DecodeJob, DenoiseJob, JobKind, JobTiming, NewRequestData, PrefillJob, RunnerOutput,
    SchedulerOutput, SeedJob, SegmentKind, SuffixJob, VisionJob)
import torch
import torch.nn.functional as F  # noqa: N812


@dataclass(slots=True)
class _RowState:
    """A running text request: where its tokens go and what it feeds next."""

    slots: torch.Tensor            # int64 [P + max_tokens - 1]: prefix slots, then decode slots
    num_prefix_tokens: int
    num_fed: int                   # generated tokens already fed (their K/V is cached)
    last_token: torch.Tensor       # int64 [] on device: the token to feed next
    use_adapter: bool = False      # the suffix LoRA is active on its tokens


class TorchBackend:
    """
    Executes plans on a ``Pi05Model`` with one ``KVCache`` pool of ``num_blocks`` blocks.

    Implements ``interface.Backend`` (the members' contracts are written there).

    :param sync: called before reading a host timer so that job times are real; None: on
        CUDA, CUDA events (no sync per job), on the CPU a plain timer.
    :param attention: the attention kernel every cycle runs with (``attention.py``).
    :param adapter: OxyGen's suffix LoRA (``model/lora.py``), active on the suffix and the
        decoded tokens of the requests that ask for it (``NewRequestData.use_adapter``).
    """

    model: Pi05Model
    cache: KVCache
    device: torch.device
    block_size: int
    adapter: SuffixLoRA | None
    attention: AttentionBackend

    block_offset = 0
    """Block ids of plans are offset by this many blocks in the pool (:meth:`sharing_pool`)."""

    def __init__(self, model: Pi05Model, num_blocks: int, block_size: int, *,
                 sync: Callable[[], None] | None = None,
                 attention: AttentionBackend = AttentionBackend.AUTO,
                 adapter: SuffixLoRA | None = None) -> None:
        self.model = model
        self.adapter = adapter
        self.device = model.device
        self.block_size = block_size
        self.attention = attention
        self.cache = KVCache(model.cfg.vlm, num_blocks * block_size, dtype=model.dtype,
                             device=self.device)
        self._clock = JobClock(self.device, sync)
        self._decode_in_graph = getattr(model, 'decode_greedy', None) is not None
        self._greedy_decode, self._greedy_seed = greedy_calls(model)
        self._decode_steps = getattr(model, 'decode_greedy_steps', None)
        self._segments: dict[int, PrefixKV] = {}
        self._rows: dict[str, _RowState] = {}
        self._embeds: dict[int, torch.Tensor] = {}
        self._new: dict[str, NewRequestData] = {}
        self._tokens = TokenCopy()

    @property
    def num_live_segments(self) -> int:
        return len(self._segments)

    @property
    def num_live_rows(self) -> int:
        return len(self._rows)

    @property
    def source_model(self) -> Pi05Model:
        """Return the model this backend was built from: its model calls, eager."""
        return self.model

    @property
    def warmup_report(self) -> WarmupReport:
        """Return an empty report: eager PyTorch warms nothing up."""
        return WarmupReport()

    @property
    def guidance_unsupported(self) -> str | None:
        """Return why this backend cannot guide denoising (real-time chunking); None: it can."""
        return None

    @property
    def num_blocks(self) -> int:
        """Return the blocks of the pool that plans may name (from ``block_offset`` on)."""
        return self.cache.num_slots // self.block_size - self.block_offset

    def sharing_pool(self, block_offset: int) -> TorchBackend:
        """
        Return a backend on the same model, graphs and KV pool for a second scheduler.

        Its plans' block ids (null block included) name pool blocks ``block_offset`` on, so
        two engines (OxyGen and isolated in ``oxygen_bench engine``) run interleaved on one
        warm-up of the fast path, whose graphs read the pool by address. Job state is its own.

        :raises ValueError: an offset outside the pool.
        """
        if not 0 < block_offset < self.cache.num_slots // self.block_size:
            raise ValueError(f'block_offset {block_offset} outside the pool of '
                             f'{self.cache.num_slots // self.block_size} blocks')
        other = copy.copy(self)
        other.block_offset = block_offset
        other._segments, other._rows, other._embeds, other._new = {}, {}, {}, {}
        other._tokens = TokenCopy()
        return other

    def execute(self, plan: SchedulerOutput, frames: FrameInputs | Sequence[FrameInputs] | None
                ) -> Generator[tuple[int, torch.Tensor], None, BackendOutput]:
        """
        Run every job of ``plan`` in order, with the backend's attention kernel.

        A generator (``interface.Backend.execute``): it yields ``(frame_id, chunk)`` as soon
        as the call that denoised the frame is done and the chunk is on the host, before the
        jobs that follow it in the plan, and returns the ``BackendOutput`` when the caller
        has run it to its end.

        :param frames: inputs of ``plan.frame_ids`` (required when the plan has vision or
            denoise jobs).
        :raises ValueError: the plan needs a frame it was not given (nothing has run).
        """
        return in_each_step(self.attention, self._execute(plan, frames))

    @torch.inference_mode()
    def _execute(self, plan: SchedulerOutput,
                 frames: FrameInputs | Sequence[FrameInputs] | None
                 ) -> Generator[tuple[int, torch.Tensor], None, BackendOutput]:
        if plan.block_size != self.block_size:
            raise ValueError(f'plan block_size {plan.block_size} != backend {self.block_size}')
        inputs = _frames_of(plan, frames)
        for req_id in plan.finished_req_ids:
            self._rows.pop(req_id, None)
        for seg_id in plan.freed_seg_ids:
            self._segments.pop(seg_id, None)
        self._new = {d.req_id: d for d in plan.new_requests}
        sampled: dict[str, list[torch.Tensor]] = {}
        marks: list[tuple[JobKind, object, object, dict[str, int]]] = []
        # On CUDA with a graph-replaying model, chunks are handed over after the next call
        # is queued: the GPU keeps working while the host publishes.
        chunks = ChunkDelivery(defer=self._clock.events and self._decode_in_graph)
        for call in plan_calls(plan.jobs, inputs):
            t0 = self._clock.mark()
            job, denoised = call[0], None
            if isinstance(job, VisionJob):
                info = self._vision(cast(tuple[VisionJob, ...], call), inputs)
            elif isinstance(job, PrefillJob):
                info = self._prefill(cast(tuple[PrefillJob, ...], call))
            elif isinstance(job, SuffixJob):
                self._suffix(job)
                info = {'batch_size': len(job.rows), 'num_tokens': job.num_tokens}
            elif isinstance(job, DenoiseJob):
                denoised = self._denoise(cast(tuple[DenoiseJob, ...], call), inputs)
                info = {'batch_size': len(call), 'num_tokens': self.model.cfg.num_denoise_steps}
            elif isinstance(job, SeedJob):
                self._seed(job, sampled)
                info = {'batch_size': len(job.req_ids)}
            elif isinstance(job, DecodeJob):
                steps = self._decode(job, sampled)
                info = {'batch_size': len(job.req_ids), 'num_tokens': steps}
            else:  # pragma: no cover - Job is a closed union
                raise TypeError(f'unknown job {job!r}')
            marks.append((job.kind, t0, self._clock.mark(), info))
            yield from chunks.after_call(denoised, [cast(DenoiseJob, j).frame_id for j in call]
                                         if denoised is not None else ())
        yield from chunks.finish()
        self._embeds.clear()
        tokens = self._tokens.to_host(sampled)
        timings = tuple(JobTiming(kind, self._clock.seconds(a, b), **info)
                        for kind, a, b, info in marks)
        forward = sum(t.seconds for t in timings)
        return BackendOutput(RunnerOutput(plan.cycle_id, tokens, timings), chunks.chunks,
                             forward)

    def _vision(self, jobs: tuple[VisionJob, ...], inputs: dict[int, FrameInputs]
                ) -> dict[str, int]:
        """Encode the images of the frames of ``jobs`` (one call); return the timing's info."""
        images = [inputs[job.frame_id].images for job in jobs]
        embeds = self.model.encode_images(
            (images[0] if len(images) == 1 else torch.cat(images)).to(self.cache.dtype))
        for b, job in enumerate(jobs):
            self._embeds[job.emb_id] = embeds[b:b + 1]
        return {'batch_size': sum(i.shape[1] for i in images)}

    def _denoise(self, jobs: tuple[DenoiseJob, ...], inputs: dict[int, FrameInputs]
                 ) -> torch.Tensor:
        """Return the chunks of the frames of ``jobs``, ``[B, H, A]`` (one call)."""
        prefixes = [self._segments[job.seg_ids[-1]] for job in jobs]
        frames = [inputs[job.frame_id] for job in jobs]
        noise = to_device(torch.cat([f.noise for f in frames]) if len(frames) > 1
                          else frames[0].noise, self.device)
        if frames[0].guidance is not None:
            assert len(frames) == 1  # plan_calls runs a guided chunk alone
            return self._guided_denoise(prefixes[0], noise, frames[0].guidance)
        prefix = prefixes[0] if len(prefixes) == 1 else stack_prefixes(prefixes, self._null)
        return self.model.denoise(prefix, noise)

    def _guided_denoise(self, prefix: PrefixKV, noise: torch.Tensor,
                        guidance: RtcGuidance) -> torch.Tensor:
        """
        Denoise with real-time chunking: one vector-Jacobian product through the expert per step.

        On the fast path (``FastPathModel.guided_denoise``) where it has a graph, else eagerly
        with autograd (``model/guidance.py``).
        """
        on_device = replace(guidance, target=to_device(guidance.target, self.device),
                            soft_mask=to_device(guidance.soft_mask, self.device))
        fast = getattr(self.model, 'guided_denoise', None)
        if fast is not None:
            return fast(prefix, noise, on_device)
        return guided_denoise(self.model, prefix, noise, on_device)

    # -- jobs ----------------------------------------------------------------------------
    def _block_slots(self, block_ids: tuple[int, ...], num_tokens: int) -> torch.Tensor:
        offset = self.block_offset
        ids = tuple(b + offset for b in block_ids) if offset else block_ids
        return block_slots(ids, num_tokens, self.block_size, self.device)

    @property
    def _null(self) -> int:
        """Return the null block's first slot: where padded rows point (never read)."""
        return (NULL_BLOCK_ID + self.block_offset) * self.block_size

    def _prefill(self, jobs: tuple[PrefillJob, ...]) -> dict[str, int]:
        """Prefill the segments of ``jobs`` (one call); return the timing's info."""
        slots = [self._block_slots(j.block_ids, j.num_tokens) for j in jobs]
        contexts = embeds = None
        if jobs[0].segment_kind is SegmentKind.TEXT:
            contexts = [self._segments[cast(int, j.parent_seg_id)] for j in jobs]
        else:
            embeds = [self._embeds[cast(int, j.emb_id)] for j in jobs]
        if len(jobs) == 1:
            tokens = to_device([jobs[0].prompt_token_ids], self.device, torch.int64)
            kwargs = {'context': contexts[0]} if contexts else {'image_embeds': embeds[0]}
            # masks None: every camera and prompt token is valid (the model need not check)
            out = [self.model.prefill(tokens, None, cache=self.cache, slots=slots[0][None],
                                      **kwargs)]
        else:
            out = prefill_rows(self.model, self.cache, jobs, slots, self._null,
                               image_embeds=embeds, contexts=contexts)
        for job, prefix in zip(jobs, out):
            self._segments[job.seg_id] = prefix
        return {'batch_size': len(jobs), 'num_tokens': sum(j.num_tokens for j in jobs)}

    def _adapter_rows(self, flags: list[bool]) -> AdapterRows | None:
        """Return the suffix LoRA on the rows whose flag is set (None: no row uses it)."""
        if self.adapter is None or not any(flags):
            return None
        return AdapterRows(self.adapter, to_device(flags, self.device, torch.bool))

    def _suffix(self, job: SuffixJob) -> None:
        """Prefill every row's causal suffix on its root in one batched call."""
        dev = self.device
        rows = job.rows
        parents = [self._segments[r.parent_seg_id] for r in rows]
        lengths = [len(r.prompt_token_ids) for r in rows]
        width, null = max(lengths), self._null
        tokens = to_device([list(r.prompt_token_ids) + [0] * (width - n)
                            for r, n in zip(rows, lengths)], dev, torch.int64)
        own = [self._block_slots(r.block_ids, n) for r, n in zip(rows, lengths)]
        slots = torch.stack([F.pad(o, (0, width - o.numel()), value=null) for o in own])
        # the roots of one robot's frame have one length; of several robots', padded
        context = stack_prefixes(parents, null)
        token_mask = None if min(lengths) == width else to_device(
            [[i < n for i in range(width)] for n in lengths], dev, torch.bool)
        out = self.model.prefill_suffix(tokens, token_mask, context, slots=slots,
                                        adapter=self._adapter_rows([r.use_adapter for r in rows]))
        for b, (row, parent, n) in enumerate(zip(rows, parents, lengths)):
            self._segments[row.seg_id] = PrefixKV(
                self.cache, torch.cat([parent.slots, own[b][None]], 1),
                torch.cat([parent.mask, torch.ones(1, n, dtype=torch.bool, device=dev)], 1),
                parent.num_tokens + n, out.last_hidden[b:b + 1])

    def _seed(self, job: SeedJob, sampled: dict[str, list[torch.Tensor]]) -> None:
        datas = [self._new[req_id] for req_id in job.req_ids]
        prefixes = [self._segments[d.seg_ids[-1]] for d in datas]
        hidden = torch.cat([p.last_hidden for p in prefixes])
        first = self._greedy_seed(hidden)
        for i, (data, prefix) in enumerate(zip(datas, prefixes)):
            if self.device.type == 'cpu':  # a host sync on CUDA: checked on the CPU only
                assert int(prefix.num_tokens[0]) == data.num_prefix_tokens
            decode = self._block_slots(data.block_ids, data.max_tokens - 1)
            self._rows[data.req_id] = _RowState(
                slots=torch.cat([prefix.slots[0, :data.num_prefix_tokens], decode]),
                num_prefix_tokens=data.num_prefix_tokens, num_fed=0, last_token=first[i],
                use_adapter=data.use_adapter)
            sampled.setdefault(data.req_id, []).append(first[i:i + 1])

    def _decode(self, job: DecodeJob, sampled: dict[str, list[torch.Tensor]]) -> int:
        """
        Run up to ``job.max_steps`` greedy steps; return the steps run.

        On the CPU the loop stops early once every row has emitted EOS, or once the previous
        step's wall time says the next one would end after ``job.deadline`` (the first step
        always runs); on CUDA it runs every step (knowing either would need a host sync per
        step; the scheduler drops tokens after EOS, and a row's K/V stays inside the slots
        reserved for its budget). With no early stop asked (CUDA's case) all the steps are one
        call of the model's ``decode_greedy_steps`` where it has one and a graph fits (the
        fast path's k-step graph, ``decode_steps.py``); else one call per step.
        """
        dev = self.device
        rows = [self._rows[req_id] for req_id in job.req_ids]
        num_rows = len(rows)
        steps = to_device(list(job.num_tokens), dev, torch.int64)
        # context length of each row before this job: prefix + tokens already fed
        lengths = [r.num_prefix_tokens + r.num_fed for r in rows]
        base = to_device(lengths, dev, torch.int64)
        width = max(n + s for n, s in zip(lengths, job.num_tokens))
        all_slots = torch.zeros(num_rows, width, dtype=torch.int64, device=dev)
        for i, r in enumerate(rows):
            n = min(width, r.slots.numel())
            all_slots[i, :n] = r.slots[:n]
        tokens = torch.stack([r.last_token for r in rows])
        null = self._null
        eos = job.eos_token_id if dev.type == 'cpu' else None
        deadline = job.deadline if dev.type == 'cpu' else None
        adapter = self._adapter_rows([r.use_adapter for r in rows])
        out = None
        if self._decode_steps is not None and eos is None and deadline is None:
            out = self._decode_steps(tokens, base, steps, all_slots, null, self.cache,
                                     job.max_steps, adapter)
        steps_run = job.max_steps
        if out is None:
            out, steps_run = self._decode_each(job, tokens, base, steps, all_slots, max(lengths),
                                               null, eos, deadline, adapter)
        for i, (req_id, r, n) in enumerate(zip(job.req_ids, rows, job.num_tokens)):
            n = min(n, steps_run)
            r.num_fed += n
            r.last_token = out[i, n - 1]
            sampled.setdefault(req_id, []).append(out[i, :n])
        return steps_run

    def _decode_each(self, job: DecodeJob, tokens: torch.Tensor, base: torch.Tensor,
                     steps: torch.Tensor, all_slots: torch.Tensor, longest: int, null: int,
                     eos: int | None, deadline: float | None, adapter: AdapterRows | None
                     ) -> tuple[torch.Tensor, int]:
        """Run :meth:`_decode`'s steps one call each; return ``(ids [B, k], steps run)``."""
        dev, (num_rows, width) = self.device, all_slots.shape
        cols, row_idx = torch.arange(width, device=dev), torch.arange(num_rows, device=dev)
        out = torch.empty(num_rows, job.max_steps, dtype=torch.int64, device=dev)
        done = torch.zeros(num_rows, dtype=torch.bool, device=dev)
        null_slots = torch.full((num_rows,), null, dtype=torch.int64, device=dev)
        extra = () if adapter is None else (adapter,)
        steps_run, step_s = 0, 0.0
        for s in range(job.max_steps):
            if deadline is not None and s and time.monotonic() + step_s > deadline:
                break  # the rows' other steps run in a later cycle
            t_step = time.monotonic()
            active = s < steps                               # [B] rows with a step left
            pos = base + s                                   # rope position = context length
            write = torch.where(active, all_slots[row_idx, pos.clamp(max=width - 1)], null_slots)
            ctx_len = longest + s
            ctx_slots = all_slots[:, :ctx_len]
            ctx_mask = cols[None, :ctx_len] < pos[:, None]
            tokens = self._greedy_decode(tokens, pos, self.cache, write, ctx_slots, ctx_mask,
                                         *extra)
            out[:, s] = tokens
            steps_run, step_s = s + 1, time.monotonic() - t_step
            if eos is not None:
                done |= tokens == eos
                if bool((done | ~(s + 1 < steps)).all()):
                    break
        return out, steps_run


def _frames_of(plan: SchedulerOutput, frames: FrameInputs | Sequence[FrameInputs] | None
               ) -> dict[int, FrameInputs]:
    """
    Return the inputs by frame id, after checking that every vision and denoise job has its.

    :raises ValueError: a frame the plan encodes or denoises without its inputs.
    """
    given = [] if frames is None else [frames] if isinstance(frames, FrameInputs) else \
        list(frames)
    inputs = {f.frame_id: f for f in given}
    for job in plan.jobs:
        if isinstance(job, (VisionJob, DenoiseJob)) and job.frame_id not in inputs:
            verb = 'encodes' if isinstance(job, VisionJob) else 'denoises'
            raise ValueError(f'plan {plan.cycle_id} {verb} frame {job.frame_id} but got '
                             f'inputs of {sorted(inputs) or None}')
    return inputs
