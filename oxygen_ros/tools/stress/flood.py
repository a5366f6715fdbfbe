"""
``oxygen_stress flood``: flood the node's ``~/ask`` with questions and measure what it does.

Usage::

    oxygen_stress flood [--via topic|action|both]
                        [--count 200 --seconds 1 | --rate 20 --seconds 30 |
                         --phase 100:1 --phase 50:10 ...]
                        [--launch demo [--bag BAG]] [--clients 8] [--node /oxygen] [--settle 4]
                        [--json PATH] [--ros-args ...]

Sends ``count`` questions (or ``rate`` per second) spread evenly over ``seconds``, or phases
of ``COUNT:SECONDS`` back to back (``--phase 100:1 --phase 50:10``: 100 questions in 1 s, then
5/s for 10 s), to a running node: as ``std_msgs/String`` on ``~/ask`` (each answered on
``~/answer``), as goals of the ``~/ask`` action through ``--clients`` independent action
clients (``rclpy.action``, round robin, deep queues), or alternating both. Then waits until
every question has its reply (a String on ``~/answer``; a goal response and, when accepted,
its result) and ``--settle`` seconds more.

``--launch CONFIG`` starts the node itself first, as ``make demo`` does (``config/CONFIG.yaml``,
the demo bag or ``--bag`` replayed in a loop, a private ROS domain on localhost), and stops it
at the end; its logs go to a temporary folder named in the output.

Reports (stdout, and ``--json``): questions asked, answered, refused or dropped by reason, goals
rejected, lost questions (no reply at the end); the action chunk rate at this subscriber
(``~/action_chunk`` DDS receive times) before the flood (``--baseline`` s), while asking, and
over the flood window (first question to ``--settle`` s after the last reply), against
``control_rate_hz`` and against the rate before; the largest waiting, open and running figures
``/diagnostics`` showed. Exits 1 if a question got no reply, a String question got more than
one, or the chunk rate over the window fell below ``--min-rate`` of the target.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from dataclasses import asdict, dataclass
import datetime
import json
from pathlib import Path
import platform
import sys
import tempfile
import time
from typing import Iterator, Sequence

from oxygen_ros.resources import config_file
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.bag.make_demo import demo_bag
from oxygen_ros.tools.common.children import (
    Child, replay_args, ros_environment, stop_children)
from oxygen_ros.tools.stress.flood_client import FloodClient, FloodTally, Phase, Via
from oxygen_ros.units import NS_PER_S
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args

NODE_NAME = 'oxygen_flood'
_READY_S = 60.0
"""How long a running node has to show its ``~/ask``, chunks and ``/diagnostics``."""
_LAUNCH_READY_S = 180.0
"""The same for a node this tool starts (building and warming up its engine first)."""


@dataclass(frozen=True, slots=True)
class ChunkRates:
    """
    The action chunk rate at the flooding client, Hz (``FloodClient.chunk_rate``).

    :ivar before: over the ``--baseline`` seconds before the first question.
    :ivar asking: from the first question to the last.
    :ivar window: from the first question to ``--settle`` s after the last reply.
    :ivar window_s: the window's length.
    """

    before: float
    asking: float
    window: float
    window_s: float

    @property
    def of_before(self) -> float:
        """Return the window's rate as a fraction of the rate before (nan without one)."""
        return self.window / self.before if self.before > 0 else float('nan')


def summary(tally: FloodTally, rates: ChunkRates, target_hz: float,
            peaks: dict[str, float]) -> str:
    """Return the human-readable report of one flood."""
    sent_s = (tally.last_sent_ns - tally.first_sent_ns) / NS_PER_S
    refused = ', '.join(f'{kind} x{n}' for kind, n in sorted(tally.refused.items())) or '-'
    lines = [f'asked {tally.asked} in {sent_s:.2f} s (topic {tally.asked_topic}, action '
             f'{tally.asked_action}): answered {tally.answered}, refused {tally.num_refused} '
             f'({refused}), lost {tally.lost}, extra replies {tally.extra_replies}',
             f'action chunks {rates.window:.2f} Hz over {rates.window_s:.1f} s from the first '
             f'question ({100 * rates.window / target_hz:.1f} % of {target_hz:g} Hz, '
             f'{100 * rates.of_before:.1f} % of the {rates.before:.2f} Hz before); '
             f'{rates.asking:.2f} Hz while asking',
             f'last reply {(tally.last_reply_ns - tally.first_sent_ns) / NS_PER_S:.1f} s after '
             f'the first question']
    lines += [f'peak {key}: {value:g}' for key, value in peaks.items()]
    return '\n'.join(lines)


PEAK_KEYS = ('text requests waiting peak', 'text requests open', 'text requests running',
             'cycle time p99 (ms)')
"""``/diagnostics`` keys whose largest value during a flood is reported."""


def _phase(text: str) -> Phase:
    try:
        return Phase.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_stress flood',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--via', choices=[v.value for v in Via], default='topic')
    parser.add_argument('--count', type=int, default=None, help='questions in all')
    parser.add_argument('--rate', type=float, default=None, help='questions per second')
    parser.add_argument('--seconds', type=float, default=1.0, help='spread over this time')
    parser.add_argument('--phase', type=_phase, action='append', default=None,
                        metavar='COUNT:SECONDS',
                        help='COUNT questions over SECONDS; repeat for phases back to back '
                             '(instead of --count/--rate/--seconds)')
    parser.add_argument('--launch', metavar='CONFIG', default=None,
                        help='start the node with config/CONFIG.yaml and a looping bag replay '
                             'first (demo: as make demo), on a private ROS domain')
    parser.add_argument('--bag', type=Path, default=None,
                        help='the bag --launch replays (default: the demo bag)')
    parser.add_argument('--clients', type=int, default=8, help='action clients')
    parser.add_argument('--max-tokens', type=int, default=0, help='goal token budget')
    parser.add_argument('--node', default='/oxygen')
    parser.add_argument('--settle', type=float, default=4.0,
                        help='seconds after the last reply (the chunk rate window ends there)')
    parser.add_argument('--timeout', type=float, default=60.0,
                        help='seconds to wait for the replies after the last question')
    parser.add_argument('--baseline', type=float, default=3.0,
                        help='seconds of chunk rate measured before the flood')
    parser.add_argument('--min-rate', type=float, default=0.95,
                        help='fail below this fraction of control_rate_hz')
    parser.add_argument('--json', type=Path, default=None)
    return parser


def _phases(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[Phase]:
    if args.phase:
        if args.count is not None or args.rate is not None:
            parser.error('--phase replaces --count/--rate/--seconds; give one or the other')
        return args.phase
    count = args.count if args.count is not None else \
        round((args.rate if args.rate is not None else 200.0) * args.seconds)
    return [Phase(count, args.seconds)]


@contextmanager
def launched(config: str | None, bag: Path | None) -> Iterator[list[Child]]:
    """
    Start the node (``config/<config>.yaml``) and a looping replay of ``bag``; stop them after.

    Yields nothing to do (an empty list) when ``config`` is None. Sets this process's ROS
    domain to a random private one first (``ros_environment``), before ``rclpy.init``.
    """
    if config is None:
        yield []
        return
    domain_id = ros_environment(None)      # first: it also finds the package's share folder
    params = config_file(config)
    log_dir = Path(tempfile.mkdtemp(prefix='oxygen_flood_'))
    print(f'oxygen_stress flood: starting the node ({params}) and the replay on '
          f'ROS_DOMAIN_ID={domain_id}; logs in {log_dir}', flush=True)
    children = [Child('node', ['oxygen_ros.ros.node', '--ros-args', '--params-file',
                               str(params)], log_dir)]
    try:
        children.append(Child('replay', replay_args(bag or demo_bag()), log_dir))
        yield children
    finally:
        stop_children(children, 'oxygen_stress flood: ')


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_stress flood``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(remove_ros_args([NODE_NAME, *argv])[1:])
    phases = _phases(args, parser)
    count = sum(p.count for p in phases)
    seconds = sum(p.seconds for p in phases)
    stop = stop_event_on_signals()
    with launched(args.launch, args.bag) as children:
        rclpy.init(args=[NODE_NAME, *argv], signal_handler_options=SignalHandlerOptions.NO)
        node = Node(NODE_NAME)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            return _flood(args, phases, FloodClient(node, executor, args.node, args.clients,
                                                    stop),
                          f'{count} questions over {seconds:g} s', bool(children))
        finally:
            executor.shutdown()
            node.destroy_node()
            rclpy.try_shutdown()


def _alone(client: FloodClient) -> bool:
    """Return whether one node publishes the chunks; say why the figures are void if not."""
    nodes = client.num_nodes()
    if nodes != 1:
        print(f'oxygen_stress flood: {nodes} nodes publish {client.chunk_topic} on '
              f'ROS_DOMAIN_ID {client.node.context.get_domain_id()}: their chunks and replies '
              f'would count here; run it again (another domain)', file=sys.stderr)
    return nodes == 1


def _flood(args: argparse.Namespace, phases: list[Phase], client: FloodClient, what: str,
           launched_node: bool) -> int:
    ready_s = _LAUNCH_READY_S if launched_node else _READY_S
    if not client.spin_until(lambda: client.ready() and len(client.chunk_ns) >= 10 and
                             client.diagnostics, ready_s):
        if client.stop.is_set():
            return 130
        print(f'oxygen_stress flood: {args.node} is not acting (no ~/ask, action server, '
              f'chunks or /diagnostics within {ready_s:g} s)', file=sys.stderr)
        return 1
    if not _alone(client):
        return 1
    target_hz = float(client.diagnostics[-1][1]['control rate target (Hz)'])
    base_from = time.time_ns()
    client.spin_until(lambda: False, args.baseline)
    base_to = time.time_ns()
    print(f'oxygen_stress flood: asking {what} ...', flush=True)
    tally = client.flood_phases(Via(args.via), phases, max_tokens=args.max_tokens,
                                reply_timeout_s=args.timeout, settle_s=args.settle)
    if client.stop.is_set():
        print('oxygen_stress flood: interrupted', file=sys.stderr)
        return 130
    # the window: the first question to --settle after the last reply (the test's window)
    end_ns = max(tally.last_reply_ns, tally.last_sent_ns) + round(args.settle * NS_PER_S)
    client.spin_until(lambda: max(client.chunk_ns) > end_ns, args.settle + 5.0)
    if not _alone(client):
        return 1
    rates = ChunkRates(client.chunk_rate(base_from, base_to)[0],
                       client.chunk_rate(tally.first_sent_ns, tally.last_sent_ns)[0],
                       client.chunk_rate(tally.first_sent_ns, end_ns)[0],
                       (end_ns - tally.first_sent_ns) / NS_PER_S)
    base_p99 = client.peak('cycle time p99 (ms)', base_from, base_to)
    peaks = {k: client.peak(k, tally.first_sent_ns, end_ns) for k in PEAK_KEYS}
    print(f'oxygen_stress flood {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, '
          f'{args.via}, {what}')
    print(f'before the flood: action chunks {rates.before:.2f} Hz over {args.baseline:g} s, '
          f'cycle time p99 {base_p99:g} ms')
    print(summary(tally, rates, target_hz, peaks))
    if args.json is not None:
        args.json.write_text(json.dumps({
            'tally': asdict(tally), 'phases': [asdict(p) for p in phases],
            'chunk_rate_hz': rates.window, 'baseline_chunk_rate_hz': rates.before,
            'asking_chunk_rate_hz': rates.asking, 'of_baseline': rates.of_before,
            'target_hz': target_hz, 'peaks': peaks, 'chunk_ns': client.chunk_ns,
            'diagnostics': client.diagnostics}, indent=1))
    ok = tally.lost == 0 and tally.extra_replies == 0 and \
        rates.window >= args.min_rate * target_hz
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
