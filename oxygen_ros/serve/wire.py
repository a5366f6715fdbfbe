"""
openpi's wire format, read with bounds: msgpack maps whose numpy arrays are tagged maps.

openpi's ``msgpack_numpy`` (``packages/openpi-client/src/openpi_client/msgpack_numpy.py``)
packs an array as ``{b'__ndarray__': True, b'data': bytes, b'dtype': dtype.str, b'shape':
shape}`` and a numpy scalar as ``{b'__npgeneric__': True, b'data': value, b'dtype': ...}``; it
refuses object, void and complex dtypes. Reading here goes further, before any array exists:
msgpack's own bounds (strings, maps, lists, no extension types, nothing after the map), then
per tagged map its exact keys, a dtype from ``ALLOWED_DTYPES`` (little-endian numbers and
bool), at most ``MAX_NDIM`` dims, ``MAX_ARRAYS`` arrays, and data of exactly ``prod(shape) *
itemsize`` bytes. An array is then a read-only view of the message's bytes (no copy). There is
no pickle anywhere, as openpi's module says msgpack avoids it (docs/serving.md#the-wire).
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from oxygen_ros.serve.errors import BadArray, MalformedMessage

ALLOWED_DTYPES: dict[str, str] = {
    '|u1': 'uint8', '|i1': 'int8', '|b1': 'bool', '<u2': 'uint16', '<i2': 'int16',
    '<u4': 'uint32', '<i4': 'int32', '<u8': 'uint64', '<i8': 'int64', '<f2': 'float16',
    '<f4': 'float32', '<f8': 'float64'}
"""``dtype.str`` -> name of the dtypes an array may have on the wire."""
MAX_NDIM = 4
"""Dims of an array on the wire (an image has 3)."""
MAX_ARRAYS = 16
"""Arrays in one message (ALOHA's four cameras and its state are five)."""
MAX_ITEMS = 64
"""Entries of one msgpack map or list."""
_ARRAY_KEYS = frozenset({b'__ndarray__', b'data', b'dtype', b'shape'})
_SCALAR_KEYS = frozenset({b'__npgeneric__', b'data', b'dtype'})


def unpack_message(data: bytes, *, max_text_bytes: int) -> dict[str, Any]:
    """
    Return the map one client message holds, its arrays as read-only numpy views.

    :param data: the message (its size is bounded by websockets' ``max_size`` already).
    :param max_text_bytes: the longest string (UTF-8 bytes).
    :raises MalformedMessage: not msgpack, not one map, over a bound, bytes after the map.
    :raises BadArray: a tagged array or scalar with other keys, a dtype not in
        ``ALLOWED_DTYPES``, a bad shape, or data whose length does not match it.
    """
    arrays = [0]

    def hook(obj: dict) -> object:
        if b'__ndarray__' in obj:
            arrays[0] += 1
            if arrays[0] > MAX_ARRAYS:
                raise BadArray(f'more than {MAX_ARRAYS} arrays in one message')
            return _array(obj)
        if b'__npgeneric__' in obj:
            return _scalar(obj)
        return obj

    try:
        msg = msgpack.unpackb(
            data, object_hook=hook, raw=False, strict_map_key=True, use_list=True,
            max_str_len=max_text_bytes, max_bin_len=len(data), max_array_len=MAX_ITEMS,
            max_map_len=MAX_ITEMS, max_ext_len=0)
    except BadArray:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise MalformedMessage(f'not one msgpack map within the bounds: {exc}') from None
    if not isinstance(msg, dict):
        raise MalformedMessage(f'expected a msgpack map (the observation dict), got '
                               f'{type(msg).__name__}')
    return msg


def _name(key: object) -> str:
    return key.decode(errors='replace') if isinstance(key, bytes) else str(key)


def _dtype(obj: dict) -> np.dtype:
    code = obj[b'dtype']
    if not isinstance(code, str) or code not in ALLOWED_DTYPES:
        allowed = ', '.join(sorted(set(ALLOWED_DTYPES.values())))
        raise BadArray(f'dtype {code!r} refused; allowed (little-endian): {allowed}')
    return np.dtype(code)


def _array(obj: dict) -> np.ndarray:
    if set(obj) != _ARRAY_KEYS or obj[b'__ndarray__'] is not True:
        raise BadArray(f'an __ndarray__ entry must hold exactly __ndarray__: true, data, '
                       f'dtype, shape; got {sorted(map(_name, obj))}')
    dtype = _dtype(obj)
    shape, data = obj[b'shape'], obj[b'data']
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(
            type(d) is int and d >= 0 for d in shape):
        raise BadArray(f'shape must be a list of at most {MAX_NDIM} sizes >= 0, got {shape!r}')
    if not isinstance(data, bytes):
        raise BadArray(f'array data must be bytes, got {type(data).__name__}')
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise BadArray(f'array of shape {tuple(shape)} and dtype {dtype} needs {expected} '
                       f'bytes of data, got {len(data)}')
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _scalar(obj: dict) -> np.generic:
    if set(obj) != _SCALAR_KEYS or obj[b'__npgeneric__'] is not True:
        raise BadArray('an __npgeneric__ entry must hold exactly __npgeneric__: true, data, '
                       'dtype')
    dtype, value = _dtype(obj), obj[b'data']
    if type(value) not in (bool, int, float):
        raise BadArray(f'a numpy scalar holds a number, got {type(value).__name__}')
    try:
        return dtype.type(value)
    except (OverflowError, ValueError, TypeError) as exc:
        raise BadArray(f'{value!r} is not a {dtype}: {exc}') from None


def _encode(obj: object) -> object:
    if isinstance(obj, np.ndarray) and obj.dtype.str in ALLOWED_DTYPES:
        return {b'__ndarray__': True, b'data': np.ascontiguousarray(obj).tobytes(),
                b'dtype': obj.dtype.str, b'shape': list(obj.shape)}
    if isinstance(obj, np.generic) and obj.dtype.str in ALLOWED_DTYPES:
        return {b'__npgeneric__': True, b'data': obj.item(), b'dtype': obj.dtype.str}
    raise TypeError(f'cannot put {type(obj).__name__} on the wire')


def pack(obj: object) -> bytes:
    """
    Return ``obj`` packed as openpi's ``msgpack_numpy.Packer`` packs it.

    :raises TypeError: an object msgpack cannot hold, or an array of a dtype outside
        ``ALLOWED_DTYPES`` (object, void, complex, big-endian).
    """
    return msgpack.packb(obj, default=_encode)


__all__ = ['ALLOWED_DTYPES', 'MAX_ARRAYS', 'MAX_ITEMS', 'MAX_NDIM', 'pack', 'unpack_message']
