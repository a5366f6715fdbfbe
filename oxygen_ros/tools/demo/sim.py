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
and prints one table. Random weights make the motion meaningless: the run shows timing,
action semantics and the smoothness of chunk boundaries. Exits 1 if no chunk was executed.
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
from oxygen_ros.tools.common.children import Child, ros_environment
from oxygen_ros.tools.demo.sim_bag import CHUNK_TOPIC, read_run, RECORDED_TOPICS, trim
from oxygen_ros.tools.demo.sim_figures import plot_trajectories, save_frame, write_video
from oxygen_ros.tools.demo.sim_report import compare_table, compute_metrics, SimMetrics, summary
from oxygen_ros.units import NS_PER_S

SMOOTHINGS = ('none', 'ensemble', 'rtc')
_START_TIMEOUT_S = 240.0
MEANINGLESS = ('random weights (no checkpoint): the motion is meaningless; the run shows '
               'timing, action semantics and chunk-boundary smoothness')


class SimClockWatch:
    """An rclpy node that follows ``/clock`` and counts the node's chunks."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from trajectory_msgs.msg import JointTrajectory

        self.node = rclpy.create_node('oxygen_sim_demo')
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.sim_ns = 0
        self.first_chunk_sim_ns: int | None = None
        self.num_chunks = 0
        self.node.create_subscription(
            Clock, '/clock', self._on_clock,
            QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.node.create_subscription(JointTrajectory, CHUNK_TOPIC, self._on_chunk, 10)

    def _on_clock(self, msg: object) -> None:
        self.sim_ns = msg.clock.sec * NS_PER_S + msg.clock.nanosec

    def _on_chunk(self, msg: object) -> None:
        self.num_chunks += 1
        if self.first_chunk_sim_ns is None:
            self.first_chunk_sim_ns = self.sim_ns

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


def node_args(smoothing: str, seed: int, extra: Sequence[str] = ()) -> list[str]:
    """Return the ``python -m`` arguments of the oxygen node for the sim."""
    norm = share_dir() / 'config' / 'sim_norm_stats.json'
    return ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(config_file('sim')),
            '-p', f'norm_stats:={norm}', '-p', f'chunk_smoothing:={smoothing}',
            '-p', f'seed:={seed}', *extra]


def run_once(smoothing: str, out_dir: Path, args: argparse.Namespace, stop: object
             ) -> SimMetrics | None:
    """Run sim + node + recorder once; write the pictures; return the figures (None: failed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bag = out_dir / 'bag'
    watch = SimClockWatch()
    children = [Child('record', ['oxygen_ros.tools.bag.record', str(bag), *RECORDED_TOPICS],
                      out_dir)]
    extra = [] if args.rtc_jacobian_steps is None else \
        ['-p', f'rtc_jacobian_steps:={args.rtc_jacobian_steps}']
    children.append(Child('node', node_args(smoothing, args.seed, extra), out_dir))
    sim_params = [f'real_time_factor:={args.real_time_factor}']
    if args.camera_rate is not None:
        sim_params.append(f'camera_rate_hz:={args.camera_rate}')
    children.append(Child('sim', ['oxygen_ros.sim.app', '--ros-args',
                                  *(a for p in sim_params for a in ('-p', p))], out_dir))
    ok, wall_s, late = False, 0.0, None
    try:
        print(f'[{smoothing}] waiting for the first action chunk (engine build + warm-up) ...',
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
    run = trim(read_run(bag), start_ns, end_ns)
    metrics = compute_metrics(run, smoothing, wall_s)
    title = (f'oxygen_ros sim, demo preset (random weights), smoothing {smoothing}: commanded '
             f'vs achieved, chunk plans and switches')
    mid = start_ns / NS_PER_S + args.duration / 2
    plot_trajectories(run, out_dir / 'trajectories.png', mid - 2.0, 4.0, title)
    if run.frames:
        write_video(run.frames, out_dir / 'base_camera.mp4', fps=15.0)
        save_frame(run.frames, out_dir / 'frame.png')
    text = summary(metrics) + '\n' + conditions(
        args, late.num_pauses if late else None) + MEANINGLESS
    (out_dir / 'summary.txt').write_text(text + '\n')
    print(f'\n== oxygen sim summary ({smoothing}) ==\n{text}\nvideo: {out_dir}/base_camera.mp4;'
          f' plot: {out_dir}/trajectories.png; bag: {bag}', flush=True)
    return metrics if ok and metrics.chunks_executed > 0 else None


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
    done = [m for m in results if m is not None]
    if args.compare and done:
        table = compare_table(done)
        table += '\n' + conditions(args) + MEANINGLESS
        (out_dir / 'compare.txt').write_text(table + '\n')
        print(f'\n== chunk smoothing compared (seed {args.seed}, {args.duration:g} s of sim time '
              f'each) ==\n{table}')
    if len(done) != len(smoothings):
        print('FAILED: a run executed no chunk or a process failed (logs in '
              f'{out_dir})', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
