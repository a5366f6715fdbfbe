"""
``oxygen_bench serve``: what openpi's wire costs, a client round trip beside the engine's step.

One process, three parts: ``oxygen_serve``'s server in its own thread on 127.0.0.1 (its own
engine), a websocket client that sends openpi msgpack-numpy observations of the layout
(cameras at ``--image-size`` in uint8, as openpi's clients resize them: the bundled
photographs, a drifting crop per frame), and a second engine on the same weights that steps
the same observations directly, in the server's engine thread (one OpenMP thread team for
both: a second calling thread would bring a second team, spinning beside the first). Their
frames alternate, which goes first switching each frame, so that a noisy machine slows both
alike. Per frame: the **round trip** (the client packs, sends over localhost; the server
decodes, checks, runs the engine cycle, packs the reply; the client receives and unpacks),
the **server's engine cycle** of that frame
(``policy_timing.infer_ms``) and the **direct step**. Wire overhead = round trip - the server's
engine cycle of the same frame, as a fraction of the direct step (p50s over the measured
frames; the first ``--warmup`` frames are not timed). Both engines see the same frames in the
same order, so their actions are equal (``actions_equal``).
docs/benchmarks.md#the-wire-oxygen_bench-serve
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from pathlib import Path
import statistics
import sys
import time

import numpy as np

from oxygen_ros.config import preset_names
from oxygen_ros.policies import preset_robot
from oxygen_ros.tools.bench.serve_messages import client_messages
from oxygen_ros.tools.common.machine import machine_summary

TARGET = 0.05
"""The wire's overhead the server is held to, as a fraction of a frame (the small preset)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_bench serve', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--preset', default='small', choices=preset_names())
    p.add_argument('--layout', default=None, choices=('libero', 'droid', 'aloha'),
                   help="default: the preset's robot, else droid")
    p.add_argument('--frames', type=int, default=30, help='measured frames per path')
    p.add_argument('--warmup', type=int, default=3, help='untimed frames first')
    p.add_argument('--image-size', type=int, default=224, help='camera images, pixels a side')
    p.add_argument('--text-every', type=int, default=0,
                   help='a question over the wire every N frames (0: none)')
    p.add_argument('--threads', type=int, default=0, help='torch threads (0: default)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', type=Path, default=None, help='write the results here')
    args = p.parse_args(argv)
    if args.frames < 1 or args.warmup < 0 or args.text_every < 0 or args.image_size < 1:
        p.error('--frames >= 1, --warmup >= 0, --text-every >= 0, --image-size >= 1')
    return args


def _direct_step(engine, obs, questions: list[dict]):
    """Return the engine's own step of ``obs`` and its wall time (seconds)."""
    t0 = time.perf_counter()
    for q in questions:
        engine.submit_text('answer', question=q['question'])
    return engine.step(obs), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    import torch
    from websockets.sync.client import connect

    from oxygen_ros.engine import Engine, EngineConfig, load_model
    from oxygen_ros.serve.layouts import check_layout, default_layout, Layout, to_observation
    from oxygen_ros.serve.limits import ServeLimits
    from oxygen_ros.serve.run import make_server, ServerThread, warmup_observation
    from oxygen_ros.serve.wire import pack, unpack_message

    if args.threads:
        torch.set_num_threads(args.threads)
    robot = preset_robot(args.preset)
    layout = Layout(args.layout) if args.layout else default_layout(robot) or Layout.DROID
    try:
        check_layout(layout, robot)
    except ValueError as exc:
        print(f'oxygen_bench serve: {exc}', file=sys.stderr)
        return 2
    config = EngineConfig(preset=args.preset, seed=args.seed)
    loaded = load_model(config, config.model_config())
    served, direct = Engine(config, model=loaded), Engine(config, model=loaded)
    for engine in (served, direct):
        engine.warmup(warmup_observation(engine, None))
    total = args.warmup + args.frames
    messages = client_messages(layout, robot, total, args.image_size, args.text_every)
    limits = ServeLimits(max_message_bytes=64 * 2**20, idle_timeout_s=None)
    srv = ServerThread(make_server(served, layout, limits))
    rows, equal, sizes = [], True, []
    try:
        with connect(srv.uri, compression=None, max_size=None) as ws:
            ws.recv()                                             # the metadata
            for f, msg in enumerate(messages):
                data = pack(msg)
                obs = to_observation(layout, unpack_message(data, max_text_bytes=4096),
                                     robot, max_image_side=4096)
                questions = msg.get('language_requests', [])
                order = ('wire', 'direct') if f % 2 == 0 else ('direct', 'wire')
                times = {}
                for path in order:
                    t0 = time.perf_counter()
                    if path == 'wire':
                        ws.send(pack(msg))
                        raw = ws.recv()
                        reply = unpack_message(raw, max_text_bytes=2**20)
                        times[path] = time.perf_counter() - t0
                    else:                   # in the driver's thread, timed there
                        step, times[path] = srv.server.driver.executor.submit(
                            _direct_step, direct, obs, questions).result()
                equal &= bool(np.array_equal(reply['actions'], step.action.actions))
                sizes.append((len(data), len(raw)))
                if f >= args.warmup:
                    rows.append((times['wire'], reply['policy_timing']['infer_ms'] / 1e3,
                                 times['direct']))
    finally:
        srv.close()
    result = _result(args, layout, rows, equal, sizes, torch)
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


def _result(args, layout, rows, equal: bool, sizes, torch) -> dict:
    wire, served, direct = (np.asarray(col) * 1e3 for col in zip(*rows))
    overhead = wire - served

    def stats(x: np.ndarray) -> dict:
        return {'p50': float(np.percentile(x, 50)), 'p90': float(np.percentile(x, 90)),
                'mean': float(statistics.fmean(x))}
    frame = float(np.percentile(direct, 50))
    return {
        'preset': args.preset, 'layout': layout.value, 'frames': args.frames,
        'warmup_frames': args.warmup, 'image_size': args.image_size,
        'text_every': args.text_every, 'round_trip_ms': stats(wire),
        'served_engine_ms': stats(served), 'direct_step_ms': stats(direct),
        'wire_overhead_ms': stats(overhead),
        'wire_overhead_frac': float(np.percentile(overhead, 50)) / frame,
        'round_trip_over_direct': float(np.percentile(wire, 50)) / frame,
        'target_frac': TARGET, 'actions_equal': equal,
        'message_bytes': sizes[0][0], 'reply_bytes': max(s[1] for s in sizes),
        'machine': machine_summary(torch),
        'date': datetime.date.today().isoformat(),
    }


def _print(r: dict) -> None:
    m = r['machine']
    print(f"oxygen_bench serve: preset {r['preset']}, layout {r['layout']}, {r['frames']} "
          f"frames per path, {r['image_size']} px cameras ({m['processor']}, "
          f"{m['threads']} torch threads)")
    for key, label in (('direct_step_ms', 'engine step (direct)'),
                       ('served_engine_ms', 'engine cycle in the server'),
                       ('round_trip_ms', 'client round trip (openpi wire)'),
                       ('wire_overhead_ms', 'wire overhead (round trip - cycle)')):
        s = r[key]
        print(f'  {label:<36} p50 {s["p50"]:8.2f} ms   p90 {s["p90"]:8.2f} ms')
    verdict = 'within' if r['wire_overhead_frac'] <= r['target_frac'] else 'OVER'
    print(f"  wire overhead: {100 * r['wire_overhead_frac']:.2f} % of a frame ({verdict} the "
          f"{100 * r['target_frac']:.0f} % target); round trip / direct step "
          f"{r['round_trip_over_direct']:.3f}")
    print(f"  message {r['message_bytes'] / 1024:.0f} KiB, reply <= "
          f"{r['reply_bytes'] / 1024:.1f} KiB; actions equal to the direct step: "
          f"{r['actions_equal']}")


__all__ = ['TARGET', 'main']
