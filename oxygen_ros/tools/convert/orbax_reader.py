"""
Read the arrays of an orbax PyTree checkpoint (openpi ``params/``) with tensorstore, no JAX.

What orbax (``PyTreeCheckpointHandler``, as openpi's ``training/checkpoints.py`` and the
released ``gs://openpi-assets/checkpoints/*`` use it) writes into ``params/``:

- ``_METADATA``: JSON tree metadata (``tree_metadata``: one entry per leaf with its key path,
  e.g. ``('params', 'PaliGemma', 'llm', 'embedder', 'input_embedding')``), ``use_ocdbt``,
  ``use_zarr3``; ``_CHECKPOINT_METADATA``, ``_sharding``, ``array_metadatas/``,
  ``commit_success.txt``.
- with OCDBT (the default since orbax 0.5): ``manifest.ocdbt`` and ``ocdbt.process_<i>/``
  (``manifest.ocdbt`` + ``d/`` data files) hold one key-value store in which every leaf is a
  zarr array named by its key path joined with ``.`` (``params.PaliGemma.img.head.kernel/``
  with ``.zarray`` and chunk ``0.0``, or ``zarr.json`` for zarr3); without OCDBT the same
  arrays are folders on disk.

openpi wraps the tree as ``{"params": tree}``; trees saved during openpi training end every
path with ``value`` (``nnx.State``), which is dropped here as openpi's ``restore_params``
does. A single-device save stores each array as one zarr chunk, so an array is read whole
(peak memory about twice its size while tensorstore decodes it).

tensorstore is an optional dependency (``pip install .[convert]``); importing this module
does not need it, opening a checkpoint does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

METADATA_FILE = '_METADATA'
OCDBT_MANIFEST = 'manifest.ocdbt'
_ZARR_KEYS = {'.zarray': 'zarr', 'zarr.json': 'zarr3'}

Path_ = tuple[str, ...]


class ConvertError(ValueError):
    """A checkpoint the converter refuses; the message says why and what to do."""


def _tensorstore():
    try:
        import tensorstore
    except ImportError:
        raise ConvertError(
            'oxygen_convert reads orbax checkpoints with tensorstore, which is not installed: '
            "pip install '.[convert]' in the oxygen_ros checkout (or "
            'pip install -r requirements/convert.txt)') from None
    return tensorstore


def params_dir(checkpoint: Path) -> Path:
    """
    Return the orbax ``params/`` folder of an openpi checkpoint folder (or the folder itself).

    :raises ConvertError: the folder holds no orbax checkpoint.
    """
    for candidate in (checkpoint / 'params', checkpoint):
        if (candidate / METADATA_FILE).is_file() or (candidate / OCDBT_MANIFEST).is_file():
            return candidate
    if not checkpoint.exists():
        raise ConvertError(f'no such checkpoint folder: {checkpoint}')
    raise ConvertError(
        f'not an orbax checkpoint: {checkpoint} holds neither params/{METADATA_FILE} nor '
        f'params/{OCDBT_MANIFEST} (expected an openpi JAX checkpoint folder with params/ and '
        'assets/, e.g. gs://openpi-assets/checkpoints/pi05_droid; a PyTorch '
        'model.safetensors needs no conversion)')


class OrbaxParams:
    """
    The arrays of an orbax ``params/`` folder, by tree path.

    :param folder: the ``params/`` folder (see :func:`params_dir`).
    :raises ConvertError: tensorstore missing, or no array in the store.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._ts = _tensorstore()
        base = folder.resolve().as_uri() + '/'
        ocdbt = (folder / OCDBT_MANIFEST).is_file()
        self._kvstore = {'driver': 'ocdbt', 'base': base} if ocdbt else \
            {'driver': 'file', 'path': str(folder)}
        store = self._ts.KvStore.open(self._kvstore).result()
        names: dict[str, str] = {}
        for key in store.list().result():
            text = key.decode() if isinstance(key, bytes) else str(key)
            name, _, leaf = text.rpartition('/')
            if leaf in _ZARR_KEYS and name:
                names[name] = _ZARR_KEYS[leaf]
        if not names:
            raise ConvertError(f'not an orbax checkpoint: {folder} holds no zarr arrays')
        paths = {name: tuple(name.split('.')) for name in names}
        if all(p[0] == 'params' for p in paths.values()):
            paths = {n: p[1:] for n, p in paths.items()}
        if all(p[-1] == 'value' for p in paths.values()):
            paths = {n: p[:-1] for n, p in paths.items()}  # nnx.State (openpi training)
        self._drivers = {paths[n]: driver for n, driver in names.items()}
        self._names = {paths[n]: n for n in names}
        self._arrays: dict[Path_, object] = {}

    @property
    def paths(self) -> list[Path_]:
        """Return every array's tree path (``('PaliGemma', 'img', 'head', 'kernel')`` …)."""
        return sorted(self._names)

    def _open(self, path: Path_):
        if path not in self._arrays:
            spec = {'driver': self._drivers[path],
                    'kvstore': {**self._kvstore, 'path': self._names[path] + '/'}}
            self._arrays[path] = self._ts.open(spec, read=True, open=True).result()
        return self._arrays[path]

    def shape(self, path: Path_) -> tuple[int, ...]:
        """Return the shape of an array (metadata only)."""
        return tuple(int(n) for n in self._open(path).shape)

    def read(self, path: Path_) -> np.ndarray:
        """
        Read a whole array as float32 (bfloat16 widened exactly).

        :raises ConvertError: a non-float array.
        """
        array = np.asarray(self._open(path).read().result())
        if array.dtype.kind not in 'fV' and 'bfloat16' not in str(array.dtype):
            raise ConvertError(f'{".".join(path)}: expected floats, got {array.dtype}')
        self._arrays.pop(path, None)
        return array.astype(np.float32, copy=False)


__all__ = ['ConvertError', 'OrbaxParams', 'params_dir']
