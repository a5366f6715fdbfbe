"""
Every refusal of oxygen_serve over real sockets: its one-line message, its close, its log line.

Each bad message reaches the client as one text frame ``'{class}: {message}'`` and the
connection closes; handshakes are refused with HTTP 401 or 503 and the same kind of line;
every refusal is logged with the peer. The server never sends a traceback.
"""

import base64
import logging
import os
import socket
import urllib.error
import urllib.request

import msgpack
import numpy as np
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from oxygen_ros.serve.driver import CycleDriver
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.serve.run import ServerThread
from oxygen_ros.serve.server import PolicyServer
import pytest
from serve_helpers import engine_for, logged, openpi_client, openpi_observation, running
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

LAYOUT = Layout.DROID
KEY = 'k' * 8 + '0123456789abcdef'


@pytest.fixture(scope='module')
def server(tokenizer):
    limits = ServeLimits(max_message_bytes=2**20, idle_timeout_s=None)
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, limits) as srv:
        yield srv


def packed(**change) -> bytes:
    obs = openpi_observation(LAYOUT, 0)
    for key, value in change.items():
        key = key.replace('__', '/')
        if value is ...:
            del obs[key]
        else:
            obs[key] = value
    return msgpack_numpy.packb(obs)


BAD_ARRAY = msgpack.packb({'observation/joint_position': {
    b'__ndarray__': True, b'data': bytes(8), b'dtype': '|O8', b'shape': [1]}})
CASES = {
    'text frame': ('{"prompt": "hi"}', 1003,
                   'NotBinary: a text frame (16 characters); an observation is a binary frame '
                   'of msgpack (openpi msgpack_numpy)'),
    'malformed msgpack': (b'\xc1\x00', 1003, 'MalformedMessage: not one msgpack map within '
                          'the bounds:'),
    'object array': (BAD_ARRAY, 1003, "BadArray: dtype '|O8' refused; allowed"),
    'wrong shape': (packed(observation__joint_position=np.zeros(6)), 1008,
                    'BadValue: observation/joint_position: expected shape (7,), got (6,)'),
    'huge image': (packed(observation__wrist_image_left=np.zeros((1, 4000, 3), np.uint8)),
                   1008, 'BadValue: observation/wrist_image_left: 4000x1 pixels; each side '
                   'must be in 1..1920 (--max-image-side)'),
    'missing key': (packed(prompt=...), 1008,
                    'MissingKey: prompt is missing (the server has no --default-prompt)'),
    'wrong key': (packed(observation__image=np.zeros((4, 4, 3), np.uint8)), 1008,
                  'UnknownKey: observation/image not in a droid observation; its keys:'),
    'bad text request': (packed(language_requests=[{'task': 'poem'}]), 1008,
                         'BadLanguageRequest: language_requests[0]: task must be one of'),
    'empty prompt': (packed(prompt=' '), 1008,
                     'ObservationError: empty task prompt (no instruction)'),
    'prompt too long': (packed(prompt='pick up the red cup ' * 20), 1008,
                        'ObservationError: instruction too long:'),
}


@pytest.mark.parametrize('case', list(CASES))
def test_a_bad_message_gets_one_line_then_the_close(case, server, caplog):
    message, code, line = CASES[case]
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    with connect(server.uri, compression=None) as ws:
        msgpack_numpy.unpackb(ws.recv())                          # the metadata
        ws.send(message)
        error = ws.recv()
        assert isinstance(error, str) and error.startswith(line), error
        assert '\n' not in error and 'Traceback' not in error
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd.code == code
    assert closed.value.rcvd.reason == line.split(':', 1)[0]
    assert logged(caplog, 'refused 127.0.0.1:', error).endswith(error)
    # the server goes on: the next client is served
    with openpi_client(server.port) as client:
        assert client.infer(openpi_observation(LAYOUT, 1))['actions'].shape == (4, 7)


def test_a_message_over_the_size_bound_is_refused_by_websockets_and_logged(server, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    with connect(server.uri, compression=None) as ws:
        ws.recv()
        ws.send(bytes(2**20 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
    assert closed.value.rcvd.code == 1009
    logged(caplog, 'refused 127.0.0.1:', 'MessageTooBig: ', 'exceeds limit of 1048576 bytes',
           '(--max-message-mb)')


def test_api_keys_are_checked_and_every_refusal_logged(tokenizer, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, api_keys=(KEY.encode(),)) as srv:
        for key in (None, 'wrong-key-0123456789abcdef', KEY + 'x'):
            with pytest.raises(InvalidStatus) as refused:
                WebsocketClientPolicy('localhost', srv.port, api_key=key)
            response = refused.value.response
            assert response.status_code == 401
            assert response.body == b'Unauthorized: missing or wrong API key (send ' \
                b'Authorization: Api-Key <key>)\n'
            assert response.headers['WWW-Authenticate'] == 'Api-Key'
        with pytest.raises(InvalidStatus, match='401'):
            connect(srv.uri, additional_headers={'Authorization': f'Bearer {KEY}'})
        with pytest.raises(InvalidStatus, match='401'):
            connect(srv.uri, additional_headers=[('Authorization', f'Api-Key {KEY}')] * 2)
        with openpi_client(srv.port, api_key=KEY) as client:
            assert client.infer(openpi_observation(LAYOUT, 0))['actions'].shape == (4, 7)
        with urllib.request.urlopen(f'http://localhost:{srv.port}/healthz', timeout=10) as r:
            assert r.status == 200                                  # liveness needs no key
        assert srv.server.refusals['Unauthorized'] == 5
    lines = [r.getMessage() for r in caplog.records if 'Unauthorized: ' in r.getMessage()]
    assert len(lines) == 5 and all(line.startswith('refused 127.0.0.1:') for line in lines)


def test_connections_are_bounded(tokenizer, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    limits = ServeLimits(max_connections=2, max_message_bytes=2**20)
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, limits) as srv:
        first, second = (connect(srv.uri, compression=None) for _ in range(2))
        with pytest.raises(InvalidStatus) as refused:
            WebsocketClientPolicy('localhost', srv.port)
        assert refused.value.response.status_code == 503
        assert refused.value.response.body == \
            b'TooManyConnections: 2 open (--max-connections 2)\n'
        first.close()
        with openpi_client(srv.port) as third:                  # a slot came free
            assert third.infer(openpi_observation(LAYOUT, 0))['actions'].shape == (4, 7)
        second.close()
    logged(caplog, 'refused 127.0.0.1:', 'TooManyConnections: 2 open')


def test_an_idle_connection_is_closed_with_its_reason(tokenizer):
    limits = ServeLimits(max_message_bytes=2**20, idle_timeout_s=1.0)
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, limits) as srv:
        with connect(srv.uri, compression=None) as ws:
            ws.recv()
            assert ws.recv(timeout=30) == 'IdleTimeout: no observation for 1 s (--idle-timeout)'


def test_a_browser_page_cannot_connect(server, caplog):
    """A handshake with an Origin header (every browser sends one) is refused."""
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    with pytest.raises(InvalidStatus) as refused:
        connect(server.uri, origin='http://localhost:8080')
    assert refused.value.response.status_code == 403
    logged(caplog, 'refused 127.0.0.1:', 'HandshakeFailed: HTTP 403: invalid Origin header')


def test_plain_http_is_refused_and_logged(server, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f'http://localhost:{server.port}/', timeout=10)
    assert refused.value.code == 426
    logged(caplog, 'refused 127.0.0.1:', 'HandshakeFailed: HTTP 426')


def test_a_client_that_does_not_read_is_closed_as_slow(tokenizer, caplog):
    """A reply (here a 32 MB metadata map) the client leaves unread past the send timeout."""
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    limits = ServeLimits(max_message_bytes=2**20, send_timeout_s=0.5)
    driver = CycleDriver(engine_for(LAYOUT, tokenizer), max_language_requests=8)
    srv = ServerThread(PolicyServer(driver, LAYOUT, limits, {'pad': bytes(32 * 2**20)}))
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(('127.0.0.1', srv.port))
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f'GET / HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nUpgrade: websocket\r\n'
                     f'Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n'
                     f'Sec-WebSocket-Version: 13\r\n\r\n'.encode())
        head = b''
        while b'\r\n\r\n' not in head:
            head += sock.recv(1)                   # the 101, then nothing more is read
        assert head.startswith(b'HTTP/1.1 101')
        logged(caplog, 'refused 127.0.0.1:', 'SlowClient: the client took no reply for 0.5 s')
        sock.close()
    finally:
        srv.close()
