"""
The engine's text requests beside the scheduler: what each was asked, and its text so far.

The scheduler's ``Request`` holds token ids; here each text request keeps what only the engine
needs (its task, question and own prompt's instruction, the stamp of the frame it reads) and
its ``IncrementalDetokenizer``: the one place ids become text. Each cycle's new ids become one
piece (``TextDelta.text``); a request's ``TextOutput.text`` is its pieces concatenated, which
equals ``tokenizer.decode`` of its ids (model/detokenizer.py). vLLM keeps the same split:
``v1/engine/output_processor.py`` holds a ``RequestState`` with a detokenizer per request
beside the scheduler's ``Request``.

Not thread-safe: the engine calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.engine.config import TextDelta, TextOutput
from oxygen_ros.model.detokenizer import IncrementalDetokenizer, SupportsDetokenize
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.sched.request import FinishReason, Request, TextContext


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


class OutputProcessor:
    """
    The state of every open text request, keyed by request id.

    :param tokenizer: the engine's tokenizer (``PaligemmaTokenizer``).
    """

    def __init__(self, tokenizer: SupportsDetokenize) -> None:
        self._tok = tokenizer
        self.states: dict[str, TextRequestState] = {}

    def add(self, req_id: str, task: TextTask, context: TextContext,
            question: str | None) -> None:
        """Start the state of a request (before the scheduler may admit it)."""
        self.states[req_id] = TextRequestState(task, context, question,
                                               IncrementalDetokenizer(self._tok))

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


__all__ = ['OutputProcessor', 'TextRequestState']
