"""
Where the package's data files (config/, launch/) and caches live.

An installed package (colcon, ``pip install .``) finds them through the ament index; an
editable install (``make setup`` uses ``pip install -e .``) gets no ``data_files``, so it
falls back to the source tree that holds ``package.xml``.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = 'oxygen_ros'


def share_dir() -> Path:
    """
    Return the package share directory (holds ``config/`` and ``launch/``).

    :raises FileNotFoundError: neither the ament index nor the source tree has the package.
    """
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory(PACKAGE))
    except (ImportError, LookupError, ValueError):
        pass
    source_root = Path(__file__).resolve().parent.parent
    if (source_root / 'package.xml').is_file():
        return source_root
    raise FileNotFoundError(
        f'cannot find the {PACKAGE} share directory: not in the ament index '
        f'(AMENT_PREFIX_PATH={os.environ.get("AMENT_PREFIX_PATH", "")!r}) '
        f'and {source_root} holds no package.xml')


def config_file(name: str) -> Path:
    """
    Return ``config/<name>.yaml`` of the package.

    :raises FileNotFoundError: no such file; the message lists the files that exist.
    """
    cfg_dir = share_dir() / 'config'
    path = cfg_dir / f'{name}.yaml'
    if not path.is_file():
        known = sorted(p.stem for p in cfg_dir.glob('*.yaml'))
        raise FileNotFoundError(f'no params file {path}; known: {", ".join(known)}')
    return path


def cache_dir() -> Path:
    """
    Return the cache directory for the tokenizer and demo bags, creating it if missing.

    ``$OXYGEN_ROS_CACHE`` if set, else ``$XDG_CACHE_HOME/oxygen_ros`` (``~/.cache/oxygen_ros``).
    """
    root = os.environ.get('OXYGEN_ROS_CACHE')
    if root:
        path = Path(root)
    else:
        xdg = os.environ.get('XDG_CACHE_HOME') or str(Path.home() / '.cache')
        path = Path(xdg) / PACKAGE
    path.mkdir(parents=True, exist_ok=True)
    return path
