"""PaliGemma tokenizer (transforms/tokenizer.py) and its builder (tools/fetch_tokenizer.py)."""

import hashlib
from pathlib import Path
import subprocess
import zipfile

from oxygen_ros.tools.fetch import tokenizer as fetch_tokenizer
from oxygen_ros.transforms.tokenizer import (
    default_tokenizer_path, extend_to_paligemma, GEMMA_VOCAB_SIZE, PaligemmaTokenizer)
import pytest


def _fetched_path() -> Path:
    path = default_tokenizer_path()
    if not path.is_file():
        pytest.fail(f'{path} is missing: run `oxygen_fetch tokenizer` first (`make test` does)')
    return path


@pytest.fixture(scope='module')
def tok() -> PaligemmaTokenizer:
    return PaligemmaTokenizer(_fetched_path())


@pytest.fixture(scope='module')
def gemma_bytes() -> bytes:
    """Rebuild the Gemma model by dropping the 1152 PaliGemma pieces of the fetched file."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(_fetched_path().read_bytes())
    del proto.pieces[GEMMA_VOCAB_SIZE:]
    return proto.SerializeToString()


def test_layout_and_special_ids(tok):
    assert tok.vocab_size == 257_152
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert [tok.id_to_piece(i) for i in range(3)] == ['<pad>', '<eos>', '<bos>']
    assert tok.piece_to_id('<loc0000>') == 256_000
    assert tok.piece_to_id('<loc1023>') == 257_023
    assert tok.piece_to_id('<seg000>') == 257_024
    assert tok.piece_to_id('<seg127>') == 257_151
    assert tok.id_to_piece(256_512) == '<loc0512>'
    with pytest.raises(KeyError, match='unknown piece'):
        tok.piece_to_id('<loc1024>')


def test_added_pieces_are_user_defined_like_big_vision():
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(_fetched_path().read_bytes())
    extra = proto.pieces[GEMMA_VOCAB_SIZE:]
    assert len(extra) == 1152
    assert {p.type for p in extra} == {pb.ModelProto.SentencePiece.USER_DEFINED}
    assert {p.score for p in extra} == {0.0}


def test_first_256000_pieces_are_the_pinned_gemma_model(gemma_bytes):
    assert hashlib.sha256(gemma_bytes).hexdigest() == fetch_tokenizer.GEMMA_SHA256


@pytest.mark.parametrize('text', [
    'pick up the red cup', 'Task: fold the towel, State: 128 0 255 -1;\nAction: ',
    'déplacez la tasse 3 cm à gauche', '  two  spaces and a tab\t', 'emoji 🤖 ok'])
def test_round_trip(tok, text):
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == 2 and 2 not in ids[1:]
    assert tok.decode(ids) == text
    assert tok.encode(text, add_bos=False) == ids[1:]


def test_known_gemma_ids(tok):
    # Pinned by the vocabulary itself: Gemma has a single piece for "\n" and splits digits.
    assert tok.encode('\n', add_bos=False) == [108]
    assert tok.encode('Task:', add_bos=False) == [7071, 235292]
    assert len(tok.encode('255', add_bos=False)) == 3


def test_loc_and_seg_pieces_encode_and_decode(tok):
    ids = tok.encode('<loc0005><seg017> cat', add_bos=False)
    assert ids[:2] == [256_005, 257_041]
    assert tok.decode(ids) == '<loc0005><seg017> cat'


def test_decode_stops_at_eos_and_drops_pad_and_bos(tok):
    hello = tok.encode('hello world', add_bos=False)
    assert tok.decode([2, *hello, 1, *tok.encode('junk', add_bos=False), 0]) == 'hello world'
    assert tok.decode([0, 0, *hello, 0]) == 'hello world'
    assert tok.decode([1, *hello]) == ''
    with pytest.raises(ValueError, match='257152'):
        tok.decode([5, 257_152])
    with pytest.raises(ValueError, match='outside'):
        tok.decode([-1])


def test_encode_rejects_non_str(tok):
    with pytest.raises(TypeError, match='must be str'):
        tok.encode(b'bytes', add_bos=True)


def test_missing_file_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match='oxygen_fetch tokenizer.*tokenizer:='):
        PaligemmaTokenizer(tmp_path / 'nope.model')


def test_rejects_non_sentencepiece_file(tmp_path):
    bad = tmp_path / 'bad.model'
    bad.write_bytes(b'this is not a sentencepiece model')
    with pytest.raises(ValueError, match='not a SentencePiece model'):
        PaligemmaTokenizer(bad)


def test_rejects_wrong_vocab_size(tmp_path, gemma_bytes):
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(gemma_bytes)
    del proto.pieces[200_000:]
    path = tmp_path / 'small.model'
    path.write_bytes(proto.SerializeToString())
    with pytest.raises(ValueError, match='expected 257152 pieces, got 200000'):
        PaligemmaTokenizer(path)


def test_plain_gemma_model_is_extended_in_memory(tmp_path, tok, gemma_bytes):
    path = tmp_path / 'tokenizer.gemma'
    path.write_bytes(gemma_bytes)
    gemma_tok = PaligemmaTokenizer(path)
    assert gemma_tok.vocab_size == 257_152
    text = 'Task: stack the blocks <loc0042>'
    assert gemma_tok.encode(text, add_bos=True) == tok.encode(text, add_bos=True)


def test_extend_refuses_bad_input(gemma_bytes):
    with pytest.raises(ValueError, match='expected a Gemma SentencePiece model with 256000'):
        extend_to_paligemma(extend_to_paligemma(gemma_bytes))
    with pytest.raises(ValueError, match='not a SentencePiece model'):
        extend_to_paligemma(b'\xff\xff\xff')


# --- oxygen_fetch tokenizer (no network: local sources and a faked pip) ---------------------

def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, 'w') as zf:
        zf.writestr(member, data)
    return path


def test_fetch_from_gemma_file_matches_cached_file_and_is_idempotent(
        tmp_path, gemma_bytes, capsys):
    src = tmp_path / 'tokenizer.gemma'
    src.write_bytes(gemma_bytes)
    out = tmp_path / 'cache' / 'paligemma_tokenizer.model'
    assert fetch_tokenizer.main(['--source', str(src), '--out', str(out)]) == 0
    assert out.read_bytes() == _fetched_path().read_bytes()
    assert 'wrote' in capsys.readouterr().out
    stamp = out.stat().st_mtime_ns
    assert fetch_tokenizer.main(['--source', str(src), '--out', str(out)]) == 0
    assert 'already valid' in capsys.readouterr().out
    assert out.stat().st_mtime_ns == stamp
    assert fetch_tokenizer.main(['--source', str(src), '--out', str(out), '--force']) == 0
    assert 'wrote' in capsys.readouterr().out
    assert not list(out.parent.glob('*.tmp'))


def test_fetch_from_wheel_and_from_paligemma_file(tmp_path, gemma_bytes):
    wheel = _wheel(tmp_path / 'maxtext-0.2.5-py3-none-any.whl', fetch_tokenizer.GEMMA_MEMBER,
                   gemma_bytes)
    out = tmp_path / 'a.model'
    assert fetch_tokenizer.main(['--source', str(wheel), '--out', str(out)]) == 0
    assert out.read_bytes() == _fetched_path().read_bytes()
    out2 = tmp_path / 'b.model'
    assert fetch_tokenizer.main(['--source', str(out), '--out', str(out2)]) == 0
    assert out2.read_bytes() == out.read_bytes()


def test_fetch_replaces_an_invalid_file_without_force(tmp_path, gemma_bytes):
    src = tmp_path / 'tokenizer.gemma'
    src.write_bytes(gemma_bytes)
    out = tmp_path / 'paligemma_tokenizer.model'
    out.write_bytes(b'truncated download')
    assert fetch_tokenizer.main(['--source', str(src), '--out', str(out)]) == 0
    assert out.read_bytes() == _fetched_path().read_bytes()


@pytest.mark.parametrize('member,data,message', [
    (fetch_tokenizer.GEMMA_MEMBER, b'not the model', 'sha256 .* does not match'),
    ('maxtext/other.txt', b'x', 'has no maxtext/assets/tokenizers/tokenizer.gemma'),
])
def test_fetch_rejects_bad_wheels(tmp_path, capsys, member, data, message):
    wheel = _wheel(tmp_path / 'maxtext.whl', member, data)
    out = tmp_path / 'out.model'
    assert fetch_tokenizer.main(['--source', str(wheel), '--out', str(out)]) == 1
    assert capsys.readouterr().err.count('error') == 1
    assert not out.exists()
    with pytest.raises(fetch_tokenizer.FetchError, match=message):
        fetch_tokenizer.fetch(out, source=wheel)


def test_fetch_rejects_bad_source_files(tmp_path, gemma_bytes, capsys):
    from sentencepiece import sentencepiece_model_pb2 as pb
    garbage = tmp_path / 'garbage.model'
    garbage.write_bytes(b'garbage')
    assert fetch_tokenizer.main(['--source', str(garbage), '--out', str(tmp_path / 'o')]) == 1
    assert 'not a SentencePiece model' in capsys.readouterr().err
    proto = pb.ModelProto.FromString(gemma_bytes)
    proto.pieces[5000].piece = 'tampered'
    other = tmp_path / 'other_gemma.model'
    other.write_bytes(proto.SerializeToString())
    assert fetch_tokenizer.main(['--source', str(other), '--out', str(tmp_path / 'o')]) == 1
    assert 'does not match the Gemma tokenizer' in capsys.readouterr().err
    valid = tmp_path / 'valid.model'
    valid.write_bytes(_fetched_path().read_bytes())
    assert fetch_tokenizer.main(['--source', str(tmp_path / 'missing'), '--out', str(valid)]) == 1
    assert 'is not a file' in capsys.readouterr().err


def test_download_failure_says_what_to_do(tmp_path, monkeypatch, capsys):
    def failing_pip(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, '', 'ERROR: No matching distribution found '
                                           'for maxtext==0.2.5 (network is unreachable)')
    monkeypatch.setattr(fetch_tokenizer.subprocess, 'run', failing_pip)
    out = tmp_path / 'paligemma_tokenizer.model'
    assert fetch_tokenizer.main(['--out', str(out)]) == 1
    err = capsys.readouterr().err
    assert 'could not download maxtext==0.2.5' in err
    assert 'network is unreachable' in err
    assert 'paligemma_tokenizer.model' in err and 'tokenizer:=PATH' in err and '--source' in err
    assert not out.exists()


def test_download_runs_pip_download_of_the_pinned_wheel(tmp_path, monkeypatch, gemma_bytes):
    seen = []

    def fake_pip(cmd, **kwargs):
        seen.append(cmd)
        dest = Path(cmd[cmd.index('-d') + 1])
        _wheel(dest / 'maxtext-0.2.5-py3-none-any.whl', fetch_tokenizer.GEMMA_MEMBER,
               gemma_bytes)
        return subprocess.CompletedProcess(cmd, 0, 'Saved', '')
    monkeypatch.setattr(fetch_tokenizer.subprocess, 'run', fake_pip)
    out = tmp_path / 'paligemma_tokenizer.model'
    assert fetch_tokenizer.main(['--out', str(out)]) == 0
    (cmd,) = seen
    assert cmd[1:4] == ['-m', 'pip', 'download']
    for flag in ('--no-deps', '--only-binary=:all:', 'maxtext==0.2.5'):
        assert flag in cmd
    assert cmd[cmd.index('--python-version') + 1] == '3.12'
    assert out.read_bytes() == _fetched_path().read_bytes()
