"""
The engine's text requests beside the scheduler: their prompts in, their text out.

The scheduler's ``Request`` holds token ids; here each text request keeps what only the engine
needs: its task and question, the instruction its own prompt was built from, the stamp of the
frame it reads, and its ``IncrementalDetokenizer``, the one place ids become text. Each cycle's
new ids become one piece (``TextDelta.text``); a request's ``TextOutput.text`` is its pieces
concatenated, which equals ``tokenizer.decode`` of its ids (transforms/detokenizer.py). vLLM keeps
the same split: ``v1/engine/output_processor.py`` holds a ``RequestState`` with a detokenizer
per request beside the scheduler's ``Request``, and its input processor validates and
tokenizes a request before the scheduler sees it.

Not thread-safe: the engine calls it under its lock (``new_request`` excepted: pure).
"""

from __future__ import annotations

from dataclasses import dataclass
import time
from typing import Iterable

from oxygen_ros.engine.outputs import TextDelta, TextOutput
from oxygen_ros.sched.request import FinishReason, Request, RequestKind, TextContext
from oxygen_ros.transforms.detokenizer import IncrementalDetokenizer
from oxygen_ros.transforms.prompt import TextTask, tokenize_text_prompt, tokenize_text_suffix
from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer


@dataclass(slots=True)
class TextRequestState:
    """
    One text request as the engine knows it beside the scheduler.

    :ivar instruction: the instruction its own prompt was built from (``OWN_PROMPT``: the
        prompt is rebuilt when a frame's instruction differs); None: not built yet.
    :ivar frame_stamp_ns: stamp of the observation whose prefix it reads (0: not admitted).
    """

    task: TextTask
    context: TextContext
    question: str | None
    detokenizer: IncrementalDetokenizer
    instruction: str | None = None
    frame_stamp_ns: int = 0


class TextStates:
    """
    The state of every open text request, keyed by request id.

    :param tokenizer: the engine's tokenizer.
    :param max_len: prompt and suffix slots (the preset's ``max_token_len``).
    """

    def __init__(self, tokenizer: PaligemmaTokenizer, max_len: int) -> None:
        self._tok = tokenizer
        self._max_len = max_len
        self.states: dict[str, TextRequestState] = {}

    # -- prompts ---------------------------------------------------------------------------
    def new_request(self, req_id: str, task: TextTask, context: TextContext,
                    question: str | None, max_tokens: int, use_adapter: bool) -> Request:
        """
        Return the scheduler's ``Request`` for a text request (any thread; keeps no state).

        Its prompt is the suffix (``Question: {q} Answer: ``), which checks the question; an
        own prompt is built on the admitting frame's instruction (``build_prompts``), the
        suffix holds its place until then.

        :raises ValueError: an ANSWER without a question, a question for another task, one
            empty after cleaning, or a budget < 1.
        """
        if task is TextTask.ANSWER and not (question and question.strip()):
            raise ValueError('an ANSWER request needs a non-empty question')
        if task is not TextTask.ANSWER and question is not None:
            raise ValueError(f'a question is only used by ANSWER requests, not {task.name}')
        if max_tokens < 1:
            raise ValueError(f'max_tokens must be >= 1, got {max_tokens}')
        suffix = tokenize_text_suffix(self._tok, task, question=question, max_len=self._max_len)
        kind = RequestKind.MEMORY if task is TextTask.MEMORY else RequestKind.TEXT
        return Request(req_id, kind, tuple(suffix.ids), max_tokens=max_tokens, context=context,
                       arrival_time=time.monotonic(),
                       use_adapter=use_adapter and kind is RequestKind.MEMORY)

    def add(self, req_id: str, task: TextTask, context: TextContext,
            question: str | None) -> None:
        """Start the state of a request (before the scheduler may admit it)."""
        self.states[req_id] = TextRequestState(task, context, question,
                                               IncrementalDetokenizer(self._tok))

    def build_prompts(self, waiting: Iterable[Request], instruction: str) -> list[TextOutput]:
        """
        Build the own prompt of each waiting ``OWN_PROMPT`` request on ``instruction``.

        Before ``schedule``: an own prompt reads the instruction of the frame that admits it
        (``Task: {instr}. Subtask: ``); it is rebuilt only when the instruction changed.

        :returns: the outputs of the requests whose prompt cannot be built (``error``: bad
            text prompt): the caller aborts them in the scheduler.
        """
        failed = []
        for req in waiting:
            state = self.states[req.req_id]
            if state.context is not TextContext.OWN_PROMPT or state.instruction == instruction:
                continue
            try:
                prompt = tokenize_text_prompt(self._tok, instruction, state.task,
                                              question=state.question, max_len=self._max_len)
            except ValueError as exc:
                failed.append(self.ended(req.req_id, (), None, f'bad text prompt: {exc}'))
                continue
            req.prompt_token_ids = tuple(prompt.ids)
            state.instruction = instruction
        return failed

    # -- text ------------------------------------------------------------------------------
    def delta(self, req: Request, num_before: int) -> TextDelta | None:
        """
        Detokenize the ids ``req`` kept this cycle (after ``num_before`` of them).

        :returns: the cycle's piece of text and ids; None when the request kept none or was
            aborted meanwhile (no state).
        """
        state = self.states.get(req.req_id)
        new_ids = tuple(req.output_token_ids[num_before:])
        if state is None or not new_ids:
            return None
        piece = state.detokenizer.push(new_ids, final=req.is_finished)
        return TextDelta(req.req_id, state.task, new_ids, piece, req.num_output_tokens,
                         state.frame_stamp_ns, req.is_finished)

    def finished(self, req: Request) -> TextOutput:
        """Return the output of a request the scheduler retired (EOS or budget); forget it."""
        state = self.states.pop(req.req_id)
        return TextOutput(req.req_id, state.task, state.detokenizer.text,
                          tuple(req.output_token_ids), req.finish_reason,
                          state.frame_stamp_ns, req.finish_cycle - req.first_cycle + 1)

    def ended(self, req_id: str, token_ids: tuple[int, ...], reason: FinishReason | None,
              error: str = '') -> TextOutput | None:
        """
        Return the output of a request that ended otherwise (aborted, refused); forget it.

        Its text is what the pieces said, with the text still held back (an incomplete
        character) let out. None when the request has no state (unknown, or ended already).
        """
        state = self.states.pop(req_id, None)
        if state is None:
            return None
        state.detokenizer.push((), final=True)
        return TextOutput(req_id, state.task, state.detokenizer.text, token_ids, reason,
                          state.frame_stamp_ns, 0, error)


__all__ = ['TextRequestState', 'TextStates']
