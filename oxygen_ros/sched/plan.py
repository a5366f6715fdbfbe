"""
What the scheduler builds a cycle's plan from: the prefix chains and the jobs that fill them.

A request reads a chain of prefix segments (``kv/manager.py``): its frame's images and a
prompt, as one FULL segment (bidirectional prefix) or as an IMAGE segment and a TEXT segment
on it (causal prompt: every prompt of the frame shares the image K/V); a request on the
action prefix (OxyGen's root and language suffix) reads the action's chain and then its own
SUFFIX. A ``SegmentKey`` names a segment: requests of one frame with equal keys share it, a
key with an ``owner`` is never shared (every suffix, and each private chain of the isolated
baseline). ``CyclePlan`` turns the segments an admission allocated into the cycle's jobs, in
admission order; the action path of several frames (one per robot due) stage by stage, so
that the backend may batch each stage across the frames (``sched/output.py``). Stdlib only,
as the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Sequence

from oxygen_ros.config import PrefixAttention
from oxygen_ros.kv.manager import Segment, SegmentSpec
from oxygen_ros.sched.output import (
    DecodeJob, DenoiseJob, Job, PrefillJob, SeedJob, SegmentKind, SuffixJob, SuffixRow,
    VisionJob)
from oxygen_ros.sched.request import FrameSpec, Request, TextContext


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """Identity of a prefix segment; ``owner`` is set only where sharing is forbidden."""

    kind: SegmentKind
    frame_id: int
    prompt_token_ids: tuple[int, ...] = ()
    owner: str | None = None


def prefix_chain(frame: FrameSpec, prompt: tuple[int, ...], owner: str | None,
                 prefix_attention: PrefixAttention) -> list[SegmentSpec]:
    """Return the segments of the frame's images + ``prompt`` (``owner`` set: one private FULL)."""
    if owner is not None:
        key = SegmentKey(SegmentKind.FULL, frame.frame_id, prompt, owner=owner)
        return [SegmentSpec(key, frame.num_image_tokens + len(prompt))]
    if prefix_attention is PrefixAttention.CAUSAL_TEXT:
        return [SegmentSpec(SegmentKey(SegmentKind.IMAGE, frame.frame_id),
                            frame.num_image_tokens),
                SegmentSpec(SegmentKey(SegmentKind.TEXT, frame.frame_id, prompt),
                            len(prompt))]
    return [SegmentSpec(SegmentKey(SegmentKind.FULL, frame.frame_id, prompt),
                        frame.num_image_tokens + len(prompt))]


def request_chain(frame: FrameSpec, req: Request, *, isolated: bool,
                  prefix_attention: PrefixAttention) -> list[SegmentSpec] | None:
    """
    Return the prefix chain ``req`` reads on ``frame`` (None: the frame has no root).

    ``isolated`` (the baseline) gives every job private segments (a copy of the root for a
    request on the action prefix); OxyGen shares every segment but a request's own suffix.
    """
    owner = req.req_id if isolated else None
    prompt = frame.prompt_of(req)
    if req.context is not TextContext.ACTION_PREFIX:
        return prefix_chain(frame, prompt, owner, prefix_attention)
    if not frame.root_prompt:
        return None
    suffix = SegmentKey(SegmentKind.SUFFIX, frame.frame_id, prompt, owner=req.req_id)
    return prefix_chain(frame, frame.root_prompt, owner, prefix_attention) + [
        SegmentSpec(suffix, len(prompt))]


def cycle_frames(frames: FrameSpec | Sequence[FrameSpec] | None,
                 max_robots: int) -> list[FrameSpec]:
    """
    Return a cycle's frames in deadline order, the tightest first (no deadline: last).

    :raises ValueError: two frames of one robot or with one id, or more than ``max_robots``.
    """
    if frames is None:
        return []
    frames = [frames] if isinstance(frames, FrameSpec) else list(frames)
    robots = [f.robot for f in frames]
    if len(set(robots)) != len(robots):
        raise ValueError(f'one frame per robot and cycle, got frames of robots {robots}')
    ids = [f.frame_id for f in frames]
    if len(set(ids)) != len(ids):
        raise ValueError(f'frames of one cycle need distinct ids, got {ids}')
    if len(frames) > max_robots:
        raise ValueError(f'{len(frames)} frames (robots {robots}) in one cycle, max_robots '
                         f'is {max_robots}')

    def tightest(frame: FrameSpec) -> tuple[bool, float]:
        due = frame.action.deadline if frame.action is not None else None
        return due is None, 0.0 if due is None else due
    return sorted(frames, key=tightest)


def cycle_deadline(frames: Sequence[FrameSpec], deadline: float | None) -> float | None:
    """Return the earliest of ``deadline`` and the frames' action deadlines (None: none)."""
    dues = [f.action.deadline for f in frames
            if f.action is not None and f.action.deadline is not None]
    return min(dues + ([] if deadline is None else [deadline]), default=None)


@dataclass(frozen=True, slots=True)
class ActionAlloc:
    """A frame's ACTION request as admitted: the segments of its chain, and the new ones."""

    frame: FrameSpec
    request: Request
    segments: tuple[Segment, ...]
    new_segments: tuple[Segment, ...]


@dataclass(slots=True)
class CyclePlan:
    """
    The jobs of one cycle being planned, and the work they add up to (for the cost model).

    :ivar emb_ids: the scheduler's source of image-embedding ids (unique across cycles).
    :ivar isolated: every job encodes its own images (the baseline); else once per frame.
    :ivar frame_embeds: per frame, its image embeddings this cycle (absent: not encoded yet).
    :ivar num_chunks: action chunks denoised (one per frame with an action).
    :ivar suffix_rows: suffixes collected for the next ``SuffixJob``.
    """

    emb_ids: Iterator[int]
    isolated: bool = False
    jobs: list[Job] = field(default_factory=list)
    frame_embeds: dict[int, int] = field(default_factory=dict)
    num_images: int = 0
    num_prefill_tokens: int = 0
    num_suffix_tokens: int = 0
    num_chunks: int = 0
    suffix_rows: list[SuffixRow] = field(default_factory=list)

    def flush_suffixes(self) -> None:
        """Append one ``SuffixJob`` for the suffixes collected so far (none: nothing)."""
        if self.suffix_rows:
            self.jobs.append(SuffixJob(tuple(self.suffix_rows)))
            self.suffix_rows.clear()

    def add_actions(self, actions: Sequence[ActionAlloc]) -> None:
        """
        Plan the action path of the cycle's frames: their prefixes, then their chunks.

        OxyGen: every frame's ``VisionJob``, then the first segment of every chain, the
        second, ..., then every ``DenoiseJob``, in the order of ``actions``: each stage a
        run of jobs on distinct frames, independent of each other (one frame: vision,
        prefill, denoise, as before). Isolated: one frame after the other.
        """
        if self.isolated:
            for act in actions:
                self.add_segments(act.frame, act.request, act.new_segments)
                self._denoise(act)
            return
        for act in actions:
            if any(seg.key.kind is not SegmentKind.TEXT for seg in act.new_segments):
                self._vision(act.frame)
        for depth in range(max((len(a.new_segments) for a in actions), default=0)):
            for act in actions:
                if depth < len(act.new_segments):
                    self._prefill(act.frame, act.new_segments[depth])
        for act in actions:
            self._denoise(act)

    def decode_to_completion(self, req: Request, eos_token_id: int | None) -> None:
        """Plan the isolated baseline's text job after its prefix: seed, then every token."""
        self.flush_suffixes()
        self.jobs.append(SeedJob((req.req_id,)))
        if req.max_tokens > 1:
            self.jobs.append(DecodeJob((req.req_id,), (req.max_tokens - 1,), eos_token_id))

    def add_segments(self, frame: FrameSpec, req: Request,
                     new_segments: tuple[Segment, ...]) -> None:
        """
        Plan the jobs that compute the segments just allocated for ``req``.

        A suffix joins the next ``SuffixJob``; any other segment gets a ``PrefillJob``, after
        a ``VisionJob`` where it holds images that are not encoded yet.
        """
        for seg in new_segments:
            key: SegmentKey = seg.key
            if key.kind is SegmentKind.SUFFIX:
                assert seg.parent is not None
                self.suffix_rows.append(SuffixRow(
                    req.req_id, seg.seg_id, seg.parent.seg_id, key.prompt_token_ids,
                    seg.block_ids, req.use_adapter))
                self.num_suffix_tokens += seg.num_tokens
                continue
            if key.kind is not SegmentKind.TEXT and \
                    (frame.frame_id not in self.frame_embeds or self.isolated):
                self._vision(frame)
            self._prefill(frame, seg)

    def _vision(self, frame: FrameSpec) -> None:
        self.frame_embeds[frame.frame_id] = emb_id = next(self.emb_ids)
        self.jobs.append(VisionJob(frame.frame_id, emb_id))
        self.num_images += frame.num_images

    def _prefill(self, frame: FrameSpec, seg: Segment) -> None:
        key: SegmentKey = seg.key
        emb_id = None if key.kind is SegmentKind.TEXT else self.frame_embeds[frame.frame_id]
        self.jobs.append(PrefillJob(
            seg_id=seg.seg_id, frame_id=frame.frame_id, segment_kind=key.kind,
            prompt_token_ids=key.prompt_token_ids, block_ids=seg.block_ids,
            num_tokens=seg.num_tokens, emb_id=emb_id,
            parent_seg_id=seg.parent.seg_id if seg.parent else None))
        self.num_prefill_tokens += seg.num_tokens

    def _denoise(self, act: ActionAlloc) -> None:
        self.jobs.append(DenoiseJob(act.request.req_id, act.frame.frame_id,
                                    tuple(s.seg_id for s in act.segments)))
        self.num_chunks += 1


__all__ = ['ActionAlloc', 'CyclePlan', 'SegmentKey', 'cycle_deadline', 'cycle_frames',
           'prefix_chain', 'request_chain']
