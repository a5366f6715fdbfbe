"""
oxygen_serve keeps serving through bad clients, and loses no state.

While one connection (B) has a question decoding, others misbehave every way the wire allows:
a TCP client that never speaks, a message trickled in over seconds, a client that vanishes
while its frame runs, one that vanishes halfway through a message, malformed and wrong
messages. B is served all along, its answer equals the engine's own, and every frame the
server took from the others ran (a vanished client's frame, too) without harm.
"""

import logging
import socket
import threading
import time

import numpy as np
from openpi_client import msgpack_numpy
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.transforms.prompt import TextTask
from serve_helpers import (
    engine_for, engine_observation, logged, openpi_client, openpi_observation, running)
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect

LAYOUT = Layout.LIBERO
QUESTION = 'what is on the table?'
BUDGET = 30


def masked_frame(payload: bytes) -> bytes:
    """Return one client-to-server binary frame (masked, as RFC 6455 requires)."""
    return Frame(Opcode.BINARY, payload).serialize(mask=True)


def test_bad_clients_do_not_disturb_a_good_one(tokenizer, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    limits = ServeLimits(max_message_bytes=2**21, open_timeout_s=1.0, max_connections=8)
    with running(engine_for(LAYOUT, tokenizer, decode_budget=BUDGET), LAYOUT, limits) as srv, \
            openpi_client(srv.port) as good:
        updates, frame = [], 0

        def good_frame(**extra):
            nonlocal frame
            obs = openpi_observation(LAYOUT, 100 + frame)
            obs.update(extra)
            reply = good.infer(obs)
            frame += 1
            assert np.isfinite(reply['actions']).all()
            updates.extend(reply['language_updates'])

        good_frame(language_requests=[{'task': 'answer', 'question': QUESTION,
                                       'max_tokens': BUDGET}])

        # a TCP client that never sends its handshake: refused after open_timeout
        silent = socket.create_connection(('127.0.0.1', srv.port))
        good_frame()
        logged(caplog, 'refused 127.0.0.1:', 'HandshakeTimeout: no opening handshake within 1 s')
        silent.settimeout(10)
        assert silent.recv(1) == b''                       # closed by the server
        silent.close()

        # a message trickled in over ~2 s: the good client is served meanwhile
        obs = openpi_observation(LAYOUT, 7)
        with connect(srv.uri, compression=None) as slow:
            slow.recv()
            data = masked_frame(msgpack_numpy.packb(obs))
            trickle = threading.Thread(target=lambda: [
                (slow.socket.sendall(data[i:i + len(data) // 20 + 1]), time.sleep(0.1))
                for i in range(0, len(data), len(data) // 20 + 1)])
            trickle.start()
            good_frame()
            assert trickle.is_alive()                      # served before the slow one ended
            trickle.join()
            reply = msgpack_numpy.unpackb(slow.recv(timeout=60))
            assert reply['actions'].shape == (4, 7)

        # a client that vanishes while its frame runs, one that vanishes mid-message
        for cut in (None, 1000):
            ws = connect(srv.uri, compression=None)
            ws.recv()
            message = masked_frame(msgpack_numpy.packb(openpi_observation(LAYOUT, 8)))
            ws.socket.sendall(message if cut is None else message[:cut])
            ws.socket.shutdown(socket.SHUT_RDWR)
            ws.socket.close()
            closed = logged(caplog, 'closed after', f'{1 if cut is None else 0} frame(s)')
            caplog.records.remove(next(r for r in caplog.records if r.getMessage() == closed))
            good_frame()

        # malformed and wrong messages
        for message in (b'\x00\x01', 'text', msgpack_numpy.packb({'prompt': 'x'})):
            with connect(srv.uri, compression=None) as ws:
                ws.recv()
                ws.send(message)
                assert isinstance(ws.recv(), str)
            good_frame()

        while not updates[-1]['finished']:
            good_frame()

    reference = engine_for(LAYOUT, tokenizer, decode_budget=BUDGET)
    req_id = reference.submit_text(TextTask.ANSWER, question=QUESTION, max_tokens=BUDGET)
    answer = None
    for seed in range(100, 100 + frame):
        out = reference.step(engine_observation(LAYOUT, openpi_observation(LAYOUT, seed)))
        answer = answer or next((t for t in out.finished if t.req_id == req_id), None)
    assert updates[-1]['text'] == answer.text
    assert sum((u['tokens'] for u in updates), []) == list(answer.token_ids)
    assert srv.server.driver.num_open_requests == 0
