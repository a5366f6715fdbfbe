"""
The websocket side: openpi's protocol over ``websockets``, every refusal one line and logged.

Per connection, as openpi's ``WebsocketPolicyServer``: the metadata map first, then one reply
per observation message: ``actions`` ``float32 [H, action_dim]`` in robot units,
``policy_timing``, ``server_timing`` (``infer_ms``; ``prev_total_ms`` from the second reply
on) and OxyGen's ``language_updates``; ``GET /healthz`` answers 200 (without credentials:
it says only that the server is up). Unlike openpi's, an error goes to the client as one
text frame ``'{class}: {message}'``, never a traceback (openpi's sends one:
Physical-Intelligence/openpi#1039), then the connection closes; the same line is logged with
the peer's address, as is every refused handshake (a wrong or missing API key: HTTP 401, too
many connections: HTTP 503, a TLS or HTTP handshake that fails or times out).
Compression is off (as openpi's client asks), so a message's size is its bytes on the wire. A
handshake with an ``Origin`` header is refused (HTTP 403): robot clients send none, browsers
always do, so a web page open on the server's machine cannot reach a loopback-bound server
(cross-site websocket hijacking).
"""

from __future__ import annotations

import asyncio
from collections import Counter
import http
import logging
import ssl
import time
from typing import Any

from oxygen_ros.engine import EngineClosedError, Observation, ObservationError
from oxygen_ros.serve.auth import authorized, SCHEME
from oxygen_ros.serve.driver import CycleDriver, NoAction, Session
from oxygen_ros.serve.errors import (
    IdleTimeout, NotBinary, one_line, POLICY_VIOLATION, Refusal, SlowClient)
from oxygen_ros.serve.language import LanguageRequest, parse_language_requests
from oxygen_ros.serve.layouts import LANGUAGE_KEY, Layout, to_observation
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.serve.wire import pack, unpack_message
from websockets.asyncio.server import Request, Response, serve, Server, ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.protocol import State

_LOG = logging.getLogger('oxygen_serve')
HEALTH_PATH = '/healthz'


class PolicyServer:
    """
    openpi's websocket policy protocol in front of a :class:`CycleDriver`.

    :param metadata: sent first on every connection (``metadata.server_metadata``).
    :param api_keys: keys a client must send (``Authorization: Api-Key <key>``); empty: none.
    :param ssl_context: TLS (``auth.tls_context``); None: plain websockets.
    """

    def __init__(self, driver: CycleDriver, layout: Layout, limits: ServeLimits,
                 metadata: dict[str, Any], *, api_keys: tuple[bytes, ...] = (),
                 ssl_context: ssl.SSLContext | None = None,
                 default_prompt: str | None = None) -> None:
        self.driver = driver
        self.layout = layout
        self.limits = limits
        self.api_keys = api_keys
        self.ssl_context = ssl_context
        self.default_prompt = default_prompt
        self._metadata = pack(metadata)
        self._admitted: set[ServerConnection] = set()
        self.refusals: Counter[str] = Counter()
        """Refusals so far by class (``Unauthorized``, ``BadArray``, ...)."""
        self.frames_served = 0
        self.closing = False
        """Set when the server stops: a failing frame is then no bug of ours."""

    # -- the opening handshake ------------------------------------------------------------
    async def start(self, host: str, port: int) -> Server:
        """Return the listening websockets server (``port`` 0: any free port)."""
        return await serve(
            self._handler, host, port, ssl=self.ssl_context, compression=None, origins=[None],
            max_size=self.limits.max_message_bytes, max_queue=self.limits.max_queued_frames,
            open_timeout=self.limits.open_timeout_s, process_request=self._process_request,
            server_header='oxygen_serve', create_connection=self._connection_class(),
            logger=logging.getLogger('oxygen_serve.websockets'))

    def _connection_class(self) -> type[ServerConnection]:
        server = self

        class Connection(ServerConnection):
            """Logs an opening handshake that did not open a websocket (the refusal)."""

            refusal: str | None = None
            health = False

            async def handshake(self, *args: Any, **kwargs: Any) -> None:
                cancelled = True      # by open_timeout, unless super() returns
                try:
                    await super().handshake(*args, **kwargs)
                    cancelled = False
                finally:
                    if self.protocol.state is not State.OPEN:
                        server._admitted.discard(self)      # its slot is free again
                        if not self.health:
                            server._refused(self, self._refusal(cancelled))

            def _refusal(self, cancelled: bool) -> str:
                if self.refusal:
                    return self.refusal
                if self.response is not None:   # websockets refused it (waits for the close)
                    return (f'HandshakeFailed: HTTP {self.response.status_code}: '
                            f'{self.protocol.handshake_exc or self.response.reason_phrase}')
                if cancelled:
                    return (f'HandshakeTimeout: no opening handshake within '
                            f'{server.limits.open_timeout_s:g} s')
                return 'HandshakeFailed: no valid HTTP request'
        return Connection

    def _process_request(self, connection: ServerConnection, request: Request
                         ) -> Response | None:
        if request.path == HEALTH_PATH:
            connection.health = True
            return connection.respond(http.HTTPStatus.OK, 'OK\n')
        if self.api_keys and not authorized(request.headers.get_all('Authorization'),
                                            self.api_keys):
            response = self._reject(connection, http.HTTPStatus.UNAUTHORIZED,
                                    f'Unauthorized: missing or wrong API key (send '
                                    f'Authorization: {SCHEME} <key>)')
            response.headers['WWW-Authenticate'] = SCHEME
            return response
        self._admitted = {c for c in self._admitted if c.state is not State.CLOSED}
        if len(self._admitted) >= self.limits.max_connections:
            return self._reject(connection, http.HTTPStatus.SERVICE_UNAVAILABLE,
                                f'TooManyConnections: {len(self._admitted)} open '
                                f'(--max-connections {self.limits.max_connections})')
        self._admitted.add(connection)
        return None

    @staticmethod
    def _reject(connection: ServerConnection, status: http.HTTPStatus, line: str) -> Response:
        connection.refusal = line
        return connection.respond(status, line + '\n')

    def _refused(self, connection: ServerConnection, line: str) -> None:
        self.refusals[line.split(':', 1)[0]] += 1
        _LOG.warning('refused %s: %s', _peer(connection), line)

    # -- a connection ---------------------------------------------------------------------
    async def _handler(self, ws: ServerConnection) -> None:
        session = self.driver.open_session(_peer(ws))
        loop = asyncio.get_running_loop()
        _LOG.info('%s connected as %s', session.peer, session.conn_id)
        try:
            await self._serve(ws, session, loop)
        except Refusal as exc:
            await self._close(ws, exc.line(), exc.close_code)
        except ObservationError as exc:
            await self._close(ws, one_line(f'ObservationError: {exc}'), POLICY_VIOLATION)
        except NoAction as exc:
            await self._close(ws, one_line(f'NoAction: {exc}'), CloseCode.INTERNAL_ERROR)
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG:
                self._refused(ws, f'MessageTooBig: {exc.sent.reason} (--max-message-mb)')
        except Exception as exc:  # noqa: B902 (shutting down, or a bug: the client gets a line)
            if self.closing or isinstance(exc, EngineClosedError):
                await self._close(ws, 'ServerShuttingDown: the server is stopping',
                                  CloseCode.GOING_AWAY)
            else:
                _LOG.exception('%s: internal error', session.peer)
                await self._close(ws, f'InternalError: {type(exc).__name__} (in the server log)',
                                  CloseCode.INTERNAL_ERROR)
        finally:
            self._admitted.discard(ws)
            try:
                ended = await loop.run_in_executor(self.driver.executor, self.driver.close_session,
                                                   session)
            except RuntimeError:                          # the driver shut down first
                ended = 0
            _LOG.info('%s (%s) closed after %d frame(s); %d text request(s) ended with it',
                      session.peer, session.conn_id, session.frames, ended)

    async def _serve(self, ws: ServerConnection, session: Session,
                     loop: asyncio.AbstractEventLoop) -> None:
        await self._send(ws, self._metadata)
        prev_total_ms = None
        while True:
            data = await self._receive(ws)
            start = time.monotonic()
            obs, requests = self._decode(data, session)
            result = await asyncio.wrap_future(self.driver.submit(session, obs, requests, start))
            server_timing = {'infer_ms': 1e3 * (time.monotonic() - start)}
            if prev_total_ms is not None:
                server_timing['prev_total_ms'] = prev_total_ms
            await self._send(ws, pack({'actions': result.actions,
                                       'policy_timing': result.policy_timing,
                                       'server_timing': server_timing,
                                       'language_updates': result.language_updates}))
            self.frames_served += 1
            prev_total_ms = 1e3 * (time.monotonic() - start)

    async def _receive(self, ws: ServerConnection) -> bytes:
        try:
            data = await asyncio.wait_for(ws.recv(), self.limits.idle_timeout_s)
        except TimeoutError:
            raise IdleTimeout(f'no observation for {self.limits.idle_timeout_s:g} s '
                              f'(--idle-timeout)') from None
        if isinstance(data, str):
            raise NotBinary(f'a text frame ({len(data)} characters); an observation is a '
                            f'binary frame of msgpack (openpi msgpack_numpy)')
        return data

    def _decode(self, data: bytes, session: Session
                ) -> tuple[Observation, list[LanguageRequest]]:
        msg = unpack_message(data, max_text_bytes=self.limits.max_text_bytes)
        engine = self.driver.engine
        obs = to_observation(self.layout, msg, engine.robot,
                             max_image_side=self.limits.max_image_side,
                             default_prompt=self.default_prompt)
        requests = parse_language_requests(msg[LANGUAGE_KEY], decode_budget=engine.decode_budget,
                                           first_index=session.texts.num_asked) \
            if LANGUAGE_KEY in msg else []
        return obs, requests

    async def _send(self, ws: ServerConnection, data: bytes) -> None:
        try:
            await asyncio.wait_for(ws.send(data), self.limits.send_timeout_s)
        except TimeoutError:
            raise SlowClient(f'the client took no reply for {self.limits.send_timeout_s:g} s') \
                from None

    async def _close(self, ws: ServerConnection, line: str, code: int) -> None:
        """Send ``line`` as one text frame (unless the client is slow or gone), then close."""
        self._refused(ws, line)
        try:
            if not line.startswith(SlowClient.__name__):
                await asyncio.wait_for(ws.send(line), self.limits.send_timeout_s)
            await ws.close(code, line.split(':', 1)[0])
        except (ConnectionClosed, TimeoutError):
            pass


def _peer(connection: ServerConnection) -> str:
    try:
        host, port = connection.remote_address[:2]
    except (TypeError, ValueError, OSError):
        return 'unknown peer'
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


__all__ = ['HEALTH_PATH', 'PolicyServer']
