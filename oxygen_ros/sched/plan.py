"""
What the scheduler builds a cycle's plan from: the prefix chains and the jobs that fill them.

A request reads a chain of prefix segments (``kv/manager.py``): its frame's images and a
prompt, as one FULL segment (bidirectional prefix) or as an IMAGE segment and a TEXT segment
on it (causal prompt: every prompt of the frame shares the image K/V); a request on the
action prefix (OxyGen's root and language suffix) reads the action's chain and then its own
SUFFIX. A ``SegmentKey`` names a segment: requests of one frame with equal keys share it, a
key with an ``owner`` is never shared (every suffix, and each private chain of the isolated
baseline). ``CyclePlan`` turns the segments an admission allocated into the cycle's jobs, in
admission order (stdlib only, as the scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from oxygen_ros.config import PrefixAttention
from oxygen_ros.kv.manager import Segment, SegmentSpec
from oxygen_ros.sched.output import Job, PrefillJob, SegmentKind, SuffixJob, SuffixRow, VisionJob
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


@dataclass(slots=True)
class CyclePlan:
    """
    The jobs of one cycle being planned, and the work they add up to (for the cost model).

    :ivar emb_ids: the scheduler's source of image-embedding ids (unique across cycles).
    :ivar isolated: every job encodes its own images (the baseline); else once per frame.
    :ivar emb_id: the frame's image embeddings this cycle (None: not encoded yet).
    :ivar suffix_rows: suffixes collected for the next ``SuffixJob``.
    """

    emb_ids: Iterator[int]
    isolated: bool = False
    jobs: list[Job] = field(default_factory=list)
    emb_id: int | None = None
    num_images: int = 0
    num_prefill_tokens: int = 0
    num_suffix_tokens: int = 0
    suffix_rows: list[SuffixRow] = field(default_factory=list)

    def flush_suffixes(self) -> None:
        """Append one ``SuffixJob`` for the suffixes collected so far (none: nothing)."""
        if self.suffix_rows:
            self.jobs.append(SuffixJob(tuple(self.suffix_rows)))
            self.suffix_rows.clear()

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
            emb_id = None
            if key.kind is not SegmentKind.TEXT:
                if self.emb_id is None or self.isolated:
                    self.emb_id = next(self.emb_ids)
                    self.jobs.append(VisionJob(frame.frame_id, self.emb_id))
                    self.num_images += frame.num_images
                emb_id = self.emb_id
            self.jobs.append(PrefillJob(
                seg_id=seg.seg_id, frame_id=frame.frame_id, segment_kind=key.kind,
                prompt_token_ids=key.prompt_token_ids, block_ids=seg.block_ids,
                num_tokens=seg.num_tokens, emb_id=emb_id,
                parent_seg_id=seg.parent.seg_id if seg.parent else None))
            self.num_prefill_tokens += seg.num_tokens


__all__ = ['CyclePlan', 'SegmentKey', 'prefix_chain', 'request_chain']
