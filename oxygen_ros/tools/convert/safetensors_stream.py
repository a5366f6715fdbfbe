"""
Write a ``.safetensors`` file tensor by tensor, never holding more than one tensor.

The format (huggingface/safetensors ``docs``): 8 bytes little-endian u64 = N, then N bytes of
JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
(padded with spaces to a multiple of 8), then the data: every tensor's little-endian,
C-order bytes, back to back without holes. The safetensors library only serializes tensors it
holds all at once; the converter knows every name, dtype and shape before reading any array,
so it writes the header first and then each tensor as it is converted. :meth:`close` checks
that every tensor was written and opens the result with the safetensors library.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import struct

import numpy as np

from safetensors import safe_open
import torch

DTYPES = {torch.float32: 'F32', torch.bfloat16: 'BF16', torch.float16: 'F16'}


class SafetensorsStreamWriter:
    """
    A ``.safetensors`` file written in a declared order, one tensor at a time.

    The file is written as ``<name>.partial`` and renamed by :meth:`close`.

    :param path: the file to write.
    :param layout: ``(name, dtype, shape)`` of every tensor, in writing order.
    :param metadata: the header's ``__metadata__`` (str → str).
    :raises ValueError: duplicate names or an unsupported dtype.
    """

    def __init__(self, path: Path, layout: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        names = [name for name, _, _ in layout]
        if len(set(names)) != len(names):
            raise ValueError('duplicate tensor names')
        header: dict[str, object] = {'__metadata__': dict(metadata or {})}
        offset = 0
        self._todo: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
        for name, dtype, shape in layout:
            if dtype not in DTYPES:
                raise ValueError(f'{name}: unsupported dtype {dtype}')
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            header[name] = {'dtype': DTYPES[dtype], 'shape': list(shape),
                            'data_offsets': [offset, offset + size]}
            offset += size
            self._todo.append((name, dtype, tuple(shape)))
        text = json.dumps(header, separators=(',', ':')).encode()
        text += b' ' * (-len(text) % 8)
        self.path = path
        self.nbytes = offset
        self._partial = path.with_name(path.name + '.partial')
        self._file = open(self._partial, 'wb')
        self._file.write(struct.pack('<Q', len(text)) + text)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """
        Append the next tensor (cast to its declared dtype).

        :raises ValueError: not the next tensor in the declared order, or a wrong shape.
        """
        want, dtype, shape = self._todo[self._next] if self._next < len(self._todo) else \
            (None, None, None)
        if name != want:
            raise ValueError(f'expected tensor {want!r} next, got {name!r}')
        if tuple(tensor.shape) != shape:
            raise ValueError(f'{name}: shape {tuple(tensor.shape)}, declared {shape}')
        data = tensor.detach().to('cpu', dtype).contiguous()
        if dtype.itemsize == 2:
            data = data.view(torch.int16)
        self._file.write(memoryview(data.numpy()).cast('B'))
        self._next += 1

    def close(self) -> Path:
        """
        Finish the file: check completeness, fsync, rename, and read its header back.

        :raises ValueError: tensors not written, or the library rejects the file.
        """
        missing = [name for name, _, _ in self._todo[self._next:]]
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if missing:
            self._partial.unlink(missing_ok=True)
            raise ValueError(f'{len(missing)} tensors not written: {", ".join(missing[:5])}')
        os.replace(self._partial, self.path)
        with safe_open(str(self.path), framework='pt') as reader:
            if set(reader.keys()) != {name for name, _, _ in self._todo}:
                raise ValueError(f'{self.path}: the written header does not read back')
        return self.path

    def abort(self) -> None:
        """Close and delete the partial file (after an error)."""
        if not self._file.closed:
            self._file.close()
        self._partial.unlink(missing_ok=True)


__all__ = ['SafetensorsStreamWriter']
