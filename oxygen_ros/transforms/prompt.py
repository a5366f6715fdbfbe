r"""
Prompt strings and their token ids: the action prompt and the text-task prompts.

Action prompt (openpi ``src/openpi/models/tokenizer.py``;
``docs/prompts.md#the-action-prompt-the-root``):

- ``PromptFormat.PI05_STATE``: BOS + ``"Task: {task}, State: {b1 b2 … bn};\nAction: "`` where
  ``b_i`` are the 256-bin codes of the *normalized, unpadded* state (:func:`discretize_state`).
- ``PromptFormat.PI0`` (pi05_libero, no state in the prompt): BOS + ``"{task}"`` followed by
  a separately encoded ``"\n"``.
- ``PromptFormat.PI05_NO_STATE`` (LeRobot without the state): BOS +
  ``"Task: {task};\nAction: "``.

``state_pad`` > 0 zero-pads the normalized state to that many dims before binning, as LeRobot
<= v0.4.4 did (to ``max_state_dim`` = 32; the padding bins are 128); openpi and LeRobot >=
v0.5.0 write the unpadded state (``state_pad`` 0).

Text-task prompts (no state; ``docs/prompts.md#text-tasks-two-contexts``):

- ``TextTask.SUBTASK``: BOS + ``"Task: {instr}. Subtask: "`` (openpi_subtask_generation and
  OxyGen ``PI05_O2``), ``instr`` normalized by :func:`normalize_instruction`.
- ``TextTask.MEMORY``: BOS + ``"Task: {instr}. Memory: "`` (OxyGen's textual-memory seed).
- ``TextTask.ANSWER``: BOS + ``"Task: {instr}. Question: {question} Answer: "``. **Our own
  format** for ``~/ask``: no released checkpoint was trained on it, so answers from a model
  not fine-tuned on it are best effort.

Text-task suffixes (OxyGen's language suffix, ``TextContext.ACTION_PREFIX``): a text request
reads the frame's action prefix (images + action prompt) and appends its own causal suffix,
encoded alone without BOS (OxyGen ``tokenize_language_seed``):

- ``TextTask.MEMORY``: ``"Memory: "`` (OxyGen's textual-memory seed; its adapter's format);
- ``TextTask.SUBTASK``: ``"Subtask: "``;
- ``TextTask.ANSWER``: ``"Question: {question} Answer: "`` (our own format).

All prompts are padded to ``max_len`` with PAD (0) and mask False. Longer action prompts are
cut at ``max_len`` as openpi does (the tail ``Action: `` is lost). Longer text prompts are
shortened *inside* the instruction (ANSWER: inside the longer of instruction and question) so
that the trailing seed words (``Subtask: ``, ``Memory: ``, ``Answer: ``) always survive: the
model decodes right after them. Both log one warning per distinct cause.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import logging
import string
import threading
from typing import TYPE_CHECKING

import numpy as np

from oxygen_ros.config import PAD_ID, PromptFormat

if TYPE_CHECKING:  # pragma: no cover
    from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer

logger = logging.getLogger(__name__)

NUM_STATE_BINS = 256
_STATE_BIN_EDGES = np.linspace(-1.0, 1.0, NUM_STATE_BINS + 1)[:-1]
"""Left edges of the 256 bins: -1 + i/128, exact in float64 (openpi ``tokenizer.py``)."""


class TextTask(str, enum.Enum):
    """Which text the VLM expert decodes after the prefix (``docs/prompts.md``)."""

    SUBTASK = 'subtask'
    """Next subtask of the instruction (seed ``"Subtask: "``)."""

    ANSWER = 'answer'
    """Answer to a question about the scene (seed ``"Answer: "``; our format)."""

    MEMORY = 'memory'
    """A textual memory note (seed ``"Memory: "``; OxyGen)."""


_TEXT_SEEDS = {TextTask.SUBTASK: 'Subtask: ', TextTask.ANSWER: 'Answer: ',
               TextTask.MEMORY: 'Memory: '}


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """
    Prompt ids padded to the model's prompt slots.

    :ivar tokens: ``int64 [max_len]`` ids, PAD (0) after ``num_tokens``.
    :ivar mask: ``bool [max_len]``, True for the first ``num_tokens`` slots.
    :ivar num_tokens: number of valid ids (BOS included).
    :ivar truncated: the full prompt did not fit into ``max_len`` and was shortened.
    """

    tokens: np.ndarray
    mask: np.ndarray
    num_tokens: int
    truncated: bool

    @property
    def max_len(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def ids(self) -> list[int]:
        """Return the valid token ids, padding excluded."""
        return self.tokens[:self.num_tokens].tolist()


_warned: set[tuple[object, ...]] = set()
_warned_lock = threading.Lock()


def _warn_once(key: tuple[object, ...], msg: str, *args: object) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(msg, *args)


def clean_text(text: str) -> str:
    """
    Return ``text`` stripped, with ``"_"`` and newlines replaced by spaces (openpi tokenizer.py).

    :raises TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f'prompt text must be str, got {type(text).__name__}')
    return text.strip().replace('_', ' ').replace('\n', ' ')


def normalize_instruction(task: str) -> str:
    """
    Return the instruction as the subtask/memory prompts expect it (``docs/prompts.md``).

    Lower-cased and cleaned (:func:`clean_text`); one trailing punctuation character is
    removed, exactly as openpi_subtask_generation / OxyGen ``tokenize_high_level_prompt`` do
    (the prompt then appends ``"."``).

    :raises ValueError: nothing is left (empty or punctuation-only task).
    """
    instr = clean_text(task).lower()
    if instr and instr[-1] in string.punctuation:
        instr = instr[:-1]
    if not instr.strip():
        raise ValueError(f'task instruction is empty after cleaning: {task!r}')
    return instr


def discretize_state(state_normalized: np.ndarray) -> list[int]:
    """
    Return the 256-bin code of each dim of a normalized state (``docs/model.md#π05-specifics``).

    ``bin = #(edges <= x) - 1`` with ``edges = linspace(-1, 1, 257)[:-1]``, i.e.
    ``floor((x + 1) * 128)`` for x in [-1, 1); 255 for every x >= 0.9921875 (including > 1)
    and -1 for x < -1 (no clipping). Same as openpi's ``np.digitize(x, edges) - 1``; computed in
    float64 on the exact edges.

    :param state_normalized: ``float [state_dim]`` quantile-normalized state, unpadded.
    :returns: ``state_dim`` ints in [-1, 255].
    :raises ValueError: not 1-D, empty, not real numbers, or NaN/Inf.
    """
    x = np.asarray(state_normalized)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f'state must be a non-empty 1-D array, got shape {x.shape}')
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise ValueError(f'state must be a real-valued array, got dtype {x.dtype}')
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f'state has NaN/Inf at dims {np.flatnonzero(~np.isfinite(x)).tolist()}')
    return (np.searchsorted(_STATE_BIN_EDGES, x, side='right') - 1).tolist()


def format_action_prompt(task: str, state_normalized: np.ndarray | None,
                         fmt: PromptFormat, *, state_pad: int = 0) -> str:
    r"""
    Return the action prompt text without BOS (``docs/prompts.md#the-action-prompt-the-root``).

    For ``PI0`` this is ``"{task}\n"``; the ids encode the ``"\n"`` separately.

    :param state_pad: ``PI05_STATE`` only: zero-pad the normalized state to this many dims
        before binning (LeRobot <= v0.4.4: 32); 0 or a smaller number: no padding.
    :raises ValueError: empty task, or PI05_STATE without a state.
    """
    task_text = clean_text(task)
    if not task_text:
        raise ValueError(f'task instruction is empty after cleaning: {task!r}')
    if fmt is PromptFormat.PI05_STATE:
        if state_normalized is None:
            raise ValueError('prompt format pi05_state needs the normalized state')
        state = np.asarray(state_normalized)
        if state.ndim == 1 and state_pad > state.shape[0]:
            state = np.pad(state, (0, state_pad - state.shape[0]))
        bins = ' '.join(str(b) for b in discretize_state(state))
        return f'Task: {task_text}, State: {bins};\nAction: '
    if fmt is PromptFormat.PI05_NO_STATE:
        return f'Task: {task_text};\nAction: '
    if fmt is PromptFormat.PI0:
        return f'{task_text}\n'
    raise ValueError(f'unknown prompt format {fmt!r}')


def _check_max_len(max_len: int) -> None:
    if max_len < 1:
        raise ValueError(f'max_len must be >= 1, got {max_len}')


def _pad(ids: list[int], max_len: int, truncated: bool) -> TokenizedPrompt:
    assert len(ids) <= max_len
    tokens = np.full(max_len, PAD_ID, dtype=np.int64)
    tokens[:len(ids)] = ids
    mask = np.zeros(max_len, dtype=np.bool_)
    mask[:len(ids)] = True
    return TokenizedPrompt(tokens=tokens, mask=mask, num_tokens=len(ids), truncated=truncated)


def action_prompt_ids(tok: PaligemmaTokenizer, task: str, state_normalized: np.ndarray | None,
                      fmt: PromptFormat, *, state_pad: int = 0) -> list[int]:
    """
    Return the ids of the whole action prompt, BOS first, never cut.

    ``tokenize_action_prompt`` cuts and pads them; ``transforms.inputs`` refuses a prompt that
    does not fit.

    :raises ValueError: empty task, missing/invalid state.
    """
    text = format_action_prompt(task, state_normalized, fmt, state_pad=state_pad)
    if fmt is PromptFormat.PI0:
        # openpi encodes the "\n" (the start-of-answer token) on its own, after the task.
        return tok.encode(text.removesuffix('\n'), add_bos=True) + tok.encode('\n', add_bos=False)
    return tok.encode(text, add_bos=True)


def tokenize_action_prompt(tok: PaligemmaTokenizer, task: str,
                           state_normalized: np.ndarray | None, fmt: PromptFormat,
                           max_len: int, *, state_pad: int = 0) -> TokenizedPrompt:
    """
    Tokenize the action prompt and pad it to ``max_len`` (openpi ``tokenizer.py`` ``tokenize``).

    :param tok: the PaliGemma tokenizer.
    :param task: the instruction (cleaned here).
    :param state_normalized: ``float [state_dim]`` normalized unpadded state; required for
        ``PI05_STATE``, ignored for ``PI0``.
    :param fmt: the prompt format (the preset's, or the checkpoint family's).
    :param max_len: the preset's ``max_token_len``; longer prompts are cut (warning).
    :param state_pad: see :func:`format_action_prompt`.
    :raises ValueError: empty task, missing/invalid state, ``max_len`` < 1.
    """
    _check_max_len(max_len)
    ids = action_prompt_ids(tok, task, state_normalized, fmt, state_pad=state_pad)
    truncated = len(ids) > max_len
    if truncated:
        _warn_once(('action', fmt, len(ids), max_len),
                   'action prompt (%s) has %d tokens, more than max_token_len %d: truncated '
                   'at the end as openpi does; raise max_token_len if this happens often',
                   fmt.value, len(ids), max_len)
        ids = ids[:max_len]
    return _pad(ids, max_len, truncated)


def format_text_prompt(task: str, kind: TextTask, *, question: str | None = None) -> str:
    """
    Return the text-task prompt without BOS (``docs/prompts.md``; ANSWER is our own format).

    :raises ValueError: empty task or question, a question for a kind other than ANSWER,
        or no question for ANSWER.
    """
    return _compose(normalize_instruction(task), kind, _question_text(kind, question))


def _question_text(kind: TextTask, question: str | None) -> str | None:
    kind = TextTask(kind)
    if kind is not TextTask.ANSWER:
        if question is not None:
            raise ValueError(f'a question is only used by TextTask.ANSWER, not {kind.name}')
        return None
    if question is None:
        raise ValueError('TextTask.ANSWER needs a question')
    q = clean_text(question)
    if not q:
        raise ValueError(f'question is empty after cleaning: {question!r}')
    return q


def _compose(instr: str, kind: TextTask, question: str | None) -> str:
    kind = TextTask(kind)
    if kind is TextTask.ANSWER:
        return f'Task: {instr}. Question: {question} {_TEXT_SEEDS[kind]}'
    return f'Task: {instr}. {_TEXT_SEEDS[kind]}'


def format_text_suffix(kind: TextTask, *, question: str | None = None) -> str:
    """
    Return a text task's causal suffix after the action prefix (see the module docstring).

    :raises ValueError: empty question, a question for a kind other than ANSWER, or no
        question for ANSWER.
    """
    kind = TextTask(kind)
    q = _question_text(kind, question)
    if kind is TextTask.ANSWER:
        return f'Question: {q} {_TEXT_SEEDS[kind]}'
    return _TEXT_SEEDS[kind]


def tokenize_text_suffix(tok: PaligemmaTokenizer, kind: TextTask, *,
                         question: str | None = None, max_len: int) -> TokenizedPrompt:
    """
    Tokenize a text task's suffix (no BOS) and pad it to ``max_len``.

    An over-long question is shortened at its end and re-encoded, so the ids always end with
    the seed words ``Answer: `` the model decodes after; one warning per cause.

    :param max_len: suffix slots (the preset's ``max_token_len``).
    :raises ValueError: see :func:`format_text_suffix`; ``max_len`` too small for the seed.
    """
    _check_max_len(max_len)
    kind = TextTask(kind)
    ids = tok.encode(format_text_suffix(kind, question=question), add_bos=False)
    full_len = len(ids)
    if full_len <= max_len:
        return _pad(ids, max_len, truncated=False)
    q_ids = tok.encode(_question_text(kind, question), add_bos=False) \
        if kind is TextTask.ANSWER else []
    while len(ids) > max_len and q_ids:
        q_ids = q_ids[:max(0, len(q_ids) - (len(ids) - max_len))]
        ids = tok.encode(f'Question: {tok.decode(q_ids)} {_TEXT_SEEDS[kind]}', add_bos=False)
    if len(ids) > max_len:
        raise ValueError(f'max_len {max_len} cannot hold the {kind.name} suffix even with an '
                         f'empty question ({len(ids)} tokens)')
    _warn_once(('suffix', kind, full_len, max_len),
               '%s suffix has %d tokens, more than max_len %d: shortened the question to fit '
               '(%d tokens), keeping the seed %r', kind.name, full_len, max_len, len(ids),
               _TEXT_SEEDS[kind])
    return _pad(ids, max_len, truncated=True)


def tokenize_text_prompt(tok: PaligemmaTokenizer, task: str, kind: TextTask, *,
                         question: str | None = None, max_len: int) -> TokenizedPrompt:
    """
    Tokenize a text-task prompt (subtask, answer, memory) and pad it to ``max_len``.

    An over-long prompt is shortened at the end of its variable part (ANSWER: tokens are taken
    from the longer of instruction and question, so both shrink towards equal length) and
    re-encoded, so the ids are always the encoding of a well-formed prompt that ends with its
    seed words; a warning is logged once per cause.

    :param tok: the PaliGemma tokenizer.
    :param task: the high-level instruction (see :func:`normalize_instruction`).
    :param kind: which text task.
    :param question: the question, for ``TextTask.ANSWER`` only.
    :param max_len: prompt slots (the preset's ``max_token_len``).
    :raises ValueError: empty task/question, question given for another kind, or
        ``max_len`` too small to hold even the fixed words of the prompt.
    """
    _check_max_len(max_len)
    kind = TextTask(kind)
    instr = normalize_instruction(task)
    q = _question_text(kind, question)
    ids = tok.encode(_compose(instr, kind, q), add_bos=True)
    full_len = len(ids)
    if full_len <= max_len:
        return _pad(ids, max_len, truncated=False)
    # Remove the overflow from the ends of the variable parts, always from the longer one
    # (ties: the instruction), and re-encode the whole prompt; every round removes >= 1 token.
    instr_ids = tok.encode(instr, add_bos=False)
    q_ids = tok.encode(q, add_bos=False) if q is not None else []
    while len(ids) > max_len and (instr_ids or q_ids):
        n_instr, n_q = len(instr_ids), len(q_ids)
        for _ in range(min(len(ids) - max_len, n_instr + n_q)):
            if n_instr >= n_q:
                n_instr -= 1
            else:
                n_q -= 1
        instr_ids, q_ids = instr_ids[:n_instr], q_ids[:n_q]
        ids = tok.encode(_compose(tok.decode(instr_ids), kind,
                                  tok.decode(q_ids) if q is not None else None), add_bos=True)
    if len(ids) > max_len:
        raise ValueError(f'max_len {max_len} cannot hold the {kind.name} prompt even with an '
                         f'empty instruction ({len(ids)} tokens)')
    _warn_once(('text', kind, full_len, max_len),
               '%s prompt has %d tokens, more than max_len %d: shortened the %s to fit (%d '
               'tokens), keeping the seed %r', kind.name, full_len, max_len,
               'instruction/question' if kind is TextTask.ANSWER else 'instruction', len(ids),
               _TEXT_SEEDS[kind])
    return _pad(ids, max_len, truncated=True)


__all__ = [
    'NUM_STATE_BINS', 'TextTask', 'TokenizedPrompt', 'action_prompt_ids', 'clean_text',
    'discretize_state', 'format_action_prompt', 'format_text_prompt', 'format_text_suffix',
    'normalize_instruction', 'tokenize_action_prompt', 'tokenize_text_prompt',
    'tokenize_text_suffix',
]
