"""
Incremental detokenization: the text of a token stream, piece by piece, as tokens arrive.

``IncrementalDetokenizer.push`` takes the token ids a text request decoded in one control
cycle and returns the new text, so that the pieces of a request concatenate exactly to
``tokenizer.decode(all ids)``. It never decodes the whole text again: each push decodes a
window that starts at the previous piece (the same idea as the ``prefix_offset`` /
``read_offset`` windows of vLLM's and Hugging Face TGI's incremental detokenizers, here with
boundaries chosen from SentencePiece's rules):

- **Byte-fallback pieces** (``<0xE2>`` ``<0x82>`` ``<0xAC>`` = ``€``): SentencePiece decodes a
  run of byte pieces as UTF-8, one U+FFFD per invalid byte. A run may end at any cycle, so text
  is held back while the decoded window ends in U+FFFD after a byte piece (a character still
  incomplete); it is released once the character is complete or a non-byte piece follows.
- **Control pieces** (pad, bos) decode to nothing and are dropped before decoding, so byte
  pieces on both sides of them join: a window never ends right after one.
- **EOS** ends the text (``PaligemmaTokenizer.decode`` stops there); later ids are ignored.
- **The leading-space rule** (SentencePiece drops the ``▁`` of the first piece of a text when
  the model adds a dummy prefix; the Gemma / PaliGemma model does not): a window only starts
  at a piece whose own text is not empty, so the rule applies to the same piece in both
  decodes whose difference is returned.

Pure Python; the tokenizer is anything with ``decode``, ``is_byte``, ``is_control`` and
``eos_id`` (``oxygen_ros.transforms.tokenizer.PaligemmaTokenizer``).
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

_REPLACEMENT = '\ufffd'


class SupportsDetokenize(Protocol):
    """What ``IncrementalDetokenizer`` needs from a tokenizer."""

    @property
    def eos_id(self) -> int: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def is_byte(self, idx: int) -> bool: ...

    def is_control(self, idx: int) -> bool: ...


class IncrementalDetokenizer:
    """
    Turns one request's token ids, pushed cycle by cycle, into text pieces.

    Not thread-safe: one instance per request, used by one thread.

    :param tokenizer: decodes ids (``PaligemmaTokenizer``).
    """

    def __init__(self, tokenizer: SupportsDetokenize) -> None:
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        """Start of the decode window: ``ids[prefix:read]`` has non-empty text (or is 0)."""
        self._read = 0
        """The text of ``ids[:read]`` has been returned."""
        self._prefix_text = ''
        """``decode(ids[prefix:read])``, kept from the push that set ``prefix`` and ``read``."""
        self._ended = False
        self._closed = False
        self._text: list[str] = []

    @property
    def text(self) -> str:
        """Return every piece returned so far, concatenated."""
        return ''.join(self._text)

    @property
    def num_tokens(self) -> int:
        """Return the ids pushed until the end of the text (EOS excluded)."""
        return len(self._ids)

    @property
    def closed(self) -> bool:
        """Return whether the text is complete (after EOS or a final push): push returns ''."""
        return self._closed

    @property
    def ended(self) -> bool:
        """Return whether an EOS id was pushed (the text is complete)."""
        return self._ended

    def push(self, ids: Sequence[int], *, final: bool = False) -> str:
        """
        Add the next ids of the request and return the text they complete.

        :param ids: token ids in decode order (any ints; after EOS they are ignored).
        :param final: no more ids will come: return everything still held back.
        :returns: the new text; ``''`` when nothing is complete yet (held back) or after the
            final push.
        """
        if self._closed:
            return ''
        eos = self._tok.eos_id
        for raw in ids:
            if self._ended:
                break
            idx = int(raw)
            if idx == eos:
                self._ended = True
            else:
                self._ids.append(idx)
        if final or self._ended:
            self._closed = True
            end, window = len(self._ids), None
        else:
            end, window = self._stable_end()
        if end <= self._read:
            return ''
        if window is None:
            window = self._tok.decode(self._ids[self._prefix:end])
        assert window.startswith(self._prefix_text), (self._prefix_text, window)
        piece = window[len(self._prefix_text):]
        tail = self._tok.decode(self._ids[self._read:end])
        if tail:  # the window moves on: ids[read:end] have text of their own
            self._prefix, self._prefix_text = self._read, tail
        else:
            self._prefix_text = window
        self._read = end
        self._text.append(piece)
        return piece

    def _stable_end(self) -> tuple[int, str | None]:
        """
        Return the longest prefix of the ids whose text no later id can change.

        :returns: ``(end, text of ids[prefix:end] if it was decoded, else None)``.
        """
        ids, is_byte, is_control = self._ids, self._tok.is_byte, self._tok.is_control
        end = len(ids)
        while end > self._read and is_control(ids[end - 1]):
            end -= 1
        if end <= self._read or not is_byte(ids[end - 1]):
            return end, None
        window = self._tok.decode(ids[self._prefix:end])
        if not window.endswith(_REPLACEMENT):
            return end, window  # the byte run ends with a complete character
        while end > self._read and (is_byte(ids[end - 1]) or is_control(ids[end - 1])):
            end -= 1
        return end, None


__all__ = ['IncrementalDetokenizer', 'SupportsDetokenize']
