"""
The PaliGemma SentencePiece tokenizer (``docs/checkpoints.md#tokenizer``).

The PaliGemma vocabulary is the Gemma SentencePiece model (256000 pieces: pad 0, eos 1,
bos 2) with 1024 ``<loc0000>``…``<loc1023>`` and then 128 ``<seg000>``…``<seg127>`` pieces
appended (257152 ids). big_vision (``pp/ops_text.py``, ``_add_pieces``) appends them as
``USER_DEFINED`` pieces with score 0.0, and its published ``paligemma_tokenizer.model`` is that
model with the pieces baked in; :func:`extend_to_paligemma` builds the same layout.

``sentencepiece`` is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, TYPE_CHECKING

from oxygen_ros.config import BOS_ID, EOS_ID, PAD_ID, PALIGEMMA_VOCAB_SIZE
from oxygen_ros.resources import cache_dir

if TYPE_CHECKING:  # pragma: no cover
    import sentencepiece

logger = logging.getLogger(__name__)

GEMMA_VOCAB_SIZE = 256_000
"""Pieces of the plain Gemma SentencePiece model."""

NUM_LOC_TOKENS = 1024
NUM_SEG_TOKENS = 128
LOC_TOKEN_OFFSET = GEMMA_VOCAB_SIZE
"""Id of ``<loc0000>``."""
SEG_TOKEN_OFFSET = GEMMA_VOCAB_SIZE + NUM_LOC_TOKENS
"""Id of ``<seg000>``."""

TOKENIZER_FILENAME = 'paligemma_tokenizer.model'

_SPECIAL_PIECES = {PAD_ID: '<pad>', EOS_ID: '<eos>', BOS_ID: '<bos>'}

assert SEG_TOKEN_OFFSET + NUM_SEG_TOKENS == PALIGEMMA_VOCAB_SIZE


def paligemma_extra_pieces() -> list[str]:
    """Return the 1152 pieces PaliGemma appends to Gemma, in id order (loc, then seg)."""
    return ([f'<loc{i:04d}>' for i in range(NUM_LOC_TOKENS)]
            + [f'<seg{i:03d}>' for i in range(NUM_SEG_TOKENS)])


def default_tokenizer_path() -> Path:
    """Return ``<cache_dir()>/paligemma_tokenizer.model`` (written by oxygen_fetch tokenizer)."""
    return cache_dir() / TOKENIZER_FILENAME


def _model_proto_module():
    from sentencepiece import sentencepiece_model_pb2
    return sentencepiece_model_pb2


def extend_to_paligemma(gemma_model: bytes) -> bytes:
    """
    Append the PaliGemma ``<loc>``/``<seg>`` pieces to a serialized Gemma SentencePiece model.

    The pieces are ``USER_DEFINED`` with score 0.0, appended after id 255999 (big_vision
    ``pp/ops_text.py``), so ``<loc0000>`` = 256000 and ``<seg127>`` = 257151.

    :param gemma_model: serialized ``ModelProto`` with exactly 256000 pieces.
    :returns: serialized ``ModelProto`` with 257152 pieces.
    :raises ValueError: the bytes are not a SentencePiece model, do not have 256000 pieces,
        or already contain one of the pieces to add.
    """
    from google.protobuf.message import DecodeError

    pb = _model_proto_module()
    try:
        proto = pb.ModelProto.FromString(gemma_model)
    except DecodeError as exc:
        raise ValueError(f'not a SentencePiece model ({exc})') from None
    if len(proto.pieces) != GEMMA_VOCAB_SIZE:
        raise ValueError(f'expected a Gemma SentencePiece model with {GEMMA_VOCAB_SIZE} '
                         f'pieces, got {len(proto.pieces)}')
    existing = {p.piece for p in proto.pieces}
    extra = paligemma_extra_pieces()
    clash = [piece for piece in extra if piece in existing]
    if clash:
        raise ValueError(f'the Gemma model already has {len(clash)} of the PaliGemma pieces '
                         f'(first: {clash[0]!r}); refusing to build a second copy')
    user_defined = pb.ModelProto.SentencePiece.USER_DEFINED
    for piece in extra:
        proto.pieces.add(piece=piece, score=0.0, type=user_defined)
    return proto.SerializeToString()


def _check_layout(sp: sentencepiece.SentencePieceProcessor, origin: str) -> None:
    """Raise ValueError unless ``sp`` has the PaliGemma ids (size, specials, loc/seg)."""
    size = sp.get_piece_size()
    if size != PALIGEMMA_VOCAB_SIZE:
        raise ValueError(f'{origin}: expected {PALIGEMMA_VOCAB_SIZE} pieces, got {size}')
    for idx, piece in _SPECIAL_PIECES.items():
        if sp.id_to_piece(idx) != piece:
            raise ValueError(f'{origin}: id {idx} is {sp.id_to_piece(idx)!r}, expected {piece!r}')
    ids = (sp.pad_id(), sp.eos_id(), sp.bos_id())
    if ids != (PAD_ID, EOS_ID, BOS_ID):
        raise ValueError(f'{origin}: (pad, eos, bos) ids are {ids}, expected '
                         f'{(PAD_ID, EOS_ID, BOS_ID)}')
    for idx, piece in ((LOC_TOKEN_OFFSET, '<loc0000>'),
                       (SEG_TOKEN_OFFSET - 1, '<loc1023>'),
                       (SEG_TOKEN_OFFSET, '<seg000>'),
                       (PALIGEMMA_VOCAB_SIZE - 1, '<seg127>')):
        if sp.id_to_piece(idx) != piece:
            raise ValueError(f'{origin}: id {idx} is {sp.id_to_piece(idx)!r}, expected '
                             f'{piece!r} (not the PaliGemma layout)')


def load_paligemma_processor(model: bytes, origin: str) -> sentencepiece.SentencePieceProcessor:
    """
    Build a SentencePiece processor with the PaliGemma layout from serialized model bytes.

    A 257152-piece PaliGemma model is used as is; a 256000-piece Gemma model is extended in
    memory with :func:`extend_to_paligemma`.

    :param model: serialized SentencePiece ``ModelProto``.
    :param origin: where the bytes came from, for error messages.
    :raises ValueError: not a SentencePiece model, or neither layout.
    """
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.load_from_serialized_proto(model)
    except RuntimeError as exc:
        raise ValueError(f'{origin}: not a SentencePiece model ({exc})') from None
    if sp.get_piece_size() == GEMMA_VOCAB_SIZE:
        logger.info('%s is a plain Gemma model; adding the PaliGemma <loc>/<seg> pieces', origin)
        sp = sentencepiece.SentencePieceProcessor()
        sp.load_from_serialized_proto(extend_to_paligemma(model))
    _check_layout(sp, origin)
    return sp


class PaligemmaTokenizer:
    """
    Text ⇄ PaliGemma token ids (SentencePiece; openpi ``src/openpi/models/tokenizer.py``).

    Thread-safe after construction (SentencePiece encode/decode are const).

    :param path: a ``paligemma_tokenizer.model`` (257152 pieces, e.g. openpi's cached
        ``big_vision/paligemma_tokenizer.model``) or a plain 256000-piece Gemma model, which is
        extended in memory. ``None``: ``<cache_dir()>/paligemma_tokenizer.model``.
    :raises FileNotFoundError: no file at ``path``; the message says how to get one.
    :raises ValueError: the file is not a SentencePiece model with either layout.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self._path = Path(path).expanduser() if path is not None else default_tokenizer_path()
        if not self._path.is_file():
            raise FileNotFoundError(
                f'PaliGemma tokenizer not found at {self._path}. Run `oxygen_fetch tokenizer` '
                f'(downloads the Gemma SentencePiece model from the maxtext wheel on PyPI and '
                f'writes {default_tokenizer_path()}), or pass your own '
                f'{TOKENIZER_FILENAME} (node parameter `tokenizer:=PATH`).')
        self._sp = load_paligemma_processor(self._path.read_bytes(), str(self._path))

    @property
    def path(self) -> Path:
        return self._path

    @property
    def vocab_size(self) -> int:
        """Return the number of ids (257152)."""
        return self._sp.get_piece_size()

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    def encode(self, text: str, *, add_bos: bool) -> list[int]:
        """
        Return the SentencePiece ids of ``text`` (no EOS; the caller adds BOS, as openpi).

        :param text: any string; not cleaned here (see ``prompt.clean_text``).
        :param add_bos: prepend BOS (id 2).
        :raises TypeError: ``text`` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f'text must be str, got {type(text).__name__}')
        ids = self._sp.encode(text)
        return [BOS_ID, *ids] if add_bos else list(ids)

    def decode(self, ids: Iterable[int]) -> str:
        """
        Return the text of ``ids``, stopping at the first EOS; pad and BOS ids are dropped.

        :param ids: token ids (list, tuple or 1-D integer array).
        :raises ValueError: an id is outside ``[0, vocab_size)``.
        """
        out: list[int] = []
        for raw in ids:
            idx = int(raw)
            if idx == EOS_ID:
                break
            if not 0 <= idx < self.vocab_size:
                raise ValueError(f'token id {idx} outside [0, {self.vocab_size})')
            if idx not in (PAD_ID, BOS_ID):
                out.append(idx)
        return self._sp.decode(out)

    def id_to_piece(self, idx: int) -> str:
        """
        Return the piece of one id (e.g. 256000 → ``'<loc0000>'``).

        :raises ValueError: ``idx`` outside ``[0, vocab_size)``.
        """
        if not 0 <= idx < self.vocab_size:
            raise ValueError(f'token id {idx} outside [0, {self.vocab_size})')
        return self._sp.id_to_piece(idx)

    def is_byte(self, idx: int) -> bool:
        """Return whether ``idx`` is a byte-fallback piece (``<0x00>``…``<0xFF>``)."""
        return 0 <= idx < self.vocab_size and self._sp.is_byte(idx)

    def is_control(self, idx: int) -> bool:
        """Return whether ``idx`` is a control piece (pad, eos, bos: no text of its own)."""
        return 0 <= idx < self.vocab_size and self._sp.is_control(idx)

    def piece_to_id(self, piece: str) -> int:
        """
        Return the id of one piece.

        :raises KeyError: unknown piece.
        """
        idx = self._sp.piece_to_id(piece)
        if idx == self._sp.unk_id() and piece != self._sp.id_to_piece(idx):
            raise KeyError(f'unknown piece {piece!r}')
        return idx

    def __repr__(self) -> str:
        return f'PaligemmaTokenizer(path={str(self._path)!r}, vocab_size={self.vocab_size})'


__all__ = [
    'GEMMA_VOCAB_SIZE', 'LOC_TOKEN_OFFSET', 'NUM_LOC_TOKENS', 'NUM_SEG_TOKENS',
    'PaligemmaTokenizer', 'SEG_TOKEN_OFFSET', 'TOKENIZER_FILENAME', 'default_tokenizer_path',
    'extend_to_paligemma', 'load_paligemma_processor', 'paligemma_extra_pieces',
]
