"""
``make sim`` / ``oxygen_demo sim``: the node drives the simulated Panda in closed loop.

Starts, as subprocesses on a fresh ROS domain (localhost only): ``oxygen_bag record`` (the chunks,
joint states and commands, chunk events, diagnostics and the base camera into
``out/sim_<time>/bag``), ``oxygen_node`` with ``config/sim.yaml`` (the ``demo`` preset with
RANDOM weights, ``use_sim_time``, joint velocities integrated into positions,
``config/sim_norm_stats.json``, ``chunk_smoothing`` from ``--smoothing``) and ``oxygen_sim``.
From the first chunk on it lets ``--duration`` seconds of SIM time pass, stops everything
with SIGINT, and writes ``base_camera.mp4``, ``trajectories.png`` (commanded vs achieved, chunk
switches marked), ``frame.png`` and ``summary.txt`` (``sim_report`` defines every figure).
``--compare`` runs ``none``, ``ensemble`` and ``rtc`` one after the other with the same seed
and prints one table. ``--robots N`` runs N simulated arms (``left``, ``right``; ``arm1`` ..
for more: ``sim.arms``) driven by the one node serving them as its ``robots``, and reports each
arm on its own (its figures and pictures in ``<out>/<arm>/``). Random weights make the motion
meaningless: the run shows timing, action semantics and the smoothness of chunk boundaries.
Exits 1 if an arm executed no chunk.
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
import signal
import sys
import time
from typing import Sequence

from oxygen_ros.resources import config_file, share_dir
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.sim.arms import arm_names, node_parameters, ros_args
from oxygen_ros.tools.common.children import Child, ros_environment
from oxygen_ros.tools.demo.sim_bag import ArmTopics, read_run, recorded_topics, trim
from oxygen_ros.tools.demo.sim_figures import plot_trajectories, save_frame, write_video
from oxygen_ros.tools.demo.sim_report import compare_table, compute_metrics, SimMetrics, summary
from oxygen_ros.units import NS_PER_S

SMOOTHINGS = ('none', 'ensemble', 'rtc')
_START_TIMEOUT_S = 240.0
MEANINGLESS = ('random weights (no checkpoint): the motion is meaningless; the run shows '
               'timing, action semantics and chunk-boundary smoothness')


class SimClockWatch:
    """
    An rclpy node that follows ``/clock`` and counts the node's chunks of each arm.

    :param arms: the arms (their chunk topics, ``ArmTopics``).
    """

    def __init__(self, arms: Sequence[str] = ('',)) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from trajectory_msgs.msg import JointTrajectory

        self.node = rclpy.create_node('oxygen_sim_demo')
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.sim_ns = 0
        self.first_chunk_ns: dict[str, int] = {}
        self.num_chunks = dict.fromkeys(arms, 0)
        self.node.create_subscription(
            Clock, '/clock', self._on_clock,
            QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
        for arm in arms:
            self.node.create_subscription(JointTrajectory, ArmTopics.of(arm).chunks,
                                          lambda msg, arm=arm: self._on_chunk(arm), 10)

    @property
    def first_chunk_sim_ns(self) -> int | None:
        """Return the sim time by which every arm had its first chunk (None: not yet)."""
        if len(self.first_chunk_ns) < len(self.num_chunks):
            return None
        return max(self.first_chunk_ns.values())

    def _on_clock(self, msg: object) -> None:
        self.sim_ns = msg.clock.sec * NS_PER_S + msg.clock.nanosec

    def _on_chunk(self, arm: str) -> None:
        self.num_chunks[arm] += 1
        self.first_chunk_ns.setdefault(arm, self.sim_ns)

    def spin_until(self, predicate: object, timeout_s: float, stop: object) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline or stop.is_set():
                return False
            self.executor.spin_once(timeout_sec=0.05)
        return True

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


class LateCycles:
    """
    Stops a process for ``pause_s`` of sim time every ``every_s`` (``--late-cycles``).

    :param pid: the process (the node).
    :param start_ns: sim time of the first chunk; the first pause starts ``every_s`` later.
    """

    def __init__(self, pid: int, every_s: float, pause_s: float, start_ns: int) -> None:
        self.pid = pid
        self.every_ns, self.pause_ns = round(every_s * NS_PER_S), round(pause_s * NS_PER_S)
        self.next_ns = start_ns + self.every_ns
        self.resume_ns: int | None = None
        self.num_pauses = 0

    def tick(self, sim_ns: int) -> None:
        """Stop or resume the process as the sim clock says."""
        if self.resume_ns is not None and sim_ns >= self.resume_ns:
            self.resume()
        elif self.resume_ns is None and sim_ns >= self.next_ns:
            os.kill(self.pid, signal.SIGSTOP)
            self.num_pauses += 1
            self.resume_ns = sim_ns + self.pause_ns
            self.next_ns += self.every_ns

    def resume(self) -> None:
        """Let the process run again (also when the run ends while it is stopped)."""
        if self.resume_ns is not None:
            os.kill(self.pid, signal.SIGCONT)
            self.resume_ns = None


def late_cycles(text: str) -> tuple[float, float]:
    """Parse ``EVERY:PAUSE`` (sim seconds, ``0 < PAUSE < EVERY``) for argparse."""
    try:
        every, pause = (float(x) for x in text.split(':'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected EVERY:PAUSE in seconds, got {text!r}') \
            from None
    if not 0 < pause < every:
        raise argparse.ArgumentTypeError(f'need 0 < PAUSE < EVERY, got {text!r}')
    return every, pause


def node_args(smoothing: str, seed: int, extra: Sequence[str] = (),
              arms: Sequence[str] = ('',)) -> list[str]:
    """
    Return the ``python -m`` arguments of the oxygen node for the sim.

    :param arms: the simulated arms: the node serves them as its ``robots``
        (``sim.arms.node_parameters``; nothing more for the one arm).
    """
    norm = share_dir() / 'config' / 'sim_norm_stats.json'
    return ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(config_file('sim')),
            '-p', f'norm_stats:={norm}', '-p', f'chunk_smoothing:={smoothing}',
            '-p', f'seed:={seed}', *ros_args(node_parameters(arms)), *extra]


def sim_args(args: argparse.Namespace, arms: Sequence[str]) -> list[str]:
    """Return the ``python -m`` arguments of ``oxygen_sim`` for the run."""
    params: dict[str, object] = {'real_time_factor': args.real_time_factor}
    if args.camera_rate is not None:
        params['camera_rate_hz'] = args.camera_rate
    if tuple(arms) != ('',):
        params['robots'] = list(arms)
    return ['oxygen_ros.sim.app', '--ros-args', *ros_args(params)]


def run_once(smoothing: str, out_dir: Path, args: argparse.Namespace, stop: object
             ) -> list[SimMetrics] | None:
    """
    Run sim + node + recorder once; write the pictures; return each arm's figures.

    :returns: None when it failed (no chunk, a process failed, an arm executed nothing).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    bag = out_dir / 'bag'
    arms = arm_names(args.robots)
    watch = SimClockWatch(arms)
    children = [Child('record', ['oxygen_ros.tools.bag.record', str(bag),
                                 *recorded_topics(arms)], out_dir)]
    extra = [] if args.rtc_jacobian_steps is None else \
        ['-p', f'rtc_jacobian_steps:={args.rtc_jacobian_steps}']
    children.append(Child('node', node_args(smoothing, args.seed, extra, arms), out_dir))
    children.append(Child('sim', sim_args(args, arms), out_dir))
    ok, wall_s, late = False, 0.0, None
    try:
        print(f'[{smoothing}] waiting for the first action chunk'
              f'{" of every arm" if len(arms) > 1 else ""} (engine build + warm-up) ...',
              flush=True)
        if not watch.spin_until(lambda: watch.first_chunk_sim_ns is not None
                                or not all(c.alive for c in children), _START_TIMEOUT_S, stop):
            print(f'[{smoothing}] no chunk arrived', file=sys.stderr)
            return None
        if not all(c.alive for c in children):
            return None
        start_ns = watch.first_chunk_sim_ns
        t0 = time.monotonic()
        print(f'[{smoothing}] closed loop from sim time {start_ns / NS_PER_S:.2f} s; running '
              f'{args.duration:g} s of sim time', flush=True)
        end_ns = start_ns + round(args.duration * NS_PER_S)
        if args.late_cycles is not None:
            late = LateCycles(children[1].popen.pid, *args.late_cycles, start_ns)

        def done() -> bool:
            if late is not None:
                late.tick(watch.sim_ns)
            return watch.sim_ns >= end_ns
        ok = watch.spin_until(done, args.duration * 20 + 60, stop)
        wall_s = time.monotonic() - t0
    finally:
        if late is not None:
            late.resume()
        for child in (children[2], children[1], children[0]):  # sim, node, then the recorder
            code = child.stop()
            if code != 0:
                ok = False
                print(f'{child.name} exited with {code}:\n{child.tail()}', file=sys.stderr)
        watch.close()
    texts, results = [], []
    for arm in arms:
        metrics, text = report_arm(bag, arm, out_dir / arm if arm else out_dir, smoothing,
                                   (start_ns, end_ns, wall_s), args.duration)
        texts.append(text)
        results.append(metrics)
    tail = conditions(args, late.num_pauses if late else None) + MEANINGLESS
    (out_dir / 'summary.txt').write_text('\n\n'.join(texts) + '\n' + tail + '\n')
    print(f'{tail}\nbag: {bag}', flush=True)
    return results if ok and all(m.chunks_executed > 0 for m in results) else None


def report_arm(bag: Path, arm: str, out_dir: Path, smoothing: str,
               span: tuple[int, int, float], duration_s: float) -> tuple[SimMetrics, str]:
    """
    Read one arm's part of the run, write its pictures into ``out_dir``, print its summary.

    :param span: the closed loop's first and last sim time (ns) and the wall seconds it took.
    :returns: its figures and its summary (heading included).
    """
    start_ns, end_ns, wall_s = span
    out_dir.mkdir(parents=True, exist_ok=True)
    run = trim(read_run(bag, arm), start_ns, end_ns)
    metrics = compute_metrics(run, smoothing, wall_s, robot=arm)
    label = f'{smoothing}, robot {arm}' if arm else smoothing
    title = (f'oxygen_ros sim, demo preset (random weights), {label}: commanded '
             f'vs achieved, chunk plans and switches')
    mid = start_ns / NS_PER_S + duration_s / 2
    plot_trajectories(run, out_dir / 'trajectories.png', mid - 2.0, 4.0, title)
    if run.frames:
        write_video(run.frames, out_dir / 'base_camera.mp4', fps=15.0)
        save_frame(run.frames, out_dir / 'frame.png')
    text = f'== oxygen sim summary ({label}) ==\n{summary(metrics)}'
    print(f'\n{text}\nvideo: {out_dir}/base_camera.mp4; plot: {out_dir}/trajectories.png',
          flush=True)
    return metrics, text


def conditions(args: argparse.Namespace, num_pauses: int | None = None) -> str:
    """Return a summary line naming the run's harder conditions; empty when none was asked."""
    parts = []
    if args.camera_rate is not None:
        parts.append(f'camera {args.camera_rate:g} Hz')
    if args.late_cycles is not None:
        every, pause = args.late_cycles
        times = '' if num_pauses is None else f' {num_pauses} times'
        parts.append(f'node stopped{times} for {pause:g} s every {every:g} s (late cycles)')
    if args.rtc_jacobian_steps is not None:
        parts.append(f'rtc: the Jacobian on the first {args.rtc_jacobian_steps} Euler steps')
    return f'conditions: {"; ".join(parts)}\n' if parts else ''


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_demo sim',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--smoothing', choices=SMOOTHINGS, default='none',
                        help="the node's chunk_smoothing (default none)")
    parser.add_argument('--compare', action='store_true',
                        help='run none, ensemble and rtc with the same seed; one table')
    parser.add_argument('--robots', type=int, default=1, metavar='N',
                        help='simulated arms, served by the one node as its robots (1; 2: '
                             'left and right; more: arm1 ..)')
    parser.add_argument('--duration', type=float, default=30.0, help='sim seconds (30)')
    parser.add_argument('--real-time-factor', type=float, default=1.0,
                        help="the simulator's pacing (1.0)")
    parser.add_argument('--seed', type=int, default=1, help='the node seed (weights, noise)')
    parser.add_argument('--camera-rate', type=float, default=None, metavar='HZ',
                        help="the simulator's camera rate (default its own, 15 Hz); below the "
                             "node's control rate (10 Hz) cycles see repeated frames")
    parser.add_argument('--late-cycles', type=late_cycles, default=None, metavar='EVERY:PAUSE',
                        help='stop the node process for PAUSE s every EVERY s (sim time) '
                             '(SIGSTOP/SIGCONT): late and dropped cycles')
    parser.add_argument('--rtc-jacobian-steps', type=int, default=None, metavar='K',
                        help="the node's rtc_jacobian_steps: RTC's Euler steps that take the "
                             'vector-Jacobian product (default: every step)')
    parser.add_argument('--out', type=Path, default=Path('out'), help='output folder')
    parser.add_argument('--domain-id', type=int, default=None, help='ROS_DOMAIN_ID')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the closed-loop demo; return 0 if every run executed chunks."""
    args = _parser().parse_args(argv)
    if not args.duration > 0:
        raise SystemExit(f'--duration must be > 0, got {args.duration}')
    if args.robots < 1:
        raise SystemExit(f'--robots must be at least 1, got {args.robots}')
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    domain_id = ros_environment(args.domain_id)
    out_dir = args.out / f'sim_{datetime.datetime.now():%Y%m%d-%H%M%S}'
    print(f'ROS_DOMAIN_ID={domain_id} (localhost only); output {out_dir}', flush=True)
    stop = stop_event_on_signals()
    rclpy.init(args=['oxygen_sim_demo'], signal_handler_options=SignalHandlerOptions.NO)
    smoothings = SMOOTHINGS if args.compare else (args.smoothing,)
    results = []
    try:
        for smoothing in smoothings:
            sub = out_dir / smoothing if args.compare else out_dir
            results.append(run_once(smoothing, sub, args, stop))
            if stop.is_set():
                break
    finally:
        rclpy.try_shutdown()
    done = [m for arms in results if arms is not None for m in arms]
    if args.compare and done:
        table = compare_table(done)
        table += '\n' + conditions(args) + MEANINGLESS
        (out_dir / 'compare.txt').write_text(table + '\n')
        print(f'\n== chunk smoothing compared (seed {args.seed}, {args.duration:g} s of sim time '
              f'each) ==\n{table}')
    if len(done) != len(smoothings) * args.robots:
        print('FAILED: a run executed no chunk or a process failed (logs in '
              f'{out_dir})', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
