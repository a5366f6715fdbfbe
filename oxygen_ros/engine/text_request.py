"""
A text request as the engine makes it: the scheduler's ``Request`` with its task and its text.

One table holds every request, the scheduler's (``Scheduler.requests``); what only the engine
needs of a text request hangs off it, on this subclass: its task and question, the stamp of
the frame it reads, its prompt recipe and its ``IncrementalDetokenizer``, the one place ids
become text. Each cycle's new ids become one piece (``TextOutput.new_text``); a request's
``TextOutput.text`` is its pieces concatenated, which equals ``tokenizer.decode`` of its ids
(transforms/detokenizer.py), as vLLM's output processor keeps a detokenizer per request
(``v1/engine/output_processor.py``).

The engine never edits a queued request: a request on the action prefix has its suffix
(``Question: {q} Answer: ``) from the start; one with a prompt of its own reads a prompt built
on the instruction of the frame that admits it (``Task: {instr}. Subtask: ``). The engine
builds it for each waiting request (``frame_prompts``, kept while the instruction stays the
same) and hands the prompts in with the frame (``FrameSpec.own_prompts``); the scheduler gives
a request its prompt when it comes to admit it. One whose prompt cannot be built is dropped
through the scheduler (``FINISHED_DROPPED``, ``bad text prompt: ...``).

Not thread-safe: the engine touches a request under its lock only (``new_text_request``
excepted: it makes a request no one else holds yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
import time

from oxygen_ros.engine.outputs import TextOutput
from oxygen_ros.sched.request import Request, RequestKind, RequestStatus, TextContext
from oxygen_ros.sched.scheduler import Scheduler
from oxygen_ros.transforms.detokenizer import IncrementalDetokenizer
from oxygen_ros.transforms.prompt import TextTask, tokenize_text_prompt, tokenize_text_suffix
from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer

_LOG = logging.getLogger('oxygen_ros.engine.engine')
"""The engine's logger (its lines name the engine)."""


@dataclass(slots=True, kw_only=True)
class TextRequest(Request):
    """
    A TEXT or MEMORY request with what the engine keeps of it.

    :ivar frame_stamp_ns: stamp of the observation whose prefix it reads (0: not admitted).
    :ivar own_prompt: its own prompt on ``prompt_instruction`` (``OWN_PROMPT``; () before).
    """

    task: TextTask
    question: str | None
    tokenizer: PaligemmaTokenizer = field(repr=False)
    max_prompt_len: int
    detokenizer: IncrementalDetokenizer = field(init=False, repr=False)
    frame_stamp_ns: int = 0
    own_prompt: tuple[int, ...] = ()
    prompt_instruction: str | None = None

    def __post_init__(self) -> None:
        Request.__post_init__(self)
        self.detokenizer = IncrementalDetokenizer(self.tokenizer)

    def prompt_on(self, instruction: str) -> tuple[int, ...]:
        """
        Return the request's own prompt on ``instruction`` (built once per instruction).

        :raises ValueError: ``tokenize_text_prompt`` cannot build it.
        """
        if instruction != self.prompt_instruction:
            self.own_prompt = tuple(tokenize_text_prompt(
                self.tokenizer, instruction, self.task, question=self.question,
                max_len=self.max_prompt_len).ids)
            self.prompt_instruction = instruction
        return self.own_prompt

    def output(self, num_before: int) -> TextOutput | None:
        """
        Return the request's news of this cycle: the ids it kept after ``num_before``, their text.

        Its last output (the request finished) carries the whole text and ids.

        :returns: None when it kept no id this cycle and has not finished.
        """
        new_ids = tuple(self.output_token_ids[num_before:])
        if not new_ids and not self.is_finished:
            return None
        piece = self.detokenizer.push(new_ids, final=self.is_finished)
        done = self.is_finished
        cycles = self.finish_cycle - self.first_cycle + 1 \
            if done and self.finish_cycle is not None and self.first_cycle is not None else 0
        return TextOutput(
            self.req_id, self.task, new_ids, piece, self.num_output_tokens, self.frame_stamp_ns,
            self.finish_reason, text=self.detokenizer.text if done else '',
            token_ids=tuple(self.output_token_ids) if done else (), num_cycles=cycles,
            error=self.error, robot=self.robot)


def frame_prompts(scheduler: Scheduler, instruction: str, robot: str = ''
                  ) -> tuple[dict[str, tuple[int, ...]], list[TextRequest]]:
    """
    Return the own prompt of every waiting ``OWN_PROMPT`` request of ``robot`` on its frame.

    What the frame hands the scheduler (``FrameSpec.own_prompts``). A request whose prompt
    cannot be built is dropped through the scheduler (``FINISHED_DROPPED``, ``error`` ``bad
    text prompt: ...``, logged). The caller holds the engine's lock.

    :returns: the prompts by request id, and the requests dropped.
    """
    prompts: dict[str, tuple[int, ...]] = {}
    dropped: list[TextRequest] = []
    for req in list(scheduler.waiting):
        if not isinstance(req, TextRequest) or req.context is not TextContext.OWN_PROMPT \
                or req.robot != robot:
            continue
        try:
            prompts[req.req_id] = req.prompt_on(instruction)
        except ValueError as exc:
            scheduler.finish_request(req.req_id, RequestStatus.FINISHED_DROPPED,
                                     f'bad text prompt: {exc}')
            _LOG.warning('text request %s rejected: %s', req.req_id, req.error)
            dropped.append(req)
    return prompts, dropped


def new_text_request(tokenizer: PaligemmaTokenizer, req_id: str, task: TextTask,
                     context: TextContext, question: str | None, max_tokens: int, *,
                     max_prompt_len: int, use_adapter: bool, robot: str = '') -> TextRequest:
    """
    Return the scheduler's request for a text request (any thread; no state is shared).

    Its prompt is the suffix (``Question: {q} Answer: ``), which checks the question; an own
    prompt is built on the admitting frame's instruction (:func:`frame_prompts`), the suffix
    holds its place until then.

    :param max_prompt_len: prompt and suffix slots (the preset's ``max_token_len``).
    :param robot: the robot whose frames it is admitted onto.
    :raises ValueError: an ANSWER without a question, a question for another task, one empty
        after cleaning, or a budget < 1.
    """
    if task is TextTask.ANSWER and not (question and question.strip()):
        raise ValueError('an ANSWER request needs a non-empty question')
    if task is not TextTask.ANSWER and question is not None:
        raise ValueError(f'a question is only used by ANSWER requests, not {task.name}')
    if max_tokens < 1:
        raise ValueError(f'max_tokens must be >= 1, got {max_tokens}')
    suffix = tokenize_text_suffix(tokenizer, task, question=question, max_len=max_prompt_len)
    kind = RequestKind.MEMORY if task is TextTask.MEMORY else RequestKind.TEXT
    return TextRequest(req_id=req_id, kind=kind, prompt_token_ids=tuple(suffix.ids),
                       max_tokens=max_tokens, context=context, arrival_time=time.monotonic(),
                       use_adapter=use_adapter and kind is RequestKind.MEMORY, task=task,
                       question=question, tokenizer=tokenizer, max_prompt_len=max_prompt_len,
                       robot=robot)


__all__ = ['TextRequest', 'frame_prompts', 'new_text_request']
