"""
The plan of one control cycle (``SchedulerOutput``) and what running it produced.

A plan is an ordered program of jobs that a backend executes in order. Both policies emit
the same job types, so one backend runs the OxyGen engine and the isolated baseline alike:

====================  =========================================================================
job                   what the backend does
====================  =========================================================================
``VisionJob``         SigLIP + projector on the frame's images -> image embeddings ``emb_id``
``PrefillJob``        VLM expert over a segment's new tokens, K/V written to its blocks
``SuffixJob``         the causal suffixes of new text requests on their roots, one batch
``DenoiseJob``        10 Euler steps of the action expert reading a prefix chain -> chunk
``SeedJob``           LM head on the last prefix token of new text requests -> first token
``DecodeJob``         ``num_tokens`` batched greedy steps over text requests of any frames
====================  =========================================================================

A plan may hold the frames of several robots (one each, those due this cycle). Their action
path comes stage by stage: every frame's ``VisionJob``, then their ``PrefillJob`` s one chain
level at a time, then every ``DenoiseJob``, so that a run of consecutive jobs of one kind (one
segment kind for prefills) names distinct frames and depends on none of its own: a backend
may run such a run as one batched call (``backends/frame_batch.py``); run one by one, it gives
the same results.

Everything here is plain data (vLLM v1 ``sched/output.py``): ints, tuples, enums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum
from typing import Mapping

from oxygen_ros.sched.request import RequestKind


class SegmentKind(enum.Enum):
    IMAGE = 'image'
    """The image tokens of a frame (causal prompt mode: shared by every job of the frame)."""
    TEXT = 'text'
    """A prompt on top of an IMAGE segment (causal prompt mode)."""
    FULL = 'full'
    """Images and prompt in one segment (bidirectional prefix)."""
    SUFFIX = 'suffix'
    """
    A text request's own causal tokens after its frame's action prefix, the root (OxyGen's
    language suffix: a seed such as ``Memory: `` or a question); private to the request.
    """


class JobKind(enum.Enum):
    VISION = 'vision'
    PREFILL = 'prefill'
    SUFFIX = 'suffix'
    DENOISE = 'denoise'
    SEED = 'seed'
    DECODE = 'decode'


@dataclass(frozen=True, slots=True)
class VisionJob:
    """Encode the images of ``frame_id`` into embeddings kept under ``emb_id`` this cycle."""

    frame_id: int
    emb_id: int
    kind: JobKind = field(default=JobKind.VISION, init=False)


@dataclass(frozen=True, slots=True)
class PrefillJob:
    """
    Compute the K/V of one segment and write it to ``block_ids``.

    :ivar emb_id: image embeddings to use (IMAGE and FULL segments), else None.
    :ivar parent_seg_id: for TEXT segments, the IMAGE segment the prompt attends to.
    """

    seg_id: int
    frame_id: int
    segment_kind: SegmentKind
    prompt_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    num_tokens: int
    emb_id: int | None
    parent_seg_id: int | None
    kind: JobKind = field(default=JobKind.PREFILL, init=False)


@dataclass(frozen=True, slots=True)
class SuffixRow:
    """
    One request's suffix in a ``SuffixJob``.

    ``prompt_token_ids`` attend the request's root chain (ending with ``parent_seg_id``) and
    each other causally; their K/V go to ``block_ids``.

    :ivar use_adapter: the suffix LoRA is active on these tokens.
    """

    req_id: str
    seg_id: int
    parent_seg_id: int
    prompt_token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    use_adapter: bool = False


@dataclass(frozen=True, slots=True)
class SuffixJob:
    """
    Prefill the causal suffixes of the cycle's new requests as one batch (row per request).

    Positions continue after each row's root; a row's last hidden state seeds its request.
    """

    rows: tuple[SuffixRow, ...]
    kind: JobKind = field(default=JobKind.SUFFIX, init=False)

    @property
    def num_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.rows)


@dataclass(frozen=True, slots=True)
class DenoiseJob:
    """Sample the action chunk of ``req_id`` from the prefix chain ``seg_ids`` (root first)."""

    req_id: str
    frame_id: int
    seg_ids: tuple[int, ...]
    kind: JobKind = field(default=JobKind.DENOISE, init=False)


@dataclass(frozen=True, slots=True)
class SeedJob:
    """Greedy first token of each new text request from its prefix's last hidden state."""

    req_ids: tuple[str, ...]
    kind: JobKind = field(default=JobKind.SEED, init=False)


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """
    Batched greedy decoding: row i decodes ``num_tokens[i]`` tokens, one greedy step each.

    ``num_tokens[i]`` is the row's share of k this cycle (``tokens_per_cycle``, less where its
    budget ends or the deadline shrank k; vLLM's ``num_scheduled_tokens``); the batch runs
    ``max_steps = max(num_tokens)`` steps.

    A row whose steps are done (or that produced ``eos_token_id``) keeps its place in the
    batch; its K/V goes to the null block and its tokens are dropped. The backend may stop
    early once every row is done.

    :ivar deadline: monotonic seconds (``time.monotonic``) by which the job should be done,
        the next control tick (OXYGEN plans with an action deadline); the backend may stop
        between steps once the next one would end after it, and always runs the first.
        Steps not run are decoded in a later cycle. None: every planned step runs.
    :raises ValueError: a row without a token (``num_tokens[i] < 1``: the backend would have no
        token to feed next) or ``num_tokens`` not one per row.
    """

    req_ids: tuple[str, ...]
    num_tokens: tuple[int, ...]
    eos_token_id: int | None
    deadline: float | None = None
    kind: JobKind = field(default=JobKind.DECODE, init=False)

    def __post_init__(self) -> None:
        if len(self.num_tokens) != len(self.req_ids) or min(self.num_tokens, default=1) < 1:
            raise ValueError(f'a decode job needs >= 1 step for each of its rows, got steps '
                             f'{self.num_tokens} for rows {self.req_ids}')

    @property
    def max_steps(self) -> int:
        return max(self.num_tokens, default=0)


Job = VisionJob | PrefillJob | SuffixJob | DenoiseJob | SeedJob | DecodeJob


@dataclass(frozen=True, slots=True)
class NewRequestData:
    """
    A text request scheduled for the first time: everything the backend keeps for it.

    :ivar seg_ids: its prefix chain, root first.
    :ivar block_ids: private blocks for generated tokens (token j of the decode goes to
        slot ``block_ids[j // block_size] * block_size + j % block_size``).
    :ivar num_prefix_tokens: tokens in the chain = rope position of the first fed token.
    :ivar use_adapter: the suffix LoRA is active on its decoded tokens.
    """

    req_id: str
    kind: RequestKind
    frame_id: int
    seg_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    num_prefix_tokens: int
    max_tokens: int
    use_adapter: bool = False


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """
    The plan of one cycle.

    :ivar frame_ids: the frames it plans, one per robot due this cycle, in the order of their
        action jobs (the tightest deadline first); empty: no valid observation.
    :ivar jobs: executed in order.
    :ivar block_size: tokens per KV block (the scheduler's ``block_size``).
    :ivar new_requests: text requests seeded this cycle.
    :ivar finished_req_ids: requests finished or aborted since the previous plan (the backend
        drops its per-request state).
    :ivar freed_seg_ids: segments whose blocks went back to the pool since the previous plan.
    :ivar tokens_per_cycle: k actually used this cycle (may be below the configured k when the
        action deadline is tight).
    """

    cycle_id: int
    frame_ids: tuple[int, ...]
    jobs: tuple[Job, ...]
    block_size: int
    new_requests: tuple[NewRequestData, ...] = ()
    finished_req_ids: frozenset[str] = frozenset()
    freed_seg_ids: frozenset[int] = frozenset()
    tokens_per_cycle: int = 0

    @property
    def frame_id(self) -> int | None:
        """
        Return the frame of a one-frame plan (one robot), None for a plan without a frame.

        :raises ValueError: the plan holds several frames (read ``frame_ids``).
        """
        if len(self.frame_ids) > 1:
            raise ValueError(f'plan {self.cycle_id} holds frames {self.frame_ids}: read frame_ids')
        return self.frame_ids[0] if self.frame_ids else None

    def jobs_of(self, kind: JobKind) -> tuple[Job, ...]:
        return tuple(job for job in self.jobs if job.kind is kind)


@dataclass(frozen=True, slots=True)
class JobTiming:
    """
    Measured wall time of one backend call: a job, or a run of jobs batched as one.

    :ivar batch_size: rows (DECODE, SEED, SUFFIX), images (VISION), action chunks (DENOISE),
        prefix rows (PREFILL).
    :ivar num_tokens: new tokens (PREFILL, SUFFIX), steps run (DECODE), Euler steps
        (DENOISE).
    """

    kind: JobKind
    seconds: float
    batch_size: int = 1
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """
    What executing a plan produced (tensors stay in the backend; these are host values).

    :ivar sampled_token_ids: per text request, the tokens generated this cycle in order
        (seed token first for new requests), before any EOS truncation.
    :ivar timings: one entry per backend call (a job, or a run of jobs batched), in plan
        order.
    """

    cycle_id: int
    sampled_token_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    timings: tuple[JobTiming, ...] = ()

    def seconds(self, kind: JobKind) -> float:
        return sum(t.seconds for t in self.timings if t.kind is kind)
