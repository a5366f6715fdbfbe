"""
Requests: one action chunk per frame, text and memory notes of any length (stdlib only).

``FrameSpec`` is the frame a cycle schedules them on. An engine may serve several robots:
each frame and each text request names its robot (``''``: the only robot of a one-robot
engine), and a text request reads only its own robot's frames.

Naming follows vLLM v1 (``v1/request.py``): ``req_id``, ``RequestStatus``,
``num_computed_tokens``, ``output_token_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum
from typing import Mapping


class RequestKind(enum.Enum):
    """The three jobs of one camera frame (OxyGen, arXiv 2603.14371; ``docs/prompts.md``)."""

    ACTION = 'action'
    """An action chunk from the frame's prefix (hard deadline: the control period)."""
    TEXT = 'text'
    """Subtask prediction or an answer to a question (greedy decoding, token budget)."""
    MEMORY = 'memory'
    """A textual memory note (decoded like TEXT, routed to ``~/memory``)."""


class TextContext(enum.Enum):
    """
    What a TEXT or MEMORY request reads before its own tokens.

    OxyGen's repository (``src/openpi/models/pi05.py``: ``prefill_language_root``,
    ``forward_language_suffix``) runs language as a short *causal suffix* on the frame's
    **root**, the action's own prefix (images + action prompt + state, bidirectional as in
    openpi), so one prefill per frame serves every job. A request with a prompt of its own
    (openpi_subtask_generation's ``Task: ... Subtask: ``) needs a prefix of its own instead.
    """

    ACTION_PREFIX = 'action_prefix'
    """The frame's action prefix (shared, reference counted) + the request's causal suffix
    (``prompt_token_ids``: its seed, e.g. ``Memory: ``, or a question)."""
    OWN_PROMPT = 'own_prompt'
    """The frame's images + the request's own prompt (``prompt_token_ids``) as a prefix."""


class RequestStatus(enum.Enum):
    WAITING = 'waiting'
    RUNNING = 'running'
    FINISHED_STOPPED = 'finished_stopped'
    """Emitted the end-of-sequence token."""
    FINISHED_LENGTH = 'finished_length'
    """Reached its token budget."""
    FINISHED_ABORTED = 'finished_aborted'
    """Cancelled by its owner (``Scheduler.abort_request``)."""
    FINISHED_DROPPED = 'finished_dropped'
    """Ended without its text by the engine (``Request.error`` says why): its own prompt
    could not be built, or the engine shut down (``Scheduler.finish_request``)."""

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                       RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_DROPPED})


class FinishReason(enum.Enum):
    """
    How a text request ended: the one vocabulary of its end, from the scheduler to the node.

    As vLLM's ``v1/engine/__init__.py`` ``FinishReason`` (stop, length, abort), with the two
    ends of a request that got no text, each with its reason text beside it (the output's
    ``error``): ``DROPPED`` and ``REFUSED``. The node says each in ROS terms in one place
    (``ros/outcomes.py``).
    """

    STOP = 'stop'
    """It emitted the end-of-sequence token: its text is whole."""
    LENGTH = 'length'
    """It reached its token budget."""
    ABORT = 'abort'
    """Cancelled by its owner (``Engine.abort``): its text is what it decoded until then."""
    DROPPED = 'dropped'
    """Taken, then ended by the engine without its text (its own prompt could not be built,
    the engine shut down) or by its caller (the node cleaned up)."""
    REFUSED = 'refused'
    """Never taken: refused on arrival (``Engine.submit_text`` raised ``QueueFullError``,
    ``ValueError`` or ``EngineClosedError``; the node's own checks). The engine raises, it
    never outputs it; callers that report every end in one stream (the node) use it."""


_FINISH_REASON = {RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
                  RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
                  RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
                  RequestStatus.FINISHED_DROPPED: FinishReason.DROPPED}


@dataclass(slots=True)
class Request:
    """
    One job on one frame.

    :ivar prompt_token_ids: the job's own prompt (the part of the prefix after the images);
        with ``context`` ACTION_PREFIX the causal suffix after the frame's action prefix.
    :ivar context: what the request reads before ``prompt_token_ids`` (TEXT, MEMORY).
    :ivar use_adapter: the suffix LoRA is active on the request's suffix and generated tokens
        (OxyGen's textual-memory adapter; ACTION_PREFIX only).
    :ivar robot: the robot whose frames a TEXT or MEMORY request is admitted onto (``''``:
        the only robot); an ACTION request's is its frame's.
    :ivar max_tokens: token budget (TEXT/MEMORY); 0 for ACTION.
    :ivar deadline: monotonic seconds by which an ACTION must be published; None otherwise.
    :ivar frame_id: the frame whose prefix the request reads; set when it is scheduled.
    :ivar num_computed_tokens: tokens whose K/V is in the cache: the prefix once prefilled,
        then one more per decode step (the newest generated token is not yet in the cache).
    :ivar error: why the request ended without its text (``FINISHED_DROPPED``), else ``''``.

    Whoever submits requests may keep its own per-request state on a subclass (the engine's
    ``TextRequest``: task, detokenizer), so that the scheduler's table is the only one; the
    scheduler reads only the fields here.
    """

    req_id: str
    kind: RequestKind
    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 0
    arrival_time: float = 0.0
    deadline: float | None = None
    context: TextContext = TextContext.OWN_PROMPT
    use_adapter: bool = False
    robot: str = ''
    frame_id: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_prefix_tokens: int = 0
    num_computed_tokens: int = 0
    first_cycle: int | None = None
    finish_cycle: int | None = None
    error: str = ''

    def __post_init__(self) -> None:
        if self.kind is RequestKind.ACTION:
            if self.max_tokens != 0:
                raise ValueError(f'{self.req_id}: an ACTION request generates no tokens '
                                 f'(max_tokens={self.max_tokens})')
            if self.context is not TextContext.OWN_PROMPT or self.use_adapter:
                raise ValueError(f'{self.req_id}: an ACTION request reads its own prompt '
                                 f'(it is the root) without an adapter')
        elif self.max_tokens < 1:
            raise ValueError(f'{self.req_id}: max_tokens must be >= 1, got {self.max_tokens}')
        if self.use_adapter and self.context is not TextContext.ACTION_PREFIX:
            raise ValueError(f'{self.req_id}: the suffix adapter needs the ACTION_PREFIX '
                             f'context (it is active on the suffix only)')
        if not self.prompt_token_ids:
            raise ValueError(f'{self.req_id}: empty prompt')

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_left(self) -> int:
        """Return tokens still allowed by the budget."""
        return self.max_tokens - len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASON.get(self.status)


@dataclass(frozen=True, slots=True)
class FrameSpec:
    """
    The newest valid observation, as far as the scheduler needs to know it.

    :ivar num_image_tokens: image tokens of its valid cameras.
    :ivar num_images: valid cameras (for the vision cost estimate).
    :ivar action: the frame's ACTION request, or None for a frame that only feeds text.
    :ivar prompt_token_ids: the frame's action prompt, the prompt of its root (the prefix
        that ACTION_PREFIX requests read); default (empty): the action's.
    :ivar robot: the robot it was observed on (``''``: the only robot); the text requests
        of that robot only are admitted onto it.
    :ivar own_prompts: request id -> the prompt of a waiting ``OWN_PROMPT`` request on this
        frame (the engine builds each on the frame's instruction: openpi_subtask_generation's
        ``Task: {instruction}. Subtask: ``): what it reads if this frame admits it
        (:meth:`prompt_of`).
    """

    frame_id: int
    num_image_tokens: int
    num_images: int = 1
    action: Request | None = None
    prompt_token_ids: tuple[int, ...] = ()
    robot: str = ''
    own_prompts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def prompt_of(self, req: Request) -> tuple[int, ...]:
        """Return the prompt ``req`` reads on this frame (``own_prompts``, else its own)."""
        if req.context is TextContext.OWN_PROMPT:
            return self.own_prompts.get(req.req_id, req.prompt_token_ids)
        return req.prompt_token_ids

    @property
    def root_prompt(self) -> tuple[int, ...]:
        """Return the prompt of the frame's root (empty: none known, no ACTION_PREFIX text)."""
        if self.prompt_token_ids or self.action is None:
            return self.prompt_token_ids
        return self.action.prompt_token_ids
