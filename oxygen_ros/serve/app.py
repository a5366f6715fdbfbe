"""
``oxygen_serve``: serve one checkpoint to openpi's clients over websockets.

The engine (OxyGen's unified KV cache) behind openpi's websocket policy protocol, so that
``openpi_client.WebsocketClientPolicy`` and the LIBERO, DROID and ALOHA example clients drive
it unchanged; text (subtask, answers, memory notes) rides on the same wire as OxyGen's
``language_updates``. Secure by default: 127.0.0.1 only, unless --host names another address
and clients must authenticate (docs/serving.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Sequence

from oxygen_ros.config import preset_names
from oxygen_ros.policies import preset_robot
from oxygen_ros.serve.auth import (
    API_KEY_ENV, check_bind, InsecureBind, load_api_keys, tls_context)
from oxygen_ros.serve.layouts import check_layout, default_layout, Layout, message_bytes
from oxygen_ros.serve.limits import MIB, ServeLimits

_LOG = logging.getLogger('oxygen_serve')
DEFAULT_PORT = 8000
"""openpi's ``serve_policy.py`` port."""

_DESCRIPTION = """\
Serve one checkpoint (or a preset's random weights) to openpi's clients: the engine, with
OxyGen's unified KV cache, behind openpi's websocket policy protocol, so that
openpi_client.WebsocketClientPolicy and the LIBERO, DROID and ALOHA example clients drive it
unchanged; subtasks, answers and memory notes ride on the same wire (language_updates)."""
_EPILOG = f"""\
protocol (openpi's, docs/serving.md): on connect a msgpack map of metadata (preset, layout,
  action horizon and dims, observation keys, limits); then per binary msgpack-numpy message
  (openpi_client.msgpack_numpy) one reply {{actions [H, action_dim] in robot units,
  policy_timing, server_timing, language_updates}}. GET /healthz answers 200. An error is one
  text frame 'Class: message', then the connection closes.
keys (--layout): libero: observation/image, observation/wrist_image, observation/state,
  prompt | droid: observation/exterior_image_1_left, observation/wrist_image_left,
  observation/joint_position, observation/gripper_position, prompt | aloha: images
  {{cam_high, cam_left_wrist, cam_right_wrist, cam_low}} [3, H, W], state, prompt (or
  --default-prompt).
language: add language_requests: [{{task: subtask|answer|memory, question, max_tokens,
  request_id}}] to an observation; each reply's language_updates holds request_id, tokens
  (since the last reply), text (so far), finished, finish_reason, error. Text decodes k tokens
  per served frame; a connection's requests end with it.
security: binds 127.0.0.1 unless --host. Any other address needs an API key (--api-key-file,
  or ${API_KEY_ENV}; never on the command line; clients send Authorization: Api-Key <key>,
  WebsocketClientPolicy(api_key=...)) or TLS with client certificates (--certfile, --keyfile,
  --client-ca). --certfile/--keyfile alone give wss:// (with a key, or on loopback).

example: oxygen_serve --preset pi05_droid --checkpoint ~/ckpt/pi05_droid
  then: WebsocketClientPolicy('localhost', 8000).infer(observation)
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='oxygen_serve', description=_DESCRIPTION,
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False)
    g = p.add_argument_group('policy')
    g.add_argument('--preset', default='pi05_droid', choices=preset_names(),
                   help='model preset (default: %(default)s)')
    g.add_argument('--checkpoint', default=None,
                   help='dir with model.safetensors + norm stats (docs/checkpoints.md); '
                        'default: seeded random weights (meaningless actions, logged)')
    g.add_argument('--layout', default=None, choices=[m.value for m in Layout],
                   help="the clients' observation keys (default: the preset's robot; "
                        'needed for small, demo, tiny)')
    g.add_argument('--default-prompt', default=None,
                   help='the task of an observation without a prompt (ALOHA clients send none)')
    g.add_argument('--tokenizer', default=None, help='paligemma_tokenizer.model')
    g.add_argument('--norm-stats', default=None, help="norm_stats.json over the checkpoint's")
    g.add_argument('--device', default='cpu', help='cpu, cuda, cuda:1 (default: %(default)s)')
    g.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
    g.add_argument('--tokens-per-cycle', type=int, default=5,
                   help='k: tokens each text request decodes per served frame')
    g.add_argument('--decode-budget', type=int, default=None,
                   help="largest max_tokens of a text request (default: the preset's)")
    g.add_argument('--seed', type=int, default=0,
                   help='random weights and the flow-matching noise of frame i')
    g.add_argument('--no-warmup', action='store_true', help='skip the warm-up cycles')
    g.add_argument('--max-robots', type=int, default=None,
                   help='serve each connection as a robot of the engine, up to N at once, '
                        'the frames that arrive together in one cycle (at least '
                        '--max-connections); default: the declared max_robots (1: the '
                        "connections' frames one at a time, docs/serving.md#several-robots)")
    g = p.add_argument_group('network and security')
    g.add_argument('--host', default='127.0.0.1',
                   help='address to bind (default: %(default)s, this machine only)')
    g.add_argument('--port', type=int, default=DEFAULT_PORT,
                   help="openpi's default: %(default)s; 0: any free port")
    g.add_argument('--api-key-file', default=None,
                   help=f'API keys, one per line (or ${API_KEY_ENV}); clients must send one')
    g.add_argument('--certfile', default=None, help='TLS certificate chain (PEM): wss://')
    g.add_argument('--keyfile', default=None, help='its private key (PEM)')
    g.add_argument('--client-ca', default=None,
                   help='CA (PEM) that signs client certificates; clients must present one')
    g = p.add_argument_group('limits (docs/serving.md#limits)')
    d = ServeLimits()
    g.add_argument('--max-connections', type=int, default=d.max_connections,
                   help='open websocket connections (default: %(default)s)')
    g.add_argument('--max-message-mb', type=float, default=None,
                   help="one message (default: the layout's images at --max-image-side, "
                        'uint8, + 1 MiB)')
    g.add_argument('--max-image-side', type=int, default=d.max_image_side,
                   help='pixels (default: %(default)s)')
    g.add_argument('--max-language-requests', type=int, default=d.max_language_requests,
                   help='open text requests per connection (default: %(default)s)')
    g.add_argument('--idle-timeout', type=float, default=d.idle_timeout_s,
                   help='seconds without an observation before a connection closes (0: '
                        'never; default: %(default)s)')
    g.add_argument('--send-timeout', type=float, default=d.send_timeout_s,
                   help='seconds a client may take to read a reply (default: %(default)s)')
    return p


def _limits(args: argparse.Namespace, layout: Layout) -> ServeLimits:
    message = message_bytes(layout, args.max_image_side) if args.max_message_mb is None \
        else int(args.max_message_mb * MIB)
    return ServeLimits(max_connections=args.max_connections, max_message_bytes=message,
                       max_image_side=args.max_image_side,
                       max_language_requests=args.max_language_requests,
                       idle_timeout_s=args.idle_timeout or None,
                       send_timeout_s=args.send_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_serve``; return the exit status (2: refused at start)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if any(a == '--api-key' or a.startswith('--api-key=') for a in argv):
        parser.error(f'--api-key is not taken on the command line (every user of the machine '
                     f'sees it in ps): use --api-key-file FILE or ${API_KEY_ENV}')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='[%(levelname)s] [%(name)s]: %(message)s')
    logging.getLogger('oxygen_serve.websockets').setLevel(logging.WARNING)
    try:
        robot = preset_robot(args.preset)
        layout = Layout(args.layout) if args.layout else default_layout(robot)
        if layout is None:
            raise ValueError(f'preset {args.preset} is no robot of its own: give --layout '
                             f'({", ".join(m.value for m in Layout)})')
        check_layout(layout, robot)
        limits = _limits(args, layout)
        if args.max_robots is not None:
            limits.check_robots(args.max_robots)
        keys = load_api_keys(args.api_key_file)
        if (args.keyfile or args.client_ca) and not args.certfile:
            raise ValueError('--keyfile and --client-ca need --certfile')
        tls = tls_context(args.certfile, args.keyfile, args.client_ca) if args.certfile \
            else None
        check_bind(args.host, api_keys=keys, tls=tls is not None,
                   client_certs=bool(args.client_ca))
    except (ValueError, InsecureBind) as exc:
        _LOG.error('refused to start: %s', exc)
        return 2
    from oxygen_ros.serve.run import build_server, serve_until_stopped
    try:
        server = build_server(args, layout, limits, keys, tls)
    except (ValueError, FileNotFoundError) as exc:
        _LOG.error('cannot start: %s', exc)
        return 2
    return asyncio.run(serve_until_stopped(server, args.host, args.port, _stop_signals()))


def _stop_signals() -> tuple[signal.Signals, ...]:
    return (signal.SIGINT, signal.SIGTERM)


__all__ = ['DEFAULT_PORT', 'main']
