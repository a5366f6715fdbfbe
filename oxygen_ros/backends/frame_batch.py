"""
Several robots' frames through one model call: which jobs of a plan run together, and how.

A plan over the frames of several robots (``sched/output.py``) brings their action path stage
by stage: every frame's ``VisionJob``, then their ``PrefillJob`` s one chain level at a time,
then every ``DenoiseJob``. :func:`plan_calls` cuts a plan into *calls*: a run of consecutive
jobs of one kind on distinct frames (none depends on another) is split by shape into groups,
each run as one batched model call; every other job is a call of its own:

=======  ================================================================  ============
jobs     one call when                                                     shape
=======  ================================================================  ============
vision   the frames have as many cameras                                   B x N images
prefill  one segment kind, as many cameras; prompts padded to the longest  B rows
denoise  unguided (a guided chunk, its own target and mask: alone, after)  B chunks
=======  ================================================================  ============

A one-frame plan is one job per call, the calls of before. The batched calls equal the frames
run one by one up to summation order (float32: 1e-5, ``test/backends/test_frame_batch.py``):
padding is masked and the rows of a prefix are cut back to their own tokens afterwards.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence, TYPE_CHECKING

from oxygen_ros.backends.async_io import to_device
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.sched.output import DenoiseJob, Job, PrefillJob, VisionJob
import torch
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:
    from oxygen_ros.backends.interface import FrameInputs
    from oxygen_ros.model.pi05 import Pi05Model

_BATCHED = (VisionJob, PrefillJob, DenoiseJob)


def plan_calls(jobs: Sequence[Job], frames: Mapping[int, FrameInputs]
               ) -> list[tuple[Job, ...]]:
    """
    Return the plan's jobs as calls, in an order that keeps every job after what it reads.

    :param frames: the inputs of the plan's frames by id (the number of cameras and the
        guidance of a frame decide which of its jobs go together).
    """
    calls: list[tuple[Job, ...]] = []
    run: list[Job] = []
    for job in jobs:
        if run and (type(job) is not type(run[0]) or _frame(job) in map(_frame, run) or
                    _kind(job) != _kind(run[0])):
            calls += _groups(run, frames)
            run = []
        if isinstance(job, _BATCHED):
            run.append(job)
        else:
            calls.append((job,))
    return calls + _groups(run, frames)


def _frame(job: Job) -> int:
    return job.frame_id  # type: ignore[union-attr]


def _kind(job: Job) -> object:
    return job.segment_kind if isinstance(job, PrefillJob) else None


def _groups(run: list[Job], frames: Mapping[int, FrameInputs]) -> list[tuple[Job, ...]]:
    """
    Split a run of independent jobs by shape, each group where its first job was.

    The plain chunks come before the guided ones: their one call is shorter than a guided
    denoise, and a guided robot's inference delay is measured and guided for (RTC), an
    unguided one's is not.
    """
    groups: dict[Hashable, list[Job]] = {}
    for job in run:
        frame = frames.get(_frame(job))
        if frame is None:  # the caller's check names the missing inputs
            key: Hashable = ('alone', _frame(job))
        elif isinstance(job, (VisionJob, PrefillJob)):
            key = (type(job), frame.images.shape[1])
        else:
            key = 'plain' if frame.guidance is None else ('guided', job.frame_id)
        groups.setdefault(key, []).append(job)
    return [tuple(group) for key, group in sorted(groups.items(), key=lambda kv: kv[0] != 'plain')]


def stack_prefixes(prefixes: Sequence[PrefixKV], null_slot: int) -> PrefixKV:
    """
    Return one-row prefixes as one batch, each padded at its end (slot ``null_slot``, masked).

    :param prefixes: batch-1 prefixes in one cache.
    """
    width = max(p.slots.shape[1] for p in prefixes)
    return PrefixKV(prefixes[0].cache,
                    torch.cat([F.pad(p.slots, (0, width - p.slots.shape[1]), value=null_slot)
                               for p in prefixes]),
                    torch.cat([F.pad(p.mask, (0, width - p.mask.shape[1])) for p in prefixes]),
                    torch.cat([p.num_tokens for p in prefixes]),
                    torch.cat([p.last_hidden for p in prefixes]))


def split_rows(prefix: PrefixKV, lengths: Sequence[int]) -> list[PrefixKV]:
    """Return each row of a batched prefix as a one-row prefix of its first ``lengths[b]``."""
    return [PrefixKV(prefix.cache, prefix.slots[b:b + 1, :n], prefix.mask[b:b + 1, :n],
                     prefix.num_tokens[b:b + 1], prefix.last_hidden[b:b + 1])
            for b, n in enumerate(lengths)]


def prefill_rows(model: Pi05Model, cache: KVCache, jobs: Sequence[PrefillJob],
                 slots: Sequence[torch.Tensor], null_slot: int, *,
                 image_embeds: Sequence[torch.Tensor] | None = None,
                 contexts: Sequence[PrefixKV] | None = None) -> list[PrefixKV]:
    """
    Prefill segments of several frames as one batch: prompts padded to the longest (masked).

    :param slots: per job ``int64 [num_tokens]``, the slots of its new tokens.
    :param image_embeds: per job ``[1, N, Ti, W]`` (IMAGE and FULL segments; N alike).
    :param contexts: per job the one-row prefix its prompt extends (TEXT segments; alike in
        length: the image segments of frames with as many cameras).
    :returns: per job its prefix, as a one-job prefill returns it.
    """
    dev = cache.device
    lengths = [len(job.prompt_token_ids) for job in jobs]
    width = max(lengths)
    tokens = to_device([list(job.prompt_token_ids) + [0] * (width - n)
                        for job, n in zip(jobs, lengths)], dev, torch.int64)
    token_mask = None if min(lengths) == width else to_device(
        [[i < n for i in range(width)] for n in lengths], dev, torch.bool)
    most = max(job.num_tokens for job in jobs)
    new = torch.stack([F.pad(s, (0, most - s.numel()), value=null_slot) for s in slots])
    if contexts is not None:
        context = stack_prefixes(contexts, null_slot)
        out = model.prefill(tokens, token_mask, context=context, slots=new)
        before = context.slots.shape[1]
        return split_rows(out, [before + job.num_tokens for job in jobs])
    assert image_embeds is not None
    out = model.prefill(tokens, token_mask, image_embeds=torch.cat(list(image_embeds)),
                        cache=cache, slots=new)
    return split_rows(out, [job.num_tokens for job in jobs])


__all__ = ['plan_calls', 'prefill_rows', 'split_rows', 'stack_prefixes']
