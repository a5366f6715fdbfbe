"""
``oxygen_serve``'s run: build the engine and the server, serve until SIGINT or SIGTERM.

Imported by ``app.main`` only after the arguments passed their checks, so that a refused
start never loads torch.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import threading

import numpy as np

from oxygen_ros.engine import Engine, EngineConfig, Observation
from oxygen_ros.serve.driver import CycleDriver
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.serve.metadata import server_metadata
from oxygen_ros.serve.robot_driver import RobotsDriver
from oxygen_ros.serve.server import HEALTH_PATH, PolicyServer

_LOG = logging.getLogger('oxygen_serve')


def engine_config(args: argparse.Namespace, limits: ServeLimits) -> EngineConfig:
    """Return the engine's config of the command line (raises ValueError on a bad mix)."""
    return EngineConfig.create(
        preset=args.preset, checkpoint=args.checkpoint, tokenizer=args.tokenizer,
        norm_stats=args.norm_stats, device=args.device, dtype=args.dtype, seed=args.seed,
        tokens_per_cycle=args.tokens_per_cycle, decode_budget=args.decode_budget,
        max_waiting_requests=max(16, limits.max_language_requests),
        **({} if args.max_robots is None else {'max_robots': args.max_robots}))


def warmup_observation(engine: Engine, prompt: str | None) -> Observation:
    """Return black images of the robot's cameras, a zero state and a prompt."""
    size, robot = engine.model_cfg.vision.image_size, engine.robot
    return Observation({slot: np.zeros((size, size, 3), np.uint8) for slot in robot.cameras},
                       np.zeros(robot.state_dim), prompt or 'warm up')


def make_server(engine: Engine, layout: Layout, limits: ServeLimits, *,
                api_keys: tuple[bytes, ...] = (), ssl_context: ssl.SSLContext | None = None,
                client_certs: bool = False, default_prompt: str | None = None
                ) -> PolicyServer:
    """
    Return the server of a built engine (what the command line and the tests make).

    An engine of ``max_robots`` > 1 serves each connection as a robot (``RobotsDriver``):
    its one unnamed robot, if it has it (the warm-up's), gives way to the connections'.

    :raises ValueError: more connections allowed than the engine serves robots.
    """
    max_robots = engine.config.scheduler.max_robots
    limits.check_robots(max_robots)
    if max_robots == 1:
        driver = CycleDriver(engine, max_language_requests=limits.max_language_requests)
    else:
        if engine.robots == ('',):
            engine.remove_robot('')
        driver = RobotsDriver(engine, max_language_requests=limits.max_language_requests)
    metadata = server_metadata(engine, layout, limits, default_prompt=default_prompt,
                               tls=ssl_context is not None, api_key=bool(api_keys),
                               client_certs=client_certs)
    return PolicyServer(driver, layout, limits, metadata, api_keys=api_keys,
                        ssl_context=ssl_context, default_prompt=default_prompt)


def build_server(args: argparse.Namespace, layout: Layout, limits: ServeLimits,
                 api_keys: tuple[bytes, ...], tls: ssl.SSLContext | None) -> PolicyServer:
    """
    Build and warm the engine of the command line, and its server.

    :raises ValueError: a bad configuration or checkpoint.
    :raises FileNotFoundError: a missing checkpoint, tokenizer or norm stats file.
    """
    engine = Engine(engine_config(args, limits))
    if not args.no_warmup:
        engine.warmup(warmup_observation(engine, args.default_prompt))
    return make_server(engine, layout, limits, api_keys=api_keys, ssl_context=tls,
                       client_certs=bool(args.client_ca), default_prompt=args.default_prompt)


class ServerThread:
    """
    A :class:`PolicyServer` listening in its own thread and event loop (benchmarks, tests).

    ``oxygen_serve`` itself runs its loop in the main thread (:func:`serve_until_stopped`).

    :param host: the address to bind; ``port`` 0: any free port (``self.port`` says which).
    """

    def __init__(self, server: PolicyServer, host: str = '127.0.0.1', port: int = 0) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name='oxygen-serve-loop',
                                       daemon=True)
        self.thread.start()
        self.ws = self.call(server.start(host, port))
        self.port = self.ws.sockets[0].getsockname()[1]
        shown = f'[{host}]' if ':' in host else host
        self.uri = f'{"wss" if server.ssl_context else "ws"}://{shown}:{self.port}'

    def call(self, coro: object, timeout: float = 60.0) -> object:
        """Run a coroutine on the server's loop; return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Close every connection and the listener, stop the loop, shut the engine down."""
        async def stop() -> None:
            self.server.closing = True
            self.ws.close()
            await self.ws.wait_closed()
        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.server.driver.shutdown()
        self.loop.close()


async def serve_until_stopped(server: PolicyServer, host: str, port: int,
                              stop_signals: tuple[signal.Signals, ...]) -> int:
    """Serve until one of ``stop_signals``; then close every connection and the engine."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop.set)
    ws_server = await server.start(host, port)
    bound = ws_server.sockets[0].getsockname()[1]
    scheme = 'wss' if server.ssl_context else 'ws'
    shown = f'[{host}]' if ':' in host else host
    print(f'oxygen_serve: listening on {scheme}://{shown}:{bound} (preset '
          f'{server.driver.engine.model_cfg.name}, layout {server.layout.value}); '
          f'health: GET {HEALTH_PATH}', flush=True)
    await stop.wait()
    _LOG.info('stopping: closing %d connection(s)', len(ws_server.connections))
    server.closing = True
    ws_server.close()
    await ws_server.wait_closed()
    await loop.run_in_executor(None, server.driver.shutdown)
    _LOG.info('served %d frame(s); refusals: %s', server.frames_served,
              dict(server.refusals) or 'none')
    return 0


__all__ = ['ServerThread', 'build_server', 'engine_config', 'make_server', 'serve_until_stopped',
           'warmup_observation']
