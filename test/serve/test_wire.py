"""openpi's msgpack-numpy on the wire: what openpi's packer makes reads back, the rest refused."""

import msgpack
import numpy as np
from openpi_client import msgpack_numpy
from oxygen_ros.serve.errors import BadArray, MalformedMessage
from oxygen_ros.serve.wire import MAX_ARRAYS, pack, unpack_message
import pytest


def read(data: bytes) -> dict:
    return unpack_message(data, max_text_bytes=4096)


def tagged(dtype: str = '<f4', shape=(2, 3), data: bytes | None = None, **extra) -> dict:
    if data is None:
        data = bytes(int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return {b'__ndarray__': True, b'data': data,
            b'dtype': dtype, b'shape': list(shape), **extra}


def test_what_openpis_packer_packs_reads_back_as_read_only_views():
    obs = {'observation/image': np.arange(27, dtype=np.uint8).reshape(3, 3, 3),
           'observation/state': np.linspace(-1, 1, 8), 'scalar': np.float32(0.5),
           'gripper': np.int64(3), 'prompt': 'pick', 'nested': {'x': np.ones(2, np.float16)}}
    msg = read(msgpack_numpy.packb(obs))
    np.testing.assert_array_equal(msg['observation/image'], obs['observation/image'])
    assert msg['observation/state'].dtype == np.float64
    assert msg['scalar'] == np.float32(0.5) and msg['scalar'].dtype == np.float32
    assert msg['gripper'].dtype == np.int64 and msg['prompt'] == 'pick'
    assert msg['nested']['x'].dtype == np.float16
    assert not msg['observation/image'].flags.writeable       # a view of the message


def test_replies_read_with_openpis_unpacker():
    reply = {'actions': np.arange(6, dtype=np.float32).reshape(3, 2), 'n': np.int32(4),
             'timing': {'infer_ms': 1.5}, 'updates': [{'text': 'a', 'finished': True}]}
    back = msgpack_numpy.unpackb(pack(reply))
    np.testing.assert_array_equal(back['actions'], reply['actions'])
    assert back['n'] == 4 and back['timing'] == reply['timing'] and back['updates'] == \
        reply['updates']
    with pytest.raises(TypeError, match='cannot put'):
        pack({'x': np.array([object()])})
    with pytest.raises(TypeError, match='cannot put'):
        pack({'x': np.zeros(2, np.complex64)})


@pytest.mark.parametrize('data, match', [
    (b'\xc1', 'not one msgpack map'),                                  # reserved byte
    (b'\x82\xa1a', 'not one msgpack map'),                             # truncated
    (msgpack.packb({'a': 1}) + b'\x00', 'not one msgpack map'),        # bytes after it
    (msgpack.packb([1, 2]), 'expected a msgpack map'),
    (msgpack.packb('text'), 'expected a msgpack map'),
    (msgpack.packb({'a': msgpack.ExtType(1, b'x')}), 'not one msgpack map'),
    (msgpack.packb({'p': 'x' * 5000}), 'not one msgpack map'),         # over max_text_bytes
    (msgpack.packb({'l': list(range(100))}), 'not one msgpack map'),   # over MAX_ITEMS
    (msgpack.packb({1: 'x'}), 'not one msgpack map'),                 # int key
    (b'\x91' * 5000 + b'\xc0', 'not one msgpack map'),                 # nested too deep
    (msgpack.packb({'s': b'\xff\xfe'}, use_bin_type=False), 'not one msgpack map'),
])
def test_malformed_messages_are_refused(data, match):
    with pytest.raises(MalformedMessage, match=match):
        read(data)


@pytest.mark.parametrize('entry, match', [
    (tagged(dtype='|O8'), "dtype '|O8' refused"),
    (tagged(dtype='<c8'), "dtype '<c8' refused"),
    (tagged(dtype='|V4'), "dtype '|V4' refused"),
    (tagged(dtype='>f4'), "dtype '>f4' refused; allowed \\(little-endian\\)"),
    (tagged(dtype=7, data=bytes(24)), 'dtype 7 refused'),
    (tagged(shape=(2, 3), data=bytes(23)), r'needs 24 bytes of data, got 23'),
    (tagged(shape=(2, 3), data=bytes(25)), r'needs 24 bytes of data, got 25'),
    (tagged(shape=(1, 1, 1, 1, 1)), 'at most 4 sizes'),
    (tagged(shape=(-1, 3), data=b''), 'sizes >= 0'),
    (tagged(shape=(2**40, 2**40), data=b''), 'needs .* bytes of data, got 0'),
    (tagged(shape=(2, 3), extra=1), 'exactly __ndarray__'),
    ({**tagged(), b'__ndarray__': 1}, 'exactly __ndarray__'),
    ({b'__npgeneric__': True, b'data': 300, b'dtype': '|u1'}, '300 is not a uint8'),
    ({b'__npgeneric__': True, b'data': 'x', b'dtype': '<f4'}, 'holds a number'),
    ({b'__npgeneric__': True, b'data': 1.0, b'dtype': '|O8'}, 'refused'),
])
def test_bad_arrays_are_refused_before_any_array_exists(entry, match):
    with pytest.raises(BadArray, match=match):
        read(msgpack.packb({'x': entry}))


def test_the_number_of_arrays_is_bounded():
    obs = {f'a{i}': np.zeros(1, np.uint8) for i in range(MAX_ARRAYS)}
    assert len(read(msgpack_numpy.packb(obs))) == MAX_ARRAYS
    obs['one_more'] = np.zeros(1, np.uint8)
    with pytest.raises(BadArray, match=f'more than {MAX_ARRAYS} arrays'):
        read(msgpack_numpy.packb(obs))


def test_refusals_name_their_class_on_one_line():
    with pytest.raises(BadArray) as info:
        read(msgpack.packb({'x': tagged(dtype='|O8')}))
    line = info.value.line()
    assert line.startswith('BadArray: dtype ') and '\n' not in line
