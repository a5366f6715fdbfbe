"""
``oxygen_fetch tokenizer``: build the PaliGemma tokenizer from the Gemma model on PyPI.

The Gemma SentencePiece model (256000 pieces) ships inside the ``maxtext==0.2.5`` wheel as
``maxtext/assets/tokenizers/tokenizer.gemma``. This tool downloads that wheel with pip (no
dependencies, nothing installed), extracts only that file, checks its sha256, appends the
PaliGemma ``<loc>``/``<seg>`` pieces (``transforms.tokenizer.extend_to_paligemma``) and writes
``<cache_dir()>/paligemma_tokenizer.model`` atomically. It does nothing when a valid file is
already there (``--force`` rebuilds). ``--source`` takes a local maxtext wheel, the Gemma
``tokenizer.gemma`` file or a ready ``paligemma_tokenizer.model`` instead of downloading
(``docs/checkpoints.md#tokenizer``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
import subprocess
import sys
import tempfile
from typing import Sequence
import zipfile

from oxygen_ros.transforms.tokenizer import (
    default_tokenizer_path, extend_to_paligemma, GEMMA_VOCAB_SIZE, load_paligemma_processor,
    TOKENIZER_FILENAME)

MAXTEXT_REQUIREMENT = 'maxtext==0.2.5'
GEMMA_MEMBER = 'maxtext/assets/tokenizers/tokenizer.gemma'
GEMMA_SHA256 = '61a7b147390c64585d6c3543dd6fc636906c9af3865a5548f27f31aee1d4c8e2'
PIP_TIMEOUT_S = 300

_OFFLINE_HINT = (
    'Without network access, get a PaliGemma tokenizer another way: openpi caches it as '
    '~/.cache/openpi/big_vision/paligemma_tokenizer.model (from '
    'gs://big_vision/paligemma_tokenizer.model). Pass that file directly (node parameter '
    '`tokenizer:=PATH`, or PaligemmaTokenizer(PATH)), or install it into the cache with '
    '`oxygen_fetch tokenizer --source PATH`; a maxtext-0.2.5 wheel downloaded elsewhere '
    '(`pip download --no-deps maxtext==0.2.5`) also works as --source.')


class FetchError(RuntimeError):
    """The tokenizer could not be obtained; the message says what to do."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_gemma(data: bytes, origin: str) -> bytes:
    """
    Return ``data`` if it is the expected Gemma model (sha256 ``GEMMA_SHA256``).

    :raises FetchError: another file.
    """
    digest = _sha256(data)
    if digest != GEMMA_SHA256:
        raise FetchError(f'{origin}: sha256 {digest} does not match the Gemma tokenizer of '
                         f'{MAXTEXT_REQUIREMENT} ({GEMMA_SHA256})')
    return data


def gemma_from_wheel(wheel: Path) -> bytes:
    """
    Extract and check ``tokenizer.gemma`` from a maxtext wheel.

    :raises FetchError: not a zip, member missing, or wrong sha256.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(GEMMA_MEMBER)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FetchError(f'cannot read {wheel} as a wheel: {exc}') from None
    except KeyError:
        raise FetchError(f'{wheel} has no {GEMMA_MEMBER}; expected the {MAXTEXT_REQUIREMENT} '
                         'wheel') from None
    return check_gemma(data, f'{wheel}!{GEMMA_MEMBER}')


def download_gemma() -> bytes:
    """
    Download the maxtext wheel with pip into a temporary folder and extract the Gemma model.

    :raises FetchError: pip failed (no network, no pip, index unreachable) or bad wheel.
    """
    with tempfile.TemporaryDirectory(prefix='oxygen-maxtext-') as tmp:
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:',
               '--python-version', '3.12', '--disable-pip-version-check',
               '--retries', '1', '--timeout', '30', MAXTEXT_REQUIREMENT, '-d', tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FetchError(f'could not run pip to download {MAXTEXT_REQUIREMENT}: {exc}. '
                             f'{_OFFLINE_HINT}') from None
        if proc.returncode != 0:
            tail = '\n'.join((proc.stderr or proc.stdout or '').strip().splitlines()[-5:])
            raise FetchError(f'could not download {MAXTEXT_REQUIREMENT} from PyPI '
                             f'(pip exit code {proc.returncode}):\n{tail}\n{_OFFLINE_HINT}')
        wheels = sorted(Path(tmp).glob('maxtext-*.whl'))
        if not wheels:
            raise FetchError(f'pip reported success but left no maxtext wheel in {tmp}')
        return gemma_from_wheel(wheels[0])


def paligemma_from_source(source: Path) -> bytes:
    """
    Return PaliGemma model bytes from a local wheel, Gemma model or PaliGemma model.

    :raises FetchError: missing file, unknown content or wrong checksum.
    """
    if not source.is_file():
        raise FetchError(f'--source {source} is not a file')
    if zipfile.is_zipfile(source):
        return extend_to_paligemma(gemma_from_wheel(source))
    data = source.read_bytes()
    if _num_pieces(data) == GEMMA_VOCAB_SIZE:
        # A plain Gemma model must be exactly the pinned one.
        return extend_to_paligemma(check_gemma(data, str(source)))
    try:
        load_paligemma_processor(data, str(source))  # a PaliGemma model is copied as is
    except ValueError as exc:
        raise FetchError(f'--source: {exc}') from None
    return data


def _num_pieces(model: bytes) -> int | None:
    """Return the number of pieces of a serialized SentencePiece model, None if unparsable."""
    from google.protobuf.message import DecodeError
    from sentencepiece import sentencepiece_model_pb2

    try:
        return len(sentencepiece_model_pb2.ModelProto.FromString(model).pieces)
    except DecodeError:
        return None


def is_valid_tokenizer(path: Path) -> tuple[bool, str]:
    """Return (valid, reason): ``path`` holds a 257152-piece PaliGemma model."""
    if not path.is_file():
        return False, 'missing'
    data = path.read_bytes()
    if _num_pieces(data) == GEMMA_VOCAB_SIZE:
        return False, 'a plain Gemma model, not the PaliGemma layout'
    try:
        load_paligemma_processor(data, str(path))
    except ValueError as exc:
        return False, str(exc)
    return True, 'ok'


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    umask = os.umask(0)
    os.umask(umask)
    try:
        with os.fdopen(fd, 'wb') as f:
            os.fchmod(f.fileno(), 0o666 & ~umask)  # mkstemp makes 0600; use the usual mode
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(out: Path, *, force: bool = False, source: Path | None = None) -> bool:
    """
    Make sure ``out`` holds the PaliGemma tokenizer.

    :param out: destination file.
    :param force: rebuild even if ``out`` is already valid.
    :param source: local wheel / Gemma model / PaliGemma model instead of downloading.
    :returns: True if the file was (re)written, False if it was already valid.
    :raises FetchError: the tokenizer could not be obtained.
    """
    if source is not None and not source.is_file():
        raise FetchError(f'--source {source} is not a file')
    if not force:
        valid, _ = is_valid_tokenizer(out)
        if valid:
            return False
    data = paligemma_from_source(source) if source else extend_to_paligemma(download_gemma())
    load_paligemma_processor(data, 'built tokenizer')  # never write a file we cannot load
    write_atomic(out, data)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point; returns the exit status (0 ok, 1 error)."""
    parser = argparse.ArgumentParser(
        prog='oxygen_fetch tokenizer',
        description=f'Build the PaliGemma tokenizer ({TOKENIZER_FILENAME}) from the Gemma '
                    f'SentencePiece model inside the {MAXTEXT_REQUIREMENT} wheel on PyPI.')
    parser.add_argument('--out', type=Path, default=None,
                        help=f'destination file (default: {default_tokenizer_path()})')
    parser.add_argument('--force', action='store_true',
                        help='rebuild even if a valid file is already there')
    parser.add_argument('--source', type=Path, default=None,
                        help='use a local maxtext wheel, tokenizer.gemma or '
                             'paligemma_tokenizer.model instead of downloading')
    args = parser.parse_args(argv)
    out = (args.out or default_tokenizer_path()).expanduser()
    try:
        written = fetch(out, force=args.force, source=args.source)
    except (FetchError, ValueError, OSError) as exc:
        print(f'oxygen_fetch tokenizer: error: {exc}', file=sys.stderr)
        return 1
    if written:
        print(f'oxygen_fetch tokenizer: wrote {out} (sha256 {_sha256(out.read_bytes())})')
    else:
        print(f'oxygen_fetch tokenizer: {out} is already valid (use --force to rebuild)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
