"""
Incremental detokenization (transforms/detokenizer.py): pieces concatenate to ``decode(all ids)``.

Property tests push random id sequences (random ids of the whole vocabulary, byte-fallback
runs that split multi-byte characters at every position, invalid UTF-8, pad/bos between bytes,
EOS, unknown and user-defined pieces) in random chunks, with the PaliGemma tokenizer and with a
small SentencePiece model trained here that adds a dummy prefix (the leading-space rule the
Gemma model does not have).
"""

import io

from hypothesis import given, HealthCheck, settings, strategies as st
from oxygen_ros.transforms.detokenizer import IncrementalDetokenizer
import pytest

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _byte_ids(tok, data: bytes) -> list[int]:
    return [tok.piece_to_id(f'<0x{b:02X}>') for b in data]


def _stream(tok, chunks, final_empty_push):
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(chunk, final=(i == len(chunks) - 1 and not final_empty_push))
              for i, chunk in enumerate(chunks)]
    if final_empty_push:
        pieces.append(detok.push([], final=True))
    return detok, pieces


def _split(draw, ids):
    cuts = sorted(draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1)))
    bounds = [0, *cuts, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def paligemma_ids(draw, tok):
    """Id sequences mixing every kind of piece the PaliGemma vocabulary has."""
    parts = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(['any', 'word', 'bytes', 'utf8', 'special', 'user']))
        if kind == 'any':
            parts += draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=4))
        elif kind == 'word':
            text = draw(st.text(alphabet=st.characters(codec='utf-8'), max_size=8))
            parts += tok.encode(text, add_bos=False)
        elif kind == 'bytes':
            parts += _byte_ids(tok, draw(st.binary(max_size=6)))
        elif kind == 'utf8':
            parts += _byte_ids(tok, draw(st.sampled_from(['€', 'é', '😀', '中文', 'ü'])).encode())
        elif kind == 'special':
            parts.append(draw(st.sampled_from([tok.pad_id, tok.bos_id, tok.eos_id, 3])))
        else:
            parts.append(draw(st.sampled_from([4, 5, 256_000, 257_151])))
    return parts


@given(data=st.data())
@SETTINGS
def test_pieces_concatenate_to_decode_paligemma(tok, data):
    ids = data.draw(paligemma_ids(tok))
    chunks = _split(data.draw, ids)
    detok, pieces = _stream(tok, chunks, data.draw(st.booleans()))
    assert ''.join(pieces) == tok.decode(ids)
    assert detok.text == tok.decode(ids)


def test_multibyte_character_split_over_cycles(tok):
    detok = IncrementalDetokenizer(tok)
    euro = _byte_ids(tok, '€'.encode())
    assert [detok.push([i]) for i in euro[:2]] == ['', '']  # incomplete: held back
    assert detok.push(euro[2:]) == '€'  # complete: released before any non-byte piece
    word = tok.encode(' hello', add_bos=False)
    assert detok.push(word) == ' hello'
    assert detok.push([tok.eos_id, *word]) == ''  # EOS ends the text, later ids ignored
    assert detok.ended and detok.text == '€ hello' == tok.decode([*euro, *word])


def test_bytes_join_across_pad_and_invalid_bytes_flush_at_the_end(tok):
    detok = IncrementalDetokenizer(tok)
    e2, x82, xac = _byte_ids(tok, '€'.encode())
    assert detok.push([e2, tok.pad_id]) == ''
    assert detok.push([x82, xac]) == '€'  # pad is dropped by decode: the bytes join
    assert detok.push([e2]) == ''
    assert detok.push([], final=True) == '\ufffd'  # an unfinished character at the end
    assert detok.text == tok.decode([e2, tok.pad_id, x82, xac, e2]) == '€\ufffd'


def test_leading_space_of_the_first_piece_is_kept_like_decode(tok):
    ids = tok.encode(' pick up the cup', add_bos=False)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    assert pieces[0].startswith(' ') and ''.join(pieces) == tok.decode(ids)


def test_windows_stay_small(tok):
    """Each push decodes a window from the previous piece on, never the whole text."""
    calls = []

    class Counting:
        eos_id = tok.eos_id
        is_byte = staticmethod(tok.is_byte)
        is_control = staticmethod(tok.is_control)

        def decode(self, ids):
            calls.append(len(ids))
            return tok.decode(ids)

    detok = IncrementalDetokenizer(Counting())
    ids = tok.encode(' the robot picks up the red cup and puts it in the sink' * 8,
                     add_bos=False)
    for i in range(0, len(ids), 4):
        detok.push(ids[i:i + 4])
    assert detok.text == tok.decode(ids) and len(ids) > 100
    assert max(calls) <= 8


class _SentencePieceAdapter:
    """A plain SentencePiece model behind the tokenizer interface (pad 0, eos 1, bos 2)."""

    eos_id = 1

    def __init__(self, sp):
        self.sp = sp

    def decode(self, ids):
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i not in (0, 2):
                out.append(int(i))
        return self.sp.decode(out)

    def is_byte(self, idx):
        return self.sp.is_byte(idx)

    def is_control(self, idx):
        return self.sp.is_control(idx)


@pytest.fixture(scope='module')
def dummy_prefix_sp():
    """Return a ~290-piece model with byte fallback and a dummy prefix (trained in ~0.1 s)."""
    import sentencepiece as spm
    corpus = ['the robot picks up the red cup', 'put the cup in the sink', 'où est le café ?',
              'open the drawer', 'was ist auf dem Tisch', 'pick up the coffee cup'] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=300, hard_vocab_limit=False,
        byte_fallback=True, add_dummy_prefix=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    assert sp.is_byte(sp.piece_to_id('<0xE2>'))
    return _SentencePieceAdapter(sp)


@given(data=st.data())
@SETTINGS
def test_pieces_concatenate_with_a_dummy_prefix_model(dummy_prefix_sp, data):
    size = dummy_prefix_sp.sp.get_piece_size()
    space = dummy_prefix_sp.sp.piece_to_id('▁')
    ids = data.draw(st.lists(st.one_of(st.integers(0, size - 1), st.just(space)), max_size=30))
    chunks = _split(data.draw, ids)
    _, pieces = _stream(dummy_prefix_sp, chunks, data.draw(st.booleans()))
    assert ''.join(pieces) == dummy_prefix_sp.decode(ids)
